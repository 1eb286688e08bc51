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


def _loop_waits_under_a_busy_core() -> tuple[float, float]:
    """(this rank's gloo loops' run-queue wait over 40 all-reduces with every thread of the
    process and a busy peer process on one core, the same without the peer)."""
    import signal
    import time

    import torch
    import torch.distributed as dist

    from earl.runtime.worker import loops_wait_s

    cpu = min(os.sched_getaffinity(0))
    for tid in [threading.get_native_id(), *loop_threads()]:
        os.sched_setaffinity(tid, {cpu})

    def reduces() -> float:
        dist.barrier()
        w0 = loops_wait_s()
        for _ in range(40):
            dist.all_reduce(torch.ones(256))
            time.sleep(0.001)  # the loop thread wakes while the peer holds the core
        return loops_wait_s() - w0

    alone = reduces()
    pid = os.fork()  # a busy peer on the same core (a rank is daemonic: no multiprocessing child)
    if pid == 0:
        end = time.perf_counter() + 20.0
        while time.perf_counter() < end:
            pass
        os._exit(0)
    try:
        time.sleep(0.3)
        shared = reduces()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return shared, alone


@pytest.mark.dist
@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux's per-thread schedstat")
def test_a_span_reads_its_gloo_loops_waits_for_a_core(monkeypatch):
    """`earl.runtime.worker.loops_wait_s` (a span's `loop_wait_s`): the loops, under SCHED_BATCH,
    wait for a core a busy process holds before they deliver a message; alone they hardly wait."""
    monkeypatch.delenv(ENV, raising=False)
    got = run_local(_loop_waits_under_a_busy_core, 2, timeout_s=120)
    assert all(shared >= 0 and alone >= 0 for shared, alone in got)
    assert sum(s for s, _ in got) > 0.01  # tens of ms over 40 rounds
    assert sum(s for s, _ in got) > 3 * sum(a for _, a in got)
