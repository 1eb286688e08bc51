"""A model's decode GEMMs at 1-16 rows, timed as `earl calibrate` times GEMMs (earl.calibrate.bench.
run_case: cold rotated weights, one thread) next to a profile's price (earl.cost_model.compute.
gemm_time_s): per projection and row count, and one layer's GEMMs plus the LM head summed.

On the 2-core EPYC VM (twenty-third session) MKL's 2- and 3-row GEMMs of qwen2-27m's shapes took
longer than its 4-row ones, which a smooth row penalty (1 + h / rows) cannot price; the profile's
`gemm_row_factors` do.

    OMP_NUM_THREADS=1 python studies/cpu_gemm_rows.py --hardware cpu-measured --model PATH_OR_NAME
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from earl.calibrate.bench import Case, gemm_shapes, run_case
from earl.cost_model.compute import gemm_time_s
from earl.cost_model.profile import load_profile
from earl.runtime.resolve import model_spec
from earl.specs import MODEL_CATALOG

ROWS = (1, 2, 3, 4, 8, 16)


def report(hardware: str, model: str, rows=ROWS, max_s: float = 0.3) -> str:
    prof = load_profile(hardware)
    if model not in MODEL_CATALOG and not (Path(model) / "config.json").is_file():
        raise ValueError(f"--model {model!r}: neither a catalog model ({', '.join(sorted(MODEL_CATALOG))}) nor a "
                         "folder with a config.json")
    spec = model_spec(model)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    lines, total = [], {}
    for proj, (k, n) in gemm_shapes(spec, 1).items():
        for t in rows:
            case = Case(kind="matmul", label=f"{proj} T={t}", flops=2.0 * t * k * n,
                        bytes=float((t * k + k * n + t * n) * 4), dims=(t, k, n))
            got = run_case(case, device=torch.device("cpu"), dtype=torch.float32, gen=gen, max_s=max_s).time_s
            price = gemm_time_s(t, k, n, prof, 4)
            m, p = total.get(t, (0.0, 0.0))
            total[t] = (m + got, p + price)
            lines.append(f"{proj:8s} rows {t:2d} (k {k}, n {n}): measured {got * 1e3:.3f} ms, "
                         f"priced {price * 1e3:.3f} ms, x{price / got:.2f}")
    lines.append("")
    for t, (m, p) in total.items():
        lines.append(f"rows {t:2d}: one layer's GEMMs + LM head measured {m * 1e3:.3f} ms, priced {p * 1e3:.3f} ms, "
                     f"x{p / m:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="cpu-measured", help="profile name or path")
    ap.add_argument("--model", default="tiny", help="catalog name or a folder with an HF config.json")
    args = ap.parse_args()
    try:
        print(report(args.hardware, args.model))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
