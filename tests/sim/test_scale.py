"""The simulator at cluster scale: replica classes agree with the per-replica mode (within 2%
on step time and throughput at 1,024 GPUs), the array workload equals the per-episode one,
plans without a dp degree fill the cluster, and the batch can follow the cluster.

    python -m pytest tests/sim/test_scale.py -q            # fast ones
    python -m pytest tests/sim/test_scale.py -q -m slow    # the full 1,024-GPU agreement
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys

import numpy as np
import pytest
import simpy

from earl.cost_model import CostModel
from earl.policies.dispatch_cost import estimate_dispatch
from earl.sim.replica_classes import choose_replicas, deal, kv_drops
from earl.sim.rollout_engine import Replica
from earl.sim.scenario import load_scenario, parse_stage_plan
from earl.sim.simulation import Simulation
from earl.sim.workload import Draw, FlatDraw, Workload, keep_freed_memory, preset, truncate_turns
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec, Stage


def agreement(sets: dict, policy=("static", "centralized")) -> tuple[Simulation, Simulation]:
    agg = Simulation(load_scenario(None, {**sets, "engine.exact": "false"}), *policy).run()
    exact = Simulation(load_scenario(None, {**sets, "engine.exact": "true"}), *policy).run()
    return agg, exact


def check_within_2_percent(agg: Simulation, exact: Simulation) -> None:
    for a, b in zip(agg.rows, exact.rows, strict=True):
        assert a["replicas_simulated"] < b["replicas_simulated"] == 128
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=0.02)
        assert a["throughput_tokens_per_gpu_s"] == pytest.approx(b["throughput_tokens_per_gpu_s"], rel=0.02)
        # what follows from the episodes alone is exact on every replica
        for k in ("generated_tokens", "trained_tokens", "rollout_oom", "oom_events", "episodes"):
            assert a[k] == b[k], k
    for k in ("step_time_s", "throughput_tokens_per_gpu_s"):
        mean_a = np.mean([r[k] for r in agg.rows])
        assert mean_a == pytest.approx(np.mean([r[k] for r in exact.rows]), rel=0.02)
    assert agg.events < exact.events / 5


def test_replica_classes_agree_with_every_replica_at_1024_gpus_fast():
    """128 nodes x 8 (tp8: 128 replicas), 1 episode per GPU, context growing to the 32K cap."""
    agg, exact = agreement({"cluster.nodes": "128", "workload.episodes_per_gpu": "1",
                            "engine.exact_up_to": "512", "scenario.steps": "3",
                            "workload.growth_steps": "2"})
    check_within_2_percent(agg, exact)


def test_compact_draw_classes_agree_with_every_replica_at_1024_gpus_fast():
    """The compact draw (engine.compact_draw_above lowered to take it at 1,024 episodes per step)
    with replica classes and sampled pricing: within 2% of every replica on the same episodes."""
    sets = {"cluster.nodes": "128", "workload.episodes_per_gpu": "1", "engine.exact_up_to": "512",
            "engine.compact_draw_above": "512", "engine.sample_episodes": "256",
            "scenario.steps": "3", "workload.growth_steps": "2"}
    agg, exact = agreement(sets)
    assert agg.workload.compact() and exact.workload.compact()
    check_within_2_percent(agg, exact)


def test_sampled_stage_pricing_agrees_with_every_replica_at_1024_gpus_fast():
    """Log-probs and training priced on a strided sample of a quarter of the batch
    (engine.sample_episodes): still within 2% of every replica and every sample."""
    agg, exact = agreement({"cluster.nodes": "128", "workload.episodes_per_gpu": "1",
                            "engine.exact_up_to": "512", "engine.sample_episodes": "256",
                            "scenario.steps": "3", "workload.growth_steps": "2"})
    check_within_2_percent(agg, exact)


@pytest.mark.slow
@pytest.mark.parametrize("compact", ["0", "8192"])
def test_replica_classes_agree_with_every_replica_at_4096_gpus(compact):
    """The default scenario on 4,096 GPUs (16,384 episodes per step, 512 replicas), log-probs
    and training priced on a sample of 4,096, drawn per episode or compactly (the 131,072-GPU
    path): within 2% of every replica and every sample."""
    agg, exact = agreement({"cluster.nodes": "512", "scenario.steps": "2", "workload.growth_steps": "1",
                            "engine.sample_episodes": "4096", "engine.compact_draw_above": compact})
    assert agg.workload.compact() == (compact != "0")
    for a, b in zip(agg.rows, exact.rows, strict=True):
        assert a["replicas_simulated"] < b["replicas_simulated"] == 512
        for k in ("step_time_s", "throughput_tokens_per_gpu_s", "rollout_s", "train_s", "experience_s"):
            assert a[k] == pytest.approx(b[k], rel=0.02), k
        for k in ("generated_tokens", "trained_tokens", "rollout_oom", "oom_events", "episodes"):
            assert a[k] == b[k], k


def test_priced_sample_stands_for_the_batch():
    """A stage priced on an evenly strided sample of a large batch (each sample standing for
    the batch's share) is within 1% of pricing every sample."""
    sets = {"cluster.nodes": "128", "engine.exact_up_to": "512"}
    full = Simulation(load_scenario(None, sets), "static", "centralized")
    part = Simulation(load_scenario(None, {**sets, "engine.sample_episodes": "500"}), "static", "centralized")
    d = full.workload.draw(40)
    plan = full.plans[Stage.TRAIN]
    ids, tok, w = part.priced_sample(d.ids, d.context)
    assert len(ids) == 456 and w == pytest.approx(4096 / 456) and ids.tolist() == list(range(0, 4096, 9))
    assert full.priced_sample(d.ids, d.context)[2] == 1.0  # 4,096 <= the default 65,536
    for stage in ("logprob", "train"):
        a, b = part.stage_cost(stage, plan, d.ids, d.context), full.stage_cost(stage, plan, d.ids, d.context)
        assert a.time_s == pytest.approx(b.time_s, rel=0.01), stage
        assert a.memory_bytes == b.memory_bytes  # the longest sequence of the whole batch


def test_what_if_dispatch_is_the_direct_price():
    """The aggregated mode's dispatch price, read off checked affine pieces in the context,
    equals `estimate_dispatch` at every context; a few pricings serve every step."""
    sim = Simulation(load_scenario(None, {"cluster.nodes": "64"}), "static", "centralized")
    ex, tr = sim.plans[Stage.EXPERIENCE], sim.plans[Stage.TRAIN]
    for ctx in (7168, 6144, 9216, 32768, 2048, 1024):
        direct = estimate_dispatch(sim.cm, "centralized", ex, tr, 2048, ctx)
        time_s, moved = sim.what_if_dispatch(ex, tr, 2048, ctx)
        assert time_s == pytest.approx(direct.time_s, rel=1e-9)
        assert moved == pytest.approx(direct.extras["moved_bytes"], rel=1e-9)
        if ctx == 32768:  # two checked lines (from 7,168 and from 6,144 up) price the first four
            assert sim._dispatch_s.calls == 6


@pytest.mark.slow
def test_replica_classes_agree_with_every_replica_at_1024_gpus():
    """The default scenario on 1,024 GPUs (4,096 episodes per step), through the growth."""
    agg, exact = agreement({"cluster.nodes": "128", "scenario.steps": "5", "workload.growth_steps": "4"})
    check_within_2_percent(agg, exact)


def test_small_clusters_stay_exact():
    """Up to engine.exact_up_to episodes every replica is simulated: the two modes coincide."""
    sets = {"workload.episodes_per_step": "64", "scenario.steps": "2"}
    agg, exact = agreement(sets)
    assert [r["step_time_s"] for r in agg.rows] == [r["step_time_s"] for r in exact.rows]


def test_16k_gpu_default_scenario_steps_quickly():
    sc = load_scenario(None, {"cluster.nodes": "2048", "scenario.steps": "1"})
    sim = Simulation(sc, "static", "centralized").run()
    row = sim.rows[0]
    assert sim.gpus == 16384 and row["episodes"] == 65536
    assert row["plan_rollout"] == "tp8-dp2048-mb1" and row["plan_train"] == "tp8-dp2048-mb1-rc-full-zero"
    assert row["replicas_simulated"] <= 6
    assert len(sim.spans) < 30  # one per simulated replica and stage, not one per GPU


def test_plans_without_dp_fill_the_stage():
    assert parse_stage_plan("tp8").resolve(16384).dp == 2048
    assert parse_stage_plan("tp4-pp2").resolve(64).dp == 8
    assert parse_stage_plan("tp4-dp2").dp == 2  # a dp degree given is kept
    sc = load_scenario(None, {"cluster.nodes": "3"})
    assert sc.stage_plan().rollout.dp == 3


def test_episodes_per_gpu_follows_the_cluster_and_set_wins():
    assert load_scenario(None, {"cluster.nodes": "32"}).workload_spec().episodes_per_step == 1024
    sc = load_scenario(None, {"workload.episodes_per_step": "64"})  # the command line wins
    assert sc.workload_spec().episodes_per_step == 64
    with pytest.raises(ValueError, match="both set"):
        load_scenario("tool-use", {"workload.episodes_per_gpu": "2", "workload.episodes_per_step": "8"})
    with pytest.raises(ValueError, match="episodes_per_gpu must be >= 0"):
        load_scenario(None, {"workload.episodes_per_gpu": "-1"})


def test_array_truncation_equals_truncate_turns():
    rng = random.Random(1)
    for _ in range(200):
        raw = [[(rng.randint(1, 400), rng.randint(1, 900), rng.random()) for _ in range(rng.randint(1, 6))]
               for _ in range(rng.randint(1, 12))]
        cap = rng.choice([0, 300, 1000, 2500])
        d = Draw.of_turns(raw, cap)
        for e, turns in zip(d.episodes(), raw, strict=True):
            assert (e.turns, e.truncated) == truncate_turns(turns, cap)


def test_kv_drops_equal_the_engine():
    cm = CostModel(ModelSpec.from_name("qwen2.5-7b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=1, gpus_per_node=1))
    cm.kv_capacity_tokens = lambda tp, pp=1: 3000  # a small cache, so some episodes cannot fit
    draw = Workload(preset("connect-four")).draw(60).rows(slice(0, 40))
    dropped, generated = kv_drops(draw, 3000)
    env = simpy.Environment()
    rep = Replica(env, cost_model=cm, tp=1, episodes=draw.episodes(), max_num_seqs=8)
    env.run()
    assert 0 < dropped.sum() < len(dropped)
    assert sorted(rep.stats.oom_episodes) == draw.ids[dropped].tolist()
    assert rep.stats.generated_tokens == generated.sum()


def test_choice_holds_the_longest_episode_and_deals_round_robin():
    draw = Workload(preset("connect-four")).draw(30)
    choice = choose_replicas(draw, 64, 0.02)
    longest = int(np.argmax(draw.generated * 0.02 + draw.lat.sum(axis=1)))
    assert longest % 64 in choice.simulated
    assert set(choice.representatives) <= set(choice.simulated) and len(choice.simulated) <= 6
    assert deal(draw, 64, 5).ids.tolist() == list(range(5, 512, 64))


def test_deal_is_the_one_round_robin():
    from earl.parallel import deal as deal_items
    assert deal_items(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    draw = Workload(preset("connect-four")).draw(3).rows(slice(0, 50))
    assert [deal(draw, 4, b).ids.tolist() for b in range(4)] == deal_items(50, 4)
    with pytest.raises(ValueError, match="n_bins >= 1"):
        deal_items(3, 0)


def test_compact_draw_is_the_same_workload_in_flat_arrays():
    """The compact draw's per-episode view equals its per-turn rows, its truncation equals
    truncate_turns, and its distributions are the per-episode draw's (a different sample)."""
    spec = dataclasses.replace(preset("connect-four"), episodes_per_step=20000, max_context=6000)
    flat, full = Workload(spec, compact_above=10000), Workload(spec)
    assert flat.compact() and not full.compact() and not Workload(spec, compact_above=20000).compact()
    f, d = flat.draw(60), full.draw(60)
    assert isinstance(f, FlatDraw) and isinstance(d, Draw) and 0 < f.truncated.sum() < len(f.ids)
    rows = f.rows(np.arange(len(f.ids)))
    assert np.array_equal(rows.context, f.context) and np.array_equal(rows.generated, f.generated)
    assert np.allclose(rows.lat_total, f.lat_total) and np.array_equal(rows.prompts, f.prompts)
    assert np.array_equal(rows.turns, f.turns) and f.context.max() <= 6000
    assert f.rows(f.turns > 0) is f and deal(f, 7, 3).ids.tolist() == list(range(3, 20000, 7))
    assert keep_freed_memory() is (sys.platform == "linux")  # glibc here: freed arrays stay for reuse
    # truncation: the drawn turns before the cap, cut as truncate_turns cuts them
    wide = Workload(dataclasses.replace(spec, max_context=0), compact_above=10000).draw(60)
    for e, w in zip(rows.rows(slice(0, 300)).episodes(), wide.rows(slice(0, 300)).episodes(), strict=True):
        turns, cut = truncate_turns([(o, g, la) for o, g, la in w.turns], 6000)
        assert [(o, g) for o, g, _ in e.turns] == [(o, g) for o, g, _ in turns] and e.truncated == cut
    for k in ("context", "generated", "turns"):  # 20,000 episodes: means within 2%
        assert getattr(f, k).mean() == pytest.approx(getattr(d, k).mean(), rel=0.02), k
    assert f.truncated.mean() == pytest.approx(d.truncated.mean(), abs=0.01)
    assert f.lat_total.mean() == pytest.approx(d.lat.sum(axis=1).mean(), rel=0.02)


def test_compact_draw_lognormal_table_is_the_lognormal_within_its_bound():
    """The compact draw's table lookup: exact tails (Acklam's quantile against the standard
    library's), every tabled value within table_error_bound of the exact inverse-CDF value, and
    2,000,000 draws indistinguishable from the lognormal (Kolmogorov-Smirnov distance within
    sampling noise; the share in each exact tail is TAIL_PROB)."""
    import statistics

    from earl.sim.workload import TAIL_PROB, _bin_edge, _lognormal_table, normal_quantile_tail, table_error_bound
    nd = statistics.NormalDist()
    q = np.geomspace(1e-300, 0.02, 500)
    assert np.max(np.abs(normal_quantile_tail(q) - [nd.inv_cdf(x) for x in q])) < 1e-7
    assert 3e-4 < table_error_bound(0.6) < 4e-4 and table_error_bound(1.0) < 6e-4
    mean, cv, n = 1000.0, 0.6, 2_000_000
    s2 = math.log1p(cv * cv)
    mu, sigma = math.log(mean) - s2 / 2, math.sqrt(s2)
    x = np.sort(_lognormal_table(np.random.default_rng(7), mean, cv, n, tokens=False).astype(np.float64))
    cdf = np.array([nd.cdf(v) for v in (np.log(x[:: n // 20000]) - mu) / sigma])
    emp = np.arange(0, n, n // 20000) / n
    assert np.max(np.abs(cdf - emp)) < 1.5e-3  # KS: 1.36 / sqrt(n) is 1e-3 at 95%
    lo, hi = math.exp(mu + sigma * _bin_edge(0)), math.exp(mu + sigma * _bin_edge(1 << 16))
    for share in ((x < lo).mean(), (x > hi).mean()):
        assert share == pytest.approx(TAIL_PROB, rel=0.05)
    assert len(np.unique(x[x > hi])) > 0.99 * (x > hi).sum()  # the tails are continuous draws
    assert x.mean() == pytest.approx(mean, rel=0.003) and x.std() / x.mean() == pytest.approx(cv, rel=0.01)
    tok = _lognormal_table(np.random.default_rng(7), 3.0, 2.0, 100_000, tokens=True)
    assert tok.dtype == np.int64 and tok.min() == 1  # token counts: rounded, at least one
    assert np.array_equal(_lognormal_table(np.random.default_rng(1), 5.0, 0.0, 3, tokens=True), [5, 5, 5])


def test_compact_draw_above_is_checked_and_off_at_16k_gpus():
    sc = load_scenario(None, {"cluster.nodes": "2048"})  # 65,536 episodes: the per-episode draw
    assert sc.compact_draw_above == 65536 and not Simulation(sc, "static", "centralized").workload.compact()
    with pytest.raises(ValueError, match="engine.compact_draw_above must be an integer >= 0"):
        load_scenario(None, {"engine.compact_draw_above": "-1"})
