"""Checkpoints and faults of an async run (earl.runtime.async_rl, `schedule.mode = "async"`):
`checkpoint_every` honoured mid-run (every rank's copy of the version checked equal first), a
killed rank in either pool stops the run with the launcher's one line and resume hint, SIGTERM
and a deadline stop it after a checkpointed step, and resuming a mid-run checkpoint continues
the step count.

    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_async_faults.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from earl.runtime.async_rl import ASYNC_JSON
from earl.runtime.checkpoint import find_checkpoint, read_meta
from earl.runtime.dist import run_local
from earl.runtime.run_config import RunConfig, apply_overrides
from earl.trace import read_chrome_trace

ASYNC = ["--set", "groups=2", "--set", "group_size=2", "--set", "plots=false", "--set", "transcript_every=0",
         "--set", "schedule.mode=async"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _rows(out):
    p = out / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.is_file() else []


def _earl_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "earl.cli", "run", "--quiet", *args], capture_output=True, text=True,
                          timeout=600, env={**ENV, **(env or {})})


@pytest.mark.slow
@pytest.mark.dist
def test_checkpoint_every_during_an_async_run(tmp_path):
    """checkpoint_every 2 over 5 steps: checkpoints after steps 2 and 4 mid-run (each rank's copy
    of the version checked equal) and 5 at the end; all resume (keep_checkpoints 3)."""
    out = tmp_path / "run"
    r = _earl_run("--nproc", "2", "--steps", "5", "--out", str(out), *ASYNC, "--set", "checkpoint_every=2",
                  "--set", "keep_checkpoints=3", "--set", "schedule.partial_rollout=true")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a checkpoint every 2 steps and at the end" in r.stdout
    assert json.loads((out / ASYNC_JSON).read_text())["mid_run_checkpoints"] == [2, 4]
    got = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert got == ["step-000002", "step-000004", "step-000005"]
    for step in (2, 4):
        meta = read_meta(out / "checkpoints" / f"step-{step:06d}")
        assert (meta["step"], meta["optimizer_step"], meta["schedule"]) == (step, step, "async")


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("pool", ["train", "rollout"])
def test_a_killed_rank_stops_the_run_and_its_checkpoint_resumes(tmp_path, pool):
    """A rank of either pool dies at step 3 of 4 (checkpoint_every 1): the launcher's one line
    with the resume hint, torchrun's traceback kept in launch.log, a mid-run checkpoint
    written before the death; resuming it continues the step count to the end."""
    rank = 0 if pool == "train" else 1
    out = tmp_path / "run"
    r = _earl_run("--nproc", "2", "--steps", "4", "--out", str(out), *ASYNC, "--set", "checkpoint_every=1",
                  env={"EARL_FAULT_RANK_STEP": f"{rank}:3"})
    assert r.returncode != 0
    assert f"rank {rank}: injected fault at step 3" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("--resume") == 1, r.stderr
    assert f"continue with earl run --resume {out}" in r.stderr and (out / "launch.log").is_file()
    saved = read_meta(find_checkpoint(out))["step"]
    assert 1 <= saved <= 2  # the trainer dies after its checkpoint of step 2; a rollout rank before
    assert [x["step"] for x in _rows(out)][:saved] == list(range(1, saved + 1))
    # the trace is written with each checkpoint, both pools' spans in it (the replica's ride with its episodes)
    spans = read_chrome_trace(out / "trace.json")
    for name, rank in (("rollout", 1), ("train_step", 0)):
        assert set(range(1, saved + 1)) <= {s.step for s in spans if s.name == name and s.rank == rank}, name
    r = _earl_run("--resume", str(out), "--nproc", "2", "--steps", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"steps {saved + 1}-4 from" in r.stdout
    rows = _rows(out)
    assert [x["step"] for x in rows] == [1, 2, 3, 4] and all(x["schedule"] == "async" for x in rows)
    assert read_meta(find_checkpoint(out))["step"] == 4


@pytest.mark.slow
@pytest.mark.dist
def test_sigterm_stops_an_async_run_after_a_checkpointed_step(tmp_path):
    """SIGTERM to the launcher (a scheduler's preemption): every rank stops after the same step,
    its checkpoint is written, one line names it and the resume command, exit 143; resuming
    continues with every metrics row present once."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "earl.cli", "run", "--quiet", "--nproc", "2", "--steps", "400",
                             "--out", str(out), *ASYNC, "--set", "checkpoint_every=1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.time() + 300
    while time.time() < deadline and len(_rows(out)) < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 143, err
    assert len(lines) == 1 and "stopped by SIGTERM after step" in lines[0], err
    assert f"continue with earl run --resume {out}" in lines[0]
    step = read_meta(find_checkpoint(out))["step"]
    assert step == int(lines[0].split("after step ")[1].split(";")[0]) and 2 <= step < 400
    assert [x["step"] for x in _rows(out)] == list(range(1, step + 1))
    r = _earl_run("--resume", str(out), "--nproc", "2", "--steps", str(step + 2))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [x["step"] for x in _rows(out)] == list(range(1, step + 3))


def _train_until(out: str, cfg: RunConfig, deadline_s: float | None, resume: str | None):
    from earl.runtime.run import run_training

    res = run_training(cfg, out, resume=resume, progress=False, echo=lambda m: None, deadline_s=deadline_s)
    return res.first_step, res.last_step, res.preempted, str(res.last_checkpoint), len(res.metrics)


@pytest.mark.slow
@pytest.mark.dist
def test_a_deadline_stops_an_async_run_with_a_checkpoint(tmp_path):
    """deadline_s 0: the run stops after its first step, checkpointed (not a preemption); the
    resumed run goes on from step 2 to the end."""
    cfg = dataclasses.replace(apply_overrides(RunConfig(), {"groups": 2, "group_size": 2, "plots": False,
                                                            "transcript_every": 0, "schedule.mode": "async"}),
                              steps=3)
    out = str(tmp_path / "run")
    got = run_local(_train_until, 2, out, cfg, 0.0, None, timeout_s=300)
    assert got[0][:3] == (1, 1, False) and got[0][3].endswith("step-000001") and got[0][4] == 1
    assert got[1][1] == 1  # the rollout rank stopped after the same step
    got = run_local(_train_until, 2, out, cfg, None, out, timeout_s=300)
    assert got[0][:3] == (2, 3, False) and got[0][3].endswith("step-000003")
    assert [x["step"] for x in _rows(tmp_path / "run")] == [1, 2, 3]
