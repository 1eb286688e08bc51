"""The policy-gradient loss variants, as pure functions of [n, t] tensors (n sequences of t
positions; `mask` marks the generated tokens a loss counts), so each can be checked against
hand-computed values. `earl.runtime.trainer.Trainer.backward` composes them:

    ratio  = policy_ratio(lp, old, mask, level)                   token (PPO/GRPO) | sequence (GSPO)
    pg     = clipped_pg(ratio, adv, eps_low, eps_high, dual_clip)  clip-higher, dual-clip
    loss   = sum(pg * token_weights(mask, aggregation)) / loss_denominator(...)
    kl     = kl_estimate(lp, ref, "k1" | "k2" | "k3")

and `uniform_groups` names the prompt groups whose rewards are all equal (dynamic sampling
drops them: their group-relative advantages are 0 and they only dilute the batch).
docs/losses.md maps each setting to the paper and to TRL's GRPOTrainer.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_losses.py
"""

from __future__ import annotations

import torch

from earl.runtime.run_config import AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS


def policy_ratio(lp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, level: str = "token") -> torch.Tensor:
    """pi / pi_old per token [n, t]: exp(lp - old) ("token"), or GSPO's sequence ratio
    exp(mean over the sequence's masked tokens of (lp - old)) broadcast over its positions
    ("sequence"; the gradient flows to every token through the mean)."""
    log_ratio = lp - old
    if level == "token":
        return torch.exp(log_ratio)
    if level != "sequence":
        raise ValueError(f"ratio level {level!r} unknown; valid: {', '.join(RATIO_LEVELS)}")
    m = mask.to(lp.dtype)
    seq = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return torch.exp(seq)[:, None].expand_as(lp)


def clipped_pg(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float,
               dual_clip: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token policy-gradient loss, clipped) of PPO's clipped surrogate with the ratio kept in
    [1 - eps_low, 1 + eps_high] (eps_high > eps_low: DAPO's clip-higher). `dual_clip` c > 1 caps
    the loss of a negative-advantage token at -c * adv (Ye et al. 2020), so a huge ratio cannot
    blow it up; 0 = off. `clipped` marks tokens whose ratio lies outside the clip range."""
    pg = -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    if dual_clip:
        pg = torch.where(adv < 0, torch.minimum(pg, -dual_clip * adv), pg)
    d = ratio.detach() - 1
    return pg, (d > eps_high) | (d < -eps_low)


def kl_estimate(lp: torch.Tensor, ref: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi, with d = ref - lp:
    k1 = -d (unbiased, can be negative), k2 = d^2 / 2 (biased, >= 0), k3 = exp(d) - d - 1
    (unbiased, >= 0; GRPO's choice)."""
    d = ref - lp
    if estimator == "k3":
        return torch.exp(d) - d - 1
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k1":
        return -d
    raise ValueError(f"KL estimator {estimator!r} unknown; valid: {', '.join(KL_ESTIMATORS)}")


def token_weights(mask: torch.Tensor, aggregation: str = "token") -> torch.Tensor:
    """Per-token weights [n, t] of the loss sum: the mask, or for "sequence" the mask over the
    sequence's token count (each sequence then adds its token mean)."""
    m = mask.float()
    if aggregation in ("token", "constant"):
        return m
    if aggregation != "sequence":
        raise ValueError(f"loss aggregation {aggregation!r} unknown; valid: {', '.join(AGGREGATIONS)}")
    return m / m.sum(-1, keepdim=True).clamp(min=1.0)


def loss_denominator(aggregation: str, total_tokens: float, total_seqs: float, constant_tokens: int = 0) -> float:
    """What the weighted token sum of the whole global (mini)batch is divided by: its loss
    tokens ("token"), its sequences ("sequence"), or sequences x `constant_tokens` ("constant")."""
    if aggregation == "token":
        return total_tokens
    if aggregation == "sequence":
        return total_seqs
    if aggregation == "constant":
        return total_seqs * constant_tokens
    raise ValueError(f"loss aggregation {aggregation!r} unknown; valid: {', '.join(AGGREGATIONS)}")


def uniform_groups(group_ids: list[int], rewards: list[float]) -> set[int]:
    """The groups whose rewards are all equal (exactly), given each episode's group and reward."""
    seen: dict[int, set[float]] = {}
    for g, r in zip(group_ids, rewards, strict=True):
        seen.setdefault(g, set()).add(float(r))
    return {g for g, rs in seen.items() if len(rs) == 1}
