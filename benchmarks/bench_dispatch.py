"""Dispatch latency, measured side by side: centralized vs layout-aware at 2, 4 and 8 gloo
processes for experience batches sized like 8K, 16K and 32K-token contexts, the ratio, and what
the cost model predicts (CostModel.dispatch on the 'cpu' profile, loopback network).

Setting: experience ran data-parallel on every process (tp1-dpN, round-robin placement);
training uses tp2-dp(N/2) with token-balanced placement. Each process produced `--per-rank`
samples. Both dispatchers run on the same processes, alternating, after a warm-up; the time of
one dispatch is the slowest rank's (barrier, then the last unpack), median of `--repeats`.
On a small shared host the processes compete for cores, so times are noisy: run it twice and
read the busiest-rank bytes (exact, load independent) next to them.

    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py
    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py --procs 2 4 --contexts 8192 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics

import torch

from earl.cost_model import CostModel
from earl.cost_model.profile import load_profile
from earl.policies.balance import balance_samples, round_robin_samples
from earl.policies.dispatch import CentralizedDispatcher, LayoutAwareDispatcher
from earl.policies.types import TENSOR_BYTES_PER_SAMPLE, TENSOR_BYTES_PER_TOKEN, Layout, Sample
from earl.runtime.dispatch import execute_dispatch
from earl.runtime.dist import run_local
from earl.specs import HARDWARE_CATALOG, MODEL_CATALOG, NETWORK_CATALOG, ClusterSpec, ParallelPlan

KINDS = ("centralized", "layout-aware")


def plans(nproc: int) -> tuple[ParallelPlan, ParallelPlan]:
    return ParallelPlan(dp=nproc), ParallelPlan(tp=2 if nproc > 1 else 1, dp=max(1, nproc // 2))


def layouts(nproc: int, per_rank: int, context: int, group_size: int = 4):
    src_plan, dst_plan = plans(nproc)
    samples = [Sample(id=i, tokens=context - 64 * (i % 4), group=i // group_size)
               for i in range(nproc * per_rank)]
    src = Layout(src_plan, round_robin_samples(samples, src_plan.dp)[0])
    dst = Layout(dst_plan, balance_samples(samples, dst_plan.dp)[0])
    return samples, src, dst


def _store(samples, src, rank):
    out = {}
    for i in src.assignment[rank // src.plan.tp]:
        n = samples[i].tokens
        out[i] = {"input_ids": torch.randint(0, 1000, (n,)), "loss_mask": torch.ones(n, dtype=torch.bool),
                  "old_logprobs": torch.randn(n), "ref_logprobs": torch.randn(n),
                  "rewards": torch.rand(1)}
    return out


def _worker(contexts, per_rank, repeats):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for ctx in contexts:
        samples, src, dst = layouts(world, per_rank, ctx)
        store = _store(samples, src, rank)
        disp = {"centralized": CentralizedDispatcher(), "layout-aware": LayoutAwareDispatcher()}
        tplans = {k: d.plan(src, dst, samples) for k, d in disp.items()}
        times = {k: [] for k in KINDS}
        busiest = {}
        for rep in range(repeats + 1):
            for k in KINDS:
                _, stats = execute_dispatch(tplans[k], store, samples, src, dst, check=(rep == 0))
                t = torch.tensor([stats.seconds, float(stats.bytes_sent + stats.bytes_recv)])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                busiest[k] = float(t[1])
                if rep:  # the first round warms up connections and allocators
                    times[k].append(float(t[0]))
        out[ctx] = {k: (statistics.median(v), busiest[k]) for k, v in times.items()}
    return out


def predict(nproc: int, per_rank: int, context: int) -> dict[str, float]:
    cluster = ClusterSpec(hardware=HARDWARE_CATALOG["cpu"], nodes=1, gpus_per_node=nproc,
                          network=NETWORK_CATALOG["loopback"])
    cm = CostModel(MODEL_CATALOG["tiny"], cluster, load_profile("cpu"))
    src, dst = plans(nproc)
    return {k: cm.dispatch(k, src, dst, nproc * per_rank, context).time_s for k in KINDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--per-rank", type=int, default=4, help="samples each process produced")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    per_token = sum(TENSOR_BYTES_PER_TOKEN.values())
    print(f"payload per sample: context x {per_token} B/token (ids, mask, 3 x fp32 per token) "
          f"+ {sum(TENSOR_BYTES_PER_SAMPLE.values())} B; {args.per_rank} samples per process")
    head = (f"{'procs':>5} {'context':>7} {'batch MB':>8} | {'central ms':>10} {'layout ms':>9} "
            f"{'ratio':>6} | {'busiest rank MB c/l':>19} | {'pred central':>12} {'pred layout':>11} "
            f"{'pred ratio':>10}")
    print(head)
    print("-" * len(head))
    ratios: dict[int, list[float]] = {}
    for n in args.procs:
        measured = run_local(_worker, n, args.contexts, args.per_rank, args.repeats, timeout_s=600)[0]
        for ctx in args.contexts:
            (tc, bc), (tl, bl) = measured[ctx]["centralized"], measured[ctx]["layout-aware"]
            p = predict(n, args.per_rank, ctx)
            mb = n * args.per_rank * ctx * per_token / 1e6
            ratios.setdefault(n, []).append(tc / tl)
            busy = f"{bc / 1e6:.1f} / {bl / 1e6:.1f}"
            print(f"{n:>5} {ctx:>7} {mb:>8.1f} | {tc * 1e3:>10.2f} {tl * 1e3:>9.2f} {tc / tl:>6.2f} | "
                  f"{busy:>19} | {p['centralized'] * 1e3:>12.2f} "
                  f"{p['layout-aware'] * 1e3:>11.2f} {p['centralized'] / p['layout-aware']:>10.2f}")
    print("mean measured ratio (centralized / layout-aware) by process count: "
          + ", ".join(f"{n}: {statistics.mean(v):.2f}x" for n, v in ratios.items()))
    print("busiest rank MB: bytes the most loaded rank sent + received (centralized: the controller)")


if __name__ == "__main__":
    main()
