"""Both dispatchers, executed on 4 gloo ranks, deliver identical per-rank training batches,
exactly once, with the advantages a single process computes from all rewards.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_dispatch.py
"""

from __future__ import annotations

import pytest
import torch

from earl.policies.balance import balance_samples, round_robin_samples
from earl.policies.dispatch import CentralizedDispatcher, LayoutAwareDispatcher
from earl.policies.types import Layout, Sample
from earl.runtime.dispatch import (
    check_delivery,
    execute_dispatch,
    fill_advantages,
    group_stats,
)
from earl.runtime.dist import run_local
from earl.specs import ParallelPlan

GROUP_SIZE = 3


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 60, (n,), generator=gen).tolist()
    return [Sample(id=i, tokens=t, group=i // GROUP_SIZE) for i, t in enumerate(lengths)]


def produce(s: Sample) -> dict[str, torch.Tensor]:
    """Deterministic experience tensors of one sample (what the experience stage computes)."""
    gen = torch.Generator().manual_seed(1000 + s.id)
    return {
        "input_ids": torch.randint(0, 64, (s.tokens,), generator=gen),
        "loss_mask": torch.rand(s.tokens, generator=gen) > 0.3,
        "old_logprobs": -torch.rand(s.tokens, generator=gen),
        "ref_logprobs": -torch.rand(s.tokens, generator=gen),
        "rewards": torch.rand(1, generator=gen),
    }


def layouts(samples, src_plan, dst_plan):
    src_assign, _ = round_robin_samples(samples, src_plan.dp)
    dst_assign, _ = balance_samples(samples, dst_plan.dp)
    return Layout(src_plan, src_assign), Layout(dst_plan, dst_assign)


def _dispatch_worker(samples, src, dst, kind):
    import torch.distributed as dist

    rank = dist.get_rank()
    g = rank // src.plan.tp
    store = {i: produce(s) for s in samples for i in [s.id] if i in src.assignment[g]}
    disp = CentralizedDispatcher() if kind == "centralized" else LayoutAwareDispatcher()
    tplan = disp.plan(src, dst, samples)
    got, stats = execute_dispatch(tplan, store, samples, src, dst)
    return got, stats.bytes_sent, stats.bytes_recv


@pytest.mark.dist
@pytest.mark.parametrize("src_plan,dst_plan", [
    (ParallelPlan(tp=2, dp=2), ParallelPlan(tp=1, dp=4)),
    (ParallelPlan(tp=1, dp=4), ParallelPlan(tp=2, dp=2)),
])
def test_both_dispatchers_deliver_identical_batches_exactly_once(src_plan, dst_plan):
    samples = make_samples(13)
    src, dst = layouts(samples, src_plan, dst_plan)
    expected = {s.id: produce(s) for s in samples}
    fill_advantages(expected, samples, group_stats(expected, samples, "grpo"), "grpo")
    runs = {k: run_local(_dispatch_worker, 4, samples, src, dst, k, timeout_s=120)
            for k in ("centralized", "layout-aware")}
    for rank in range(4):
        a, b = runs["centralized"][rank][0], runs["layout-aware"][rank][0]
        group = rank // dst_plan.tp
        assert sorted(a) == sorted(b) == sorted(dst.assignment[group])
        for i in a:
            assert sorted(a[i]) == sorted(b[i])
            for name in a[i]:
                assert torch.equal(a[i][name], b[i][name]), f"rank {rank} sample {i} {name} differs"
                assert torch.allclose(a[i][name].float(), expected[i][name].float(), atol=1e-6), name
    # the controller (rank 0) carries everything twice under centralized; not under layout-aware
    sent_c = [r[1] for r in runs["centralized"]]
    sent_l = [r[1] for r in runs["layout-aware"]]
    assert sent_c[0] > max(sent_l)
    assert sum(sent_c) > sum(sent_l)


def test_delivery_check_catches_duplicates_and_gaps():
    samples = make_samples(4)
    _, dst = layouts(samples, ParallelPlan(dp=1), ParallelPlan(dp=1))
    need = {(s.id, n): 1 for s in samples for n in
            ("input_ids", "loss_mask", "old_logprobs", "ref_logprobs", "advantages")}
    check_delivery(need, dst, samples, 0)
    with pytest.raises(RuntimeError, match="1 tensors twice"):
        check_delivery({**need, (0, "input_ids"): 2}, dst, samples, 0)
    with pytest.raises(RuntimeError, match="missed 1"):
        check_delivery({k: v for k, v in need.items() if k != (3, "advantages")}, dst, samples, 0)
