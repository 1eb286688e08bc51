"""The dispatch executor with and without its start barrier, measured side by side: until
2026-12-06 `execute_dispatch` lined its ranks up with a barrier before moving anything
("barrier", `start_barrier=True`); now an early rank waits in its first receives ("none"). On
the runtime's training dispatch (no statistics reduction, earl.calibrate.dispatchfit.runtime_plans,
both dispatchers) at 2 and 4 gloo processes.

Each call is timed as `earl validate` reads a dispatch in a run's trace (from the last rank's
start to the last rank's end) and as `earl calibrate` does (the slowest rank's wall after a
barrier). Before each call every rank works 0-2 ms (seeded per rank: arrival skew, as after a
training step's compute), then enters the executor (in the "barrier" variant its start barrier
lines the ranks up first). The
two variants alternate call by call in the same process group; `--rounds` repeats it all
with fresh groups. Printed per case: median and p25-p75 (ms), the spread (p75 - p25) / median,
the share of calls over 1.5 x the median (a slow mode), and none / barrier of the medians.

    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch_barrier.py
    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch_barrier.py --procs 2 --contexts 256 --repeats 60 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

VARIANTS = ("barrier", "none")
KINDS = ("layout-aware", "centralized")


def worker(cases, repeats, kinds=KINDS):
    """Runs on every gloo rank: {(per_rank, context, dispatcher): {variant: [(start, end) per
    call]}} of every rank (rank 0 returns them all)."""
    import torch.distributed as dist

    from earl.calibrate.dispatchfit import _store, layouts, runtime_plans, sample_reward
    from earl.calibrate.timing import busy_wait
    from earl.runtime.move_samples import execute_dispatch

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    out = {}
    for per_rank, ctx in cases:
        samples, src, dst = layouts(world, per_rank, ctx)
        store = _store(samples, src, rank)
        rewards = {x.id: sample_reward(x.id) for x in samples}
        tplans = runtime_plans(world, per_rank, ctx)
        for kind in kinds:
            tplan = tplans[kind]
            calls = {v: [] for v in VARIANTS}
            for rep in range(repeats + 2):  # the first two warm connections and allocators
                for v in VARIANTS:
                    dist.barrier()
                    busy_wait(rng.random() * 2e-3)
                    t0 = time.perf_counter()
                    execute_dispatch(tplan, store, samples, src, dst, rewards=rewards, start_barrier=v == "barrier",
                                     check=rep == 0)
                    if rep >= 2:
                        calls[v].append((t0, time.perf_counter()))
            out[(per_rank, ctx, kind)] = calls
    every = [None] * world
    dist.all_gather_object(every, out)
    return every if rank == 0 else None


def _quantiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    from earl.runtime.dist import run_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 2048, 16384])
    ap.add_argument("--dispatchers", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--per-rank", type=int, default=4, help="samples each process produced")
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per variant, case and round")
    ap.add_argument("--rounds", type=int, default=2, help="fresh process groups")
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 4 or min(args.procs) < 2:
        ap.error(f"--rounds >= 1, --repeats >= 4 and --procs >= 2 each; got {args.rounds}, {args.repeats}, "
                 f"{args.procs}")
    print(f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"{args.per_rank} samples per process, {args.repeats} calls per variant x {args.rounds} rounds")
    cases = [(args.per_rank, c) for c in args.contexts]
    keys = [(p, c, k) for p, c in cases for k in args.dispatchers]
    got: dict[int, list] = {n: [] for n in args.procs}  # per process count: each round's
    for r in range(args.rounds):
        for n in args.procs:
            got[n].append(run_local(worker, n, cases, args.repeats, tuple(args.dispatchers), timeout_s=600)[0])
        print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    head = (f"{'procs':>5} {'context':>7} {'dispatcher':>12} {'start':>7} | {'as validate reads: median':>25} "
            f"{'p25-p75':>13} {'spread':>6} {'>1.5x':>5} | {'slowest rank: median':>20} {'p25-p75':>13} | "
            f"{'none/barrier':>12}")
    print(head)
    print("-" * len(head))
    for n in args.procs:
        for case in keys:
            med = {}
            for t in VARIANTS:
                read, slowest = [], []
                for every in got[n]:
                    per_rank = [e[case][t] for e in every]
                    for k in range(len(per_rank[0])):
                        starts = [c[k][0] for c in per_rank]
                        ends = [c[k][1] for c in per_rank]
                        read.append(max(ends) - max(starts))
                        slowest.append(max(b - a for a, b in zip(starts, ends, strict=True)))
                lo, m, hi = _quantiles(read)
                slo, sm, shi = _quantiles(slowest)
                med[t] = (m, sm)
                slow = sum(x > 1.5 * m for x in read) / len(read)
                ratio = (f"{med['none'][0] / med['barrier'][0]:.2f} / {med['none'][1] / med['barrier'][1]:.2f}"
                         if t == "none" else "")
                print(f"{n:>5} {case[1]:>7} {case[2]:>12} {t:>7} | {m * 1e3:>25.3f} {lo * 1e3:>6.3f}-{hi * 1e3:<6.3f} "
                      f"{(hi - lo) / m:>6.2f} {slow:>5.0%} | {sm * 1e3:>20.3f} {slo * 1e3:>6.3f}-{shi * 1e3:<6.3f} | "
                      f"{ratio:>12}")
    print(f"load average {os.getloadavg()[0]:.2f} at end; none/barrier: of the medians, as validate reads / "
          "slowest rank (whose wall holds the arrival skew without the barrier)")


if __name__ == "__main__":
    main()
