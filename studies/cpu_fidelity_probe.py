"""Does the host probe place a run's level? An offline check on `studies/cpu_fidelity.sh` passes
that read it (earl/runtime/hostprobe.py; from 2026-12-03).

Per multi-process run: the run's median probe reading (validation.json's `host_probe_s`, every
rank at every scored step's start) next to its calibration's readings (the pass's
profile-cpu.json: `host_probe_s` between the one-process phases' cases, `host_probe_ranks_s` on
the gloo ranks of phases fsdp and dispatch, and the readings by phase in fit_quality), and each
stage's measured / predicted over the run without any probe factor. Then, over all the runs,
each stage's correlation and slope of log(measured / predicted) on log(reading / N-rank
reference), and how many stage-runs are within 25% (median per-step error) under each rule:

  as priced          no factor (what validate reports since the twelfth session)
  one-process ref    x reading / host_probe_s
  N-rank ref         x reading / host_probe_ranks_s[N] (validate's recorded `host_speed`)
  stage's phase ref  x reading / the reading of the phase that fitted that stage's constants
                     (rollout: matmul, attention, overhead, memory; experience: runtime;
                     dispatch: the dispatch ranks; train and reshard: the fsdp ranks)
  sqrt N-rank        x sqrt(reading / N-rank reference) on all stages but rollout: the rule
                     fitted on the first three passes' slopes, to be judged on later passes only

    python studies/cpu_fidelity_probe.py docs/cpu/epyc-2026-12-03b/cf23 docs/cpu/epyc-2026-12-03b/cf24
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from cpu_fidelity_hostspeed import BAR, STAGES, per_step_err  # this folder, as scripts run
from cpu_fidelity_scorecard import applied

ROLLOUT_PHASES = ("matmul", "attention", "overhead", "memory")


def references(profile: dict, nproc: int) -> dict:
    """The calibration's probe readings a run of `nproc` ranks could be held to."""
    by = profile["fit_quality"]["host_probe"]["by_phase"]
    ranks = profile["fit_quality"]["host_probe"]["ranks_by_phase"]
    n = str(nproc)
    return {"one": profile["host_probe_s"], "ranks": profile["host_probe_ranks_s"][n],
            "phase": {"rollout": float(np.median([x for p in ROLLOUT_PHASES for x in by.get(p, [])])),
                      "experience": float(np.median(by["runtime"])),
                      "dispatch": ranks["dispatch"][n], "train": ranks["fsdp"][n], "reshard": ranks["fsdp"][n]}}


def runs(folder: Path) -> list[dict]:
    prof_path = folder / "profile-cpu.json"
    if not prof_path.is_file():
        raise ValueError(f"{folder}: no profile-cpu.json (give an OUT folder of studies/cpu_fidelity.sh "
                         f"that calibrated)")
    profile = json.loads(prof_path.read_text())
    if not profile.get("host_probe_ranks_s"):
        raise ValueError(f"{prof_path}: the calibration did not read the host probe on its gloo ranks")
    out = []
    for f in sorted(folder.glob("nproc*/validation.json")):
        d = json.loads(f.read_text())
        v = d["variants"][0]
        if not v.get("host_probe_s"):
            continue
        k = v["host_speed"] if applied(v) else 1.0  # the predictions as priced, without the factor
        pred = [{st: r[st] / k for st in STAGES} for r in v["predicted"]]
        out.append({"name": f"{folder.name} {f.parent.name}", "nproc": int(d["nproc"]), "read": v["host_probe_s"],
                    "ref": references(profile, int(d["nproc"])), "pred": pred, "meas": v["measured"]})
    if not out:
        raise ValueError(f"{folder}: no nproc*/validation.json of a run that read the host probe")
    return out


RULES = {
    "as priced": lambda r, st: 1.0,
    "one-process ref": lambda r, st: r["read"] / r["ref"]["one"],
    "N-rank ref": lambda r, st: r["read"] / r["ref"]["ranks"],
    "stage's phase ref": lambda r, st: r["read"] / r["ref"]["phase"][st],
    "sqrt N-rank": lambda r, st: 1.0 if st == "rollout" else math.sqrt(r["read"] / r["ref"]["ranks"]),
}


def within(r: dict, rule) -> int:
    return sum(per_step_err([p[st] * rule(r, st) for p in r["pred"]], [m[st] for m in r["meas"]]) <= BAR
               for st in STAGES)


def main(folders: list[Path]) -> str:
    got = [r for f in folders for r in runs(f)]
    lines = ["run                               reading us  one-process  N-rank  | measured / predicted: "
             + " ".join(f"{st[:4]:>5s}" for st in STAGES)]
    ratio = {}
    for r in got:
        ratio[r["name"]] = {st: sum(m[st] for m in r["meas"]) / sum(p[st] for p in r["pred"]) for st in STAGES}
        lines.append(f"{r['name']:34s} {1e6 * r['read']:9.1f} {1e6 * r['ref']['one']:12.1f} "
                     f"{1e6 * r['ref']['ranks']:7.1f} | {' ' * 22}"
                     + " ".join(f"{ratio[r['name']][st]:5.2f}" for st in STAGES))
    x = np.log([r["read"] / r["ref"]["ranks"] for r in got])
    lines.append("")
    for st in STAGES:
        y = np.log([ratio[r["name"]][st] for r in got])
        slope = np.polyfit(x, y, 1)[0] if len(got) > 1 else float("nan")
        corr = np.corrcoef(x, y)[0, 1] if len(got) > 2 else float("nan")
        lines.append(f"{st:10s} log(measured/predicted) on log(reading/N-rank ref): "
                     f"corr {corr:5.2f}, slope {slope:5.2f}")
    lines.append("")
    for name, rule in RULES.items():
        lines.append(f"{name:18s} {sum(within(r, rule) for r in got):3d} of {len(got) * len(STAGES)} "
                     f"stage-runs within {BAR:.0%}")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", type=Path, nargs="+", help="studies/cpu_fidelity.sh OUT folders")
    args = ap.parse_args()
    try:
        print(main(args.folders))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
