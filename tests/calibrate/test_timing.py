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


def test_cpu_gemm_cases_rotate_past_the_last_level_cache():
    """A small GEMM's case rotates through enough distinct copies of its operands (> 128 MB in
    all) that the calls timed first run on weights evicted by the rest: the cold weights of a
    model larger than the cache. A large one needs few; none exceeds the 1 GB cap."""
    from earl.calibrate import bench

    gen = torch.Generator().manual_seed(0)
    for dims, at_least in (((1, 64, 128), 3800), ((4, 1536, 17920), 2)):
        case = bench.Case(kind="matmul", label="t", flops=2.0 * dims[0] * dims[1] * dims[2], bytes=0.0, dims=dims)
        fn, inputs, _ = bench._build(case, device=torch.device("cpu"), dtype=torch.float32, gen=gen)
        per_set = sum(t.numel() * t.element_size() for t in inputs[0])
        assert len(inputs) >= at_least and 128e6 <= len(inputs) * per_set <= 1e9 + per_set
        ptrs = {t.data_ptr() for pair in inputs[:40] for t in pair}
        assert len(ptrs) == 2 * min(40, len(inputs))  # distinct memory, not views of one tensor
        torch.testing.assert_close(fn(*inputs[0]), fn(*inputs[-1]))  # the same operands' values
