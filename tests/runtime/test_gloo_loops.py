"""gloo's event-loop threads under SCHED_BATCH (earl.runtime.gloo_loops): every loop of the
world group and of the groups the runtime makes later, on real gloo ranks; left alone under
`EARL_GLOO_LOOPS=default`; a bad value named with the valid ones. What it buys is measured by
benchmarks/bench_gloo_loops.py, not here.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_gloo_loops.py
"""

from __future__ import annotations

import os
import threading

import pytest

from earl.runtime.dist import run_local
from earl.runtime.gloo_loops import ENV, batched_threads, loop_policy, loop_threads

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="needs Linux scheduling policies")


def _policies_after_groups() -> tuple[list[int], list[int]]:
    from earl.parallel import build_mesh, build_plan_groups
    from earl.specs import ParallelPlan

    first = [os.sched_getscheduler(t) for t in loop_threads()]  # after init_distributed
    build_plan_groups(ParallelPlan(dp=1, tp=2))  # new gloo groups: new loop threads
    build_mesh(ParallelPlan(dp=1, tp=2))
    return first, [os.sched_getscheduler(t) for t in loop_threads()]


@pytest.mark.dist
def test_every_gloo_loop_runs_under_sched_batch_including_later_groups(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    for first, later in run_local(_policies_after_groups, 2, timeout_s=120):
        assert first and set(first) == {os.SCHED_BATCH}
        assert len(later) > len(first)  # the plan's groups started loops of their own
        assert set(later) == {os.SCHED_BATCH}, (first, later)


@pytest.mark.dist
def test_default_policy_leaves_the_loops_alone(monkeypatch):
    monkeypatch.setenv(ENV, "default")  # the fork inherits it
    for first, later in run_local(_policies_after_groups, 2, timeout_s=120):
        assert os.SCHED_BATCH not in set(first) | set(later)
        assert len(later) > len(first)


def test_a_bad_policy_is_named_with_the_valid_ones(monkeypatch):
    monkeypatch.setenv(ENV, "fifo")
    with pytest.raises(ValueError, match=r"EARL_GLOO_LOOPS='fifo' unknown; valid: batch, default"):
        loop_policy()
    with pytest.raises(ValueError, match="fifo"), batched_threads():
        pass


def _started_inside(backend: str = "gloo") -> tuple[int, int]:
    """(policy of a thread started inside batched_threads, the caller's policy after it)."""
    seen = []
    with batched_threads(backend):
        t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
        t.start()
        t.join()
    return seen[0], os.sched_getscheduler(0)


def test_threads_started_inside_inherit_sched_batch_and_the_caller_gets_its_policy_back(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    before = os.sched_getscheduler(0)
    assert _started_inside() == (os.SCHED_BATCH, before)
    assert _started_inside("nccl") == (before, before)  # another backend's threads are left alone
    monkeypatch.setenv(ENV, "default")
    assert _started_inside() == (before, before)
