"""Resources checked before anything is built: the run's memory (weights, gradients, optimizer
states, a reference copy, activations and logits of one training micro-batch) estimated from the
model's shapes and compared with the free memory of the device the ranks run on, so a model that
cannot fit is refused in one line with the numbers and a suggestion, instead of being built until
the kernel's out-of-memory killer ends the process.

The estimate is a lower bound of what the runtime allocates (the KV cache of rollout, the engine's
buffers and allocator slack come on top), so a refusal is never a false alarm of the formula; the
activation term is the cost model's (earl.cost_model.memory), in the runtime's dtype.

    python -c "from earl.runtime.resources import estimate_bytes; from earl.runtime.config import \
RunConfig; from earl.specs import ModelSpec; print(estimate_bytes(RunConfig(), \
ModelSpec.from_name('qwen2.5-72b'), 1))"
"""

from __future__ import annotations

import os

from earl.cost_model.memory import korthikanti_activation_bytes
from earl.specs import DTYPE_BYTES, ModelSpec

GIB = 2**30


def estimate_bytes(cfg, spec: ModelSpec, world: int) -> dict[str, float]:
    """Bytes all `world` ranks of this host hold together, by component (and "total"). Weights
    are counted once per rank (each rank builds the model before sharding it), optimizer states
    (AdamW: two per parameter) once overall when sharded, once per rank otherwise."""
    dtype_bytes = DTYPE_BYTES.get(cfg.model.dtype, 4)
    params = spec.num_params
    sharded = world > 1
    tokens = max(1, min(cfg.trainer.token_budget, cfg.sampling.max_context))
    act = korthikanti_activation_bytes(tokens, 1, spec.hidden_size, spec.num_heads, 1, False, "selective")
    out = {
        "weights": world * params * dtype_bytes,
        "reference": world * params * dtype_bytes if cfg.trainer.kl_coef else 0.0,
        "grads": world * params * dtype_bytes,
        "optimizer": (1 if sharded else world) * 2 * params * dtype_bytes,
        "activations": world * act * spec.num_layers * dtype_bytes / 2,  # Korthikanti counts 2-byte values
        "logits": world * 2 * tokens * spec.vocab_size * 4,
    }
    out["total"] = sum(out.values())
    return out


def available_bytes(device: str) -> tuple[float, str] | None:
    """(free bytes, what was measured) on `device`, or None when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return float(free), f"free memory of {device}"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024, "available host memory"
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")), "free host memory"
    except (ValueError, OSError):
        return None


def check_resources(cfg, spec: ModelSpec, world: int, *, available: float | None = None) -> dict[str, float]:
    """ValueError with the numbers and a suggestion when the estimate exceeds the free memory
    (`available`, else measured); the estimate otherwise. GPU runs: per device, one rank each."""
    device = str(cfg.model.device)
    est = estimate_bytes(cfg, spec, world if not device.startswith("cuda") else 1)
    if available is None:
        got = available_bytes(device)
        if got is None:
            return est
        available, what = got
    else:
        what = "available memory"
    if est["total"] > available:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in est.items() if k != "total" and v >= 0.05 * GIB)
        raise ValueError(
            f"model {spec.name!r} ({spec.num_params / 1e9:.2f}B parameters, {cfg.model.dtype}) needs at least "
            f"{est['total'] / GIB:.1f} GiB for {world} process{'es' if world > 1 else ''} ({parts} GiB) but "
            f"{what} is {available / GIB:.1f} GiB; choose a smaller model, a lower trainer.token_budget, "
            f"dtype bf16, or a machine with more memory")
    return est


__all__ = ["available_bytes", "check_resources", "estimate_bytes"]
