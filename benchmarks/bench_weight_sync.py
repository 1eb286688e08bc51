"""The FSDP2 weight sync (training shards -> whole weights for the rollout and experience
copies, `FSDPAdamW.weights`) on gloo: one all-gather per bucket of consecutive tensors
(`SYNC_BUCKET_BYTES`, the runtime's default) against one all-gather per tensor (the sync
before buckets; `bucket_bytes=1`), side by side in the same processes and alternating, so load
changes hit both alike. Both must return the same tensors (checked). The cost model's price
of the bucketed sync (`CostModel.reshard(..., fsdp=True)` with the given profile) is printed
next to them, bare (a dedicated core per rank) and as `earl validate` stretches it on a CPU host
(`earl.calibrate.hostload.sync_stretch`: N ranks on the profile's `host_parallel` cores, arriving
together from the barrier, no other tenant). "bucketed ms" is the slowest rank's median, "first
end" the first rank's: `earl validate` reads a runtime step's sync from its last rank's arrival to
its first rank's end (earl.calibrate.validate.measured_stages), the window "on host" prices.

Models: the built-in `tiny` (2 layers, 20 tensors: latency-bound) and `qwen2-27m` (8 layers,
27M parameters, random weights: closer to bandwidth-bound).

    OMP_NUM_THREADS=1 python benchmarks/bench_weight_sync.py
    OMP_NUM_THREADS=1 python benchmarks/bench_weight_sync.py --worlds 2 --models tiny --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from earl.calibrate.host import local_cluster
from earl.calibrate.hostload import sync_stretch
from earl.cost_model import CostModel
from earl.cost_model.model import SYNC_BUCKET_BYTES
from earl.cost_model.profile import load_profile
from earl.parallel import build_plan_groups
from earl.runtime.dist import run_local
from earl.runtime.hf_model import hf_config_from_spec
from earl.runtime.optim import FSDPAdamW
from earl.runtime.parallelize import parallelize
from earl.runtime.run_config import TrainerConfig
from earl.runtime.tp import param_shapes
from earl.specs import MODEL_CATALOG, ParallelPlan

PER_TENSOR = 1  # bytes per bucket that put every tensor in a gather of its own


def _model(name: str):
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(hf_config_from_spec(MODEL_CATALOG[name], "fp32"))


def _worker(name: str, world: int, repeats: int, bucket_bytes: float) -> dict:
    torch.set_num_threads(1)
    plan = ParallelPlan(dp=world, sharded_optimizer=True)
    groups = build_plan_groups(plan)
    model = _model(name)
    shapes = param_shapes(model)
    model = parallelize(model, plan, shapes)
    optim = FSDPAdamW(model, shapes, groups, TrainerConfig(), torch.float32)
    ref = optim.weights(bucket_bytes=bucket_bytes)
    same = all(torch.equal(ref[n], t) for n, t in optim.weights(bucket_bytes=PER_TENSOR).items())
    times: dict[str, list[float]] = {"bucketed": [], "per tensor": []}
    for r in range(repeats):
        order = ("bucketed", "per tensor") if r % 2 == 0 else ("per tensor", "bucketed")
        for side in order:
            torch.distributed.barrier()
            t0 = time.perf_counter()
            optim.weights(bucket_bytes=bucket_bytes if side == "bucketed" else PER_TENSOR)
            times[side].append(time.perf_counter() - t0)
    return {"same": same, "tensors": len(shapes), **{k: statistics.median(v) for k, v in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--models", nargs="+", default=["tiny", "qwen2-27m"], choices=["tiny", "qwen2-27m"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--profile", default="cpu-measured", help="profile the cost model prices with")
    ap.add_argument("--bucket-mib", type=float, default=SYNC_BUCKET_BYTES / 2**20,
                    help="bucket size of the bucketed side (the runtime's: %(default)s)")
    args = ap.parse_args()
    try:
        prof = load_profile(args.profile)
    except (ValueError, OSError) as e:
        ap.error(f"--profile: {e}")
    print(f"{'model':10s} {'world':>5s} {'tensors':>7s} {'per tensor ms':>13s} {'bucketed ms':>11s} "
          f"{'speed-up':>8s} {'first end':>9s} {'predicted':>10s} {'on host':>9s}  same")
    for name in args.models:
        spec = dataclasses.replace(MODEL_CATALOG[name], dtype="fp32")
        for world in args.worlds:
            res = run_local(_worker, world, name, world, args.repeats, args.bucket_mib * 2**20, timeout_s=600)
            slow = max(res, key=lambda r: r["bucketed"])  # the last rank to finish sets the stage
            per, buck = max(r["per tensor"] for r in res), slow["bucketed"]
            first = min(r["bucketed"] for r in res)  # the first rank done: where validate's window ends
            cm = CostModel(spec, local_cluster(prof, world), prof)
            src, dst = ParallelPlan(dp=world, sharded_optimizer=True), ParallelPlan(dp=world)
            pred = cm.reshard(src, dst, fsdp=True).time_s
            cores = prof.dispatch_path.host_parallel
            host = pred * sync_stretch(prof, world, "cpu", min(1.0, cores / world), [0.0] * world, pred)
            print(f"{name:10s} {world:5d} {slow['tensors']:7d} {per * 1e3:13.2f} {buck * 1e3:11.2f} "
                  f"{per / buck:7.2f}x {first * 1e3:7.2f}ms {pred * 1e3:8.2f}ms {host * 1e3:7.2f}ms  "
                  f"{all(r['same'] for r in res)}")


if __name__ == "__main__":
    main()
