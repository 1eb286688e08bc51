"""Study 6: what choosing the training plan (tp/pp/cp/dp, micro-batch, activation recompute,
sharded optimizer) at every step buys as context grows, against fixed plans.

The EARL paper selects parallelism for rollout only and leaves training to future work. Here
the cost model ranks every training plan at each context length; we compare the best plan per
context with (a) the plan tuned at the start of training (short context) and kept, and (b) a
conservative plan tuned for the longest context and used throughout.

    python studies/s6_train_plans.py [--out docs/figures] [--quick]     # or: earl study s6
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from common import HARDWARE, MODEL, PAPER_GPUS, context_label, main, print_table, save_figure, write_csv

from earl.cost_model.resolve import make_cost_model
from earl.cost_model.search import rank_plans

NAME = "s6_train_plans"
BATCH = 512  # sequences per optimizer step (64 prompts x 8 responses)
MARGIN = 0.10  # device memory kept free, as the cost-model selector does
CONTEXTS = (2048, 4096, 8192, 16384, 32768, 65536)
QUICK_CONTEXTS = (2048, 32768)
ASSUMPTIONS = (
    f"{MODEL} on {PAPER_GPUS} x {HARDWARE} (16 nodes, NVLink inside a node, 200 Gbps RDMA between nodes; "
    "datasheet profile). One optimizer step over a global batch of "
    f"{BATCH} sequences of `context` tokens (bf16 weights, fp32 grads + Adam, FlashAttention). "
    "Plan space: tp in {1,2,4,8} (inside a node) x pp dividing 80 layers x cp in {1,2,4,8,16} x dp = rest, "
    "micro-batch {1,2,4,8}, recompute none/selective/full, optionally ZeRO-sharded optimizer over dp x cp "
    "(earl.cost_model enumerate_plans); throughput = trained tokens/s/GPU from cost model `train`. "
    "'tuned at start' = best plan at the shortest context, 'tuned for longest' = best plan at the longest "
    "context, both kept for every step; "
    f"'selected' keeps {MARGIN:.0%} of device memory free at every context (as the cost-model selector does); "
    f"the fixed plans were chosen with that margin at their tuning context, later count as OOM only when they do "
    f"not fit at all ('tight': fits with under {MARGIN:.0%} free)."
)


def with_margin(ranked: list) -> list:
    """The ranked (plan, estimate) pairs that keep MARGIN of device memory free; if none does,
    the best plan that fits at all."""
    safe = [(p, e) for p, e in ranked if e.feasible and e.memory.total <= (1 - MARGIN) * e.memory.capacity]
    return safe or ranked[:1]


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    cm = make_cost_model(MODEL, HARDWARE, PAPER_GPUS, "rdma-200g")
    ctxs = QUICK_CONTEXTS if quick else CONTEXTS
    ranked = {c: rank_plans(cm, "train", PAPER_GPUS, BATCH, c) for c in ctxs}
    safe = {c: with_margin(r) for c, r in ranked.items()}
    start_plan = safe[ctxs[0]][0][0]
    long_plan = safe[ctxs[-1]][0][0]
    rows = []
    for c in ctxs:
        best, best_e = safe[c][0]
        feasible = sum(e.feasible for _, e in ranked[c])
        row = {"context": c, "plans": len(ranked[c]), "feasible plans": feasible,
               "with margin": len(safe[c]) if safe[c][0][1].memory.headroom_frac >= MARGIN else 0,
               "no-margin best plan": ranked[c][0][0].describe(),
               "no-margin best tok/s/GPU": ranked[c][0][1].tokens_per_gpu_s,
               "best plan": best.describe() if best_e.feasible else "none",
               "best tok/s/GPU": best_e.tokens_per_gpu_s, "best step s": best_e.time_s,
               "best MFU": best_e.mfu,
               "best mem GiB": best_e.memory.total / 2**30 if best_e.memory else float("nan")}
        for label, plan in (("tuned at start", start_plan), ("tuned for longest", long_plan)):
            e = cm.train(plan, BATCH, c) if c % plan.cp == 0 else None
            ok = e is not None and e.feasible
            row[f"{label} plan"] = plan.describe()
            row[f"{label} tok/s/GPU"] = e.tokens_per_gpu_s if ok else 0.0
            tight = ok and e.memory.headroom_frac < MARGIN
            row[f"{label} status"] = ("tight" if tight else "ok") if ok else ("OOM" if e is not None else "invalid cp")
            row[f"gain vs {label}"] = best_e.tokens_per_gpu_s / e.tokens_per_gpu_s if ok else float("inf")
        rows.append(row)
    df = pd.DataFrame(rows)
    write_csv(df, out, NAME)
    print_table(df, f"Study 6: training plan per context, {MODEL} on {PAPER_GPUS} GPUs, batch {BATCH} "
                    f"(tuned at start: {start_plan.describe()}; tuned for longest: {long_plan.describe()})",
                ["context", "feasible plans", "with margin", "best plan", "best tok/s/GPU", "best MFU", "best mem GiB",
                 "tuned at start tok/s/GPU", "tuned at start status", "gain vs tuned at start",
                 "tuned for longest tok/s/GPU", "gain vs tuned for longest"])
    plot(df, out, start_plan.describe(), long_plan.describe(), int(df["plans"].max()))
    return df


def plot(df: pd.DataFrame, out: Path, start: str, longest: str, space: int) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.8), gridspec_kw={"width_ratios": [1.3, 1]})
    x = list(range(len(df)))
    ax1.plot(x, df["best tok/s/GPU"], "-o", color="tab:green", label="best plan per context (selected)")
    ax1.plot(x, df["tuned at start tok/s/GPU"].replace(0.0, float("nan")), "--s", color="tab:red",
             label=f"fixed: tuned at start ({start})")
    ax1.plot(x, df["tuned for longest tok/s/GPU"], ":^", color="tab:blue",
             label=f"fixed: tuned for longest ({longest})")
    for i, r in df.iterrows():
        if r["tuned at start status"] not in ("ok", "tight"):
            ax1.annotate(r["tuned at start status"], (i, 0), color="tab:red", ha="center", va="bottom", fontsize=8,
                         fontweight="bold")
        ax1.annotate(r["best plan"].replace("-mb", "\nmb"), (i, r["best tok/s/GPU"]), textcoords="offset points",
                     xytext=(0, 6), ha="center", fontsize=6.5, color="tab:green")
    ax1.set_xticks(x, [context_label(c) for c in df["context"]])
    ax1.set_xlabel("context length (tokens per sequence)")
    ax1.set_ylabel("trained tokens/s per GPU")
    ax1.set_ylim(0, df["best tok/s/GPU"].max() * 1.3)
    ax1.set_title(f"Training throughput: selecting the plan per context (up to {space} plans)")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=7.5, loc="lower left", bbox_to_anchor=(0, 0.06))
    gains = [("tuned at start", "tab:red"), ("tuned for longest", "tab:blue")]
    w = 0.38
    for k, (label, color) in enumerate(gains):
        vals = [v if v != float("inf") else 0 for v in df[f"gain vs {label}"]]
        bars = ax2.bar([i + (k - 0.5) * w for i in x], vals, w, color=color, alpha=0.8, label=f"vs {label}")
        for b, v in zip(bars, df[f"gain vs {label}"], strict=True):
            ax2.annotate("OOM" if v == float("inf") else f"{v:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                         ha="center", va="bottom", fontsize=7)
    ax2.axhline(1, color="0.3", lw=0.8)
    ax2.set_xticks(x, [context_label(c) for c in df["context"]])
    ax2.set_xlabel("context length (tokens per sequence)")
    ax2.set_ylabel("speedup of the selected plan")
    ax2.set_title("What per-step selection buys")
    ax2.legend(fontsize=8)
    ax2.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, out, NAME, ASSUMPTIONS)


if __name__ == "__main__":
    main(run, __doc__)
