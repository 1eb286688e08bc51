"""The experience stage's two modes at more ranks than cores, read from the runs' traces: per
`earl validate --nproc N` run of `studies/cpu_fidelity.sh` outputs (or of folders holding such
runs), per scored step, whether a rank was preempted inside its own experience work (its log-prob
span and a hand-off that waited for no one: CPU seconds under PREEMPTED x wall seconds), and the
stage's measured time (the slowest rank's) over the ranks' median own CPU seconds.

Four ranks on two cores (2026-12-04): a step where no rank was preempted takes about one rank's
own work; a step where one was takes about twice that (the preempted rank waits for a peer's own
work); which of the two is the majority of a run's steps moves from run to run. A per-step price
follows the pooled share of the ranks' CPU (earl.calibrate.validate.EXPERIENCE_SPANS), not the
slowest rank's wait.

Runs whose spans carry run-queue waits (`wait_s`, since 2026-12-07) get one more line per
process count: how many ranks' own work lost over 1 ms to other than its thread's CPU, the ranks
that reached the stage before the last apart from the last, and in how many of those the thread
was mostly waiting for a core (the rest it slept). Four ranks on two cores, cf142-cf145: 28 of
192 before the last (all waiting for a core), 3 of 64 the last (held-out model: 12 of 48, 11
waiting, and 0 of 16); validate reads the stage from the
last rank since then (docs/validate-history.md, thirty-fifth session).

    python studies/cpu_experience_modes.py /tmp/cf35 /tmp/cf36            # one line per run
    python studies/cpu_experience_modes.py docs/cpu/xeon-2026-12-07/cf14[2-5]
    python studies/cpu_experience_modes.py --runs heldout-nproc docs/cpu/xeon-2026-12-07/cf14[2-5]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from earl.calibrate.validate import COLLECTIVE_SPANS, EXPERIENCE_SPANS, in_share
from earl.trace import read_chrome_trace

PREEMPTED = 0.7  # a rank's own experience work got under this share of a core: preempted in it
LOST_S = 1e-3  # a rank's own work lost more wall time than this to other than its thread's CPU
BAR = 0.25


def own_work(spans, step: int) -> dict[int, tuple[float, float]]:
    """rank -> (wall s, CPU s) of its own experience work in `step`."""
    out: dict[int, tuple[float, float]] = {}
    for sp in spans:
        if sp.step != step or sp.stage != "experience" or "cpu_s" not in sp.args:
            continue
        if in_share(sp, EXPERIENCE_SPANS, COLLECTIVE_SPANS):  # the spans validate's experience share reads
            w, c = out.get(sp.rank, (0.0, 0.0))
            out[sp.rank] = (w + sp.duration_s, c + float(sp.args["cpu_s"]))
    return out


def arrivals(spans, step: int) -> list[tuple[bool, float, float]] | None:
    """Per rank of `step`, in the order they reached their own experience work: (the last to
    reach it, seconds of it neither on the rank's thread's CPU nor elsewhere, of which waited for
    a core); None for a trace whose spans carry no `wait_s` (before the thirty-fifth session)."""
    got: dict[int, list[float]] = {}  # rank -> [first start, wall, thread CPU, run-queue wait]
    for sp in spans:
        if sp.step != step or sp.stage != "experience" or not in_share(sp, EXPERIENCE_SPANS, COLLECTIVE_SPANS):
            continue
        if "wait_s" not in sp.args:
            return None
        g = got.setdefault(sp.rank, [sp.t_start, 0.0, 0.0, 0.0])
        g[0] = min(g[0], sp.t_start)
        g[1] += sp.duration_s
        g[2] += float(sp.args.get("thread_cpu_s", sp.args.get("cpu_s", 0.0)))
        g[3] += float(sp.args["wait_s"])
    order = sorted(got, key=lambda r: got[r][0])
    return [(r == order[-1], got[r][1] - got[r][2], got[r][3]) for r in order]


def run_modes(run: Path) -> dict | None:
    """One multi-process run's steps: {nproc, steps: [(preempted ranks, slowest wall / median
    own CPU)], err: validate's median per-step error of the stage}; None for a one-process run."""
    v = json.loads((run / "validation.json").read_text())
    if v.get("nproc", 1) < 2:
        return None
    # a run's own folder, or where a re-priced one (`earl validate --rescore`) says its run lies
    base = run / "runs" / "base"
    if not base.is_dir():
        base = Path(v["variants"][0]["run_dir"])
    if not (base / "trace.json").is_file():
        raise ValueError(f"{run}: no trace.json in {base}")
    steps = [json.loads(line)["step"] for line in (base / "metrics.jsonl").read_text().splitlines() if line.strip()]
    scored = steps[-len(v["variants"][0]["measured"]):]
    by_step: dict[int, list] = {}  # each step's spans, read once
    for sp in read_chrome_trace(base / "trace.json"):
        by_step.setdefault(sp.step, []).append(sp)
    rows, ranks = [], []
    for st in scored:
        own = own_work(by_step.get(st, []), st)
        if not own:
            continue
        slow = sum(c < PREEMPTED * w for w, c in own.values())
        rows.append((slow, max(w for w, _ in own.values()) / statistics.median(c for _, c in own.values())))
        ranks += arrivals(by_step.get(st, []), st) or []
    err = next(s["median_err"] for s in v["stages"] if s["stage"] == "experience")
    return {"nproc": v["nproc"], "steps": rows, "err": err, "arrivals": ranks}


def report(folders: list[Path], prefix: str = "nproc") -> str:
    """The per-run lines and the summaries over the runs in `folders` whose folder names start
    with `prefix` (cpu_fidelity.sh: "nproc", the tiny model's; "heldout-nproc", the held-out's)."""
    lines, by_mode = [], {0: [], 1: []}
    lost: dict[tuple[int, bool], list[tuple[float, float]]] = {}  # (nproc, last to arrive) -> (lost, waited)
    for folder in folders:
        runs = sorted(p.parent for p in folder.glob(f"{prefix}*/validation.json"))
        if not runs:
            raise ValueError(f"{folder}: no {prefix}*/validation.json; give the OUT folder of studies/cpu_fidelity.sh")
        for run in runs:
            got = run_modes(run)
            if got is None or not got["steps"]:
                continue
            hit = [r for s, r in got["steps"] if s]
            clean = [r for s, r in got["steps"] if not s]
            for s, r in got["steps"]:
                by_mode[min(s, 1)].append((got["nproc"], r))
            for last, gone, waited in got["arrivals"]:
                lost.setdefault((got["nproc"], last), []).append((gone, waited))
            med = (lambda xs: f"x{statistics.median(xs):.2f}" if xs else "  -  ")
            lines.append(f"{folder.name:>8s} {run.name:24s} steps with a preempted rank {len(hit)} of "
                         f"{len(got['steps'])}; slowest / own work: none preempted {med(clean)}, one or more "
                         f"{med(hit)} | experience error {100 * got['err']:5.1f}%{'*' if got['err'] > BAR else ''}")
    lines.append("")
    for n in sorted({n for rows in by_mode.values() for n, _ in rows}):
        parts = []
        for mode, name in ((0, "none preempted"), (1, "one or more")):
            xs = [r for k, r in by_mode[mode] if k == n]
            if xs:
                q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
                parts.append(f"{name}: {len(xs)} steps, slowest / own work median x{q[1]:.2f} "
                             f"(quartiles x{q[0]:.2f}-{q[2]:.2f})")
        lines.append(f"nproc {n}: " + "; ".join(parts))
    for n in sorted({n for n, _ in lost}):  # traces with run-queue waits (`wait_s`) only
        parts = []
        for last, name in ((False, "ranks before the last"), (True, "the last rank")):
            xs = lost.get((n, last), [])
            big = [(g, w) for g, w in xs if g > LOST_S]
            parts.append(f"{name} {len(big)} of {len(xs)} ({sum(w > g / 2 for g, w in big)} mostly waiting for a core)")
        lines.append(f"nproc {n}, own work that lost over {LOST_S * 1e3:.0f} ms to other than its CPU: "
                     + ", ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="OUT folders of studies/cpu_fidelity.sh")
    ap.add_argument("--runs", default="nproc", choices=("nproc", "heldout-nproc"),
                    help="which runs: the tiny model's (nproc*) or the held-out model's (heldout-nproc*)")
    try:
        args = ap.parse_args()
        print(report(args.folders, args.runs))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
