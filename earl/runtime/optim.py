"""The optimizer strategies of the training step (earl.runtime.trainer.train_step runs the loss
and one of these for one training step on any world size).

Two strategies behind one interface (step, zero_grad, dp_sum, weights, state_tensors,
load_state_tensors, step_count, state_names): `FSDPAdamW` for `zero` plans with dp > 1 (AdamW
on the FSDP2-sharded fp32 parameters) and `ReplicatedAdamW` for every other plan (dp all-reduce
of the gradients, global-norm clipping, AdamW on each rank's tp shard). State is exported per
tensor in earl.parallel's layout, so re-shards and checkpoints move it to any plan; the
optimizer always works in fp32 (fp32 masters for a bf16/fp16 model). `FSDPAdamW.weights` (the
weight sync to the rollout and experience copies) gathers the shards in buckets of consecutive
tensors (`sync_buckets`). Details: docs/runtime.md, "Design notes: the optimizer".

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_train.py tests/runtime/test_fsdp.py
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from earl.cost_model.model import FSDP_SHARD_BYTES, SYNC_BUCKET_BYTES
from earl.parallel import ParamShape, PlanGroups, local_bounds, shard_bounds
from earl.policies.reshard import opt_name
from earl.runtime.dist import comm_device
from earl.runtime.run_config import TrainerConfig

STATES = ("exp_avg", "exp_avg_sq")
MASTER = "master"  # fp32 master weights of a low-precision model, laid out like the moments


def state_names(model_dtype: torch.dtype) -> tuple[str, ...]:
    """The per-parameter optimizer tensors kept for a model held in `model_dtype`."""
    return STATES if model_dtype == torch.float32 else (*STATES, MASTER)


class ReplicatedAdamW:
    """AdamW over this rank's tp shard of the model, replicated over dp: every dp rank holds the
    whole optimizer state of its shard and makes the same update from the dp-summed gradients.
    Parameters are plain tensors, or DTensors of the DTensor-TP training model (its local shards
    are earl.parallel's weight layout; the optimizer works on them as plain tensors)."""

    def __init__(self, model: torch.nn.Module, shapes: dict[str, ParamShape], groups: PlanGroups,
                 cfg: TrainerConfig):
        self.model, self.shapes, self.groups, self.cfg = model, shapes, groups, cfg
        self.params = dict(model.named_parameters())
        self.last_norm = float("nan")  # global grad norm of the last step, before clipping
        self.model_dtype = next(iter(self.params.values())).dtype
        self.state_names = state_names(self.model_dtype)
        # the fp32 tensors the optimizer updates: an fp32 model of plain tensors is its own
        # (no copy of weights or gradients); else fp32 copies (master weights of a low-precision
        # model, or a DTensor's local shard)
        self.direct = self.model_dtype == torch.float32 and not any(isinstance(p, DTensor)
                                                                    for p in self.params.values())
        self.owned = dict(self.params) if self.direct else {
            n: torch.nn.Parameter(local_tensor(p).to(torch.float32, copy=True)) for n, p in self.params.items()}
        self.grads: dict[str, torch.Tensor] = {}  # fp32, dp-summed gradients of the last step
        # CPU: torch's fused AdamW kernel (one pass per tensor; the per-tensor loop took 8x as long
        # on the 41M-parameter benchmarks/bench_trl.py model)
        fused = all(q.device.type == "cpu" for q in self.owned.values())
        self.inner = torch.optim.AdamW(list(self.owned.values()), lr=cfg.lr, betas=cfg.betas,
                                       weight_decay=cfg.weight_decay, fused=fused or None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    def dp_sum(self, values: list[float]) -> list[float]:
        """Sum a few scalars over this rank's dp group (float64)."""
        vec = torch.tensor(values, dtype=torch.float64, device=comm_device())
        if self.groups.plan.dp > 1:
            dist.all_reduce(vec, group=self.groups.dp_group)
        return vec.tolist()

    # ---- the step ---------------------------------------------------------------------------
    def _sync_grads(self) -> None:
        """self.grads: every parameter's local gradient in fp32, summed over dp (one flat all_reduce)."""
        local = {n: local_tensor(p) for n, p in self.params.items()}
        if self.direct and self.groups.plan.dp == 1:  # the gradients as they are
            self.grads = {n: p.grad if p.grad is not None else torch.zeros_like(local[n])
                          for n, p in self.params.items()}
            return
        flat = torch.cat([(local_tensor(p.grad) if p.grad is not None else torch.zeros_like(local[n]))
                          .reshape(-1).float() for n, p in self.params.items()])
        if self.groups.plan.dp > 1:
            dist.all_reduce(flat, group=self.groups.dp_group)
        off, self.grads = 0, {}
        for name, t in local.items():
            self.grads[name] = flat[off:off + t.numel()].view(t.shape)
            off += t.numel()

    def grad_norm(self) -> float:
        dev = next(iter(self.grads.values())).device
        sharded = torch.zeros((), dtype=torch.float64, device=dev)
        replicated = torch.zeros((), dtype=torch.float64, device=dev)
        names = list(self.grads)
        norms = torch._foreach_norm([self.grads[n] for n in names], 2)  # fp32 per tensor, one pass each
        for name, norm in zip(names, norms, strict=True):
            sq = norm.double().square()
            if self.shapes[name].tp_dim is None:
                replicated += sq
            else:
                sharded += sq
        if self.groups.plan.tp > 1:
            dist.all_reduce(sharded, group=self.groups.tp_group)
        return float((sharded + replicated).sqrt())

    def step(self) -> float:
        """Sync, clip, update; returns the global grad norm before clipping."""
        self._sync_grads()
        norm = self.grad_norm()
        coef = 1.0
        if self.cfg.grad_clip and math.isfinite(norm):
            coef = min(1.0, self.cfg.grad_clip / (norm + 1e-6))
        grads = [self.grads[name] for name in self.owned]
        if coef < 1:
            torch._foreach_mul_(grads, coef)
        for q, g in zip(self.owned.values(), grads, strict=True):
            q.grad = g
        self.inner.step()
        if not self.direct:
            with torch.no_grad():
                for name, q in self.owned.items():
                    local_tensor(self.params[name]).copy_(q.data)  # rounds to the model dtype
        self.grads = {}
        self.last_norm = norm
        return norm

    # ---- state for checkpoints and re-sharding ------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """name -> this rank's weights (its tp shard, in the model dtype)."""
        return {n: local_tensor(p) for n, p in self.params.items()}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """"<param>/<state>" -> this rank's fp32 tensors (moments: zeros before the first step;
        "master": the fp32 master weights of a low-precision model)."""
        out = {}
        for name, q in self.owned.items():
            st = self.inner.state.get(q, {})
            for s in STATES:
                out[opt_name(name, s)] = st[s] if s in st else torch.zeros_like(q)
            if MASTER in self.state_names:
                out[opt_name(name, MASTER)] = q.detach()
        return out

    @property
    def step_count(self) -> int:
        return _step_count(self.inner)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """The inverse of `state_tensors`; saved master weights replace the copies taken from the
        (rounded) model weights. Moments before the first step are not loaded."""
        with torch.no_grad():
            for name, q in self.owned.items():
                if opt_name(name, MASTER) in tensors:
                    q.copy_(tensors[opt_name(name, MASTER)])
        if step_count == 0:
            return
        for name, q in self.owned.items():
            self.inner.state[q] = {"step": torch.tensor(float(step_count)),
                                   **{s: tensors[opt_name(name, s)].to(q.device, q.dtype, copy=True) for s in STATES}}


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The plain local tensor behind a parameter or gradient (a DTensor's local shard), detached."""
    t = t.detach()
    return t.to_local() if isinstance(t, DTensor) else t


def _step_count(opt: torch.optim.Optimizer) -> int:
    """Optimizer steps taken (0 before the first)."""
    for st in opt.state.values():
        if "step" in st:
            return int(st["step"])
    return 0


class FSDPAdamW:
    """The optimizer strategy of an FSDP2 training model (earl.runtime.parallelize; plans with
    `sharded_optimizer` and dp > 1): torch's AdamW on the fp32 sharded parameters (they are the
    master weights; FSDP2 already reduce-scattered the gradients in fp32), global-norm clipping,
    and the same state export as `ReplicatedAdamW`. Every local shard is the ZeRO slice
    `local_bounds(..., optimizer=True)`, so the re-sharder and the checkpoints move it as is;
    the model-dtype weights under the plan's weight layout are gathered over dp on demand."""

    def __init__(self, model: torch.nn.Module, shapes: dict[str, ParamShape], groups: PlanGroups,
                 cfg: TrainerConfig, model_dtype: torch.dtype):
        self.model, self.shapes, self.groups, self.cfg = model, shapes, groups, cfg
        self.model_dtype = model_dtype
        self.state_names = state_names(model_dtype)
        self.params = dict(model.named_parameters())  # DTensors: fp32 local shards
        self.last_norm = float("nan")
        self.inner = torch.optim.AdamW(list(self.params.values()), lr=cfg.lr, betas=cfg.betas,
                                       weight_decay=cfg.weight_decay)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    dp_sum = ReplicatedAdamW.dp_sum

    def grad_norm(self) -> float:
        """sqrt of the sum of squares over every rank's distinct shard: dp shards are disjoint;
        tp-replicated tensors count once per tp group."""
        dev = comm_device()
        sharded = torch.zeros((), dtype=torch.float64, device=dev)
        replicated = torch.zeros((), dtype=torch.float64, device=dev)
        for name, p in self.params.items():
            if p.grad is None:
                continue
            sq = p.grad.to_local().double().pow(2).sum().to(dev)
            if self.shapes[name].tp_dim is None:
                replicated += sq
            else:
                sharded += sq
        both = torch.stack([sharded, replicated])
        dist.all_reduce(both, group=self.groups.dp_group)
        if self.groups.plan.tp > 1:
            dist.all_reduce(both[:1], group=self.groups.tp_group)
        return float(both.sum().sqrt())

    def step(self) -> float:
        """Undo FSDP2's mean over dp (the loss is already a global token mean), clip, update;
        returns the global grad norm before clipping."""
        dp = self.groups.plan.dp
        for p in self.params.values():
            if p.grad is not None:
                p.grad.to_local().mul_(dp)
        norm = self.grad_norm()
        if self.cfg.grad_clip and math.isfinite(norm):
            coef = min(1.0, self.cfg.grad_clip / (norm + 1e-6))
            if coef < 1.0:
                for p in self.params.values():
                    if p.grad is not None:
                        p.grad.to_local().mul_(coef)
        self.inner.step()
        self.last_norm = norm
        return norm

    # ---- state for checkpoints and re-sharding ------------------------------------------------
    def weights(self, bucket_bytes: float = SYNC_BUCKET_BYTES) -> dict[str, torch.Tensor]:
        """name -> this rank's weights in the model dtype under the plan's weight layout (its tp
        shard, whole over dp): the fp32 shards gathered over dp, one all-gather per bucket of
        consecutive tensors (`sync_buckets`) rather than one per tensor: a gather's cost on a
        small tensor is its latency, and each is a lockstep round of the dp group. Collective."""
        out = {}
        plan, me = self.groups.plan, self.groups.dp_rank
        # cut on the full tensors' sizes, which every dp rank knows alike (its own shard's may differ)
        full = {n: math.prod(self.shapes[n].shape) * FSDP_SHARD_BYTES / plan.dp for n in self.params}
        for bucket in sync_buckets(full, bucket_bytes):
            shapes = {}  # name -> each dp rank's shard shape
            for name in bucket:
                s, local = self.shapes[name], self.params[name].to_local()
                lo, hi = local_bounds(s, plan, self.groups.rank, optimizer=False)
                shapes[name] = [_with(local.shape, s.shard_dim, b - a)
                                for a, b in (shard_bounds(hi - lo, plan.dp, d) for d in range(plan.dp))]
            counts = [[math.prod(shapes[n][d]) for n in bucket] for d in range(plan.dp)]
            width = max(sum(c) for c in counts)  # every rank sends as many elements: pad the short ones
            first = self.params[bucket[0]].to_local()
            flat = first.new_zeros(width)
            torch.cat([self.params[n].to_local().detach().reshape(-1) for n in bucket], out=flat[:sum(counts[me])])
            parts = [flat.new_empty(width) for _ in range(plan.dp)]
            dist.all_gather(parts, flat, group=self.groups.dp_group)
            offsets = [0] * plan.dp
            for i, name in enumerate(bucket):
                pieces = []
                for d in range(plan.dp):
                    pieces.append(parts[d][offsets[d]:offsets[d] + counts[d][i]].view(shapes[name][d]))
                    offsets[d] += counts[d][i]
                out[name] = torch.cat(pieces, dim=self.shapes[name].shard_dim).to(self.model_dtype)
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.params.items():
            st = self.inner.state.get(p, {})
            for s in STATES:
                out[opt_name(name, s)] = st[s].to_local() if s in st else torch.zeros_like(p.to_local())
            if MASTER in self.state_names:
                out[opt_name(name, MASTER)] = p.to_local().detach()
        return out

    @property
    def step_count(self) -> int:
        return _step_count(self.inner)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """Weights (the plan's weight layout, or the fp32 "master" slices when saved) and
        moments (optimizer layout) into the sharded parameters and AdamW's state."""
        plan = self.groups.plan
        with torch.no_grad():
            for name, p in self.params.items():
                s = self.shapes[name]
                if opt_name(name, MASTER) in tensors:
                    p.to_local().copy_(tensors[opt_name(name, MASTER)])
                elif name in tensors:
                    w_lo = local_bounds(s, plan, self.groups.rank, optimizer=False)[0]
                    o_lo, o_hi = local_bounds(s, plan, self.groups.rank, optimizer=True)
                    p.to_local().copy_(tensors[name].narrow(s.shard_dim, o_lo - w_lo, o_hi - o_lo))
        if step_count == 0:
            return
        for name, p in self.params.items():
            moments = {s: tensors[opt_name(name, s)].to(p.device, torch.float32, copy=True) for s in STATES}
            self.inner.state[p] = {"step": torch.tensor(float(step_count)),
                                   **{s: DTensor.from_local(t, p.device_mesh, p.placements, run_check=False,
                                                            shape=p.shape, stride=p.stride())
                                      for s, t in moments.items()}}


def sync_buckets(sizes: dict[str, float], limit: float = SYNC_BUCKET_BYTES) -> list[list[str]]:
    """The names of `sizes` (name -> a shard's bytes, in order) cut into runs of consecutive
    tensors holding at most `limit` bytes together (a larger tensor alone): the weight
    sync's all-gathers (`FSDPAdamW.weights`), as earl.cost_model prices them
    (`CostModel.reshard`). Every rank of a gather must cut alike: pass sizes they all know."""
    out: list[list[str]] = []
    size = 0.0
    for name, nbytes in sizes.items():
        if out and size + nbytes <= limit:
            out[-1].append(name)
            size += nbytes
        else:
            out.append([name])
            size = nbytes
    return out


def _with(shape, dim: int, n: int) -> tuple[int, ...]:
    out = list(shape)
    out[dim] = n
    return tuple(out)
