"""Collective benchmark across local processes: all-reduce, all-gather, all-to-all and
point-to-point over a range of message sizes, fitted to alpha-beta per operation.

It starts `world` fresh processes (spawn) joined by torch.distributed: gloo on CPU, NCCL on
CUDA with one GPU per rank. Rank 0 times every operation after a barrier (CUDA: device events)
and keeps the median; point-to-point is a ping-pong between ranks 0 and 1, halved. Sizes are
the bytes of one rank's message (all-gather: its contribution; reduce-scatter: the whole tensor
it reduces, FSDP2's gradients of a unit; all-to-all: its whole buffer).

    OMP_NUM_THREADS=1 python -m earl.calibrate.collectives      # 2 gloo ranks, a few seconds
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from earl.calibrate.fit import fit_affine
from earl.runtime.gloo_loops import batched_threads

OPS = ("p2p", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")
CPU_SIZES = tuple(2 ** e for e in range(10, 25))  # 1 KiB .. 16 MiB
CUDA_SIZES = tuple(2 ** e for e in range(10, 31))  # 1 KiB .. 1 GiB


@dataclass(frozen=True, kw_only=True)
class CollectiveResult:
    """Median seconds per (op, message bytes) on `world` ranks."""

    backend: str  # "gloo" | "nccl"
    world: int  # ranks
    times: dict[str, list[tuple[int, float]]]  # op -> [(bytes per rank, median seconds)]
    wall_s: float  # seconds the whole benchmark took, process start-up included


def _bus_factor(op: str, world: int) -> float:
    """Bytes each rank moves per message byte (NCCL's bus-bandwidth convention)."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_gather", "all_to_all"):
        return (world - 1) / world
    return 1.0


def bus_bandwidth(op: str, world: int, nbytes: float, time_s: float) -> float:
    return _bus_factor(op, world) * nbytes / time_s


def _worker(rank: int, world: int, backend: str, store_path: str, sizes: list[int],
            budget_s: float, result_path: str) -> None:

    torch.set_num_threads(1)
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    with batched_threads(backend):  # as the runtime's ranks run them (earl.runtime.gloo_loops)
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(fn) -> float:
        dist.barrier()
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    # Every rank runs the same schedule, so the loop bounds must not depend on local clocks:
    # the repetition count per point comes from rank 0's warm-up, broadcast to all.
    per_point_s = budget_s / max(1, len(sizes) * len(OPS))
    times: dict[str, list[tuple[int, float]]] = {op: [] for op in OPS}
    gen = torch.Generator().manual_seed(rank + 1)
    for op in OPS:
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            if op == "reduce_scatter":  # the whole tensor, cut into equal shards
                numel = max(world, numel - numel % world)
            send = (torch.rand(numel, generator=gen) + 0.5).to(device)
            recv = torch.empty(numel * world if op == "all_gather" else
                               numel // world if op == "reduce_scatter" else numel, device=device)

            def run(op=op, send=send, recv=recv):
                if op == "all_reduce":
                    dist.all_reduce(send)
                elif op == "all_gather":
                    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(recv, send)
                elif op == "reduce_scatter":
                    dist.reduce_scatter_tensor(recv, send)
                elif op == "all_to_all":
                    dist.all_to_all_single(recv, send)
                elif rank == 0:
                    dist.send(send, 1)
                    dist.recv(recv, 1)
                elif rank == 1:
                    dist.recv(recv, 0)
                    dist.send(recv, 0)

            first = max(timed(run), timed(run))  # warm-up (connections, buffers)
            reps = torch.tensor([int(min(20, max(5, per_point_s / max(first, 1e-6))))])
            dist.broadcast(reps, 0)
            samples = [timed(run) for _ in range(int(reps.item()))]
            med = statistics.median(samples)
            times[op].append((nbytes, med / 2 if op == "p2p" else med))
    if rank == 0:
        Path(result_path).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def run_collectives(*, backend: str = "gloo", world: int = 2, sizes: tuple[int, ...] = CPU_SIZES,
                    budget_s: float = 10.0, timeout_s: float | None = None) -> CollectiveResult:
    """Start `world` processes, run the collective benchmark, return rank 0's medians."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown collective backend {backend!r}; valid: gloo, nccl")
    if world < 2:
        raise ValueError(f"the collective benchmark needs >= 2 ranks, got {world}")
    if not sizes:
        raise ValueError("the collective benchmark needs at least one message size")
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="earl-coll-") as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        env_before = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
        try:
            procs = [ctx.Process(target=_worker, args=(r, world, backend, store, list(sizes),
                                                       budget_s, result), daemon=True)
                     for r in range(world)]
            for p in procs:
                p.start()
        finally:
            if env_before is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_before
        deadline = time.perf_counter() + (timeout_s or 3 * budget_s + 120)
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.perf_counter()))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join()
        codes = [p.exitcode for p in procs]
        if hung or any(codes) or not os.path.exists(result):
            raise RuntimeError(f"collective benchmark failed ({backend}, {world} ranks): "
                               f"exit codes {codes}{', timed out' if hung else ''}")
        raw = json.loads(Path(result).read_text())
    times = {op: [(int(b), float(t)) for b, t in raw[op]] for op in OPS}
    return CollectiveResult(backend=backend, world=world, times=times,
                            wall_s=time.perf_counter() - t0)


if __name__ == "__main__":

    res = run_collectives(budget_s=4.0)
    print(f"{res.backend}, {res.world} ranks, {res.wall_s:.1f} s")
    for op, pts in res.times.items():
        f = fit_affine([b for b, _ in pts], [t for _, t in pts], what=op)
        print(f"{op:11s} alpha {f.fixed_s * 1e6:8.1f} us  bw {f.rate / 1e9:6.2f} GB/s  "
              f"held-out error {f.heldout_median_err:.1%}")
