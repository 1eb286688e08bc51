"""The vectorised LPT (`balance_tokens`, used by `balance_samples`) places every sample where
the one-at-a-time heap does, ties and zero-token samples included.

    python -m pytest tests/policies/test_balance_tokens.py -q
"""

import heapq
import random

from earl.policies import Sample, balance_samples


def heap_lpt(samples, dp):
    order = sorted(samples, key=lambda s: (-s.tokens, s.id))
    groups = [[] for _ in range(dp)]
    heap = [(0, 0, d) for d in range(dp)]
    for s in order:
        load, count, d = heap[0]
        groups[d].append(s.id)
        heapq.heapreplace(heap, (load + s.tokens, count + 1, d))
    return tuple(tuple(g) for g in groups)


def test_balance_samples_equals_the_heap_lpt():
    rng = random.Random(0)
    for _ in range(800):
        n, dp = rng.randint(0, 200), rng.randint(1, 40)
        tied = rng.random() < 0.3
        toks = [rng.choice([0, 5, 10, 10, 20]) if tied else int(rng.lognormvariate(5, 1.5))
                for _ in range(n)]
        samples = [Sample(i, t) for i, t in zip(rng.sample(range(10 * n + 1), n), toks, strict=True)]
        assert balance_samples(samples, dp)[0] == heap_lpt(samples, dp)


def test_many_equal_samples_finish_on_the_heap():
    samples = [Sample(i, 7) for i in range(5000)]
    assert balance_samples(samples, 300)[0] == heap_lpt(samples, 300)
