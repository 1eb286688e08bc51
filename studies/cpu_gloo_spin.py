"""gloo's loop-thread spin on a host whose ranks share cores, and the scheduling policies that
stop it (earl.runtime.gloo_loops). Fresh gloo ranks exchange 12 KB each way with every peer
(irecv, isend, wait: the runtime dispatch's pattern) between a few ms of compute, as a runtime
step's dispatch sits between its log-prob passes and its training step; each policy in a fresh
set of ranks, the policies alternating round after round. Prints rank 0's exchange times and
the share of exchanges slower than 2 ms (a spin lasts until the scheduler's next tick, 4 ms at
CONFIG_HZ=250).

    OMP_NUM_THREADS=1 python studies/cpu_gloo_spin.py
    OMP_NUM_THREADS=1 python studies/cpu_gloo_spin.py --nproc 4 --calls 150 --policies default,batch

Policies (for the `gloo_tcp_loop` threads only): default (the kernel's), batch (SCHED_BATCH: no
wakeup preemption, the runtime's), idle (SCHED_IDLE), nice (nice 19). The ranks start as the
runtime's do (`EARL_GLOO_LOOPS` unset: the group's worker threads under SCHED_BATCH too; point-
to-point sends and receives do not use them). 2026-12-06 23:37 UTC, idle Xeon, `--calls 60
--rounds 1`: over 2 ms default 23 of 60, batch 3, idle 10, nice 32.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

POLICIES = ("default", "batch", "idle", "nice")
BYTES = 12_000  # about what a rank of the tiny model's 2-rank training dispatch sends a peer


def _busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def _apply(policy: str) -> None:
    from earl.runtime.gloo_loops import loop_threads

    for tid in loop_threads():
        if policy == "batch":
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        elif policy == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        elif policy == "nice":
            os.setpriority(os.PRIO_PROCESS, tid, 19)
        else:  # the kernel's default, whatever the runtime set
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def _exchanges(policy: str, calls: int) -> list[float]:
    import torch
    import torch.distributed as dist

    _apply(policy)
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    out = torch.randint(0, 255, (BYTES,), dtype=torch.uint8)
    times = []
    for _ in range(calls + 5):  # 5 warm-up calls
        _busy(0.003 + rng.random() * 0.0005)  # the log-prob pass, ranks arriving up to 0.5 ms apart
        t0 = time.perf_counter()
        bufs = {p: torch.empty(BYTES, dtype=torch.uint8) for p in range(world) if p != rank}
        works = [dist.irecv(b, src=p) for p, b in bufs.items()]
        works += [dist.isend(out, dst=p) for p in bufs]
        for w in works:
            w.wait()
        times.append(time.perf_counter() - t0)
        _busy(0.005)  # the training step's first work
    return times[5:]


def main(argv=None) -> None:
    from earl.runtime.dist import run_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policies", default="default,batch,idle,nice", help=f"comma-separated: {', '.join(POLICIES)}")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    bad = [p for p in policies if p not in POLICIES]
    if bad or args.nproc < 2 or args.calls < 1 or args.rounds < 1:
        ap.error(f"--policies {args.policies!r} (valid: {', '.join(POLICIES)}), --nproc >= 2 "
                 f"({args.nproc}), --calls and --rounds >= 1")
    if not hasattr(os, "SCHED_BATCH"):
        sys.exit("needs Linux scheduling policies")
    print(f"{args.nproc} gloo ranks on {os.cpu_count()} CPUs, {BYTES} B each way with every peer, "
          f"{args.calls} exchanges per policy and round")
    for r in range(args.rounds):
        for policy in (policies if r % 2 == 0 else policies[::-1]):
            t = sorted(run_local(_exchanges, args.nproc, policy, args.calls, timeout_s=600)[0])
            n = len(t)
            slow = sum(x > 0.002 for x in t)
            print(f"round {r + 1} {policy:8s} median {statistics.median(t) * 1e3:5.2f} ms  p25 {t[n // 4] * 1e3:5.2f}"
                  f"  p75 {t[3 * n // 4] * 1e3:5.2f}  p90 {t[9 * n // 10] * 1e3:5.2f}  > 2 ms: {slow}/{n}", flush=True)


if __name__ == "__main__":
    main()
