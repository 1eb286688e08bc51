"""gloo's loop threads at their default priority against lowered ones (`EARL_GLOO_LOOP_NICE`,
earl.runtime.dist.calm_gloo_loops), on the whole multi-process runtime: `earl run --nproc N`
(calculator, 4 groups of 4, the protocol of `earl validate`'s CPU passes) once per nice value,
the values alternating round after round so load changes hit them alike. Per stage: the median
over every run's steps (the first step, warm-up, left out) and its ratio to nice 0 in the same
round set; and the stage's spread (median |step - median| / median), the figure that sets how
close a per-step price can get.

    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py
    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py --nprocs 2 --nices 0,19 --rounds 1 --steps 3

Needs the host to itself: on 2 cores a run of 4 ranks is already oversubscribed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from earl.runtime.dist import GLOO_LOOP_NICE_ENV

STAGES = ("rollout", "experience", "dispatch", "train", "reshard", "step")
RUN_ARGS = ("--env", "calculator", "--set", "groups=4", "--set", "group_size=4", "--quiet")


def one_run(nproc: int, nice: int, steps: int, out: Path) -> list[dict]:
    """`earl run` with gloo's loop threads at `nice`; its metrics rows after the first step."""
    env = {**os.environ, GLOO_LOOP_NICE_ENV: str(nice), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "earl.cli", "run", "--nproc", str(nproc), "--steps", str(steps),
           "--out", str(out), *RUN_ARGS]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"earl run failed (nproc {nproc}, nice {nice}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("step", 0) > 1]


def spread(xs: list[float]) -> float:
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs) / m if m > 0 else 0.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", default="2,4", help="process counts, comma-separated")
    ap.add_argument("--nices", default="0,10,19", help="nice values, comma-separated (0 first: the reference)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7, help="steps per run (the first is left out)")
    args = ap.parse_args(argv)
    try:
        nprocs = [int(x) for x in args.nprocs.split(",")]
        nices = [int(x) for x in args.nices.split(",")]
    except ValueError:
        ap.error(f"--nprocs {args.nprocs!r} / --nices {args.nices!r}: comma-separated integers")
    if not nices or nices[0] != 0 or any(not 0 <= n <= 19 for n in nices):
        ap.error(f"--nices {args.nices!r}: values 0-19, the first 0 (the reference)")
    if args.steps < 2 or args.rounds < 1:
        ap.error(f"--steps {args.steps} / --rounds {args.rounds}: at least 2 steps and 1 round")
    got: dict[tuple[int, int], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for n in nprocs:
                for nice in nices:
                    rows = one_run(n, nice, args.steps, Path(tmp) / f"r{r}-n{n}-nice{nice}")
                    cell = got.setdefault((n, nice), {s: [] for s in STAGES})
                    for s in STAGES:
                        cell[s].extend(float(row[f"{s}_s"]) for row in rows)
                    print(f"round {r + 1}/{args.rounds}: nproc {n} nice {nice:2d}: step median "
                          f"{statistics.median(cell['step'][-len(rows):]) * 1e3:.0f} ms", flush=True)
    print(f"\nmedian ms per stage (x: over nice 0), spread; {args.rounds} rounds x {args.steps - 1} steps")
    for n in nprocs:
        for nice in nices:
            cell, ref = got[(n, nice)], got[(n, 0)]
            parts = []
            for s in STAGES:
                m, m0 = statistics.median(cell[s]), statistics.median(ref[s])
                parts.append(f"{s[:5]} {m * 1e3:7.1f} (x{m / m0 if m0 else 0:.2f}, {spread(cell[s]):.2f})")
            print(f"nproc {n} nice {nice:2d}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
