"""gloo's event-loop threads on a CPU host: how much CPU they burn inside the runtime's stages
and its single collectives, and what that does to the millisecond-scale stages' wall time.

gloo's TCP transport runs one loop thread per process group ("gloo_tcp_loop"). When a message
waits on a socket while the rank's own thread holds that peer's lock, the loop skips it (a
try-lock in gloo/transport/tcp/pair.cc, `Pair::handleEvents`) and its level-triggered
`epoll_wait` returns at once: it spins in the kernel until the lock is free. `perf record` on one
loop during a stream of 4 KB sends between 2 ranks (2-core VM, 2026-12-04): 45% of a core, nearly
all in `epoll_wait`, `tcp_poll` and `pthread_mutex_trylock`. On a host with no core to spare the
spin takes one from the ranks' own threads.

Two modes:
- traces: `python studies/cpu_gloo_loop.py RUN_DIR...` (folders with a `trace.json` written by
  the runtime, e.g. `<validate out>/runs/base`): per stage, the spans' wall time, the process's
  CPU over it and the span's own thread's (`args.thread_cpu_s`, earl.runtime.worker.Worker.span),
  and the other threads' part (gloo's loops, the rest small).
- ops: `python studies/cpu_gloo_loop.py --ops --nproc 2`: fresh gloo ranks (spawned) time a
  barrier, an all-reduce, five 4 KB send/receive pairs and the layout-aware dispatch of
  `earl calibrate`'s setting (earl.calibrate.dispatchfit), REPEATS each after a barrier, and read
  every loop thread's CPU (/proc/self/task/*/schedstat) around each call: per op, the median and
  slowest wall time, the median loop CPU, and the calls in which the loops took more than 1 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

from earl.trace import read_chrome_trace

LOOP_THREAD = "gloo_tcp_loop"
SPIN_MS = 1.0  # a call whose loop threads took more CPU than this, ms: they spun in it
REPEATS = 40
OPS = ("barrier", "all_reduce", "send_recv", "dispatch")


def trace_table(run: Path) -> list[str]:
    """Per (stage, span) of one run's trace: spans, wall ms, process and own-thread CPU / wall."""
    path = run / "trace.json"
    if not path.is_file():
        raise ValueError(f"{run}: no trace.json (give a run folder the runtime wrote, e.g. <validate out>/runs/base)")
    agg: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for sp in read_chrome_trace(path):
        if "thread_cpu_s" not in sp.args or sp.duration_s <= 0:
            continue
        a = agg[(sp.stage, sp.name)]
        a[0] += sp.duration_s
        a[1] += float(sp.args["cpu_s"])
        a[2] += float(sp.args["thread_cpu_s"])
        a[3] += 1
    if not agg:
        raise ValueError(f"{run}: its spans carry no thread_cpu_s (a trace from before 2026-12-04)")
    lines = [f"{run}", f"  {'stage':10s} {'span':18s} {'spans':>5s} {'wall ms':>9s} {'process/wall':>12s} "
                       f"{'thread/wall':>11s} {'other threads':>13s}"]
    for (stage, name), (w, c, t, n) in sorted(agg.items()):
        lines.append(f"  {stage:10s} {name:18s} {n:5d} {w * 1e3:9.1f} {c / w:12.2f} {t / w:11.2f} "
                     f"{100 * (c - t) / w:12.1f}%")
    return lines


def _loop_ms() -> float:
    """CPU ms this process's gloo loop threads have run (the kernel's schedstat: every switch)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != LOOP_THREAD:
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e6
        except (OSError, ValueError, IndexError):
            continue
    return total


def _op_worker(repeats: int) -> dict[str, list[tuple[float, float]]]:
    """One rank: per op, (wall ms, this rank's loop-thread CPU ms) per call after a warm-up."""
    import torch
    import torch.distributed as dist

    from earl.calibrate import dispatchfit
    from earl.runtime.move_samples import execute_dispatch

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    samples, src, dst = dispatchfit.layouts(world, 8 if world == 2 else 4, 220)
    store = dispatchfit._store(samples, src, rank)
    tplan = dispatchfit.transfer_plans(world, 8 if world == 2 else 4, 220)["layout-aware"]
    out_bufs = [torch.zeros(4096, dtype=torch.uint8) for _ in range(5)]
    in_bufs = [torch.zeros(4096, dtype=torch.uint8) for _ in range(5)]
    x = torch.zeros(16)
    peer_to, peer_from = (rank + 1) % world, (rank - 1) % world

    def send_recv():
        works = [dist.irecv(in_bufs[i], src=peer_from, tag=i) for i in range(5)]
        works += [dist.isend(out_bufs[i], dst=peer_to, tag=i) for i in range(5)]
        for w in works:
            w.wait()

    calls = {"barrier": dist.barrier, "all_reduce": lambda: dist.all_reduce(x), "send_recv": send_recv,
             "dispatch": lambda: execute_dispatch(tplan, store, samples, src, dst, check=False)}
    got: dict[str, list[tuple[float, float]]] = {op: [] for op in OPS}
    for rep in range(repeats + 1):
        for op in OPS:
            dist.barrier()
            loop0, t0 = _loop_ms(), time.perf_counter()
            calls[op]()
            wall = (time.perf_counter() - t0) * 1e3
            if rep:  # the first round warms up connections and allocators
                got[op].append((wall, _loop_ms() - loop0))
    return got


def op_table(nproc: int, repeats: int = REPEATS) -> list[str]:
    from earl.runtime.dist import run_local

    res = run_local(_op_worker, nproc, repeats, timeout_s=600, start_method="spawn")
    lines = [f"{nproc} gloo ranks, {repeats} calls per op (all ranks pooled; a call starts after a barrier)",
             f"  {'op':10s} {'wall median':>11s} {'slowest':>8s} {'loop CPU median':>15s} "
             f"{'calls with loops > 1 ms':>24s} {'their wall median':>17s}"]
    for op in OPS:
        rows = [r for rank in res for r in rank[op]]
        walls = [w for w, _ in rows]
        spun = [w for w, c in rows if c > SPIN_MS]
        lines.append(f"  {op:10s} {statistics.median(walls):9.2f}ms {max(walls):6.2f}ms "
                     f"{statistics.median(c for _, c in rows):13.2f}ms {len(spun):14d} of {len(rows):3d} "
                     f"{statistics.median(spun) if spun else float('nan'):15.2f}ms")
    return lines


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, help="run folders holding the runtime's trace.json")
    ap.add_argument("--ops", action="store_true", help="time single collectives on fresh gloo ranks instead")
    ap.add_argument("--nproc", type=int, default=2, help="ranks for --ops (2 or more)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="calls per op for --ops")
    args = ap.parse_args()
    if args.ops == bool(args.runs):
        ap.error("give run folders, or --ops (not both)")
    if args.ops and (args.nproc < 2 or args.repeats < 1):
        ap.error(f"--nproc {args.nproc} / --repeats {args.repeats}: at least 2 ranks and 1 call")
    if args.ops and not os.path.isdir("/proc/self/task"):
        ap.error("--ops reads /proc/self/task (Linux only)")
    try:
        lines = op_table(args.nproc, args.repeats) if args.ops else [ln for r in args.runs for ln in trace_table(r)]
    except ValueError as e:
        ap.error(str(e))  # exit code 2
    print("\n".join(lines))
