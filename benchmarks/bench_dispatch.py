"""Dispatch latency, measured side by side: centralized vs layout-aware at 2, 4 and 8 gloo
processes for experience batches sized like 8K, 16K and 32K-token contexts, the ratio, and what
the one dispatch price (earl.cost_model.dispatch on the TransferPlans that ran) predicts with a
profile (default: the shipped `cpu-measured`, whose dispatch path `earl calibrate` fitted at 2
and 4 processes on other payloads: 8 processes and 32K contexts are out of its sample).

Setting (earl.calibrate.dispatchfit, shared with the calibration): experience ran data-parallel
on every process (tp1-dpN, round-robin placement); training uses tp2-dp(N/2) with token-balanced
placement. Each process produced `--per-rank` samples. Both dispatchers run on the same
processes, alternating, after a warm-up; the time of one dispatch is from its last rank's start to
its last rank's end (as `earl validate` reads a run's), median of `--repeats`
(earl.calibrate.dispatchfit.worker). On a small shared host the processes compete for cores, so times
are noisy: the load average is printed; read the busiest-rank bytes (exact) next to them.
`--rounds R` repeats the whole measurement R times with fresh process groups, the process
counts interleaved round by round (ranks spawned fresh, as the calibration's), and reports
each ratio's median over the rounds (with its range): one invocation then reads like the mean
of several, which single rounds on this host (+-30% apart) do not.

    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py
    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py --procs 2 4 --contexts 8192 --repeats 5 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import statistics

from earl.calibrate.dispatchfit import KINDS, START_METHOD, predict, worker
from earl.cost_model.profile import load_profile
from earl.policies.types import TENSOR_BYTES_PER_SAMPLE, TENSOR_BYTES_PER_TOKEN
from earl.runtime.dist import run_local


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--per-rank", type=int, default=4, help="samples each process produced")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3, help="whole measurements; ratios are their median")
    ap.add_argument("--profile", default="cpu-measured", help="profile whose dispatch path predicts")
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        ap.error(f"--rounds and --repeats must be >= 1, got {args.rounds} and {args.repeats}")
    profile = load_profile(args.profile)
    per_token = sum(TENSOR_BYTES_PER_TOKEN.values())
    print(f"payload per sample: context x {per_token} B/token (ids, mask, 3 x fp32 per token) "
          f"+ {sum(TENSOR_BYTES_PER_SAMPLE.values())} B; {args.per_rank} samples per process; "
          f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"profile {args.profile}")
    head = (f"{'procs':>5} {'context':>7} {'batch MB':>8} | {'central ms':>10} {'layout ms':>9} "
            f"{'ratio':>6} {'(rounds)':>9} | {'busiest rank MB c/l':>19} | {'pred central':>12} "
            f"{'pred layout':>11} {'pred ratio':>10}")
    print(head)
    print("-" * len(head))
    cases = [(args.per_rank, c) for c in args.contexts]
    rounds: dict[int, list[dict]] = {n: [] for n in args.procs}
    for r in range(args.rounds):
        for n in args.procs:  # interleaved: every process count meets each round's load
            rounds[n].append(run_local(worker, n, cases, args.repeats, timeout_s=600, start_method=START_METHOD)[0])
        print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    ratios: dict[int, list[tuple[float, float]]] = {}
    for n in args.procs:
        for ctx in args.contexts:
            per_round = [[m[(args.per_rank, ctx)][k] for k in KINDS] for m in rounds[n]]
            tc = statistics.median(c[0] for c, _ in per_round)
            tl = statistics.median(lay[0] for _, lay in per_round)
            bc, bl = per_round[0][0][1], per_round[0][1][1]
            rs = [c[0] / lay[0] for c, lay in per_round]
            ratio = statistics.median(rs)
            p = predict(profile, n, args.per_rank, ctx)
            pr = p["centralized"] / p["layout-aware"]
            mb = n * args.per_rank * ctx * per_token / 1e6
            ratios.setdefault(n, []).append((ratio, pr))
            busy = f"{bc / 1e6:.1f} / {bl / 1e6:.1f}"
            spread = f"{min(rs):.2f}-{max(rs):.2f}"
            print(f"{n:>5} {ctx:>7} {mb:>8.1f} | {tc * 1e3:>10.2f} {tl * 1e3:>9.2f} {ratio:>6.2f} "
                  f"{spread:>9} | {busy:>19} | {p['centralized'] * 1e3:>12.2f} "
                  f"{p['layout-aware'] * 1e3:>11.2f} {pr:>10.2f}")
    print("mean ratio (centralized / layout-aware) by process count, measured vs predicted: " + ", ".join(
        f"{n}: {statistics.mean(m for m, _ in v):.2f}x vs {statistics.mean(q for _, q in v):.2f}x "
        f"({statistics.mean(q for _, q in v) / statistics.mean(m for m, _ in v) - 1:+.0%})"
        for n, v in ratios.items()))
    print(f"load average {os.getloadavg()[0]:.2f} at end; busiest rank MB: bytes the most loaded rank sent + "
          "received (centralized: the controller)")


if __name__ == "__main__":
    main()
