"""The validate scorecard of one or more `studies/cpu_fidelity.sh` outputs: per `earl validate
--nproc N` run (`--runs model`: the held-out model's one-process runs) and stage, three errors
of the calibrated prediction:

- the median per-step |error| (validate's headline; `*` above 25%, issue #24's bar);
- the level-fitted error (`spread_err`): what remains with the prediction's level fitted to the
  run, the floor the host's step-to-step noise sets under any model of the level;
- the summed ratio: predicted / measured seconds over the run's scored steps (the level itself).

Then, per process count and stage, how many runs are within 25% on each of the first two, and a
third count between them: one level per pass (per folder, process count and stage, the one
multiplier of the prediction that brings the most of that pass's runs within 25%; a log grid of
x0.30-x3.32), what a calibration that placed each stage's level right for its pass would get,
the runs of that pass keeping their own spread around it; with `--common`, one level for all
(the one multiplier for every run given, and the count it reaches): what any constant-level
price of the stage could reach on these runs. Runs
that read the host probe (earl/runtime/hostprobe.py) also show the host's speed over the
calibration's (validate's `host_speed`), and the count is given the other way: with that factor
where validate only recorded it, without it where validate applied it (runs of 2026-12-03).

    python studies/cpu_fidelity_scorecard.py /tmp/cf16 /tmp/cf17     # cpu_fidelity.sh prints it too
    python studies/cpu_fidelity_scorecard.py --runs heldout-nproc /tmp/cf42   # the held-out model's runs
    python studies/cpu_fidelity_scorecard.py --runs model /tmp/cf42   # ... and its one-process runs
    python studies/cpu_fidelity_scorecard.py --common /tmp/cf60 /tmp/cf61     # + one level for all runs
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

STAGES = ("rollout", "experience", "dispatch", "train", "reshard")
BAR = 0.25


def runs(folder: Path, prefix: str = "nproc") -> list[tuple[str, int, dict, dict]]:
    """(name, nproc, stage -> its validation.json row, its first variant) of each multi-process
    run in `folder` whose folder name starts with `prefix` (cpu_fidelity.sh: "nproc", the tiny
    model's runs; "heldout-nproc", the held-out model's); "model" takes the held-out model's
    one-process runs (model-tictactoe, model-calculator) instead, with the process count 1."""
    out = []
    for f in sorted(folder.glob(f"{prefix}*/validation.json")):
        d = json.loads(f.read_text())
        if (d.get("nproc", 1) > 1) != (prefix == "model"):
            out.append((f.parent.name, int(d["nproc"]), {s["stage"]: s for s in d["stages"]}, d["variants"][0]))
    return out


def applied(variant: dict) -> bool:
    """Whether validate multiplied the run's predictions by its host-speed factor (the runs of
    2026-12-03 before the twelfth session's passes did; since then it is recorded only)."""
    return bool(variant.get("host_probe_s")) and variant.get("host_speed_applied", True)


LEVELS = np.exp(np.linspace(-1.2, 1.2, 481))  # the multipliers the one-level-per-pass count tries


def step_err(variant: dict, stage: str, k: float = 1.0) -> float:
    """The median per-step |error| of the run's prediction (as reported) times `k`."""
    return float(np.median([abs(p[stage] * k - m[stage]) / m[stage]
                            for p, m in zip(variant["predicted"], variant["measured"], strict=True)]))


def other_err(variant: dict, stage: str) -> float:
    """The median per-step error of the prediction the other way: without the host-speed factor
    where validate applied it, with it where validate only recorded it."""
    k = variant.get("host_speed", 1.0)
    return step_err(variant, stage, 1.0 / k if applied(variant) else k)


def pass_level(variants: list[dict], stage: str) -> int:
    """How many of one pass's runs (one process count) one common level brings within 25%."""
    return common_level(variants, stage)[0]


def common_level(variants: list[dict], stage: str) -> tuple[int, float]:
    """(how many of `variants` one common level brings within 25% at best, the level nearest
    x1 that does): over every pass, what any constant-level price of the stage could reach."""
    counts = [sum(step_err(v, stage, k) <= BAR for v in variants) for k in LEVELS]
    best = max(counts)
    return best, min((k for k, c in zip(LEVELS, counts, strict=True) if c == best), key=lambda k: abs(np.log(k)))


def scorecard(folders: list[Path], prefix: str = "nproc", common: bool = False) -> str:
    lines, within, floor, total, bare = [], Counter(), Counter(), Counter(), Counter()
    per_pass = Counter()
    everyone: dict[tuple[int, str], list[dict]] = {}
    probed, scaled = 0, 0
    for folder in folders:
        got = runs(folder, prefix)
        if not got:
            raise ValueError(f"{folder}: no {prefix}*/validation.json of a "
                             f"{'one' if prefix == 'model' else 'multi'}-process run; "
                             f"give the OUT folder of studies/cpu_fidelity.sh")
        for name, nproc, by, variant in got:
            cells = []
            probed += bool(variant.get("host_probe_s"))
            scaled += applied(variant)
            for st in (st for st in STAGES if st in by):  # one process: no reshard
                s = by[st]
                e, lvl = s["median_err"], s.get("spread_err", float("nan"))
                ratio = s["predicted_s"] / s["measured_s"] if s["measured_s"] else float("nan")
                within[(nproc, st)] += e <= BAR
                floor[(nproc, st)] += lvl <= BAR
                total[(nproc, st)] += 1
                bare[(nproc, st)] += other_err(variant, st) <= BAR
                cells.append(f"{st[:4]} {100 * e:5.1f}{'*' if e > BAR else ' '} ({100 * lvl:4.1f}, x{ratio:.2f})")
            speed = (f" | speed x{variant['host_speed']:.2f}{'' if applied(variant) else ' (not applied)'}"
                     if variant.get("host_probe_s") else "")
            lines.append(f"{folder.name:>8s} {name:24s} " + " | ".join(cells) + speed)
        for nproc in sorted({n for _, n, _, _ in got}):
            group = [v for _, n, _, v in got if n == nproc]
            for st in (st for st in STAGES if (nproc, st) in total):
                per_pass[(nproc, st)] += pass_level(group, st)
                everyone.setdefault((nproc, st), []).extend(group)
    lines.append("")
    lines.append(f"median per-step error within {BAR:.0%}: {sum(within.values())} of {sum(total.values())} "
                 f"stage-runs (level-fitted: {sum(floor.values())}; one level per pass: {sum(per_pass.values())})")
    if probed:  # the other count: each run priced the other way (applied runs without, the rest with)
        how = ("without its factor" if scaled == probed else "with its factor" if not scaled
               else f"each the other way ({scaled} applied it)")
        lines.append(f"  ({probed} runs read the host probe; {how}: {sum(bare.values())} within)")
    for key in sorted(total):
        line = (f"  nproc {key[0]} {key[1]:10s} {within[key]:3d} of {total[key]:<3d} "
                f"(level-fitted {floor[key]}, one level per pass {per_pass[key]})")
        if common:
            n_all, k_all = common_level(everyone[key], key[1])
            line += f" one level for all {n_all} (x{k_all:.2f})"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="OUT folders of studies/cpu_fidelity.sh")
    ap.add_argument("--runs", default="nproc", choices=("nproc", "heldout-nproc", "model"),
                    help="which runs: the tiny model's (nproc*), the held-out model's (heldout-nproc*) or "
                         "the held-out model's on one process (model-*)")
    ap.add_argument("--common", action="store_true",
                    help="also count what one level for every run given reaches, per process count and stage")
    try:
        args = ap.parse_args()
        print(scorecard(args.folders, args.runs, args.common))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
