"""Study 2: how much intermediate data one RL step hands from experience preparation to
training, and how long a centralized controller takes to move it, as context grows.

On 1,024 H100s the batch of token ids, masks, two log-prob tensors, advantages and rewards
grows linearly with context; a single controller gathers all of it through one NIC and then
scatters to every tensor-parallel rank of the trainers what its pipeline stage needs (the
first stage: token ids; the last: everything). Times are the one dispatch price of the
dispatcher's TransferPlan (earl.cost_model.dispatch). By default the controller packs like any
other rank; the dotted lines put it behind an object store at 0.8 GB/s (the EARL paper's "~1 TB
took over 20 minutes" anecdote), a named option, not the default.

    python studies/s2_data_volume.py [--out docs/figures] [--quick]     # or: earl study s2
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from common import (
    GIB,
    HARDWARE,
    MODEL,
    NETWORKS,
    context_label,
    controller_note,
    main,
    object_store,
    print_table,
    save_figure,
    write_csv,
)

from earl.cost_model.resolve import make_cost_model
from earl.policies.dispatch_cost import estimate_dispatch
from earl.specs import TENSOR_BYTES_PER_SAMPLE, TENSOR_BYTES_PER_TOKEN, ParallelPlan

NAME = "s2_data_volume"
GPUS = 1024
BATCH = 4096  # sequences per RL step: 512 prompts x 8 responses, 4 per GPU
SRC = ParallelPlan(tp=8, dp=GPUS // 8)  # experience preparation (log-prob) layout: producers
DST = ParallelPlan(tp=8, pp=4, dp=GPUS // 32)  # training layout: consumers
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
QUICK_CONTEXTS = (1024, 32768)
# tensors grouped as the figure shows them
GROUPS = {
    "tokens (ids + mask)": ("input_ids", "loss_mask"),
    "log-probs (old + ref)": ("old_logprobs", "ref_logprobs"),
    "advantages": ("advantages",),
}


def assumptions(cm) -> str:
    return (
        f"{MODEL} on {GPUS} x {HARDWARE} (128 nodes, NVLink inside a node, 200 Gbps NIC per node; "
        "TCP = 60% of line rate + 30 us, RDMA = 90% + 3 us). "
        f"Batch {BATCH} sequences (512 prompts x 8 responses) of `context` tokens each. Bytes per token: "
        + ", ".join(f"{k} {v}" for k, v in TENSOR_BYTES_PER_TOKEN.items())
        + "; rewards 4 per sequence (GRPO: no value/return tensors; PPO would add two fp32 tensors). "
        f"Producers {SRC.short()} (log-prob layout), consumers {DST.short()} (training layout). "
        "Times: centralized gathers to one controller then scatters each tp rank what its pipeline stage needs; "
        "layout-aware sends producer to consumer directly; " + controller_note(cm)
        + "; dotted: the centralized controller behind an object store at 0.8 GB/s (named option)."
    )


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    cms = {net: make_cost_model(MODEL, HARDWARE, GPUS, name) for net, name in NETWORKS.items()}
    rows = []
    for ctx in QUICK_CONTEXTS if quick else CONTEXTS:
        row = {"context": ctx}
        for group, names in GROUPS.items():
            row[f"{group} GiB"] = BATCH * ctx * sum(TENSOR_BYTES_PER_TOKEN[n] for n in names) / GIB
        row["rewards GiB"] = BATCH * sum(TENSOR_BYTES_PER_SAMPLE.values()) / GIB
        row["payload GiB"] = BATCH * (ctx * sum(TENSOR_BYTES_PER_TOKEN.values())
                                      + sum(TENSOR_BYTES_PER_SAMPLE.values())) / GIB
        for net, cm in cms.items():
            row[f"centralized {net} object-store s"] = estimate_dispatch(object_store(cm), "centralized", SRC, DST,
                                                                         BATCH, ctx).time_s
            for kind in ("centralized", "layout-aware"):
                est = estimate_dispatch(cm, kind, SRC, DST, BATCH, ctx)
                row[f"{kind} {net} s"] = est.time_s
                if net == "TCP":
                    if kind == "layout-aware":
                        row["delivered GiB"] = est.extras["moved_bytes"] / GIB
                    row[f"{kind} controller GiB"] = est.extras["controller_bytes"] / GIB
        rows.append(row)
    df = pd.DataFrame(rows)
    write_csv(df, out, NAME)
    print_table(df, f"Study 2: intermediate data per RL step, {MODEL} on {GPUS} GPUs, batch {BATCH}",
                ["context", "payload GiB", "delivered GiB", "centralized controller GiB", "centralized TCP s",
                 "centralized RDMA s", "centralized TCP object-store s", "layout-aware TCP s",
                 "layout-aware RDMA s"])
    plot(df, out, cms["TCP"])
    return df


def plot(df: pd.DataFrame, out: Path, cm) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    x = range(len(df))
    bottom = [0.0] * len(df)
    for col in [f"{g} GiB" for g in GROUPS] + ["rewards GiB"]:
        ax1.bar(x, df[col], bottom=bottom, label=col.removesuffix(" GiB"))
        bottom = [b + v for b, v in zip(bottom, df[col], strict=True)]
    for i, (tot, dl) in enumerate(zip(df["payload GiB"], df["delivered GiB"], strict=True)):
        ax1.annotate(f"{tot:.2f} GiB\n({dl:.1f} GiB\ndelivered)", (i, tot), ha="center", va="bottom", fontsize=7)
    ax1.set_xticks(list(x), [context_label(c) for c in df["context"]])
    ax1.set_xlabel("context length (tokens per sequence)")
    ax1.set_ylabel("experience batch (GiB)")
    ax1.set_ylim(0, max(bottom) * 1.35)
    ax1.set_title(f"Intermediate data per step ({BATCH} sequences)")
    ax1.legend(fontsize=8, loc="upper left")
    colors = {"TCP": "tab:red", "RDMA": "tab:blue"}
    for net, c in colors.items():  # RDMA drawn thinner on top so a coinciding TCP line stays visible
        ax2.plot(df["context"], df[f"centralized {net} s"], "-", color=c, marker="o", lw=3.5 if net == "TCP" else 1.4,
                 ms=7 if net == "TCP" else 4, label=f"centralized, {net}")
    for net, c in colors.items():
        ax2.plot(df["context"], df[f"centralized {net} object-store s"], ":", color=c, lw=1.2,
                 label=f"centralized, {net}, object-store controller (0.8 GB/s)")
    for net, c in colors.items():
        ax2.plot(df["context"], df[f"layout-aware {net} s"], "--", color=c, marker="o", label=f"layout-aware, {net}")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(list(df["context"]), [context_label(c) for c in df["context"]])
    ax2.set_xlabel("context length (tokens per sequence)")
    ax2.set_ylabel("dispatch time per step (s)")
    ax2.set_title(f"Moving it: {SRC.short()} -> {DST.short()}")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7, loc="upper left")
    ax2.set_ylim(top=df["centralized TCP object-store s"].max() * 10)
    return save_figure(fig, out, NAME, assumptions(cm))


if __name__ == "__main__":
    main(run, __doc__)
