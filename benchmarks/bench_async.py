"""Asynchronous vs synchronous RL in the runtime, measured next to the simulator's prediction.

For each `--nproc` N: `earl run --nproc N` on one config with `schedule.mode = sync`, then with
`mode = async` at each `max_staleness` K (and, with `--partial`, each K again with
`schedule.partial_rollout = true`), one after the other in this call. Printed per async run:
generated tokens/s of wall time over the scored steps (the first is left out: process start,
model load) as async / sync ratio (the median over `--repeat` interleaved sync + async runs: on a
shared host the load moves between runs), next to the simulator's prediction of the same ratio, and
staleness mean / max measured vs predicted. The prediction is `earl validate --schedule async`'s
(earl.calibrate.validate_async.compare_runs): each run's recorded workload replayed with the
calibrated profile (`--hardware`, default the shipped cpu-measured) on N devices, the async one
through the simulator's per-step feed (the runtime's replicas) with the runtime's pool split, each
pool stretched by its share of the host's cores (printed: rollout / training pool stretch).

`--learning`: reward vs samples trained of a sync run and an async run (K = 1) of the default
task, printed side by side, and the samples each needs to reach the sync run's final reward
(mean of its last `--window` steps).

    OMP_NUM_THREADS=1 python benchmarks/bench_async.py [--nproc 2 4] [--steps 6] [--staleness 1 2] \
        [--env calculator] [--groups 8] [--repeat 2] [--partial] [--both KEY=VALUE] [--out docs/cpu/bench_async.txt]
    OMP_NUM_THREADS=1 python benchmarks/bench_async.py --learning --steps 60 --nproc 2 [--set groups=16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def earl_run(out: Path, nproc: int, steps: int, sets: list[str], env: str | None) -> list[dict]:
    args = [sys.executable, "-m", "earl.cli", "run", "--nproc", str(nproc), "--steps", str(steps), "--out",
            str(out), "--quiet", *(["--env", env] if env else [])]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def load_avg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def throughput(a, tmp: Path, emit) -> None:
    from earl.calibrate.validate_async import compare_runs
    from earl.cost_model.profile import load_profile
    from earl.runtime.resolve import resolve_config

    prof = load_profile(a.hardware)
    base = [f"groups={a.groups}", "plots=false", "checkpoints=false", "transcript_every=0", *a.both]
    async_sets = list(a.set)  # e.g. schedule.rollout_gpus=3: the async runs only
    cfg = resolve_config(None, overrides={"env.name": a.env, **dict(s.split("=", 1) for s in base)})
    emit(f"bench_async: {a.env}, {a.groups} groups x {cfg.group_size}, steps 2-{a.steps} scored; simulated with "
         f"{a.hardware}; --both {' '.join(a.both) or '-'}; async --set {' '.join(async_sets) or '-'}; load average "
         f"at start {load_avg()}")
    emit(f"{'run':34s} {'tok/s':>8s} {'ratio':>6s} {'sim':>6s} {'sim/meas':>8s}  {'stale mean':>10s} {'sim':>5s}"
         f"  {'max':>3s} {'sim':>3s}  pools")
    for n in a.nproc:
        t0 = time.perf_counter()
        variants = [(k, False) for k in a.staleness] + ([(k, True) for k in a.staleness] if a.partial else [])
        got: dict = {v: [] for v in variants}  # variant -> per repeat (rows, pools, sync stretch, pool stretch)
        for rep in range(a.repeat):  # interleaved: each async run next to its own sync run
            sync_dir = tmp / f"sync{n}-{rep}"
            earl_run(sync_dir, n, a.steps, base, a.env)
            for k, partial in variants:
                name = f"async{n}-k{k}" + ("-partial" if partial else "") + f"-{rep}"
                sets = [*base, "schedule.mode=async", f"schedule.max_staleness={k}",
                        f"schedule.partial_rollout={str(partial).lower()}", *async_sets]
                earl_run(tmp / name, n, a.steps, sets, a.env)
                kcfg = resolve_config(None, overrides={"env.name": a.env, **dict(s.split("=", 1) for s in sets)})
                got[k, partial].append(compare_runs(kcfg, prof, sync_dir, tmp / name, n, warmup_steps=1))
        first = {row["what"]: row for row in got[variants[0]][0][0]}["sync generated tokens/s"]
        emit(f"{f'--nproc {n} sync':34s} {first['measured']:8.1f} {'':6s} {'':6s} {'':8s}  (simulated "
             f"{first['simulated']:.1f} tok/s, host stretch x{got[variants[0]][0][2]:g}; first repeat)")
        for (k, partial), reps in got.items():
            per = [{row["what"]: row for row in rows} for rows, _, _, _ in reps]
            med = lambda what, side, per=per: statistics.median(r[what][side] for r in per)  # noqa: E731
            ratios = [r["async / sync tokens/s"]["measured"] for r in per]
            m, p = med("async / sync tokens/s", "measured"), med("async / sync tokens/s", "simulated")
            pools = reps[0][1]
            label = f"--nproc {n} async K={k}" + (" partial" if partial else "")
            emit(f"{label:34s} {med('async generated tokens/s', 'measured'):8.1f} {m:6.2f} {p:6.2f} {p / m:8.2f}  "
                 f"{med('staleness mean', 'measured'):10.2f} {med('staleness mean', 'simulated'):5.2f}  "
                 f"{max(r['staleness max']['measured'] for r in per):3.0f} "
                 f"{max(r['staleness max']['simulated'] for r in per):3.0f}  rollout {pools['rollout']} / "
                 f"train {pools['train']}, stretch x{reps[0][3][0]:.2f} / x{reps[0][3][1]:.2f}  (measured ratio per "
                 f"repeat: {', '.join(f'{x:.2f}' for x in ratios)})")
            for what in [row["what"] for row in reps[0][0][5:]]:
                emit(f"    {what:40s} measured {med(what, 'measured'):8.4f}  simulated {med(what, 'simulated'):8.4f}")
        emit(f"  (--nproc {n}: {time.perf_counter() - t0:.0f} s wall; load average now {load_avg()})")


def samples_to_reach(rows: list[dict], target: float, window: int) -> int | None:
    """Samples trained when the trailing `window`-step mean reward first reaches `target`."""
    seen = 0
    for i, r in enumerate(rows):
        seen += r["samples_trained"] if "samples_trained" in r else r["episodes"]
        recent = rows[max(0, i + 1 - window):i + 1]
        if len(recent) == window and sum(x["reward_mean"] for x in recent) / window >= target:
            return seen
    return None


def learning(a, tmp: Path, emit) -> None:
    n = a.nproc[0]
    base = ["plots=false", "checkpoints=false", "transcript_every=0", *a.set]
    emit(f"bench_async --learning: the default task, {a.steps} steps, --nproc {n}, --set {' '.join(a.set) or '-'}; "
         f"load average {load_avg()}")
    t0 = time.perf_counter()
    sync = earl_run(tmp / "sync", n, a.steps, base, None)
    t1 = time.perf_counter()
    asyn = earl_run(tmp / "async", n, a.steps, [*base, "schedule.mode=async", "schedule.max_staleness=1"], None)
    t2 = time.perf_counter()
    emit(f"wall: sync {t1 - t0:.0f} s, async {t2 - t1:.0f} s")
    emit(f"{'step':>4s} {'sync samples':>12s} {'reward':>7s} {'async samples':>13s} {'reward':>7s} {'staleness':>9s}")
    ss = sa = 0
    for rs, ra in zip(sync, asyn, strict=False):
        ss += rs["episodes"]
        sa += ra["samples_trained"]
        if rs["step"] % max(1, a.steps // 15) == 0 or rs["step"] == len(sync):
            emit(f"{rs['step']:4d} {ss:12d} {rs['reward_mean']:+7.3f} {sa:13d} {ra['reward_mean']:+7.3f} "
                 f"{ra['staleness_mean']:9.2f}")
    w = a.window
    target = sum(r["reward_mean"] for r in sync[-w:]) / w
    got_s, got_a = samples_to_reach(sync, target, w), samples_to_reach(asyn, target, w)
    emit(f"sync's final reward (mean of its last {w} steps): {target:+.3f}; samples to reach it ({w}-step mean): "
         f"sync {got_s}, async {got_a}" + (f" (async / sync {got_a / got_s:.2f})" if got_s and got_a else
                                          " (async did not reach it)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--staleness", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--env", default="calculator")  # answers of varying length: a tail of episode lengths
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="sync + async runs per --nproc, interleaved (medians)")
    ap.add_argument("--partial", action="store_true", help="also each K with schedule.partial_rollout = true")
    ap.add_argument("--hardware", default="cpu-measured", help="calibrated profile the prediction uses")
    ap.add_argument("--learning", action="store_true", help="reward vs samples, sync vs async (K = 1)")
    ap.add_argument("--window", type=int, default=10, help="--learning: steps the reward is averaged over")
    ap.add_argument("--set", action="append", default=[],
                    help="config override key=value: both runs with --learning, else the async runs")
    ap.add_argument("--both", action="append", default=[],
                    help="config override key=value of the sync and the async runs alike (throughput; e.g. "
                         "model.path=qwen2-27m: a training-bound run, where a replica runs ahead)")
    ap.add_argument("--out", help="also write the output to this file")
    a = ap.parse_args()
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory() as tmp:
        (learning if a.learning else throughput)(a, Path(tmp), emit)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
