"""Study 8: how each study's conclusion moves when the numbers under it move: the hardware
profile's efficiencies by +-20% (the error bars a calibration could plausibly carry), and every
assumed constant the headlines rest on: TCP incast efficiency, TCP efficiency, the single
controller's path (object store), tensor- and data-parallel overlap, and the OOM restart charge;
and the two constants study s10's Megatron rows assume (TP communication hidden by
--tp-comm-overlap, virtual pipeline stages), over a grid, in s8_sensitivity_megatron.csv.

The matmul, attention and memory-bandwidth efficiency curves of the H100 profile are scaled one
at a time and all together (peak_frac x 0.8 and x 1.2, capped at 100% of the datasheet); each
assumption is set to a plausible other value; the headline number of studies 3, 4, 5, 6 and 7 is
recomputed along with the plan each one picks. Study 5's simulation runs once (static vs the
cost-model selector, centralized dispatch, tp8 start); its restart-charge variants come from the
same run (the charge comes off the wall time exactly); its other cells are left blank.

    python studies/s8_sensitivity.py [--out docs/figures] [--quick]     # or: earl study s8
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import HARDWARE, MODEL, PAPER_GPUS, main, print_table, save_figure, write_csv
from s6_train_plans import BATCH as TRAIN_BATCH
from s6_train_plans import with_margin
from s7_scale import one_scale
from s10_fidelity import MEGATRON_MFU, MEGATRON_TP_OVERLAP, MEGATRON_VIRTUAL_STAGES, megatron_published

from earl.cost_model import CostModel, HardwareProfile, load_profile, rank_plans
from earl.cost_model.profile import with_controller_path
from earl.cost_model.resolve import make_cost_model
from earl.policies.dispatch_cost import estimate_dispatch
from earl.specs import NETWORK_CATALOG, NetworkSpec, ParallelPlan

NAME = "s8_sensitivity"
CURVES = ("matmul", "attention", "memory")
EXTRA_KNOBS = ("nvlink", "kernel overhead")  # beyond the efficiency curves: link and launch costs
SCALES = (0.8, 1.2)
DISPATCH_BATCH = 1024  # the EARL paper's Fig. 4 batch (study s4)
ASSUMPTIONS = (
    f"{MODEL} on {HARDWARE}, datasheet profile (GEMMs fitted to measured H100 GEMMs: 74% of peak, 1.5-norm; "
    "attention 55%, HBM 90%) scaled per curve "
    "by x0.8 / x1.2 ('all curves': the three together); a scaled peak is capped at 100% (HBM +20% becomes +11%). "
    "Beyond the curves: NVLink bandwidth (360 GB/s x0.8 / x1.2, capped at the 450 GB/s datasheet) and the per-kernel "
    "launch overhead (5 us x0.8 / x1.2). "
    "Assumptions (baseline -> variant): TCP incast efficiency 0.5 -> 1.0 / 0.25; TCP efficiency 0.6 -> x0.8 / x1.2; "
    "controller packs like any rank -> object store at 0.8 GB/s; TP overlap 0 -> 0.5; DP gradient overlap on -> off; "
    "OOM restart charge 600 s -> 0. "
    "Metrics as in studies 3 (one engine, tp8 vs tp4 decode), 4 (the EARL paper's Fig. 4: 128 GPUs, TCP, tp4, "
    "batch 1024, 32K; its error vs the paper's 11.2x), 5 (simulated run, cost-model vs static selector), "
    f"6 (128 GPUs, batch {TRAIN_BATCH}, best plan per context with 10% memory margin vs the plan tuned for 32K, at 8K) "
    "and 7 (4,096 GPUs, 4 sequences/GPU, 16K mean context). Dashed line: where the conclusion would flip."
)


def scaled_profile(base: HardwareProfile, knobs: tuple[str, ...], factor: float) -> HardwareProfile:
    """`base` with each named knob scaled by `factor`: an efficiency curve's peak_frac (capped at
    100%), the NVLink bandwidth ('nvlink', capped at the datasheet) or the per-kernel overhead."""
    changes: dict = {}
    for k in knobs:
        if k in CURVES:
            fields = (k, "attention_decode") if k == "attention" and base.attention_decode else (k,)
            for f in fields:  # a calibrated profile may carry a separate decode-attention curve
                curve = getattr(base, f)
                changes[f] = dataclasses.replace(curve, peak_frac=min(1.0, curve.peak_frac * factor))
        elif k == "nvlink":
            cap = base.hardware.intra_bw_bytes_s
            links = {"intra": base.intra, **{f"collective:{c}": v for c, v in base.collective_links.items()}}
            scaled = {n: dataclasses.replace(v, bw_bytes_s=min(cap, v.bw_bytes_s * factor)) for n, v in links.items()}
            changes["intra"] = scaled.pop("intra")
            changes["collective_links"] = {n.split(":", 1)[1]: v for n, v in scaled.items()}
        elif k == "kernel overhead":
            changes["op_overhead_s"] = base.op_overhead_s * factor
        else:
            raise ValueError(f"unknown profile knob {k!r}; valid: {', '.join(CURVES + EXTRA_KNOBS)}")
    return dataclasses.replace(base, **changes)


TCP = NETWORK_CATALOG["tcp-200g"]
# (label, profile change, TCP network change, OOM restart charge s)
ASSUMPTION_VARIANTS = (
    ("TCP incast 1.0 (none)", None, {"incast_efficiency": 1.0}, None),
    ("TCP incast 0.25", None, {"incast_efficiency": 0.25}, None),
    ("TCP efficiency x0.8", None, {"efficiency": TCP.efficiency * 0.8}, None),
    ("TCP efficiency x1.2", None, {"efficiency": TCP.efficiency * 1.2}, None),
    ("controller object-store", lambda p: with_controller_path(p, "object-store"), None, None),
    ("TP overlap 0.5", lambda p: dataclasses.replace(p, tp_comm_overlap=0.5), None, None),
    ("DP overlap off", lambda p: dataclasses.replace(p, dp_grad_overlap=False), None, None),
    ("OOM restart 0 s", None, None, 0.0),
)
RESTART_S = 600.0  # the simulator's default scenario (failure.oom_restart_s)
S5_METRIC = "s5 cost-model vs static selector (tp8 start)"


def s5_ratios(quick: bool) -> dict[float, float]:
    """Study 5's headline (cost-model / static throughput, centralized, tp8 start) with the OOM
    restart charge at RESTART_S and at 0, from one pair of simulations."""
    from s5_end_to_end import QUICK

    from earl.sim.run import simulate
    from earl.sim.scenario import load_scenario

    sc = dataclasses.replace(load_scenario(None, QUICK if quick else {}),
                             compare=("static/centralized", "cost-model/centralized"))
    assert sc.oom_restart_s == RESTART_S, sc.oom_restart_s
    out = {}
    runs = {res.label: res for res in simulate(sc, compare=True)}
    for charge in (RESTART_S, 0.0):
        tput = {}
        for label, res in runs.items():
            wall = sum(r["step_time_s"] for r in res.rows) - sum(r["restart_s"] for r in res.rows) * (charge == 0)
            tput[label] = sum(r["trained_tokens"] for r in res.rows) / wall
        out[charge] = tput["cost-model/centralized"] / tput["static/centralized"]
    return out


def metrics(profile: HardwareProfile, quick: bool, network: NetworkSpec = TCP) -> dict:
    node = make_cost_model(MODEL, HARDWARE, 8).with_profile(profile)
    cm128 = make_cost_model(MODEL, HARDWARE, PAPER_GPUS, "tcp-200g").with_profile(profile)
    cm128 = CostModel(cm128.model, dataclasses.replace(cm128.cluster, network=network), profile)
    m: dict = {}
    for ctx, label in ((32768, "KV-limited: 32K x 32"), (4096, "KV fits: 4K x 32")):
        t4 = node.decode(ParallelPlan(tp=4, dp=1), 32, ctx).tokens_per_gpu_s
        t8 = node.decode(ParallelPlan(tp=8, dp=1), 32, ctx).tokens_per_gpu_s
        m[f"s3 decode tp8/tp4, {label}"] = t8 / t4
    fig4 = ParallelPlan(tp=4, dp=PAPER_GPUS // 4)
    m["s4 layout-aware speedup, 32K TCP"] = (
        estimate_dispatch(cm128, "centralized", fig4, fig4, DISPATCH_BATCH, 32768).time_s
        / estimate_dispatch(cm128, "layout-aware", fig4, fig4, DISPATCH_BATCH, 32768).time_s)
    m["s4 |error vs paper 11.2x| (%)"] = 100 * abs(m["s4 layout-aware speedup, 32K TCP"] / 11.2 - 1)
    best8 = with_margin(rank_plans(cm128, "train", PAPER_GPUS, TRAIN_BATCH, 8192))[0]
    long_plan = with_margin(rank_plans(cm128, "train", PAPER_GPUS, TRAIN_BATCH, 32768))[0][0]
    fixed = cm128.train(long_plan, TRAIN_BATCH, 8192)
    m["s6 selected vs tuned-for-32K train plan, 8K"] = best8[1].tokens_per_gpu_s / fixed.tokens_per_gpu_s
    m["s6 train plan at 8K"] = best8[0].describe()
    row = one_scale(1024 if quick else 4096, profile, network)
    m["s7 centralized dispatch share of step (%)"] = 100 * row["centralized share"]
    m["s7 rollout plan"] = row["rollout plan"]
    m["s7 train plan"] = row["train plan"]
    return m


# where each numeric conclusion flips (None: no natural threshold)
THRESHOLDS = {"s3 decode tp8/tp4, KV-limited: 32K x 32": 1.0, "s3 decode tp8/tp4, KV fits: 4K x 32": 1.0,
              "s4 layout-aware speedup, 32K TCP": 1.0, "s4 |error vs paper 11.2x| (%)": 30.0,
              S5_METRIC: 1.0, "s6 selected vs tuned-for-32K train plan, 8K": 1.0,
              "s7 centralized dispatch share of step (%)": None}


MEGATRON_OVERLAPS = (0.0, 0.25, 0.5, 0.75, 0.9)
MEGATRON_VSTAGES = (1, 2, 4, 8)


def megatron_sensitivity(out: Path, quick: bool) -> pd.DataFrame:
    """Study s10's Megatron MFU on the published plan (GPT-3 175B, tp8 pp6, 96 and 4,608 H100)
    over the assumed TP overlap and virtual pipeline stages; the baseline is s10's pair."""
    overlaps = (0.0, MEGATRON_TP_OVERLAP) if quick else MEGATRON_OVERLAPS
    vstages = (1, MEGATRON_VIRTUAL_STAGES) if quick else MEGATRON_VSTAGES
    rows = []
    for ov in overlaps:
        for v in vstages:
            row = {"TP overlap": ov, "virtual stages": v,
                   "baseline": ov == MEGATRON_TP_OVERLAP and v == MEGATRON_VIRTUAL_STAGES}
            for gpus, paper in MEGATRON_MFU.items():
                plan, est = megatron_published(gpus, ov, v)
                row[f"MFU {gpus}"] = est.mfu
                row[f"error {gpus} %"] = 100 * (est.mfu / paper - 1)
                row[f"recompute {gpus}"] = plan.recompute
            row["within 15% at both"] = all(abs(row[f"error {g} %"]) <= 15 for g in MEGATRON_MFU)
            rows.append(row)
    df = pd.DataFrame(rows)
    write_csv(df, out, f"{NAME}_megatron")
    print_table(df, "Study 8: Megatron GPT-3 175B MFU on the published plan vs the assumed constants "
                    f"(published {', '.join(f'{v:.0%} at {g:,}' for g, v in MEGATRON_MFU.items())})",
                list(df.columns))
    return df


def run(out: Path, quick: bool = False) -> pd.DataFrame:
    megatron_sensitivity(out, quick)
    base = load_profile(HARDWARE)
    variants = [("baseline", (), 1.0)]
    groups = [(c,) for c in CURVES] + [CURVES] + [(k,) for k in EXTRA_KNOBS]
    if quick:
        groups = [CURVES]
    for knobs in groups:
        for f in SCALES:
            name = "all curves" if knobs == CURVES else knobs[0]
            variants.append((f"{name} x{f:g}", knobs, f))
    rows = []
    s5 = s5_ratios(quick)
    for label, curves, f in variants:
        prof = scaled_profile(base, curves, f) if curves else base
        rows.append({"variant": label, **metrics(prof, quick), S5_METRIC: s5[RESTART_S] if not curves else np.nan})
    for label, change_profile, change_net, restart in ASSUMPTION_VARIANTS:
        prof = change_profile(base) if change_profile else base
        net = dataclasses.replace(TCP, **change_net) if change_net else TCP
        s5_value = s5[restart] if restart is not None else (s5[RESTART_S] if change_net is None and
                                                              change_profile is None else np.nan)
        rows.append({"variant": label, **metrics(prof, quick, net), S5_METRIC: s5_value})
    df = pd.DataFrame(rows)
    baseline = df.iloc[0]
    for col in [c for c in df.columns if c.endswith("plan") or "plan at" in c]:
        df[f"{col} changed"] = df[col] != baseline[col]
    write_csv(df, out, NAME)
    numeric = list(THRESHOLDS)
    print_table(df, f"Study 8: conclusions under +-20% profile efficiencies and other assumptions ({HARDWARE})",
                ["variant"] + numeric)
    flips = flipped(df, numeric)
    print("conclusions that flip: " + ("; ".join(flips) if flips else "none"))
    plans = [c for c in df.columns if c.endswith("plan") or c.endswith("at 8K")]
    print_table(df, "Study 8: plans picked under each variant", ["variant"] + plans)
    plot(df, numeric, plans, out)
    return df


def flipped(df: pd.DataFrame, numeric: list[str]) -> list[str]:
    """'metric: variant (value)' for each variant on the other side of a metric's threshold."""
    out = []
    for metric in numeric:
        thr = THRESHOLDS[metric]
        base = df[metric].iloc[0]
        if thr is None or np.isnan(base):
            continue
        for _, r in df.iloc[1:].iterrows():
            v = r[metric]
            if not np.isnan(v) and (v > thr) != (base > thr):
                out.append(f"{metric}: {r['variant']} ({v:.3g} vs baseline {base:.3g})")
    return out


def plot(df: pd.DataFrame, numeric: list[str], plans: list[str], out: Path) -> Path:
    n = len(numeric) + 1
    cols = 3
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 4.4 * rows + 0.6))
    axes = np.atleast_1d(axes).ravel()
    variants = list(df["variant"])
    y = np.arange(len(variants))
    colors = ["0.35"] + ["tab:red" if "x0.8" in v else "tab:green" for v in variants[1:]]  # x0.8: slower hw
    colors = ["0.35"] + [("tab:green" if "x0.8" in v else "tab:red") if "overhead" in v else c
                         for v, c in zip(variants[1:], colors[1:], strict=True)]  # more overhead: slower
    assumed = {label for label, *_ in ASSUMPTION_VARIANTS}
    colors = [("tab:blue" if v in assumed else c) for v, c in zip(variants, colors, strict=True)]
    for ax, metric in zip(axes, numeric, strict=False):
        vals = df[metric].to_numpy(dtype=float)
        ax.barh(y, vals, color=colors, alpha=0.8)
        ax.axvline(vals[0], color="0.2", lw=1)
        thr = THRESHOLDS[metric]
        if thr is not None:
            ax.axvline(thr, color="black", ls="--", lw=1)
        for yi, v in zip(y, vals, strict=True):
            if np.isnan(v):
                continue
            ax.annotate(f"{v:.3g}", (v, yi), xytext=(2, 0), textcoords="offset points", va="center", fontsize=7)
        lo = min(np.nanmin(vals), thr if thr is not None else np.nanmin(vals))
        ax.set_xlim(min(0, lo), max(np.nanmax(vals), thr or 0) * 1.18)
        ax.set_yticks(y, variants, fontsize=7.5)
        ax.invert_yaxis()
        ax.set_title(metric, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    ax = axes[len(numeric)]
    ax.axis("off")
    changed = []
    for col in plans:
        diff = df[df[col] != df[col].iloc[0]]
        what = ", ".join(f"{v}: {p}" for v, p in zip(diff["variant"], diff[col], strict=True)) or "never"
        changed.append(f"{col}\n  baseline {df[col].iloc[0]}\n  changes: {what}")
    ax.text(0, 1, "Plan decisions\n\n" + "\n\n".join(changed), va="top", ha="left", fontsize=7, wrap=True,
            family="monospace")
    for ax in axes[n:]:
        ax.axis("off")
    fig.suptitle("Sensitivity: red = slower hardware, green = faster, blue = another value of an assumed constant; "
                 "solid line = baseline, dashed = where the conclusion flips", fontsize=10)
    return save_figure(fig, out, NAME, ASSUMPTIONS)


if __name__ == "__main__":
    main(run, __doc__)
