"""Host-cost terms of calibrated profiles: how they are stored, fitted, priced by the cost
model and charged by the simulator's model of the runtime engine (fast, no timing).

    pytest tests/calibrate/test_hostcost.py
"""

import dataclasses
import json

import pytest
import simpy
import torch

from earl.calibrate.hostcost import _sim_rollout, synthetic_trajectories
from earl.calibrate.overhead import ForwardPoint, fit_overhead
from earl.calibrate.validate import VariantResult, stage_table
from earl.cost_model import CostModel
from earl.cost_model.compute import param_tensors
from earl.cost_model.profile import HOST_COST_FIELDS, EfficiencyCurve, HardwareProfile, load_profile
from earl.runtime.engine.pytorch import KV_ROUND
from earl.runtime.rollout import Trajectory, Turn
from earl.sim.rollout_engine import Replica, TurnSyncReplica
from earl.sim.workload import Episode
from earl.specs import MODEL_CATALOG, ClusterSpec, ParallelPlan


def _cm(**fields) -> CostModel:
    prof = dataclasses.replace(load_profile("cpu"), **fields)
    spec = dataclasses.replace(MODEL_CATALOG["tiny"], dtype="fp32")
    return CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), prof)


def test_profiles_without_host_costs_still_load(tmp_path):
    d = load_profile("cpu").to_dict()
    for k in (*HOST_COST_FIELDS, "elementwise"):
        del d[k]
    (tmp_path / "old.json").write_text(json.dumps(d))
    old = load_profile(str(tmp_path / "old.json"))
    assert old.elementwise is None and all(getattr(old, k) == 0.0 for k in HOST_COST_FIELDS)
    new = dataclasses.replace(old, elementwise=EfficiencyCurve(peak_frac=0.25, half_size=0.0),
                              **{k: (i + 1) * 1e-6 for i, k in enumerate(HOST_COST_FIELDS)})
    assert HardwareProfile.from_dict(new.to_dict()) == new


def test_cost_model_prices_each_host_term_once_where_it_belongs():
    base, plan = _cm(), ParallelPlan(micro_batch=4)
    with_terms = _cm(logprob_pass_s=1e-3, logprob_token_s=1e-7, train_pass_s=2e-3, train_token_s=2e-7,
                     optimizer_step_s=3e-4, optimizer_tensor_s=1e-5,
                     experience_fixed_s=2e-4, experience_seq_s=5e-5, experience_token_s=1e-7, step_overhead_s=4e-4,
                     step_seq_overhead_s=1e-5, step_kv_token_s=1e-8)
    n_t = param_tensors(base.model)
    # 8 sequences of 64 tokens: two micro-batches of 4
    assert with_terms.logprob(plan, 8, 64).time_s == pytest.approx(
        base.logprob(plan, 8, 64).time_s + 2 * 1e-3 + 512 * 1e-7)
    assert with_terms.train(plan, 8, 64).time_s == pytest.approx(
        base.train(plan, 8, 64).time_s + 2 * 2e-3 + 512 * 2e-7 + 3e-4 + n_t * 1e-5)
    lengths = [64] * 8
    assert with_terms.mixed_batch("logprob", plan, lengths).time_s == pytest.approx(
        base.mixed_batch("logprob", plan, lengths).time_s + 2 * 1e-3 + 512 * 1e-7 + 2e-4 + 8 * 5e-5 + 512 * 1e-7)
    assert with_terms.decode_step_time_s(1, 4, 256) == pytest.approx(
        base.decode_step_time_s(1, 4, 256) + 4e-4 + 4 * 1e-5 + 256 * 1e-8)
    assert with_terms.prefill_time_s(1, 64, 0, 4) == pytest.approx(
        base.prefill_time_s(1, 64, 0, 4) + 4e-4 + 4 * 1e-5 + 64 * 1e-8)
    # a padding mask makes attention cover the whole square; padded buckets use their longest row
    full, causal = base.logprob(plan, 8, 64, masked=True), base.logprob(plan, 8, 64)
    assert full.breakdown["attention"] > causal.breakdown["attention"]
    attn = 4 * 2 * base.model.num_layers * base.model.num_heads * base.model.head_dim  # FLOPs per pair, 2 mbs
    assert full.flops - causal.flops == pytest.approx(attn * 4 * (64 * 64 - 64 * 65 / 2))
    assert base.mixed_batch("train", plan, [10, 64, 64, 64], padded=True).time_s == pytest.approx(
        base.train(plan, 4, 64, masked=True).time_s)
    # a slower elementwise curve slows exactly the elementwise part of a forward
    slow = _cm(elementwise=dataclasses.replace(base.profile.memory, peak_frac=base.profile.memory.peak_frac / 4))
    a, b = base.logprob(plan, 8, 64), slow.logprob(plan, 8, 64)
    assert b.breakdown["elementwise"] == pytest.approx(4 * a.breakdown["elementwise"])
    assert b.breakdown["linear"] == a.breakdown["linear"]


def test_turn_sync_engine_by_hand():
    """Two episodes in one batch: a padded prefill per turn whose logits give the first token,
    lockstep decode over every row until the longest generation ends, then the environments."""
    cm = _cm(step_overhead_s=3e-4, step_seq_overhead_s=2e-5, turn_overhead_s=1e-4, turn_seq_overhead_s=1e-5,
             rollout_fixed_s=1e-3, rollout_batch_s=2e-4, rollout_episode_s=5e-5)
    a = Episode(id=0, turns=((10, 3, 0.001), (5, 2, 0.0)))
    b = Episode(id=1, turns=((8, 1, 0.002),))
    env = simpy.Environment()
    r = TurnSyncReplica(env, cost_model=cm, tp=1, episodes=[a, b], max_num_seqs=4)
    env.run()
    t = 1e-3 + 2 * 5e-5 + 2e-4  # rollout set-up, one engine batch
    # turn 1: both rows, padded to 10 new tokens; 3 - 1 decode forwards of 2 rows, b idle in both
    t += cm.prefill_time_s(1, 20, 0, 2, masked=True) + 1e-4 + 2 * 1e-5
    t += sum(cm.decode_step_time_s(1, 2, 2 * (10 + j)) - 2e-5 for j in range(2))
    t += 0.001 + 0.002  # the environments step one after the other
    assert r.stats.finished[1] == pytest.approx(t)
    # turn 2: a alone, its last token plus 5 observation tokens on a 12-wide cache
    t += cm.prefill_time_s(1, 6, 12, 1, masked=True) + 1e-4 + 1e-5 + cm.decode_step_time_s(1, 1, 18)
    assert r.stats.finished[0] == pytest.approx(t) == pytest.approx(env.now)
    assert r.stats.generated_tokens == 6 and r.stats.decode_iterations == 3
    assert r.stats.prefill_tokens == 10 + 8 + 6


def test_rollout_set_up_is_charged_by_the_default_engines_model_too():
    """The continuous-batching model (the runtime's default `pytorch` engine) pays the rollout's
    fixed and per-episode host work once, before its first forward, as the lockstep one does;
    hostcost fits those terms on the model of the engine it plays with (its slot cache's
    rounded attention width included: KV_ROUND)."""
    eps = [Episode(id=0, turns=((10, 3, 0.001),)), Episode(id=1, turns=((8, 2, 0.0),))]
    times = {}
    for fixed, per in ((0.0, 0.0), (1e-3, 5e-5)):
        cm = _cm(rollout_fixed_s=fixed, rollout_episode_s=per)
        env = simpy.Environment()
        r = Replica(env, cost_model=cm, tp=1, episodes=list(eps), max_num_seqs=4, kv_round=KV_ROUND)
        env.run()
        times[fixed] = r.stats.t_end
        assert _sim_rollout(cm, _trajs(eps), 4, "pytorch") == pytest.approx(times[0.0])  # terms zeroed
    assert times[1e-3] - times[0.0] == pytest.approx(1e-3 + 2 * 5e-5)
    cm = _cm(rollout_fixed_s=1e-3, rollout_episode_s=5e-5)
    env = simpy.Environment()
    bare = cm.with_profile(dataclasses.replace(cm.profile, rollout_fixed_s=0.0, rollout_episode_s=0.0))
    TurnSyncReplica(env, cost_model=bare, tp=1, episodes=list(eps), max_num_seqs=4)
    env.run()
    assert _sim_rollout(cm, _trajs(eps), 4, "pytorch-static") == pytest.approx(env.now)


def _trajs(eps):
    """Trajectories with these episodes' turns (what hostcost hands `_sim_rollout`)."""
    return [Trajectory(episode_id=e.id, group_id=0, turns=[Turn(*t) for t in e.turns]) for e in eps]


def test_forward_fit_recovers_op_overhead_and_elementwise_factor():
    pts = [ForwardPoint(label=str(i), explained_s=e + w, elementwise_s=w, ops=18,
                        time_s=e + 3.0 * w + 18 * 40e-6)
           for i, (e, w) in enumerate([(1e-4, 1e-5), (5e-4, 2e-4), (2e-3, 1e-3), (3e-5, 1e-6), (8e-3, 4e-3)])]
    fit = fit_overhead(pts)
    assert fit.op_overhead_s == pytest.approx(40e-6, rel=1e-6)
    assert fit.elem_factor == pytest.approx(3.0, rel=1e-6)
    assert fit.heldout_median_err == pytest.approx(0.0, abs=1e-9)
    curve = fit.elementwise_curve(EfficiencyCurve(peak_frac=0.9, half_size=1e5))
    assert curve.peak_frac == pytest.approx(0.3) and curve.half_size == 1e5
    # a floor below the truth does not move the fit; forwards the curves over-explain (nothing
    # left per operator) give the floor, flagged, not zero
    floored = fit_overhead(pts, floor_s=3e-6)
    assert floored.op_overhead_s == pytest.approx(40e-6, rel=1e-6) and not floored.at_floor
    over = [dataclasses.replace(p, explained_s=p.time_s * 1.2, elementwise_s=0.0) for p in pts]
    assert fit_overhead(over).op_overhead_s == 0.0
    stuck = fit_overhead(over, floor_s=3e-6)
    assert stuck.op_overhead_s == pytest.approx(3e-6) and stuck.at_floor and stuck.quality()["at_floor"]


def test_synthetic_trajectories_collate_like_rollouts():
    from earl.runtime.trainer import collate

    trajs = synthetic_trajectories(8, 40, 64, torch.Generator().manual_seed(0))
    assert [t.group_id for t in trajs] == [0, 0, 0, 0, 1, 1, 1, 1]
    for t in trajs:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) == sum(u.obs_tokens + u.gen_tokens
                                                                              for u in t.turns)
        assert t.generated_tokens == sum(u.gen_tokens for u in t.turns) > 0
        assert 30 <= len(t.token_ids) <= 50
    b = collate(trajs, 0)
    assert b.input_ids.shape == (8, max(len(t.token_ids) for t in trajs))
    assert int(b.loss_mask.sum()) == sum(t.generated_tokens for t in trajs)


def test_stage_table_scores_against_cpu_time_too():
    rows = [{"rollout": 0.2, "experience": 0.1, "dispatch": 0.0, "train": 0.4, "reshard": 0.0}]
    pred = [{"rollout": 0.1, "experience": 0.05, "dispatch": 0.0, "train": 0.2, "reshard": 0.0}]
    v = VariantResult(name="base", overrides={}, measured=rows, predicted=pred, datasheet=pred,
                      peak_mem_measured=1.0, peak_mem_predicted=1.0, run_dir="x", cpu_share=[0.5])
    table = {r["stage"]: r for r in stage_table([v])}
    assert table["train"]["median_err"] == pytest.approx(0.5)
    assert table["train"]["cpu_median_err"] == pytest.approx(0.0)
    assert table["train"]["measured_cpu_s"] == pytest.approx(0.2)


def test_token_budget_packing_is_the_runtimes():
    import random

    from earl.cost_model.model import pack_micro_batches
    from earl.runtime.trainer import micro_batches

    rng = random.Random(0)
    for _ in range(100):
        lengths = [rng.randint(1, 100) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(50, 500)
        runtime = sorted(sorted(lengths[i] for i in g) for g in micro_batches(lengths, budget))
        assert sorted(pack_micro_batches(lengths, budget)) == runtime
    # priced one micro-batch per packed group: 3 rows of 41 tokens, then 4 of 27, ...
    cm, plan = _cm(logprob_pass_s=1e-3), ParallelPlan(micro_batch=1)
    est = cm.mixed_batch("logprob", plan, [41] * 3 + [27] * 13, padded=True, token_budget=128)
    groups = pack_micro_batches([41] * 3 + [27] * 13, 128)
    assert [len(g) for g in groups] == [3, 4, 4, 4, 1]
    expected = sum(cm.logprob(dataclasses.replace(plan, micro_batch=len(g)), len(g), g[-1], masked=True).time_s
                   for g in groups)
    assert est.breakdown["stream"] == pytest.approx(expected)


def test_host_work_after_a_rollout_past_the_cache_costs_the_cold_factor():
    """`host_cold_factor` multiplies the hand-off's and the experience batch's host terms where a
    rank's share of the weights (streamed by every decode step) exceeds `host_cache_bytes`, and
    nowhere else: not for a model that fits, not with the factor unset or the cache unknown."""
    from earl.cost_model.dispatch import price_transfer_plan
    from earl.parallel import deal
    from earl.policies import make_dispatcher
    from earl.policies.balance import balance_aligned
    from earl.policies.types import Layout, Sample

    terms = dict(experience_fixed_s=2e-4, experience_seq_s=5e-5, experience_token_s=1e-7,
                 handoff_fixed_s=4e-4, handoff_seq_s=2e-5, handoff_token_s=5e-8)
    prof = dataclasses.replace(load_profile("cpu"), **terms, host_cold_factor=1.5, host_cache_bytes=2 * 2**20)
    spec = {n: dataclasses.replace(MODEL_CATALOG[n], dtype="fp32") for n in ("tiny", "qwen2-27m")}
    assert spec["tiny"].num_params * 4 < 2 * 2**20 < spec["qwen2-27m"].num_params * 4 / 8
    one, tp8 = ParallelPlan(), ParallelPlan(tp=8)

    def cm(name, p):
        return CostModel(spec[name], ClusterSpec.for_gpus(p.hardware, 8), p)

    assert cm("qwen2-27m", prof).host_cold_factor(one) == 1.5 == cm("qwen2-27m", prof).host_cold_factor(tp8)
    assert cm("tiny", prof).host_cold_factor(one) == 1.0
    for off in (dict(host_cold_factor=1.0), dict(host_cache_bytes=0.0)):
        assert cm("qwen2-27m", dataclasses.replace(prof, **off)).host_cold_factor(one) == 1.0
    big = dataclasses.replace(spec["qwen2-27m"], num_layers=80)  # its tp-8 share past the cache too, 1 GB
    assert CostModel(big, ClusterSpec.for_gpus(prof.hardware, 8), prof).host_cold_factor(tp8) == 1.5
    lengths = [64] * 8
    warm = cm("qwen2-27m", dataclasses.replace(prof, host_cold_factor=1.0))
    host = lambda c: c.mixed_batch("logprob", one, lengths, passes=0).breakdown["host"]  # noqa: E731
    assert host(cm("qwen2-27m", prof)) == pytest.approx(1.5 * host(warm)) and host(warm) > 0
    # the hand-off onto the aligned layout (local copies only): its host work scales, the same plan
    samples = [Sample(id=i, tokens=100 + i, group=i // 4) for i in range(16)]
    plan2 = ParallelPlan(dp=2)
    src = Layout(plan2, tuple(tuple(g) for g in deal(16, 2)))
    dst = Layout(plan2, tuple(tuple(g) for g in balance_aligned(samples, 2, src.assignment)[0]))
    tplan = make_dispatcher("layout-aware").plan(src, dst, samples)
    assert not dataclasses.replace(tplan, reduce_bytes=0).waits_for_peers  # the hand-off reduces nothing
    price = lambda f: price_transfer_plan(warm, tplan, samples=16, producers=2, world=2,  # noqa: E731
                                          advantages=False, host_factor=f).time_s
    assert price(1.5) == pytest.approx(1.5 * price(1.0)) and price(1.0) > 0
    with pytest.raises(ValueError, match="host_cold_factor"):
        dataclasses.replace(prof, host_cold_factor=0.1)
    assert HardwareProfile.from_dict(prof.to_dict()) == prof



@pytest.mark.parametrize("ranks", [2, 4])
def test_a_ranks_share_of_the_handoff_runs_in_one_process_as_that_rank_runs_it(ranks):
    """`earl calibrate` times the hand-off at a rank's share in one process (hostcost's cases
    with ranks > 1): `hand_off` as rank 0 of a `ranks`-way step plans the whole step's episodes
    and copies exactly its own, the rows the whole step's one-process hand-off holds for them;
    the profile's `handoff_sample_s` prices the whole-step part (test_dispatch_price)."""
    from earl.policies import make_dispatcher
    from earl.policies.types import Sample
    from earl.runtime.step import hand_off

    step = synthetic_trajectories(4 * ranks, 40, 64, torch.Generator().manual_seed(0))
    samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in step]
    mine = [t for t in step if t.episode_id % ranks == 0]
    plan, disp = ParallelPlan(dp=ranks), make_dispatcher("layout-aware")
    got, stats, dst = hand_off(disp, mine, samples, plan, plan, len(samples), rank=0)
    assert sorted(got) == sorted(dst.assignment[0]) == [t.episode_id for t in mine]
    assert stats.bytes_sent == 0 and not stats.waited
    whole, _, _ = hand_off(disp, step, samples, ParallelPlan(), ParallelPlan(), len(samples), rank=0)
    for i, rows in got.items():
        assert rows.keys() == whole[i].keys() and all(torch.equal(rows[k], whole[i][k]) for k in rows)


def test_host_work_of_n_ranks_is_priced_as_their_slowest():
    """Where each of N ranks does its own host work and the stage ends with the slowest (the
    hand-off onto the aligned layout, the experience batch), `host_spread` prices the expected
    largest of N draws: x (1 + spread x E[max of N standard normals]); one rank, or no spread:
    x1. The calibration's `spread` is the robust coefficient of variation of its repetitions."""
    import random

    from earl.calibrate.hostcost import spread
    from earl.cost_model.dispatch import price_transfer_plan
    from earl.cost_model.model import expected_max_normal
    from earl.parallel import deal
    from earl.policies import make_dispatcher
    from earl.policies.balance import balance_aligned
    from earl.policies.types import Layout, Sample

    # E[max of n] by sampling agrees with the integral (1.0294 at 4 in the tables)
    rng = random.Random(0)
    for n in (2, 4, 8):
        draws = [max(rng.gauss(0, 1) for _ in range(n)) for _ in range(20000)]
        assert expected_max_normal(n) == pytest.approx(sum(draws) / len(draws), abs=0.03)
    assert expected_max_normal(1) == 0.0 and expected_max_normal(4) == pytest.approx(1.0294, abs=1e-3)
    times = [1e-3 * (1 + 0.06 * rng.gauss(0, 1)) for _ in range(4001)]
    assert spread(times) == pytest.approx(0.06, rel=0.1) and spread([1.0, 2.0]) == 0.0

    terms = dict(experience_fixed_s=2e-4, experience_seq_s=5e-5, experience_token_s=1e-7,
                 handoff_fixed_s=4e-4, handoff_seq_s=2e-5, handoff_token_s=5e-8, handoff_sample_s=1e-5)
    flat = dataclasses.replace(load_profile("cpu"), **terms)
    spread_prof = dataclasses.replace(flat, host_spread=0.08)
    spec = dataclasses.replace(MODEL_CATALOG["tiny"], dtype="fp32")
    samples = [Sample(id=i, tokens=100 + i, group=i // 4) for i in range(16)]
    for ranks in (1, 2, 4):
        cms = [CostModel(spec, ClusterSpec.for_gpus(p.hardware, ranks), p) for p in (flat, spread_prof)]
        k = 1 + 0.08 * expected_max_normal(ranks)
        assert cms[1].slowest_of(ranks) == pytest.approx(k) and cms[0].slowest_of(ranks) == 1.0
        plan = ParallelPlan(dp=ranks)
        host = [c.mixed_batch("logprob", plan, [64] * 16, passes=0).breakdown["host"] for c in cms]
        assert host[1] == pytest.approx(k * host[0]) and host[0] > 0
        src = Layout(plan, tuple(tuple(g) for g in deal(16, ranks)))
        dst = Layout(plan, tuple(tuple(g) for g in balance_aligned(samples, ranks, src.assignment)[0]))
        tplan = make_dispatcher("layout-aware").plan(src, dst, samples)
        est = [price_transfer_plan(c, tplan, samples=16, producers=ranks, world=ranks, advantages=False)
               for c in cms]
        assert est[1].breakdown["local"] == pytest.approx(k * est[0].breakdown["local"])
        assert est[1].breakdown["planning"] == est[0].breakdown["planning"]
    with pytest.raises(ValueError, match="host_spread"):
        dataclasses.replace(flat, host_spread=1.5)
    assert HardwareProfile.from_dict(spread_prof.to_dict()) == spread_prof


def test_the_calibrations_experience_point_is_the_stage_validate_reads():
    """`earl calibrate` prices the experience stage from the same spans `earl validate` reads it
    by (measured_stages), not from `prepare_experience`'s whole call, whose work outside the two
    spans no stage's window holds; on its own clock (a one-thread CPU process's CPU seconds): a
    real one-process step of the tiny model, its spans read both ways."""
    import time

    from earl.calibrate.hostcost import experience_parts
    from earl.calibrate.validate import measured_stages
    from earl.policies import make_dispatcher
    from earl.policies.types import Sample
    from earl.runtime.dist import process_group
    from earl.runtime.run_config import EnvConfig, ModelConfig, PolicyConfig, RunConfig, TrainerConfig
    from earl.runtime.step import SampleMeta, StepContext, play, prepare_experience
    from earl.runtime.worker import ONE, Worker
    from earl.specs import StagePlan

    torch.manual_seed(0)
    cfg = RunConfig(model=ModelConfig(path="tiny", dtype="fp32", device="cpu"), trainer=TrainerConfig(lr=1e-6),
                    env=EnvConfig(name="calculator"), policy=PolicyConfig(dispatcher="layout-aware"),
                    groups=2, group_size=2, steps=1, seed=0)
    with process_group():
        w = Worker(cfg, StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
        trajs, _ = play(w, 1)
        w.spans = []
        samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs]
        meta = {t.episode_id: SampleMeta.of(t) for t in trajs}
        t0 = time.perf_counter()
        prepare_experience(w, StepContext(selector=None, dispatcher=make_dispatcher("layout-aware")), 1,
                           trajs, samples, meta)
        wall = time.perf_counter() - t0
    exp = {sp.name: sp for sp in w.spans if sp.stage == "experience"}
    assert sorted(exp) == ["handoff", "logprob"]
    walls = sum(sp.duration_s for sp in exp.values())
    assert walls == pytest.approx(measured_stages(w.spans, [1])[0]["experience"], rel=1e-9)
    assert walls < wall  # prepare_experience's work outside the spans is in neither
    # on the calibration's clock: a one-thread CPU process's CPU seconds, as every host term
    cpu = torch.get_num_threads() == 1
    hand, batch = experience_parts(w.spans, torch.device("cpu"))
    assert (hand, batch) == tuple(exp[n].args["cpu_s"] if cpu else exp[n].duration_s for n in ("handoff", "logprob"))
    assert hand > 0 and batch > 0
