"""Fit the profile's dispatch path (`HardwareProfile.dispatch_path`) from gloo runs of the
runtime's own dispatch executor, through the one dispatch price.

Each point runs both dispatchers (earl.runtime.move_samples.execute_dispatch) on local gloo
processes, warm and cold (as the runtime's dispatch runs right after its log-prob passes), as
the runtime's training dispatch runs them: every rank holds the rewards, no statistics reduction
(`runtime_plans`; until 2026-12-06 the points reduced once, which the fit priced at `reduce_s`);
host costs come from timing the executor's own packing in one process; each process group
first times its synchronising rounds (back-to-back barriers: `DispatchPath.round_s`, and at more
processes than cores `sync_s`) and its statistics reductions (the runtime's own advantage
code after a barrier, less its local work: `reduce_s`, `reduce_sync_s`); the gloo runs then
fit the per-message cost and the oversubscription stretch by least squared log error of
`price_transfer_plan` on the plans that ran, each dispatch read from its last rank's start to
its last rank's end, as `earl validate` reads the runtime's. benchmarks/bench_dispatch.py uses the same layouts
and workers. Layouts, medians and the cold-cache figures: docs/calibration.md, "Design notes".

    OMP_NUM_THREADS=1 python -m earl.calibrate.dispatchfit     # measure at 2 and 4, fit, print
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from scipy.optimize import least_squares, nnls

from earl.calibrate.host import local_cost_model
from earl.calibrate.hostload import CpuShare, cores
from earl.cost_model.dispatch import price_transfer_plan, sync_rounds
from earl.cost_model.profile import DispatchPath, HardwareProfile, load_profile
from earl.parallel import coord_of
from earl.policies.balance import balance_samples, round_robin_samples
from earl.policies.dispatch import CentralizedDispatcher, LayoutAwareDispatcher
from earl.policies.types import Layout, Sample, Transfer
from earl.runtime.advantages import AdvantageSpec, distributed_advantages, fill_advantages, local_stats
from earl.runtime.dist import run_local
from earl.runtime.gc_steps import StepGC
from earl.runtime.hostprobe import HostProbe, median_probe
from earl.runtime.move_samples import execute_dispatch, pack_transfer, unpack_transfer
from earl.specs import ParallelPlan

KINDS = ("centralized", "layout-aware")
# (samples per process, context tokens) measured by `earl calibrate`: small to large payloads
# (up to 11 MB a step at 4 processes: 32K-token contexts), few to many pieces, so the
# per-message, per-piece and per-byte terms separate
CASES: tuple[tuple[int, int], ...] = ((1, 512), (4, 2048), (16, 1024), (4, 16384), (8, 8192), (4, 32768))
# the dispatch-path terms the gloo runs fit, in this order (a quick fit: the first only)
# (round_s and the reduction's terms are measured directly, `round_terms`; sync_s is measured so
# too, then refitted on the
# executor's own runs where some ran more processes than cores: OVERSUBSCRIBED_ROUND)
FITTED = ("message_s", "oversubscribed_exp", "controller_bw_bytes_s", "wire_bw_bytes_s")
# sync_s, what a round adds when ranks outnumber the cores, is fitted on the executor's runs at
# such process counts within [this x, 1 x] the back-to-back barrier loop's figure: the loop is
# the worst case (every rank asleep on its socket at every round), the executor's rounds come
# between pieces of work, where a waking rank often finds its peers' messages already sent (4
# gloo ranks on 2 cores, 2026-12-02: the loop 2.0 ms a round, the executor's small-payload
# dispatches 0.6-1.2 ms a round). The loop's figure itself is kept as `wake_sync_s`: the runtime's
# rounds, whose ranks come from other work, pay it (docs/validate-history.md, twenty-ninth session)
OVERSUBSCRIBED_ROUND = 0.05
QUICK_BUDGET_S = 3.0  # seconds of dispatch budget below which only the quick set runs
START_METHOD = "spawn"  # fresh rank processes for every measurement (see `measure`)
# bytes each rank writes before a cold repeat: past the last-level cache (32 MiB on this host)
EVICT_BYTES = 64 << 20
ROUNDS = 40  # back-to-back barriers per timed loop (`round_seconds`)
# `reduce_seconds`: the batch whose advantages the ranks compute (samples over all ranks, the
# longest `REDUCE_CONTEXT` tokens, `layouts`' lengths) and the timed repeats
REDUCE_SAMPLES, REDUCE_CONTEXT, REDUCE_REPEATS = 16, 256, 25


@dataclass(frozen=True, kw_only=True)
class DispatchPoint:
    """One measured dispatch."""

    procs: int  # gloo processes
    per_rank: int  # samples each process produced
    context: int  # tokens of the longest sample
    kind: str  # dispatcher
    # from the last rank's start to the last rank's end (the slowest rank's wall from a common
    # start in calibrations before 2026-12-06's twenty-eighth session), median of the repeats, s
    seconds: float
    busiest_bytes: float  # bytes the busiest rank sent + received
    cold_seconds: float = math.nan  # the same on cold caches (nan: not measured), s
    # the share of a core its ranks got beyond their own oversubscription (earl.calibrate.hostload)
    share: float = 1.0
    # seconds per synchronising round of its process group (`round_seconds`; nan: not measured)
    round_s: float = math.nan
    # seconds per statistics reduction of its process group (`reduce_seconds`; nan: not measured)
    reduce_s: float = math.nan
    probe_s: float | None = None  # rank 0's median host-probe reading over its trials (earl/runtime/hostprobe.py)
    # statistics reductions each of its dispatches issued: none since 2026-12-06 (`runtime_plans`),
    # one in the points of calibrations before (their recorded points, studies/cpu_refit_dispatch.py)
    reductions: int = 0
    # rounds before the executor's first phase: its start barrier's, 1 in the points of
    # calibrations before 2026-12-06's twenty-eighth session (the executor then lined its ranks
    # up first; their recorded points, studies/cpu_refit_dispatch.py), none since
    start_rounds: int = 0


def plans(nproc: int) -> tuple[ParallelPlan, ParallelPlan]:
    """(experience plan, training plan) of the measured setting."""
    return ParallelPlan(dp=nproc), ParallelPlan(tp=2 if nproc > 1 else 1, dp=max(1, nproc // 2))


def layouts(nproc: int, per_rank: int, context: int, group_size: int = 4):
    """(samples, src layout, dst layout): lengths context - 64 * (i % 4), GRPO groups of 4."""
    src_plan, dst_plan = plans(nproc)
    samples = [Sample(id=i, tokens=max(1, context - 64 * (i % 4)), group=i // group_size)
               for i in range(nproc * per_rank)]
    src = Layout(src_plan, round_robin_samples(samples, src_plan.dp)[0])
    dst = Layout(dst_plan, balance_samples(samples, dst_plan.dp)[0])
    return samples, src, dst


def transfer_plans(nproc: int, per_rank: int, context: int) -> dict:
    samples, src, dst = layouts(nproc, per_rank, context)
    return {"centralized": CentralizedDispatcher().plan(src, dst, samples),
            "layout-aware": LayoutAwareDispatcher().plan(src, dst, samples)}


def runtime_plans(nproc: int, per_rank: int, context: int) -> dict:
    """`transfer_plans` as the runtime's training dispatch runs them: every rank holds the
    statistics its advantages need (a group estimator's rewards, REINFORCE++'s key sums: the
    metadata all-gather; earl.runtime.step.train), so no plan reduces any. What the gloo points
    execute (`sample_reward` given to every rank) and the fit prices; a run with a KL penalty in
    REINFORCE++'s rewards reduces once, priced with `reduce_seconds`' measured reduction."""
    return {k: dataclasses.replace(tp, reduce_bytes=0) for k, tp in transfer_plans(nproc, per_rank, context).items()}


def sample_reward(i: int) -> float:
    """Sample `i`'s episode reward in the measured setting, the same on every rank (the
    runtime's metadata gives every rank every reward): spread over [0, 1)."""
    return (i * 37 % 101) / 101


def _store(samples, src, rank):

    out = {}
    for i in src.assignment[coord_of(src.plan, rank).dp]:
        n = samples[i].tokens
        out[i] = {"input_ids": torch.randint(0, 1000, (n,)), "loss_mask": torch.ones(n, dtype=torch.bool),
                  "old_logprobs": torch.randn(n), "ref_logprobs": torch.randn(n),
                  "rewards": torch.tensor([sample_reward(i)])}
    return out


def worker(cases, repeats):
    """Runs on every gloo rank: both dispatchers alternating, per case, warm then cold; rank 0's
    answer is {(per_rank, context): {kind: (median seconds from the last rank's start to the last
    rank's end, busiest-rank bytes, the same median cold)}}. The garbage collector runs as in the runtime's steps:
    by hand, between the timed dispatches (earl.runtime.gc_steps)."""
    with StepGC(every=1) as step_gc:
        return _timed_cases(cases, repeats, step_gc)


def _timed_cases(cases, repeats, step_gc):
    """`worker`'s timed loops."""


    rank, world = dist.get_rank(), dist.get_world_size()
    evict = torch.empty(EVICT_BYTES // 4)
    probe = HostProbe()  # the host's speed through the timed repeats (HardwareProfile.host_probe_dispatch_s)
    out = {"probe": []}
    for per_rank, ctx in cases:
        samples, src, dst = layouts(world, per_rank, ctx)
        store = _store(samples, src, rank)
        tplans = runtime_plans(world, per_rank, ctx)
        rewards = {x.id: sample_reward(x.id) for x in samples}
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        busiest = {}
        for rep in range(repeats + 1):
            out["probe"].append(probe.time())
            for k in KINDS:
                step_gc.step_done(rep)
                t0, t1, stats = _timed_span(tplans[k], store, samples, src, dst, check=(rep == 0), rewards=rewards)
                wall, busiest[k] = _last_start_to_end(t0, t1, float(stats.bytes_sent + stats.bytes_recv))
                if rep:  # the first round warms up connections and allocators
                    times[k].append(wall)
        cold: dict[str, list[float]] = {k: [] for k in KINDS}
        for rep in range(repeats):
            for k in KINDS:
                step_gc.step_done(rep)
                evict.fill_(rep)  # cold caches (see EVICT_BYTES)
                t0, t1, _ = _timed_span(tplans[k], store, samples, src, dst, check=False, rewards=rewards)
                cold[k].append(_last_start_to_end(t0, t1)[0])
        # the median repeat: the runtime's dispatches are single shots, not the luckiest of several
        out[(per_rank, ctx)] = {k: (statistics.median(v), busiest[k], statistics.median(cold[k]))
                                for k, v in times.items()}
    return out


def _timed_span(tplan, store, samples, src, dst, check: bool, rewards: dict[int, float] | None = None):
    """(start, end, stats) of one `execute_dispatch` on this rank, after a barrier (`rewards`:
    every sample's, known to every rank: no statistics reduction, `runtime_plans`), on the
    host's monotonic clock (`time.perf_counter`, one for all its processes). The points read a
    dispatch from the last rank's start to the last rank's end (`_last_start_to_end`), as `earl
    validate` reads the runtime's (earl.calibrate.validate.measured_stages): its phases are the
    rounds the price counts (`sync_rounds`). Warm and cold repeats are both timed so.
    History: until 2026-12-06 (twenty-eighth session) the points read the slowest rank's wall
    from its own barrier exit, and the executor lined its ranks up with a barrier of its own
    first, a round the price counted; until 2026-12-05 the warm repeats read the executor's own
    seconds after that barrier, which the price counted as a round the points did not hold, and
    the cold ones the wall around the call, so `cold_round_s` took the barrier's round for the
    caches' cost (0.4-1.0 ms at 2 ranks, 1.7-4.5 ms at 4 on the 2-vCPU EPYC;
    studies/cpu_dispatch_cold.py, docs/validate-history.md, twentieth session)."""
    dist.barrier()
    t0 = time.perf_counter()
    _, stats = execute_dispatch(tplan, store, samples, src, dst, check=check, rewards=rewards)
    return t0, time.perf_counter(), stats


def _timed_call(tplan, store, samples, src, dst, check: bool, rewards: dict[int, float] | None = None):
    """(this rank's wall seconds, stats) of `_timed_span`'s dispatch."""
    t0, t1, stats = _timed_span(tplan, store, samples, src, dst, check, rewards)
    return t1 - t0, stats


def _last_start_to_end(t0: float, t1: float, extra: float = 0.0) -> tuple[float, float]:
    """Collective: (seconds from the last rank's start to the last rank's end, the largest
    `extra` of any rank); float64, as the clock's seconds since boot need."""
    t = torch.tensor([t0, t1, extra], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[1] - t[0]), float(t[2])


def round_seconds(rounds: int = ROUNDS, repeats: int = 5) -> float:
    """Runs on every gloo rank: seconds per synchronising round, a barrier issued back to back
    `rounds` times (the executor's and the weight sync's rounds follow one another so), median
    of `repeats` loops after one warm-up, the slowest rank's. `DispatchPath.round_s` / `sync_s`."""

    per = []
    for rep in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(rounds):
            dist.barrier()
        t = torch.tensor([(time.perf_counter() - t0) / rounds])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rep:
            per.append(float(t[0]))
    return statistics.median(per)


def reduce_seconds(repeats: int = REDUCE_REPEATS, samples: int = REDUCE_SAMPLES) -> float:
    """Runs on every gloo rank: seconds per statistics reduction as the runtime issues them. The
    runtime's own `distributed_advantages` under a per-turn REINFORCE++ baseline (its default:
    each rank's local statistics, then one `reduce_small` of the per-turn sums, the turn count
    known to every rank as the runtime's metadata all-gather makes it) runs right after a
    barrier, as the dispatch executor runs it; the slowest rank's time, median of `repeats`
    after one warm-up, less the same rank's local work alone (the statistics and the fill
    without any round, timed the same way), over the reductions issued (one). Until the
    twenty-sixth session (2026-12-05) the runtime agreed on the turn count in a reduction of
    its own, and this timed the two and divided by two.
    `DispatchPath.reduce_s` / `reduce_sync_s`. Neither a barrier round pair nor a back-to-back
    loop of reductions is that: on 2 gloo ranks on 2 cores here (2026-12-05) a reduction read
    0.46-0.74 ms in situ (two, averaged), 0.20-0.33 ms back to back, 0.39-1.0 ms as two barrier
    rounds; at 4 ranks 1.3-2.2, 0.5-1.2 and 3.9-4.4 ms (docs/validate-history.md, twenty-fifth session);
    a lone one in situ 0.45-0.89 / 1.8-2.4 ms (six calibrations, twenty-sixth session)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = AdvantageSpec(estimator="reinforce++", per_turn=True)
    batch, src, _ = layouts(world, max(1, samples // world), REDUCE_CONTEXT)
    store = with_turns(_store(batch, src, rank))
    mine = [x for x in batch if x.id in store]

    def slowest(fn) -> float:
        per = []
        for rep in range(repeats + 1):
            work = {k: dict(v) for k, v in store.items()}
            dist.barrier()
            t0 = time.perf_counter()
            fn(work)
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if rep:
                per.append(float(t[0]))
        return statistics.median(per)

    both = slowest(lambda work: distributed_advantages(work, batch, src, spec, rank, turns=TURNS))
    local = slowest(lambda work: fill_advantages(work, mine, local_stats(work, mine, spec), spec))
    return max(0.0, both - local) / spec.reductions(turns=TURNS)


def _measure_worker(cases, repeats):
    """`worker` after `round_seconds` and `reduce_seconds`, in the same process group:
    ((round, reduction), cases)."""
    with StepGC(every=1):
        rounds = (round_seconds(), reduce_seconds())
    return rounds, worker(cases, repeats)


def measure(procs=(2, 4), cases=CASES, repeats: int = 5, trials: int = 3) -> list[DispatchPoint]:
    """Run the executor on local gloo processes; one point per (procs, case, dispatcher): the
    median over `trials` fresh process groups (process counts interleaved) of each one's
    median of `repeats`. The median, not the fastest, of the trials: on this shared host one
    case's fastest repeat moved 1.8x between process groups minutes apart (centralized, 4
    processes, 4 x 16K: 6.9 vs 12.6 ms), and benchmarks/bench_dispatch.py reads its rounds the
    same way. The ranks are spawned (fresh interpreters), not forked: forked from the process
    that had just run the other calibration phases, the centralized controller ran 1.5x faster
    than in any fresh process (8.0 vs 12.0 ms at 4 x 16K), so the fit depended on what ran
    before it."""

    seen: dict[tuple, list[tuple[float, float, float]]] = {}
    rounds: dict[int, list[tuple[float, float]]] = {}
    probes: dict[int, list[float]] = {}
    for _ in range(trials):
        for n in procs:
            with CpuShare(procs=n) as load:
                got, res = run_local(_measure_worker, n, list(cases), repeats, timeout_s=600,
                                     start_method=START_METHOD)[0]
            rounds.setdefault(n, []).append(got)
            probes.setdefault(n, []).extend(res.pop("probe", []))
            # the share beyond the ranks' own oversubscription, which the path's terms model
            share = min(1.0, load.share() / min(1.0, cores() / n))
            for (per_rank, ctx), by_kind in res.items():
                for k, (sec, busy, cold) in by_kind.items():
                    seen.setdefault((n, per_rank, ctx, k), []).append((sec, busy, cold, share))
    return [DispatchPoint(procs=n, per_rank=per_rank, context=ctx, kind=k,
                          seconds=statistics.median(x[0] for x in v), busiest_bytes=v[0][1],
                          cold_seconds=statistics.median(x[2] for x in v), share=statistics.median(x[3] for x in v),
                          round_s=statistics.median(r for r, _ in rounds[n]),
                          reduce_s=statistics.median(r for _, r in rounds[n]), probe_s=median_probe(probes[n]))
            for (n, per_rank, ctx, k), v in seen.items()]


def predict(profile: HardwareProfile, nproc: int, per_rank: int, context: int) -> dict[str, float]:
    """Seconds the profile predicts for each dispatcher on the measured setting (execution only:
    the benchmark plans before it times, and sends no separate metadata)."""
    cm = local_cost_model(profile, nproc)
    src, _ = plans(nproc)
    return {k: price_transfer_plan(cm, tp, samples=nproc * per_rank, producers=src.dp, world=nproc,
                                   control=False).time_s
            for k, tp in runtime_plans(nproc, per_rank, context).items()}


def _with_path(profile: HardwareProfile, **fields) -> HardwareProfile:
    return dataclasses.replace(profile, dispatch_path=dataclasses.replace(profile.dispatch_path, **fields))


# the advantage estimators `measure_host` times apart (AdvantageSpec.key -> its spec): the
# runtime's default REINFORCE++ with a per-turn baseline costs ~3x GRPO's per sample (~51 vs ~16
# us at 200 tokens on the 2-vCPU EPYC), and its return-to-go grows with the tokens
ESTIMATOR_SPECS = {spec.key: spec for spec in (
    AdvantageSpec(), AdvantageSpec(estimator="rloo"), AdvantageSpec(estimator="reinforce++"),
    AdvantageSpec(estimator="reinforce++", per_turn=True), AdvantageSpec(estimator="reinforce++", gamma=0.99),
    AdvantageSpec(estimator="reinforce++", per_turn=True, gamma=0.99))}
TURNS = 4  # turns per timed sample (its turn ids: the per-turn baseline's keys)


def with_turns(store, turns: int = TURNS):
    """`store` (`_store`'s) with what the return-based estimators read: per-token rewards (one
    at each sample's last token) and turn ids (`turns` equal turns)."""
    for item in store.values():
        n = item["input_ids"].numel()
        item["token_rewards"] = torch.zeros(n)
        item["token_rewards"][-1] = 1.0
        item["turn_ids"] = torch.arange(n) * turns // n
    return store


def fit_estimator(tokens: list[float], seconds: list[float]) -> tuple[float, float]:
    """(s per sample, s per token) through per-sample costs `seconds` at `tokens` tokens per
    sample: non-negative least squares of relative errors."""
    t, y = np.asarray(tokens, dtype=float), np.asarray(seconds, dtype=float)
    coef, _ = nnls(np.stack([np.ones_like(t), t], axis=1) / y[:, None], np.ones_like(y))
    return float(coef[0]), float(coef[1])


def measure_host(repeats: int = 15) -> dict:
    """In one process, the executor's own packing and unpacking (per piece and per byte) and
    advantage computation (per sample), fastest of `repeats`: {object_s, copy_bw_bytes_s,
    sample_s, estimator_s}: `sample_s` GRPO's median per sample (what the gloo runs'
    dispatches compute), `estimator_s` each of ESTIMATOR_SPECS' [s per sample, s per token]
    (`fit_estimator`; HardwareProfile.estimator_s), and each REINFORCE++ one's filling-in alone
    (its `priced_key(summed=True)`: the statistics came with the metadata). Quiet and exact
    where the gloo runs are noisy."""


    def fastest(fn) -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    rows, per_sample, sizes = [], [], []
    per_estimator: dict[str, list[float]] = {k: [] for k in ESTIMATOR_SPECS}
    spec = AdvantageSpec()
    for per, ctx in ((1, 512), (16, 64), (64, 64), (4, 16384), (16, 8192), (2, 65536)):
        samples, src, _ = layouts(1, per, ctx)
        store = with_turns(_store(samples, src, 0))
        tokens = {s.id: s.tokens for s in samples}
        ids = tuple(s.id for s in samples)
        names = ("input_ids", "loss_mask", "old_logprobs", "ref_logprobs")
        tr = Transfer(0, 1, ids, names, sum(tokens.values()) * 17, tuple((0, tokens[i]) for i in ids))
        buf = pack_transfer(tr, store, tokens)
        # a sent piece is packed and a received one unpacked; a local one is copied once
        t = (fastest(lambda tr=tr, st=store, tk=tokens: pack_transfer(tr, st, tk))
             + fastest(lambda tr=tr, b=buf, tk=tokens: unpack_transfer(tr, b, tk, {}, {}))) / 2
        rows.append((len(ids) * len(names), float(buf.numel()), t))
        for key, sp in ESTIMATOR_SPECS.items():
            per_estimator[key].append(fastest(lambda st=store, sm=samples, sp=sp:
                                              fill_advantages(st, sm, local_stats(st, sm, sp), sp)) / len(samples))
            if not sp.grouped:  # the batch statistics summed with the metadata: filling in only
                stats = local_stats(store, samples, sp)
                per_estimator.setdefault(sp.priced_key(summed=True), []).append(
                    fastest(lambda st=store, sm=samples, sp=sp, x=stats: fill_advantages(st, sm, x, sp)) / len(samples))
        per_sample.append(per_estimator[spec.key][-1])
        sizes.append(sum(tokens.values()) / len(samples))
    a = np.array([[r[0], r[1]] for r in rows])
    y = np.array([r[2] for r in rows])
    (obj, inv_bw), *_ = np.linalg.lstsq(a / y[:, None], np.ones(len(y)), rcond=None)  # relative error
    return {"object_s": max(float(obj), 1e-8), "copy_bw_bytes_s": 1 / max(float(inv_bw), 1e-12),
            "sample_s": float(np.median(per_sample)),
            "estimator_s": {k: fit_estimator(sizes, v) for k, v in per_estimator.items()}}


def round_terms(points: list[DispatchPoint], host_parallel: int, path) -> dict[str, float]:
    """{round_s, sync_s, reduce_s, reduce_sync_s} from the points' measured rounds and
    reductions: each the loop at the largest process count that fits the cores, and what the
    smallest count beyond them adds; a term with no such measurement keeps `path`'s."""
    out = {}
    for base, extra in (("round_s", "sync_s"), ("reduce_s", "reduce_sync_s")):
        by: dict[int, list[float]] = {}
        for p in points:
            if math.isfinite(getattr(p, base)):
                by.setdefault(p.procs, []).append(getattr(p, base))
        fit = [n for n in by if n <= host_parallel]
        over = [n for n in by if n > host_parallel]
        out[base] = statistics.median(by[max(fit)]) if fit else getattr(path, base)
        out[extra] = max(0.0, statistics.median(by[min(over)]) - out[base]) if over else getattr(path, extra)
    return out


def fit_cold(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(seconds per synchronising round, seconds per byte of the busiest rank), both >= 0, that
    best explain the executor's extra time on cold caches at `points` ((rounds, busiest bytes,
    cold - warm seconds) each). A robust fit (soft-L1 beyond 0.2 ms): a single repeat that met a
    spinning gloo loop (+2 ms, seventeenth session) is not a cold cache's cost."""
    x = np.array([(r, b) for r, b, _ in points], dtype=float)
    y = np.array([d for *_, d in points], dtype=float)
    scale = np.array([1e-3, 1e-3 / max(float(x[:, 1].max()), 1.0)])  # ms a round; ms over the largest
    res = least_squares(lambda v: (x @ (v * scale) - y) / 1e-3, [0.1, 0.1], bounds=([0.0, 0.0], [np.inf, np.inf]),
                        loss="soft_l1", f_scale=0.2)
    a, b = (float(v) for v in res.x * scale)
    return a, b


def fit_dispatch_path(profile: HardwareProfile, points: list[DispatchPoint], host: dict[str, float],
                      host_parallel: int | None = None, message_only: bool = False) -> tuple[DispatchPath, dict]:
    """The DispatchPath that best predicts `points` through `price_transfer_plan` on `profile`'s
    links, with the per-piece, per-byte and per-sample terms of `host` (measure_host) fixed and
    the bytes between processes on the profile's intra link (a loopback socket costs CPU both
    ways), the rounds' terms as the points measured them (`round_terms`): the gloo runs fit the
    per-message cost, the oversubscription stretch, the centralized controller's extra per-byte
    cost and the executor's wire bandwidth (with `message_only`, the per-message cost alone;
    the others stay `profile`'s). Returns it and its quality {fit_median_err, fit_max_err, n,
    host_parallel, round_s, sync_s, reduce_s, reduce_sync_s, points}."""

    if not points:
        raise ValueError("fit_dispatch_path needs measured points")
    hp = host_parallel or len(os.sched_getaffinity(0))
    measured_rounds = round_terms(points, hp, profile.dispatch_path)
    host = {k: v for k, v in host.items() if k != "estimator_s"}  # the profile's own field, not the path's
    base = _with_path(profile, host_parallel=hp, controller_bw_bytes_s=float("inf"), controller_object_s=0.0,
                      full_duplex=False, **host, **measured_rounds)  # gloo on one host: loopback sockets, CPU both ways
    plans_by = {(p.procs, p.per_rank, p.context, p.reductions): (
        transfer_plans if p.reductions else runtime_plans)(p.procs, p.per_rank, p.context) for p in points}
    cms = {n: local_cost_model(base, n) for n in {p.procs for p in points}}

    k = 1 if message_only else len(FITTED)
    fixed = {name: getattr(profile.dispatch_path, name) for name in FITTED[k:]}  # not fitted: the profile's
    loop_sync = measured_rounds["sync_s"]
    # the oversubscribed round is fitted too where points ran beyond the cores and the loop measured it
    sync = not message_only and loop_sync > 0 and any(p.procs > hp and math.isfinite(p.round_s) for p in points)
    names = FITTED[:k] + (("sync_s",) if sync else ())

    def fields(x) -> dict:
        return {**fixed, **dict(zip(names, np.exp(x).tolist(), strict=True))}

    def predicted(x) -> list[float]:
        prof = _with_path(base, **fields(x))
        out = []
        for p in points:
            tp = plans_by[(p.procs, p.per_rank, p.context, p.reductions)][p.kind]
            out.append(price_transfer_plan(cms[p.procs].with_profile(prof), tp, samples=p.procs * p.per_rank,
                                           producers=p.procs, world=p.procs, control=False).time_s
                       + p.start_rounds * prof.dispatch_path.round_cost_s(p.procs))
        return out

    y = np.array([p.seconds for p in points])
    link_bw = profile.intra.bw_bytes_s
    x0 = np.log([50e-6, 0.3, 10 * link_bw, link_bw][:k] + ([loop_sync * 0.5] if sync else []))
    lo = np.log([1e-7, 1e-4, link_bw / 100, link_bw / 100][:k] + ([loop_sync * OVERSUBSCRIBED_ROUND] if sync else []))
    hi = np.log([1e-2, 2.0, 1e13, 100 * link_bw][:k] + ([loop_sync] if sync else []))
    res = least_squares(lambda x: np.log(np.array(predicted(x)) / y), x0, bounds=(lo, hi), x_scale="jac")
    pred = predicted(res.x)
    # cold caches: the extra time per synchronising round of the executor and per byte its
    # busiest rank moves (`fit_cold`)
    plans = [plans_by[(p.procs, p.per_rank, p.context, p.reductions)][p.kind] for p in points]
    rounds = [sync_rounds(tp) + p.start_rounds for tp, p in zip(plans, points, strict=True)]
    moved = [price_transfer_plan(cms[p.procs].with_profile(base), tp, samples=p.procs * p.per_rank, producers=p.procs,
                                 world=p.procs, control=False).extras["busiest_rank_bytes"]
             for tp, p in zip(plans, points, strict=True)]
    cold = [(r, b, p.cold_seconds - p.seconds) for r, b, p in zip(rounds, moved, points, strict=True)
            if math.isfinite(p.cold_seconds)]
    cold_round_s, cold_byte_s = fit_cold(cold) if cold else (profile.dispatch_path.cold_round_s,
                                                             profile.dispatch_path.cold_byte_s)
    # the runtime's rounds, whose ranks arrive from other work, cost what the barrier loop measured
    # beyond the cores (DispatchPath.wake_sync_s); the executor's back-to-back points fit sync_s
    path = dataclasses.replace(base.dispatch_path, **fields(res.x), cold_round_s=cold_round_s, cold_byte_s=cold_byte_s,
                               wake_sync_s=loop_sync if sync else profile.dispatch_path.wake_sync_s,
                               host_share=round(statistics.median(p.share for p in points), 4))
    errs = [abs(a / b - 1) for a, b in zip(pred, y, strict=True)]
    quality = {"fit_median_err": round(float(np.median(errs)), 4), "fit_max_err": round(float(max(errs)), 4),
               "n": len(points), "host_parallel": hp, "cold_round_s": cold_round_s, "cold_byte_s": cold_byte_s,
               "round_s": path.round_s, "sync_s": path.sync_s, "sync_s_loop": loop_sync,
               "reduce_s": path.reduce_s, "reduce_sync_s": path.reduce_sync_s,
               "reductions": max(p.reductions for p in points),
               "start_rounds": max(p.start_rounds for p in points),
               "points": [{"label": f"{p.kind} n={p.procs} {p.per_rank}x{p.context}", "measured_s": p.seconds,
                           "predicted_s": q, "cold_measured_s": p.cold_seconds,
                           "cold_predicted_s": q + r * cold_round_s + b * cold_byte_s}
                          for p, q, r, b in zip(points, pred, rounds, moved, strict=True)]}
    return path, quality


def calibrate_dispatch(profile: HardwareProfile, budget_s: float = 60.0) -> HardwareProfile:
    """Measure and fit; `profile` with the fitted dispatch path and its fit quality. The full
    set (2 and 4 processes, six cases, three trials of 9; about 30 s on 2 cores, most of it
    starting the spawned ranks) measures both rounds' terms and fits the four others. A budget
    under QUICK_BUDGET_S measures 2 processes on three cases once: that exercises the path, but
    2 processes on 2 cores never oversubscribe, so sync_s and the fitted terms but the
    per-message cost keep `profile`'s values."""
    quick = budget_s < QUICK_BUDGET_S
    pts = measure((2,), CASES[:3], repeats=3, trials=1) if quick else measure((2, 4), CASES, repeats=9, trials=3)
    host = measure_host()
    path, quality = fit_dispatch_path(profile, pts, host, message_only=quick)
    quality["probe_s"] = {str(n): median_probe(p.probe_s for p in pts if p.procs == n)
                          for n in sorted({p.procs for p in pts})}
    return dataclasses.replace(profile, dispatch_path=path, estimator_s=host["estimator_s"],
                               fit_quality={**profile.fit_quality, "dispatch_path": quality})


if __name__ == "__main__":

    prof = load_profile("cpu-measured")
    pts = measure()
    path, q = fit_dispatch_path(prof, pts, measure_host())
    print(path)
    for p in q["points"]:
        print(f"  {p['label']:<36} measured {p['measured_s'] * 1e3:7.2f} ms  "
              f"predicted {p['predicted_s'] * 1e3:7.2f} ms")
    print(f"median error {q['fit_median_err']:.0%}, max {q['fit_max_err']:.0%} (host_parallel {q['host_parallel']}, "
          f"{math.nan if not pts else len(pts)} points)")
