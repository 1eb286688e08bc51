"""Asynchronous vs synchronous RL in the runtime: `earl run --nproc N` on the same config with
`schedule.mode` sync and async (each `max_staleness` given), run one after the other in this
call, printing generated tokens per second of wall time and the async / sync ratio, plus the
async runs' measured staleness (mean, max) and pool sizes.

Only the steady state counts: the first step (model load, process start, first compile) is
left out of every figure. The simulator's prediction of the same ratio is not printed yet.

    OMP_NUM_THREADS=1 python benchmarks/bench_async.py [--nproc 2] [--steps 6] [--staleness 1 2] \
        [--env calculator] [--groups 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(out: Path, nproc: int, steps: int, env: str, groups: int, extra: list[str]) -> list[dict]:
    args = [sys.executable, "-m", "earl.cli", "run", "--nproc", str(nproc), "--steps", str(steps), "--out",
            str(out), "--env", env, "--quiet", "--set", f"groups={groups}", "--set", "plots=false",
            "--set", "checkpoints=false", "--set", "transcript_every=0", *extra]
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def tokens_per_s(rows: list[dict]) -> float:
    steady = rows[1:] or rows
    return sum(r["gen_tokens_mean"] * r["episodes"] for r in steady) / sum(r["step_s"] for r in steady)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--staleness", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--env", default="calculator")  # answers of varying length: a tail of episode lengths
    ap.add_argument("--groups", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sync = tokens_per_s(run(Path(tmp) / "sync", a.nproc, a.steps, a.env, a.groups, []))
        print(f"--nproc {a.nproc}, {a.env}, {a.groups} groups, steps 2-{a.steps}")
        print(f"  sync                     {sync:9.1f} generated tokens/s")
        for k in a.staleness:
            rows = run(Path(tmp) / f"async{k}", a.nproc, a.steps, a.env, a.groups,
                       ["--set", "schedule.mode=async", "--set", f"schedule.max_staleness={k}"])
            rate = tokens_per_s(rows)
            print(f"  async max_staleness {k}    {rate:9.1f} generated tokens/s  x{rate / sync:.2f} vs sync  "
                  f"staleness mean {sum(r['staleness_mean'] for r in rows) / len(rows):.2f} max "
                  f"{max(r['staleness_max'] for r in rows)}  pools rollout {rows[0]['rollout_pool']} / train "
                  f"{rows[0]['train_pool']}")


if __name__ == "__main__":
    main()
