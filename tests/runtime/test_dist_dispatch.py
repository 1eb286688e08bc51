"""Both dispatchers, executed on 4 gloo ranks, deliver identical per-rank training batches,
exactly once, with the advantages a single process computes from all rewards.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_dispatch.py
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from earl.policies.balance import balance_samples, round_robin_samples
from earl.policies.dispatch import CentralizedDispatcher, LayoutAwareDispatcher
from earl.policies.types import Layout, Sample
from earl.runtime.advantages import AdvantageSpec, episode_key_sums, fill_advantages, local_stats, summed_stats
from earl.runtime.dist import run_local
from earl.runtime.move_samples import check_delivery, execute_dispatch
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


def turn_count(samples) -> int:
    """The most turns of any sample `produce` makes: what the runtime's metadata gives every rank."""
    return max(int(produce(s)["turn_ids"].max()) + 1 for s in samples)


def known_stats(samples, spec: AdvantageSpec):
    """REINFORCE++'s batch statistics from every sample's key sums, as each rank of the runtime
    sums them from its metadata all-gather (None for a group estimator)."""
    if spec.grouped:
        return None
    return summed_stats(episode_key_sums({s.id: produce(s) for s in samples}, spec), samples)


def expected_advantages(samples, spec: AdvantageSpec) -> dict[int, torch.Tensor]:
    """The estimators' reference formulas on the whole batch, on one process.

    GRPO: (reward - group mean) / (group std + eps) on every generated token. REINFORCE++: the
    undiscounted return-to-go of the token rewards, minus the batch mean (or, per turn, the
    mean of the same turn index), divided by the std of the centred returns over all generated
    tokens of the batch (+ eps)."""
    items = {s.id: produce(s) for s in samples}
    out = {}
    if spec.estimator == "grpo":
        for g in {s.group for s in samples}:
            ids = [s.id for s in samples if s.group == g]
            r = torch.cat([items[i]["rewards"] for i in ids]).double()
            adv = (r - r.mean()) / (r.std(unbiased=False) + spec.eps)
            for i, a in zip(ids, adv.tolist(), strict=True):
                out[i] = (a * items[i]["loss_mask"].double()).float()
        return out
    returns = {i: it["token_rewards"].double().flip(0).cumsum(0).flip(0) for i, it in items.items()}
    masks = {i: it["loss_mask"] for i, it in items.items()}
    keys = {i: it["turn_ids"] if spec.per_turn else torch.zeros_like(it["turn_ids"]) for i, it in items.items()}
    values: dict[int, list[float]] = {}  # baseline key -> returns of the generated tokens
    for i in items:
        for k, v in zip(keys[i][masks[i]].tolist(), returns[i][masks[i]].tolist(), strict=True):
            values.setdefault(k, []).append(v)
    means = {k: sum(v) / len(v) for k, v in values.items()}
    centred = {i: torch.tensor([v - means[k] for k, v in zip(keys[i][masks[i]].tolist(),
                                                             returns[i][masks[i]].tolist(), strict=True)],
                               dtype=torch.float64) for i in items}
    std = torch.cat(list(centred.values())).pow(2).mean().sqrt().item()
    for i in items:
        adv = torch.zeros_like(returns[i])
        adv[masks[i]] = centred[i] / (std + spec.eps)
        out[i] = adv.float()
    return out


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
    # "rewards": every sample's episode reward and the most turns of any, on every rank, as the
    # runtime's metadata gives them; "summed": REINFORCE++'s key sums too (no KL penalty)
    known = kind in ("rewards", "summed")
    rewards = {s.id: float(produce(s)["rewards"]) for s in samples} if known else None
    turns = turn_count(samples) if known else None
    got, stats = execute_dispatch(tplan, store, samples, src, dst, advantages=spec, rewards=rewards, turns=turns,
                                  stats=known_stats(samples, spec) if kind == "summed" else None)
    return got, stats.bytes_sent, stats.bytes_recv, stats.waited, stats.reductions


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
    # "rewards": layout-aware with the rewards and the turn count known everywhere (a group
    # estimator's statistics from them, no reduce; reinforce++ reduces its sums only)
    # (the group estimators' statistics are the rewards: "summed" is REINFORCE++'s)
    kinds = ("centralized", "layout-aware", "rewards") + (() if spec.grouped else ("summed",))
    runs = {k: run_local(_dispatch_worker, 4, samples, src, dst, k, spec, timeout_s=120) for k in kinds}
    for rank in range(4):
        a, b, *others = (runs[k][rank][0] for k in kinds)
        group = rank // dst_plan.tp
        assert sorted(a) == sorted(b) == sorted(dst.assignment[group])
        assert all(sorted(c) == sorted(b) for c in others)
        for i in a:
            assert sorted(a[i]) == sorted(b[i]) and all(sorted(c[i]) == sorted(b[i]) for c in others)
            for name in a[i]:
                if name == "advantages":  # float64 statistics, summed in a different order
                    torch.testing.assert_close(a[i][name], b[i][name], atol=1e-5, rtol=1e-5)
                    for c in others:
                        torch.testing.assert_close(c[i][name], b[i][name], atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(a[i][name], expected[i][name], atol=1e-5, rtol=1e-5)
                else:
                    assert torch.equal(a[i][name], b[i][name]), f"rank {rank} sample {i} {name} differs"
                    for c in others:
                        assert torch.equal(c[i][name], b[i][name]), f"rank {rank} sample {i} {name} differs"
                    assert torch.equal(a[i][name], expected[i][name]), f"rank {rank} sample {i} {name}"
    # the controller (rank 0) carries everything twice under centralized; not under layout-aware
    sent_c = [r[1] for r in runs["centralized"]]
    sent_l = [r[1] for r in runs["layout-aware"]]
    assert sent_c[0] > max(sent_l)
    assert sum(sent_c) > sum(sent_l)
    # the reductions each rank issued, as AdvantageSpec.reductions counts them (none centralized:
    # the controller computes alone)
    assert [r[4] for r in runs["centralized"]] == [0] * 4
    assert [r[4] for r in runs["layout-aware"]] == [spec.reductions()] * 4
    assert [r[4] for r in runs["rewards"]] == [spec.reductions({}, 0)] * 4
    if "summed" in runs:  # REINFORCE++ with its key sums known: no round at all
        assert [r[4] for r in runs["summed"]] == [spec.reductions({}, 0, summed=True)] * 4 == [0] * 4


@pytest.mark.dist
def test_group_statistics_from_the_rewards_need_no_round_between_ranks():
    """GRPO onto the layout the samples are on (nothing to send): with every reward known to
    every rank the dispatch waits for no one (no barrier, no statistics reduce) and gives the
    advantages the reduce gives; without them it must meet its peers for the statistics."""
    samples = make_samples(8)
    plan = ParallelPlan(dp=2)
    src = Layout(plan, round_robin_samples(samples, 2)[0])
    spec = AdvantageSpec(estimator="grpo")
    runs = {k: run_local(_dispatch_worker, 2, samples, src, src, k, spec, timeout_s=120)
            for k in ("layout-aware", "rewards")}
    assert [r[3] for r in runs["layout-aware"]] == [True, True]
    assert [r[3] for r in runs["rewards"]] == [False, False]
    for rank in range(2):
        for i, item in runs["rewards"][rank][0].items():
            torch.testing.assert_close(item["advantages"], runs["layout-aware"][rank][0][i]["advantages"],
                                       atol=1e-6, rtol=1e-6)


def _reductions_worker(samples, src, cases):
    """Per (estimator, per_turn, what is known) case (known: None, "rewards": the rewards and the
    turn count, "summed": REINFORCE++'s key sums too): the statistics reductions between ranks
    (`reduce_small` calls) the runtime's dispatch runs (execute_dispatch with the training
    step's arguments)."""
    import torch.distributed as dist

    from earl.runtime import advantages

    rank = dist.get_rank()
    calls = []
    real = advantages.reduce_small

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    advantages.reduce_small = counted
    out = []
    for estimator, per_turn, known in cases:
        spec = AdvantageSpec(estimator=estimator, per_turn=per_turn)
        store = {i: produce(s) for s in samples for i in [s.id] if i in src.assignment[rank]}
        tplan = LayoutAwareDispatcher().plan(src, src, samples)
        rewards = {s.id: float(produce(s)["rewards"]) for s in samples} if known else None
        turns = turn_count(samples) if known else None
        calls.clear()
        _, stats = execute_dispatch(tplan, store, samples, src, src, advantages=spec, rewards=rewards, turns=turns,
                                    stats=known_stats(samples, spec) if known == "summed" else None)
        assert stats.reductions == len(calls)
        out.append(len(calls))
    advantages.reduce_small = real
    return out


@pytest.mark.dist
def test_the_priced_count_of_statistics_reductions_is_what_the_executor_runs():
    """AdvantageSpec.reductions (the simulator's `stat_reductions`, TransferPlan.reductions) is
    the number of reductions the executor issues on 2 gloo ranks: none for a group estimator
    whose rewards every rank holds, one of the per-key sums, two with a per-turn baseline whose
    turn count the ranks do not know (one where they do, as the runtime's metadata gives it), none
    for REINFORCE++ whose episodes' key sums every rank holds (the metadata without a KL term)."""
    samples = make_samples(8)
    src = Layout(ParallelPlan(dp=2), round_robin_samples(samples, 2)[0])
    cases = [(e, pt, known) for e in ("grpo", "rloo", "reinforce++") for pt in (False, True)
             for known in (None, "rewards")] + [("reinforce++", pt, "summed") for pt in (False, True)]
    got = run_local(_reductions_worker, 2, samples, src, cases, timeout_s=120)
    want = [AdvantageSpec(estimator=e, per_turn=pt).reductions({} if known else None, 0 if known else None,
                                                               summed=known == "summed")
            for e, pt, known in cases]
    assert got == [want, want]
    assert dict(zip(cases, want, strict=True))[("reinforce++", True, None)] == 2
    assert dict(zip(cases, want, strict=True))[("reinforce++", True, "rewards")] == 1
    assert dict(zip(cases, want, strict=True))[("reinforce++", True, "summed")] == 0
    assert dict(zip(cases, want, strict=True))[("grpo", True, "rewards")] == 0


def _handoff_worker(samples, src, dst, late_s):
    """The runtime's rollout -> experience hand-off (tensors only) onto `dst`; the last rank
    arrives `late_s` late. Returns what this rank got, the seconds it spent in the executor and
    the bytes it sent."""
    import time

    import torch.distributed as dist

    rank = dist.get_rank()
    store = {i: produce(s) for s in samples for i in [s.id] if i in src.assignment[rank]}
    tplan = LayoutAwareDispatcher().plan(src, dst, samples)
    if rank == dist.get_world_size() - 1:
        time.sleep(late_s)
    t0 = time.perf_counter()
    got, stats = execute_dispatch(tplan, store, samples, src, dst, tensors=("input_ids", "loss_mask"))
    took = time.perf_counter() - t0
    dist.barrier()  # the late rank's hand-off is over before any rank leaves
    return got, took, stats.bytes_sent, stats.waited


@pytest.mark.dist
def test_handoff_onto_the_aligned_layout_waits_for_no_one():
    """A hand-off onto the layout aligned with the rollout's (every episode stays where it was
    played: local copies, no statistics) runs no collective:
    the punctual ranks finish their copies while the last one is still 2 s late, and every rank
    holds exactly its episodes; a hand-off that sends still waits for its peers."""
    from earl.policies.balance import balance_aligned

    samples = make_samples(12)
    plan = ParallelPlan(dp=2)
    src_assign = tuple(tuple(s.id for s in samples if s.id % 2 == d) for d in range(2))
    src = Layout(plan, src_assign)
    aligned = Layout(plan, tuple(tuple(g) for g in balance_aligned(samples, 2, src_assign)[0]))
    assert not dataclasses.replace(LayoutAwareDispatcher().plan(src, aligned, samples), reduce_bytes=0).waits_for_peers
    late = 2.0
    runs = run_local(_handoff_worker, 2, samples, src, aligned, late, timeout_s=120)
    for rank, (got, _, sent, waited) in enumerate(runs):
        assert sorted(got) == sorted(aligned.assignment[rank]) and sent == 0 and not waited
        for i in got:
            assert torch.equal(got[i]["input_ids"], produce(samples[i])["input_ids"])
    assert runs[0][1] < late / 4, f"the punctual rank waited {runs[0][1]:.2f} s for its late peer"
    # onto a layout that moves episodes, the punctual rank waits for the late one's sends
    moved = Layout(plan, (src_assign[1], src_assign[0]))
    runs = run_local(_handoff_worker, 2, samples, src, moved, late, timeout_s=120)
    assert all(sorted(got) == sorted(moved.assignment[r]) and waited for r, (got, _, _, waited) in enumerate(runs))
    assert runs[0][1] > late / 2


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


def test_a_known_turn_count_keys_the_per_turn_baseline_as_the_agreed_one_does():
    """One process: `distributed_advantages` with the turn count given (the runtime's metadata
    knows it) writes the advantages it writes when it finds the count itself, also with a count
    above the longest sample's (empty keys drop out); a sample with a turn at or above the given
    count raises instead of leaving its statistics out."""
    from earl.runtime.advantages import distributed_advantages

    samples = make_samples(7)
    src = Layout(ParallelPlan(), (tuple(s.id for s in samples),))
    spec = AdvantageSpec(estimator="reinforce++", per_turn=True)
    turns = turn_count(samples)
    found = {s.id: produce(s) for s in samples}
    distributed_advantages(found, samples, src, spec)
    for given in (turns, turns + 3):
        store = {s.id: produce(s) for s in samples}
        distributed_advantages(store, samples, src, spec, turns=given)
        for i in store:
            assert torch.equal(store[i]["advantages"], found[i]["advantages"])
    with pytest.raises(ValueError, match=f"turn index {turns - 1} at or above the known turn count {turns - 1}"):
        distributed_advantages({s.id: produce(s) for s in samples}, samples, src, spec, turns=turns - 1)


@pytest.mark.parametrize("spec", [AdvantageSpec(estimator="reinforce++"),
                                  AdvantageSpec(estimator="reinforce++", per_turn=True),
                                  AdvantageSpec(estimator="reinforce++", per_turn=True, gamma=0.9)])
def test_episode_key_sums_add_up_to_the_statistics_a_rank_sums(spec):
    """Each sample's `episode_key_sums` are what `local_stats` of it alone holds, and
    `summed_stats` over the batch is `local_stats` over it (per turn: the turns' keys, as the
    reduction keys them; a generated token after the last rewarded turn counts in none); the
    advantages from them are the reference formulas'. A group estimator has none."""
    samples = make_samples(9)
    items = {s.id: produce(s) for s in samples}
    tail = items[4]  # generated tokens after its last rewarded turn (turn id -1, on the mask)
    tail["loss_mask"][-2:], tail["turn_ids"][-2:], tail["token_rewards"][-2:] = True, -1, 0.0
    sums = episode_key_sums(items, spec)
    for s in samples:
        alone = local_stats({s.id: items[s.id]}, [s], spec)
        alone = {k: v for k, v in alone.items() if k >= 0 or not spec.per_turn}
        assert {k for k, *_ in sums[s.id]} == set(alone)
        for k, *tot in sums[s.id]:
            torch.testing.assert_close(torch.tensor(tot, dtype=torch.float64), alone[k], rtol=1e-12, atol=1e-12)
    whole = summed_stats(sums, samples)
    ref = {k: v for k, v in local_stats(items, samples, spec).items() if k >= 0 or not spec.per_turn}
    assert sorted(whole) == sorted(ref)
    for k in ref:
        torch.testing.assert_close(whole[k], ref[k], rtol=1e-12, atol=1e-12)
    assert summed_stats(sums, list(reversed(samples))).keys() == whole.keys()
    if spec.gamma == 1:
        items = {s.id: produce(s) for s in samples}
        fill_advantages(items, samples, summed_stats(episode_key_sums(items, spec), samples), spec)
        for i, adv in expected_advantages(samples, spec).items():
            torch.testing.assert_close(items[i]["advantages"], adv, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="grpo needs only the rewards"):
        episode_key_sums(items, AdvantageSpec(estimator="grpo"))
