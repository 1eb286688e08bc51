"""The multi-process scorecard of one or more `studies/cpu_fidelity.sh` outputs: per
`earl validate --nproc N` run and stage, three errors of the calibrated prediction:

- the median per-step |error| (validate's headline; `*` above 25%, issue #24's bar);
- the level-fitted error (`spread_err`): what remains with the prediction's level fitted to the
  run, the floor the host's step-to-step noise sets under any model of the level;
- the summed ratio: predicted / measured seconds over the run's scored steps (the level itself).

Then, per process count and stage, how many runs are within 25% on each of the first two.

    python studies/cpu_fidelity_scorecard.py /tmp/cf16 /tmp/cf17     # cpu_fidelity.sh prints it too
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

STAGES = ("rollout", "experience", "dispatch", "train", "reshard")
BAR = 0.25


def runs(folder: Path) -> list[tuple[str, int, dict]]:
    """(name, nproc, stage -> its validation.json row) of each multi-process run in `folder`."""
    out = []
    for f in sorted(folder.glob("nproc*/validation.json")):
        d = json.loads(f.read_text())
        if d.get("nproc", 1) > 1:
            out.append((f.parent.name, int(d["nproc"]), {s["stage"]: s for s in d["stages"]}))
    return out


def scorecard(folders: list[Path]) -> str:
    lines, within, floor, total = [], Counter(), Counter(), Counter()
    for folder in folders:
        got = runs(folder)
        if not got:
            raise ValueError(f"{folder}: no nproc*/validation.json of a multi-process run; "
                             f"give the OUT folder of studies/cpu_fidelity.sh")
        for name, nproc, by in got:
            cells = []
            for st in STAGES:
                s = by[st]
                e, lvl = s["median_err"], s.get("spread_err", float("nan"))
                ratio = s["predicted_s"] / s["measured_s"] if s["measured_s"] else float("nan")
                within[(nproc, st)] += e <= BAR
                floor[(nproc, st)] += lvl <= BAR
                total[(nproc, st)] += 1
                cells.append(f"{st[:4]} {100 * e:5.1f}{'*' if e > BAR else ' '} ({100 * lvl:4.1f}, x{ratio:.2f})")
            lines.append(f"{folder.name:>8s} {name:24s} " + " | ".join(cells))
    lines.append("")
    lines.append(f"median per-step error within {BAR:.0%}: {sum(within.values())} of {sum(total.values())} "
                 f"stage-runs (level-fitted: {sum(floor.values())})")
    for key in sorted(total):
        lines.append(f"  nproc {key[0]} {key[1]:10s} {within[key]:3d} of {total[key]:<3d} "
                     f"(level-fitted {floor[key]})")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="OUT folders of studies/cpu_fidelity.sh")
    try:
        print(scorecard(ap.parse_args().folders))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
