"""Per-step time of the one runtime step at world 1 versus an older revision's loop, side by side.

Both trees run the same `earl run` configuration (tiny model, Tic-Tac-Toe, one thread) in
alternating rounds on this machine, so load changes hit both alike; the ratio of median per-step
seconds (and CPU seconds) is printed. The older tree is exported with `git archive` into a
temporary folder and run with PYTHONPATH pointing at it (default: 7ca5d98, the last revision
with the separate single-process loop).

    OMP_NUM_THREADS=1 python benchmarks/bench_step_overhead.py --rounds 3 --steps 12
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

ROOT = Path(__file__).resolve().parents[1]


def export(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def run(tree: Path, out: Path, steps: int, sets: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "earl.cli", "run", "--out", str(out), "--steps", str(steps), "--quiet"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=str(tree))
    if r.returncode:
        raise SystemExit(f"{tree}: earl run failed:\n{r.stderr[-2000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="7ca5d98", help="git revision of the old loop")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--set", action="append", default=None, dest="sets",
                    help="config override for both (default: groups=16 group_size=4 plots=false)")
    a = ap.parse_args()
    sets = a.sets or ["groups=16", "group_size=4", "plots=false", "checkpoint_every=0"]
    with tempfile.TemporaryDirectory(prefix="earl-bench-step-") as tmp:
        old_tree = export(a.old, Path(tmp) / "old")
        trees = {"old loop": old_tree, "new step": ROOT}
        step_s: dict[str, list[float]] = {k: [] for k in trees}
        cpu_s: dict[str, list[float]] = {k: [] for k in trees}
        for rnd in range(a.rounds):
            for name, tree in (trees.items() if rnd % 2 == 0 else reversed(trees.items())):
                rows = run(tree, Path(tmp) / f"{name.replace(' ', '-')}-{rnd}", a.steps, sets)[1:]  # step 1 warms up
                step_s[name] += [r["step_s"] for r in rows]
                cpu_s[name] += [r["step_cpu_s"] for r in rows]
                print(f"round {rnd + 1}: {name:9s} median step {statistics.median(step_s[name]) * 1e3:7.1f} ms",
                      flush=True)
    med = {k: statistics.median(v) for k, v in step_s.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_s.items()}
    print(f"\nconfig: {' '.join(sets)}, {a.steps} steps x {a.rounds} rounds (first step of each run dropped)")
    for k in trees:
        print(f"  {k:9s} step {med[k] * 1e3:7.1f} ms   cpu {cpu[k] * 1e3:7.1f} ms")
    print(f"new / old: wall {med['new step'] / med['old loop']:.3f}x, cpu {cpu['new step'] / cpu['old loop']:.3f}x")


if __name__ == "__main__":
    main()
