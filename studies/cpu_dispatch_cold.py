"""What a cold cache costs the dispatch executor, told apart from its start barrier: the
layout-aware dispatch of `earl calibrate`'s settings on local gloo ranks, each repeat run warm
(right after the previous one) and cold (after every rank writes EVICT_BYTES), each timed two
ways: the executor's own seconds after its start barrier (`DispatchStats.seconds`, what the
calibration's warm repeats read) and the wall around the call (the start barrier's round
included, what its cold repeats read until 2026-12-05). The slowest rank's, median of repeats.

`cold_round_s` is fitted as (cold - warm) per synchronising round: timed around the call, the
cold repeats also carried the barrier's round (docs/validate-history.md, twentieth session).

    OMP_NUM_THREADS=1 python studies/cpu_dispatch_cold.py                 # about a minute
    OMP_NUM_THREADS=1 python studies/cpu_dispatch_cold.py --worlds 2 --reps 5
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import gloo_study_args  # noqa: E402

from earl.runtime.dist import run_local  # noqa: E402

# (samples per rank, context tokens): two of the calibration's cases and the runtime's validate
# setting (4 groups of 4 at 2 ranks: 8 episodes a rank of ~200 tokens)
CASES = ((1, 512), (4, 2048), (8, 256))
WAYS = ("warm", "warm_wall", "cold", "cold_wall")


def _timed(per_rank: int, context: int, reps: int) -> dict[str, float]:
    """On one gloo rank (earl.runtime.dist.run_local): median over `reps` (after a warm-up) of
    the slowest rank's seconds, each way of WAYS."""
    import torch
    import torch.distributed as dist

    from earl.calibrate.dispatchfit import EVICT_BYTES, _store, _timed_call, layouts, transfer_plans
    from earl.runtime.gc_steps import StepGC

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    samples, src, dst = layouts(world, per_rank, context)
    store = _store(samples, src, rank)
    tplan = transfer_plans(world, per_rank, context)["layout-aware"]
    evict = torch.empty(EVICT_BYTES // 4)
    got: dict[str, list[float]] = {w: [] for w in WAYS}
    with StepGC(every=1) as gc:
        for rep in range(reps + 1):
            for cold in (False, True):
                gc.step_done(rep)
                if cold:
                    evict.fill_(rep)
                wall, stats = _timed_call(tplan, store, samples, src, dst, check=False)  # the calibration's timing
                t = torch.tensor([stats.seconds, wall])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if rep:  # the first round warms up connections and allocators
                    name = "cold" if cold else "warm"
                    got[name].append(float(t[0]))
                    got[f"{name}_wall"].append(float(t[1]))
    return {w: statistics.median(v) for w, v in got.items()}


def measure(world: int, cases=CASES, reps: int = 15, timeout_s: float = 300.0) -> dict[tuple, dict[str, float]]:
    """Per case: seconds each way of WAYS (fresh spawned ranks per case)."""
    return {case: run_local(_timed, world, *case, reps, timeout_s=timeout_s, start_method="spawn")[0]
            for case in cases}


def main(argv=None) -> None:
    worlds, reps, _ = gloo_study_args(__doc__, argv, "2,4", 15)
    print(f"layout-aware dispatch on gloo, {os.cpu_count()} CPUs, ms (slowest rank, median of {reps}); "
          "executor: its own seconds after the start barrier; wall: around the call")
    for w in worlds:
        for (per_rank, ctx), r in measure(w, reps=reps).items():
            ms = {k: v * 1e3 for k, v in r.items()}
            print(f"ranks {w}  {per_rank:2d} x {ctx:5d}  warm {ms['warm']:7.2f}  cold {ms['cold']:7.2f}  "
                  f"cold-warm {ms['cold'] - ms['warm']:+6.2f}  |  wall warm {ms['warm_wall']:7.2f}  "
                  f"cold {ms['cold_wall']:7.2f}  |  cold wall - warm {ms['cold_wall'] - ms['warm']:+6.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
