"""The simulator's "per-step" async feed models the runtime's async design
(earl.runtime.async_rl): tp1 replicas play each step's share in turn, start it once they hold
version >= s - K, queue it for training (so up to K batches ahead when training is the slower
side), and the weight push is one broadcast of the whole policy.

    OMP_NUM_THREADS=1 python -m pytest -q tests/sim/test_async_matches_runtime.py
"""

from __future__ import annotations

import pytest

from earl.cost_model import CostModel
from earl.sim.async_rl import broadcast_push_s
from earl.sim.scenario import load_scenario
from earl.sim.simulation import Simulation
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec

SMALL = {"scenario.steps": "6", "workload.episodes_per_step": "32", "workload.growth_steps": "6",
         "schedule.mode": "async", "schedule.rollout_gpus": "2", "plan.rollout": "tp1",
         "plan.experience": "tp1", "plan.train": "tp1-mb1-zero"}


def run(feed: str = "per-step", **sets) -> Simulation:
    merged = {**SMALL, **{k.replace("__", "."): str(v) for k, v in sets.items()}}
    return Simulation(load_scenario("connect-four-small", merged), "static", "centralized", async_feed=feed).run()


def test_per_step_rollout_bound_stays_one_batch_ahead_whatever_k():
    """Rollout slower than training (7B, Connect Four): a replica never gets ahead, so K = 2
    runs as K = 1, step for step."""
    one, two = run(schedule__max_staleness=1), run(schedule__max_staleness=2)
    for sim in (one, two):
        assert [r["staleness_max"] for r in sim.rows] == [0, 1, 1, 1, 1, 1]
        assert all(r["episodes"] == 32 for r in sim.rows)
    assert [r["step_time_s"] for r in two.rows] == pytest.approx([r["step_time_s"] for r in one.rows], rel=1e-12)


SHORT = {"schedule__rollout_gpus": 6, "workload__turns_max": 1, "workload__turns_min": 1, "workload__growth": "none"}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_per_step_training_bound_runs_k_batches_ahead(k):
    """Short episodes on 6 rollout GPUs, training on 2: each replica plays ahead until the gate
    holds it, so batch j's samples are min(j, K) versions old, K reached and never exceeded."""
    sim = run(schedule__max_staleness=k, workload__gen_tokens=16, **SHORT)
    assert [r["staleness_max"] for r in sim.rows] == [min(j, k) for j in range(6)]
    assert all(r["episodes"] == 32 for r in sim.rows)


def test_per_step_long_tail_k2_buys_overlap():
    """A long tail of episode lengths (cv 1.5) with rollout about as long as training: a batch
    played ahead absorbs a slow one, so K = 2 is faster than K = 1, and K = 3 than K = 2."""
    tail = {**SHORT, "workload__gen_tokens": 64, "workload__gen_tokens_cv": 1.5, "scenario__steps": 12,
            "workload__growth_steps": 12}
    total = {k: sum(r["step_time_s"] for r in run(schedule__max_staleness=k, **tail).rows[1:]) for k in (1, 2, 3)}
    assert total[2] < 0.9 * total[1] and total[3] < total[2], total


def test_per_step_k0_is_the_sum_of_its_stages_and_k1_overlaps():
    k0, k1 = run(schedule__max_staleness=0), run(schedule__max_staleness=1)
    assert all(r["staleness_max"] == 0 for r in k0.rows)
    for r in k0.rows[1:]:
        parts = r["rollout_s"] + r["experience_s"] + r["dispatch_s"] + r["train_s"] + r["sync_s"] + r["reshard_s"]
        assert r["step_time_s"] == pytest.approx(parts + r["restart_s"], rel=1e-9)
    assert sum(r["step_time_s"] for r in k1.rows) < sum(r["step_time_s"] for r in k0.rows)


def test_stream_feed_runs_further_ahead_than_per_step():
    stream = run("stream", schedule__max_staleness=2)
    assert max(r["staleness_max"] for r in stream.rows) == 2  # batches 0..2 share the engines


def test_broadcast_push_is_a_tree_of_whole_policy_copies():
    cm = CostModel(ModelSpec.from_name("qwen2.5-7b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=1, gpus_per_node=8))
    one = cm.transfer_time_s(cm.model.num_params * cm.model.dtype_bytes, 0, 1)
    assert broadcast_push_s(cm, 0) == 0.0
    assert [broadcast_push_s(cm, r) for r in (1, 2, 3, 4, 7)] == pytest.approx([one, 2 * one, 2 * one, 3 * one,
                                                                                 3 * one])


def test_unknown_feed_is_refused():
    with pytest.raises(ValueError, match="unknown async_feed 'later'; valid: stream, per-step"):
        run("later")



def test_rollout_cost_model_prices_the_rollout_pool_alone():
    """`rollout_cost_model` (an async pool's share of a CPU host, earl.calibrate.validate_async,
    or other devices): a rollout pool priced 2x slower plays every share 2x longer; the training
    pool's stages keep their prices (the environment's own time, not the device's, stays: under
    1% of a share here); a sync run refuses it."""
    from earl.cost_model.profile import slowed

    sc = load_scenario("connect-four-small", {**SMALL, "schedule.max_staleness": "1"})
    plain = Simulation(sc, "static", "centralized", async_feed="per-step").run()
    slow = CostModel(plain.cm.model, plain.cm.cluster, slowed(plain.cm.profile, 2.0))
    slow_ro = Simulation(sc, "static", "centralized", async_feed="per-step", rollout_cost_model=slow).run()

    def rollout_s(sim):
        return sorted(s.duration_s for s in sim.spans if s.name == "rollout")

    assert rollout_s(slow_ro) == pytest.approx([2 * x for x in rollout_s(plain)], rel=0.01)
    assert all(a < 2 * b for a, b in zip(rollout_s(slow_ro), rollout_s(plain), strict=True))
    assert [r["train_s"] for r in slow_ro.rows] == pytest.approx([r["train_s"] for r in plain.rows], rel=1e-12)
    assert sum(r["step_time_s"] for r in slow_ro.rows) > 1.5 * sum(r["step_time_s"] for r in plain.rows)
    with pytest.raises(ValueError, match="rollout_cost_model prices an async run"):
        Simulation(load_scenario("connect-four-small", {"scenario.steps": "2"}), "static", "centralized",
                   rollout_cost_model=slow)
