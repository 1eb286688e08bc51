"""`earl run --nproc N` through the real CLI: torchrun processes, per-stage plans, clear errors."""

import json
import subprocess
import sys

import pytest

from earl.trace import read_chrome_trace


def earl(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "earl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                "PYTHONUNBUFFERED": "1"})


def test_plan_for_another_world_size_is_rejected():
    r = earl("run", "--rollout-plan", "tp2-dp1", "--steps", "1")
    assert r.returncode == 2 and "needs 2 processes, the run has 1; pass --nproc 2" in r.stderr


def test_bad_plan_is_rejected_before_any_process_starts():
    r = earl("run", "--nproc", "2", "--rollout-plan", "tp3-dp1", "--steps", "1")
    assert r.returncode == 2 and "tp3-dp1-mb1 needs 3 processes, the run has 2" in r.stderr
    r = earl("run", "--nproc", "4", "--rollout-plan", "tp4-dp1", "--steps", "1")
    assert r.returncode == 2 and "tp=4 does not divide tiny's 2 key/value heads" in r.stderr


@pytest.mark.dist
def test_two_processes_run_with_their_plans(tmp_path):
    out = tmp_path / "run"
    r = earl("run", "--nproc", "2", "--rollout-plan", "tp2-dp1", "--train-plan", "tp1-dp2-zero",
             "--steps", "2", "--out", str(out), "--set", "host_probe=5")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert (out / "trace.json").is_file()
    assert "tp2-dp1" in r.stdout and "tp1-dp2" in r.stdout
    # one timeline for both ranks (earl.runtime.dist.aligned_origin): the ranks' spans of a
    # collective stage overlap in time, each step (they were offset by the ranks' start-up skew);
    # a dispatch of local copies with no statistics to reduce waits for no one (`waits`)
    spans = read_chrome_trace(out / "trace.json")
    for step in (1, 2):
        for stage in ("dispatch", "train", "metadata"):  # the metadata all-gather: its own span
            got = [s for s in spans if s.step == step and stage in (s.stage, s.name)]
            assert {s.rank for s in got} == {0, 1}, (step, stage)
            if all(s.args.get("waits", True) for s in got):
                assert max(s.t_start for s in got) <= min(s.t_end for s in got), (step, stage, got)
            else:
                assert not any(s.args["waits"] for s in got) and all(s.args["reductions"] == 0 for s in got)
    # each dispatch span says where its time went: the executor's seconds after its start
    # barrier (advantages, statistics round included, and each phase) within the span
    for s in (s for s in spans if s.stage == "dispatch"):
        assert 0 < s.args["moved_s"] <= s.duration_s, s
        assert s.args["advantage_s"] + sum(s.args["phase_s"]) <= s.args["moved_s"] + 1e-5, s
        assert len(s.args["phase_s"]) >= 1, s
    # the host probe (earl/runtime/hostprobe.py): one reading per rank and step, stage "other"
    probes = [s for s in spans if s.name == "host_probe"]
    assert sorted((s.step, s.rank) for s in probes) == [(st, r) for st in (1, 2) for r in range(2)]
    assert all(s.stage == "other" and s.args["iters"] == 5 and 0 < s.args["probe_s"] < 0.1 for s in probes)
