"""Study 1: how agentic context grows over training under a fixed maximum context: episode and
per-turn context, the share of truncated episodes, and when the static configuration starts to
fail.

The workload is the simulator's Connect-Four preset (4-18 moves per game; the reasoning the
model writes per move grows 8x along a logistic curve over 100 steps; 32K cap). The
simulation runs the paper's setting with a static hand-tuned plan and records out-of-memory
events and memory headroom per stage.

    python studies/s1_context_growth.py [--out docs/figures] [--quick]     # or: earl study s1
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import main, print_table, save_figure, write_csv

from earl.sim.run import simulate
from earl.sim.scenario import load_scenario
from earl.sim.workload import Workload, with_overrides

NAME = "s1_context_growth"
QUICK = {"scenario.steps": "6", "workload.episodes_per_step": "64", "workload.growth_steps": "6"}
POLICY = "static/centralized"
OTHER_CAPS = (8192, 16384)  # tighter caps: truncation share only (workload draws, no simulation)


def scenario(quick: bool):
    sc = load_scenario(None, QUICK if quick else {})
    sel, disp = POLICY.split("/")
    import dataclasses

    return dataclasses.replace(sc, selector=sel, dispatcher=disp)


def assumptions(sc) -> str:
    w, plans = sc.workload_spec(), sc.stage_plan()
    return (
        f"Simulator default scenario ({sc.name}): {sc.model} on {sc.nodes} x {sc.gpus_per_node or 8} {sc.hardware}, "
        f"{sc.network}; workload preset {w.name}: {w.episodes_per_step} episodes/step, {w.turns_min}-{w.turns_max} "
        f"turns, prompt {w.prompt_tokens:.0f}, observation {w.obs_tokens:.0f} and generated {w.gen_tokens:.0f} "
        f"tokens per turn at step 0 (lognormal, cv {w.gen_tokens_cv}), generation growing x{w.growth_factor:g} "
        f"({w.growth}) over {w.growth_steps} steps, cap {w.max_context:,} tokens (episodes reaching it are "
        f"truncated; the truncation panel also shows 8K and 16K caps on the same episodes). "
        f"Turn context = tokens the model sees when it starts a turn. Static plans: rollout "
        f"{plans.rollout.short()}, experience {plans.experience.short()}, train {plans.train.describe()}; "
        f"{sc.steps} steps, seed {sc.seed}. "
        f"An OOM event drops that sequence from the stage and charges the step {sc.oom_restart_s:g} s (job restart "
        "from a checkpoint)."
    )


def workload_rows(sc) -> list[dict]:
    capped = Workload(sc.workload_spec(), seed=sc.seed)
    uncapped = Workload(with_overrides(sc.workload_spec(), max_context=0), seed=sc.seed)
    tighter = {c: Workload(with_overrides(sc.workload_spec(), max_context=c), seed=sc.seed) for c in OTHER_CAPS}
    rows = []
    for step in range(sc.steps):
        eps = capped.episodes(step)
        ctx = np.array([e.context_tokens for e in eps])
        turn_ctx, gen = [], []
        for e in eps:
            prefix = 0
            for obs, g, _ in e.turns:
                prefix += obs
                turn_ctx.append(prefix)
                gen.append(g)
                prefix += g
        raw = np.array([e.context_tokens for e in uncapped.episodes(step)])
        rows.append({
            "step": step, "episode ctx mean": ctx.mean(), "episode ctx p95": np.percentile(ctx, 95),
            "episode ctx max": ctx.max(), "turn ctx mean": np.mean(turn_ctx), "turn ctx max": np.max(turn_ctx),
            "gen tokens per turn": np.mean(gen), "turns per episode": np.mean([len(e.turns) for e in eps]),
            "truncated %": 100 * np.mean([e.truncated for e in eps]),
            "uncapped ctx p95": np.percentile(raw, 95), "uncapped ctx max": raw.max(),
            **{f"truncated % at {c // 1024}K cap": 100 * np.mean([e.truncated for e in w.episodes(step)])
               for c, w in tighter.items()},
        })
    return rows


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    sc = scenario(quick)
    df = pd.DataFrame(workload_rows(sc))
    (res,) = simulate(sc)
    sim = pd.DataFrame(res.rows)
    cols = ["oom_events", "rollout_oom", "experience_oom", "train_oom", "headroom_rollout", "headroom_experience",
            "headroom_train", "headroom_min", "step_time_s", "throughput_tokens_per_gpu_s", "truncated_episodes"]
    df = df.merge(sim[["step"] + cols], on="step")
    assert (df["truncated_episodes"] == (df["truncated %"] / 100 * sc.workload_spec().episodes_per_step).round()).all()
    write_csv(df, out, NAME)
    step_idx = sorted(set(np.linspace(0, len(df) - 1, min(len(df), 11)).round().astype(int)))
    print_table(df.iloc[step_idx], f"Study 1: context growth, {sc.workload.name}, cap {sc.workload.max_context:,} "
                                   f"({POLICY})",
                ["step", "episode ctx mean", "episode ctx p95", "episode ctx max", "turn ctx mean", "turn ctx max",
                 "truncated %", "uncapped ctx max", "oom_events", "headroom_min", "throughput_tokens_per_gpu_s"])
    fail = first_failure(df)
    print(f"static plan first fails at step: {fail if fail is not None else 'never (within the run)'}")
    plot(df, sc, fail, out)
    return df


def first_failure(df: pd.DataFrame) -> int | None:
    bad = df[df["oom_events"] > 0]
    return int(bad["step"].iloc[0]) if len(bad) else None


def plot(df: pd.DataFrame, sc, fail: int | None, out: Path) -> Path:
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4.6))
    s = df["step"]
    cap = sc.workload.max_context
    ax1.fill_between(s, 0, df["episode ctx p95"], color="tab:blue", alpha=0.12, label="episode context <= p95")
    ax1.plot(s, df["episode ctx mean"], color="tab:blue", label="episode context, mean")
    ax1.plot(s, df["episode ctx max"], color="tab:blue", ls=":", label="episode context, max")
    ax1.plot(s, df["uncapped ctx max"], color="0.5", ls="--", lw=1, label="max without the cap")
    ax1.plot(s, df["turn ctx mean"], color="tab:orange", label="turn context, mean")
    ax1.plot(s, df["turn ctx max"], color="tab:orange", ls=":", label="turn context, max")
    ax1.axhline(cap, color="tab:red", lw=1)
    ax1.annotate(f"max context {cap:,}", (s.iloc[-1], cap), xytext=(0, 3), textcoords="offset points",
                 color="tab:red", fontsize=8, ha="right")
    ax1.set_ylim(0, max(df["uncapped ctx max"].max(), cap) * 1.08)
    ax1.set_xlabel("training step")
    ax1.set_ylabel("tokens")
    ax1.set_title("Context length over training")
    ax1.legend(fontsize=7, loc="upper left")
    ax1.grid(True, alpha=0.3)
    ax2.plot(s, df["truncated %"], color="tab:red", label=f"cap {cap // 1024}K (simulated)")
    for c, ls in zip(OTHER_CAPS, ("--", ":"), strict=True):
        ax2.plot(s, df[f"truncated % at {c // 1024}K cap"], color="tab:red", ls=ls, alpha=0.7,
                 label=f"cap {c // 1024}K (same episodes)")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("episodes truncated at the cap (%)")
    ax2.set_title("Share of truncated episodes")
    ax2.legend(fontsize=7, loc="upper left")
    ax2.grid(True, axis="y", alpha=0.3)
    for col, color in (("headroom_rollout", "tab:green"), ("headroom_experience", "tab:olive"),
                       ("headroom_train", "tab:purple")):
        ax3.plot(s, 100 * df[col].astype(float), color=color, label=f"memory headroom: {col.split('_')[1]}")
    ax3.axhline(0, color="0.3", lw=0.8)
    ax3.set_xlabel("training step")
    ax3.set_ylabel("free device memory at the step's peak (%)")
    ax3.set_title(f"Static plan ({sc.stage_plan().train.describe()} training)")
    ax3.grid(True, alpha=0.3)
    ax3b = ax3.twinx()
    ax3b.bar(s, df["oom_events"], color="tab:red", alpha=0.5, label="OOM events (sequences)")
    ax3b.set_ylabel("OOM events per step", color="tab:red")
    if fail is not None:
        ax3.axvline(fail, color="tab:red", ls="--")
        ax3.annotate(f"first OOM: step {fail}", (fail, 95), xytext=(-4, 0), textcoords="offset points",
                     color="tab:red", fontsize=8, va="top", ha="right")
    h1, l1 = ax3.get_legend_handles_labels()
    h2, l2 = ax3b.get_legend_handles_labels()
    ax3.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left")
    ax3.set_ylim(-5, 100)
    return save_figure(fig, out, NAME, assumptions(sc))


if __name__ == "__main__":
    main(run, __doc__)
