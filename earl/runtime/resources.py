"""Resources checked before anything is built: the run's memory (weights, gradients, optimizer
states, a reference copy, activations and logits of one training micro-batch) estimated from the
model's shapes and compared with the free memory of the device the ranks run on, so a model that
cannot fit is refused in one line with the numbers and a suggestion, instead of being built until
the kernel's out-of-memory killer ends the process.

The training terms are a lower bound of what the runtime allocates (the engine's buffers and
allocator slack come on top): the cost model's training account in the runtime's precision
(earl.cost_model.memory.train_memory). Rollout (the built-in engines; vLLM sizes its own cache)
adds one step's KV cache and the trajectories' per-token records (episodes in flight x tokens x the model's KV
bytes per token): at least each episode's first cache slot (the `pytorch` engine preallocates
INITIAL_CAPACITY tokens per episode), which is refused with the numbers and the knobs
(sampling.max_context, engine_batch, groups) before the first step when it cannot fit; at most
every episode at `sampling.max_context`, which is a one-line warning when it cannot (episodes
are usually far shorter than max_context, so that alone does not refuse a run).

    python -c "from earl.runtime.resources import estimate_bytes; from earl.runtime.run_config import \
RunConfig; from earl.specs import ModelSpec; print(estimate_bytes(RunConfig(), \
ModelSpec.from_name('qwen2.5-72b'), 1))"
"""

from __future__ import annotations

import os
import sys

from earl.cost_model.memory import runtime_precision, train_memory
from earl.specs import DTYPE_BYTES, ModelSpec, ParallelPlan

GIB = 2**30
_WARNED: set[str] = set()
LOCAL_ROLLOUT = ("pytorch", "pytorch-static")  # engines whose KV cache is the runtime's (vLLM sizes its own)
TRAJECTORY_BYTES_PER_TOKEN = 16  # a token's id (int64), log-prob (fp32) and mask/reward bookkeeping


def estimate_bytes(cfg, spec: ModelSpec, world: int, *, per_device: bool = False) -> dict[str, float]:
    """Bytes all `world` ranks of this host hold together, by component (and "total"); with
    `per_device` (GPU runs), what one rank holds on its device. Weights are counted once per rank
    (each rank builds the model before sharding it), optimizer states (fp32 AdamW moments, and
    fp32 masters for a low-precision model) once overall when sharded, once per rank otherwise;
    the terms are the cost model's training account (earl.cost_model.memory.train_memory) in the
    runtime's precision for one whole copy; rollout at its lower bound."""
    sharded = world > 1
    ranks = 1 if per_device else world
    tokens = max(1, min(cfg.trainer.token_budget, cfg.sampling.max_context))
    one = train_memory(spec, ParallelPlan(), tokens, 0.0, 0.0,  # one rank's whole copy, the runtime's account
                       precision=runtime_precision(DTYPE_BYTES.get(cfg.model.dtype, 4)))
    out = {
        "weights": ranks * one.weights,
        "reference": ranks * one.weights if cfg.trainer.kl_coef else 0.0,
        "grads": ranks * one.grads,
        "optimizer": (1 if sharded or per_device else world) * one.optimizer,
        "activations": ranks * one.activations,
        "logits": ranks * one.logits,
    }
    if cfg.engine in LOCAL_ROLLOUT:
        out.update(rollout_bytes(cfg, spec, world, per_device=per_device, at_most=False))
    out["total"] = sum(out.values())
    return out


def rollout_bytes(cfg, spec: ModelSpec, world: int, *, per_device: bool, at_most: bool) -> dict[str, float]:
    """One step's KV cache and trajectory records (all of this host's ranks, or one device's
    share): every episode at sampling.max_context (`at_most`), else at its first cache slot (the
    `pytorch` engine's preallocation; the static engine's cache grows from nothing)."""
    episodes, in_flight = cfg.episodes_per_step, _in_flight(cfg, world)
    share = world if per_device else 1
    tokens = cfg.sampling.max_context if at_most else _first_slot(cfg)
    return {"kv_cache": in_flight * tokens * kv_bytes_per_token(cfg, spec) / share,
            "trajectories": episodes * tokens * TRAJECTORY_BYTES_PER_TOKEN / share}


def _in_flight(cfg, world: int) -> int:
    return min(cfg.episodes_per_step, cfg.engine_batch * world) if cfg.engine_batch else cfg.episodes_per_step


def _first_slot(cfg) -> int:
    from earl.runtime.engine.pytorch import INITIAL_CAPACITY

    return min(cfg.sampling.max_context, INITIAL_CAPACITY) if cfg.engine == "pytorch" else 0


def kv_bytes_per_token(cfg, spec: ModelSpec) -> int:
    """K and V of one token over all layers, in the run's dtype."""
    return 2 * spec.num_layers * spec.kv_dim * DTYPE_BYTES.get(cfg.model.dtype, 4)


def _rollout_line(cfg, spec, world: int, need: dict, model: float, what: str, available: float, at_most: bool):
    per_episode = f"sampling.max_context {cfg.sampling.max_context}" if at_most else \
        f"a first cache slot of {_first_slot(cfg)}"
    return (f"one rollout step needs {'up to' if at_most else 'at least'} {sum(need.values()) / GIB:.1f} GiB "
            f"(KV cache {need['kv_cache'] / GIB:.1f} GiB: {_in_flight(cfg, world)} episodes in flight x "
            f"{per_episode} tokens x {kv_bytes_per_token(cfg, spec) / 1024:.1f} KiB per token; trajectories "
            f"{need['trajectories'] / GIB:.1f} GiB) on top of {model / GIB:.1f} GiB for the model, but {what} is "
            f"{available / GIB:.1f} GiB; lower sampling.max_context, set engine_batch (episodes decoded at once), "
            "or fewer groups")


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
    per_device = device.startswith("cuda")
    est = estimate_bytes(cfg, spec, world, per_device=per_device)
    if available is None:
        got = available_bytes(device)
        if got is None:
            return est
        available, what = got
    else:
        what = "available memory"
    low = {k: est[k] for k in ("kv_cache", "trajectories") if k in est}
    model = est["total"] - sum(low.values())
    if low and model <= available < est["total"]:
        raise ValueError(_rollout_line(cfg, spec, world, low, model, what, available, at_most=False))
    if low and model <= available:
        high = rollout_bytes(cfg, spec, world, per_device=per_device, at_most=True)
        line = _rollout_line(cfg, spec, world, high, model, what, available, at_most=True)
        if model + sum(high.values()) > available and line not in _WARNED:
            _WARNED.add(line)
            print(f"earl run: warning: {line}", file=sys.stderr, flush=True)
    if est["total"] > available:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in est.items() if k != "total" and v >= 0.05 * GIB)
        raise ValueError(
            f"model {spec.name!r} ({spec.num_params / 1e9:.2f}B parameters, {cfg.model.dtype}) needs at least "
            f"{est['total'] / GIB:.1f} GiB for {world} process{'es' if world > 1 else ''} ({parts} GiB) but "
            f"{what} is {available / GIB:.1f} GiB; choose a smaller model, a lower trainer.token_budget, "
            f"dtype bf16, or a machine with more memory")
    return est


__all__ = ["available_bytes", "check_resources", "estimate_bytes", "kv_bytes_per_token", "rollout_bytes"]
