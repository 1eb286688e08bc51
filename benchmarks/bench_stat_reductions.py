"""The training dispatch's statistics rounds, measured side by side: the runtime's layout-aware
dispatch under its default estimator (REINFORCE++, per-turn baseline) with the turn count agreed
in a reduction of its own (how the runtime ran until the twenty-sixth session: two reductions),
with the turn count known to every rank (the metadata all-gather gives it: one reduction, the
twenty-sixth session) and with every episode's key sums known to every rank (the same
all-gather carries them without a KL penalty: no reduction, the twenty-seventh). The last
variant's time includes what the runtime does for it outside the dispatch: each rank sums its
own episodes (`episode_key_sums`, in the metadata span) and adds up every episode's
(`summed_stats`); the all-gather itself runs in every variant and is not timed.

Each gloo rank produced `--per-rank` samples of up to `--context` tokens in `--turns` turns
(earl.calibrate.dispatchfit's setting: experience tp1-dpN, training tp2-dp(N/2)). The two
variants alternate dispatch by dispatch after a barrier, as the executor starts; a dispatch's
time is the slowest rank's, the median of `--repeats`; `--rounds` fresh process groups (ranks
spawned), the process counts interleaved. Prints the medians and their ratio per round and
the median ratio. On a 2-core host the ranks compete for cores: read the ratios, not the
absolute times.

    OMP_NUM_THREADS=1 python benchmarks/bench_stat_reductions.py
    OMP_NUM_THREADS=1 python benchmarks/bench_stat_reductions.py --procs 2 --repeats 41 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# the turn count agreed in a reduction / known to every rank / the episodes' key sums known too
VARIANTS = ("agreed", "known", "summed")


def worker(per_rank: int, context: int, turns: int, repeats: int) -> dict:
    """Runs on every gloo rank: {variant: (median slowest-rank seconds, reductions issued)}."""
    import torch
    import torch.distributed as dist

    from earl.calibrate.dispatchfit import _store, layouts, with_turns
    from earl.policies.dispatch import LayoutAwareDispatcher
    from earl.runtime.advantages import AdvantageSpec, episode_key_sums, summed_stats
    from earl.runtime.gc_steps import StepGC
    from earl.runtime.move_samples import execute_dispatch

    rank = dist.get_rank()
    samples, src, dst = layouts(dist.get_world_size(), per_rank, context)
    store = with_turns(_store(samples, src, rank), turns)
    tplan = LayoutAwareDispatcher().plan(src, dst, samples)
    spec = AdvantageSpec(estimator="reinforce++", per_turn=True)
    every = [None] * dist.get_world_size()  # every rank's episodes' key sums: the metadata's
    dist.all_gather_object(every, episode_key_sums(store, spec))
    every = {i: v for part in every for i, v in part.items()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    issued = {}
    with StepGC(every=1):
        for rep in range(repeats + 1):  # the first of each: a warm-up
            for v in VARIANTS if rep % 2 else VARIANTS[::-1]:
                work = {k: dict(x) for k, x in store.items()}
                dist.barrier()
                t0 = time.perf_counter()
                known = None
                if v == "summed":  # this rank's own sums (the runtime's metadata span), then all
                    episode_key_sums(work, spec)
                    known = summed_stats(every, samples)
                _, stats = execute_dispatch(tplan, work, samples, src, dst, advantages=spec,
                                            turns=turns if v != "agreed" else None, stats=known)
                t = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                issued[v] = stats.reductions
                if rep:
                    times[v].append(float(t[0]))
    return {v: (statistics.median(times[v]), issued[v]) for v in VARIANTS}


def main() -> None:
    from earl.calibrate.dispatchfit import START_METHOD
    from earl.runtime.dist import run_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--per-rank", type=int, default=4, help="samples each process produced")
    ap.add_argument("--context", type=int, default=256, help="tokens of the longest sample")
    ap.add_argument("--turns", type=int, default=4, help="turns per sample (the baseline's keys)")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    bad = {k: v for k, v in (("--per-rank", args.per_rank), ("--context", args.context), ("--turns", args.turns),
                             ("--repeats", args.repeats), ("--rounds", args.rounds)) if v < 1}
    if bad or any(n < 2 for n in args.procs):
        ap.error(f"--per-rank, --context, --turns, --repeats and --rounds must be >= 1 and --procs >= 2, "
                 f"got {bad or args.procs}")
    print(f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"{args.per_rank} samples per process of up to {args.context} tokens, {args.turns} turns; "
          f"median of {args.repeats} dispatches per variant, slowest rank")
    got: dict[int, list[dict]] = {n: [] for n in args.procs}
    for r in range(args.rounds):
        for n in args.procs:
            got[n].append(run_local(worker, n, args.per_rank, args.context, args.turns, args.repeats,
                                    timeout_s=600, start_method=START_METHOD)[0])
            m = got[n][-1]
            print(f"round {r + 1}/{args.rounds}, {n} processes: turn count agreed {m['agreed'][0] * 1e3:.2f} ms "
                  f"({m['agreed'][1]} reductions), known {m['known'][0] * 1e3:.2f} ms ({m['known'][1]}), "
                  f"key sums known {m['summed'][0] * 1e3:.2f} ms ({m['summed'][1]}); "
                  f"known / agreed x{m['known'][0] / m['agreed'][0]:.2f}, "
                  f"summed / known x{m['summed'][0] / m['known'][0]:.2f}; load {os.getloadavg()[0]:.2f}", flush=True)
    for n in args.procs:
        for a, b in (("known", "agreed"), ("summed", "known"), ("summed", "agreed")):
            ratios = [m[a][0] / m[b][0] for m in got[n]]
            saved = [(m[b][0] - m[a][0]) * 1e3 for m in got[n]]
            print(f"{n} processes: {a} / {b} x{statistics.median(ratios):.2f} (rounds x{min(ratios):.2f}-"
                  f"x{max(ratios):.2f}), {statistics.median(saved):.2f} ms saved per dispatch (median of rounds)")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
