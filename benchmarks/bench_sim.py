"""Simulator speed and fast-vs-fine agreement, measured side by side in one run.

1. The default scenario (Qwen2.5-72B, 16 x 8 H100, Connect-Four workload growing to 32K,
   512 episodes per step) for 100 steps, pinned to one CPU core: wall and CPU seconds, events
   per second, simulated (generated) tokens per wall second. Target: under 20 s.
2. The same scenario, reduced (64 episodes, 3 steps), in the fast mode (events at batch
   changes, decode integrated in closed form) and the fine mode (one event per decode
   iteration): step-time agreement (must be within 5%) and the speed ratio.

    python benchmarks/bench_sim.py            # both parts
    python benchmarks/bench_sim.py --steps 20 # a shorter first part
"""

from __future__ import annotations

import argparse
import os
import time

from earl.sim.iteration import Simulation
from earl.sim.scenario import load_scenario


def timed(sc, selector: str, dispatcher: str, fine: bool = False):
    w0, c0 = time.perf_counter(), time.process_time()
    sim = Simulation(sc, selector, dispatcher, fine=fine).run()
    return sim, time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--policies", default="static/centralized,cost-model/layout-aware")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"pinned to {cores} CPU core(s)")

    sc = load_scenario(None, {"scenario.steps": str(args.steps)})
    print(f"\n[1] default scenario: {sc.model}, {sc.cluster_spec().num_gpus} GPUs, "
          f"{sc.workload.episodes_per_step} episodes/step, {args.steps} steps")
    print(f"{'policy':26s} {'wall s':>7s} {'cpu s':>7s} {'events':>10s} {'events/s':>10s} "
          f"{'sim tokens/wall s':>18s} {'simulated h':>11s} {'OOM':>5s}")
    for pair in args.policies.split(","):
        sel, disp = pair.split("/")
        sim, wall, cpu = timed(sc, sel, disp)
        tokens = sum(r["generated_tokens"] for r in sim.rows)
        oom = sum(r["oom_events"] for r in sim.rows)
        print(f"{pair:26s} {wall:7.2f} {cpu:7.2f} {sim.events:10,d} {sim.events / wall:10,.0f} "
              f"{tokens / wall:18,.0f} {sim.env.now / 3600:11.1f} {oom:5d}"
              f"   {'OK' if wall < 20 else 'SLOW'} (target < 20 s)")

    small = load_scenario(None, {"scenario.steps": "3", "workload.episodes_per_step": "64",
                                 "workload.growth_steps": "3"})
    print("\n[2] fast vs fine mode (default scenario, 64 episodes, 3 steps, context growing)")
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


if __name__ == "__main__":
    main()
