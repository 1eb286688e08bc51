"""Study 4: dispatch latency of the experience tensors (log-probs and the rest) from the
log-prob layout to the training layout: centralized gather-and-scatter vs. layout-aware
all-to-all, at 8K, 16K and 32K context on 128 GPUs, over TCP and over RDMA. The centralized
controller process moves at most `CostModel.controller_bw_bytes_s` (1 GB/s); the figure marks
what the controller's NIC alone would allow.

    python studies/s4_dispatch_latency.py [--out docs/figures] [--quick]     # or: earl study s4
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import (
    GIB,
    HARDWARE,
    MODEL,
    NETWORKS,
    PAPER_GPUS,
    context_label,
    controller_note,
    main,
    network_only,
    print_table,
    save_figure,
    write_csv,
)

from earl.cost_model.resolve import make_cost_model
from earl.specs import TENSOR_BYTES_PER_TOKEN, ParallelPlan

NAME = "s4_dispatch_latency"
BATCH = 512  # sequences per RL step: 64 prompts x 8 responses, 4 per GPU
SRC = ParallelPlan(tp=8, dp=PAPER_GPUS // 8)
DST = ParallelPlan(tp=8, pp=4, dp=PAPER_GPUS // 32)
CONTEXTS = (8192, 16384, 32768)
QUICK_CONTEXTS = (8192, 32768)


def assumptions(cm) -> str:
    return (
        f"{MODEL} on {PAPER_GPUS} x {HARDWARE} (16 nodes, NVLink inside a node, one 200 Gbps NIC per node; "
        "TCP = 60% of line rate + 30 us per message, RDMA = 90% + 3 us). "
        f"Batch {BATCH} sequences of `context` tokens; the dispatched tensors are the whole experience batch "
        f"({sum(TENSOR_BYTES_PER_TOKEN.values())} B/token: ids, mask, old and reference log-probs, advantages; "
        "log-probs are 8 of those bytes) plus rewards. "
        f"Producers {SRC.short()} (log-prob layout), consumers {DST.short()} (training layout; each tp rank and both "
        "pipeline edges need their samples). Times: earl cost model `dispatch`; " + controller_note(cm)
        + "; black ticks: the centralized dispatch bound by the NIC alone (no controller cap)."
    )


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    rows = []
    for net, net_name in NETWORKS.items():
        cm = make_cost_model(MODEL, HARDWARE, PAPER_GPUS, net_name)
        bare = network_only(cm)
        for ctx in QUICK_CONTEXTS if quick else CONTEXTS:
            c = cm.dispatch("centralized", SRC, DST, BATCH, ctx)
            a = cm.dispatch("layout-aware", SRC, DST, BATCH, ctx)
            rows.append({
                "network": net, "context": ctx,
                "payload GiB": c.extras["payload_bytes"] / GIB,
                "delivered GiB": c.extras["delivered_bytes"] / GIB,
                "centralized s": c.time_s, "gather s": c.breakdown["gather"], "scatter s": c.breakdown["scatter"],
                "centralized NIC-only s": bare.dispatch("centralized", SRC, DST, BATCH, ctx).time_s,
                "layout-aware s": a.time_s, "all-to-all s": a.breakdown["alltoall"],
                "advantage stats s": a.breakdown["advantage_stats"],
                "speedup": c.time_s / a.time_s,
            })
    df = pd.DataFrame(rows)
    write_csv(df, out, NAME)
    print_table(df, f"Study 4: dispatch latency, {MODEL} on {PAPER_GPUS} GPUs, batch {BATCH}, "
                    f"{SRC.short()} -> {DST.short()}",
                ["network", "context", "payload GiB", "delivered GiB", "gather s", "scatter s", "centralized s",
                 "centralized NIC-only s", "all-to-all s", "advantage stats s", "layout-aware s", "speedup"])
    plot(df, out, cm)
    return df


def plot(df: pd.DataFrame, out: Path, cm) -> Path:
    nets = list(dict.fromkeys(df["network"]))
    fig, axes = plt.subplots(1, len(nets), figsize=(10.5, 4.4), sharey=True)
    axes = np.atleast_1d(axes)
    w = 0.38
    for ax, net in zip(axes, nets, strict=True):
        sub = df[df["network"] == net].reset_index(drop=True)
        x = np.arange(len(sub))
        ax.bar(x - w / 2, sub["gather s"], w, color="tab:red", alpha=0.55, label="centralized: gather")
        ax.bar(x - w / 2, sub["scatter s"], w, bottom=sub["gather s"], color="tab:red", label="centralized: scatter")
        ax.bar(x + w / 2, sub["layout-aware s"], w, color="tab:blue", label="layout-aware all-to-all")
        ax.hlines(sub["centralized NIC-only s"], x - w, x, color="black", lw=2,
                  label="centralized, NIC only (no controller cap)")
        for i, r in sub.iterrows():
            ax.annotate(f"{r['centralized s']:.2f} s", (i - w / 2, r["centralized s"]), ha="center", va="bottom",
                        fontsize=8)
            ax.annotate(f"{r['layout-aware s'] * 1e3:.0f} ms\n{r['speedup']:.0f}x faster",
                        (i + w / 4, r["layout-aware s"]), ha="left", va="bottom", fontsize=8, color="tab:blue")
        ax.set_xticks(x, [context_label(c) for c in sub["context"]])
        ax.set_xlabel("context length (tokens per sequence)")
        ax.set_title(f"{net} (200 Gbps per node)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("dispatch latency per step (s)")
    top = df["centralized s"].max()
    axes[0].set_ylim(0, top * 1.2)
    axes[0].legend(fontsize=8, loc="upper left")
    return save_figure(fig, out, NAME, assumptions(cm))


if __name__ == "__main__":
    main(run, __doc__)
