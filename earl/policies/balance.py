"""Token-balanced placement of samples on data-parallel groups.

Agentic rollouts are long-tailed: a few episodes run many turns and hold most of the tokens.
Placing samples round-robin balances sample counts, not work, so the dp group that draws the
long episodes sets the step time. `balance_samples` places samples largest-first on the
currently lightest group (LPT greedy; within 4/3 of optimal, usually within a few percent on
thousands of samples) and reports the imbalance ratio max/mean of tokens per group.

    python -c "from earl.policies import balance_samples, Sample; \
print(balance_samples([Sample(i, t) for i, t in enumerate([900, 10, 10, 500, 400])], 2))"
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from earl.policies.types import Sample

Assignment = tuple[tuple[int, ...], ...]


def _check(samples: Sequence[Sample], dp: int) -> None:
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
        raise ValueError(f"dp must be a positive int, got {dp!r}")
    seen: set[int] = set()
    for s in samples:
        if s.tokens < 0:
            raise ValueError(f"sample {s.id} has a negative token count {s.tokens}")
        if s.id in seen:
            raise ValueError(f"sample id {s.id} appears twice")
        seen.add(s.id)


def imbalance_ratio(loads: Sequence[float]) -> float:
    """max / mean of per-group loads (1.0 is perfect; 1.0 for an empty batch)."""
    total = sum(loads)
    if not loads or total <= 0:
        return 1.0
    return max(loads) * len(loads) / total


def group_tokens(assignment: Assignment, samples: Sequence[Sample]) -> list[int]:
    """Tokens held by each dp group of an assignment."""
    tokens = {s.id: s.tokens for s in samples}
    return [sum(tokens[i] for i in ids) for ids in assignment]


def balance_samples(samples: Sequence[Sample], dp: int) -> tuple[Assignment, float]:
    """Place samples on `dp` groups so tokens are balanced (largest first onto the lightest
    group; ties go to the group with fewer samples, then the lower index).
    Returns (assignment, imbalance) with assignment[d] the sample ids of group d."""
    _check(samples, dp)
    order = sorted(samples, key=lambda s: (-s.tokens, s.id))
    groups: list[list[int]] = [[] for _ in range(dp)]
    heap = [(0, 0, d) for d in range(dp)]  # (tokens, samples, group), already a heap
    loads = [0] * dp
    for s in order:
        load, count, d = heap[0]
        groups[d].append(s.id)
        loads[d] = load + s.tokens
        heapq.heapreplace(heap, (loads[d], count + 1, d))
    return tuple(tuple(g) for g in groups), imbalance_ratio(loads)


def round_robin_samples(samples: Sequence[Sample], dp: int) -> tuple[Assignment, float]:
    """The baseline: sample i goes to group i mod dp, whatever its length."""
    _check(samples, dp)
    groups: list[list[int]] = [[] for _ in range(dp)]
    loads = [0] * dp
    for i, s in enumerate(samples):
        groups[i % dp].append(s.id)
        loads[i % dp] += s.tokens
    return tuple(tuple(g) for g in groups), imbalance_ratio(loads)
