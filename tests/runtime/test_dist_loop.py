"""The multi-process loop end to end under torchrun (2 gloo ranks): plan switches in flight,
a memory-budget re-plan that retries the step, a killed rank, and resume on another plan.

    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_dist_loop.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from earl.runtime.launch import torchrun_command
from earl.trace import read_chrome_trace

SMALL = ["--set", "groups=2", "--set", "group_size=4", "--set", "plots=false"]


def _launch(args: list[str], extra_env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return subprocess.run(torchrun_command(2, args), env=env, capture_output=True, text=True, timeout=300)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.dist
def test_plan_switch_mid_training_keeps_training(tmp_path):
    out = tmp_path / "run"
    r = _launch(["--out", str(out), "--rollout-plan", "tp2-dp1", "--train-plan", "tp1-dp2-zero",
                 "--schedule", "2:train:tp2-dp1", "--schedule", "3:rollout:tp1-dp2",
                 "--set", "steps=4", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(out)
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    assert rows[0]["plan_train"].startswith("tp1-dp2") and rows[-1]["plan_train"].startswith("tp2-dp1")
    assert rows[-1]["plan_rollout"].startswith("tp1-dp2")
    assert "tp1-dp2-mb1-zero -> tp2-dp1-mb1" in rows[1]["switch_reasons"]
    assert all(x["samples_trained"] == 8 and x["loss"] == x["loss"] for x in rows)
    assert all("reward_mean" in x for x in rows)
    names = {s.name for s in read_chrome_trace(out / "trace.json")}
    assert {"switch_train", "switch_rollout", "train_to_rollout", "train_step"} <= names


@pytest.mark.slow
@pytest.mark.dist
def test_memory_budget_replans_and_retries_the_step(tmp_path):
    base = tmp_path / "base"
    r = _launch(["--out", str(base), "--train-plan", "tp1-dp2", "--set", "steps=1", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    need = _rows(base)[0]["memory_accounted_bytes"]
    out = tmp_path / "tight"
    budget_mb = 0.97 * need / 2**20
    r = _launch(["--out", str(out), "--train-plan", "tp1-dp2", "--memory-budget-mb", f"{budget_mb:.4f}",
                 "--set", "steps=2", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(out)
    assert rows[0]["replans"] == 1 and "memory budget" in rows[0]["switch_reasons"]
    assert rows[0]["plan_train"] != "tp1-dp2-mb1"
    assert rows[0]["memory_accounted_bytes"] <= budget_mb * 2**20
    # same samples as the unconstrained run: nothing lost, nothing skipped
    assert rows[0]["samples_trained"] == 8 and rows[0]["reward_mean"] == _rows(base)[0]["reward_mean"]


@pytest.mark.slow
@pytest.mark.dist
def test_killed_rank_stops_cleanly_and_resume_on_another_plan(tmp_path):
    out = tmp_path / "run"
    args = ["--out", str(out), "--train-plan", "tp1-dp2-zero", "--set", "steps=5",
            "--set", "checkpoint_every=2", *SMALL]
    r = _launch(args, {"EARL_FAULT_RANK_STEP": "1:4"})
    assert r.returncode != 0
    assert "injected fault at step 4" in r.stderr
    assert (out / "checkpoints" / "step-000002").is_dir()
    assert not (out / "checkpoints" / "step-000004").exists()
    r = _launch(["--out", str(out), "--resume", str(out), "--train-plan", "tp2-dp1",
                 "--rollout-plan", "tp2-dp1", "--set", "steps=5"])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(out)
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["plan_train"] == "tp2-dp1-mb1"
    assert (out / "checkpoints" / "step-000005").is_dir()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-m", "slow"]))


def test_bad_multi_process_options_are_one_line_errors():
    from earl.runtime.dist_loop import dist_options, parse_args

    with pytest.raises(ValueError, match=r"expected STEP:rollout\|experience\|train:PLAN"):
        dist_options(2, schedule=["2:warmup:tp2"])
    with pytest.raises(ValueError, match="cannot parse plan"):
        dist_options(2, train_plan="tp2-xx")
    with pytest.raises(ValueError, match="--out DIR"):
        parse_args(["--steps", "3"])
    with pytest.raises(ValueError, match="--nproc must be an integer >= 2"):
        torchrun_command(1, [])
    from earl.runtime.dist_loop import check_launch

    with pytest.raises(ValueError, match="tp=4 does not divide tiny's 2 key/value heads"):
        check_launch(4, ["--out", "x", "--train-plan", "tp4-dp1"])
    with pytest.raises(ValueError, match="unknown config key 'trainer.lrr'"):
        check_launch(2, ["--out", "x", "--set", "trainer.lrr=1"])
    with pytest.raises(ValueError, match="trainer.minibatches=1"):
        check_launch(2, ["--out", "x", "--set", "trainer.minibatches=2"])
    assert "--out" in check_launch(2, ["--steps", "2"])  # one default folder for every rank
    opts = dist_options(4, rollout_plan="tp2-dp2")
    assert opts.train_plan.dp == 4 and opts.train_plan.sharded_optimizer and opts.rollout_plan.tp == 2


@pytest.mark.slow
@pytest.mark.dist
def test_cost_model_selector_switch_is_applied_in_flight(tmp_path):
    out = tmp_path / "run"
    r = _launch(["--out", str(out), "--train-plan", "tp1-dp2-zero", "--set", "selector=cost-model",
                 "--set", "steps=3", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    decisions = [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines() if x.strip()]
    switched = [d for d in decisions if d.get("switched") and d["stage"] == "train"]
    applied = [d for d in decisions if "from" in d and d["stage"] == "train"]
    assert switched and applied, "the selector did not switch the train plan in this setting"
    assert applied[0]["to"] == switched[0]["plan"]
    rows = _rows(out)
    assert rows[-1]["plan_train"] == applied[0]["to"] and len(rows) == 3


@pytest.mark.slow
@pytest.mark.dist
def test_same_run_on_two_train_plans_gives_the_same_metrics(tmp_path):
    """Training on tp2-dp1 or on tp1-dp2 with a sharded optimizer is the same computation."""
    rows = {}
    for train in ("tp2-dp1", "tp1-dp2-zero"):
        out = tmp_path / train
        r = _launch(["--out", str(out), "--rollout-plan", "tp2-dp1", "--train-plan", train,
                     "--set", "steps=3", *SMALL])
        assert r.returncode == 0, r.stderr[-3000:]
        rows[train] = _rows(out)
    a, b = rows["tp2-dp1"], rows["tp1-dp2-zero"]
    assert any(x["loss"] != 0 for x in a), "no learning signal in this setting"
    for x, y in zip(a, b, strict=True):
        assert x["reward_mean"] == y["reward_mean"] and x["train_tokens"] == y["train_tokens"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-3, abs=1e-6)
