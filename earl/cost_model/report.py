"""What `earl estimate` and `earl plan` compute and show: one stage priced from the CLI's
options, and the tables a person reads (the CLI only prints them).

    earl estimate decode --gpus 4 --tp 2
"""

from __future__ import annotations

import time

from rich.table import Table

from earl.cost_model.model import STAGES, CostModel, Estimate
from earl.cost_model.profile import with_controller_path
from earl.cost_model.resolve import make_cost_model, resolve_preset
from earl.cost_model.search import rank_plans
from earl.specs import ParallelPlan


def fmt_s(t: float) -> str:
    if t == float("inf"):
        return "inf"
    return f"{t * 1e3:.3f} ms" if t < 1 else f"{t:.3f} s"


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def cost_model_for(model: str, *, hardware: str | None, gpus: int, network: str | None = None,
                   cluster: str | None = None, controller_path: str | None = None) -> CostModel:
    """The CostModel `earl estimate` / `earl plan` price with: a cluster preset fills the
    hardware and network the user did not give; `controller_path` sets the single
    controller's serialisation path (dispatch)."""
    hardware, network = resolve_preset(cluster, hardware, network)
    cm = make_cost_model(model, hardware, gpus, network)
    if controller_path:
        cm = cm.with_profile(with_controller_path(cm.profile, controller_path))
    return cm


ESTIMATED = (*STAGES, "rollout")  # what `earl estimate` prices: the cost model's stages and a whole rollout


def estimate_stage(stage: str, cm: CostModel, plan: ParallelPlan, *, gpus: int, batch: int = 64,
                   context: int = 4096, to: str | None = None, optimizer_state: bool = False,
                   prompt: int = 0) -> Estimate:
    """Price one stage (prefill | decode | logprob | train | reshard | rollout) on `gpus` GPUs;
    reshard goes from `plan` to `to` (default: the same plan); rollout is `batch` responses grown
    from `prompt` tokens to `context` (CostModel.rollout: prefill, decode as the KV grows,
    preemption). Dispatch is priced on the dispatcher's own TransferPlan
    (earl.policies.dispatch_cost.estimate_dispatch), one layer up."""
    if stage not in ESTIMATED or stage == "dispatch":
        raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(ESTIMATED)}")
    plan = plan.resolve(gpus)
    if stage == "rollout":
        if not 0 <= prompt < context:
            raise ValueError(f"--prompt {prompt} must be >= 0 and below --context {context}")
        return cm.rollout(plan, batch, context, prompt)
    if stage == "reshard":
        dst = ParallelPlan.parse(to).resolve(gpus) if to else plan
        return cm.reshard(plan, dst, include_optimizer=optimizer_state)
    return cm.estimate(stage, plan, batch, context)


def network_note(cm: CostModel) -> str:
    """The network a command priced with, named in its output (never a silent default)."""
    c, net = cm.cluster, cm.cluster.network
    return (f"{c.nodes} node(s) x {c.gpus_per_node}, network {net.name} ({net.nics_per_node} x "
            f"{net.nic_bw_bytes_s * 8 / 1e9:g} Gb/s per node at {net.efficiency:.0%}, "
            f"incast {net.incast_efficiency:.0%})")


def estimate_table(est: Estimate, title: str) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value")
    t.add_row("plan", est.plan.describe() if est.plan else "-")
    t.add_row("feasible", "[green]yes[/]" if est.feasible else "[red]no[/]")
    if est.reason:
        t.add_row("note" if est.feasible else "reason", est.reason)
    t.add_row("time", fmt_s(est.time_s))
    if est.tokens and est.feasible:
        t.add_row("tokens/s/GPU", f"{est.tokens_per_gpu_s:,.1f}")
    if est.flops:
        t.add_row("TFLOP/s/GPU", f"{est.tflops_per_gpu:.1f}")
        t.add_row("MFU", f"{est.mfu:.1%}")
    if est.memory:
        t.add_row("memory/GPU", f"{gib(est.memory.total)} of {gib(est.memory.capacity)}")
        for c in est.memory.COMPONENTS:
            v = getattr(est.memory, c)
            if v:
                t.add_row(f"  {c}", gib(v))
    for k, v in est.breakdown.items():
        if v:
            t.add_row(f"  time: {k}", fmt_s(v))
    for k, v in est.extras.items():
        t.add_row(f"  {k}", f"{v:,.4g}" if isinstance(v, float) else str(v))
    return t


def timed_ranking(cm: CostModel, stage: str, gpus: int, batch: int, context: int):
    """`rank_plans` and the seconds it took: [(plan, estimate)] best first, elapsed_s."""
    t0 = time.perf_counter()
    ranked = rank_plans(cm, stage, gpus, batch, context)
    return ranked, time.perf_counter() - t0


def ranking_table(cm: CostModel, stage: str, gpus: int, batch: int, context: int, ranked: list,
                  elapsed_s: float, top: int) -> Table:
    """The `top` best plans (0: all), with why the infeasible ones fail."""
    n_ok = sum(e.feasible for _, e in ranked)
    t = Table(title=f"{stage}: {cm.model.name} on {gpus} x {cm.profile.name}, batch {batch} x {context}: "
                    f"{len(ranked)} plans ({n_ok} feasible) in {elapsed_s * 1e3:.0f} ms; {network_note(cm)}",
              title_justify="left")
    for col in ("#", "plan", "tokens/s/GPU", "time", "MFU", "mem/GPU", "why not"):
        t.add_column(col, justify="right" if col not in ("plan", "why not") else "left")
    for i, (p, e) in enumerate(ranked[:top] if top else ranked, 1):
        t.add_row(str(i), p.describe(), f"{e.tokens_per_gpu_s:,.0f}" if e.feasible else "-", fmt_s(e.time_s),
                  f"{e.mfu:.1%}" if e.feasible and e.flops else "-",
                  gib(e.memory.total) if e.memory else "-", "" if e.feasible else e.reason)
    return t


def ranking_dict(cm: CostModel, stage: str, ranked: list, elapsed_s: float, top: int) -> dict:
    """`earl plan --json`: the `top` best plans (0: all) as JSON-ready dicts."""
    return {"stage": stage, "plans_evaluated": len(ranked), "search_s": elapsed_s,
            "network": cm.cluster.network.name, "nodes": cm.cluster.nodes,
            "plans": [e.to_dict() for _, e in (ranked[:top] if top else ranked)]}
