"""The control plane of the runtime: what ranks exchange outside the dispatcher and the
re-sharder. Only per-sample metadata (ids, lengths, groups, rewards, outcomes, per-turn token
counts) and reduced scalars travel here, never token tensors, and every byte a rank receives is
counted (`ControlBytes`), so a test can show that rank 0's share does not grow with the tokens.

One process is a world of size 1: the same calls run, and move nothing.

    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_run_multiprocess.py -k control_bytes
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from earl.runtime.dist import comm_device


@dataclass
class ControlBytes:
    """Bytes this rank received over the control plane, by purpose."""

    received: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, nbytes: int) -> None:
        self.received[what] = self.received.get(what, 0) + int(nbytes)

    @property
    def total(self) -> int:
        return sum(self.received.values())

    def reset(self) -> None:
        self.received.clear()


def _to_bytes(obj) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def all_gather_objects(obj, counter: ControlBytes, what: str) -> list:
    """Every rank's `obj`, in rank order, on every rank (pickled, padded all_gather)."""
    world = dist.get_world_size()
    if world == 1:
        return [obj]
    buf = _to_bytes(obj)
    dev = comm_device()
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([buf.numel()], dtype=torch.int64, device=dev))
    n = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(n), dtype=torch.uint8, device=dev)
    padded[:buf.numel()] = buf.to(dev)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    me = dist.get_rank()
    counter.add(what, sum(n[r] + 8 for r in range(world) if r != me))
    return [obj if r == me else pickle.loads(parts[r][:n[r]].cpu().numpy().tobytes()) for r in range(world)]


def gather_objects(obj, counter: ControlBytes, what: str, dst: int = 0) -> list | None:
    """Every rank's `obj` on rank `dst` (None elsewhere): sizes, then point-to-point bytes."""
    world, me = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return [obj]
    buf = _to_bytes(obj)
    dev = comm_device()
    size = torch.tensor([buf.numel()], dtype=torch.int64, device=dev)
    if me != dst:
        dist.send(size, dst=dst)
        dist.send(buf.to(dev), dst=dst)
        return None
    out = []
    for r in range(world):
        if r == me:
            out.append(obj)
            continue
        n = torch.zeros(1, dtype=torch.int64, device=dev)
        dist.recv(n, src=r)
        data = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
        dist.recv(data, src=r)
        counter.add(what, int(n.item()) + 8)
        out.append(pickle.loads(data.cpu().numpy().tobytes()))
    return out


def reduce_scalars(values: list[float], counter: ControlBytes, what: str, op: str = "sum") -> list[float]:
    """Sum (or max) a few scalars over all ranks; every rank gets the result."""
    vec = torch.tensor(values, dtype=torch.float64, device=comm_device())
    if dist.get_world_size() > 1:
        dist.all_reduce(vec, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        counter.add(what, vec.numel() * vec.element_size())
    return vec.tolist()


def broadcast_object(obj, counter: ControlBytes, what: str, src: int = 0):
    """`obj` from rank `src` on every rank."""
    if dist.get_world_size() == 1:
        return obj
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    if dist.get_rank() != src:
        counter.add(what, len(pickle.dumps(box[0])))
    return box[0]


def vote_stop(past: bool, stop: bool, group=None) -> tuple[bool, bool]:
    """(past the deadline, stop) for every rank of `group` alike, so that all stop after the same
    step: rank 0's clock (`past`) and any rank's SIGTERM (`stop`). Collective over `group`."""
    n = dist.get_world_size(group)
    if n == 1:
        return past, stop
    votes: list = [None] * n
    dist.all_gather_object(votes, (past, stop), group=group)
    return votes[0][0], any(v[1] for v in votes)


def fault_hook(rank: int, step: int) -> None:
    """The fault-injection test hook of both loops: EARL_FAULT_RANK_STEP=RANK:STEP kills rank
    RANK as step STEP starts; RANK:STEP:hang makes it hang there instead (alive, silent), which
    the others see as a collective timing out after `collective_timeout_s`."""
    spec = os.environ.get("EARL_FAULT_RANK_STEP", "")
    if spec.split(":")[:2] != [str(rank), str(step)]:
        return
    if spec.endswith(":hang"):
        print(f"rank {rank}: injected hang at step {step}", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    print(f"rank {rank}: injected fault at step {step}", file=sys.stderr, flush=True)
    os._exit(17)
