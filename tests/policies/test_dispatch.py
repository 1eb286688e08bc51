"""Dispatcher and balancing tests: property tests over random layouts and sample sets.

    pytest tests/policies/test_dispatch.py
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from earl.policies.balance import balance_aligned, balance_samples, group_tokens, round_robin_samples
from earl.policies.dispatch import (
    CONSUMED_TENSORS,
    PRODUCED_TENSORS,
    CentralizedDispatcher,
    LayoutAwareDispatcher,
    cp_token_range,
    received_sets,
    required_sets,
)
from earl.policies.types import TENSOR_BYTES_PER_SAMPLE, TENSOR_BYTES_PER_TOKEN, Layout, Sample
from earl.specs import ParallelPlan

DISPATCHERS = [CentralizedDispatcher(), LayoutAwareDispatcher()]


# --------------------------------------------------------------------------------------------
# An independent oracle of what each rank needs, written from the layout rules in words:
# every rank of dp group d needs d's samples; tp peers need the same; cp rank c needs share c;
# pp stage 0 needs input_ids, the last stage needs all consumed tensors, middle stages nothing.
# --------------------------------------------------------------------------------------------
def oracle(dst: Layout, samples: list[Sample]) -> dict:
    tokens = {s.id: s.tokens for s in samples}
    need: dict = {}
    for c in dst.coords:
        names = set()
        if c.pp == 0:
            names.add("input_ids")
        if c.pp == dst.plan.pp - 1:
            names.update(CONSUMED_TENSORS)
        per = {}
        for i in dst.assignment[c.dp]:
            a, b = cp_token_range(tokens[i], dst.plan.cp, c.cp)
            if b > a:
                for n in names:
                    per[(i, n)] = ((a, b),)
        if per:
            need[c.rank] = per
    return need


def needed_bytes(need: dict) -> int:
    return sum((b - a) * TENSOR_BYTES_PER_TOKEN[name]
               for per in need.values() for (_, name), rs in per.items() for a, b in rs)


@st.composite
def scenarios(draw):
    def plan():
        return ParallelPlan(tp=draw(st.sampled_from([1, 2, 4])), cp=draw(st.sampled_from([1, 2, 3])),
                            pp=draw(st.sampled_from([1, 2, 3])), dp=draw(st.integers(1, 4)))

    n = draw(st.integers(0, 24))
    samples = [Sample(i, draw(st.integers(0, 60)), group=draw(st.integers(0, 3))) for i in range(n)]
    sp, dpn = plan(), plan()

    def layout(p, base):
        owner = [draw(st.integers(0, p.dp - 1)) for _ in samples]
        groups = tuple(tuple(s.id for s, o in zip(samples, owner, strict=True) if o == d) for d in range(p.dp))
        return Layout(p, groups, base_rank=base)

    src = layout(sp, 0)
    dst = layout(dpn, draw(st.sampled_from([0, 3, sp.world_size])))  # colocated, shifted, disjoint
    return src, dst, samples


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_rank_gets_exactly_what_it_needs(case):
    src, dst, samples = case
    need = oracle(dst, samples)
    got = {}
    for disp in DISPATCHERS:
        tplan = disp.plan(src, dst, samples)
        got[disp.name] = received_sets(tplan)  # raises on any duplicate token
        assert got[disp.name] == need, disp.name
        final_bytes = sum(t.bytes for t in tplan.phases[-1])
        assert final_bytes == needed_bytes(need)  # bytes conserved
        assert all(t.bytes > 0 and len(t.sample_ids) == len(t.token_ranges) for t in tplan.phases[-1])
    assert got["centralized"] == got["layout-aware"]
    assert required_sets(dst, samples) == need


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_producers_hold_what_they_send(case):
    """Layout-aware sources are last-stage ranks of the src dp group holding the sample,
    whose cp share covers the range sent."""
    src, dst, samples = case
    tokens = {s.id: s.tokens for s in samples}
    coords = {c.rank: c for c in src.coords}
    owner = {i: g for g, ids in enumerate(src.assignment) for i in ids}
    tplan = LayoutAwareDispatcher().plan(src, dst, samples)
    assert len(tplan.phases) == 1
    for t in tplan.transfers:
        c = coords[t.src]
        assert c.pp == src.plan.pp - 1
        for i, (a, b) in zip(t.sample_ids, t.token_ranges, strict=True):
            assert owner[i] == c.dp
            ca, cb = cp_token_range(tokens[i], src.plan.cp, c.cp)
            assert ca <= a < b <= cb
    assert tplan.reduce_bytes == 24 * len({s.group for s in samples})


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_centralized_gathers_each_datum_once(case):
    src, dst, samples = case
    tplan = CentralizedDispatcher().plan(src, dst, samples)
    gather, scatter = tplan.phases
    assert all(t.dst == tplan.controller for t in gather)
    assert all(t.src == tplan.controller for t in scatter)
    produced = sum(s.tokens for s in samples) * sum(TENSOR_BYTES_PER_TOKEN[n] for n in PRODUCED_TENSORS)
    produced += len(samples) * sum(TENSOR_BYTES_PER_SAMPLE.values())
    assert sum(t.bytes for t in gather) == produced
    seen = [(i, n, r) for t in gather
            for i, r in zip(t.sample_ids, t.token_ranges or [None] * len(t.sample_ids), strict=True)
            for n in t.tensors]
    assert len(seen) == len(set(seen))


def test_colocated_identical_layout_moves_nothing_layout_aware():
    plan = ParallelPlan(tp=2, cp=2, dp=2)
    samples = [Sample(i, 10 + 7 * i) for i in range(9)]
    assignment, _ = balance_samples(samples, plan.dp)
    layout = Layout(plan, assignment)
    la = LayoutAwareDispatcher().plan(layout, layout, samples)
    ce = CentralizedDispatcher().plan(layout, layout, samples)
    assert la.total_bytes == 0
    assert ce.total_bytes > 0


def test_centralized_controller_carries_everything_twice():
    src = Layout(ParallelPlan(tp=1, dp=4), ((0, 1), (2, 3), (4, 5), (6, 7)))
    dst = Layout(ParallelPlan(tp=2, dp=2), ((0, 2, 4, 6), (1, 3, 5, 7)), base_rank=4)
    samples = [Sample(i, 100) for i in range(8)]
    ce = CentralizedDispatcher().plan(src, dst, samples)
    la = LayoutAwareDispatcher().plan(src, dst, samples)
    per_token = sum(TENSOR_BYTES_PER_TOKEN.values())
    # every dst rank (4 of them) gets its dp group's 4 samples x 100 tokens of all tensors
    assert sum(t.bytes for t in la.transfers) == 4 * 4 * 100 * per_token
    assert la.total_bytes == 4 * 4 * 100 * per_token  # disjoint ranks: nothing is local
    produced_per_token = sum(TENSOR_BYTES_PER_TOKEN[n] for n in PRODUCED_TENSORS)
    gathered = 8 * 100 * produced_per_token + 8 * 4
    local = 2 * 100 * produced_per_token + 2 * 4  # rank 0 is the controller and holds samples 0, 1
    assert ce.total_bytes == la.total_bytes + gathered - local
    assert ce.controller == 0 and la.metadata_bytes == ce.metadata_bytes == 8 * 32


def test_bad_layouts_are_rejected():
    samples = [Sample(0, 5), Sample(1, 5)]
    good = Layout(ParallelPlan(dp=1), ((0, 1),))
    with pytest.raises(ValueError, match="exactly once"):
        LayoutAwareDispatcher().plan(good, Layout(ParallelPlan(dp=2), ((0,), (0,))), samples)
    with pytest.raises(ValueError, match="twice"):
        CentralizedDispatcher().plan(good, good, [Sample(0, 5), Sample(0, 6)])
    with pytest.raises(ValueError, match="sample 1 has a negative token count -2"):  # the first bad one, named
        CentralizedDispatcher().plan(good, good, [Sample(0, 5), Sample(1, -2)])


def test_cp_token_range_partitions():
    for n in range(0, 40):
        for cp in range(1, 6):
            ranges = [cp_token_range(n, cp, c) for c in range(cp)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(ranges[k][1] == ranges[k + 1][0] for k in range(cp - 1))
            assert {b - a for a, b in ranges} <= {n // cp, -(-n // cp)}


def test_received_sets_flags_duplicates():
    from earl.policies.types import Transfer, TransferPlan
    t = Transfer(src=0, dst=1, sample_ids=(3,), tensors=("input_ids",), bytes=80, token_ranges=((0, 10),))
    t2 = Transfer(src=2, dst=1, sample_ids=(3,), tensors=("input_ids",), bytes=40, token_ranges=((5, 10),))
    with pytest.raises(ValueError, match="twice"):
        received_sets(TransferPlan(kind="x", controller=0, phases=[[t, t2]]))


# --------------------------------------------------------------------------------------------
# Balancing
# --------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=60), st.integers(1, 9))
def test_balance_places_each_sample_once_within_greedy_bound(lengths, dp):
    samples = [Sample(i, n) for i, n in enumerate(lengths)]
    assignment, imbalance = balance_samples(samples, dp)
    assert len(assignment) == dp
    assert sorted(i for g in assignment for i in g) == list(range(len(samples)))
    loads = group_tokens(assignment, samples)
    total = sum(lengths)
    if total:
        assert imbalance == pytest.approx(max(loads) * dp / total)
        # list-scheduling bound: the heaviest group exceeds the mean by at most one sample
        assert max(loads) <= total / dp + max(lengths) + 1e-9
    else:
        assert imbalance == 1.0


def test_balance_beats_round_robin_on_long_tail():
    rng = random.Random(0)
    lengths = [int(min(32_000, rng.lognormvariate(7.5, 1.2))) for _ in range(2048)]  # mean ~3.6k
    samples = [Sample(i, n) for i, n in enumerate(lengths)]
    _, balanced = balance_samples(samples, 64)
    _, rr = round_robin_samples(samples, 64)
    assert balanced < 1.01
    assert rr > 1.3
    with pytest.raises(ValueError, match="dp"):
        balance_samples(samples, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5_000), max_size=80), st.integers(1, 8), st.integers(1, 8))
def test_balance_aligned_keeps_groups_and_balance(lengths, src_dp, dp):
    samples = [Sample(i, n) for i, n in enumerate(lengths)]
    src, src_imb = balance_samples(samples, src_dp)
    assignment, imbalance = balance_aligned(samples, dp, src)
    assert len(assignment) == dp
    assert sorted(i for g in assignment for i in g) == list(range(len(samples)))
    loads = group_tokens(assignment, samples)
    assert imbalance == pytest.approx(max(loads) * dp / sum(lengths)) if sum(lengths) else imbalance == 1.0
    owner = {i: g for g, ids in enumerate(src) for i in ids}
    if src_dp % dp == 0:  # merging: source groups stay whole
        for g in range(src_dp):
            assert len({d for d, ids in enumerate(assignment) for i in ids if owner[i] == g}) <= 1
    elif dp % src_dp == 0:  # splitting: each destination group draws from one source group
        assert all(len({owner[i] for i in g}) <= 1 for g in assignment)
    elif sum(lengths):  # contiguous cut: within one sample of even
        assert max(loads) <= sum(lengths) / dp + max(lengths) + 1e-9


def test_aligned_placement_keeps_colocated_data_local():
    rng = random.Random(3)
    samples = [Sample(i, int(rng.lognormvariate(6, 1))) for i in range(256)]
    src_plan, dst_plan = ParallelPlan(tp=2, dp=8), ParallelPlan(tp=4, dp=4)
    src_a, _ = balance_samples(samples, src_plan.dp)
    dst_a, imbalance = balance_aligned(samples, dst_plan.dp, src_a)
    independent, _ = balance_samples(samples, dst_plan.dp)
    assert imbalance < 1.02
    aligned = LayoutAwareDispatcher().plan(Layout(src_plan, src_a), Layout(dst_plan, dst_a), samples)
    indep = LayoutAwareDispatcher().plan(Layout(src_plan, src_a), Layout(dst_plan, independent), samples)
    assert received_sets(aligned) == oracle(Layout(dst_plan, dst_a), samples)
    assert aligned.total_bytes < 0.75 * indep.total_bytes
    assert len(aligned.transfers) < len(indep.transfers)
