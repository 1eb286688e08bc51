"""Parallelize the training model on a device mesh, torchtitan's way: build the module, then
apply tensor parallelism (DTensor `parallelize_module`, every training plan with tp > 1), then
activation checkpointing, then FSDP2 (`fully_shard`) over the plan's dp dimension (plans with
`zero` and dp > 1: `uses_fsdp`). The model code never knows. A training plan without `zero` is
replicated over dp (optim.ReplicatedAdamW all-reduces its gradients); the rollout engine's and
the log-prob copies keep the hand-written TP of earl.runtime.tp.

Layouts stay earl.parallel's, so re-shard plans, checkpoints and the optimizer-state export keep
working; how TP, FSDP2 and checkpointing line up with them: docs/runtime.md, "Design notes".

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_fsdp.py
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from earl.parallel import ParamShape, build_mesh
from earl.runtime.tp import COLWISE, ROWWISE, check_tp, local_heads
from earl.specs import ParallelPlan

AC_EVERY = {"none": 0, "selective": 2, "full": 1}  # checkpoint every k-th decoder layer


def uses_fsdp(plan: ParallelPlan) -> bool:
    """A training plan runs on FSDP2 when it shards optimizer state over dp > 1 (`zero`)."""
    return plan.sharded_optimizer and plan.dp > 1


def fsdp_shard_error(plan: ParallelPlan, shapes: dict[str, ParamShape]) -> str:
    """'' if FSDP2 can shard every tensor of a `uses_fsdp` plan, else why not (one line). FSDP2
    pads an uneven dim 0 but refuses uneven sharding on any other dim ("does not support uneven
    sharding on dim 1"): a tensor whose `shard_dim` is not 0 (the row-parallel o/down weights,
    cut along their input features) needs dp to divide its size there on each tp rank."""
    if not uses_fsdp(plan):
        return ""
    sizes = {n: s.shape[s.shard_dim] // plan.tp for n, s in shapes.items() if s.shard_dim != 0}
    bad = next(((n, k) for n, k in sizes.items() if k % plan.dp), None)
    if bad is None:
        return ""
    common = math.gcd(*sizes.values())
    valid = [str(d) for d in range(1, common + 1) if common % d == 0]
    shown = ", ".join(valid[:12])
    if len(valid) > 12:
        shown += f", ... ({len(valid)} values: the divisors of {common})"
    name, size = bad
    return (f"FSDP2 cannot shard {name} ({size} along dim {shapes[name].shard_dim} per tp rank) over dp={plan.dp}: "
            f"it refuses uneven sharding on dims other than 0; valid dp with tp={plan.tp} and `zero`: "
            f"{shown} (or drop `zero`)")


def uses_dtensor(plan: ParallelPlan) -> bool:
    """The training model of `plan` holds DTensor parameters (DTensor TP or FSDP2): its stages
    run on hand-written copies (earl.runtime.tp), never on the training module itself."""
    return plan.tp > 1 or uses_fsdp(plan)


def apply_dtensor_tp(model: nn.Module, tp_mesh) -> nn.Module:
    """Megatron layout with DTensor styles; the attention reshapes with -1 heads, so it runs on
    its local heads (outputs are local tensors)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    check_tp(model.config, tp)
    for layer in model.model.layers:
        styles = {}
        for parent in ("self_attn", "mlp"):
            for name in COLWISE + ROWWISE:
                if getattr(getattr(layer, parent), name, None) is not None:
                    styles[f"{parent}.{name}"] = ColwiseParallel() if name in COLWISE else RowwiseParallel()
        parallelize_module(layer, tp_mesh, styles)
        local_heads(layer.self_attn, tp)
    return model


def _checkpointed(forward, *args, **kwargs):
    if torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def apply_ac(model: nn.Module, recompute: str) -> nn.Module:
    """Activation checkpointing per decoder layer for the plan's `recompute` mode."""
    if recompute not in AC_EVERY:
        raise ValueError(f"recompute {recompute!r}; valid: {', '.join(AC_EVERY)}")
    every = AC_EVERY[recompute]
    if every:
        for i, layer in enumerate(model.model.layers):
            if i % every == 0:
                layer.forward = functools.partial(_checkpointed, layer.forward)
    return model


def apply_fsdp(model: nn.Module, dp_mesh, shapes: dict[str, ParamShape], compute_dtype: torch.dtype) -> nn.Module:
    """FSDP2 over `dp_mesh`: each decoder layer is a unit, the root holds the rest (embeddings,
    final norm and the head, tied or not). Parameters must be fp32 (they become the masters)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    dim_of = {id(p): shapes[n].shard_dim for n, p in model.named_parameters()}
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    kw = {"mesh": dp_mesh, "mp_policy": mp, "shard_placement_fn": lambda p: Shard(dim_of[id(p)])}
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def parallelize(model: nn.Module, plan: ParallelPlan, shapes: dict[str, ParamShape], *,
                device_type: str = "cpu") -> nn.Module:
    """The training model of any plan: DTensor TP (tp > 1), activation checkpointing, and for a
    `uses_fsdp` plan FSDP2 over dp with fp32 sharded masters and compute in the model's dtype
    (its optimizer: `FSDPAdamW`). Other plans keep the model's dtype and are replicated over dp
    (`ReplicatedAdamW`). Collective when tp > 1 or dp > 1."""
    if not uses_fsdp(plan):
        if plan.tp > 1:
            apply_dtensor_tp(model, build_mesh(plan, device_type=device_type)["tp"])
        return apply_ac(model, plan.recompute)
    compute_dtype = next(model.parameters()).dtype
    mesh = build_mesh(plan, device_type=device_type)
    model = model.float()
    if plan.tp > 1:
        apply_dtensor_tp(model, mesh["tp"])
    apply_ac(model, plan.recompute)
    return apply_fsdp(model, mesh["dp"], shapes, compute_dtype)
