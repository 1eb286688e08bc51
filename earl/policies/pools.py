"""Split a cluster into a rollout pool and a training pool (asynchronous, disaggregated RL).

In asynchronous RL (AReaL, verl's fully-async mode, slime) rollout engines generate on their
own GPUs while the trainer trains on the others; the slower pool sets the pace. This chooser
prices the given stage plans on every split (whole nodes) through the cost model's plan scorer
(the one the cost-model selector uses) and keeps the split whose slower pool is fastest, among
those whose plans fit in memory.

    python -c "from earl.policies.pools import choose_pool_split; help(choose_pool_split)"
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from earl.cost_model import CostModel
from earl.specs import Stage, StagePlan, WorkloadStats

from .selectors import PlanScorer


@dataclass(frozen=True, kw_only=True)
class PoolSplit:
    """A rollout / training split of the cluster and what the cost model predicts for it."""

    rollout_gpus: int  # GPUs running the rollout engines
    train_gpus: int  # GPUs running log-probs and training
    rollout_s: float  # predicted rollout time of one batch on the rollout pool, s
    train_s: float  # predicted log-probs + training time of one batch on the training pool, s
    table: tuple[dict, ...] = ()  # every split priced: rollout_gpus, rollout_s, train_s, period_s

    @property
    def period_s(self) -> float:
        """Predicted seconds per step once the pipeline runs: the slower pool's time."""
        return max(self.rollout_s, self.train_s)


def choose_pool_split(cm: CostModel, plans: StagePlan, stats: WorkloadStats, gpus: int, *,
                      granularity: int, logprob_passes: int = 2, margin: float = 0.10) -> PoolSplit:
    """The split of `gpus` (in steps of `granularity` GPUs, e.g. a node) minimising the slower
    pool's predicted time per batch of `stats.num_responses` episodes. `plans` may leave dp
    open (-1): it fills each pool. Raises ValueError when no split fits."""
    if granularity < 1 or gpus < 2 * granularity:
        raise ValueError(f"cannot split {gpus} GPUs into two pools of whole {granularity}-GPU steps")
    rows, best = [], None
    for r in range(granularity, gpus - granularity + 1, granularity):
        t = gpus - r
        try:
            ro = plans.rollout.resolve(r)
            ex, tr = plans.experience.resolve(t), plans.train.resolve(t)
        except ValueError:
            continue
        ctx = dict(ctx_tput=stats.context_mean, ctx_mem=stats.context_max, margin=margin)
        s_ro = PlanScorer(cm, r, logprob_passes=logprob_passes).score(Stage.ROLLOUT, ro, stats, **ctx)
        train_scorer = PlanScorer(cm, t, logprob_passes=logprob_passes)
        s_ex = train_scorer.score(Stage.EXPERIENCE, ex, stats, **ctx)
        s_tr = train_scorer.score(Stage.TRAIN, tr, stats, **ctx)
        rollout_s, train_s = s_ro.stage_time_s, s_ex.stage_time_s + s_tr.stage_time_s
        period = max(rollout_s, train_s)
        rows.append({"rollout_gpus": r, "rollout_s": rollout_s, "train_s": train_s, "period_s": period})
        if math.isfinite(period) and (best is None or period < best.period_s):
            best = PoolSplit(rollout_gpus=r, train_gpus=t, rollout_s=rollout_s, train_s=train_s)
    if best is None:
        raise ValueError(f"no rollout/training split of {gpus} GPUs fits plans rollout "
                         f"{plans.rollout.short()}, experience {plans.experience.short()}, train "
                         f"{plans.train.describe()} in memory at {stats.context_max:,.0f} tokens")
    return PoolSplit(rollout_gpus=best.rollout_gpus, train_gpus=best.train_gpus, rollout_s=best.rollout_s,
                     train_s=best.train_s, table=tuple(rows))
