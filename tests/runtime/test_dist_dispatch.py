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
from earl.runtime.dispatch import check_delivery, execute_dispatch
from earl.runtime.dist import run_local
from earl.runtime.advantages import AdvantageSpec
from earl.specs import ParallelPlan

GROUP_SIZE = 3


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 60, (n,), generator=gen).tolist()
    return [Sample(id=i, tokens=t, group=i // GROUP_SIZE) for i, t in enumerate(lengths)]


def produce(s: Sample) -> dict[str, torch.Tensor]:
    """Deterministic experience tensors of one sample (what the experience stage computes):
    turns of 2 observation tokens then up to 5 generated ones, a step reward on each turn's
    last generated token."""
    gen = torch.Generator().manual_seed(1000 + s.id)
    mask = torch.zeros(s.tokens, dtype=torch.bool)
    turn = torch.full((s.tokens,), -1, dtype=torch.long)
    tok_r = torch.zeros(s.tokens)
    pos, k = 2, 0
    while pos < s.tokens:
        n = int(torch.randint(1, 6, (1,), generator=gen))
        end = min(pos + n, s.tokens)
        mask[pos:end], turn[pos:end] = True, k
        tok_r[end - 1] = float(torch.randn(1, generator=gen))
        pos, k = end + 2, k + 1
    return {
        "input_ids": torch.randint(0, 64, (s.tokens,), generator=gen),
        "loss_mask": mask,
        "old_logprobs": -torch.rand(s.tokens, generator=gen),
        "ref_logprobs": -torch.rand(s.tokens, generator=gen),
        "rewards": tok_r.sum().reshape(1),
        "token_rewards": tok_r,
        "turn_ids": turn,
    }


def expected_advantages(samples, spec: AdvantageSpec) -> dict[int, torch.Tensor]:
    """runtime-1's single-process estimators on the whole batch (earl.runtime.trainer)."""
    from earl.runtime.trainer import grpo_advantages, reinforce_pp_advantages

    items = [produce(s) for s in samples]
    width = max(s.tokens for s in samples)

    def pad(name, fill=0):
        out = torch.full((len(samples), width), fill, dtype=items[0][name].dtype)
        for r, it in enumerate(items):
            out[r, :it[name].numel()] = it[name]
        return out

    mask = pad("loss_mask")
    if spec.estimator == "grpo":
        per_sample = grpo_advantages(torch.cat([it["rewards"] for it in items]),
                                     torch.tensor([s.group for s in samples]))
        adv = per_sample[:, None] * mask
    else:
        adv = reinforce_pp_advantages(pad("token_rewards"), mask, pad("old_logprobs"), None, 0.0,
                                      turn_ids=pad("turn_ids", -1) if spec.per_turn else None)
    return {s.id: adv[r, :s.tokens] for r, s in enumerate(samples)}


def layouts(samples, src_plan, dst_plan):
    src_assign, _ = round_robin_samples(samples, src_plan.dp)
    dst_assign, _ = balance_samples(samples, dst_plan.dp)
    return Layout(src_plan, src_assign), Layout(dst_plan, dst_assign)


def _dispatch_worker(samples, src, dst, kind, spec):
    import torch.distributed as dist

    rank = dist.get_rank()
    g = rank // src.plan.tp
    store = {i: produce(s) for s in samples for i in [s.id] if i in src.assignment[g]}
    disp = CentralizedDispatcher() if kind == "centralized" else LayoutAwareDispatcher()
    tplan = disp.plan(src, dst, samples)
    got, stats = execute_dispatch(tplan, store, samples, src, dst, advantages=spec)
    return got, stats.bytes_sent, stats.bytes_recv


@pytest.mark.dist
@pytest.mark.parametrize("src_plan,dst_plan,spec", [
    (ParallelPlan(tp=2, dp=2), ParallelPlan(tp=1, dp=4), AdvantageSpec(estimator="grpo")),
    (ParallelPlan(tp=1, dp=4), ParallelPlan(tp=2, dp=2), AdvantageSpec(estimator="reinforce++", per_turn=True)),
    (ParallelPlan(tp=2, dp=2), ParallelPlan(tp=4, dp=1), AdvantageSpec(estimator="reinforce++")),
])
def test_both_dispatchers_deliver_identical_batches_exactly_once(src_plan, dst_plan, spec):
    samples = make_samples(13)
    src, dst = layouts(samples, src_plan, dst_plan)
    expected = {s.id: produce(s) for s in samples}
    for i, adv in expected_advantages(samples, spec).items():
        expected[i]["advantages"] = adv
    runs = {k: run_local(_dispatch_worker, 4, samples, src, dst, k, spec, timeout_s=120)
            for k in ("centralized", "layout-aware")}
    for rank in range(4):
        a, b = runs["centralized"][rank][0], runs["layout-aware"][rank][0]
        group = rank // dst_plan.tp
        assert sorted(a) == sorted(b) == sorted(dst.assignment[group])
        for i in a:
            assert sorted(a[i]) == sorted(b[i])
            for name in a[i]:
                if name == "advantages":  # float64 statistics, summed in a different order
                    torch.testing.assert_close(a[i][name], b[i][name], atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(a[i][name], expected[i][name], atol=1e-5, rtol=1e-5)
                else:
                    assert torch.equal(a[i][name], b[i][name]), f"rank {rank} sample {i} {name} differs"
                    assert torch.equal(a[i][name], expected[i][name]), f"rank {rank} sample {i} {name}"
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
