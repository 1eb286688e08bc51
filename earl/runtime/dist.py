"""The multi-process runtime's plumbing: init from torchrun's environment, rank-0 printing,
local gloo workers for tests, and a shutdown that never hangs. A plan's
process groups and device mesh are built by earl.parallel (build_plan_groups, build_mesh).

gloo on CPU, NCCL when CUDA is present (same code path).

    torchrun --standalone --nproc_per_node 2 -m earl.runtime.dist
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from earl.parallel import build_plan_groups
from earl.runtime.gloo_loops import batched_threads
from earl.specs import ParallelPlan


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int  # global rank
    world: int  # number of processes
    local_rank: int  # rank on this node
    backend: str  # "gloo" | "nccl"
    device: str  # "cpu" or "cuda:<local_rank>"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(backend: str | None = None, timeout_s: float = 120.0) -> DistEnv:
    """Join the job torchrun started (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
    environment). Without those variables: a single process, a world of size 1 with its own
    one-rank gloo group (so every collective of the runtime runs, and moves nothing)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return DistEnv(rank=0, world=1, local_rank=0, backend="gloo", device="cpu")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend {backend!r} unknown; valid: gloo, nccl")
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        with batched_threads(backend):  # gloo's event loop under SCHED_BATCH (earl.runtime.gloo_loops)
            dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
    return DistEnv(rank=rank, world=world, local_rank=local_rank, backend=backend, device=device)


def comm_device() -> torch.device:
    """Where tensors handed to collectives must live: the current CUDA device under NCCL,
    else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def print0(*args, **kwargs) -> None:
    """print on global rank 0 only (every rank when there is no process group)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def aligned_origin(offset: float = 0.0) -> float:
    """A `time.perf_counter()` origin every rank shares, so their spans line up in one trace:
    rank 0's `offset` (seconds the trace already holds: a resumed run's) goes to every rank.
    Ranks on rank 0's host take rank 0's origin itself (perf_counter is the host's monotonic
    clock, one for all its processes: exact); ranks on other hosts take theirs right after a
    barrier (aligned to the barrier's exit skew). Collective over the world; alone:
    perf_counter() - offset."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return time.perf_counter() - offset
    box = [offset, time.perf_counter() - offset, socket.gethostname()]
    dist.broadcast_object_list(box, src=0)
    dist.barrier()
    mine = time.perf_counter() - float(box[0])
    return float(box[1]) if box[2] == socket.gethostname() else mine


def shutdown(code: int = 0) -> None:
    """End a worker process: barrier, destroy the process group, flush, and `os._exit` (torch
    2.13's gloo/DTensor teardown can abort at interpreter exit; this path never reaches it)."""
    try:
        if dist.is_initialized():
            if code in (0, 143):  # 143: preempted, every rank stopped after the same step
                dist.barrier()
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_worker(fn, rank: int, world: int, port: int, queue, args, timeout_s: float) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    code = 0
    try:
        init_distributed(backend="gloo", timeout_s=timeout_s)
        queue.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:  # report any failure to the parent, then leave
        queue.put((rank, False, traceback.format_exc()))
        code = 1
    queue.close()
    queue.join_thread()
    shutdown(code)


def run_local(fn, nproc: int, *args, timeout_s: float = 300.0, start_method: str = "fork") -> list:
    """Run `fn(*args)` on `nproc` local gloo ranks (tests, benchmarks); rank order results.

    "fork" starts in ~1 s (torch already imported); use "spawn" for a clean interpreter (then
    `fn` must be importable at module level). A failing rank's traceback is raised here as a
    RuntimeError; the other ranks are terminated."""
    ctx = mp.get_context(start_method)
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_local_worker, args=(fn, r, nproc, port, queue, args, timeout_s),
                         daemon=True) for r in range(nproc)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    try:
        for _ in range(nproc):
            rank, ok, payload = queue.get(timeout=timeout_s)
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            results[rank] = pickle.loads(payload)
    finally:
        for p in procs:
            p.join(timeout=10 if len(results) == nproc else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [results[r] for r in range(nproc)]


if __name__ == "__main__":
    env = init_distributed()
    groups = build_plan_groups(ParallelPlan(tp=env.world // 2 or 1, dp=2 if env.world > 1 else 1))
    x = torch.ones(1) * env.rank
    if dist.is_initialized():
        dist.all_reduce(x, group=groups.tp_group)
    print(f"rank {env.rank}/{env.world} backend={env.backend} tp_rank={groups.tp_rank} "
          f"dp_rank={groups.dp_rank} tp-sum={x.item()}", flush=True)
    shutdown()


@contextlib.contextmanager
def process_group(timeout_s: float = 300.0):
    """(rank, world) of this process's group for the duration: torchrun's job (its collectives
    fail after `timeout_s` waiting for a rank), or a one-rank gloo group made here and destroyed
    on exit (so a later fork starts without one)."""
    created = not dist.is_initialized()
    rank, world = init_process_group(timeout_s)
    try:
        yield rank, world
    finally:
        if created and world == 1 and dist.is_initialized():
            dist.destroy_process_group()


def init_process_group(timeout_s: float = 300.0) -> tuple[int, int]:
    """Join torchrun's job, or make a one-rank gloo group for a single process (rank, world)."""
    env = init_distributed(timeout_s=timeout_s)
    return env.rank, env.world
