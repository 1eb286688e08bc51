"""Study 9: synchronous colocated vs asynchronous disaggregated RL as the context grows: over
staleness bounds and rollout/training pool splits, what each buys in throughput and what it
costs in staleness and memory.

Runs the simulator (`earl.sim.run`) on its default scenario (the EARL paper's setting, context
growing towards the 32K cap over 100 steps): EARL's synchronous design (every stage on all 128
GPUs in turn) against the asynchronous design of AReaL / verl fully-async / slime (a rollout
pool streaming episodes up to K policy versions ahead of a training pool), for several pool
splits (and the split the cost model picks), K = 0 / 1 / 4, engines draining before each weight
update, and at the cost model's split also with partial rollout (episodes interrupted at an
update and resumed on the new weights). Variants run in
parallel processes (`--jobs`). Next to them, `s9_async_measured.csv`: the runtime's async / sync
ratios measured on this machine by benchmarks/bench_async.py (its output, docs/cpu/bench_async.txt)
beside the simulator's prediction of each (`measured_rows`).

    python studies/s9_async.py [--out docs/figures] [--quick] [--jobs N]     # or: earl study s9
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import main, print_table, save_figure, write_csv

from earl.sim.run import simulate_job
from earl.sim.scenario import load_scenario
from earl.sim.sweep import run_jobs

NAME = "s9_async"
SPLITS = (32, 64, 96)  # rollout-pool GPUs of 128 (plus the cost model's choice)
STALENESS = (0, 1, 4)
QUICK = {"scenario.steps": "6", "workload.episodes_per_step": "64", "workload.growth_steps": "6"}
QUICK_SPLITS, QUICK_STALENESS = (64,), (0, 1)
BENCH_TXT = Path(__file__).resolve().parents[1] / "docs" / "cpu" / "bench_async.txt"  # bench_async.py's output
# one async run's line of bench_async.txt: label, tok/s, measured ratio, simulated ratio, sim/meas, staleness
# mean measured / simulated, max measured / simulated, pools
BENCH_ROW = re.compile(r"^--nproc (\d+) async K=(\d+)( partial)?\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                       r"([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+rollout (\d+) / train (\d+)")
WINDOW = 10  # steps per point of the throughput-over-training panel
STEP_COLUMNS = ("step", "step_time_s", "throughput_tokens_per_gpu_s", "trained_tokens", "context_mean", "rollout_s",
                "experience_s", "train_s", "sync_s", "restart_s", "oom_events", "staleness_mean", "staleness_max",
                "recompute_tokens", "headroom_train", "rollout_gpus")


def variants(quick: bool) -> list[tuple[str, dict]]:
    """(label, --set overrides) of every variant; the first is the synchronous baseline."""
    base = QUICK if quick else {}
    out = [("sync colocated", {**base})]
    splits = (QUICK_SPLITS if quick else SPLITS) + (0,)
    for split in splits:
        for k in QUICK_STALENESS if quick else STALENESS:
            out.append((f"async {split or 'auto'}/{k}", {
                **base, "schedule.mode": "async", "schedule.rollout_gpus": str(split),
                "schedule.max_staleness": str(k), "schedule.partial_rollout": "false"}))
    for k in (QUICK_STALENESS if quick else STALENESS)[1:]:
        out.append((f"async auto/{k} partial", {
            **base, "schedule.mode": "async", "schedule.rollout_gpus": "0",
            "schedule.max_staleness": str(k), "schedule.partial_rollout": "true"}))
    return out


def summarize(label: str, sc, res) -> dict:
    rows = pd.DataFrame(res.rows)
    s = res.summary
    return {
        "variant": label, "mode": sc.mode, "rollout GPUs": int(rows["rollout_gpus"].iloc[0]),
        "max staleness": sc.max_staleness if sc.mode == "async" else 0,
        "partial rollout": sc.partial_rollout if sc.mode == "async" else False,
        "throughput tok/s/GPU": s["throughput_tokens_per_gpu_s"], "step time mean s": s["step_time_mean_s"],
        "throughput without restarts": s["trained_tokens"] / (rows["step_time_s"].sum() - rows["restart_s"].sum())
        / res.gpus,
        "staleness mean": s["staleness_mean"], "staleness max": s["staleness_max"],
        "OOM events": s["oom_events"], "OOM steps": s["oom_steps"],
        "min headroom train %": 100 * float(rows["headroom_train"].dropna().min()),
        "min headroom rollout %": 100 * float(rows["headroom_rollout"].min()),
        "recomputed tokens": int(rows["recompute_tokens"].sum()),
        "final train plan": s["final_plans"]["train"], "sim wall s": s["wall_s"],
    }


def measured_rows(path: Path = BENCH_TXT) -> pd.DataFrame:
    """The runtime's measured async / sync generated tokens/s and staleness next to the
    simulator's prediction of each (per-step feed, the calibrated CPU profile its workload names), read from
    benchmarks/bench_async.py's output: one row per async run (empty when there is no file)."""
    rows, workload = [], ""
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.startswith("bench_async: "):  # a call's header: its env, episodes and overrides of both runs
            parts = line.removeprefix("bench_async: ").split("; ")
            workload = parts[0] + "".join(f"; {p}" for p in parts if p.startswith("simulated with ")
                                          or (p.startswith("--both ") and p != "--both -"))
        m = BENCH_ROW.match(line)
        if m:
            g = m.groups()
            rows.append({"source": "measured (bench_async.py)", "workload": workload,
                         "nproc": int(g[0]), "max staleness": int(g[1]),
                         "partial rollout": bool(g[2]), "async tok/s": float(g[3]),
                         "measured vs sync": float(g[4]), "simulated vs sync": float(g[5]),
                         "simulated / measured": float(g[6]), "staleness mean": float(g[7]),
                         "simulated staleness mean": float(g[8]), "staleness max": int(g[9]),
                         "simulated staleness max": int(g[10]), "rollout pool": int(g[11]),
                         "train pool": int(g[12])})
    return pd.DataFrame(rows)


def assumptions(sc, auto: int) -> str:
    w = sc.workload_spec()
    return (
        f"Simulator default scenario: {sc.model} on {sc.nodes} x {sc.gpus_per_node or 8} {sc.hardware}, {sc.network}; "
        f"{w.name} workload, {w.episodes_per_step} episodes/step, {w.turns_min}-{w.turns_max} turns, generated tokens "
        f"per turn growing x{w.growth_factor:g} ({w.growth}) over {w.growth_steps} steps, cap {w.max_context:,}; "
        f"{sc.steps} steps, seed {sc.seed}, same episodes for every variant; static plans rollout {sc.rollout_plan}, "
        f"experience {sc.experience_plan}, train {sc.train_plan} (dp fills each stage's GPUs), centralized dispatch. "
        "Sync: every stage on all GPUs in turn, weights re-shard/sync between them. Async: rollout pool = first R GPUs "
        "(engines never pause), training pool = the rest (log-probs + training); batch j enters the engines once "
        "policy version j-K is out; step s trains on the batch's worth of finished episodes, oldest-started first "
        "(staleness = s - version an episode started on, <= K); weights pushed to the rollout pool over the "
        "inter-node network after each step; partial rollout interrupts episodes at a push (context recomputed on "
        f"the new weights), else engines drain before loading. Auto split: the cost model's ({auto} rollout GPUs, "
        "priced on the episodes of 4 evenly spaced steps). An OOM event drops the sequence and charges the step "
        f"{sc.oom_restart_s:g} s. "
        "Throughput = trained tokens / simulated time / all GPUs."
    )


def run(out: Path, quick: bool = False, jobs: int | str = 1) -> pd.DataFrame:
    labelled = variants(quick)
    scs = [load_scenario(None, sets) for _, sets in labelled]
    results = run_jobs(simulate_job, [(sc, "static", "centralized", None) for sc in scs], jobs)
    df = pd.DataFrame([summarize(label, sc, res) for (label, _), sc, res in zip(labelled, scs, results, strict=True)])
    df["vs sync"] = df["throughput tok/s/GPU"] / df["throughput tok/s/GPU"].iloc[0]
    write_csv(df, out, NAME)
    steps = pd.concat([pd.DataFrame(res.rows).assign(variant=label) for (label, _), res in zip(labelled, results,
                                                                                                strict=True)])
    write_csv(steps[["variant"] + [c for c in STEP_COLUMNS if c in steps]], out, f"{NAME}_steps")
    print_table(df, f"Study 9: synchronous colocated vs asynchronous disaggregated ({scs[0].model}, "
                    f"{scs[0].cluster_spec().num_gpus} GPUs, {scs[0].steps} steps)",
                ["variant", "rollout GPUs", "throughput tok/s/GPU", "vs sync", "throughput without restarts",
                 "staleness mean", "OOM events", "OOM steps", "min headroom train %", "recomputed tokens"])
    measured = measured_rows()
    if len(measured):
        write_csv(measured, out, f"{NAME}_measured")
        print_table(measured, f"Study 9, measured on the runtime ({BENCH_TXT.name}): async / sync next to the "
                              "simulator's prediction", ["workload", "nproc", "max staleness", "partial rollout",
                                                         "measured vs sync", "simulated vs sync",
                                                         "simulated / measured", "staleness mean",
                                                         "simulated staleness mean", "staleness max"])
    sync = scs[0]
    auto = int(df[df["variant"].str.startswith("async auto")]["rollout GPUs"].iloc[0])
    plot(df, labelled, results, out, assumptions(sync, auto))
    return df


def plot(df: pd.DataFrame, labelled, results, out: Path, footer: str) -> Path:
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 5.2))
    # 1. throughput over training (context grows): sync vs the best async of each K at the auto split
    show = [0] + [i for i, (label, _) in enumerate(labelled) if label.startswith("async auto/")]
    for i in show:
        rows = pd.DataFrame(results[i].rows)
        w = max(1, min(WINDOW, len(rows) // 3))
        grp = rows.groupby(rows["step"] // w)
        tput = grp["trained_tokens"].sum() / grp["step_time_s"].sum() / results[i].gpus
        ctx = grp["context_mean"].mean()
        ax1.plot(ctx, tput, marker="o", ms=3, lw=2.2 if i == 0 else 1.3, label=labelled[i][0],
                 color="black" if i == 0 else None, ls="--" if "partial" in labelled[i][0] else "-")
    ax1.set_xlabel(f"mean episode context (tokens; windows of up to {WINDOW} steps)")
    ax1.set_ylabel("trained tokens / s / GPU")
    ax1.set_title("Throughput as the context grows")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=7)
    # 2. throughput vs staleness bound, one line per split
    a = df[(df["mode"] == "async") & ~df["partial rollout"]]
    for label, g in a.groupby(a["variant"].str.extract(r"async (\w+)/")[0], sort=False):
        g = g.sort_values("max staleness")
        name = f"R = {int(g['rollout GPUs'].iloc[0])} rollout GPUs" + (" (cost model's)" if label == "auto" else "")
        ax2.plot(g["max staleness"], g["throughput tok/s/GPU"], marker="o", label=name)
        for _, r in g.iterrows():
            ax2.annotate(f"{r['staleness mean']:.2f}", (r["max staleness"], r["throughput tok/s/GPU"]),
                         fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax2.axhline(df["throughput tok/s/GPU"].iloc[0], color="black", lw=1.5, label="sync colocated")
    ax2.set_xlabel("max staleness K (policy versions); labels: mean staleness")
    ax2.set_ylabel("trained tokens / s / GPU (whole run)")
    ax2.set_title("Throughput vs staleness bound and pool split")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    # 3. memory: the training pool's smallest headroom and its OOM events, per pool size
    g = df.groupby("rollout GPUs", sort=True).agg(mode=("mode", "first"), headroom=("min headroom train %", "min"),
                                                  ooms=("OOM events", "max")).reset_index()
    g = pd.concat([g[g["mode"] == "sync"], g[g["mode"] != "sync"]])
    x = np.arange(len(g))
    total = results[0].gpus
    labels = [f"sync\n(train on {r})" if m == "sync" else f"async R={r}\n(train on {total - r})"
              for m, r in zip(g["mode"], g["rollout GPUs"], strict=True)]
    ax3.bar(x, g["headroom"], color=["black" if m == "sync" else "tab:purple" for m in g["mode"]], alpha=0.7)
    ax3.axhline(0, color="0.3", lw=0.8)
    ax3.set_xticks(x, labels, fontsize=7)
    ax3.set_ylabel("smallest free memory while training (%)")
    ax3.set_title("Memory: fewer training GPUs, less headroom")
    ax3b = ax3.twinx()
    ax3b.plot(x, g["ooms"], "x", color="tab:red", ms=9, mew=2)
    ax3b.set_ylabel("OOM events (most over K)", color="tab:red")
    ax3b.set_ylim(bottom=0)
    return save_figure(fig, out, NAME, footer)


if __name__ == "__main__":
    main(run, __doc__)
