"""Policy planning cost and balance quality, measured side by side in one run.

1. Dispatch planning time for 1,024 ranks and 8,192 samples (target < 100 ms per plan):
   token-balanced placement plus a TransferPlan, centralized vs layout-aware, for a few
   rollout -> training layout pairs.
2. Token imbalance (max/mean tokens per dp group) of the balanced placement vs round-robin on
   long-tailed length distributions.
3. Selector call cost: cost-model `select` per stage for Qwen2.5-72B on 1,024 H100 (first call,
   which scores every plan, and later calls, served from the context-grid cache).

    python benchmarks/bench_policies.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from earl.cost_model import CostModel
from earl.policies import balance_aligned, balance_samples, make_dispatcher, make_selector, round_robin_samples
from earl.policies.types import Layout, Sample
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec, ParallelPlan, Stage, StagePlan, WorkloadStats

RANKS = 1024
SAMPLES = 8192


def long_tail(n: int, kind: str, seed: int = 0) -> list[Sample]:
    """Agentic-looking context lengths: lognormal (median ~1.8k) or Pareto (alpha 1.5), capped
    at 64k tokens; 16 samples per prompt group."""
    rng = random.Random(seed)
    if kind == "lognormal":
        lengths = [rng.lognormvariate(7.5, 1.2) for _ in range(n)]
    else:
        lengths = [500 * rng.paretovariate(1.5) for _ in range(n)]
    return [Sample(i, int(min(65536, max(16, x))), group=i // 16) for i, x in enumerate(lengths)]


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_dispatch(repeats: int) -> None:
    samples = long_tail(SAMPLES, "lognormal")
    pairs = [
        (ParallelPlan(tp=4, dp=256), ParallelPlan(tp=8, dp=128)),
        (ParallelPlan(tp=8, dp=128), ParallelPlan(tp=8, cp=2, dp=64)),
        (ParallelPlan(tp=1, dp=1024), ParallelPlan(tp=8, pp=4, dp=32)),
        (ParallelPlan(tp=4, dp=256), ParallelPlan(tp=4, cp=2, pp=2, dp=64)),
    ]
    print(f"== dispatch planning, {RANKS} colocated ranks, {SAMPLES} samples (median of {repeats}; "
          "target < 100 ms)")
    print("placement: 'independent' = balance_samples on each side; 'aligned' = balance_aligned "
          "(training placement derived from the rollout one)")
    print(f"{'src -> dst':<28} {'placement':<11} {'imbal':>6} {'place ms':>8} {'dispatcher':<13} "
          f"{'plan ms':>8} {'total ms':>9} {'transfers':>9} {'moved GB':>9} {'ctrl GB':>8}")
    for sp, dp in pairs:
        src_a = balance_samples(samples, sp.dp)[0]
        placements = {
            "independent": lambda dp=dp: balance_samples(samples, dp.dp),
            "aligned": lambda dp=dp, src_a=src_a: balance_aligned(samples, dp.dp, src_a),
        }
        for pname, place in placements.items():
            t_place, (dst_a, imb) = timed(place, repeats)
            src, dst = Layout(sp, src_a), Layout(dp, dst_a)
            for name in ("centralized", "layout-aware"):
                disp = make_dispatcher(name)
                t_plan, tplan = timed(lambda disp=disp, src=src, dst=dst: disp.plan(src, dst, samples), repeats)
                ctrl = sum(t.bytes for t in tplan.transfers
                           if t.src != t.dst and tplan.controller in (t.src, t.dst))
                print(f"{sp.short() + ' -> ' + dp.short():<28} {pname:<11} {imb:>6.3f} {t_place * 1e3:>8.1f} "
                      f"{name:<13} {t_plan * 1e3:>8.1f} {(t_place + t_plan) * 1e3:>9.1f} "
                      f"{len(tplan.transfers):>9,} {tplan.total_bytes / 1e9:>9.2f} {ctrl / 1e9:>8.2f}")
    print("(total = placing the training side + planning the transfers; ctrl GB = bytes in and out "
          "of the controller rank)")


def bench_balance() -> None:
    print("\n== token imbalance (max/mean tokens per dp group), balanced vs round-robin")
    print(f"{'distribution':<12} {'samples':>7} {'dp':>5} {'balanced':>9} {'round-robin':>11} {'ratio':>6}")
    for kind in ("lognormal", "pareto"):
        for n, dp in ((8192, 128), (8192, 1024), (1024, 64)):
            s = long_tail(n, kind, seed=1)
            _, bal = balance_samples(s, dp)
            _, rr = round_robin_samples(s, dp)
            print(f"{kind:<12} {n:>7} {dp:>5} {bal:>9.3f} {rr:>11.3f} {rr / bal:>6.2f}")


def bench_selector() -> None:
    gpus = RANKS
    cm = CostModel(ModelSpec.from_name("qwen2.5-72b"),
                   ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=gpus // 8))
    plan = ParallelPlan(tp=8, pp=4, dp=32, sharded_optimizer=True, recompute="full")
    sel = make_selector("cost-model", cost_model=cm, stage_gpus=gpus,
                        initial=StagePlan(rollout=ParallelPlan(tp=8, dp=128), experience=plan, train=plan))
    print(f"\n== cost-model select, qwen2.5-72b on {gpus} H100")
    print(f"{'stage':<11} {'plans':>6} {'first call ms':>13} {'next calls ms':>13}  decision")
    rng = random.Random(0)
    for stage in Stage:
        cur = sel.initial.for_stage(stage)
        n = len(sel.scorer.candidates(stage))
        t0 = time.perf_counter()
        d = sel.select(stage, WorkloadStats(step=0, num_responses=4096, context_mean=8000,
                                            context_p95=16000, context_max=20000,
                                            response_tokens_mean=4000), cur)
        first = time.perf_counter() - t0
        later = []
        for k in range(1, 21):
            m = 8000 * rng.uniform(0.97, 1.03)
            st = WorkloadStats(step=k, num_responses=4096, context_mean=m, context_p95=2 * m,
                               context_max=2.5 * m, response_tokens_mean=m / 2)
            t0 = time.perf_counter()
            sel.select(stage, st, cur)
            later.append(time.perf_counter() - t0)
        print(f"{stage.value:<11} {n:>6} {first * 1e3:>13.1f} {statistics.median(later) * 1e3:>13.2f}  "
              f"{d.plan.describe()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    bench_dispatch(args.repeats)
    bench_balance()
    bench_selector()


if __name__ == "__main__":
    main()
