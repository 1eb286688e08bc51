"""gloo's TCP event-loop threads under SCHED_BATCH, so that a loop thread waking on incoming
data never preempts its own rank's thread in the middle of posting a send or a receive.

Why: each gloo process group runs one event-loop thread (`gloo_tcp_loop`). On a message it
*try*-locks the peer's pair (gloo/transport/tcp/pair.cc, `Pair::handleEvents`) and, if the
lock is held, returns to a level-triggered `epoll_wait` that fires again at once: it spins. The
lock's holder is the rank's own thread, posting an `isend`/`irecv`. Under CFS a loop thread
that wakes after sleeping preempts the running thread of its core at once (wakeup preemption),
and when that thread is the lock's holder the loop spins until the next scheduler tick (4 ms at
`CONFIG_HZ=250`) hands the core back. On a host whose ranks share cores (2 ranks on 2 vCPUs, 4 on
2) this is the slow mode of the runtime's millisecond-scale exchanges (docs/fidelity.md,
seventeenth and thirty-fourth sessions). SCHED_BATCH keeps the thread's share of the CPU (nice 0,
unlike a lower priority, which starves the loop behind other ranks' compute and slowed FSDP2
training) and only turns off wakeup preemption for it. Any user may set it; nothing changes
where the policy is unavailable (not Linux) or where no gloo group exists (NCCL only).

`EARL_GLOO_LOOPS=default` leaves the threads as they are (A/B benchmarks:
benchmarks/bench_gloo_loops.py).

    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py
"""

from __future__ import annotations

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


def batch_gloo_loops() -> int:
    """Put every gloo event-loop thread of this process under SCHED_BATCH (call after creating
    process groups: each gloo group starts its own loop). Idempotent; returns how many threads
    it changed (0 under `EARL_GLOO_LOOPS=default`, or where the policy does not exist)."""
    if loop_policy() == "default" or not hasattr(os, "sched_setscheduler"):
        return 0
    changed = 0
    for tid in loop_threads():
        try:
            if os.sched_getscheduler(tid) != os.SCHED_BATCH:
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                changed += 1
        except OSError:  # ended meanwhile, or a sandbox that forbids it: leave it as it is
            continue
    return changed
