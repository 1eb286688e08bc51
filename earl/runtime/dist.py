"""Process groups for the multi-process runtime: init from torchrun's environment, groups per
ParallelPlan (tp and dp groups), rank-0 printing and a shutdown that never hangs.

gloo on CPU, NCCL when CUDA is present (same code path). A plan's ranks are ordered tp fastest,
then dp (earl.policies.types.rank_coords), so tp groups are contiguous ranks.

    torchrun --standalone --nproc_per_node 2 -m earl.runtime.dist
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import socket
import sys
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from earl.specs import ParallelPlan


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int  # global rank
    world: int  # number of processes
    local_rank: int  # rank on this node
    backend: str  # "gloo" | "nccl" | "none" (single process without a process group)
    device: str  # "cpu" or "cuda:<local_rank>"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(backend: str | None = None, timeout_s: float = 120.0) -> DistEnv:
    """Join the job torchrun started (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
    environment). Without those variables: a single process and no process group."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistEnv(rank=0, world=1, local_rank=0, backend="none", device="cpu")
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


@dataclass(frozen=True)
class PlanGroups:
    """This rank's place in a tp x dp plan and the process groups it talks over.

    `tp_group` joins the tp ranks of this rank's replica; `dp_group` joins the ranks holding the
    same tp shard in every replica. Ranks outside the plan (plan smaller than the world) have
    `active=False` and None groups."""

    plan: ParallelPlan
    rank: int
    active: bool
    tp_rank: int
    dp_rank: int
    tp_group: object
    dp_group: object
    tp_ranks: tuple[int, ...]
    dp_ranks: tuple[int, ...]


_GROUP_CACHE: dict[tuple[int, ...], object] = {}


def _group(ranks: tuple[int, ...]):
    """A process group over `ranks`, created once. Must be called by every rank, in the same
    order, for every group (torch.distributed.new_group is collective)."""
    if ranks not in _GROUP_CACHE:
        _GROUP_CACHE[ranks] = dist.new_group(list(ranks)) if dist.is_initialized() else None
    return _GROUP_CACHE[ranks]


def build_plan_groups(plan: ParallelPlan, rank: int | None = None) -> PlanGroups:
    """tp and dp groups of `plan` (ranks 0..plan.world_size-1). Collective: every rank of the
    world calls it with the same plan."""
    if plan.pp != 1 or plan.cp != 1:
        raise ValueError(f"plan {plan.short()}: the runtime supports tp x dp plans (pp=1, cp=1)")
    world = dist.get_world_size() if dist.is_initialized() else 1
    if plan.world_size > world:
        raise ValueError(f"plan {plan.short()} needs {plan.world_size} processes, the job has {world}")
    rank = (dist.get_rank() if dist.is_initialized() else 0) if rank is None else rank
    mine_tp, mine_dp = None, None
    for d in range(plan.dp):  # every rank creates every group, in the same order
        ranks = tuple(d * plan.tp + t for t in range(plan.tp))
        g = _group(ranks)
        if rank in ranks:
            mine_tp = (ranks, g)
    for t in range(plan.tp):
        ranks = tuple(d * plan.tp + t for d in range(plan.dp))
        g = _group(ranks)
        if rank in ranks:
            mine_dp = (ranks, g)
    if mine_tp is None:
        return PlanGroups(plan, rank, False, 0, 0, None, None, (), ())
    return PlanGroups(plan, rank, True, rank % plan.tp, rank // plan.tp, mine_tp[1], mine_dp[1],
                      mine_tp[0], mine_dp[0])


def exchange_objects(outgoing: dict[int, object], group=None) -> dict[int, object]:
    """Point-to-point exchange of picklable objects: `outgoing[dst]` goes to rank dst; returns
    {src: object} of what this rank received. Collective over the group (one all_gather of the
    byte counts, then isend/irecv of the pickled bytes)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    payload = {d: torch.frombuffer(bytearray(pickle.dumps(o)), dtype=torch.uint8)
               for d, o in outgoing.items() if d != rank}
    sizes = torch.zeros(world, dtype=torch.int64, device=comm_device())
    for d, buf in payload.items():
        sizes[d] = buf.numel()
    table = [torch.zeros_like(sizes) for _ in range(world)]
    dist.all_gather(table, sizes, group=group)
    inbox = {s: torch.empty(int(table[s][rank]), dtype=torch.uint8, device=comm_device())
             for s in range(world) if s != rank and int(table[s][rank]) > 0}
    works = [dist.irecv(buf, src=s, group=group) for s, buf in inbox.items()]
    works += [dist.isend(buf.to(comm_device()), dst=d, group=group) for d, buf in payload.items()]
    for w in works:
        w.wait()
    out = {s: pickle.loads(buf.cpu().numpy().tobytes()) for s, buf in inbox.items()}
    if rank in outgoing:
        out[rank] = outgoing[rank]
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown(code: int = 0) -> None:
    """End a worker process: barrier, destroy the process group, flush, and `os._exit` (torch
    2.13's gloo/DTensor teardown can abort at interpreter exit; this path never reaches it)."""
    try:
        if dist.is_initialized():
            if code == 0:
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
