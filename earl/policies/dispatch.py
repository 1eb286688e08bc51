"""Data dispatchers: who sends which intermediate tensors to whom between experience
preparation (the `src` layout) and training (the `dst` layout).

Both dispatchers deliver exactly the same bytes to every rank; they differ in the path:
`centralized` (verl's and ROLL's single controller) gathers everything to one rank and scatters
it; `layout-aware` sends each consumer its share straight from a producer, with only metadata
through the controller and advantages normalised in place. A `TransferPlan` is a pure list of
phases and transfers, executed by the runtime and priced by the cost model. What each rank
needs under tp / cp / pp, and the exactly-once checks: docs/policies.md, "Design notes".

    python -c "from earl.policies import make_dispatcher, Layout, Sample; from earl.specs import \
ParallelPlan as P; s=[Sample(i, 100) for i in range(4)]; \
print(make_dispatcher('layout-aware').plan(Layout(P(dp=2), ((0, 1), (2, 3))), \
Layout(P(tp=2), ((0, 1, 2, 3),)), s).total_bytes)"
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections import defaultdict
from collections.abc import Iterator, Sequence

from earl.parallel import rank_of, serving_peer
from earl.policies.types import (
    TENSOR_BYTES_PER_SAMPLE,
    TENSOR_BYTES_PER_TOKEN,
    Layout,
    Sample,
    Transfer,
    TransferPlan,
)

# Tensors the experience stage produces per token; advantages are derived from the rewards.
PRODUCED_TENSORS: tuple[str, ...] = ("input_ids", "loss_mask", "old_logprobs", "ref_logprobs")
CONSUMED_TENSORS: tuple[str, ...] = tuple(TENSOR_BYTES_PER_TOKEN)  # the above + advantages
FIRST_STAGE_TENSORS: tuple[str, ...] = ("input_ids",)
METADATA_BYTES_PER_SAMPLE = 32  # id, tokens, group, destination group (4 x int64)
STAT_BYTES_PER_GROUP = 24  # sum, sum of squares, count (3 x fp64) per advantage group

Ranges = tuple[tuple[int, int], ...]
Received = dict[int, dict[tuple[int, str], Ranges]]


def cp_token_range(tokens: int, cp: int, index: int) -> tuple[int, int]:
    """The contiguous token range [start, stop) of a `tokens`-long sample held by cp rank
    `index` of `cp` (shares differ by at most one token; empty when tokens < cp)."""
    return tokens * index // cp, tokens * (index + 1) // cp


def consumer_tensors(pp: int, pp_index: int) -> tuple[str, ...]:
    """Tensors a training rank at pipeline stage `pp_index` of `pp` needs."""
    if pp_index == pp - 1:
        return CONSUMED_TENSORS
    if pp_index == 0:
        return FIRST_STAGE_TENSORS
    return ()


@functools.lru_cache(maxsize=64)
def _bytes_per_token(tensors: tuple[str, ...]) -> int:
    return sum(TENSOR_BYTES_PER_TOKEN[t] for t in tensors)


def check_layouts(src: Layout, dst: Layout, samples: Sequence[Sample]) -> dict[int, int]:
    """Validate that both layouts place each sample exactly once; return {id: tokens}."""
    tokens = {s.id: s.tokens for s in samples}
    if len(tokens) != len(samples) or (tokens and min(tokens.values()) < 0):
        tokens = {}  # name the first bad sample, in batch order
        for s in samples:
            if s.id in tokens:
                raise ValueError(f"sample id {s.id} appears twice in the batch")
            if s.tokens < 0:
                raise ValueError(f"sample {s.id} has a negative token count {s.tokens}")
            tokens[s.id] = s.tokens
    for name, layout in (("src", src), ("dst", dst)):
        placed = [i for ids in layout.assignment for i in ids]
        if len(placed) != len(tokens) or set(placed) != tokens.keys():
            missing = sorted(tokens.keys() - set(placed))[:5]
            extra = sorted(set(placed) - tokens.keys())[:5]
            raise ValueError(f"{name} layout must place each of the {len(tokens)} samples exactly "
                             f"once; placed {len(placed)} (missing e.g. {missing}, unknown e.g. "
                             f"{extra})")
    return tokens


def cp_share(ids: Sequence[int], tokens: dict[int, int], cp: int, index: int
             ) -> tuple[list[int], list[tuple[int, int]], int]:
    """(sample ids, token ranges, tokens) of cp share `index` of `cp` of the samples `ids`:
    those with at least one token in it, in order (cp 1: every non-empty sample, whole)."""
    if cp == 1:
        lens = [tokens[i] for i in ids]
        if lens and min(lens) > 0:
            return list(ids), [(0, n) for n in lens], sum(lens)
    kept, ranges, ntok = [], [], 0
    for i in ids:
        a, b = cp_token_range(tokens[i], cp, index)
        if b > a:
            kept.append(i)
            ranges.append((a, b))
            ntok += b - a
    return kept, ranges, ntok


def iter_shares(dst: Layout, tokens: dict[int, int]
                ) -> Iterator[tuple[int, int, list[int], list[tuple[int, int]], int]]:
    """Yield (dp group, cp index, sample ids, token ranges, tokens) of every non-empty cp share."""
    cp = dst.plan.cp
    for d, ids in enumerate(dst.assignment):
        for c in range(cp):
            kept, ranges, ntok = cp_share(ids, tokens, cp, c)
            if kept:
                yield d, c, kept, ranges, ntok


def share_ranks(dst: Layout, d: int, c: int) -> Iterator[tuple[int, tuple[str, ...]]]:
    """Yield (rank, tensors) of the dst ranks holding cp share `c` of dp group `d`."""
    plan = dst.plan
    for p in range(plan.pp):
        tensors = consumer_tensors(plan.pp, p)
        if tensors:
            first = rank_of(plan, dp=d, pp=p, cp=c, base_rank=dst.base_rank)
            for t in range(plan.tp):
                yield first + t, tensors


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while building ~1e5 small acyclic objects (a plan
    for 1,024 ranks); its generation-0 passes otherwise cost ~20% of the planning time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _transfer(src: int, dst: int, ids: list[int], ranges: list[tuple[int, int]],
              tensors: tuple[str, ...], ntok: int) -> Transfer:
    return Transfer(src=src, dst=dst, sample_ids=tuple(ids), tensors=tensors,
                    bytes=ntok * _bytes_per_token(tensors), token_ranges=tuple(ranges))


def _producer_first_rank(src: Layout, group: int, cp_index: int) -> int:
    """The tp-0 rank of the last pipeline stage holding cp share `cp_index` of dp `group`."""
    p = src.plan
    return rank_of(p, dp=group, pp=p.pp - 1, cp=cp_index, base_rank=src.base_rank)


class Dispatcher:
    """`plan(src, dst, samples) -> TransferPlan`; subclasses implement `_plan`."""

    name = ""

    def __init__(self, controller: int | None = None):
        self.controller = controller  # None: the src layout's first rank

    def plan(self, src: Layout, dst: Layout, samples: Sequence[Sample]) -> TransferPlan:
        with paused_gc():
            return self._plan(src, dst, samples)

    def _plan(self, src: Layout, dst: Layout, samples: Sequence[Sample]) -> TransferPlan:
        raise NotImplementedError


class CentralizedDispatcher(Dispatcher):
    """Gather everything to the controller, then scatter (verl / ROLL single controller)."""

    name = "centralized"

    def _plan(self, src: Layout, dst: Layout, samples: Sequence[Sample]) -> TransferPlan:
        tokens = check_layouts(src, dst, samples)
        ctrl = src.base_rank if self.controller is None else self.controller
        gather: list[Transfer] = []
        reward_bytes = sum(TENSOR_BYTES_PER_SAMPLE.values())
        for g, ids in enumerate(src.assignment):
            if not ids:
                continue
            for c in range(src.plan.cp):
                kept, ranges, ntok = cp_share(ids, tokens, src.plan.cp, c)
                producer = _producer_first_rank(src, g, c)
                if kept:
                    gather.append(_transfer(producer, ctrl, kept, ranges, PRODUCED_TENSORS, ntok))
                if c == 0:
                    gather.append(Transfer(src=producer, dst=ctrl, sample_ids=tuple(ids),
                                           tensors=tuple(TENSOR_BYTES_PER_SAMPLE),
                                           bytes=reward_bytes * len(ids)))
        scatter = []
        for d, c, ids, ranges, ntok in iter_shares(dst, tokens):
            ids_t, ranges_t = tuple(ids), tuple(ranges)
            for rank, tensors in share_ranks(dst, d, c):
                scatter.append(Transfer(src=ctrl, dst=rank, sample_ids=ids_t, tensors=tensors,
                                        bytes=ntok * _bytes_per_token(tensors), token_ranges=ranges_t))
        return TransferPlan(kind=self.name, controller=ctrl, phases=[gather, scatter],
                            metadata_bytes=METADATA_BYTES_PER_SAMPLE * len(tokens))


class LayoutAwareDispatcher(Dispatcher):
    """Producers send each consumer rank exactly its share; metadata only via the controller."""

    name = "layout-aware"

    def _plan(self, src: Layout, dst: Layout, samples: Sequence[Sample]) -> TransferPlan:
        tokens = check_layouts(src, dst, samples)
        ctrl = src.base_rank if self.controller is None else self.controller
        sp = src.plan
        owner = {i: g for g, ids in enumerate(src.assignment) for i in ids}
        if sp.cp == 1:  # a sample is one piece, held by its group's producer: look that up once
            first_of = [_producer_first_rank(src, g, 0) for g in range(sp.dp)]
            owner = {i: first_of[g] for i, g in owner.items()}
        transfers: list[Transfer] = []
        for d, c, ids, ranges, _ in iter_shares(dst, tokens):
            # Group the share by the producer (its tp-0 rank) holding each piece of it.
            by_producer: dict[int, tuple[list[int], list[tuple[int, int]]]] = {}
            for i, (a, b) in zip(ids, ranges, strict=True):
                pieces = ((owner[i], a, b),) if sp.cp == 1 else _source_pieces(src, owner[i], tokens[i], a, b)
                for first, lo, hi in pieces:
                    entry = by_producer.get(first)
                    if entry is None:
                        entry = by_producer[first] = ([], [])
                    entry[0].append(i)
                    entry[1].append((lo, hi))
            groups = [(first, tuple(g_ids), tuple(g_ranges), sum(b - a for a, b in g_ranges))
                      for first, (g_ids, g_ranges) in by_producer.items()]
            for rank, tensors in share_ranks(dst, d, c):
                bpt = _bytes_per_token(tensors)
                for first, g_ids, g_ranges, ntok in groups:
                    # Any tp peer of the producer holds the share: take the consumer itself when
                    # it is one (a local copy), else spread consumers over the peers.
                    s = serving_peer(first, sp.tp, rank)
                    transfers.append(Transfer(s, rank, g_ids, tensors, ntok * bpt, g_ranges))
        groups = len({s.group for s in samples})
        return TransferPlan(kind=self.name, controller=ctrl, phases=[transfers],
                            metadata_bytes=METADATA_BYTES_PER_SAMPLE * len(tokens),
                            reduce_bytes=STAT_BYTES_PER_GROUP * groups)


def _source_pieces(src: Layout, group: int, n: int, a: int, b: int) -> list[tuple[int, int, int]]:
    """Split tokens [a, b) of an `n`-token sample of src dp `group` by the src cp shares holding
    them: [(producer tp-0 rank, start, stop)]."""
    cp = src.plan.cp
    if cp == 1:
        return [(_producer_first_rank(src, group, 0), a, b)]
    out = []
    for c in range(cp * a // n, cp):  # share cp*a//n starts at or before token a
        ca, cb = cp_token_range(n, cp, c)
        lo, hi = max(a, ca), min(b, cb)
        if lo < hi:
            out.append((_producer_first_rank(src, group, c), lo, hi))
        if cb >= b:
            break
    return out


# --------------------------------------------------------------------------------------------
# Delivery accounting: what each rank gets and what it needs, in one comparable form
# --------------------------------------------------------------------------------------------
def _merge(ranges: list[tuple[int, int]], rank: int, key: tuple[int, str]) -> Ranges:
    ranges.sort()
    out: list[list[int]] = []
    for a, b in ranges:
        if out and a < out[-1][1]:
            raise ValueError(f"rank {rank} receives tokens {a}..{b} of sample {key[0]}'s "
                             f"{key[1]} twice (already has ..{out[-1][1]})")
        if out and a == out[-1][1]:
            out[-1][1] = b
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def received_sets(tplan: TransferPlan) -> Received:
    """Per destination rank: {(sample id, tensor): merged token ranges} delivered by the
    plan's final phase. Per-sample scalars are recorded as the range (0, 1).
    Raises ValueError when any token of any tensor reaches a rank twice."""
    raw: dict[int, dict[tuple[int, str], list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    final = tplan.phases[-1] if tplan.phases else []
    for t in final:
        ranges = t.token_ranges or ((0, 1),) * len(t.sample_ids)
        per_rank = raw[t.dst]
        for i, r in zip(t.sample_ids, ranges, strict=True):
            for name in t.tensors:
                per_rank[(i, name)].append(r)
    return {rank: {k: _merge(v, rank, k) for k, v in per.items()} for rank, per in raw.items()}


def required_sets(dst: Layout, samples: Sequence[Sample]) -> Received:
    """Per rank of the dst layout: {(sample id, tensor): token ranges} it needs."""
    tokens = {s.id: s.tokens for s in samples}
    out: Received = {}
    for d, c, ids, ranges, _ in iter_shares(dst, tokens):
        for rank, tensors in share_ranks(dst, d, c):
            out[rank] = {(i, name): (r,) for i, r in zip(ids, ranges, strict=True) for name in tensors}
    return out


def rank_traffic(tplan: TransferPlan) -> dict[int, tuple[int, int]]:
    """Per rank: (bytes sent, bytes received) to/from other ranks, all phases."""
    sent: dict[int, int] = defaultdict(int)
    recv: dict[int, int] = defaultdict(int)
    for t in tplan.transfers:
        if t.src != t.dst:
            sent[t.src] += t.bytes
            recv[t.dst] += t.bytes
    return {r: (sent[r], recv[r]) for r in sorted(sent.keys() | recv.keys())}
