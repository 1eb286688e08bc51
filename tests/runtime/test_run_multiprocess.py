"""The same run on several processes (`earl run --nproc 2`, gloo under torchrun): equal to one
process, resume across world sizes and plans, plan switches in flight, a memory-budget re-plan
that retries the step, a killed rank, and rank 0's control-plane bytes.

    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_run_multiprocess.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from earl.policies import make_selector
from earl.runtime.hf_model import hf_config_from_spec, model_shapes
from earl.runtime.launch import torchrun_command
from earl.runtime.resolve import check_config, initial_plans, resolve_config, selector_cost_model
from earl.runtime.run_config import RunConfig
from earl.runtime.worker import runnable
from earl.specs import MODEL_CATALOG, ParallelPlan, Stage
from earl.trace import read_chrome_trace

SMALL = ["--set", "groups=2", "--set", "group_size=4", "--set", "plots=false", "--quiet"]
# metrics that depend on the clock or the process layout, not on the computation
LAYOUT = ("world", "plan_rollout", "plan_experience", "plan_train", "control_recv_bytes", "peak_mem_bytes",
          "memory_accounted_bytes", "handoff_bytes", "dispatch_bytes", "dispatch_transfers")


def earl_run(args: list[str], extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "earl.cli", "run", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def decisions_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines() if x.strip()]


def assert_same_computation(a: list[dict], b: list[dict]) -> None:
    """Same episodes (rewards, tokens, outcomes) exactly; losses to float-reduction order."""
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b, strict=True):
        for k in ("reward_mean", "tokens", "train_tokens", "invalid_move_rate", "context_mean"):
            assert x[k] == y[k], (k, x[k], y[k])
        for k in ("loss", "pg_loss", "entropy", "grad_norm", "legal_loss"):
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), k


@pytest.mark.slow
@pytest.mark.dist
def test_one_and_two_processes_run_the_same_step(tmp_path):
    """`earl run` and `earl run --nproc 2` on the same config: equal rewards (exactly) and losses
    (to 1e-4 relative: gradient sums are reduced in another order), the same metric columns and
    one decision per stage per step in both."""
    one, two = tmp_path / "one", tmp_path / "two"
    r = earl_run(["--out", str(one), "--steps", "3", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    r = earl_run(["--out", str(two), "--steps", "3", "--nproc", "2", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = rows_of(one), rows_of(two)
    assert list(a[0]) == list(b[0])  # the same columns, in the same order
    assert {x["world"] for x in a} == {1} and {x["world"] for x in b} == {2}
    assert any(x["loss"] != 0 for x in a), "no learning signal in this setting"
    assert_same_computation(a, b)
    for out in (one, two):
        stages = [d["stage"] for d in decisions_of(out) if "predicted" in d]
        assert stages == ["rollout", "experience", "train"] * 3
    assert (one / "metrics.csv").read_text().splitlines()[0] == (two / "metrics.csv").read_text().splitlines()[0]
    # the default REINFORCE++'s key sums come with the metadata (no KL penalty): no training
    # dispatch reduces its statistics, on two ranks as in one process
    for out, want in ((one, 0), (two, 0)):
        got = [sp.args["reductions"] for sp in read_chrome_trace(out / "trace.json") if sp.stage == "dispatch"]
        assert got and set(got) == {want}, (out.name, got)
    # transcripts: rank 0 writes episodes it played itself (rollout tp1-dp2: the even ids)
    tr = {out: [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()] for out in (one, two)}
    assert tr[one] and tr[two] and {t["step"] for t in tr[one] + tr[two]} == {3}
    assert all(t["episode"] % 2 == 0 for t in tr[two])


@pytest.mark.slow
@pytest.mark.dist
def test_resume_across_world_sizes_and_plans(tmp_path):
    """1 process -> 2 processes, 2 -> 1, and tp2 -> tp1 all continue at the next step and
    compute what an uninterrupted run computes."""
    ref = tmp_path / "ref"
    assert earl_run(["--out", str(ref), "--steps", "3", *SMALL]).returncode == 0
    a = tmp_path / "a"
    assert earl_run(["--out", str(a), "--steps", "2", *SMALL]).returncode == 0
    r = earl_run(["--resume", str(a), "--nproc", "2", "--steps", "3", "--quiet"])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(a)
    assert [x["step"] for x in rows] == [1, 2, 3] and rows[-1]["world"] == 2
    assert_same_computation(rows, rows_of(ref))

    b = tmp_path / "b"
    assert earl_run(["--out", str(b), "--steps", "2", "--nproc", "2", *SMALL]).returncode == 0
    r = earl_run(["--resume", str(b), "--steps", "3", "--quiet"])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(b)
    assert [x["step"] for x in rows] == [1, 2, 3] and rows[-1]["world"] == 1
    assert_same_computation(rows, rows_of(ref))

    c = tmp_path / "c"
    r = earl_run(["--out", str(c), "--steps", "2", "--nproc", "2", "--rollout-plan", "tp2-dp1",
                  "--train-plan", "tp2-dp1", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    r = earl_run(["--resume", str(c), "--steps", "3", "--quiet"])  # tp2 -> one process (tp1)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(c)
    assert rows[1]["plan_train"].startswith("tp2-dp1") and rows[2]["plan_train"].startswith("tp1-dp1")
    assert_same_computation(rows, rows_of(ref))


@pytest.mark.slow
@pytest.mark.dist
def test_rank0_control_bytes_do_not_grow_with_tokens(tmp_path):
    """Outside the dispatcher (and the weight re-shards), rank 0 receives per-sample metadata
    and reduced scalars only: 5x longer episodes leave its bytes per step unchanged."""
    got = {}
    for gen in (2, 64):
        out = tmp_path / f"gen{gen}"
        r = earl_run(["--out", str(out), "--steps", "2", "--nproc", "2", "--set", f"sampling.max_new_tokens={gen}",
                      "--set", "sampling.stop=@@@@", "--set", "sampling.max_context=4096", *SMALL])
        assert r.returncode == 0, r.stderr[-3000:]
        got[gen] = rows_of(out)
    small, large = got[2], got[64]
    tokens_ratio = sum(x["tokens"] for x in large) / sum(x["tokens"] for x in small)
    assert tokens_ratio > 2.0, tokens_ratio
    for x, y in zip(small, large, strict=True):
        assert y["control_recv_bytes"] <= 1.15 * x["control_recv_bytes"], (x["control_recv_bytes"],
                                                                            y["control_recv_bytes"])
        assert y["control_recv_bytes"] / y["episodes"] < 2000  # bytes per sample, spans included
        assert y["handoff_bytes"] + y["dispatch_bytes"] >= 0


@pytest.mark.slow
@pytest.mark.dist
def test_plan_switch_mid_training_keeps_training(tmp_path):
    out = tmp_path / "run"
    r = earl_run(["--out", str(out), "--nproc", "2", "--rollout-plan", "tp2-dp1", "--train-plan", "tp1-dp2-zero",
                  "--schedule", "2:train:tp2-dp1", "--schedule", "3:rollout:tp1-dp2", "--steps", "4", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(out)
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    assert rows[0]["plan_train"].startswith("tp1-dp2") and rows[-1]["plan_train"].startswith("tp2-dp1")
    assert rows[-1]["plan_rollout"].startswith("tp1-dp2")
    assert "tp1-dp2-mb1-zero -> tp2-dp1-mb1" in rows[1]["switch_reasons"]
    assert all(x["samples_trained"] == 8 and x["loss"] == x["loss"] for x in rows)
    names = {s.name for s in read_chrome_trace(out / "trace.json")}
    assert {"switch_train", "switch_rollout", "train_to_rollout", "train_step", "handoff"} <= names


@pytest.mark.slow
@pytest.mark.dist
def test_memory_budget_replans_and_retries_the_step(tmp_path):
    base = tmp_path / "base"
    r = earl_run(["--out", str(base), "--nproc", "2", "--train-plan", "tp1-dp2", "--steps", "1", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    need = rows_of(base)[0]["memory_accounted_bytes"]
    out = tmp_path / "tight"
    budget_mb = 0.97 * need / 2**20
    r = earl_run(["--out", str(out), "--nproc", "2", "--train-plan", "tp1-dp2", "--memory-budget-mb",
                  f"{budget_mb:.4f}", "--steps", "2", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(out)
    assert rows[0]["replans"] == 1 and "memory budget" in rows[0]["switch_reasons"]
    assert rows[0]["plan_train"] != "tp1-dp2-mb1"
    assert rows[0]["memory_accounted_bytes"] <= budget_mb * 2**20
    # same samples as the unconstrained run: nothing lost, nothing skipped
    assert rows[0]["samples_trained"] == 8 and rows[0]["reward_mean"] == rows_of(base)[0]["reward_mean"]


@pytest.mark.slow
@pytest.mark.dist
def test_killed_rank_stops_cleanly_and_resume_on_another_plan(tmp_path):
    out = tmp_path / "run"
    args = ["--out", str(out), "--nproc", "2", "--train-plan", "tp1-dp2-zero", "--steps", "5",
            "--set", "checkpoint_every=2", *SMALL]
    r = earl_run(args, {"EARL_FAULT_RANK_STEP": "1:4"})
    assert r.returncode != 0
    assert "injected fault at step 4" in r.stderr
    # reported once by the launcher, torchrun's traceback kept in the run folder's launch.log
    assert "Traceback" not in r.stderr and r.stderr.count("--resume") == 1, r.stderr
    assert f"continue with earl run --resume {out}" in r.stderr and (out / "launch.log").is_file()
    assert (out / "checkpoints" / "step-000002").is_dir()
    assert not (out / "checkpoints" / "step-000004").exists()
    r = earl_run(["--resume", str(out), "--nproc", "2", "--train-plan", "tp2-dp1", "--rollout-plan", "tp2-dp1",
                  "--steps", "5", "--quiet"])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(out)
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["plan_train"] == "tp2-dp1-mb1"
    assert (out / "checkpoints" / "step-000005").is_dir()


@pytest.mark.slow
@pytest.mark.dist
def test_hung_rank_times_out_into_the_resume_hint_and_resumes(tmp_path):
    # a rank alive but silent (stuck user code, a wedged node): the others' collective gives up
    # after collective_timeout_s and the run stops with one line, its checkpoints intact
    out = tmp_path / "run"
    args = ["--out", str(out), "--nproc", "2", "--train-plan", "tp1-dp2", "--steps", "4", "--set",
            "checkpoint_every=2", "--set", "collective_timeout_s=5", *SMALL]
    t0 = time.monotonic()
    r = earl_run(args, {"EARL_FAULT_RANK_STEP": "1:3:hang"})
    assert r.returncode != 0 and "injected hang at step 3" in r.stderr
    assert "Timed out" in r.stderr and r.stderr.count("--resume") == 1, r.stderr
    assert time.monotonic() - t0 < 150  # the timeout, then the launcher's grace period; never a hang
    assert (out / "checkpoints" / "step-000002").is_dir() and len(rows_of(out)) == 2
    r = earl_run(["--resume", str(out), "--nproc", "2", "--steps", "4", "--quiet"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["step"] for x in rows_of(out)] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.dist
def test_cost_model_selector_switch_is_applied_in_flight(tmp_path):
    out = tmp_path / "run"
    r = earl_run(["--out", str(out), "--nproc", "2", "--train-plan", "tp1-dp2-zero", "--set",
                  "policy.selector=cost-model", "--steps", "3", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    decisions = decisions_of(out)
    switched = [d for d in decisions if d.get("switched") and d["stage"] == "train"]
    applied = [d for d in decisions if "from" in d and d["stage"] == "train"]
    assert switched and applied, "the selector did not switch the train plan in this setting"
    assert applied[0]["to"] == switched[0]["plan"]
    rows = rows_of(out)
    assert rows[-1]["plan_train"] == applied[0]["to"] and len(rows) == 3


@pytest.mark.slow
@pytest.mark.dist
def test_same_run_on_two_train_plans_gives_the_same_metrics(tmp_path):
    """Training on tp2-dp1 (DTensor TP, replicated optimizer) or on tp1-dp2 with a sharded
    optimizer (FSDP2) is the same computation as on one process."""
    one = tmp_path / "one"
    r = earl_run(["--out", str(one), "--steps", "3", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {}
    for train in ("tp2-dp1", "tp1-dp2-zero"):
        out = tmp_path / train
        r = earl_run(["--out", str(out), "--nproc", "2", "--rollout-plan", "tp2-dp1", "--train-plan", train,
                      "--steps", "3", *SMALL])
        assert r.returncode == 0, r.stderr[-3000:]
        rows[train] = rows_of(out)
    assert any(x["loss"] != 0 for x in rows["tp2-dp1"]), "no learning signal in this setting"
    assert_same_computation(rows_of(one), rows["tp2-dp1"])  # DTensor TP training
    assert_same_computation(rows["tp2-dp1"], rows["tp1-dp2-zero"])  # FSDP2


def test_bad_multi_process_options_are_one_line_errors():
    with pytest.raises(ValueError, match=r"expected STEP:rollout\|experience\|train:PLAN"):
        check_config(resolve_config(overrides={"nproc": 2, "plan.schedule": "2:warmup:tp2"}))
    with pytest.raises(ValueError, match="cannot parse plan"):
        check_config(resolve_config(overrides={"nproc": 2, "plan.train": "tp2-xx"}))
    with pytest.raises(ValueError, match="--nproc must be an integer >= 2"):
        torchrun_command(1, Path("c.json"), Path("out"))
    with pytest.raises(ValueError, match="tp=4 does not divide tiny's 2 key/value heads"):
        check_config(resolve_config(overrides={"nproc": 4, "plan.train": "tp4-dp1"}))
    with pytest.raises(ValueError, match="needs 4 processes, the run has 2"):
        check_config(resolve_config(overrides={"nproc": 2, "plan.train": "tp1-dp4"}))
    with pytest.raises(ValueError, match="unknown config key 'trainer.lrr'"):
        resolve_config(overrides={"trainer.lrr": "1"})
    check_config(RunConfig(nproc=4))  # the defaults fit any world size


def test_prelaunch_check_of_plans_fsdp2_cannot_shard():
    """dp=3 does not divide tiny's o_proj/down_proj input features (64, 128): FSDP2 refuses that
    uneven dim-1 sharding, so an explicit `zero` plan is a one-line error naming the plan, the
    tensor, its size and the valid dp values; the default for 3 processes drops `zero`; the
    selector never offers such a plan; and its cost model has 3 processes on one node (not
    the profile's 2-GPU nodes)."""
    with pytest.raises(ValueError, match=r"^train plan tp1-dp3-mb1-zero: FSDP2 cannot shard "
                                         r"model\.layers\.0\.self_attn\.o_proj\.weight \(64 along dim 1 per "
                                         r"tp rank\) over dp=3: .* valid dp with tp=1 and `zero`: 1, 2, 4, 8, 16, "
                                         r"32, 64 \(or drop `zero`\)$"):
        check_config(resolve_config(overrides={"nproc": 3, "plan.train": "tp1-dp3-zero"}))
    with pytest.raises(ValueError, match=r"^scheduled train plan tp1-dp3-mb1-zero: FSDP2 cannot shard"):
        check_config(resolve_config(overrides={"nproc": 3, "plan.schedule": "2:train:tp1-dp3-zero"}))
    check_config(RunConfig(nproc=3))
    assert initial_plans(RunConfig(nproc=3), 3).train == ParallelPlan(dp=3)
    assert initial_plans(RunConfig(nproc=4), 4).train == ParallelPlan(dp=4, sharded_optimizer=True)
    cm = selector_cost_model(MODEL_CATALOG["tiny"], "cpu-measured", 3)
    assert (cm.cluster.nodes, cm.cluster.gpus_per_node) == (1, 3)
    shapes, config = model_shapes("tiny"), hf_config_from_spec(MODEL_CATALOG["tiny"], "fp32")
    selector = make_selector("cost-model", cost_model=cm, initial=initial_plans(RunConfig(nproc=3), 3), stage_gpus=3,
                             can_run=lambda stage, plan: runnable(plan, 3, config, shapes, stage))
    train = selector.scorer.candidates(Stage.TRAIN)
    assert train and all(p.dp == 3 and not p.sharded_optimizer for p in train)
    assert ParallelPlan(dp=3) in train


@pytest.mark.slow
@pytest.mark.dist
def test_three_processes_run_on_a_plan_fsdp2_can_shard(tmp_path):
    """`earl run --nproc 3` on the default tiny model: dp=3 cannot be FSDP2-sharded, so training
    runs replicated over 3 processes."""
    out = tmp_path / "three"
    r = earl_run(["--out", str(out), "--nproc", "3", "--steps", "2", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(out)
    assert [x["step"] for x in rows] == [1, 2] and {x["plan_train"] for x in rows} == {"tp1-dp3-mb1"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-m", "slow"]))


@pytest.mark.slow
@pytest.mark.dist
def test_bf16_runs_on_two_processes_through_plan_switches_checkpoints_and_resume(tmp_path):
    """A bf16 model on 2 processes: FSDP2 (tp1-dp2-zero) -> DTensor TP (tp2) in flight (weights
    bf16, fp32 moments and master weights moved by the re-shard planner), checkpoints with fp32 optimizer state, and a
    resume on one process."""
    out = tmp_path / "run"
    bf16 = ["--set", "model.dtype=bf16"]
    r = earl_run(["--out", str(out), "--nproc", "2", "--rollout-plan", "tp2-dp1", "--train-plan", "tp1-dp2-zero",
                  "--schedule", "2:train:tp2-dp1", "--steps", "3", *bf16, *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(out)
    assert [x["step"] for x in rows] == [1, 2, 3] and all(x["loss"] == x["loss"] for x in rows)
    meta = json.loads((out / "checkpoints" / "step-000003" / "meta.json").read_text())
    assert {v["dtype"] for v in meta["layout"]["tensors"].values()} == {"bfloat16"}
    opt = meta["layout"]["optimizer"]
    assert {v for v in opt.values()} == {"float32"} and any(k.endswith("/master") for k in opt)
    r = earl_run(["--resume", str(out), "--steps", "4", "--quiet"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["step"] for x in rows_of(out)] == [1, 2, 3, 4]
