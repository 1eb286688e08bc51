"""Enumerate every valid ParallelPlan for a stage and rank them by predicted throughput.

    earl plan train --model qwen2.5-72b --hardware h100-sxm-80gb --gpus 1024 --batch 512 --context 16384
"""

from __future__ import annotations

import math

from earl.cost_model.model import CostModel, Estimate
from earl.specs import RECOMPUTE_MODES, ModelSpec, ParallelPlan

PLAN_STAGES = ("prefill", "decode", "logprob", "train")
MICRO_BATCHES = (1, 2, 4, 8)
CP_DEGREES = (1, 2, 4, 8, 16)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_plans(stage: str, model: ModelSpec, gpus: int, context: int | None = None,
                    gpus_per_node: int | None = None) -> list[ParallelPlan]:
    """All plans for `stage` on `gpus` GPUs that satisfy the model's divisibility rules.

    Rollout (prefill/decode): tp x dp, tp dividing the heads (and the node, if given).
    Log-probs: tp x pp x dp x micro-batch. Training: tp x pp x cp x dp x micro-batch x
    recompute x sharded optimizer x interleaving (1 or 2 model chunks per pipeline rank)."""
    if stage not in PLAN_STAGES:
        raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(PLAN_STAGES)}")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    tps = [t for t in _divisors(gpus) if model.num_heads % t == 0 and model.ffn_hidden % t == 0
           and (gpus_per_node is None or t <= gpus_per_node)]
    plans = []
    if stage in ("prefill", "decode"):
        return [ParallelPlan(tp=t, dp=gpus // t) for t in tps]
    pps = [p for p in _divisors(gpus) if p <= model.num_layers and model.num_layers % p == 0]
    cps = CP_DEGREES if stage == "train" else (1,)
    for t in tps:
        for p in pps:
            for c in cps:
                mp = t * p * c
                if gpus % mp or (context is not None and context % c):
                    continue
                dp = gpus // mp
                for mb in MICRO_BATCHES:
                    if stage == "logprob":
                        plans.append(ParallelPlan(tp=t, pp=p, cp=c, dp=dp, micro_batch=mb))
                        continue
                    # interleaved 1F1B with 2 chunks per pipeline rank where the layers split evenly
                    vs = (1, 2) if p > 1 and model.num_layers % (2 * p) == 0 else (1,)
                    for rc in RECOMPUTE_MODES:
                        for zero in ((False, True) if dp * c > 1 else (False,)):
                            for v in vs:
                                plans.append(ParallelPlan(tp=t, pp=p, cp=c, dp=dp, micro_batch=mb, recompute=rc,
                                                          sharded_optimizer=zero, virtual_stages=v))
    return plans


def rank_plans(cm: CostModel, stage: str, gpus: int, batch: int, context: int,
               top: int | None = None) -> list[tuple[ParallelPlan, Estimate]]:
    """Every plan's estimate, feasible ones first by throughput (tokens/s/GPU), then the
    infeasible ones (with their reasons)."""
    plans = enumerate_plans(stage, cm.model, gpus, context, cm.cluster.gpus_per_node)
    if stage == "train":
        # a micro-batch larger than a replica's share of the batch is the same as the share
        plans = [p for p in plans if p.micro_batch <= max(1, math.ceil(batch / p.dp))]
    scored = [(p, cm.estimate(stage, p, batch, context)) for p in plans]
    scored.sort(key=lambda pe: (not pe[1].feasible, -pe[1].tokens_per_gpu_s, pe[0].world_size))
    return scored[:top] if top else scored
