"""User code runs bounded (earl.runtime.sandbox): a reward function or tool that never returns is
stopped by its timeout, a crash or an exception is an error result, and a run whose reward
function fails on every episode stops with one line instead of training on zeros.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_sandbox.py
"""

import json
import time

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.envs import make_env
from earl.runtime.envs.tools import Tool, parse_tool_calls, run_tool_calls
from earl.runtime.sandbox import Sandbox, UserCodeError

USER = '''
import os, time
from pathlib import Path

def spin(sample, messages):
    while True:
        pass

def boom(sample, messages):
    raise ZeroDivisionError("always")

def once_slow(sample, messages):
    mark = Path(__file__).with_name("slept")
    if not mark.exists():
        mark.write_text("1")
        time.sleep(30)
    return 1.0

def die(sample, messages):
    os._exit(7)

def spin_tool(x):
    while True:
        pass
'''


@pytest.fixture
def data(tmp_path):
    (tmp_path / "user.py").write_text(USER)
    (tmp_path / "p.jsonl").write_text('{"prompt": "2+3="}\n{"prompt": "7*6="}\n')
    return tmp_path


def test_a_spinning_reward_function_is_stopped_within_its_timeout(data):
    e = make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'user.py'}:spin", reward_timeout_s=0.5)
    e.reset(0)
    t0 = time.perf_counter()
    r = e.step("5")
    assert time.perf_counter() - t0 < 5
    assert r.outcome == "reward_error" and r.reward == 0.0 and "timed out after 0.5s" in r.info["reward_error"]


def test_a_reward_function_slow_once_then_fine(data):
    e = make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'user.py'}:once_slow", reward_timeout_s=0.5)
    e.reset(0)
    assert e.step("5").outcome == "reward_error"
    e.reset(1)
    r = e.step("42")  # a fresh helper process answers the next call
    assert r.outcome == "correct" and r.reward == 1.0


def test_raising_and_crashing_calls_are_errors_and_the_helper_restarts(data):
    box = Sandbox()
    try:
        with pytest.raises(UserCodeError, match="ZeroDivisionError: always"):
            box.call(("file", str(data / "user.py"), "boom"), ({}, []), timeout_s=5)
        with pytest.raises(UserCodeError, match="exit code 7"):
            box.call(("file", str(data / "user.py"), "die"), ({}, []), timeout_s=5)
        assert box.call(len, ([1, 2, 3],), timeout_s=5) == 3
    finally:
        box.close()


def test_a_spinning_tool_is_stopped_and_becomes_an_error_result(data):
    tools = {"spin": Tool(name="spin", description="", parameters={"properties": {"x": {}}},
                          fn=("file", str(data / "user.py"), "spin_tool"))}
    t0 = time.perf_counter()
    out = run_tool_calls(parse_tool_calls('<tool_call>{"name": "spin", "arguments": {"x": 1}}</tool_call>'),
                         tools, 0.3)
    assert time.perf_counter() - t0 < 5
    assert out == ["error: tool timed out after 0.3s"]


def test_earl_run_with_a_spinning_reward_finishes_in_seconds(data, tmp_path):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["run", "--env", f"jsonl:{data / 'p.jsonl'}", "--reward", f"{data / 'user.py'}:spin",
                                 "--steps", "1", "--quiet", "--out", str(out), "--set", "groups=2",
                                 "--set", "plots=false", "--set", "sampling.max_new_tokens=4",
                                 "--set", "env.reward_timeout_s=0.5"])
    assert time.perf_counter() - t0 < 60
    assert r.exit_code == 2 and "timed out after 0.5s" in r.stderr, r.output


def test_earl_run_tolerates_errors_below_the_rate(data, tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--env", f"jsonl:{data / 'p.jsonl'}", "--reward",
                                 f"{data / 'user.py'}:once_slow", "--steps", "1", "--quiet", "--out", str(out),
                                 "--set", "groups=2", "--set", "plots=false", "--set", "sampling.max_new_tokens=4",
                                 "--set", "env.reward_timeout_s=0.5"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reward_error_rate"] == 0.5
    assert "failed on 1 of 2 episodes (timed out after 0.5s (stopped)); reward 0" in r.stderr


def test_held_objects_live_in_the_helper_until_it_restarts():
    from earl.runtime.sandbox import apply_held, hold

    box = Sandbox()
    try:
        gen = box.ensure_started()
        box.call(hold, ("k", ("module", "collections", "Counter"), ("abca",)), timeout_s=10)
        assert box.call(apply_held, ("k", dict.__getitem__, ("a",)), timeout_s=10) == 2
        box.call(hold, ("j", ("module", "collections", "Counter"), ("x",), None, ("k",)), timeout_s=10)
        with pytest.raises(UserCodeError, match="LookupError: no object held under 'k'"):
            box.call(apply_held, ("k", dict.__getitem__, ("a",)), timeout_s=10)  # dropped
        box.close()
        assert box.ensure_started() == gen + 1  # a new helper: what the old one held is gone
        with pytest.raises(UserCodeError, match="no object held under 'j'"):
            box.call(apply_held, ("j", dict.__getitem__, ("x",)), timeout_s=10)
    finally:
        box.close()
