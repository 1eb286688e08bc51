"""The optimizer strategy of the training step: `ShardedAdamW` over this rank's share of a
tp x dp plan, and `train_step`, which runs the loss (earl.runtime.trainer) and the optimizer
for one training step on any world size (one process: tp1-dp1, where it is plain AdamW).

`ShardedAdamW` (ZeRO-1 when the plan has `sharded_optimizer`): gradients, already divided by
the global loss-token count, are summed over the dp group (so the update is the one a single
process would make on the whole batch), clipped by the global norm (tp-sharded parameters'
squares summed over the tp group, replicated ones counted once), then each dp rank runs AdamW
on its own slice of every tensor (earl.parallel.local_bounds's optimizer layout) and broadcasts the
updated slices to its dp peers. Without `sharded_optimizer` every rank keeps the full optimizer
state of its tp shard. Optimizer state is exported / imported per tensor ("<param>/exp_avg",
"<param>/exp_avg_sq") so the re-sharder and the checkpoints can move it to another plan.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_train.py
"""

from __future__ import annotations

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

    def dp_sum(self, values: list[float]) -> list[float]:
        """Sum a few scalars over this rank's dp group (float64)."""
        vec = torch.tensor(values, dtype=torch.float64, device=comm_device())
        if self.groups.plan.dp > 1:
            dist.all_reduce(vec, group=self.groups.dp_group)
        return vec.tolist()

    # ---- the step ---------------------------------------------------------------------------
    def _sync_grads(self) -> None:
        grads = []
        for p in self.params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
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
                                   **{s: tensors[f"{name}/{s}"].to(q.device, q.dtype, copy=True) for s in STATES}}


def train_step(trainer: Trainer, optim: ShardedAdamW, local: ExperienceBatch, *, progress: float = 0.0,
               generator: torch.Generator | None = None) -> dict:
    """One training step: `minibatches` optimizer steps over the global batch, given this rank's
    dp share `local` (every tp rank of a dp group passes the same share). Each rank splits its
    share the same number of ways, so all dp ranks step together. Returns global token-weighted
    stats (identical on every rank)."""
    lr = trainer.lr_at(progress)
    for group in optim.inner.param_groups:
        group["lr"] = lr
    k = trainer.cfg.minibatches
    n = local.size
    perm = torch.randperm(n, generator=generator) if k > 1 else torch.arange(n)
    chunks = [perm[i * n // k:(i + 1) * n // k].tolist() for i in range(k)]
    keys = ("loss", "pg_loss", "kl", "clip_frac", "entropy")
    totals = dict.fromkeys(keys, 0.0)
    norms, tokens, steps = [], 0.0, 0
    for idx in chunks:
        sub = local.select(idx) if idx else None
        n_local = float(sub.loss_mask.sum()) if sub is not None else 0.0
        optim.zero_grad(set_to_none=True)
        n_global = optim.dp_sum([n_local])[0]
        if n_global == 0:
            continue
        sums = trainer.backward(sub, n_global) if sub is not None and n_local else dict.fromkeys(keys, 0.0)
        norms.append(optim.step())
        reduced = optim.dp_sum([sums[key] for key in keys])
        for key, v in zip(keys, reduced, strict=True):
            totals[key] += v / n_global
        tokens += n_global
        steps += 1
    out = {key: v / max(steps, 1) for key, v in totals.items()}
    out["grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
    out["train_tokens"] = tokens
    out["lr"] = lr
    return out
