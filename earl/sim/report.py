"""What `earl simulate` shows: the scenario in one line, the per-policy results table and the
outputs line (the CLI only prints them; `earl.sim.run` simulates and writes the files).

    earl simulate --steps 3 --compare --out /tmp/sim
"""

from __future__ import annotations

import datetime

from rich.table import Table

from .run import PolicyResult
from .scenario import Scenario, load_scenario


def prepare(scenario: str | None, sets: dict[str, str], *, steps: int | None = None,
            fine: bool = False, exact: bool = False, compare: bool = False) -> tuple[Scenario, list[tuple[str, str]]]:
    """The checked scenario (file or built-in name, `--set`s, then `--steps` / `--fine` /
    `--exact`) and the (selector, dispatcher) pairs to simulate."""
    sets = dict(sets)
    if steps is not None:
        sets["scenario.steps"] = str(steps)
    if fine:
        sets["engine.fine"] = "true"
    if exact:
        sets["engine.exact"] = "true"
    sc = load_scenario(scenario, sets)
    return sc, sc.policies(compare)


def default_out_dir() -> str:
    return f"runs/sim-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def headline(sc: Scenario, pairs: list) -> str:
    return (f"[bold]{sc.name}[/]: {sc.model} on {sc.cluster_spec().num_gpus} x {sc.hardware} "
            f"({sc.network}), workload {workload_label(sc)}, {sc.steps} steps, "
            f"{len(pairs)} polic{'y' if len(pairs) == 1 else 'ies'}")


def workload_label(sc: Scenario) -> str:
    """The workload as shown: a replayed trace by its file, never by the preset it overrides."""
    return f"trace {sc.workload.trace}" if sc.workload.trace else sc.workload.name


def results_table(sc: Scenario, results: list[PolicyResult]) -> Table:
    same = "same replayed trace" if sc.workload.trace else "same seeded workload"
    table = Table(title=f"{sc.name}: {sc.steps} steps, {same} (s/step: mean per step; total: over the run)")
    for col in ("policy", "tokens/s/GPU", "s/step", "OOM events", "truncated", "dispatch s total",
                "re-shard s total", "sync s total",
                "final plans (rollout | experience | train)"):
        table.add_column(col, justify="left" if col.startswith(("policy", "final")) else "right")
    for r in results:
        s = r.summary
        fp = s["final_plans"]
        table.add_row(s["policy"], f"{s['throughput_tokens_per_gpu_s']:.1f}",
                      f"{s['step_time_mean_s']:.1f}", str(s["oom_events"]),
                      str(s["truncated_episodes"]), f"{s['dispatch_s']:.2f}",
                      f"{s['reshard_s']:.1f}", f"{s['sync_s']:.1f}",
                      f"{fp.get('rollout')} | {fp.get('experience')} | {fp.get('train')}")
    return table


def outputs_line(path, results: list[PolicyResult], plots: bool, *, jobs=1, wall_s: float | None = None) -> str:
    events = sum(r.events for r in results)
    sim_s = sum(r.wall_s for r in results)
    how = f" over {jobs} {'processes' if jobs != 'ray' else 'Ray tasks'}" if jobs != 1 else ""
    total = f", {wall_s:.1f} s wall" if wall_s is not None else ""
    return (f"wrote {path}/ (metrics.csv, summary.json, decisions.jsonl, trace.json"
            f"{', plots' if plots else ''}); {events:,} events in {sim_s:.1f} s of simulation{how}{total}")
