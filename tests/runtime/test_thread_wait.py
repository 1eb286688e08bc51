"""`earl.runtime.worker.thread_wait_s`: the seconds a thread waited for a core, as a span records
them (`args.wait_s`): a busy loop that shares its only core with another busy process waits
about as long as it runs; alone on a core it hardly waits."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from earl.runtime.worker import kernel_usage, thread_wait_s

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat")
                                or not hasattr(os, "sched_setaffinity"),
                                reason="needs Linux's per-thread schedstat and CPU affinity")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _busy(cpu: int, seconds: float) -> None:
    os.sched_setaffinity(0, {cpu})
    _spin(seconds)


def _cpu_time_of_busy_loop(seconds: float) -> tuple[float, float, float]:
    """(wall, this thread's CPU, its run-queue wait) over a busy loop of `seconds` wall."""
    w0, c0, q0 = time.perf_counter(), time.thread_time(), thread_wait_s()
    _spin(seconds)
    return time.perf_counter() - w0, time.thread_time() - c0, thread_wait_s() - q0


def test_a_thread_sharing_its_core_with_a_busy_process_waits_for_it():
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        assert thread_wait_s() >= 0
        ctx = mp.get_context("spawn")
        peer = ctx.Process(target=_busy, args=(cpu, 3.0))
        peer.start()
        try:
            time.sleep(0.5)  # the peer spinning on the same core
            wall, ran, waited = _cpu_time_of_busy_loop(0.6)
        finally:
            peer.terminate()
            peer.join()
        # two busy tasks on one core: each runs about half the time and waits the other half
        assert ran + waited == pytest.approx(wall, rel=0.15)
        assert waited > 0.25 * wall
        _, _, alone = _cpu_time_of_busy_loop(0.2)
        assert alone < waited / 2  # (other work on the host may take a little of the core)
        # a forked child reads its own thread, not the parent's it was forked from
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, repr(thread_wait_s()).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        os.close(w)
        assert float(os.read(r, 64)) < waited / 2 < thread_wait_s()
        os.close(r)
    finally:
        os.sched_setaffinity(0, before)


def test_kernel_usage_counts_the_faults_of_freshly_touched_memory():
    """`kernel_usage` (a span's `sys_s` and `minflt`): writing one byte in every page of 64 MiB
    just mapped faults each page in (at least one fault per 2 MiB huge page), the kernel's work,
    system time; reading the counters again without touching anything adds next to none."""
    import numpy as np

    sys0, flt0 = kernel_usage()
    fresh = np.empty(64 << 20, np.uint8)  # large: mapped, not yet backed by pages
    fresh[::4096] = 1
    sys1, flt1 = kernel_usage()
    assert flt1 - flt0 >= 32 and sys1 >= sys0
    sys2, flt2 = kernel_usage()
    assert flt2 - flt1 < 32 and sys2 >= sys1
    del fresh
