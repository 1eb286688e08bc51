"""The training step under a tp x dp plan: runtime-1's Trainer computes the loss and backward on
this rank's share of the batch (its tp-sharded model, its dp share of the samples), and a
`ShardedAdamW` takes over from there.

`ShardedAdamW` (ZeRO-1 when the plan has `sharded_optimizer`): gradients are weighted by this
rank's share of the global loss tokens and summed over the dp group (so the update is the one
a single process would make on the whole batch), clipped by the global norm (tp-sharded
parameters' squares summed over the tp group, replicated ones counted once), then each dp rank
runs AdamW on its own slice of every tensor (earl.parallel.local_bounds's optimizer layout) and
broadcasts the updated slices to its dp peers. Without `sharded_optimizer` every rank keeps the
full optimizer state of its tp shard. Optimizer state is exported / imported per tensor
("<param>/exp_avg", "<param>/exp_avg_sq") so the re-sharder can move it to another plan.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_train.py
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from earl.parallel import ParamShape, PlanGroups, local_bounds
from earl.runtime.config import TrainerConfig
from earl.runtime.dist import comm_device
from earl.runtime.trainer import ExperienceBatch, Trainer

STATES = ("exp_avg", "exp_avg_sq")


class ShardedAdamW:
    """AdamW over this rank's slices of a tp-sharded model, gradients synced over dp."""

    def __init__(self, model: torch.nn.Module, shapes: dict[str, ParamShape], groups: PlanGroups,
                 cfg: TrainerConfig):
        self.model, self.shapes, self.groups, self.cfg = model, shapes, groups, cfg
        self.params = dict(model.named_parameters())
        self.scale = 1.0  # this rank's share of the global loss tokens (set per optimizer step)
        self.last_norm = float("nan")  # global grad norm of the last step, before clipping
        self.slices: dict[str, tuple[int, int, int]] = {}  # name -> (dim, local start, length)
        plan, rank = groups.plan, groups.rank
        for name, p in self.shapes.items():
            w_lo = local_bounds(p, plan, rank, optimizer=False)[0]
            o_lo, o_hi = local_bounds(p, plan, rank, optimizer=True)
            self.slices[name] = (p.shard_dim, o_lo - w_lo, o_hi - o_lo)
        self.owned = {n: torch.nn.Parameter(self._slice(n, self.params[n].detach()).clone())
                      for n in self.shapes}
        self.inner = torch.optim.AdamW(list(self.owned.values()), lr=cfg.lr, betas=cfg.betas,
                                       weight_decay=cfg.weight_decay)

    def _slice(self, name: str, t: torch.Tensor) -> torch.Tensor:
        dim, start, length = self.slices[name]
        return t.narrow(dim, start, length)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    # ---- the step ---------------------------------------------------------------------------
    def _sync_grads(self) -> None:
        grads = []
        for p in self.params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads]) * self.scale
        if self.groups.plan.dp > 1:
            dist.all_reduce(flat, group=self.groups.dp_group)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def grad_norm(self) -> float:
        dev = next(iter(self.params.values())).device
        sharded = torch.zeros((), dtype=torch.float64, device=dev)
        replicated = torch.zeros((), dtype=torch.float64, device=dev)
        for name, p in self.params.items():
            sq = p.grad.double().pow(2).sum()
            if self.shapes[name].tp_dim is None:
                replicated += sq
            else:
                sharded += sq
        if self.groups.plan.tp > 1:
            dist.all_reduce(sharded, group=self.groups.tp_group)
        return float((sharded + replicated).sqrt())

    def _broadcast_slices(self) -> None:
        """Every dp rank's updated slices to its dp peers: one flat broadcast per owner."""
        plan, rank = self.groups.plan, self.groups.rank
        for owner in self.groups.dp_ranks:
            parts, views = [], []
            for name, p in self.shapes.items():
                w_lo = local_bounds(p, plan, owner, optimizer=False)[0]
                o_lo, o_hi = local_bounds(p, plan, owner, optimizer=True)
                view = self.params[name].data.narrow(p.shard_dim, o_lo - w_lo, o_hi - o_lo)
                views.append(view)
                parts.append(view.reshape(-1) if owner != rank else view.contiguous().reshape(-1))
            flat = torch.cat(parts) if owner == rank else torch.empty(sum(v.numel() for v in views),
                                                                      dtype=views[0].dtype,
                                                                      device=views[0].device)
            dist.broadcast(flat, src=owner, group=self.groups.dp_group)
            if owner != rank:
                off = 0
                for v in views:
                    v.copy_(flat[off:off + v.numel()].view_as(v))
                    off += v.numel()

    def step(self) -> float:
        """Sync, clip, update; returns the global grad norm before clipping."""
        self._sync_grads()
        norm = self.grad_norm()
        coef = 1.0
        if self.cfg.grad_clip and math.isfinite(norm):
            coef = min(1.0, self.cfg.grad_clip / (norm + 1e-6))
        for name, q in self.owned.items():
            q.grad = self._slice(name, self.params[name].grad).clone() * coef
        self.inner.step()
        with torch.no_grad():
            for name, q in self.owned.items():
                self._slice(name, self.params[name].data).copy_(q.data)
        if self.groups.plan.sharded_optimizer and self.groups.plan.dp > 1:
            self._broadcast_slices()
        self.last_norm = norm
        return norm

    # ---- state for checkpoints and re-sharding ------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """"<param>/<state>" -> this rank's slice (zeros before the first step)."""
        out = {}
        for name, q in self.owned.items():
            st = self.inner.state.get(q, {})
            for s in STATES:
                out[f"{name}/{s}"] = st[s] if s in st else torch.zeros_like(q)
        return out

    @property
    def step_count(self) -> int:
        for q in self.owned.values():
            st = self.inner.state.get(q)
            if st and "step" in st:
                return int(st["step"])
        return 0

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        if step_count == 0:
            return
        for name, q in self.owned.items():
            self.inner.state[q] = {"step": torch.tensor(float(step_count)),
                                   **{s: tensors[f"{name}/{s}"].clone() for s in STATES}}


def make_dist_trainer(model: torch.nn.Module, shapes: dict[str, ParamShape], groups: PlanGroups,
                      cfg: TrainerConfig, *, temperature: float,
                      ref_model: torch.nn.Module | None = None) -> tuple[Trainer, ShardedAdamW]:
    """runtime-1's Trainer (loss, micro-batching; its own clipping off) + a ShardedAdamW."""
    trainer = Trainer(model, dataclasses.replace(cfg, grad_clip=0.0), temperature=temperature,
                      ref_model=ref_model)
    optim = ShardedAdamW(model, shapes, groups, cfg)
    trainer.optimizer = optim
    return trainer, optim


def dist_train_step(trainer: Trainer, optim: ShardedAdamW, local: ExperienceBatch, progress: float = 0.0) -> dict:
    """One optimizer step over the global batch, given this rank's dp share `local` (every tp
    rank of a dp group passes the same share). Returns global token-weighted stats."""
    groups = optim.groups
    n_local = torch.tensor([float(local.loss_mask.sum())], dtype=torch.float64, device=comm_device())
    n_global = n_local.clone()
    if groups.plan.dp > 1:
        dist.all_reduce(n_global, group=groups.dp_group)
    optim.scale = float(n_local.item() / max(n_global.item(), 1.0))
    assert not trainer.cfg.grad_clip, "build the Trainer with grad_clip=0: ShardedAdamW clips globally"
    lr = trainer.lr_at(progress)  # runtime-1's decay schedule, applied to the sharded AdamW
    for group in optim.inner.param_groups:
        group["lr"] = lr
    trainer.optimizer = optim  # Trainer._optimizer_step: zero_grad(), backward, then .step()
    stats = trainer._optimizer_step(local)
    keys = [k for k in sorted(stats) if k not in ("grad_norm", "train_tokens")]
    vec = torch.tensor([stats[k] * optim.scale for k in keys], dtype=torch.float64, device=comm_device())
    if groups.plan.dp > 1:
        dist.all_reduce(vec, group=groups.dp_group)
    out = dict(zip(keys, vec.tolist(), strict=True))
    out["grad_norm"] = optim.last_norm
    out["train_tokens"] = float(n_global.item())
    out["lr"] = lr
    return out
