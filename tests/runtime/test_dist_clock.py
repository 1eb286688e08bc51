"""One timeline for every rank (earl.runtime.dist.aligned_origin): ranks on one host take rank
0's perf_counter origin itself, however late each reaches the call.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_clock.py
"""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from earl.runtime.dist import aligned_origin, run_local


def _origin_after(delays: list[float], offset: float) -> tuple[float, float]:
    time.sleep(delays[dist.get_rank()])  # ranks arrive apart, as after uneven start-up work
    origin = aligned_origin(offset)
    return origin, time.perf_counter()


@pytest.mark.dist
def test_ranks_on_one_host_share_rank0s_origin():
    (o0, now0), (o1, now1) = run_local(_origin_after, 2, [0.0, 0.3], 5.0, timeout_s=60)
    assert o0 == o1  # exactly: one host, one monotonic clock
    # rank 0's offset is honoured: its origin sits 5 s before its own call
    assert now0 - o0 > 5.0 and now1 - o1 > 5.3 - 0.05


def test_one_process_origin_is_now_minus_offset():
    before = time.perf_counter()
    assert before - 2.0 <= aligned_origin(2.0) <= time.perf_counter() - 2.0
