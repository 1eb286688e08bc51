"""Execute a re-shard plan (earl.policies.reshard.plan_reshard) on torch.distributed.

Each rank packs the slices it sends to one peer into byte buckets (at most `bucket_bytes`
each, in plan order, so both ends cut the same buckets; a large contiguous slice travels alone,
sent and received in place), posts every receive and send at once (isend/irecv; gloo or NCCL),
copies the slices it keeps while those are in flight, and unpacks into the destination
tensors. Slices are copied, never recomputed: a round trip is bit-exact.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_reshard.py
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from earl import parallel
from earl.parallel import ParamShape, local_bounds
from earl.policies.reshard import param_of
from earl.policies.types import ReshardPlan, SliceTransfer
from earl.specs import ParallelPlan

DEFAULT_BUCKET_BYTES = 32 * 2**20


@dataclass(frozen=True, kw_only=True)
class ReshardStats:
    """What one rank did during one re-shard."""

    seconds: float  # wall time on this rank, s
    bytes_sent: int  # bytes sent to other ranks
    bytes_recv: int  # bytes received from other ranks
    bytes_local: int  # bytes copied inside this rank
    messages: int  # buckets sent plus received


def local_range(shapes: dict[str, ParamShape], plan: ParallelPlan, rank: int,
                name: str) -> tuple[int, int]:
    """(start, stop) along the shard dim of the full tensor `name` that `rank` holds."""
    param, opt = param_of(name)
    return local_bounds(shapes[param], plan, rank, optimizer=opt)


def local_shape(shapes: dict[str, ParamShape], plan: ParallelPlan, rank: int,
                name: str) -> tuple[int, ...]:
    param, opt = param_of(name)
    return parallel.local_shape(shapes[param], plan, rank, optimizer=opt)


def allocate_local(shapes: dict[str, ParamShape], plan: ParallelPlan, rank: int, names,
                   dtype: torch.dtype | dict[str, torch.dtype] = torch.float32,
                   device: str = "cpu") -> dict[str, torch.Tensor]:
    """Zero tensors of this rank's local shapes under `plan` (destination buffers), in `dtype`
    or per name `dtype[name]` (a re-shard moves bytes: the two ends must agree on the dtype)."""
    return {n: torch.zeros(local_shape(shapes, plan, rank, n), device=device,
                           dtype=dtype[n] if isinstance(dtype, dict) else dtype) for n in names}


def _plan_rank(ranks: tuple[int, ...], rank: int) -> int:
    """`rank`'s rank in a plan laid over the global ranks `ranks` (`()`: the whole world, so itself;
    -1: not one of them, it holds nothing there)."""
    if not ranks:
        return rank
    return ranks.index(rank) if rank in ranks else -1


def _view(t: torch.Tensor, tr: SliceTransfer, lo: int) -> torch.Tensor:
    return t.narrow(tr.dim, tr.start - lo, tr.stop - tr.start)


def _buckets(transfers: list[SliceTransfer], bucket_bytes: int) -> list[list[SliceTransfer]]:
    """Small slices packed together up to `bucket_bytes`; a slice of half a bucket or more
    travels alone (then a contiguous one is sent and received in place, without copies)."""
    out: list[list[SliceTransfer]] = []
    size = 0
    for t in transfers:
        alone = 2 * t.bytes >= bucket_bytes
        if not out or alone or 2 * out[-1][-1].bytes >= bucket_bytes or size + t.bytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.bytes
    return out


def execute_reshard(plan: ReshardPlan, shapes: dict[str, ParamShape], src: dict[str, torch.Tensor],
                    dst: dict[str, torch.Tensor], *, rank: int | None = None,
                    bucket_bytes: int = DEFAULT_BUCKET_BYTES, group=None) -> ReshardStats:
    """Move slices from this rank's `src` tensors (laid out by plan.src_plan) into its `dst`
    tensors (plan.dst_plan's layout, pre-allocated, written in place). Collective over the
    ranks the plan names. A plan between two pools (earl.policies.reshard.plan_pool_push) lays
    each layout over its own ranks: a rank sends from one and receives into the other."""
    rank = (dist.get_rank() if dist.is_initialized() else 0) if rank is None else rank
    t0 = time.perf_counter()
    src_rank, dst_rank = _plan_rank(plan.src_ranks, rank), _plan_rank(plan.dst_ranks, rank)  # in each layout
    sends: dict[int, list[SliceTransfer]] = defaultdict(list)
    recvs: dict[int, list[SliceTransfer]] = defaultdict(list)
    local_bytes = 0
    local: list[SliceTransfer] = []
    for tr in plan.transfers:
        if tr.src == rank and tr.dst == rank:
            local.append(tr)
        elif tr.src == rank:
            sends[tr.dst].append(tr)
        elif tr.dst == rank:
            recvs[tr.src].append(tr)
    works, inbox = [], []
    sent = recv = msgs = 0
    for peer in sorted(recvs):
        for i, bucket in enumerate(_buckets(recvs[peer], bucket_bytes)):
            direct = None
            if len(bucket) == 1:
                tr = bucket[0]
                view = _view(dst[tr.name], tr, local_range(shapes, plan.dst_plan, dst_rank, tr.name)[0])
                if view.is_contiguous():
                    direct = view.reshape(-1).view(torch.uint8)
            if direct is not None:
                buf = direct
            else:
                buf = torch.empty(sum(t.bytes for t in bucket), dtype=torch.uint8,
                                  device=dst[bucket[0].name].device)
                inbox.append((bucket, buf))
            works.append(dist.irecv(buf, src=peer, group=group, tag=i))
            recv += buf.numel()
            msgs += 1
    for peer in sorted(sends):
        for i, bucket in enumerate(_buckets(sends[peer], bucket_bytes)):
            parts = []
            for tr in bucket:
                lo = local_range(shapes, plan.src_plan, src_rank, tr.name)[0]
                parts.append(_view(src[tr.name], tr, lo).contiguous().view(torch.uint8).flatten())
            buf = torch.cat(parts) if len(parts) > 1 else parts[0]
            works.append(dist.isend(buf, dst=peer, group=group, tag=i))
            sent += buf.numel()
            msgs += 1
    for tr in local:  # copies this rank keeps, while the messages are in flight
        s_lo = local_range(shapes, plan.src_plan, src_rank, tr.name)[0]
        d_lo = local_range(shapes, plan.dst_plan, dst_rank, tr.name)[0]
        _view(dst[tr.name], tr, d_lo).copy_(_view(src[tr.name], tr, s_lo))
        local_bytes += tr.bytes
    for w in works:
        w.wait()
    for bucket, buf in inbox:
        off = 0
        for tr in bucket:
            lo = local_range(shapes, plan.dst_plan, dst_rank, tr.name)[0]
            view = _view(dst[tr.name], tr, lo)
            raw = buf[off:off + tr.bytes]
            if off % view.element_size():  # keep the dtype view aligned
                raw = raw.clone()
            chunk = raw.view(view.dtype).view(view.shape)
            view.copy_(chunk)
            off += tr.bytes
    return ReshardStats(seconds=time.perf_counter() - t0, bytes_sent=sent, bytes_recv=recv,
                        bytes_local=local_bytes, messages=msgs)
