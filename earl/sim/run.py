"""Run one or several policies on a scenario and write the study's outputs.

`simulate()` runs each (selector, dispatcher) pair on the same seeded workload; `write_outputs()`
writes metrics.csv (one row per step and policy), summary.json, decisions.jsonl, a Chrome trace
per policy (trace.json for the first; the runtime writes the same span format) and PNG plots,
all into a temporary folder that is renamed into place only when everything is written.

Policies of `--compare` run in parallel processes with `--jobs N` (earl/sim/sweep.py).

    earl simulate --steps 10 --compare --jobs 4 --out /tmp/sim
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from earl.trace import Span, to_chrome_trace

from .scenario import Scenario
from .simulation import Simulation
from .sweep import run_jobs

METRIC_COLUMNS = (
    "policy", "selector", "dispatcher", "step", "step_time_s", "throughput_tokens_per_gpu_s",
    "generated_tokens_per_gpu_s", "rollout_s", "experience_s", "dispatch_s", "train_s",
    "reshard_s", "sync_s", "restart_s", "oom_events", "rollout_oom", "experience_oom", "train_oom",
    "truncated_episodes", "episodes", "trained_episodes", "trained_tokens", "generated_tokens",
    "recompute_tokens", "preemptions", "evictions", "context_mean", "context_p95", "context_max",
    "kv_capacity_tokens", "peak_kv_tokens", "headroom_rollout", "headroom_experience",
    "headroom_train", "headroom_min", "plan_rollout", "plan_experience", "plan_train", "sim_time_s",
    "replicas_simulated", "rollout_gpus", "staleness_mean", "staleness_max",
)


@dataclass
class PolicyResult:
    label: str
    rows: list[dict]
    spans: list[Span]
    decisions: list[dict]
    events: int  # simulated events (engine batch changes, transfers, stage timeouts)
    wall_s: float  # wall-clock seconds the simulation took
    cpu_s: float  # process CPU seconds it took
    gpus: int
    summary: dict = field(default_factory=dict)


def summarize(res: PolicyResult) -> dict:
    rows = res.rows
    sim_s = sum(r["step_time_s"] for r in rows)
    trained = sum(r["trained_tokens"] for r in rows)
    switches = sum(1 for a, b in zip(rows, rows[1:], strict=False)
                   for k in ("plan_rollout", "plan_experience", "plan_train") if a[k] != b[k])
    return {
        "policy": res.label, "steps": len(rows), "simulated_s": sim_s,
        "throughput_tokens_per_gpu_s": trained / sim_s / res.gpus if sim_s else 0.0,
        "step_time_mean_s": sim_s / len(rows) if rows else 0.0,
        "oom_events": sum(r["oom_events"] for r in rows),
        "oom_steps": sum(1 for r in rows if r["oom_events"]),
        "truncated_episodes": sum(r["truncated_episodes"] for r in rows),
        "dispatch_s": sum(r["dispatch_s"] for r in rows),
        "reshard_s": sum(r["reshard_s"] for r in rows),
        "sync_s": sum(r["sync_s"] for r in rows),
        "plan_switches": switches,
        "trained_tokens": trained,
        "generated_tokens": sum(r["generated_tokens"] for r in rows),
        "headroom_min": min((r["headroom_min"] for r in rows), default=None),
        "staleness_mean": (sum(r["staleness_mean"] * r["trained_episodes"] for r in rows)
                           / max(1, sum(r["trained_episodes"] for r in rows))),
        "staleness_max": max((r["staleness_max"] for r in rows), default=0),
        "final_plans": {k: rows[-1][f"plan_{k}"] for k in ("rollout", "experience", "train")}
        if rows else {},
        "events": res.events, "wall_s": res.wall_s, "cpu_s": res.cpu_s,
        "events_per_wall_s": res.events / res.wall_s if res.wall_s else 0.0,
        "simulated_tokens_per_wall_s": (sum(r["generated_tokens"] for r in rows) / res.wall_s
                                        if res.wall_s else 0.0),
    }


def simulate_policy(scenario: Scenario, selector: str, dispatcher: str, *, fine: bool | None = None,
                    progress=None) -> PolicyResult:
    """One (selector, dispatcher) pair on the scenario, timed."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    cb = None if progress is None else (lambda sim, step: progress(sim.label, step))
    sim = Simulation(scenario, selector, dispatcher, fine=fine, progress=cb).run()
    res = PolicyResult(label=sim.label, rows=sim.rows, spans=sim.spans, decisions=sim.decisions,
                       events=sim.events, wall_s=time.perf_counter() - wall0,
                       cpu_s=time.process_time() - cpu0, gpus=sim.gpus)
    res.summary = summarize(res)
    return res


def simulate_job(job: tuple) -> PolicyResult:
    """`simulate_policy(*job)` for `run_jobs`: job = (scenario, selector, dispatcher, fine)."""
    scenario, selector, dispatcher, fine = job
    return simulate_policy(scenario, selector, dispatcher, fine=fine)


def simulate(scenario: Scenario, *, compare: bool = False, fine: bool | None = None,
             progress=None, jobs: int | str = 1, done=None) -> list[PolicyResult]:
    """Simulate the scenario's policy (or every policy of `policy.compare`). Serially
    (`jobs=1`), `progress(label, step)` is called after each step; in parallel (`jobs` > 1
    processes, or "ray": earl/sim/sweep.py) `done(result)` as each policy finishes. Results
    come back in `policy.compare` order, equal to the serial run's."""
    pairs = scenario.policies(compare)
    if jobs == 1 or len(pairs) == 1:
        out = []
        for sel, disp in pairs:
            out.append(simulate_policy(scenario, sel, disp, fine=fine, progress=progress))
            if done is not None:
                done(out[-1])
        return out
    return run_jobs(simulate_job, [(scenario, sel, disp, fine) for sel, disp in pairs], jobs,
                    done=None if done is None else (lambda i, res: done(res)))


def metrics_csv(results: list[PolicyResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for res in results:
        for r in res.rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in METRIC_COLUMNS})
    return buf.getvalue()


def _slug(label: str) -> str:
    return label.replace("/", "__")


def check_out_dir(out: str | Path) -> Path:
    """Refuse an --out folder that already holds files (nothing is ever overwritten) or cannot
    be written, before the simulation runs."""
    from earl.outputs import check_out_dir as check

    return check(out)


def write_outputs(scenario: Scenario, results: list[PolicyResult], out: str | Path,
                  plots: bool = True) -> Path:
    """Write every output into a temporary sibling folder, then rename it to `out`."""
    out = check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        (tmp / "metrics.csv").write_text(metrics_csv(results))
        summary = {"scenario": scenario.to_flat(), "policies": [r.summary for r in results]}
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        (tmp / "decisions.jsonl").write_text(
            "".join(json.dumps(d, default=str) + "\n" for r in results for d in r.decisions))
        for i, res in enumerate(results):
            name = "trace.json" if i == 0 else f"trace-{_slug(res.label)}.json"
            (tmp / name).write_text(json.dumps(to_chrome_trace(res.spans), default=str))
        if plots:
            from .plots import write_plots

            write_plots([r for res in results for r in res.rows], tmp)
        if out.exists():  # an empty folder: replace it
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
