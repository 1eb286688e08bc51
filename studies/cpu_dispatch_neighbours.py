"""The dispatch executor's time on a CPU host as its neighbours change: what the ranks do once
they leave it. `earl calibrate` times the executor call after call, so a rank that is done waits
(sleeps) until its peers' next call; in `earl run` it goes on to its next stage's work. With
more ranks than cores those ranks take cores from the ones still moving, and the window
`earl validate` reads (the last rank's start to the last rank's end) grows.

Per process count, on the runtime's training dispatch of one step (16 episodes of 150-250
tokens dealt to the rollout ranks as `earl run` deals them, then `balance_samples`; the
layout-aware executor, no statistics reduction), three neighbours alternate call by call in
the same process group, each call after 0 to `--skew-ms` (1) ms of seeded per-rank work
(arrival skew):
  - "sleep":   the rank waits at the next call's barrier (what the calibration times);
  - "compute": the rank busy-loops `--after-ms` (the next stage's work, e.g. a rollout after
               the weight sync, before any collective);
  - "gather":  the rank enters an all-gather of 64 floats right away (FSDP2's first unit, the
               training step's start after the dispatch), then busy-loops.
Printed: each neighbour's median window and p25-p75 (ms), over "sleep"; and the executor's
price for the same plan with `--hardware` (control plane left out, as the calibration's points).

    OMP_NUM_THREADS=1 python studies/cpu_dispatch_neighbours.py --hardware cpu-measured
    OMP_NUM_THREADS=1 python studies/cpu_dispatch_neighbours.py --procs 4 --repeats 30 --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import time

NEIGHBOURS = ("sleep", "compute", "gather")
EPISODES = 16  # one step of `--set groups=4 --set group_size=4`, validate's multi-process runs


def step_layouts(world: int, seed: int = 0):
    """(samples, src, dst) of one training dispatch as `earl run` plans it: episodes dealt to
    the rollout ranks (earl.parallel.deal), then balanced over the training ranks."""
    from earl.calibrate.dispatchfit import plans
    from earl.parallel import deal
    from earl.policies.balance import balance_samples
    from earl.policies.types import Layout, Sample

    rng = random.Random(seed)
    samples = [Sample(id=i, tokens=150 + rng.randrange(100), group=i // 4) for i in range(EPISODES)]
    src_plan, dst_plan = plans(world)
    src = Layout(src_plan, tuple(tuple(b) for b in deal(EPISODES, src_plan.dp)))
    return samples, src, Layout(dst_plan, balance_samples(samples, dst_plan.dp)[0])


def step_plan(samples, src, dst):
    """The layout-aware plan between `step_layouts`' layouts, reducing no statistics (as the
    runtime's training dispatch runs it: every rank holds them from the metadata)."""
    from earl.policies import make_dispatcher

    return dataclasses.replace(make_dispatcher("layout-aware").plan(src, dst, samples), reduce_bytes=0)


def worker(repeats: int, after_s: float, skew_s: float = 1e-3):
    """Runs on every gloo rank: {neighbour: [(start, end) per call]} of every rank (rank 0)."""
    import torch
    import torch.distributed as dist

    from earl.calibrate.dispatchfit import _store, sample_reward
    from earl.calibrate.timing import busy_wait
    from earl.runtime.move_samples import execute_dispatch

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    samples, src, dst = step_layouts(world)
    store = _store(samples, src, rank)
    rewards = {x.id: sample_reward(x.id) for x in samples}
    tplan = step_plan(samples, src, dst)
    small = torch.zeros(64)
    parts = [torch.zeros(64) for _ in range(world)]
    calls = {v: [] for v in NEIGHBOURS}
    for rep in range(repeats + 2):  # the first two warm connections and allocators
        for v in NEIGHBOURS:
            dist.barrier()
            busy_wait(rng.random() * skew_s)
            t0 = time.perf_counter()
            execute_dispatch(tplan, store, samples, src, dst, rewards=rewards, check=rep == 0)
            t1 = time.perf_counter()
            if v == "gather":
                dist.all_gather(parts, small)
            if v != "sleep":
                busy_wait(after_s)
            if rep >= 2:
                calls[v].append((t0, t1))
    every = [None] * world
    dist.all_gather_object(every, calls)
    return every if rank == 0 else None


def main() -> None:
    from earl.calibrate.dispatchfit import local_cost_model
    from earl.cost_model.dispatch import price_transfer_plan
    from earl.cost_model.profile import load_profile
    from earl.runtime.dist import run_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per neighbour and round")
    ap.add_argument("--rounds", type=int, default=2, help="fresh process groups")
    ap.add_argument("--after-ms", type=float, default=20.0, help="the next stage's work after a call")
    ap.add_argument("--hardware", default="cpu-measured", help="profile that prices the plan")
    ap.add_argument("--skew-ms", type=float, default=1.0, help="each call after 0 to this much seeded per-rank work")
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 4 or min(args.procs) < 2 or args.after_ms < 0 or args.skew_ms < 0:
        ap.error(f"--rounds >= 1, --repeats >= 4, --procs >= 2, --after-ms and --skew-ms >= 0; got "
                 f"{args.rounds}, {args.repeats}, {args.procs}, {args.after_ms}, {args.skew_ms}")
    try:
        prof = load_profile(args.hardware)
    except (ValueError, OSError) as e:
        ap.error(f"--hardware {args.hardware}: {e}")
    print(f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at start; {EPISODES} "
          f"episodes, {args.repeats} calls per neighbour x {args.rounds} rounds, {args.after_ms:g} ms after, "
          f"skew up to {args.skew_ms:g} ms")
    print(f"{'procs':>5} {'round':>5} | " + " | ".join(f"{v:>7}: median p25-p75 (ms)" for v in NEIGHBOURS)
          + " | compute / sleep, gather / sleep | priced (ms)")
    for n in args.procs:
        tplan = step_plan(*step_layouts(n))
        priced = price_transfer_plan(local_cost_model(prof, n), tplan, samples=EPISODES, producers=n, world=n,
                                     control=False).time_s
        for r in range(args.rounds):
            every = run_local(worker, n, args.repeats, args.after_ms / 1e3, args.skew_ms / 1e3, timeout_s=600)[0]
            med, cells = {}, []
            for v in NEIGHBOURS:
                per_rank = [e[v] for e in every]
                read = [max(c[k][1] for c in per_rank) - max(c[k][0] for c in per_rank)
                        for k in range(len(per_rank[0]))]
                q = statistics.quantiles(read, n=4)
                med[v] = q[1]
                cells.append(f"{q[1] * 1e3:>14.3f} {q[0] * 1e3:>5.2f}-{q[2] * 1e3:<5.2f}")
            print(f"{n:>5} {r + 1:>5} | " + " | ".join(cells)
                  + f" | {med['compute'] / med['sleep']:>15.2f} {med['gather'] / med['sleep']:>15.2f}"
                  + f" | {priced * 1e3:>11.3f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
