"""How much of the multi-process validations' level error is the host's speed during the run:
an offline check on recorded `earl validate --nproc N` runs, all priced with one profile.

Per run, the in-run reading is the rollout's CPU seconds per decode step (the `rollout` spans'
`cpu_s` over their `host_syncs`, every rank, the scored steps): a fixed model's work, so it moves
with the host's speed. Printed: each stage's correlation between log(reading) and log(measured /
predicted) over the runs at each process count, and the runs within 25% (median per-step error)
before and after scaling the experience, dispatch, train and reshard predictions of each run by
its reading over the median reading of all the runs (one constant for all: no per-run fit).

    python studies/cpu_fidelity_hostspeed.py docs/cpu/epyc-2026-12-03/more/median5 docs/cpu/epyc-2026-12-03
    # (the reports re-priced with one profile, then the folder holding the runs' traces)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from earl.trace import read_chrome_trace

STAGES = ("rollout", "experience", "dispatch", "train", "reshard")
BAR = 0.25


def find_trace(traces: Path, cf: str, run: str) -> Path:
    """The run's trace.json: under more/<cf>/ where `traces` keeps that pass there, else in
    `traces` itself (the folder's own pass)."""
    base = traces / "more" / cf if (traces / "more" / cf).is_dir() else traces
    p = base / run / "runs" / "base" / "trace.json"
    if not p.is_file():
        raise ValueError(f"no trace.json for {cf}/{run}: looked for {p}")
    return p


def reading(trace: Path) -> float:
    """Median CPU seconds per decode step of the rollout spans of the scored steps (step >= 2)."""
    per = [s.args["cpu_s"] / max(1, s.args.get("host_syncs", 1)) for s in read_chrome_trace(trace)
           if s.name == "rollout" and s.step >= 2 and "cpu_s" in s.args]
    if not per:
        raise ValueError(f"{trace}: no rollout spans with cpu_s")
    return float(np.median(per))


def per_step_err(pred: list[float], meas: list[float]) -> float:
    return float(np.median([abs(p - m) / m for p, m in zip(pred, meas, strict=True)]))


def main(priced: Path, traces: Path) -> str:
    runs = []
    for f in sorted(priced.glob("*/nproc*/validation.json")):
        cf, run = f.parent.parent.name, f.parent.name
        d = json.loads(f.read_text())
        v = d["variants"][0]
        runs.append((cf, run, int(d["nproc"]), reading(find_trace(traces, cf, run)), v["measured"], v["predicted"]))
    if not runs:
        raise ValueError(f"{priced}: no <pass>/nproc*/validation.json")
    ref = float(np.median([r[3] for r in runs]))
    lines = [f"{len(runs)} runs; reading (ms CPU per decode step) median {1e3 * ref:.2f}"]
    for n in sorted({r[2] for r in runs}):
        sel = [r for r in runs if r[2] == n]
        x = np.log([r[3] for r in sel])
        cells = []
        for st in STAGES:
            y = np.log([sum(s[st] for s in r[4]) / sum(s[st] for s in r[5]) for r in sel])
            cells.append(f"{st} {np.corrcoef(x, y)[0, 1]:.2f}")
        lines.append(f"nproc {n}: corr(log reading, log measured/predicted): " + ", ".join(cells))
    for scaled in (False, True):
        ok = 0
        for _, _, _, r, meas, pred in runs:
            k = r / ref if scaled else 1.0
            for st in STAGES:
                p = [x[st] * (1.0 if st == "rollout" else k) for x in pred]
                ok += per_step_err(p, [x[st] for x in meas]) <= BAR
        lines.append(f"{'scaled by the reading' if scaled else 'as priced'}: {ok} of {len(runs) * len(STAGES)} "
                     f"stage-runs within {BAR:.0%}")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("priced", type=Path, help="folder of <pass>/nproc*/validation.json re-priced with one profile")
    ap.add_argument("traces", type=Path, help="studies/cpu_fidelity.sh OUT folder whose runs they are")
    args = ap.parse_args()
    try:
        print(main(args.priced, args.traces))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
