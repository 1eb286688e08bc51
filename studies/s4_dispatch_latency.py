"""Study 4: the EARL paper's Fig. 4, reproduced: dispatch latency of the experience tensors,
centralized gather-and-scatter vs layout-aware all-to-all, Qwen2.5-72B on 128 H100 (16 nodes,
one 200 Gbps NIC each), tp4 on both sides, batch 1024, at 8K, 16K and 32K context, over TCP (the
paper's network) and RDMA; the predicted ratio next to the paper's measured 9.7x / 11.0x / 11.2x.

Times are the one dispatch price (earl.cost_model.dispatch) of the TransferPlan each dispatcher
returns, with the default profile and network constants; the assumptions that move the ratio
most are named in the footer and varied in study s8: TCP incast efficiency (0.5), the
controller path (packing like any rank; the object-store option, 0.8 GB/s, is shown apart).

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
    object_store,
    print_table,
    save_figure,
    write_csv,
)

from earl.cost_model.resolve import make_cost_model
from earl.policies.dispatch_cost import estimate_dispatch
from earl.specs import TENSOR_BYTES_PER_TOKEN, ParallelPlan

NAME = "s4_dispatch_latency"
BATCH = 1024  # the paper's Fig. 4 batch
SRC = DST = ParallelPlan(tp=4, dp=PAPER_GPUS // 4)
CONTEXTS = (8192, 16384, 32768)
QUICK_CONTEXTS = (8192, 32768)
# EARL paper (Tan et al. 2025, arXiv 2510.05943), Fig. 4: measured centralized / layout-aware
# latency ratio on 128 H100 over 200 Gbps TCP (46 / 93 / 187 MiB per worker)
PAPER_RATIO = {8192: 9.7, 16384: 11.0, 32768: 11.2}


def assumptions(cm) -> str:
    return (
        f"{MODEL} on {PAPER_GPUS} x {HARDWARE} (16 nodes, NVLink inside a node, one 200 Gbps NIC per node; "
        "TCP = 60% of line rate + 30 us, RDMA = 90% + 3 us). "
        f"Batch {BATCH} sequences of `context` tokens ({sum(TENSOR_BYTES_PER_TOKEN.values())} B/token: ids, mask, "
        "old and reference log-probs, advantages; plus rewards). Producers and consumers both "
        f"{SRC.short()}; producer d holds a contiguous block of the batch, consumer d takes samples i = d mod 32. "
        + controller_note(cm) + ". Paper ratios: EARL (Tan et al. 2025) Fig. 4, measured."
    )


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    rows = []
    for net, net_name in NETWORKS.items():
        cm = make_cost_model(MODEL, HARDWARE, PAPER_GPUS, net_name)
        store = object_store(cm)
        for ctx in QUICK_CONTEXTS if quick else CONTEXTS:
            c = estimate_dispatch(cm, "centralized", SRC, DST, BATCH, ctx)
            a = estimate_dispatch(cm, "layout-aware", SRC, DST, BATCH, ctx)
            ratio = c.time_s / a.time_s
            paper = PAPER_RATIO[ctx] if net == "TCP" else float("nan")
            rows.append({
                "network": net, "context": ctx,
                "per consumer MiB": a.extras["moved_bytes"] / PAPER_GPUS / 2**20,
                "moved GiB (layout-aware)": a.extras["moved_bytes"] / GIB,
                "controller GiB (centralized)": c.extras["controller_bytes"] / GIB,
                "centralized s": c.time_s, "gather s": c.breakdown["gather"], "scatter s": c.breakdown["scatter"],
                "controller advantages s": c.breakdown["advantages"],
                "layout-aware s": a.time_s, "all-to-all s": a.breakdown["alltoall"],
                "advantage stats s": a.breakdown["advantage_stats"],
                "speedup": ratio, "paper speedup": paper, "error vs paper": ratio / paper - 1,
                "centralized object-store s": estimate_dispatch(store, "centralized", SRC, DST, BATCH, ctx).time_s,
            })
    df = pd.DataFrame(rows)
    df["object-store speedup"] = df["centralized object-store s"] / df["layout-aware s"]
    write_csv(df, out, NAME)
    print_table(df, f"Study 4 (EARL Fig. 4): dispatch latency, {MODEL} on {PAPER_GPUS} GPUs, batch {BATCH}, "
                    f"{SRC.short()} -> {DST.short()}",
                ["network", "context", "per consumer MiB", "gather s", "scatter s", "centralized s", "all-to-all s",
                 "layout-aware s", "speedup", "paper speedup", "error vs paper", "centralized object-store s",
                 "object-store speedup"])
    plot(df, out, make_cost_model(MODEL, HARDWARE, PAPER_GPUS, NETWORKS["TCP"]))
    return df


def plot(df: pd.DataFrame, out: Path, cm) -> Path:
    nets = list(dict.fromkeys(df["network"]))
    fig, axes = plt.subplots(1, len(nets), figsize=(10.5, 4.6), sharey=True)
    axes = np.atleast_1d(axes)
    w = 0.38
    for ax, net in zip(axes, nets, strict=True):
        sub = df[df["network"] == net].reset_index(drop=True)
        x = np.arange(len(sub))
        ax.bar(x - w / 2, sub["gather s"], w, color="tab:red", alpha=0.55, label="centralized: gather")
        ax.bar(x - w / 2, sub["scatter s"], w, bottom=sub["gather s"], color="tab:red", label="centralized: scatter")
        ax.bar(x + w / 2, sub["layout-aware s"], w, color="tab:blue", label="layout-aware all-to-all")
        for i, r in sub.iterrows():
            paper = "" if np.isnan(r["paper speedup"]) else f"\npaper {r['paper speedup']:.1f}x"
            ax.annotate(f"{r['centralized s'] * 1e3:.0f} ms", (i - w / 2, r["centralized s"]), ha="center",
                        va="bottom", fontsize=8)
            ax.annotate(f"{r['layout-aware s'] * 1e3:.0f} ms\nmodel {r['speedup']:.1f}x{paper}",
                        (i + w / 4, r["layout-aware s"]), ha="left", va="bottom", fontsize=8, color="tab:blue")
        ax.set_xticks(x, [context_label(c) for c in sub["context"]])
        ax.set_xlabel("context length (tokens per sequence)")
        ax.set_title(f"{net} (200 Gbps per node)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("dispatch latency per step (s)")
    axes[0].set_ylim(0, df["centralized s"].max() * 1.3)
    axes[0].legend(fontsize=8, loc="upper left")
    return save_figure(fig, out, NAME, assumptions(cm))


if __name__ == "__main__":
    main(run, __doc__)
