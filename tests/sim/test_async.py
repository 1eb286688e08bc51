"""Asynchronous RL in the simulator: staleness stays within its bound, K = 0 is synchronous
training on separate pools, partial rollout interrupts and recomputes (or, the runtime's way,
keeps the cache), the cost model picks a
pool split, and the schedule keys are checked.

    python -m pytest tests/sim/test_async.py -q
"""

from __future__ import annotations

import pytest
import simpy

from earl.cost_model import CostModel
from earl.policies.pools import choose_pool_split
from earl.sim.async_rl import StreamReplica, weight_push_s
from earl.sim.scenario import load_scenario
from earl.sim.simulation import Simulation
from earl.sim.workload import Episode
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec, ParallelPlan, StagePlan, WorkloadStats

SMALL = {"scenario.steps": "6", "workload.episodes_per_step": "64", "workload.growth_steps": "6",
         "schedule.mode": "async", "schedule.rollout_gpus": "4", "plan.rollout": "tp1",
         "plan.experience": "tp1", "plan.train": "tp1-mb1-zero"}


def run(**sets) -> Simulation:
    merged = {**SMALL, **{k.replace("__", "."): str(v) for k, v in sets.items()}}
    return Simulation(load_scenario("connect-four-small", merged), "static", "centralized").run()


@pytest.mark.parametrize("k", [0, 1, 3])
def test_staleness_never_exceeds_the_bound(k):
    sim = run(schedule__max_staleness=k)
    assert len(sim.rows) == 6
    assert max(r["staleness_max"] for r in sim.rows) <= k
    assert all(r["episodes"] == 64 for r in sim.rows)
    if k == 0:
        assert all(r["staleness_mean"] == 0 for r in sim.rows)
    else:
        assert max(r["staleness_max"] for r in sim.rows) == k  # the rollout runs ahead


def test_staleness_buys_throughput():
    sync_pools = run(schedule__max_staleness=0)
    ahead = run(schedule__max_staleness=2)
    t0 = sum(r["step_time_s"] for r in sync_pools.rows)
    t2 = sum(r["step_time_s"] for r in ahead.rows)
    assert t2 < t0
    # K = 0: nothing overlaps, a step is the batch's rollout, then training, then the push
    for r in sync_pools.rows[1:]:
        parts = r["rollout_s"] + r["experience_s"] + r["dispatch_s"] + r["train_s"] + r["sync_s"] + r["reshard_s"]
        assert r["step_time_s"] == pytest.approx(parts + r["restart_s"], rel=1e-9)


def test_partial_rollout_interrupts_and_recomputes():
    whole = run(schedule__max_staleness=1, schedule__partial_rollout="false")
    partial = run(schedule__max_staleness=1, schedule__partial_rollout="true")
    assert sum(r["recompute_tokens"] for r in partial.rows) > sum(r["recompute_tokens"] for r in whole.rows)
    assert [r["trained_tokens"] for r in partial.rows] != [] and partial.rows[-1]["rollout_gpus"] == 4


def test_stream_replica_drains_before_loading_new_weights():
    cm = CostModel(ModelSpec.from_name("qwen2.5-7b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=1, gpus_per_node=1))
    env = simpy.Environment()
    done = []
    rep = StreamReplica(env, cost_model=cm, tp=1, partial=False,
                        on_done=lambda i, t, v, dropped: done.append((i, v)))
    rep.feed([Episode(id=0, turns=((100, 400, 0.0),))])

    def later():
        yield env.timeout(1e-3)
        rep.update(1)  # while episode 0 decodes
        rep.feed([Episode(id=1, turns=((100, 10, 0.0),))])
        yield env.timeout(10.0)
        rep.stop()

    env.process(later())
    env.run()
    assert done == [(0, 0), (1, 1)]  # episode 1 waited for the drain and ran on version 1


def test_partial_update_recomputes_or_keeps_the_cache():
    """A weight update mid-episode under partial rollout: the stream feed's replica (AReaL)
    re-admits the episode and recomputes its context; the runtime's (per-step feed, PipelineRL)
    swaps between two iterations and goes on with the cached K/V, finishing sooner."""
    cm = CostModel(ModelSpec.from_name("qwen2.5-7b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=1, gpus_per_node=1))

    def play(keep_kv: bool):
        env = simpy.Environment()
        done = []
        rep = StreamReplica(env, cost_model=cm, tp=1, partial=True, keep_kv=keep_kv,
                            on_done=lambda i, t, v, dropped: done.append((i, v, t)))
        rep.feed([Episode(id=0, turns=((2000, 400, 0.0),))])

        def later():
            yield env.timeout(0.05)
            rep.update(1)  # while episode 0 decodes
            yield env.timeout(100.0)
            rep.stop()

        env.process(later())
        env.run()
        (ep, version, t_done), = done
        assert (ep, version, rep.version, rep.interruptions) == (0, 0, 1, 1)  # staleness: its first token's
        assert rep.stats.generated_tokens == 400
        return rep.stats, t_done

    kept, t_kept = play(True)
    redone, t_redone = play(False)
    assert kept.recompute_tokens == 0 and kept.prefill_tokens == 2000
    assert redone.recompute_tokens > 2000 and redone.prefill_tokens == 2000 + redone.recompute_tokens
    assert t_kept < t_redone


def test_cost_model_chooses_the_split():
    sim = Simulation(load_scenario(None, {"scenario.steps": "1", "schedule.mode": "async",
                                          "schedule.rollout_gpus": "0", "workload.episodes_per_step": "64"}),
                     "static", "centralized")
    split = sim.split
    assert split is not None and split.rollout_gpus % 8 == 0 and 0 < split.rollout_gpus < 128
    fewest = min(r["points_not_fitting"] for r in split.table)
    assert split.period_s == min(r["period_s"] for r in split.table if r["points_not_fitting"] == fewest)
    assert sim.stage_gpus[next(iter(sim.stage_gpus))] in (split.rollout_gpus, split.train_gpus)


def test_split_chooser_refuses_what_cannot_fit():
    cm = CostModel(ModelSpec.from_name("qwen2.5-72b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=2, gpus_per_node=8))
    plans = StagePlan(rollout=ParallelPlan(tp=1, dp=-1), experience=ParallelPlan(tp=1, dp=-1),
                      train=ParallelPlan(tp=1, dp=-1))
    stats = WorkloadStats(num_responses=64, context_mean=4000, context_p95=8000, context_max=9000,
                          response_tokens_mean=2000)
    with pytest.raises(ValueError, match="no rollout/training split"):
        choose_pool_split(cm, plans, stats, 16, granularity=8)


def test_weight_push_grows_with_the_model_shard():
    cm = CostModel(ModelSpec.from_name("qwen2.5-72b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=16, gpus_per_node=8))
    assert weight_push_s(cm, ParallelPlan(tp=4, dp=16), 64, 64) > weight_push_s(cm, ParallelPlan(tp=8, dp=8), 64, 64)


def test_schedule_keys_are_checked():
    with pytest.raises(ValueError, match="schedule.mode 'later'; valid: sync, async"):
        load_scenario(None, {"schedule.mode": "later"})
    with pytest.raises(ValueError, match="schedule.max_staleness must be an integer >= 0"):
        load_scenario(None, {"schedule.max_staleness": "-1"})
    with pytest.raises(ValueError, match="leave GPUs to train"):
        load_scenario(None, {"schedule.mode": "async", "schedule.rollout_gpus": "128"})


def test_async_scheduler_calls_only_public_stage_services():
    """The sync and async schedulers are two clients of the simulation's stage services: the
    async one reaches into no private state of the simulation."""
    import inspect

    from earl.sim import async_rl
    src = inspect.getsource(async_rl)
    assert "sim._" not in src
    for service in ("sim.begin_step()", "sim.learn(", "sim.finish_step(", "sim.span("):
        assert service in src
