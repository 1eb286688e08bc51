"""Study 5: end to end over a long run whose context grows: static plan vs. the `earl-table`
selector vs. the `cost-model` selector, each with the centralized and the layout-aware
dispatcher: throughput, OOM events, truncated episodes, time spent re-sharding.

Runs the simulator (`earl.sim.run.simulate`) on its default scenario (the EARL paper's
setting) from two starting configurations: the simulator's hand-tuned tp8 rollout, and a tp4
rollout (which study 3 favours per engine at short context, but which is the slower choice
here, where a fixed batch is spread over a fixed cluster), so a rollout selector has something
to switch.

    python studies/s5_end_to_end.py [--out docs/figures] [--quick]     # or: earl study s5
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import main, print_table, save_figure, write_csv

from earl.sim.run import simulate
from earl.sim.scenario import load_scenario

NAME = "s5_end_to_end"
POLICIES = tuple(f"{s}/{d}" for d in ("centralized", "layout-aware") for s in ("static", "earl-table", "cost-model"))
STARTS = {"start tp8 rollout": {}, "start tp4 rollout": {"plan.rollout": "tp4-dp32"}}
QUICK = {"scenario.steps": "6", "workload.episodes_per_step": "64", "workload.growth_steps": "6"}
TIME_PARTS = ("rollout_s", "experience_s", "train_s", "dispatch_s", "reshard_s", "sync_s", "restart_s")


def scenarios(quick: bool) -> dict:
    out = {}
    for label, sets in STARTS.items():
        sc = load_scenario(None, {**(QUICK if quick else {}), **sets})
        out[label] = dataclasses.replace(sc, compare=POLICIES)
    return out


def assumptions(sc) -> str:
    w, plans = sc.workload_spec(), sc.stage_plan()
    return (
        f"Simulator default scenario: {sc.model} on {sc.nodes} x {sc.gpus_per_node or 8} {sc.hardware}, {sc.network}; "
        f"{w.name} workload, {w.episodes_per_step} episodes/step, {w.turns_min}-{w.turns_max} turns, generated tokens "
        f"per turn growing x{w.growth_factor:g} ({w.growth}) over {w.growth_steps} steps, cap {w.max_context:,}; "
        f"{sc.steps} steps, seed {sc.seed}, same episodes for every policy. Initial plans: rollout "
        f"{plans.rollout.short()} (or tp4-dp32), experience {plans.experience.short()}, train "
        f"{plans.train.describe()}; colocated stages (weights re-shard "
        "train -> experience and sync train -> rollout whenever layouts differ). Throughput = trained tokens / "
        f"simulated wall time / GPUs. An OOM event drops that sequence from the stage and charges the step "
        f"{sc.oom_restart_s:g} s (the job restarts from a checkpoint; an assumption: the CSV also gives every ratio "
        f"without it); dispatch is the one price of the dispatcher's "
        "TransferPlan (earl.cost_model.dispatch; the controller packs like any rank, TCP incast efficiency 0.5)."
    )


def run(out: Path, quick: bool = False, jobs: int | str = 1) -> pd.DataFrame:
    summaries, per_step = [], []
    scs = scenarios(quick)
    for start, sc in scs.items():
        for res in simulate(sc, compare=True, jobs=jobs):
            rows = pd.DataFrame(res.rows)
            s = res.summary
            sel, disp = res.label.split("/")
            summaries.append({
                "start": start, "selector": sel, "dispatcher": disp,
                "throughput tok/s/GPU": s["throughput_tokens_per_gpu_s"], "step time mean s": s["step_time_mean_s"],
                "OOM events": s["oom_events"], "OOM steps": s["oom_steps"],
                "truncated episodes": s["truncated_episodes"], "plan switches": s["plan_switches"],
                **{f"total {p.removesuffix('_s')} s": rows[p].sum() for p in TIME_PARTS},
                "final rollout": s["final_plans"]["rollout"], "final experience": s["final_plans"]["experience"],
                "final train": s["final_plans"]["train"], "sim wall s": s["wall_s"],
            })
            rows["start"] = start
            per_step.append(rows)
    df = pd.DataFrame(summaries)
    # the same runs without the OOM restart charge (an assumed constant): nothing else in a
    # step depends on the simulated clock, so the charge comes off the wall time exactly
    wall = df["step time mean s"] * [len(r) for r in per_step]
    df["throughput no restart tok/s/GPU"] = df["throughput tok/s/GPU"] * wall / (wall - df["total restart s"])
    base = df[(df["selector"] == "static") & (df["dispatcher"] == "centralized")].set_index("start")
    for col, suffix in (("throughput tok/s/GPU", ""), ("throughput no restart tok/s/GPU", ", no restart charge")):
        df[f"vs static/centralized{suffix}"] = [r[col] / base.loc[r["start"], col] for _, r in df.iterrows()]
    write_csv(df, out, NAME)
    steps = pd.concat(per_step, ignore_index=True)
    write_csv(steps[["start", "policy", "step", "throughput_tokens_per_gpu_s", "step_time_s", "oom_events",
                     "context_mean", "plan_rollout", "plan_experience", "plan_train", "reshard_s", "sync_s",
                     "dispatch_s", "restart_s"]],
              out, f"{NAME}_steps")
    print_table(df, "Study 5: end to end, selectors x dispatchers (simulator)",
                ["start", "selector", "dispatcher", "throughput tok/s/GPU", "vs static/centralized",
                 "vs static/centralized, no restart charge", "OOM events", "truncated episodes", "plan switches",
                 "total dispatch s", "total reshard s", "total sync s", "total restart s", "total train s"])
    print_table(df[df["dispatcher"] == "layout-aware"], "Study 5: final plans",
                ["start", "selector", "final rollout", "final experience", "final train"])
    plot(df, steps, next(iter(scs.values())), out)
    return df


def plot(df: pd.DataFrame, steps: pd.DataFrame, sc, out: Path) -> Path:
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 5), gridspec_kw={"width_ratios": [1, 1.25, 1.1]})
    starts = list(dict.fromkeys(df["start"]))
    labels = [f"{s}\n{d}" for s, d in zip(df["selector"], df["dispatcher"], strict=True)]
    n = len(POLICIES)
    w = 0.8 / len(starts)
    colors = {"static": "tab:gray", "earl-table": "tab:orange", "cost-model": "tab:green"}
    for k, start in enumerate(starts):
        sub = df[df["start"] == start].reset_index(drop=True)
        x = np.arange(len(sub)) + (k - (len(starts) - 1) / 2) * w
        bars = ax1.bar(x, sub["throughput tok/s/GPU"], w, color=[colors[s] for s in sub["selector"]],
                       hatch="" if k == 0 else "//", edgecolor="white")
        for b, (_, r) in zip(bars, sub.iterrows(), strict=True):
            mid = b.get_x() + b.get_width() / 2
            ax1.annotate(f"{r['throughput tok/s/GPU']:.0f}", (mid, b.get_height()), ha="center", va="bottom",
                         fontsize=6.5)
            if r["OOM events"]:
                ax1.text(mid, b.get_height() * 0.95, f"{r['OOM events']} OOM", rotation=90, ha="center", va="top",
                         fontsize=7, color="white", fontweight="bold")
    ax1.set_xticks(range(n), labels[:n], fontsize=7, rotation=30, ha="right")
    ax1.set_ylabel("trained tokens/s per GPU over the run")
    ax1.set_ylim(0, df["throughput tok/s/GPU"].max() * 1.25)
    ax1.set_title("End-to-end throughput\n(plain: " + starts[0] + ", hatched: " + starts[-1] + ")", fontsize=9)
    ax1.grid(True, axis="y", alpha=0.3)
    parts = [("rollout", "tab:green"), ("experience", "tab:olive"), ("train", "tab:purple"),
             ("dispatch", "tab:red"), ("reshard", "tab:brown"), ("sync", "tab:pink"), ("restart", "0.15")]
    xs = np.arange(len(df))
    bottom = np.zeros(len(df))
    for p, color in parts:
        vals = df[f"total {p} s"].to_numpy() / 3600
        label = {"sync": "weight sync", "restart": "OOM restart"}.get(p, p)
        ax2.bar(xs, vals, 0.7, bottom=bottom, color=color, label=label)
        bottom += vals
    short = {"static": "static", "earl-table": "table", "cost-model": "cost", "centralized": "C",
             "layout-aware": "LA"}
    ax2.set_xticks(xs, [f"{short[r['selector']]}/{short[r['dispatcher']]}, {'tp8' if 'tp8' in r['start'] else 'tp4'}"
                        for _, r in df.iterrows()], fontsize=7, rotation=60, ha="right")
    ax2.set_xlabel("selector/dispatcher (C: centralized, LA: layout-aware), starting rollout plan", fontsize=8)
    ax2.set_ylabel("simulated hours over the run")
    ax2.set_title("Where the time goes", fontsize=9)
    ax2.legend(fontsize=7, ncol=4, loc="upper left")
    ax2.set_ylim(0, bottom.max() * 1.2)
    ax2.grid(True, axis="y", alpha=0.3)
    start = starts[-1]
    for sel, color in colors.items():
        r = steps[(steps["start"] == start) & (steps["policy"] == f"{sel}/layout-aware")]
        ax3.plot(r["step"], r["throughput_tokens_per_gpu_s"], color=color, lw=1.2, label=f"{sel}/layout-aware")
        oom = r[r["oom_events"] > 0]
        ax3.scatter(oom["step"], oom["throughput_tokens_per_gpu_s"], color="tab:red", marker="x", zorder=3)
    ax3.scatter([], [], color="tab:red", marker="x", label="step with an OOM event")
    ax3b = ax3.twinx()
    r = steps[(steps["start"] == start) & (steps["policy"] == "static/layout-aware")]
    ax3b.plot(r["step"], r["context_mean"], color="0.6", ls=":", lw=1)
    ax3b.set_ylabel("mean episode context (tokens, dotted)", color="0.4")
    ax3.set_xlabel("training step")
    ax3.set_ylabel("trained tokens/s per GPU (per step)")
    ax3.set_title(f"Per step, {start}", fontsize=9)
    ax3.legend(fontsize=7, loc="lower left")
    ax3.grid(True, alpha=0.3)
    return save_figure(fig, out, NAME, assumptions(sc))


if __name__ == "__main__":
    main(run, __doc__)
