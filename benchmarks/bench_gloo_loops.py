"""gloo's event-loop threads under SCHED_BATCH (the runtime's default, earl.runtime.gloo_loops)
against the kernel's default policy, on the whole multi-process runtime: `earl run --nproc N`
(calculator, 4 groups of 4, the protocol of `earl validate`'s CPU passes) once per policy, the
two alternating run after run so that load changes hit both alike. Per stage: the median over
every run's steps (the first, warm-up, left out), its ratio to the default policy's, the
stage's spread (median |step - median| / median) and the share of steps slower than 1.8x the
stage's default-policy median (the slow mode: a spinning loop holds a core until the scheduler's
next tick).

    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py
    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py --nprocs 2 --rounds 1 --steps 3
    OMP_NUM_THREADS=1 python benchmarks/bench_gloo_loops.py --model qwen2-27m --nprocs 4 --steps 5

`--model` takes a catalog name (a random-initialised checkpoint of its shape is written to a
temporary folder, as `earl validate --model` does) or a checkpoint folder.

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

from earl.calibrate.host import random_checkpoint
from earl.runtime.gloo_loops import ENV, POLICIES
from earl.runtime.hf_model import BUILTIN_MODELS
from earl.specs import MODEL_CATALOG

STAGES = ("rollout", "experience", "dispatch", "train", "reshard", "step")
RUN_ARGS = ("--env", "calculator", "--set", "groups=4", "--set", "group_size=4", "--quiet")
SLOW = 1.8  # a step this many times the default policy's median counts as the slow mode


def one_run(nproc: int, policy: str, steps: int, out: Path, model: str | None = None) -> list[dict]:
    """`earl run` with gloo's loop threads under `policy`; its metrics rows after the first step."""
    env = {**os.environ, ENV: policy, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "earl.cli", "run", "--nproc", str(nproc), "--steps", str(steps),
           "--out", str(out), *RUN_ARGS, *(("--model", model) if model else ())]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"earl run failed (nproc {nproc}, {ENV}={policy}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("step", 0) > 1]


def spread(xs: list[float]) -> float:
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs) / m if m > 0 else 0.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", default="2,4", help="process counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=9, help="steps per run (the first is left out)")
    ap.add_argument("--model", default=None, help="a catalog name (e.g. qwen2-27m) or a checkpoint folder; "
                    "default: the runtime's tiny model")
    args = ap.parse_args(argv)
    try:
        nprocs = [int(x) for x in args.nprocs.split(",")]
    except ValueError:
        ap.error(f"--nprocs {args.nprocs!r}: comma-separated integers")
    if not nprocs or any(n < 2 for n in nprocs):
        ap.error(f"--nprocs {args.nprocs!r}: each at least 2 (one process has no loop to spin)")
    if args.steps < 2 or args.rounds < 1:
        ap.error(f"--steps {args.steps} / --rounds {args.rounds}: at least 2 steps and 1 round")
    policies = ("default", "batch")
    assert set(policies) == set(POLICIES)
    got: dict[tuple[int, str], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model and model.lower() in MODEL_CATALOG and model.lower() not in BUILTIN_MODELS:
            model = str(random_checkpoint(model.lower(), Path(tmp) / "model", "fp32"))
        elif model and not Path(model).is_dir() and model.lower() not in BUILTIN_MODELS:
            ap.error(f"--model {model!r}: not a catalog name nor a checkpoint folder; catalog: "
                     f"{', '.join(sorted(MODEL_CATALOG))}")
        for r in range(args.rounds):
            for n in nprocs:
                order = policies if r % 2 == 0 else policies[::-1]
                for policy in order:
                    rows = one_run(n, policy, args.steps, Path(tmp) / f"r{r}-n{n}-{policy}", model)
                    cell = got.setdefault((n, policy), {s: [] for s in STAGES})
                    for s in STAGES:
                        cell[s].extend(float(row[f"{s}_s"]) for row in rows)
                    print(f"round {r + 1}/{args.rounds}: nproc {n} {policy:7s}: step median "
                          f"{statistics.median(cell['step'][-len(rows):]) * 1e3:.0f} ms, dispatch "
                          f"{statistics.median(cell['dispatch'][-len(rows):]) * 1e3:.2f} ms", flush=True)
    print(f"\nmodel {args.model or 'tiny'}; median ms per stage (x: over the default policy, spread, "
          f"share of steps > {SLOW}x the default's median); {args.rounds} rounds x {args.steps - 1} steps per policy")
    for n in nprocs:
        for policy in policies:
            cell, ref = got[(n, policy)], got[(n, "default")]
            parts = []
            for s in STAGES:
                m, m0 = statistics.median(cell[s]), statistics.median(ref[s])
                slow = sum(x > SLOW * m0 for x in cell[s]) / len(cell[s])
                parts.append(f"{s[:5]} {m * 1e3:7.2f} (x{m / m0 if m0 else 0:.2f}, {spread(cell[s]):.2f}, "
                             f"{slow:.0%})")
            print(f"nproc {n} {policy:7s}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
