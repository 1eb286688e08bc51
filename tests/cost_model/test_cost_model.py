"""Cost model formulas and directions."""

import dataclasses

import pytest

from earl.cost_model import CostModel, rank_plans
from earl.cost_model.compute import causal_pairs, forward_pass, train_flops_per_token
from earl.cost_model.memory import korthikanti_activation_bytes
from earl.cost_model.resolve import make_cost_model, resolve_network
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec, ParallelPlan


def cm_for(model="qwen2.5-7b", hw="h100-sxm-80gb", gpus=8, network=None) -> CostModel:
    return make_cost_model(model, hw, gpus, network)


# Korthikanti et al. 2022, Table 2, for s=2048, b=1, h=12288, a=96, t=8 (their 175B config).
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H


@pytest.mark.parametrize("sp,mode,expected", [
    (False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),
    (True, "none", SBH * (34 / T + 5 * A * S / (H * T))),
    (False, "selective", SBH * (10 + 24 / T)),
    (True, "selective", SBH * 34 / T),
    (True, "full", SBH * 2),
])
def test_korthikanti_rows(sp, mode, expected):
    assert korthikanti_activation_bytes(S, B, H, A, T, sp, mode) == pytest.approx(expected)


def test_korthikanti_no_parallelism_row():
    assert korthikanti_activation_bytes(S, B, H, A, 1, False, "none") == pytest.approx(SBH * (34 + 5 * A * S / H))


def test_training_flops_are_6n_per_token_at_short_context():
    """Summing the operator-level forward FLOPs (x3 for forward + backward) at short context
    gives 6N per token, N = parameters that take part in matmuls (all but the input lookup)."""
    m = ModelSpec.from_name("qwen2.5-7b")
    n_matmul = m.num_params - m.vocab_size * m.hidden_size  # untied: the input embedding is a lookup
    cm = cm_for("qwen2.5-7b", gpus=1)
    t = 128
    fwd = forward_pass(m, cm.profile, tp=1, layers=m.num_layers, tokens=t, attn_pairs=causal_pairs(t, 0),
                       kv_tokens=t, lm_tokens=t)
    assert 3 * fwd.flops / t == pytest.approx(6 * n_matmul, rel=0.05)
    assert train_flops_per_token(m, t) == pytest.approx(6 * n_matmul, rel=0.05)
    assert 6 * n_matmul == pytest.approx(6 * m.num_params, rel=0.08)


def test_more_tp_lowers_memory_per_gpu():
    cm = cm_for("qwen2.5-72b", gpus=8)
    mems = [cm.memory("train", ParallelPlan(tp=t, dp=8 // t), 64, 4096).total for t in (1, 2, 4, 8)]
    assert mems == sorted(mems, reverse=True) and mems[0] > mems[-1]
    kv = [cm.memory("decode", ParallelPlan(tp=t, dp=8 // t), 64, 4096).total for t in (2, 4, 8)]
    assert kv == sorted(kv, reverse=True)


def test_longer_context_raises_decode_time_and_kv():
    cm = cm_for("qwen2.5-7b", gpus=4)
    plan = ParallelPlan(tp=4, dp=1)
    e1, e2 = cm.decode(plan, 16, 2048), cm.decode(plan, 16, 16384)
    assert e2.time_s > e1.time_s
    assert e2.memory.kv_cache == pytest.approx(8 * e1.memory.kv_cache)


def test_72b_on_one_80gb_gpu_is_infeasible():
    cm = cm_for("qwen2.5-72b", gpus=1)
    est = cm.decode(ParallelPlan(tp=1, dp=1), 1, 1024)
    assert not est.feasible and "weights" in est.reason
    assert not cm.train(ParallelPlan(), 1, 1024).feasible


def test_decode_reports_reduced_concurrency_not_infeasible():
    cm = cm_for("qwen2.5-7b", gpus=1)
    cap = cm.kv_capacity_tokens(1)
    est = cm.decode(ParallelPlan(), 1000, 32768)
    assert est.feasible and est.extras["concurrency"] == cap // 32768 < 1000
    assert "fit in KV memory" in est.reason
    assert not cm.decode(ParallelPlan(), 1, cap + 1).feasible


def test_kv_heads_replicated_when_tp_exceeds_kv_heads():
    cm = cm_for("llama-3.1-8b", gpus=16)  # 8 KV heads
    m8 = cm.memory("decode", ParallelPlan(tp=8, dp=2), 2, 1000).kv_cache
    m16 = cm.memory("decode", ParallelPlan(tp=16, dp=1), 1, 1000).kv_cache
    assert m16 == pytest.approx(m8)  # one sequence per replica, one KV head per GPU in both


def test_pipeline_bubble_fraction():
    cm = cm_for("qwen2.5-7b", gpus=8)
    est = cm.train(ParallelPlan(pp=4, dp=2, micro_batch=1), 16, 2048)  # 8 micro-batches per replica
    assert est.extras["bubble_frac"] == pytest.approx(3 / (8 + 3))


def test_reshard_same_plan_is_free_and_bigger_tp_keeps_local_slices():
    cm = cm_for("qwen2.5-7b", gpus=4)
    assert cm.reshard(ParallelPlan(tp=2, dp=2), ParallelPlan(tp=2, dp=2)).time_s == 0
    grow = cm.reshard(ParallelPlan(tp=1, dp=4), ParallelPlan(tp=4, dp=1))  # tp1 holds everything
    assert grow.extras["bytes_per_gpu"] == 0
    shrink = cm.reshard(ParallelPlan(tp=4, dp=1), ParallelPlan(tp=1, dp=4))
    assert shrink.extras["bytes_per_gpu"] == pytest.approx(0.75 * cm.model.num_params * 2)
    # the weights move in the model's dtype: an fp32 run (earl run's CPU default) moves twice the bytes
    fp32 = CostModel(dataclasses.replace(cm.model, dtype="fp32"), cm.cluster, cm.profile)
    moved = fp32.reshard(ParallelPlan(tp=4, dp=1), ParallelPlan(tp=1, dp=4)).extras["bytes_per_gpu"]
    assert moved == pytest.approx(0.75 * cm.model.num_params * 4)


def test_rank_plans_orders_feasible_first():
    cm = cm_for("qwen2.5-72b", gpus=64)
    ranked = rank_plans(cm, "train", 64, 64, 8192)
    feas = [e.feasible for _, e in ranked]
    assert feas == sorted(feas, reverse=True) and any(feas) and not all(feas)
    thr = [e.tokens_per_gpu_s for _, e in ranked if e.feasible]
    assert thr == sorted(thr, reverse=True)
    assert all(p.world_size == 64 for p, _ in ranked)


def test_network_parsing():
    n = resolve_network("rdma-400gx8")
    assert n.nics_per_node == 8 and n.protocol == "rdma" and n.nic_bw_bytes_s == pytest.approx(50e9)
    with pytest.raises(ValueError, match="unknown network 'ethernet'"):
        resolve_network("ethernet")


def test_cluster_for_gpus():
    h100 = HardwareSpec.from_name("h100-sxm-80gb")
    assert ClusterSpec.for_gpus(h100, 1024).nodes == 128
    with pytest.raises(ValueError, match="12 GPUs is not a whole number of 8-GPU nodes"):
        ClusterSpec.for_gpus(h100, 12)


def test_reshard_prices_zero_sharded_optimizer_states():
    cm = cm_for("qwen2.5-7b", gpus=4)
    zero, full = ParallelPlan(dp=4, sharded_optimizer=True), ParallelPlan(dp=4)
    # un-sharding: every rank must fetch the 3/4 of the optimizer states it lacks
    est = cm.reshard(zero, full, include_optimizer=True)
    assert est.extras["bytes_per_gpu"] == pytest.approx(0.75 * cm.model.num_params * 12)
    # sharding keeps a local slice: nothing moves; weights alone never move between these plans
    assert cm.reshard(full, zero, include_optimizer=True).extras["bytes_per_gpu"] == 0
    assert cm.reshard(zero, full).extras["bytes_per_gpu"] == 0


def test_interleaved_1f1b_shrinks_the_bubble_and_round_trips():
    cm = cm_for("qwen2.5-7b", gpus=8)
    plain = cm.train(ParallelPlan(pp=4, dp=2, micro_batch=1), 16, 2048)
    inter = cm.train(ParallelPlan(pp=4, dp=2, micro_batch=1, virtual_stages=2), 16, 2048)
    assert inter.breakdown["pipeline_bubble"] == pytest.approx(plain.breakdown["pipeline_bubble"] / 2)
    assert inter.breakdown["pp_p2p"] > plain.breakdown["pp_p2p"]  # twice the stage-to-stage sends
    assert inter.time_s < plain.time_s
    p = ParallelPlan.parse("tp2-pp4-dp1-mb1-v2")
    assert p.virtual_stages == 2 and ParallelPlan.parse(p.describe()) == p
    with pytest.raises(ValueError, match="needs pp > 1"):
        ParallelPlan(virtual_stages=2)


def test_overlap_assumptions_hide_tp_and_dp_communication():
    import dataclasses

    cm = cm_for("qwen2.5-72b", gpus=64, network="rdma-200g")
    plan = ParallelPlan(tp=8, pp=2, dp=4, micro_batch=1, recompute="selective", sharded_optimizer=True)
    none = cm.with_profile(dataclasses.replace(cm.profile, tp_comm_overlap=0.0, dp_grad_overlap=False))
    half = cm.with_profile(dataclasses.replace(cm.profile, tp_comm_overlap=0.5, dp_grad_overlap=True))
    a, b = none.train(plan, 64, 4096), half.train(plan, 64, 4096)
    assert b.breakdown["tp_comm"] == pytest.approx(a.breakdown["tp_comm"] / 2)
    assert b.breakdown["dp_grad_sync"] < a.breakdown["dp_grad_sync"] == b.extras["dp_grad_sync_unhidden_s"]
    assert b.mfu > a.mfu
    with pytest.raises(ValueError, match="tp_comm_overlap"):
        dataclasses.replace(cm.profile, tp_comm_overlap=1.5)


def test_head_on_generated_positions_prices_the_runtime_head():
    """earl's runtime computes LM-head logits only on the generated positions (and recomputes
    that chunked head in the backward): `head_frac` prices exactly that share of the head."""
    cm = cm_for("qwen2-27m", hw="cpu", gpus=1)
    plan = ParallelPlan(micro_batch=16)
    full = cm.logprob(plan, 16, 64, masked=True)
    assert cm.logprob(plan, 16, 64, masked=True, head_frac=1.0).time_s == pytest.approx(full.time_s)
    tenth = cm.logprob(plan, 16, 64, masked=True, head_frac=0.1)
    assert tenth.breakdown["lm_head"] == pytest.approx(0.1 * full.breakdown["lm_head"], rel=0.05)
    assert tenth.breakdown["linear"] == pytest.approx(full.breakdown["linear"])
    tr_full, tr_none = cm.train(plan, 16, 64, masked=True), cm.train(plan, 16, 64, masked=True, head_frac=0.0)
    assert tr_none.breakdown["recompute"] == 0.0 and tr_none.time_s < tr_full.time_s
    tr_some = cm.train(plan, 16, 64, masked=True, head_frac=0.5)
    assert tr_some.breakdown["recompute"] > 0.0  # the checkpointed head's second forward
    lengths = [30, 40, 50, 64]
    assert cm.mixed_batch("logprob", plan, lengths, padded=True, head_frac=0.2).time_s < \
        cm.mixed_batch("logprob", plan, lengths, padded=True).time_s
    with pytest.raises(ValueError, match="head_frac"):
        cm.logprob(plan, 16, 64, head_frac=1.5)


def test_rollout_integrates_growth_and_counts_each_recompute_once():
    cm = cm_for("qwen2.5-7b", gpus=1)
    cap = cm.kv_capacity_tokens(1)
    # fits: prompt prefill + decode as the KV grows; 64 stretches agree with a per-token sum
    fine = cm.rollout(ParallelPlan(), 4, 1100, 100, segments=1000)
    coarse = cm.rollout(ParallelPlan(), 4, 1100, 100)
    assert fine.extras["status"] == coarse.extras["status"] == "fits" and fine.extras["recomputed_tokens"] == 0
    per_token = cm.prefill_time_s(1, 400, 0, 4) + sum(cm.decode_step_time_s(1, 4, 4 * t + 2) for t in range(100, 1100))
    assert fine.time_s == pytest.approx(per_token, rel=1e-9)
    assert coarse.time_s == pytest.approx(fine.time_s, rel=2e-3)
    assert fine.tokens == 4 * 1000
    # two sequences of 3/4 of the cache: the later is preempted once, near half the cache, and
    # prefilled again once when the first finishes
    ctx = 3 * cap // 4
    est = cm.rollout(ParallelPlan(), 2, ctx)
    dt = -(-ctx // 64)
    assert est.extras["status"] == "preempting" and est.extras["preemptions"] == 1
    assert cap / 2 - 2 * dt <= est.extras["recomputed_tokens"] <= cap / 2
    assert est.breakdown["prefill"] == pytest.approx(cm.prefill_time_s(1, est.extras["recomputed_tokens"], 0, 1))
    # cannot run, and bad input
    assert cm.rollout(ParallelPlan(), 1, cap + 1).extras["status"] == "cannot run"
    with pytest.raises(ValueError, match="prompt must be in"):
        cm.rollout(ParallelPlan(), 1, 100, 100)


def test_mixed_step_is_one_forward_for_every_row():
    """A continuous-batching engine's mixed step (admitted turns prefilled in the forward that
    decodes the running rows): alone it is a padding-masked prefill plus the turn's host terms;
    beside running rows it costs less than a separate prefill and decode step on a GPU (the
    weights are read once), and never less than either part."""
    cm = cm_for(gpus=1)
    alone = cm.mixed_step_time_s(1, 100, 1, 100 * 150, 150, 0, 0)
    assert alone == pytest.approx(cm.prefill_time_s(1, 100, 50, 1, masked=True), rel=1e-12)
    prof = dataclasses.replace(cm.profile, turn_overhead_s=1e-3, turn_seq_overhead_s=2e-4)
    turns = cm.with_profile(prof)
    assert turns.mixed_step_time_s(1, 200, 2, 2 * 100 * 150, 300, 0, 0) == pytest.approx(
        turns.prefill_time_s(1, 200, 100, 2, masked=True) + 1e-3 + 2 * 2e-4, rel=1e-12)
    dec = cm.decode_step_time_s(1, 32, 32 * 2000)
    both = cm.mixed_step_time_s(1, 100, 1, 100 * 150, 150, 32, 32 * 2000)
    assert max(dec, alone) < both < dec + alone
    assert cm.mixed_step_time_s(1, 0, 0, 0, 0, 32, 32 * 2000) == pytest.approx(
        cm.decode_step_time_s(1, 32, 32 * 2000), rel=0.05)  # no admissions: about a decode step


@pytest.mark.parametrize("factor", [0.5, 2.0, 3.7])
def test_slowed_profile_prices_everything_factor_times_longer(factor):
    """`slowed(profile, f)` (an async pool's share of a CPU host, earl.calibrate.validate_async):
    every stage price of the calibrated CPU profile, host terms, FSDP2 and links included, is f
    times the original's; a field it missed would show as a ratio off f."""
    from earl.calibrate.host import local_cost_model
    from earl.cost_model.profile import load_profile, slowed
    from earl.specs import MODEL_CATALOG

    base = load_profile("cpu-measured")
    one, slow = local_cost_model(base, 2), local_cost_model(slowed(base, factor), 2)
    spec = MODEL_CATALOG["tiny"]
    assert one.model == slow.model == spec
    plan, zero = ParallelPlan(tp=1, dp=2), ParallelPlan(tp=1, dp=2, sharded_optimizer=True)
    prices = {
        "decode step": lambda cm: cm.decode_step_time_s(1, 8, 4096),
        "prefill": lambda cm: cm.prefill_time_s(1, 512, 128),
        "mixed step": lambda cm: cm.mixed_step_time_s(1, 96, 3, 96 * 200, 300, 8, 4096),
        "rollout": lambda cm: cm.rollout(plan, 16, 1024, prompt=64).time_s,
        "logprob": lambda cm: cm.mixed_batch("logprob", plan, [300, 500, 900], padded=True, token_budget=2048,
                                             groups=[[300, 900], [500]]).time_s,
        "train fsdp": lambda cm: cm.mixed_batch("train", zero, [300, 500, 900], padded=True, token_budget=2048,
                                               groups=[[300, 900], [500]], fsdp=True).time_s,
        "reshard fsdp": lambda cm: cm.reshard(zero, ParallelPlan(tp=1, dp=2), fsdp=True).time_s,
        "transfer": lambda cm: cm.transfer_time_s(1e6, 0, 1),
    }
    for what, price in prices.items():
        assert price(slow) == pytest.approx(factor * price(one), rel=1e-9), what
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        slowed(base, 0)
