"""gloo's TCP event-loop threads under SCHED_BATCH, so that a loop thread waking on incoming
data never preempts its own rank's thread in the middle of posting a send or a receive.

Why: each gloo process group runs one event-loop thread (`gloo_tcp_loop`). On a message it
*try*-locks the peer's pair (gloo/transport/tcp/pair.cc, `Pair::handleEvents`) and, if the
lock is held, returns to a level-triggered `epoll_wait` that fires again at once: it spins. The
lock's holder is the rank's own thread, posting an `isend`/`irecv`. Under CFS a loop thread
that wakes after sleeping preempts the running thread of its core at once (wakeup preemption),
and when that thread is the lock's holder the loop spins until the next scheduler tick (4 ms at
`CONFIG_HZ=250`) hands the core back. On a host whose ranks share cores (2 ranks on 2 vCPUs, 4 on
2) this is the slow mode of the runtime's millisecond-scale exchanges (docs/validate-history.md,
seventeenth and thirty-fourth sessions). SCHED_BATCH keeps the thread's share of the CPU (nice 0,
unlike a lower priority, which starves the loop behind other ranks' compute and slowed FSDP2
training) and only turns off wakeup preemption for it. Any user may set it; nothing changes
where the policy is unavailable (not Linux) or where no gloo group exists (NCCL only).

How: a thread inherits its creator's policy, so the group is made inside `batched_threads()`
(the calling thread under SCHED_BATCH for the call, restored after): the group's loop thread
and its two worker threads start under it. Setting the threads by name after the call raced with
the loop naming itself (a loop not yet scheduled on a loaded host kept its default name and
policy). `EARL_GLOO_LOOPS=default` leaves the threads as they are (A/B benchmarks:
benchmarks/bench_gloo_loops.py).

    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py
"""

from __future__ import annotations

import contextlib
import os

LOOP_THREAD = "gloo_tcp_loop"
ENV = "EARL_GLOO_LOOPS"
POLICIES = ("batch", "default")


def loop_policy() -> str:
    """The policy asked for by `EARL_GLOO_LOOPS` (batch unless set)."""
    policy = os.environ.get(ENV, "batch")
    if policy not in POLICIES:
        raise ValueError(f"{ENV}={policy!r} unknown; valid: {', '.join(POLICIES)}")
    return policy


def loop_threads() -> list[int]:
    """Thread ids of this process's gloo event loops (empty where /proc is absent)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    out = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == LOOP_THREAD:
                    out.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(out)


@contextlib.contextmanager
def batched_threads(backend: str = "gloo"):
    """Threads started inside the block (a gloo group's event loop and workers: make groups in
    it) start under SCHED_BATCH, inherited from the calling thread, whose own policy is restored
    on exit. Nothing changes for another `backend` (NCCL's threads are left as they are:
    unmeasured there), under `EARL_GLOO_LOOPS=default`, where the policy does not exist, or where
    the OS refuses it."""
    if backend != "gloo" or loop_policy() == "default" or not hasattr(os, "sched_setscheduler"):
        yield
        return
    try:
        old, param = os.sched_getscheduler(0), os.sched_getparam(0)  # 0: the calling thread
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, old, param)
