"""Tensor parallelism for already-built HF Qwen2 / Llama models (the model code never knows).

`apply_tp(model, groups)` swaps each decoder layer's projections for sharded linears holding
only this rank's slice (Megatron layout: q/k/v and gate/up column-parallel, o and down
row-parallel with one all_reduce). Parameter names are unchanged, so state dicts, re-shard
plans and checkpoints name the same tensors with and without TP. Training shards with DTensor
instead (earl.runtime.parallelize); these layers serve the copies that never train (the rollout
engine's, the log-prob copy, the KL reference), where DTensor's per-op cost is too high for
tiny decode passes. Why, and what DTensor costs: docs/runtime.md, "Design notes".

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m pytest -q tests/runtime/test_dist_tp.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from earl.parallel import ParamShape, check_tp_divides, shard_bounds

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all_reduce of the input gradient backward (Megatron's f)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """all_reduce forward; identity backward (Megatron's g)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ShardedLinear(nn.Module):
    """A linear layer holding this rank's shard of the weight (and bias) and its TP group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group = group


class ColwiseLinear(_ShardedLinear):
    """y_local = x @ W[rows of this rank].T (+ b[rows]); output stays sharded."""

    def forward(self, x):
        if torch.is_grad_enabled() and self.group is not None:
            x = _CopyToTP.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowwiseLinear(_ShardedLinear):
    """y = all_reduce(x_local @ W[:, cols of this rank].T) (+ b once, after the sum)."""

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.group is not None:
            y = _ReduceFromTP.apply(y, self.group)
        return y + self.bias if self.bias is not None else y


def _shard(t: torch.Tensor, dim: int, tp: int, rank: int) -> torch.Tensor:
    lo, hi = shard_bounds(t.shape[dim], tp, rank)
    return t.narrow(dim, lo, hi - lo).detach().clone()


def tp_dims(model: nn.Module) -> dict[str, int | None]:
    """Parameter name -> dim it is split along under TP (None: replicated)."""
    out = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        leaf = parts[-2] if len(parts) >= 2 else ""
        if leaf in COLWISE:
            out[name] = 0  # weight rows and bias entries are output features
        elif leaf in ROWWISE:
            out[name] = 1 if parts[-1] == "weight" else None
        else:
            out[name] = None
    return out


def param_shapes(model: nn.Module, tp: int = 1) -> dict[str, ParamShape]:
    """Full (unsharded) shapes of a model's parameters, given it is sharded `tp` ways now."""
    dims = tp_dims(model)
    out = {}
    for name, p in model.named_parameters():
        shape = list(p.shape)
        if dims[name] is not None:
            shape[dims[name]] *= tp
        out[name] = ParamShape(shape=tuple(shape), tp_dim=dims[name], itemsize=p.element_size())
    return out


def check_tp(config, tp: int) -> None:
    """earl.parallel's tp check on an HF config: whole heads, key/value heads and MLP columns."""
    heads = config.num_attention_heads
    check_tp_divides(tp, num_heads=heads, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                     ffn_hidden=config.intermediate_size)


def apply_tp(model: nn.Module, tp: int, tp_rank: int, group) -> nn.Module:
    """Shard `model` in place for rank `tp_rank` of a `tp`-way group; returns it."""
    if tp == 1:
        return model
    check_tp(model.config, tp)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in COLWISE + ROWWISE:
                lin = getattr(parent, name, None)
                if lin is None:
                    continue
                bias = lin.bias.detach() if lin.bias is not None else None
                if name in COLWISE:
                    new = ColwiseLinear(_shard(lin.weight.detach(), 0, tp, tp_rank),
                                        _shard(bias, 0, tp, tp_rank) if bias is not None else None,
                                        group)
                else:
                    new = RowwiseLinear(_shard(lin.weight.detach(), 1, tp, tp_rank),
                                        bias.clone() if bias is not None else None, group)
                setattr(parent, name, new)
        local_heads(layer.self_attn, tp)
    return model


def local_heads(attn: nn.Module, tp: int) -> None:
    """Head counts an attention module keeps (older HF versions) become its local ones."""
    for attr in ("num_heads", "num_key_value_heads"):
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, getattr(attn, attr) // tp)


def shard_state_dict(full: dict[str, torch.Tensor], dims: dict[str, int | None], tp: int,
                     tp_rank: int) -> dict[str, torch.Tensor]:
    """This tp rank's slices of a full state dict."""
    return {k: (_shard(v, dims[k], tp, tp_rank) if dims.get(k) is not None else v)
            for k, v in full.items()}
