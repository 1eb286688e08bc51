"""Dispatch latency, measured side by side: centralized vs layout-aware at 2, 4 and 8 gloo
processes for experience batches sized like 8K, 16K and 32K-token contexts, the ratio, and what
the one dispatch price (earl.cost_model.dispatch on the TransferPlans that ran) predicts with a
profile (default: the shipped `cpu-measured`, whose dispatch path `earl calibrate` fitted at 2
and 4 processes on other payloads: 8 processes and 32K contexts are out of its sample).

Setting (earl.calibrate.dispatchfit, shared with the calibration): experience ran data-parallel
on every process (tp1-dpN, round-robin placement); training uses tp2-dp(N/2) with token-balanced
placement. Each process produced `--per-rank` samples. Both dispatchers run on the same
processes, alternating, after a warm-up; the time of one dispatch is the slowest rank's, fastest
(and median) of `--repeats`. On a small shared host the processes compete for cores, so times
are noisy: the load average is printed; read the busiest-rank bytes (exact) next to them.

    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py
    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py --procs 2 4 --contexts 8192 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics

from earl.calibrate.dispatchfit import KINDS, predict, worker
from earl.cost_model.profile import load_profile
from earl.policies.types import TENSOR_BYTES_PER_SAMPLE, TENSOR_BYTES_PER_TOKEN
from earl.runtime.dist import run_local


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--per-rank", type=int, default=4, help="samples each process produced")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--profile", default="cpu-measured", help="profile whose dispatch path predicts")
    args = ap.parse_args()
    profile = load_profile(args.profile)
    per_token = sum(TENSOR_BYTES_PER_TOKEN.values())
    print(f"payload per sample: context x {per_token} B/token (ids, mask, 3 x fp32 per token) "
          f"+ {sum(TENSOR_BYTES_PER_SAMPLE.values())} B; {args.per_rank} samples per process; "
          f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"profile {args.profile}")
    head = (f"{'procs':>5} {'context':>7} {'batch MB':>8} | {'central ms':>10} {'layout ms':>9} "
            f"{'ratio':>6} {'(median)':>8} | {'busiest rank MB c/l':>19} | {'pred central':>12} "
            f"{'pred layout':>11} {'pred ratio':>10}")
    print(head)
    print("-" * len(head))
    ratios: dict[int, list[tuple[float, float]]] = {}
    cases = [(args.per_rank, c) for c in args.contexts]
    for n in args.procs:
        measured = run_local(worker, n, cases, args.repeats, timeout_s=600)[0]
        for ctx in args.contexts:
            (tc, bc, mc), (tl, bl, ml) = (measured[(args.per_rank, ctx)][k] for k in KINDS)
            p = predict(profile, n, args.per_rank, ctx)
            pr = p["centralized"] / p["layout-aware"]
            mb = n * args.per_rank * ctx * per_token / 1e6
            ratios.setdefault(n, []).append((tc / tl, pr))
            busy = f"{bc / 1e6:.1f} / {bl / 1e6:.1f}"
            print(f"{n:>5} {ctx:>7} {mb:>8.1f} | {tc * 1e3:>10.2f} {tl * 1e3:>9.2f} {tc / tl:>6.2f} "
                  f"{mc / ml:>8.2f} | {busy:>19} | {p['centralized'] * 1e3:>12.2f} "
                  f"{p['layout-aware'] * 1e3:>11.2f} {pr:>10.2f}")
    print("mean ratio (centralized / layout-aware) by process count, measured vs predicted: " + ", ".join(
        f"{n}: {statistics.mean(m for m, _ in v):.2f}x vs {statistics.mean(q for _, q in v):.2f}x "
        f"({statistics.mean(q for _, q in v) / statistics.mean(m for m, _ in v) - 1:+.0%})"
        for n, v in ratios.items()))
    print(f"load average {os.getloadavg()[0]:.2f} at end; busiest rank MB: bytes the most loaded rank sent + "
          "received (centralized: the controller)")


if __name__ == "__main__":
    main()
