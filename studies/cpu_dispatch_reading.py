"""How a multi-process run's dispatch (or weight sync) reads, from the runs' traces: per scored
step of each `earl validate --nproc N` run in `studies/cpu_fidelity.sh` outputs, the dispatch

- the shortest span over ranks (validate's reading until the twenty-third session: the last
  rank to arrive, whose span holds the least wait, up to its own end);
- from the last rank's arrival to the last rank's end (validate's reading since: what `earl
  calibrate` times, the executor's slowest rank from a common start,
  earl.calibrate.dispatchfit._timed_call);
- the slowest rank's executor seconds after its start barrier (the span's `moved_s`);

and how far apart the ranks' ends are. With `--stage reshard`, the weight sync (twenty-fourth
session): the shortest span; from the last rank's arrival to the first rank's end (validate's
reading since: what `earl calibrate` times, the fastest rank after a barrier,
earl.calibrate.fsdpfit._sync_times); to the last rank's end; how long before the last rank the
first one arrived; and a rank's CPU seconds in its span (its threads, gloo's included). Medians
and quartiles per process count and model (the tiny model's runs, "nproc*", and the held-out
model's, "heldout-nproc*").

    python studies/cpu_dispatch_reading.py /tmp/cf57 /tmp/cf58     # one block per model and count
    python studies/cpu_dispatch_reading.py --stage reshard /tmp/cf57 /tmp/cf58
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from earl.runtime.metrics import read_metrics
from earl.trace import read_chrome_trace

READINGS = {"dispatch": ("shortest span", "last arrival -> last end", "slowest executor", "ends apart"),
            "reshard": ("shortest span", "last arrival -> first end", "last arrival -> last end", "first arrived",
                        "rank CPU")}


def readings(stage: str, ss: list) -> tuple[float, ...]:
    """One step's READINGS[stage] (seconds) from its ranks' spans `ss`."""
    last = max(sp.t_start for sp in ss)
    if stage == "dispatch":
        return (min(sp.duration_s for sp in ss), max(sp.t_end for sp in ss) - last,
                max(float(sp.args.get("moved_s", 0.0)) for sp in ss),
                max(sp.t_end for sp in ss) - min(sp.t_end for sp in ss))
    return (min(sp.duration_s for sp in ss), min(sp.t_end for sp in ss) - last, max(sp.t_end for sp in ss) - last,
            last - min(sp.t_start for sp in ss), statistics.median(float(sp.args.get("cpu_s", 0.0)) for sp in ss))


def run_steps(run: Path, stage: str = "dispatch") -> tuple[int, list[tuple[float, ...]]]:
    """(nproc, per scored step: the READINGS[stage] in seconds) of one validate run's folder."""
    v = json.loads((run / "validation.json").read_text())
    base = run / "runs" / "base"
    if not (base / "trace.json").is_file():
        raise ValueError(f"{run}: no runs/base/trace.json; give the OUT folder of studies/cpu_fidelity.sh")
    steps = [r["step"] for r in read_metrics(base)]
    scored = set(steps[-len(v["variants"][0]["measured"]):])
    by: dict[int, list] = {}
    for sp in read_chrome_trace(base / "trace.json"):
        if sp.stage == stage and sp.step in scored:
            by.setdefault(sp.step, []).append(sp)
    out = []
    for step in sorted(by):
        ss = by[step]
        if len({sp.rank for sp in ss}) != len(ss):
            continue  # a retried dispatch, a plan switch (two spans on a rank): left out here
        out.append(readings(stage, ss))
    return int(v["nproc"]), out


def report(folders: list[Path], stage: str = "dispatch") -> str:
    lines = []
    for prefix, model in (("nproc", "tiny model"), ("heldout-nproc", "held-out model")):
        got: dict[int, list] = {}
        for folder in folders:
            for f in sorted(folder.glob(f"{prefix}*/validation.json")):
                n, rows = run_steps(f.parent, stage)
                if n > 1:
                    got.setdefault(n, []).extend(rows)
        for n in sorted(got):
            rows = got[n]
            parts = []
            for i, name in enumerate(READINGS[stage]):
                xs = [r[i] * 1e3 for r in rows]
                q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
                parts.append(f"{name} {q[1]:.2f} ms ({q[0]:.2f}-{q[2]:.2f})")
            lines.append(f"{model}, nproc {n}, {len(rows)} steps: " + "; ".join(parts))
    if not lines:
        raise ValueError(f"no multi-process nproc*/validation.json in {', '.join(map(str, folders))}; give the "
                         "OUT folders of studies/cpu_fidelity.sh")
    lines.append("median (quartiles) over the steps; ends apart: the last rank's end less the first's"
                 if stage == "dispatch" else "median (quartiles) over the steps; first arrived: how long before the "
                 "last rank the first one reached the sync; rank CPU: the median rank's CPU seconds in its span")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="OUT folders of studies/cpu_fidelity.sh")
    ap.add_argument("--stage", choices=sorted(READINGS), default="dispatch", help="the move to read (default dispatch)")
    args = ap.parse_args()
    try:
        print(report(args.folders, args.stage))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
