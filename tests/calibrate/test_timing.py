"""Interleaved host timing (earl.calibrate.timing.time_host_interleaved): every round times
each call once, the order rotated by one per round, and each call gets its own median.

    OMP_NUM_THREADS=1 python -m pytest -q tests/calibrate/test_timing.py
"""

from __future__ import annotations

import pytest
import torch

from earl.calibrate.timing import time_host_interleaved


def test_calls_are_timed_round_robin_with_a_rotating_order():
    order: list[int] = []
    fns = [lambda i=i: order.append(i) for i in range(3)]
    got = time_host_interleaved(fns, device=torch.device("cpu"), warmup=1, reps=3)
    assert order == [0, 1, 2] + [0, 1, 2] + [1, 2, 0] + [2, 0, 1]  # warm-up, then the rotated rounds
    assert [t.reps for t in got] == [3, 3, 3]


def test_each_call_keeps_its_own_median():
    def work(n: int) -> int:  # CPU work (the CPU clock does not count sleeping)
        return sum(i * i for i in range(n))

    light, heavy = time_host_interleaved([lambda: work(2_000), lambda: work(200_000)],
                                         device=torch.device("cpu"), warmup=1, reps=5)
    assert 0 < light.median_s < heavy.median_s
    assert heavy.median_s / light.median_s > 10


def test_no_calls_is_an_error():
    with pytest.raises(ValueError, match="at least one call"):
        time_host_interleaved([], device=torch.device("cpu"))
