"""The rollout/trainer log-prob mismatch: how far the generation engine's sampling log-probs are
from the trainer's log-probs of the same tokens, and truncated importance sampling (TIS) that
corrects the policy gradient for it.

Per generated token, delta = log pi_trainer_old(y) - log pi_engine(y). Recorded:
`logprob_diff_mean` / `logprob_diff_max` (|delta|), `rollout_kl` (the k3 estimate of
KL(pi_engine || pi_trainer_old)), and with `trainer.tis_cap` = C > 0 the weight
min(exp(delta), C) on each token's policy-gradient loss (`tis_weight_mean`, `tis_clip_frac`).
Sums are returned rather than means, so data-parallel shards add up to the global figures.
Why e != t and the estimators: docs/engines.md, "Design notes".

    OMP_NUM_THREADS=1 python benchmarks/bench_mismatch.py
"""

from __future__ import annotations

import torch

# the scalars `mismatch_sums` returns, summed over ranks (the max of |delta| is reduced apart)
SUM_KEYS = ("tokens", "abs_diff", "kl", "tis_weight", "tis_clipped")


def tis_weights(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_trainer_old / pi_engine, cap) per token, detached (exp overflow clamps to `cap`)."""
    return torch.exp(old_logprobs.detach() - engine_logprobs.detach()).clamp(max=cap)


def mismatch_sums(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                  tis_cap: float = 0.0) -> tuple[dict[str, float], float]:
    """Token sums over the loss-masked tokens ({key in SUM_KEYS: sum}) and the max |delta|
    (0 for no tokens). The TIS sums are 0 when `tis_cap` is 0 (off)."""
    mask = loss_mask.bool()
    old, engine = old_logprobs.double()[mask], engine_logprobs.double()[mask]
    delta = old - engine
    ratio = torch.exp(delta)
    sums = {"tokens": float(delta.numel()), "abs_diff": float(delta.abs().sum()),
            "kl": float((ratio - 1 - delta).sum()), "tis_weight": 0.0, "tis_clipped": 0.0}
    if tis_cap > 0:
        sums["tis_weight"] = float(tis_weights(old, engine, tis_cap).sum())
        sums["tis_clipped"] = float((ratio > tis_cap).sum())
    return sums, float(delta.abs().max()) if delta.numel() else 0.0


def mismatch_metrics(sums: dict[str, float], max_abs_diff: float, tis_cap: float = 0.0) -> dict[str, float]:
    """The metrics-row columns from (rank-reduced) `mismatch_sums`."""
    n = max(sums["tokens"], 1.0)
    out = {"logprob_diff_mean": sums["abs_diff"] / n, "logprob_diff_max": max_abs_diff, "rollout_kl": sums["kl"] / n}
    if tis_cap > 0:
        out["tis_weight_mean"] = sums["tis_weight"] / n
        out["tis_clip_frac"] = sums["tis_clipped"] / n
    return out
