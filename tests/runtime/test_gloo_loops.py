"""gloo's event-loop threads under SCHED_BATCH (earl.runtime.gloo_loops): every loop of the
world group and of the groups the runtime makes later, on real gloo ranks; left alone under
`EARL_GLOO_LOOPS=default`; a bad value named with the valid ones. What it buys is measured by
benchmarks/bench_gloo_loops.py, not here.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_gloo_loops.py
"""

from __future__ import annotations

import os

import pytest

from earl.runtime.dist import run_local
from earl.runtime.gloo_loops import ENV, batch_gloo_loops, loop_policy, loop_threads

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
        assert set(later) == {os.SCHED_BATCH}


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
    with pytest.raises(ValueError, match="fifo"):
        batch_gloo_loops()


def test_no_loop_threads_means_nothing_changes(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    import earl.runtime.gloo_loops as gl

    monkeypatch.setattr(gl, "loop_threads", lambda: [])
    assert batch_gloo_loops() == 0
