"""Measured per-operator GEMM times on real H100 and A100 GPUs, next to the cost model's.

The figures (studies/data/gemm_refs.csv) are Vidur's profiles (Agrawal et al., MLSys 2024;
github.com/microsoft/vidur, data/profiling/compute/{h100,a100}/<model>/mlp.csv): CUDA-event
medians of the four GEMMs of one decoder layer (QKV, attention output, MLP gate+up, MLP down)
for one tensor-parallel shard, at 1-4,096 tokens and tp 1-8, for Llama-2-7B, Llama-2-70B and
Qwen-72B. The datasheet profiles' GEMM curves were fitted on the two Llama models (every token
count of the set); Qwen-72B is held out. Study s10 prints the comparison; a test holds the
median error to it.

    python -c "import sys; sys.path.insert(0, 'studies'); import kernel_refs; print(kernel_refs.compare().head())"
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from earl.cost_model.compute import gemm_time_s
from earl.cost_model.profile import HardwareProfile, load_profile

REFS_CSV = Path(__file__).resolve().parent / "data" / "gemm_refs.csv"
HARDWARE = {"h100": "h100-sxm-80gb", "a100": "a100-sxm-80gb"}
OPS = ("qkv", "o", "up", "down")
# (hidden, query heads, key/value heads, MLP width) as Vidur profiles them (gated MLPs, head dim
# hidden / heads)
SHAPES = {"llama-2-7b": (4096, 32, 32, 11008), "llama-2-70b": (8192, 64, 8, 28672), "qwen-72b": (8192, 64, 64, 24576)}
HELD_OUT = ("qwen-72b",)


def op_shapes(model: str, tp: int, tokens: int) -> dict[str, tuple[float, float, float]]:
    """(m, k, n) of each GEMM of one layer on one tensor-parallel shard."""
    h, heads, kv_heads, ffn = SHAPES[model]
    hd = h // heads
    return {"qkv": (tokens, h, (heads + 2 * kv_heads) * hd / tp), "o": (tokens, heads * hd / tp, h),
            "up": (tokens, h, 2 * ffn / tp), "down": (tokens, ffn / tp, h)}


def load_refs() -> pd.DataFrame:
    return pd.read_csv(REFS_CSV, comment="#")


def compare(profiles: dict[str, HardwareProfile] | None = None) -> pd.DataFrame:
    """One row per (hardware, model, tp, tokens): measured and predicted time of each GEMM and of
    the layer's four together (us), and the layer's error (predicted / measured - 1)."""
    profiles = profiles or {k: load_profile(v) for k, v in HARDWARE.items()}
    rows = []
    for r in load_refs().itertuples(index=False):
        prof = profiles[r.hardware]
        row = {"hardware": r.hardware, "model": r.model, "tp": r.tp, "tokens": r.tokens,
               "held out": r.model in HELD_OUT}
        for op, (m, k, n) in op_shapes(r.model, r.tp, r.tokens).items():
            row[f"{op} measured us"] = getattr(r, f"{op}_us")
            row[f"{op} predicted us"] = gemm_time_s(m, k, n, prof) * 1e6
        row["layer measured us"] = sum(row[f"{op} measured us"] for op in OPS)
        row["layer predicted us"] = sum(row[f"{op} predicted us"] for op in OPS)
        row["error"] = row["layer predicted us"] / row["layer measured us"] - 1
        rows.append(row)
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median |error|, share within 15% and share under-predicted, per hardware and fit/held-out."""
    g = df.groupby(["hardware", "held out"])["error"]
    return pd.DataFrame({"cells": g.size(), "median |error|": g.apply(lambda e: e.abs().median()),
                         "within 15%": g.apply(lambda e: (e.abs() <= 0.15).mean()),
                         "under-predicted": g.apply(lambda e: (e < 0).mean())}).reset_index()
