"""Explain a selector's decision for given workload statistics (what `earl plan --selector`
shows): the chosen plan, whether it switched, why, and the predicted numbers behind it.

    python -c "from earl.policies.explain import demo; demo('cost-model')"
"""

from __future__ import annotations

from collections.abc import Sequence

from earl.policies.registry import make_selector
from earl.policies.types import Decision
from earl.specs import ParallelPlan, Stage, StagePlan, WorkloadStats


def explain_selection(selector_name: str, cost_model, stage: Stage | str, stats: WorkloadStats,
                      current: ParallelPlan, *, history: Sequence[WorkloadStats] = (),
                      **options) -> Decision:
    """One decision of `selector_name` for `stage` given `stats`, starting from `current`
    (its GPU count is the stage's; -1 degrees are not allowed here). `history`: earlier steps'
    stats, fed first so the cost-model selector sees the context trend. A one-shot explanation
    has no earlier calls to confirm a switch, so the cost-model selector's `patience` defaults
    to 1 here (pass `patience=` to change it)."""
    stage = Stage(stage)
    if current.world_size < 1 or -1 in (current.tp, current.pp, current.dp, current.cp):
        raise ValueError(f"current plan {current.short()} must have explicit degrees")
    if selector_name == "cost-model":
        options.setdefault("patience", 1)
    if selector_name == "earl-table":
        options.setdefault("profile_batch", stats.num_responses)
    initial = StagePlan(rollout=current, experience=current, train=current)
    selector = make_selector(selector_name, cost_model=cost_model, initial=initial,
                             stage_gpus=current.world_size, **options)
    for past in history:
        selector.select(stage, past, current)
    return selector.select(stage, stats, current)


STAGE_OF = {"decode": Stage.ROLLOUT, "prefill": Stage.ROLLOUT, "logprob": Stage.EXPERIENCE,
            "train": Stage.TRAIN}  # cost-model stage -> the RL stage a selector plans


def explain_for_ranking(selector_name: str, cost_model, stage: str, gpus: int, batch: int, context: int,
                        ranked: list, *, current: str | None = None, context_p95: int | None = None,
                        context_max: int | None = None) -> Decision:
    """`earl plan --selector`: the selector's decision for the cost-model `stage`, starting from
    `current` (default: the slowest feasible plan of `ranked`, so the selector has something to
    improve on). p95 / max context default to 1.5 x and 2 x `context`."""
    if current:
        cur = ParallelPlan.parse(current).resolve(gpus)
    else:
        feasible = [p for p, e in ranked if e.feasible]
        cur = feasible[-1] if feasible else ranked[0][0]
    stats = WorkloadStats(num_responses=batch, context_mean=context,
                          context_p95=context_p95 or int(1.5 * context), context_max=context_max or 2 * context)
    return explain_selection(selector_name, cost_model, STAGE_OF[stage], stats, cur)


def decision_dict(decision: Decision) -> dict:
    return {"plan": decision.plan.describe(), "switched": decision.switched, "reason": decision.reason,
            "predicted": decision.predicted}


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) and abs(v) >= 1000:
        return f"{v:,}"
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}"
    return str(v)


def format_decision(decision: Decision) -> str:
    """A plain-text block: the decision, its reason, the predicted figures, and (cost-model)
    the top alternatives as a table."""
    p = decision.predicted
    lines = [f"{decision.stage.value}: {decision.plan.describe()}"
             f"{'  (switched)' if decision.switched else ''}",
             f"  reason: {decision.reason}"]
    scalars = [(k, v) for k, v in p.items() if not isinstance(v, (dict, list)) and v != ""]
    width = max((len(k) for k, _ in scalars), default=0)
    lines += [f"  {k:<{width}}  {_fmt(v)}" for k, v in scalars]
    if isinstance(p.get("current"), dict):
        c = p["current"]
        lines.append(f"  current plan {c['plan']}: {_fmt(c['tokens_per_gpu_s'])} tokens/s/GPU, "
                     f"{c['memory_frac']:.0%} memory"
                     + (f", {c['infeasible_reason']}" if c["infeasible_reason"] else ""))
    cands = p.get("candidates") or []
    if cands:
        head = f"  {'candidate':<34} {'tok/s/GPU':>10} {'stage s':>9} {'mem':>5} {'reshard s':>9}"
        lines += ["", head, "  " + "-" * (len(head) - 2)]
        for c in cands:
            lines.append(f"  {c['plan']:<34} {c['tokens_per_gpu_s']:>10,.0f} {c['stage_time_s']:>9.3g} "
                         f"{c['memory_frac']:>5.0%} {c['reshard_s']:>9.3g}")
    return "\n".join(lines)


def demo(selector: str = "cost-model") -> None:
    """Print one decision per stage for Qwen2.5-72B on 16 x 8 H100 at 32k context."""
    from earl.cost_model import CostModel
    from earl.specs import ClusterSpec, HardwareSpec, ModelSpec

    cm = CostModel(ModelSpec.from_name("qwen2.5-72b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=16))
    stats = WorkloadStats(num_responses=512, context_mean=20000, context_p95=30000,
                          context_max=32000, response_tokens_mean=6000)
    plan = ParallelPlan(tp=8, dp=16)
    for stage in Stage:
        print(format_decision(explain_selection(selector, cm, stage, stats, plan)), end="\n\n")
