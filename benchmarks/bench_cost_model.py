"""Cost-model speed: estimates per second per stage, and a full `earl plan` over 1,024 GPUs.

Target: enumerating and ranking every plan for 1,024 GPUs in under 1 s on one core.

    python benchmarks/bench_cost_model.py
"""

from __future__ import annotations

import time

from earl.cost_model.resolve import make_cost_model
from earl.cost_model.search import enumerate_plans, rank_plans
from earl.policies.dispatch_cost import estimate_dispatch
from earl.specs import ParallelPlan


def rate(fn, seconds: float = 0.5) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    cm = make_cost_model("qwen2.5-72b", "h100-sxm-80gb", 1024, "tcp-200g")
    plan = ParallelPlan(tp=8, pp=4, dp=32, micro_batch=2, recompute="selective")
    rollout = ParallelPlan(tp=8, dp=128)
    print("estimates per second (qwen2.5-72b, 1,024 x H100):")
    cases = {
        "decode": lambda: cm.decode(rollout, 4096, 16384),
        "prefill": lambda: cm.prefill(rollout, 4096, 2048),
        "logprob": lambda: cm.logprob(plan, 1024, 16384),
        "train": lambda: cm.train(plan, 1024, 16384),
        "dispatch (plan + price)": lambda: estimate_dispatch(cm, "layout-aware", rollout, plan, 1024, 16384),
        "reshard": lambda: cm.reshard(plan, rollout),
        "decode_step_time_s (sim hook)": lambda: cm.decode_step_time_s(8, 64, 64 * 16384),
    }
    for name, fn in cases.items():
        print(f"  {name:32s} {rate(fn):>12,.0f} /s")
    print("full plan search over 1,024 GPUs (enumerate + estimate + rank):")
    for stage in ("decode", "logprob", "train"):
        t0 = time.perf_counter()
        n = len(enumerate_plans(stage, cm.model, 1024, 16384, 8))
        ranked = rank_plans(cm, stage, 1024, 1024, 16384)
        dt = time.perf_counter() - t0
        ok = sum(e.feasible for _, e in ranked)
        print(f"  {stage:8s} {n:5d} plans ({ok:4d} feasible) in {dt * 1e3:7.1f} ms   "
              f"best {ranked[0][0].describe()}   target < 1000 ms: {'met' if dt < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
