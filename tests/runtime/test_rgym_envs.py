"""reasoning-gym tasks (`--env reasoning-gym:TASK`): the package's questions per episode seed,
its own scorer, options, one-line errors, and `earl run` end to end on one process and on two
(slow). Marked `rgym`: they run when the package is installed (CI: `pip install reasoning-gym`
from .ci/constraints-rgym.txt, then `pytest -m rgym`) and skip otherwise; the error without the
package is tested either way.

    OMP_NUM_THREADS=1 python -m pytest -q -m rgym tests/runtime/test_rgym_envs.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.envs import make_env
from tests.runtime.env_runs import assert_one_and_two_processes_agree, rows_of

ROOT = Path(__file__).resolve().parents[2]
EASY = ("max_terms=2", "max_digits=1")  # chain sums of two one-digit terms
RUN = ["--quiet", "--set", "plots=false", "--set", "checkpoints=false", "--set", "group_size=2",
       "--set", "groups=3", "--set", "env.options=max_terms=2,max_digits=1"]


def needs_rgym():
    return pytest.importorskip("reasoning_gym")


@pytest.mark.rgym
def test_an_episode_is_the_tasks_question_for_its_seed_scored_by_the_task():
    rg = needs_rgym()
    env = make_env("reasoning-gym:chain_sum", options=EASY)
    ds = rg.create_dataset("chain_sum", seed=0, size=100, max_terms=2, max_digits=1)
    for seed in (0, 7, 42):
        assert env.reset(seed) == ds[seed]["question"] + "\n"
        assert re.search(r": \d [+-] \d =$", ds[seed]["question"]), ds[seed]["question"]
        answer = ds[seed]["answer"]
        right = env.step(answer)
        assert (right.reward, right.outcome, right.done) == (1.0, "correct", True)
        env.reset(seed)
        assert env.step(f"so <answer>{answer}</answer>").outcome == "correct"
        env.reset(seed)
        wrong = env.step(str(int(answer) + 1))
        assert (wrong.reward, wrong.outcome) == (0.0, "wrong")
    assert len({make_env("reasoning-gym:chain_sum", options=EASY).reset(s) for s in range(20)}) > 5


@pytest.mark.rgym
def test_other_tasks_and_their_partial_scores():
    needs_rgym()
    for task in ("basic_arithmetic", "countdown"):
        env = make_env(f"reasoning-gym:{task}")
        q = env.reset(3)
        assert q.strip() and env.entry["question"] in q
        res = env.step(env.entry["answer"])
        assert (res.reward, res.outcome) == (1.0, "correct"), task
    env = make_env("reasoning-gym:countdown")
    env.reset(3)
    partial = env.step("nonsense")  # countdown gives a small score to any reply
    assert 0 <= partial.reward < 1 and partial.outcome == "wrong"


@pytest.mark.rgym
def test_bad_tasks_and_options_are_one_line_errors():
    needs_rgym()
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'chain_summ' \(did you mean chain_sum"):
        make_env("reasoning-gym:chain_summ")
    with pytest.raises(ValueError, match="rejected: AssertionError: max_terms must be >= min_terms"):
        make_env("reasoning-gym:chain_sum", options=("max_terms=0",))
    with pytest.raises(ValueError, match="unexpected keyword argument 'colour'"):
        make_env("reasoning-gym:chain_sum", options=("colour=1",))
    with pytest.raises(ValueError, match=r"needs an argument: reasoning-gym:NAME"):
        make_env("reasoning-gym")
    r = CliRunner().invoke(app, ["run", "--env", "reasoning-gym:chain_summ", "--steps", "1"])
    assert r.exit_code == 2 and "chain_summ" in r.output and "Traceback" not in r.output, r.output


def test_without_the_package_the_error_names_the_install_command():
    code = ("import sys; sys.modules['reasoning_gym'] = None\n"
            "from earl.runtime.envs import make_env\n"
            "try:\n    make_env('reasoning-gym:chain_sum')\nexcept ValueError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("env reasoning-gym:TASK needs the reasoning-gym package: pip install 'earl[rgym]'")
    assert len(r.stdout.strip().splitlines()) == 1


@pytest.mark.rgym
def test_earl_run_on_a_reasoning_gym_task(tmp_path):
    needs_rgym()
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--env", "reasoning-gym:chain_sum", "--steps", "2", "--out", str(out), *RUN])
    assert r.exit_code == 0, r.output
    rows = rows_of(out)
    assert [x["step"] for x in rows] == [1, 2]
    for x in rows:
        assert x["correct_rate"] + x["wrong_rate"] == pytest.approx(1) and x["env_error_rate"] == 0
        assert x["turns_mean"] == 1


@pytest.mark.rgym
@pytest.mark.slow
@pytest.mark.dist
def test_earl_run_on_two_processes_plays_the_same_episodes(tmp_path):
    needs_rgym()
    assert_one_and_two_processes_agree(tmp_path, ["--env", "reasoning-gym:chain_sum", *RUN],
                                       ("reward_mean", "tokens", "correct_rate"))
