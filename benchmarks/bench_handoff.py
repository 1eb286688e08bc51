"""The rollout -> experience hand-off onto the layout aligned with the rollout's (what
`earl.runtime.step.prepare_experience` runs every step) on gloo: as the runtime runs it now,
waiting for no one (its plan copies every episode where it was played and reduces nothing:
`TransferPlan.waits_for_peers` false, so the executor skips its start barrier), against the
same hand-off behind a barrier (the executor before it skipped one), side by side in the same
processes and alternating, so load changes hit both alike. Both must deliver the same
episodes (checked). Each side's time is the slowest rank's (building the episodes' rows,
planning, the copies, the delivery check), median over repeats; the cost model's prices with
the given profile are printed next to them (the barrier side: the same plus one synchronising
round, `DispatchPath.round_cost_s`, and its cold start).

    OMP_NUM_THREADS=1 python benchmarks/bench_handoff.py
    OMP_NUM_THREADS=1 python benchmarks/bench_handoff.py --worlds 2 --episodes 16 --repeats 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from earl.calibrate import dispatchfit
from earl.calibrate.hostcost import synthetic_trajectories
from earl.cost_model.dispatch import price_transfer_plan
from earl.cost_model.profile import load_profile
from earl.parallel import deal
from earl.policies import make_dispatcher
from earl.policies.balance import balance_aligned
from earl.policies.types import Layout, Sample
from earl.runtime.step import hand_off
from earl.specs import ParallelPlan

SIDES = ("no wait", "barrier")


def layouts(episodes: int, length: int, world: int):
    """The synthetic episodes (the same on every rank), their samples, and the rollout and
    aligned experience layouts at dp `world`."""
    trajs = synthetic_trajectories(episodes, length, 1000, torch.Generator().manual_seed(0))
    samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs]
    plan = ParallelPlan(dp=world)
    src = Layout(plan, tuple(tuple(g) for g in deal(episodes, world)))
    dst = Layout(plan, tuple(tuple(g) for g in balance_aligned(samples, world, src.assignment)[0]))
    return trajs, samples, src, dst


def _worker(episodes: int, length: int, repeats: int) -> dict:
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    trajs, samples, src, dst = layouts(episodes, length, world)
    mine = [t for t in trajs if t.episode_id in set(src.assignment[rank])]
    dispatcher = make_dispatcher("layout-aware")

    def handoff(barrier: bool):
        if barrier:
            dist.barrier()
        return hand_off(dispatcher, mine, samples, src.plan, dst.plan, episodes)[0]  # the runtime's

    got = {side: sorted(handoff(side == "barrier")) for side in SIDES}
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(repeats):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            dist.barrier()  # both sides start together; only the "barrier" side then waits again
            t0 = time.perf_counter()
            handoff(side == "barrier")
            times[side].append(time.perf_counter() - t0)
    return {"same": got["no wait"] == got["barrier"] == sorted(dst.assignment[rank]), "times": times}


def main() -> None:
    from earl.runtime.dist import run_local

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--episodes", type=int, default=16, help="episodes per step (all ranks)")
    ap.add_argument("--length", type=int, default=160, help="mean tokens per episode")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--profile", default="cpu-measured", help="profile the cost model prices with")
    args = ap.parse_args()
    for name, v in (("--episodes", args.episodes), ("--length", args.length), ("--repeats", args.repeats)):
        if v < 1:
            ap.error(f"{name} must be >= 1, got {v}")
    if any(w < 2 for w in args.worlds):
        ap.error(f"--worlds must be >= 2 (the hand-off on one process has no barrier), got {args.worlds}")
    try:
        prof = load_profile(args.profile)
    except (ValueError, OSError) as e:
        ap.error(f"--profile: {e}")
    path = prof.dispatch_path
    print(f"{'world':>5s} {'episodes':>8s} {'no wait ms':>10s} {'barrier ms':>10s} {'speed-up':>8s} "
          f"{'pred no wait':>12s} {'pred barrier':>12s}  same")
    for world in args.worlds:
        res = run_local(_worker, world, args.episodes, args.length, args.repeats, timeout_s=600)
        # per repeat the slowest rank sets the stage; then the median over repeats
        stage = {side: statistics.median(max(r["times"][side][i] for r in res) for i in range(args.repeats))
                 for side in SIDES}
        _, samples, src, dst = layouts(args.episodes, args.length, world)
        tplan = make_dispatcher("layout-aware").plan(src, dst, samples)
        cm = dispatchfit.local_cost_model(prof, world)
        pred = price_transfer_plan(cm, tplan, samples=len(samples), producers=world, world=world,
                                   advantages=False).time_s
        round_s = path.round_cost_s(world) + path.cold_round_s
        print(f"{world:5d} {args.episodes:8d} {stage['no wait'] * 1e3:10.2f} {stage['barrier'] * 1e3:10.2f} "
              f"{stage['barrier'] / stage['no wait']:7.2f}x {pred * 1e3:10.2f}ms {(pred + round_s) * 1e3:10.2f}ms  "
              f"{all(r['same'] for r in res)}")


if __name__ == "__main__":
    main()
