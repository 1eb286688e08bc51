"""Learning benchmark: run the default `earl run` setup (tiny model, Tic-Tac-Toe vs. the random
opponent) for a fixed budget and print first-10-step vs. last-10-step win and invalid-move rates.

The budget is a number of steps and/or wall-clock minutes, whichever ends first. Wall time on a
shared machine depends on the load; the CPU seconds the process used are printed too.

    python benchmarks/bench_learning.py [--minutes 10] [--steps 400] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from earl.config_machinery import parse_sets
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=0, help="0: the default config's steps")
    ap.add_argument("--out", default="")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    over = parse_sets(args.sets)
    if args.steps:
        over["steps"] = args.steps
    over.setdefault("plots", "false")
    cfg = resolve_config(overrides=over)
    out = args.out or tempfile.mkdtemp(prefix="earl-bench-learning-")
    t0, c0 = time.perf_counter(), time.process_time()

    def echo(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {line}", flush=True)

    res = run_training(cfg, out, progress=False, echo=echo, deadline_s=60 * args.minutes)
    rows = res.metrics
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0

    def avg(rs, k):
        return sum(r[k] for r in rs) / len(rs)

    head, tail = rows[:10], rows[-10:]
    print(f"\n{len(rows)} steps x {cfg.episodes_per_step} episodes in {wall:.0f}s wall, {cpu:.0f}s CPU "
          f"({cfg.env.name} vs {cfg.env.opponent}, {cfg.trainer.algo}, lr {cfg.trainer.lr}); out: {out}")
    print(f"{'':18s} {'first 10 steps':>15s} {'last 10 steps':>15s}")
    for k in ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate", "reward_mean"):
        print(f"{k:18s} {avg(head, k):15.3f} {avg(tail, k):15.3f}")
    ok = avg(tail, "invalid_move_rate") < 0.05 and avg(tail, "win_rate") >= 0.7
    print(f"target (invalid < 0.05 and win >= 0.7 in the last 10 steps): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
