"""SIGTERM (a scheduler's preemption) mid-run: the current step finishes, its checkpoint is
written, the run exits 143 with one line naming `--resume OUT`, and resuming continues with
every metrics row present exactly once; under --nproc the launcher passes SIGTERM to every rank.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_preempt.py
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from earl.runtime.checkpoint import find_checkpoint, read_meta

SETS = ["--set", "groups=2", "--set", "group_size=2", "--set", "checkpoint_every=1000", "--set", "plots=false",
        "--set", "threads=1"]


def _rows(out):
    p = out / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


def _preempt_and_resume(tmp_path, nproc: int):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "earl.cli", "run", "--out", str(out), "--steps", "400", "--quiet",
           *(["--nproc", str(nproc)] if nproc > 1 else []), *SETS]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 180
    while time.time() < deadline and len(_rows(out)) < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # to the launcher alone, as a scheduler would
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 143, err
    assert len(lines) == 1 and "stopped by SIGTERM after step" in lines[0], err
    assert f"continue with earl run --resume {out}" in lines[0] and "Traceback" not in err
    step = read_meta(find_checkpoint(out))["step"]
    assert step == int(lines[0].split("after step ")[1].split(";")[0]) and step < 400
    assert [r["step"] for r in _rows(out)] == list(range(1, step + 1))
    res = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--resume", str(out), "--steps", str(step + 2),
                          "--quiet", *(["--nproc", str(nproc)] if nproc > 1 else [])],
                         capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    assert [r["step"] for r in _rows(out)] == list(range(1, step + 3))


def test_sigterm_checkpoints_the_step_and_resumes(tmp_path):
    _preempt_and_resume(tmp_path, 1)


@pytest.mark.slow
@pytest.mark.dist
def test_sigterm_to_the_launcher_reaches_every_rank(tmp_path):
    _preempt_and_resume(tmp_path, 2)
