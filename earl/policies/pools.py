"""Split a cluster into a rollout pool and a training pool (asynchronous, disaggregated RL).

In asynchronous RL (AReaL, verl's fully-async mode, slime) rollout engines generate on their
own GPUs while the trainer trains on the others; the slower pool sets the pace. This chooser
prices the given stage plans on every split (whole nodes) through the cost model's plan scorer
(the one the cost-model selector uses) at one or several points of the workload and keeps the
split whose slower pool is fastest in total, among those whose plans fit in memory at the most
points.

    python -c "from earl.policies.pools import choose_pool_split; help(choose_pool_split)"
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from earl.cost_model import CostModel
from earl.specs import Stage, StagePlan, WorkloadStats

from .selectors import PlanScorer


@dataclass(frozen=True, kw_only=True)
class PoolSplit:
    """A rollout / training split of the cluster and what the cost model predicts for it."""

    rollout_gpus: int  # GPUs running the rollout engines
    train_gpus: int  # GPUs running log-probs and training
    rollout_s: float  # predicted rollout time of the batches priced on the rollout pool, s
    train_s: float  # predicted log-probs + training time of those batches on the training pool, s
    period_s: float  # predicted seconds once the pipeline runs: the slower pool's, summed, s
    table: tuple[dict, ...] = ()  # every split priced: rollout_gpus, rollout_s, train_s, period_s


def choose_pool_split(cm: CostModel, plans: StagePlan, stats: WorkloadStats | Sequence[WorkloadStats],
                      gpus: int, *, granularity: int, logprob_passes: int = 2,
                      margin: float = 0.10) -> PoolSplit:
    """The split of `gpus` (in steps of `granularity` GPUs, e.g. a node) minimising the slower
    pool's predicted time per batch, summed over `stats` (one workload, or several points of a
    run whose context grows: the split is fixed for the run). `plans` may leave dp open (-1): it
    fills each pool. Splits whose plans fit in memory at more points come first; ValueError when
    no split fits at any point."""
    points = [stats] if isinstance(stats, WorkloadStats) else list(stats)
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
        ro_scorer = PlanScorer(cm, r, logprob_passes=logprob_passes)
        train_scorer = PlanScorer(cm, t, logprob_passes=logprob_passes)
        rollout_s = train_s = period = 0.0
        misfits = 0  # points where a plan does not fit: they count first, then time where all fit
        for st in points:
            ctx = dict(ctx_tput=st.context_mean, ctx_mem=st.context_max, margin=margin)
            a = ro_scorer.score(Stage.ROLLOUT, ro, st, **ctx).stage_time_s
            b = (train_scorer.score(Stage.EXPERIENCE, ex, st, **ctx).stage_time_s
                 + train_scorer.score(Stage.TRAIN, tr, st, **ctx).stage_time_s)
            if not math.isfinite(a + b):
                misfits += 1
                continue
            rollout_s, train_s, period = rollout_s + a, train_s + b, period + max(a, b)
        rows.append({"rollout_gpus": r, "rollout_s": rollout_s, "train_s": train_s, "period_s": period,
                     "points_not_fitting": misfits})
        if misfits < len(points) and (best is None or (misfits, period) < best[0]):
            best = ((misfits, period), r, rollout_s, train_s)
    if best is None:
        raise ValueError(f"no rollout/training split of {gpus} GPUs fits plans rollout "
                         f"{plans.rollout.short()}, experience {plans.experience.short()}, train "
                         f"{plans.train.describe()} in memory at "
                         f"{max(st.context_max for st in points):,.0f} tokens")
    _, r, rollout_s, train_s = best
    return PoolSplit(rollout_gpus=r, train_gpus=gpus - r, rollout_s=rollout_s, train_s=train_s,
                     period_s=best[0][1], table=tuple(rows))
