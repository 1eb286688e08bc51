"""Simulator speed at cluster scale, parallel sweeps, and fast-vs-fine agreement, measured side by
side in one run.

1. Scale table: the default scenario (Qwen2.5-72B, tp8 plans filling the cluster, 4 Connect-Four
   episodes per GPU per step, context growing to 32K) at 128, 1,024, 4,096, 16,384 and 131,072
   GPUs, each run in a fresh process pinned to one CPU core: wall and CPU seconds, seconds per
   step, events and peak resident memory, with replica classes (the default) and with `--exact`
   (every replica and transfer) where that is affordable (fewer steps at 1,024 and 4,096 GPUs;
   none above). Targets: 16,384 and 131,072 GPUs x 100 steps under 60 s and 2 GiB.
2. `earl simulate --compare` (4 policies, default scenario) serially vs in parallel processes
   (`--jobs`): wall seconds and the ratio; results must be identical.
3. Fast vs fine mode (events at batch changes vs one per decode iteration) on a reduced default
   scenario: step-time agreement (within 5%) and the speed ratio.

    python benchmarks/bench_sim.py                 # all three parts
    python benchmarks/bench_sim.py --part scale    # or compare / fine
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from earl.sim.run import metrics_csv, simulate
from earl.sim.scenario import load_scenario
from earl.sim.simulation import Simulation
from earl.sim.sweep import default_jobs

# (GPUs, steps with replica classes, steps with --exact; 0: not affordable)
SCALES = ((128, 100, 100), (1024, 100, 10), (4096, 100, 2), (16384, 100, 0), (131072, 100, 0))


def timed(sc, selector: str, dispatcher: str, fine: bool = False):
    w0, c0 = time.perf_counter(), time.process_time()
    sim = Simulation(sc, selector, dispatcher, fine=fine).run()
    return sim, time.perf_counter() - w0, time.process_time() - c0


def one(gpus: int, steps: int, exact: bool) -> dict:
    """One scale point in this (fresh, pinned) process."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    sc = load_scenario(None, {"cluster.nodes": str(gpus // 8), "scenario.steps": str(steps),
                              "engine.exact": str(exact).lower()})
    sim, wall, cpu = timed(sc, "static", "centralized")
    return {"gpus": gpus, "mode": "exact" if exact else "classes", "steps": steps, "wall_s": wall,
            "cpu_s": cpu, "events": sim.events, "episodes_per_step": sim.rows[0]["episodes"],
            "replicas": sim.plans[next(iter(sim.plans))].dp,
            "replicas_simulated": max(r["replicas_simulated"] for r in sim.rows),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_time_mean_s": sum(r["step_time_s"] for r in sim.rows) / len(sim.rows),
            "throughput": sum(r["trained_tokens"] for r in sim.rows) / sum(r["step_time_s"] for r in sim.rows) / gpus}


def scale_table() -> list[dict]:
    print("\n[1] scale: default scenario, static/centralized, one pinned core per run, fresh process each")
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start "
          "(other users' processes share them)")
    print(f"{'GPUs':>7s} {'mode':>8s} {'steps':>5s} {'wall s':>8s} {'CPU s':>7s} {'s/step':>7s} {'events':>10s} "
          f"{'episodes/step':>13s} {'replicas sim/all':>16s} {'peak MiB':>9s} {'sim step s':>10s}")
    out = []
    for gpus, steps, exact_steps in SCALES:
        for exact, n in ((False, steps), (True, exact_steps)):
            if not n:
                print(f"{gpus:7,d} {'exact':>8s}  (not run: too slow for a benchmark)")
                continue
            proc = subprocess.run([sys.executable, __file__, "--one", json.dumps([gpus, n, exact])],
                                  capture_output=True, text=True, check=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            out.append(r)
            print(f"{gpus:7,d} {r['mode']:>8s} {n:5d} {r['wall_s']:8.1f} {r['cpu_s']:7.1f} {r['wall_s'] / n:7.2f} "
                  f"{r['events']:10,d} "
                  f"{r['episodes_per_step']:13,d} {r['replicas_simulated']:>7d}/{r['replicas']:<8d} "
                  f"{r['peak_rss_mib']:9.0f} {r['step_time_mean_s']:10.1f}")
    for r in out:
        if r["gpus"] >= 16384 and r["mode"] == "classes":
            # on a shared host the wall clock waits for other users' processes: say both
            verdict = {k: "OK" if r[k] < 60 and r["peak_rss_mib"] < 2048 else "MISSED" for k in ("wall_s", "cpu_s")}
            print(f"{r['gpus']:,d} GPUs x {r['steps']} steps: {r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU), "
                  f"{r['peak_rss_mib']:.0f} MiB (< 60 s and < 2 GiB: wall {verdict['wall_s']}, "
                  f"CPU {verdict['cpu_s']}; load average {os.getloadavg()[0]:.1f} now)")
    for gpus in sorted({r["gpus"] for r in out}):
        pair = {r["mode"]: r for r in out if r["gpus"] == gpus}
        if len(pair) == 2:
            a, e = pair["classes"], pair["exact"]
            print(f"{gpus:7,d} GPUs: exact / classes = {e['wall_s'] / e['steps'] / (a['wall_s'] / a['steps']):.1f}x "
                  "per step (exact's steps are the first ones, at the shortest context)")
    return out


def compare_ratio(steps: int) -> None:
    jobs = max(2, default_jobs())
    sc = load_scenario(None, {"scenario.steps": str(steps)})
    print(f"\n[2] earl simulate --compare: 4 policies x {steps} steps, default scenario, serial vs --jobs {jobs}")
    w0 = time.perf_counter()
    serial = simulate(sc, compare=True, jobs=1)
    w1 = time.perf_counter()
    parallel = simulate(sc, compare=True, jobs=jobs)
    w2 = time.perf_counter()
    same = metrics_csv(serial) == metrics_csv(parallel)
    cpu = [sum(r.cpu_s for r in res) for res in (serial, parallel)]
    print(f"serial {w1 - w0:.1f} s wall ({cpu[0]:.1f} s CPU), parallel ({jobs} processes) {w2 - w1:.1f} s wall "
          f"({cpu[1]:.1f} s CPU): {(w1 - w0) / (w2 - w1):.2f}x faster; metrics identical: {same}; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other users' processes share them)")


def fine_vs_fast() -> None:
    small = load_scenario(None, {"scenario.steps": "3", "workload.episodes_per_step": "64",
                                 "workload.growth_steps": "3"})
    print("\n[3] fast vs fine mode (default scenario, 64 episodes, 3 steps, context growing)")
    fast, wf, _ = timed(small, "static", "centralized", fine=False)
    fine, wn, _ = timed(small, "static", "centralized", fine=True)
    print(f"{'step':>4s} {'fast step s':>12s} {'fine step s':>12s} {'rel diff':>10s}")
    worst = 0.0
    for a, b in zip(fast.rows, fine.rows, strict=True):
        d = abs(a["step_time_s"] / b["step_time_s"] - 1)
        worst = max(worst, d)
        print(f"{a['step']:4d} {a['step_time_s']:12.3f} {b['step_time_s']:12.3f} {d:10.2e}")
    print(f"worst step-time difference {worst:.2e} ({'OK' if worst < 0.05 else 'FAIL'}: < 5%); "
          f"events fast {fast.events:,} vs fine {fine.events:,} "
          f"({fine.events / fast.events:.0f}x); wall fast {wf:.2f} s vs fine {wn:.2f} s "
          f"({wn / wf:.0f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "scale", "compare", "fine"), default="all")
    ap.add_argument("--compare-steps", type=int, default=20)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one scale point, JSON out
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*json.loads(args.one))))
        return
    if args.part in ("all", "scale"):
        scale_table()
    if args.part in ("all", "compare"):
        compare_ratio(args.compare_steps)
    if args.part in ("all", "fine"):
        fine_vs_fast()


if __name__ == "__main__":
    main()
