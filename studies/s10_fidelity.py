"""Study 10: fidelity: the cost model's predictions next to published measurements, with the
error of each and the assumptions it rests on (docs/fidelity.md's table comes from here).

Rows:
- EARL (Tan et al. 2025, arXiv 2510.05943), Fig. 4: centralized / layout-aware dispatch latency
  on 128 H100 over 200 Gbps TCP, Qwen2.5-72B, tp4, batch 1024, at 8K / 16K / 32K context:
  measured 9.7x / 11.0x / 11.2x. Predicted with the default profile, TCP incast 0.5 (assumed).
- Megatron-Core (NVIDIA/Megatron-LM README, "Training Speed and Scalability"): GPT-3 175B
  ("slightly more than 175 billion parameters": vocab 131,072, sequence 4,096; 96 layers, hidden
  12,288, 96 heads), strong-scaled on H100 at a global batch of 1,152 sequences throughout, with
  DP (`--overlap-grad-reduce --overlap-param-gather`), TP (`--tp-comm-overlap`) and PP
  communication overlapped: MFU 47% at 96 GPUs, 42% at 4,608 (images/strong_scaling.png).
  The published plan: the README's model table (images/model_table.png, read from the image in
  the repository, commit d98e8a64dd): the 177B row is TP 8 x PP 6 x DP 48 on 2,304 GPUs, batch
  1,152, 432.8 TFLOP/s per GPU, 44% MFU; the strong-scaling run is that model at that batch, so
  TP 8 x PP 6 with DP = GPUs / 48 (DP 2 at 96, 96 at 4,608; every point of the figure is a
  multiple of 48). Not in the README, assumed here: micro-batch 1 (Megatron's GPT-3 175B example
  script's), the distributed optimizer (what --overlap-param-gather runs on), and the two
  constants below, each varied in study s8 (`s8_sensitivity_megatron.csv`):
  MEGATRON_VIRTUAL_STAGES = 4 (4 layers per virtual stage, the value Megatron's parallelism
  guide shows; at 4,608 GPUs each pipeline gets 12 micro-batches for 6 stages, so without
  interleaving the bubble alone would cap MFU near 33%) and MEGATRON_TP_OVERLAP = 0.5 (the share
  of TP communication `--tp-comm-overlap` hides; see its comment). The 2,304-GPU table row is a
  third point on the same plan. Also predicted: the best plan the cost model's own search picks
  (`earl plan train`), with the profile's default overlap (TP 0, DP bucketed) and with TP 0.5. All
  on DGX H100 nodes (8 x 400 Gb/s NDR); the least activation recompute that fits.
- Vidur (Agrawal et al., MLSys 2024) per-operator GEMM times measured on H100 and A100
  (studies/kernel_refs.py): the four GEMMs of one layer of Qwen-72B (held out of the fit) on one
  tp-4 shard at 16 / 512 / 4,096 tokens; the whole table (384 cells, both Llama-2 models too)
  goes to s10_fidelity_kernels.csv with its summary.

    python studies/s10_fidelity.py [--out docs/figures] [--quick]     # or: earl study s10
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kernel_refs
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import MODEL, PAPER_GPUS, main, print_table, save_figure, write_csv

from earl.cost_model import rank_plans
from earl.cost_model.resolve import make_cost_model
from earl.policies.dispatch_cost import estimate_dispatch
from earl.specs import ModelSpec, ParallelPlan

NAME = "s10_fidelity"
# GPT-3 175B as Megatron-Core's README strong-scales it (vocab 131,072; GELU MLP)
GPT3 = ModelSpec(name="gpt3-175b", num_layers=96, hidden_size=12288, num_heads=96, num_kv_heads=96,
                 head_dim=128, ffn_hidden=4 * 12288, vocab_size=131072, gated_mlp=False)
EARL_FIG4 = {8192: 9.7, 16384: 11.0, 32768: 11.2}
MEGATRON_MFU = {96: 0.47, 4608: 0.42}  # strong scaling (README figure)
MEGATRON_TABLE_MFU = {2304: 0.44}  # the model table's 177B row, same plan and batch
MEGATRON_BATCH, MEGATRON_SEQ = 1152, 4096
MEGATRON_MODEL_PARALLEL = 48  # TP 8 x PP 6: DP = GPUs / 48
MEGATRON_VIRTUAL_STAGES = 4  # assumed (see the docstring)
# assumed share of TP communication hidden by --tp-comm-overlap (Transformer Engine userbuffers).
# Its GPT-3 175B H100 configuration (NeMo / Megatron-Bridge `userbuffers_bf16_h100_h12288_tp4_
# mbs1_seqlen2048`) overlaps every TP collective of a layer: 6 by ring exchange or 4-way pipelined
# splits (1/tp to 1/4 of each left exposed), 4 in bulk under an independent GEMM, so at most
# ~85% is hidden; the overlapped collectives take 1-24 of the 132 SMs from those GEMMs, which
# costs back part of it: 0.5 sits between none and that bound (s8 varies it 0-0.9)
MEGATRON_TP_OVERLAP = 0.5


def megatron_plan(gpus: int, recompute: str = "none", virtual_stages: int = MEGATRON_VIRTUAL_STAGES) -> ParallelPlan:
    """Megatron's published GPT-3 175B plan on `gpus` H100 (see the docstring)."""
    return ParallelPlan(tp=8, pp=6, dp=gpus // MEGATRON_MODEL_PARALLEL, micro_batch=1, virtual_stages=virtual_stages,
                        sharded_optimizer=True, recompute=recompute)


def megatron_published(gpus: int, tp_overlap: float = MEGATRON_TP_OVERLAP,
                       virtual_stages: int = MEGATRON_VIRTUAL_STAGES):
    """(plan, train estimate) of the published plan with the least recompute that fits."""
    base = make_cost_model(GPT3, "h100-sxm-80gb", gpus, "ib-ndr400x8")
    cm = base.with_profile(dataclasses.replace(base.profile, tp_comm_overlap=tp_overlap))
    return next((p, e) for p, e in ((p, cm.train(p, MEGATRON_BATCH, MEGATRON_SEQ)) for p in (
        megatron_plan(gpus, r, virtual_stages) for r in ("none", "selective", "full"))) if e.feasible)


KERNEL_ROWS = {"model": "qwen-72b", "tp": 4, "tokens": (16, 512, 4096)}
ASSUMPTIONS = (
    "EARL Fig. 4 rows: earl estimate dispatch (the TransferPlan of each dispatcher priced by earl.cost_model.dispatch; "
    "tcp-200g = 60% of 200 Gb/s, 30 us, incast efficiency 0.5 (assumed); the controller packs like any rank). "
    "Megatron rows: the best plan of `earl plan train` for GPT-3 175B, seq 4096, batch 1152 on DGX H100 "
    "(ib-ndr400x8), datasheet profile (GEMMs fitted to measured H100 GEMMs: 74% of peak, 1.5-norm; attention 55%, "
    "HBM 90%), DP gradients bucketed and "
    "overlapped; 'TP overlap 0.5': half the tensor-parallel communication hidden (assumed); 'published plan': "
    "the README model table's tp8 pp6, DP = GPUs / 48, micro-batch 1, 4 virtual stages (assumed), distributed "
    "optimizer, least recompute that fits. "
    "Vidur rows: per-layer GEMM time (4 GEMMs, one shard); datasheet curves fitted to Llama-2 7B/70B, Qwen-72B "
    "held out."
)


def dispatch_rows(quick: bool) -> list[dict]:
    cm = make_cost_model(MODEL, "h100-sxm-80gb", PAPER_GPUS, "tcp-200g")
    plan = ParallelPlan(tp=4, dp=PAPER_GPUS // 4)
    rows = []
    for ctx, paper in EARL_FIG4.items():
        if quick and ctx != 32768:
            continue
        c = estimate_dispatch(cm, "centralized", plan, plan, 1024, ctx)
        a = estimate_dispatch(cm, "layout-aware", plan, plan, 1024, ctx)
        rows.append({"reference": "EARL Fig. 4 (measured)", "quantity": f"dispatch ratio, {ctx // 1024}K",
                     "published": paper, "predicted": c.time_s / a.time_s, "unit": "x",
                     "setting": "qwen2.5-72b, 128 H100, tcp-200g, tp4, batch 1024"})
    return rows


def megatron_rows(quick: bool, *, published: bool = False) -> list[dict]:
    """Megatron-Core's GPT-3 175B MFU next to the model's: on the model's own best plan (with
    the profile's TP overlap and with MEGATRON_TP_OVERLAP), or (`published`) on the published
    plan with MEGATRON_TP_OVERLAP, and with none."""
    rows = []
    refs = {**MEGATRON_MFU, **(MEGATRON_TABLE_MFU if published else {})}
    for gpus, paper in sorted(refs.items()):
        if quick and gpus != 96:
            continue
        src = "Megatron-Core README (measured)" if gpus in MEGATRON_MFU else "Megatron-Core README table (measured)"
        for ov in ((MEGATRON_TP_OVERLAP, 0.0) if published else (0.0, MEGATRON_TP_OVERLAP)):
            label = f", TP overlap {ov:g}" if ov else ""
            if published:
                plan, est = megatron_published(gpus, ov)
                what, setting = ", published plan", plan.describe()
            else:
                base = make_cost_model(GPT3, "h100-sxm-80gb", gpus, "ib-ndr400x8")
                cm = base.with_profile(dataclasses.replace(base.profile, tp_comm_overlap=ov))
                plan, est = next((p, e) for p, e in rank_plans(cm, "train", gpus, MEGATRON_BATCH, MEGATRON_SEQ)
                                 if e.feasible)
                what, setting = "", f"model's plan {plan.describe()}"
            rows.append({"reference": src, "quantity": f"GPT-3 175B MFU, {gpus:,} H100{what}{label}",
                         "published": paper, "predicted": est.mfu, "unit": "MFU",
                         "setting": f"seq 4096, batch 1152, ib-ndr400x8; {setting}"})
    return rows


def kernel_table(out: Path, quick: bool) -> tuple[pd.DataFrame, list[dict]]:
    """The whole measured-GEMM comparison (written beside the study) and its headline rows."""
    table = kernel_refs.compare()
    write_csv(table, out, f"{NAME}_kernels")
    summ = kernel_refs.summary(table)
    print_table(summ, "Per-layer GEMM time vs Vidur's measured H100 / A100 GEMMs", list(summ.columns))
    rows = []
    pick = table[(table["model"] == KERNEL_ROWS["model"]) & (table["tp"] == KERNEL_ROWS["tp"])
                 & table["tokens"].isin((512,) if quick else KERNEL_ROWS["tokens"])]
    for _, r in pick.iterrows():
        rows.append({"reference": "Vidur profiles (measured)",
                     "quantity": f"{r['hardware'].upper()} per-layer GEMM time, {r['model']} tp{r['tp']}, "
                                 f"{r['tokens']} tokens",
                     "published": r["layer measured us"], "predicted": r["layer predicted us"], "unit": "us",
                     "setting": "qkv + o + MLP up + down, one shard; held out of the fit"})
    return table, rows


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    _, kernel_rows = kernel_table(out, quick)
    df = pd.DataFrame(dispatch_rows(quick) + megatron_rows(quick) + megatron_rows(quick, published=True) + kernel_rows)
    df["error"] = df["predicted"] / df["published"] - 1
    write_csv(df, out, NAME)
    print_table(df, "Study 10: predicted vs published", ["reference", "quantity", "published", "predicted", "error",
                                                        "setting"])
    plot(df, out)
    return df


def plot(df: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(df) + 1.6))
    y = np.arange(len(df))
    colors = {"EARL": "tab:blue", "Megatron": "tab:purple", "Vidur": "tab:green"}
    ax.barh(y, df["error"] * 100, color=[next(c for k, c in colors.items() if r.startswith(k))
                                         for r in df["reference"]])
    ax.axvline(0, color="black", lw=1)
    for lim in (-30, 30):
        ax.axvline(lim, color="0.5", ls="--", lw=1)
    for yi, (_, r) in zip(y, df.iterrows(), strict=True):
        ax.annotate(f"{r['predicted']:.3g} vs {r['published']:.3g}", (r["error"] * 100, yi), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(y, df["quantity"], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("prediction error vs the published measurement (%)")
    ax.set_title("Cost model vs published measurements (dashed: +-30%)")
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, out, NAME, ASSUMPTIONS)


if __name__ == "__main__":
    main(run, __doc__)
