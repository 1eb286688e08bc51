"""How a multi-process run's dispatch reads, three ways, from the runs' traces: per scored step of
each `earl validate --nproc N` run in `studies/cpu_fidelity.sh` outputs,

- the shortest span over ranks (validate's reading until the twenty-third session: the last
  rank to arrive, whose span holds the least wait, up to its own end);
- from the last rank's arrival to the last rank's end (validate's reading since: what `earl
  calibrate` times, the executor's slowest rank from a common start,
  earl.calibrate.dispatchfit._timed_call);
- the slowest rank's executor seconds after its start barrier (the span's `moved_s`);

and how far apart the ranks' ends are. Medians and quartiles per process count and model (the
tiny model's runs, "nproc*", and the held-out model's, "heldout-nproc*").

    python studies/cpu_dispatch_reading.py /tmp/cf57 /tmp/cf58     # one block per model and count
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from earl.runtime.metrics import read_metrics
from earl.trace import read_chrome_trace

READINGS = ("shortest span", "last arrival -> last end", "slowest executor", "ends apart")


def run_steps(run: Path) -> tuple[int, list[tuple[float, float, float, float]]]:
    """(nproc, per scored step: the four READINGS in seconds) of one validate run's folder."""
    v = json.loads((run / "validation.json").read_text())
    base = run / "runs" / "base"
    if not (base / "trace.json").is_file():
        raise ValueError(f"{run}: no runs/base/trace.json; give the OUT folder of studies/cpu_fidelity.sh")
    steps = [r["step"] for r in read_metrics(base)]
    scored = set(steps[-len(v["variants"][0]["measured"]):])
    by: dict[int, list] = {}
    for sp in read_chrome_trace(base / "trace.json"):
        if sp.stage == "dispatch" and sp.step in scored:
            by.setdefault(sp.step, []).append(sp)
    out = []
    for step in sorted(by):
        ss = by[step]
        if len({sp.rank for sp in ss}) != len(ss):
            continue  # a retried dispatch (two spans on a rank): left out here
        out.append((min(sp.duration_s for sp in ss),
                    max(sp.t_end for sp in ss) - max(sp.t_start for sp in ss),
                    max(float(sp.args.get("moved_s", 0.0)) for sp in ss),
                    max(sp.t_end for sp in ss) - min(sp.t_end for sp in ss)))
    return int(v["nproc"]), out


def report(folders: list[Path]) -> str:
    lines = []
    for prefix, model in (("nproc", "tiny model"), ("heldout-nproc", "held-out model")):
        got: dict[int, list] = {}
        for folder in folders:
            for f in sorted(folder.glob(f"{prefix}*/validation.json")):
                n, rows = run_steps(f.parent)
                if n > 1:
                    got.setdefault(n, []).extend(rows)
        for n in sorted(got):
            rows = got[n]
            parts = []
            for i, name in enumerate(READINGS):
                xs = [r[i] * 1e3 for r in rows]
                q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
                parts.append(f"{name} {q[1]:.2f} ms ({q[0]:.2f}-{q[2]:.2f})")
            lines.append(f"{model}, nproc {n}, {len(rows)} steps: " + "; ".join(parts))
    if not lines:
        raise ValueError(f"no multi-process nproc*/validation.json in {', '.join(map(str, folders))}; give the "
                         "OUT folders of studies/cpu_fidelity.sh")
    lines.append("median (quartiles) over the steps; ends apart: the last rank's end less the first's")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="OUT folders of studies/cpu_fidelity.sh")
    try:
        print(report(ap.parse_args().folders))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
