"""Ctrl-C mid-run leaves the last complete checkpoint intact and `--resume` continues from it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from earl.runtime.checkpoint import find_checkpoint, read_meta


@pytest.mark.slow
def test_ctrl_c_keeps_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "earl.cli", "run", "--out", str(out), "--steps", "400", "--quiet",
           "--set", "groups=2", "--set", "group_size=4", "--set", "checkpoint_every=3",
           "--set", "threads=1", "--set", "plots=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "checkpoints" / "latest").is_file():
        time.sleep(0.2)
    time.sleep(0.7)  # land somewhere mid-step, possibly mid-checkpoint
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "last complete checkpoint" in err
    ckpt = find_checkpoint(out)
    step = read_meta(ckpt)["step"]
    assert step % 3 == 0 and not list((out / "checkpoints").glob(".tmp-*"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] >= step  # whole lines only
    res = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--resume", str(out),
                          "--steps", str(step + 2), "--quiet"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, step + 3))


@pytest.mark.slow
@pytest.mark.dist
def test_ctrl_c_on_nproc_2_is_quiet_and_resumable(tmp_path):
    """Ctrl-C reaches the launcher, torchrun and both ranks (one process group, as from a
    terminal): a few lines on stderr, no traceback, the resume hint; torchrun's noise is kept in
    <out>/launch.log, and the resume command works."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "earl.cli", "run", "--nproc", "2", "--out", str(out), "--steps", "400", "--quiet",
           "--set", "groups=2", "--set", "group_size=4", "--set", "checkpoint_every=1", "--set", "plots=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline and not (out / "checkpoints" / "latest").is_file():
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert f"continue with earl run --resume {out}" in err
    assert (out / "launch.log").is_file()
    step = read_meta(find_checkpoint(out))["step"]
    res = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--resume", str(out), "--steps", str(step + 1),
                          "--quiet"], capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
