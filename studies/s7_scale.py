"""Study 7: scaling the cluster 128 -> 1,024 -> 4,096 GPUs (and on to 16,384): where the
centralized dispatcher's cost overtakes the other parts of an RL step, and what the cost-model
selector picks for each stage at each scale.

Weak scaling: every GPU keeps the same share of the batch (4 sequences), so per-GPU compute
stays flat while everything funnelled through one controller grows with the cluster. Dispatch
is the one price of the dispatcher's TransferPlan (earl.cost_model.dispatch): by default the
controller packs like any rank and is bound by its NIC; the object-store controller (0.8 GB/s,
the EARL paper's anecdote) is a named option shown dotted.

    python studies/s7_scale.py [--out docs/figures] [--quick]     # or: earl study s7
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from common import GIB, HARDWARE, MODEL, controller_note, main, object_store, print_table, save_figure, write_csv

from earl.cost_model import CostModel, HardwareProfile
from earl.cost_model.resolve import make_cost_model
from earl.policies import make_selector
from earl.policies.dispatch_cost import estimate_dispatch
from earl.specs import NetworkSpec, ParallelPlan, Stage, StagePlan, WorkloadStats

NAME = "s7_scale"
SCALES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_SCALES = (128, 1024)
HIGHLIGHT = (128, 1024, 4096)
SEQS_PER_GPU = 4  # weak scaling: batch = 4 x GPUs sequences
CONTEXT_MEAN, CONTEXT_P95, CONTEXT_MAX = 16384, 24576, 32768  # tokens per sequence
RESPONSE_TOKENS = 4096  # model-generated tokens per sequence (the rest: prompt + observations)
LOGPROB_PASSES = 2  # reference + old-policy log-probs
NETWORK = "tcp-200g"
INITIAL = StagePlan(rollout=ParallelPlan(tp=8, dp=-1), experience=ParallelPlan(tp=8, dp=-1),
                    train=ParallelPlan(tp=8, pp=4, dp=-1, recompute="full"))
COMPONENTS = ("rollout", "experience", "train", "weight sync", "dispatch centralized",
              "dispatch layout-aware")
ASSUMPTIONS = (
    f"{MODEL} on N x {HARDWARE} (8 per node, NVLink inside, one 200 Gbps TCP NIC per node: 60% of line rate, "
    f"30 us). Weak scaling: {SEQS_PER_GPU} sequences per GPU per step, context mean "
    f"{CONTEXT_MEAN:,} / p95 {CONTEXT_P95:,} / max {CONTEXT_MAX:,} tokens, {RESPONSE_TOKENS:,} generated. Plans: the "
    "cost-model selector (10% memory margin, no hysteresis for this one-shot choice) picks rollout (tp x dp), "
    "experience (tp x pp x dp x micro-batch) and training (tp/pp/cp/dp, micro-batch, recompute, ZeRO) on all N GPUs; "
    "rollout = generated tokens x one decode iteration at the mean context; experience = 2 forward log-prob passes; "
    "weight sync = re-shard training -> rollout layout; dispatch = the dispatcher's TransferPlan from the experience "
    "to the training layout (producer d: a contiguous block; consumer d: samples i = d mod dp), priced once. "
    "Every stage uses the whole cluster (colocated). "
    + controller_note(make_cost_model(MODEL, HARDWARE, 128, NETWORK))
    + "; dotted: the centralized controller behind an object store at 0.8 GB/s (named option), TCP."
)


def one_scale(gpus: int, profile: HardwareProfile | None = None, network: NetworkSpec | None = None) -> dict:
    """One RL step at `gpus` GPUs (optionally priced with another hardware profile or another
    TCP network)."""
    cm = make_cost_model(MODEL, HARDWARE, gpus, NETWORK)
    if network is not None:
        cm = CostModel(cm.model, dataclasses.replace(cm.cluster, network=network), cm.profile)
    rdma = make_cost_model(MODEL, HARDWARE, gpus, "rdma-200g")
    if profile is not None:
        cm, rdma = cm.with_profile(profile), rdma.with_profile(profile)
    batch = SEQS_PER_GPU * gpus
    sel = make_selector("cost-model", cost_model=cm, initial=INITIAL, stage_gpus=gpus,
                        logprob_passes=LOGPROB_PASSES, patience=1, hysteresis=0.0)
    stats = WorkloadStats(num_responses=batch, context_mean=CONTEXT_MEAN, context_p95=CONTEXT_P95,
                          context_max=CONTEXT_MAX, response_tokens_mean=RESPONSE_TOKENS)
    plans, times = {}, {}
    for stage in Stage:
        d = sel.select(stage, stats)
        plans[stage.value] = d.plan
        times[stage.value] = d.predicted["stage_time_s"]
    row = {"gpus": gpus, "batch": batch}
    row.update({f"{s} plan": p.describe() for s, p in plans.items()})
    row["rollout s"] = times["rollout"]
    row["experience s"] = times["experience"]
    row["train s"] = times["train"]
    row["weight sync s"] = cm.reshard(plans["train"], plans["rollout"]).time_s
    ex, tr = plans["experience"], plans["train"]
    for kind in ("centralized", "layout-aware"):
        est = estimate_dispatch(cm, kind, ex, tr, batch, CONTEXT_MEAN)
        row[f"dispatch {kind} s"] = est.time_s
        row[f"dispatch {kind} controller GiB"] = est.extras["controller_bytes"] / GIB
    row["dispatch centralized object-store s"] = estimate_dispatch(object_store(cm), "centralized", ex, tr, batch,
                                                                   CONTEXT_MEAN).time_s
    row["dispatch centralized RDMA s"] = estimate_dispatch(rdma, "centralized", ex, tr, batch, CONTEXT_MEAN).time_s
    step = sum(row[f"{c} s"] for c in COMPONENTS[:4])
    for kind in ("centralized", "layout-aware"):
        row[f"step with {kind} s"] = step + row[f"dispatch {kind} s"]
    row["centralized share"] = row["dispatch centralized s"] / row["step with centralized s"]
    return row


def crossovers(df: pd.DataFrame) -> pd.DataFrame:
    """For each other component: the first scale where centralized dispatch costs more, and
    the scale where it would by linear extrapolation of both (in GPUs) from the last two points."""
    out = []
    for comp in COMPONENTS[:4] + ("dispatch layout-aware",):
        over = df[df["dispatch centralized s"] > df[f"{comp} s"]]
        first = int(over["gpus"].iloc[0]) if len(over) else None
        est = None
        if first is None and len(df) >= 2:
            a, b = df.iloc[-2], df.iloc[-1]
            dc = (b["dispatch centralized s"] - a["dispatch centralized s"]) / (b["gpus"] - a["gpus"])
            dx = (b[f"{comp} s"] - a[f"{comp} s"]) / (b["gpus"] - a["gpus"])
            if dc > dx:
                est = b["gpus"] + (b[f"{comp} s"] - b["dispatch centralized s"]) / (dc - dx)
        out.append({"component": comp, "centralized exceeds it from (GPUs)": first if first else "not in sweep",
                    "extrapolated (GPUs)": f"~{est:,.0f}" if est else ("-" if first else "never (linear)")})
    return pd.DataFrame(out)


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    df = pd.DataFrame([one_scale(g) for g in (QUICK_SCALES if quick else SCALES)])
    write_csv(df, out, NAME)
    print_table(df, f"Study 7: one RL step vs cluster size, {MODEL}, {SEQS_PER_GPU} sequences/GPU x "
                    f"{CONTEXT_MEAN:,} tokens ({NETWORK})",
                ["gpus", "batch", "rollout s", "experience s", "train s", "weight sync s",
                 "dispatch centralized s", "dispatch layout-aware s", "centralized share",
                 "dispatch centralized controller GiB"])
    print_table(df, "Study 7: the cost-model selector's plans", ["gpus", "rollout plan", "experience plan",
                                                                 "train plan"])
    cross = crossovers(df)
    print_table(cross, "Study 7: where centralized dispatch overtakes each other part of the step")
    plot(df, cross, out)
    return df


def plot(df: pd.DataFrame, cross: pd.DataFrame, out: Path) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1.25, 1]})
    styles = {"rollout": ("tab:green", "--"), "experience": ("tab:olive", "-"), "train": ("tab:purple", "-"),
              "weight sync": ("tab:gray", "-"), "dispatch centralized": ("tab:red", "-"),
              "dispatch layout-aware": ("tab:blue", "-")}
    for comp, (color, ls) in styles.items():
        ax1.plot(df["gpus"], df[f"{comp} s"], ls, color=color, marker="o", ms=4, label=comp,
                 lw=2.2 if "dispatch" in comp else 1.4)
    ax1.plot(df["gpus"], df["dispatch centralized object-store s"], ":", color="tab:red", lw=1.4,
             label="dispatch centralized, object-store controller (0.8 GB/s)")
    for g in HIGHLIGHT:
        if g in set(df["gpus"]):
            ax1.axvline(g, color="0.7", lw=0.8, ls=":")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xticks(list(df["gpus"]), [f"{g:,}" for g in df["gpus"]], rotation=30)
    ax1.set_xlabel("GPUs (batch grows with them: 4 sequences per GPU)")
    ax1.set_ylabel("seconds per RL step")
    ax1.set_title("Per-step cost of each part vs cluster size")
    ax1.grid(True, which="both", alpha=0.25)
    top = max(df[f"{c} s"].max() for c in styles)
    ax1.set_ylim(top=top * 80)  # room for the legend above the curves
    ax1.legend(fontsize=7, loc="upper left", ncol=2)
    ax2.axis("off")
    rows = df[df["gpus"].isin(HIGHLIGHT)] if df["gpus"].isin(HIGHLIGHT).any() else df
    cell = [[f"{r['gpus']:,}", r["rollout plan"].removesuffix("-mb1"), r["experience plan"], r["train plan"],
             f"{r['centralized share']:.1%}"] for _, r in rows.iterrows()]
    table = ax2.table(cellText=cell, colLabels=["GPUs", "rollout", "experience", "train", "centr.\nshare"],
                      loc="upper center", cellLoc="center", colWidths=[0.1, 0.2, 0.25, 0.38, 0.1])
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1, 2.2)
    ax2.set_title("Cost-model selector's plans at each scale\n(centr. share: centralized dispatch / step time)")
    t2 = ax2.table(cellText=[[r["component"], str(r["centralized exceeds it from (GPUs)"]), r["extrapolated (GPUs)"]]
                             for _, r in cross.iterrows()],
                   colLabels=["centralized dispatch exceeds", "from (sweep)", "extrapolated"],
                   loc="lower center", cellLoc="center", colWidths=[0.4, 0.25, 0.25])
    t2.auto_set_font_size(False)
    t2.set_fontsize(7.5)
    t2.scale(1, 1.6)
    return save_figure(fig, out, NAME, ASSUMPTIONS)


if __name__ == "__main__":
    main(run, __doc__)
