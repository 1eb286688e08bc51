"""Training on FSDP2 and DTensor (earl.runtime.parallelize + optim.FSDPAdamW) equals one process
running the loss and plain AdamW: tp1 x dp2 (FSDP2 only) and tp2 x dp2 (DTensor TP composed with
FSDP2 on a 2-D mesh), fp32 on gloo; local shards follow earl.parallel's ZeRO layout; with bf16
compute the sharded parameters stay fp32 masters; activation checkpointing gives the same step.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_fsdp.py
"""

from __future__ import annotations

import pytest
import torch

from earl.parallel import build_plan_groups, local_shape
from earl.policies.balance import balance_samples
from earl.policies.types import Sample
from earl.runtime.dist import run_local
from earl.runtime.hf_model import build_builtin
from earl.runtime.optim import FSDPAdamW, sync_buckets
from earl.runtime.parallelize import parallelize
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import Trainer, train_step
from earl.specs import ParallelPlan
from tests.runtime.test_dist_train import CFG, STEPS, check_ranks, make_batch, reference_run


def _fsdp_worker(batch, plan: ParallelPlan, dtype=torch.float32):
    groups = build_plan_groups(plan)
    model = build_builtin("tiny", seed=0).model.to(dtype)
    shapes = param_shapes(model)
    model = parallelize(model, plan, shapes)
    trainer = Trainer(model, CFG, temperature=1.0, lockstep=groups.dp_group)
    optim = FSDPAdamW(model, shapes, groups, CFG, dtype)
    samples = [Sample(id=i, tokens=int(n)) for i, n in enumerate(batch.loss_mask.sum(1))]
    assignment, _ = balance_samples(samples, plan.dp)
    local = batch.select(list(assignment[groups.dp_rank]))
    stats = [train_step(trainer, optim, local) for _ in range(STEPS)]
    state = optim.state_tensors()
    layout_ok = all(tuple(t.shape) == local_shape(shapes[k.split("/")[0]], plan, groups.rank, optimizer=True)
                    for k, t in state.items())
    weights = optim.weights()
    # the weight sync's gathers cut into buckets of a few tensors each give the same weights
    small = optim.weights(bucket_bytes=4096)
    assert small.keys() == weights.keys() and all(torch.equal(small[n], weights[n]) for n in weights)
    return stats, {n: t.clone() for n, t in weights.items()}, layout_ok, {k: t.dtype for k, t in state.items()}


@pytest.mark.dist
@pytest.mark.parametrize("plan", [ParallelPlan(dp=2, sharded_optimizer=True),
                                  ParallelPlan(tp=2, dp=2, sharded_optimizer=True, recompute="full")],
                         ids=["tp1-dp2-fsdp", "tp2-dp2-fsdp-ac"])
def test_fsdp2_step_matches_single_process(plan):
    batch = make_batch()
    ref_stats, ref_w, signal = reference_run(batch)
    results = run_local(_fsdp_worker, plan.world_size, batch, plan, timeout_s=180)
    assert all(layout_ok for _, _, layout_ok, _ in results)
    init_w = {n: p.detach() for n, p in build_builtin("tiny", seed=0).model.named_parameters()}
    check_ranks(results, plan, ref_stats, ref_w, init_w, signal)
    assert ref_stats[0]["grad_norm"] > CFG.grad_clip  # the global clip was exercised


def test_sync_buckets_cut_runs_of_consecutive_tensors():
    sizes = {"a": 60.0, "b": 30.0, "c": 200.0, "d": 10.0, "e": 80.0, "f": 15.0}
    assert sync_buckets(sizes, 100) == [["a", "b"], ["c"], ["d", "e"], ["f"]]
    assert sync_buckets(sizes, 1e9) == [list(sizes)]
    assert sync_buckets(sizes, 1) == [[n] for n in sizes]  # one tensor per gather: the old sync


@pytest.mark.dist
def test_fsdp2_bf16_keeps_fp32_masters_and_moments():
    plan = ParallelPlan(dp=2, sharded_optimizer=True)
    results = run_local(_fsdp_worker, 2, make_batch(), plan, torch.bfloat16, timeout_s=180)
    for stats, weights, layout_ok, dtypes in results:
        assert layout_ok and all(s["loss"] == s["loss"] for s in stats)
        assert all(t.dtype == torch.bfloat16 for t in weights.values())
        assert set(dtypes.values()) == {torch.float32} and any(k.endswith("/master") for k in dtypes)
