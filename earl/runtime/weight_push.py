"""The async run's weight push: the training pool's weights to the rollout replicas after each
optimizer step (`WeightPush`, through the re-shard planner), received on a rollout rank's own
thread (`WeightReceiver`) into staging tensors the replica swaps in (earl.runtime.async_rl).

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_async_push.py
"""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from earl.policies.reshard import plan_pool_push
from earl.runtime.dist import comm_device
from earl.runtime.move_weights import allocate_local, execute_reshard
from earl.runtime.tp import param_shapes
from earl.specs import ParallelPlan

if TYPE_CHECKING:
    from earl.runtime.async_rl import Pools

PUSH_BUCKET_BYTES = 32 * 2**20  # one weight-push message carries at most this many bytes
END_OF_PUSHES = -1  # the version number that ends a run's weight pushes


def weights_digest(model: torch.nn.Module | dict[str, torch.Tensor]) -> str:
    """sha256 of every parameter's bytes, in order (bitwise equality of two copies)."""
    h = hashlib.sha256()
    for name, p in (model.items() if isinstance(model, dict) else model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
    return h.hexdigest()


def _header(version: int, group) -> int:
    """Rank 0's version number to every rank of `group` (END_OF_PUSHES: no more)."""
    t = torch.tensor([version], dtype=torch.int64, device=comm_device())
    dist.broadcast(t, src=0, group=group)
    return int(t.item())


def _named(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters()}


class WeightPush:
    """The training pool's weights to the rollout replicas through the re-shard planner
    (earl.policies.reshard.plan_pool_push: tp1-dpT on the training ranks to R tp1 replicas, dp=R,
    on the rollout ranks; each slice from the least loaded training rank, so the sends spread over
    the training pool), executed by earl.runtime.move_weights.execute_reshard in buckets of
    PUSH_BUCKET_BYTES (gloo here, NCCL on GPUs, the same code) on `group`, a process group of the
    whole world apart from the default one (a rollout rank receives on a thread). Each version
    goes out after a header with its number from rank 0."""

    def __init__(self, model: torch.nn.Module, pools: Pools, group):
        self.group, self.rank = group, dist.get_rank()
        self.shapes = param_shapes(model)
        self.dtypes = {n: p.dtype for n, p in model.named_parameters()}
        self.plan = plan_pool_push(self.shapes, ParallelPlan(dp=len(pools.train_ranks)), pools.train_ranks,
                                   ParallelPlan(dp=len(pools.rollout_ranks)), pools.rollout_ranks)

    def send(self, model: torch.nn.Module, version: int) -> int:
        """A training rank: version `version` of `model` (every training rank calls it); returns
        the bytes this rank sent."""
        _header(version, self.group)
        return execute_reshard(self.plan, self.shapes, _named(model), {}, rank=self.rank,
                               bucket_bytes=PUSH_BUCKET_BYTES, group=self.group).bytes_sent

    def end(self) -> None:
        """A training rank: no more versions; the rollout ranks' receivers end."""
        _header(END_OF_PUSHES, self.group)

    def receive(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """A rollout rank: the next version and its weights in fresh tensors, or None at the end."""
        version = _header(0, self.group)
        if version == END_OF_PUSHES:
            return None
        me = self.plan.dst_ranks.index(self.rank)
        dst = allocate_local(self.shapes, self.plan.dst_plan, me, list(self.dtypes), dtype=self.dtypes,
                             device=str(comm_device()))
        execute_reshard(self.plan, self.shapes, {}, dst, rank=self.rank, bucket_bytes=PUSH_BUCKET_BYTES,
                        group=self.group)
        return version, dst


class WeightReceiver(threading.Thread):
    """A rollout rank's receiver of weight versions (`push.receive`) until the end: each waits
    in `ready` (version, named tensors) until the replica swaps it in, and (END_OF_PUSHES, None)
    follows the last; `latest` keeps the newest for a checkpoint (`weights_of`)."""

    def __init__(self, push: WeightPush):
        super().__init__(daemon=True)
        self.push = push
        self.ready: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.latest: tuple[int, dict[str, torch.Tensor]] | None = None
        self.arrived = threading.Condition()
        self.ended = False  # the training pool sent its last version

    def run(self) -> None:
        try:
            while (got := self.push.receive()) is not None:
                with self.arrived:
                    self.latest = got
                    self.arrived.notify_all()
                self.ready.put(got)
            self.ended = True  # set before the marker: a reader that sees it finds every push queued
            self.ready.put((END_OF_PUSHES, None))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = e
            self.ready.put((None, None))
            with self.arrived:
                self.arrived.notify_all()

    def weights_of(self, version: int, timeout_s: float) -> dict[str, torch.Tensor]:
        """The weights of `version`, once pushed (the newest: rank 0 pushes no later one before
        the checkpoint of `version` this is for)."""
        with self.arrived:
            got = self.arrived.wait_for(lambda: self.error is not None or (self.latest is not None
                                                                          and self.latest[0] >= version), timeout_s)
        if self.error is not None:
            raise RuntimeError(f"weight push failed: {self.error}") from self.error
        if not got:
            raise RuntimeError(f"timed out waiting for weight version {version} from the training pool")
        assert self.latest[0] == version, (self.latest[0], version)
        return self.latest[1]
