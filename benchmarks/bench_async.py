"""Asynchronous vs synchronous RL in the runtime: `earl run --nproc N` on the same config with
`schedule.mode` sync and async (each `max_staleness` given), run one after the other in this
call, printing generated tokens per second of wall time and the async / sync ratio, plus the
async runs' measured staleness (mean, max) and pool sizes.

Only the steady state counts: the first step (model load, process start, first compile) is
left out of every figure. Next to each measured ratio, the simulator's prediction of it: the
same schedule keys on the sync run's recorded workload (workload.jsonl), priced with the
shipped calibrated CPU profile (cpu-measured) on the same N local processes, the simulator
settings `earl validate` uses for the runtime's engine.

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


def predicted(trace: Path, nproc: int, steps: int, episodes: int, mode: str, k: int, rollout: int) -> tuple:
    """(generated tokens/s of steps 2.., mean staleness) the simulator predicts for the run."""
    from earl.calibrate.host import local_cluster, sim_engine
    from earl.cost_model import CostModel
    from earl.cost_model.profile import load_profile
    from earl.sim.scenario import Scenario
    from earl.sim.simulation import Simulation
    from earl.sim.workload import WorkloadSpec
    from earl.specs import MODEL_CATALOG

    prof = load_profile("cpu-measured")
    plan = f"tp1-dp{nproc}" if mode == "sync" else "tp1"  # async: each stage fills its pool
    sc = Scenario(name="bench-async", steps=steps, model="tiny", hardware="cpu", nodes=1, gpus_per_node=nproc,
                  workload=WorkloadSpec(episodes_per_step=episodes, trace=str(trace), max_context=4096),
                  rollout_plan=plan, experience_plan=plan, train_plan=plan, selector="static",
                  dispatcher="layout-aware", max_num_seqs=episodes, logprob_passes=1, mode=mode, max_staleness=k,
                  rollout_gpus=rollout if mode == "async" else 0)
    cm = CostModel(MODEL_CATALOG["tiny"], local_cluster(prof, nproc), prof)
    sim = Simulation(sc, "static", "layout-aware", cost_model=cm,
                     engine=sim_engine("pytorch"), padded=True, token_budget=16384, fsdp=True, handoff=True,
                     head_on="generated", train_placement="balanced").run()
    steady = sim.rows[1:] or sim.rows
    rate = sum(r["generated_tokens"] for r in steady) / sum(r["step_time_s"] for r in steady)
    return rate, sum(r["staleness_mean"] for r in sim.rows) / len(sim.rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--staleness", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--env", default="calculator")  # answers of varying length: a tail of episode lengths
    ap.add_argument("--groups", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sync_rows = run(Path(tmp) / "sync", a.nproc, a.steps, a.env, a.groups, [])
        sync = tokens_per_s(sync_rows)
        trace, episodes = Path(tmp) / "sync" / "workload.jsonl", sync_rows[0]["episodes"]
        sim_sync, _ = predicted(trace, a.nproc, a.steps, episodes, "sync", 1, 0)
        print(f"--nproc {a.nproc}, {a.env}, {a.groups} groups, steps 2-{a.steps} (simulated: cpu-measured)")
        print(f"  sync                     {sync:9.1f} generated tokens/s")
        for k in a.staleness:
            rows = run(Path(tmp) / f"async{k}", a.nproc, a.steps, a.env, a.groups,
                       ["--set", "schedule.mode=async", "--set", f"schedule.max_staleness={k}"])
            rate = tokens_per_s(rows)
            sim_rate, sim_stale = predicted(trace, a.nproc, a.steps, episodes, "async", k, rows[0]["rollout_pool"])
            print(f"  async max_staleness {k}    {rate:9.1f} generated tokens/s  x{rate / sync:.2f} vs sync "
                  f"(simulated x{sim_rate / sim_sync:.2f})  staleness mean "
                  f"{sum(r['staleness_mean'] for r in rows) / len(rows):.2f} (simulated {sim_stale:.2f}) max "
                  f"{max(r['staleness_max'] for r in rows)}  pools rollout {rows[0]['rollout_pool']} / train "
                  f"{rows[0]['train_pool']}")

if __name__ == "__main__":
    main()
