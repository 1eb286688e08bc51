"""Fit the host costs of the multi-process runtime's FSDP2 path (calibration phase "fsdp"):
`HardwareProfile.fsdp_unit_s`, `fsdp_tensor_s`, `reshard_fixed_s`, `reshard_tensor_s`,
`reshard_byte_s`, `reshard_shard_byte_s`, the
weight sync's busy share `reshard_busy`, its wake-up term `reshard_wake_s`, and a training
step's start before its first collective (`train_lead_s`, `train_lead_tensor_s`).

On a CPU host most of an FSDP2 step's time is not the bytes the cost model prices but FSDP2's
per-unit hooks, DTensor host work, collectives waiting in lockstep, and the weight sync's
per-tensor copies. This phase runs the runtime's own code on spawned gloo ranks (the tiny model,
plan tp1-dpN-zero) and fits what the cost model leaves unexplained as constants times counted
quantities. The points, the fit and the host stretch: docs/calibration.md, "Design notes".

    OMP_NUM_THREADS=1 python -m earl.calibrate.fsdpfit      # measure at 2 and 4 ranks, fit, print
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from scipy.optimize import nnls
from transformers import AutoModelForCausalLM

from earl.calibrate.host import local_cost_model
from earl.calibrate.hostload import CpuShare, cores, overlap_factor, sync_stretch
from earl.cost_model.compute import param_tensors
from earl.cost_model.model import fsdp_sync_counts, pack_micro_batches
from earl.cost_model.profile import HardwareProfile, load_profile
from earl.parallel import build_plan_groups
from earl.policies.reshard import plan_reshard
from earl.runtime.dist import run_local
from earl.runtime.gc_steps import StepGC
from earl.runtime.hf_model import Policy, empty_like_policy, hf_config_from_spec
from earl.runtime.hostprobe import HostProbe, median_probe
from earl.runtime.move_weights import execute_reshard
from earl.runtime.optim import FSDPAdamW
from earl.runtime.parallelize import parallelize
from earl.runtime.rollout import Trajectory
from earl.runtime.run_config import TrainerConfig
from earl.runtime.tokenizer import CharTokenizer
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import Trainer, collate, train_step
from earl.specs import MODEL_CATALOG, ParallelPlan

MODEL = "tiny"  # the runtime's default model, the one `earl validate --nproc N` runs
# (layers, sequences, longest tokens, token budget) of the measured training steps: the tiny
# model at one micro-batch per rank, two, and four (the budget holds two sequences), and twice
# as deep, so the per-unit and per-tensor counts vary apart
TRAIN_CASES: tuple[tuple[int, int, int, int], ...] = ((2, 16, 96, 16384), (2, 16, 96, 384), (2, 16, 96, 192),
                                                      (4, 16, 96, 16384))
# a small budget: the tiny model at 1 and 4 micro-batches per rank, 2 ranks, 2 repeats
QUICK_CASES = (TRAIN_CASES[0], TRAIN_CASES[2])
# the profile fields each kind of point fits
FIELDS = {"train": ("fsdp_unit_s", "fsdp_tensor_s"),
          "sync": ("reshard_fixed_s", "reshard_tensor_s", "reshard_byte_s", "reshard_shard_byte_s"),
          "lead": ("train_lead_s", "train_lead_tensor_s")}
FITTED = tuple(f for names in FIELDS.values() for f in names)
# the weight sync is also timed on a wider model (sync only): the same 26 tensors at ~32x the
# tiny model's bytes, so the per-tensor and per-byte terms separate. On the tiny model alone the
# per-tensor constant took the bytes' cost too, and a 27M-parameter model's sync (108 MB of
# fp32 shards gathered) ran 1.4-1.8x its price at 2 ranks (2026-12-04, eighteenth session). Its
# shapes are neither the tiny model's nor a catalog model's, so `earl validate --model
# qwen2-27m --nproc N` stays held out.
WIDE = {"hidden_size": 256, "head_dim": 64, "ffn_hidden": 704, "vocab_size": 4096}
PROCS = (2, 4)  # ranks measured (the process counts `earl validate` checks)
# a training step's start to its first collective (`timed_step`) is also timed on the tiny
# model this deep (98 parameter tensors, as many as the held-out qwen2-27m's; the cases' 26 and
# 50 alone put the per-tensor term's slope on a 0.1 ms difference), LEAD_REPEATS times, where
# the ranks have a core each. 2 ranks on a 2-vCPU AMD EPYC VM, 2026-12-07: 0.36-0.42 ms at 26
# tensors, 0.74-1.07 at 98 (tiny widths) and 0.90-1.13 (qwen2-27m), medians of 20
LEAD_CASE = (8, 16, 96, 16384)
LEAD_REPEATS = 12
# The runtime's ranks reach the weight sync one after another (their training steps end apart:
# the tiny model's 4 ranks 8-14 ms first to last, the second-last ~4 ms before the last, in the
# traces of 2026-12-06), and its early ranks sleep in the first all-gather until the last one
# sends. The phase times the sync so too, rank r arriving r x STAGGER_S after rank 0 (a busy
# loop before it, as a training step is), and reads it as `earl validate` does: from the last
# arrival to the first rank's end. What that window holds beyond the sync's price (with the
# stretch validate gives it, `sync_stretch`) where the ranks outnumber the cores is
# `reshard_wake_s` (4 gloo ranks on 2 cores, a throwaway run of 30 repeats: the gather took
# ~0.9 ms after the last rank's packing vs ~0.4 at 2 ranks; docs/validate-history.md, thirty-third session)
STAGGER_S = 0.004
# the staggered syncs' repeats: their windows spread widely (4 ranks on 2 cores, 2026-12-06:
# 2.1-7.8 ms in one run of 40 for a median of 3.3-3.8), so more of them than SYNC_REPEATS
WAKE_REPEATS = 40
REPEATS = 6  # timed repeats per case after one warm-up
# the weight sync's repeats (a few tens of ms each): its lockstep rounds move most from call to
# call, and their median is what `reshard_tensor_s` is fitted to
SYNC_REPEATS = 15
START_METHOD = "spawn"  # fresh ranks: the calibrating process may hold CUDA or many threads
# phase budget (s) below which only the quick set runs; the full set takes about 35 s on 2 cores
# whatever the budget (most of it spawning ranks), the quick one about 12 s
QUICK_BUDGET_S = 4.0


@dataclass(frozen=True, kw_only=True)
class FsdpPoint:
    """One measured training step or weight sync."""

    # "train" | "sync" | "wake" (a sync whose ranks arrive STAGGER_S apart) | "lead" (a training
    # step's start to its first collective, `timed_step`)
    kind: str
    procs: int  # gloo ranks
    layers: int  # model depth (the tiny model's shapes otherwise)
    wide: bool = False  # the WIDE shapes (a weight sync only)
    label: str  # e.g. "16x96 budget 192"
    # wall time, median over repeats: the slowest rank's (train), the fastest's (sync), the
    # ranks' median (lead), s
    measured_s: float
    # profile field -> its counted quantity: FSDP units x micro-batches of the busiest rank and
    # parameter tensors (train), parameter tensors gathered and their fp32 bytes (sync)
    counts: dict[str, int]
    priced_s: float = 0.0  # the cost model's price without the fitted term, s (filled by `price`)
    # the share of a core each rank got over its run (earl.calibrate.hostload); None: the idle
    # host's, min(1, host_parallel / procs)
    share: float | None = None
    stretch: float = 1.0  # the profile's host_share / share: its wall time over the profile's (filled by `price`)
    probe_s: float | None = None  # its ranks' median host-probe reading (earl/runtime/hostprobe.py)
    # a sync's CPU seconds over wall seconds, its ranks' median over the repeats (None: not measured)
    busy: float | None = None
    # a "wake" point's ranks: how long before the last one each arrived, median over repeats, s
    leads: tuple[float, ...] = ()

    def residual_s(self) -> float:
        """Per-device seconds the priced terms leave unexplained."""
        return self.measured_s / self.stretch - self.priced_s

    def predicted_s(self, fields: dict[str, float]) -> float:
        """Wall seconds priced with the fitted constants `fields`."""
        return (self.priced_s + sum(fields[f] * c for f, c in self.counts.items())) * self.stretch


def lengths(seqs: int, longest: int) -> list[int]:
    """Sequence lengths of a measured batch: longest - 8 * (i % 4), as a GRPO batch of uneven episodes."""
    return [max(16, longest - 8 * (i % 4)) for i in range(seqs)]


def rank_share(seqs: int, procs: int, rank: int) -> list[int]:
    """Sample ids a rank trains on (round-robin: the shares differ by at most one sequence)."""
    return [i for i in range(seqs) if i % procs == rank]


def _batch(seqs: int, longest: int, vocab: int):


    gen = torch.Generator().manual_seed(0)
    trajs = [Trajectory(episode_id=i, group_id=i // 4,
                        token_ids=torch.randint(3, vocab, (n,), generator=gen).tolist(),
                        loss_mask=[0] * 8 + [1] * (n - 8), logprobs=[0.0] * n, reward=float(i % 3))
             for i, n in enumerate(lengths(seqs, longest))]
    b = collate(trajs, 0)
    lp = -torch.rand(b.input_ids.shape, generator=gen)
    adv = torch.randn(b.input_ids.shape, generator=gen)
    return dataclasses.replace(b, old_logprobs=lp, ref_logprobs=lp, advantages=adv)


def spec_of(layers: int, wide: bool = False):
    """The measured model: the tiny model's shapes (with `wide`, WIDE's) at `layers` layers."""
    return dataclasses.replace(MODEL_CATALOG[MODEL], num_layers=layers, **(WIDE if wide else {}))


def sync_counts(spec, procs: int) -> dict[str, float]:
    """A weight sync's counted quantities on `procs` ranks: the sync itself, the parameter
    tensors a rank gathers, their bytes (its tp shard, gathered whole) and those of its own
    shard (over the ranks: earl.cost_model.model.CostModel.reshard)."""
    tensors, whole, own = fsdp_sync_counts(spec, dp=procs)
    return {"reshard_fixed_s": 1, "reshard_tensor_s": tensors, "reshard_byte_s": whole, "reshard_shard_byte_s": own}


def depths(cases) -> list[int]:
    return sorted({c[0] for c in cases})


def worker(cases, repeats: int, sync_repeats: int) -> dict:
    """One rank (under earl.runtime.dist.run_local): per model depth, the runtime's FSDP2
    training step on each case, then its weight sync to a rollout copy; seconds per repeat
    (the first one a warm-up). The garbage collector runs as in the runtime's steps: by hand,
    between the timed calls (earl.runtime.gc_steps)."""


    torch.set_num_threads(1)
    world = dist.get_world_size()
    plan, roll_plan = ParallelPlan(dp=world, sharded_optimizer=True), ParallelPlan(dp=world)
    groups = build_plan_groups(plan)
    base = TrainerConfig(algo="grpo", lr=1e-5)
    out: dict = {"train": {}, "lead": {}, "sync": {}, "wake": {}, "probe": []}
    probe = HostProbe()  # the host's speed through the timed repeats (HardwareProfile.host_probe_fsdp_s)
    with StepGC(every=1) as step_gc:
        for layers in depths(cases):
            spec = spec_of(layers)
            model, shapes, roll, optim = _fsdp_model(spec, plan, groups, base)
            for case in (c for c in cases if c[0] == layers):
                out["train"][case], out["lead"][case] = _case_steps(model, optim, case, spec.vocab_size, groups,
                                                                    base, repeats, step_gc, probe, out["probe"])
            out["sync"][(layers, False)] = _sync_times(optim, shapes, roll, plan, roll_plan, sync_repeats,
                                                       step_gc, probe, out["probe"])
            out["wake"][(layers, False)] = _staggered_syncs(optim, shapes, roll, plan, roll_plan,
                                                            wake_repeats(sync_repeats), step_gc)
        if world <= cores() and LEAD_CASE[0] not in depths(cases):  # one more model on every rank
            lead_spec = spec_of(LEAD_CASE[0])
            model, _, _, optim = _fsdp_model(lead_spec, plan, groups, base)
            out["lead"][LEAD_CASE] = _case_steps(model, optim, LEAD_CASE, lead_spec.vocab_size, groups, base,
                                                 LEAD_REPEATS, step_gc)[1]
        spec = spec_of(min(depths(cases)), wide=True)
        _, shapes, roll, optim = _fsdp_model(spec, plan, groups, base)
        out["sync"][(spec.num_layers, True)] = _sync_times(optim, shapes, roll, plan, roll_plan, sync_repeats,
                                                           step_gc, probe, out["probe"])
        out["wake"][(spec.num_layers, True)] = _staggered_syncs(optim, shapes, roll, plan, roll_plan,
                                                                wake_repeats(sync_repeats), step_gc)
    return out


def _case_steps(model, optim, case, vocab: int, groups, base, repeats: int, step_gc, probe=None, probes=None
                ) -> tuple[list[float], list[float]]:
    """(wall seconds, seconds to the first collective) of the runtime's training step on `case`
    (layers, sequences, longest, token budget) with `model` (of `vocab` tokens) and `optim`, `repeats` + 1 times
    (the first a warm-up), each after a barrier (and a host-probe reading into `probes` where
    `probe` is given). The garbage collector runs by hand between them (`step_gc`)."""
    _, seqs, longest, budget = case
    world, rank = dist.get_world_size(), dist.get_rank()
    trainer = Trainer(model, dataclasses.replace(base, token_budget=budget), temperature=1.0,
                      lockstep=groups.dp_group)
    local = _batch(seqs, longest, vocab).select(rank_share(seqs, world, rank))
    times, leads = [], []
    for i in range(repeats + 1):
        step_gc.step_done(i)
        if probe is not None:
            probes.append(probe.time())
        dist.barrier()
        wall, lead = timed_step(trainer, optim, local)
        times.append(wall)
        leads.append(lead)
    return times, leads


def timed_step(trainer, optim, local) -> tuple[float, float]:
    """(wall seconds, seconds to its first collective) of one run of the runtime's training step
    (earl.runtime.trainer.train_step) on this rank. The first collective is the dp all-reduce
    of the token counts (`optim.dp_sum`), wrapped on this instance for the call to note when it
    is entered; what comes before it (learning rate, mini-batch order, `zero_grad`) is what the
    ranks that leave a runtime dispatch first do on the cores the last one still needs
    (`HardwareProfile.train_lead_s`, `CostModel.train_lead_s`)."""
    entered: list[float] = []
    inner = optim.dp_sum

    def dp_sum(values):
        if not entered:
            entered.append(time.perf_counter())
        return inner(values)

    optim.dp_sum = dp_sum
    try:
        t0 = time.perf_counter()
        train_step(trainer, optim, local)
        t1 = time.perf_counter()
    finally:
        del optim.dp_sum  # the class's method again
    return t1 - t0, (entered[0] if entered else t1) - t0


def _fsdp_model(spec, plan, groups, base):
    """(FSDP2 model, full parameter shapes, an fp32 rollout copy, its optimizer) of `spec`,
    random weights seeded alike on every rank, as the runtime builds them for `plan`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = Policy(model=AutoModelForCausalLM.from_config(hf_config_from_spec(spec, "fp32")),
                        tokenizer=CharTokenizer(), spec=spec, source=MODEL)
    shapes = param_shapes(policy.model)
    roll = empty_like_policy(policy, torch.float32).eval()
    model = parallelize(policy.model, plan, shapes, device_type="cpu")
    return model, shapes, roll, FSDPAdamW(model, shapes, groups, base, torch.float32)


def _sync_times(optim, shapes, roll, plan, roll_plan, repeats: int, step_gc, probe, probes: list
                ) -> list[tuple[float, float]]:
    """The runtime's weight sync (FSDP2 shards -> the rollout copy `roll`), `repeats` + 1
    times (the first a warm-up), each after a host-probe reading and a barrier: (wall seconds,
    this process's CPU seconds, gloo's threads included) each."""
    rplan = plan_reshard(shapes, plan, roll_plan, dist.get_world_size())
    dst = {n: p.data for n, p in roll.named_parameters()}
    times = []
    for i in range(repeats + 1):
        step_gc.step_done(i)
        probes.append(probe.time())
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        execute_reshard(rplan, shapes, optim.weights(), dst)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def _staggered_syncs(optim, shapes, roll, plan, roll_plan, repeats: int, step_gc) -> list[tuple[float, float]]:
    """The runtime's weight sync reached as the runtime's ranks reach it: after a barrier, rank r
    computes (a busy loop) for r x STAGGER_S, then syncs; `repeats` + 1 times (the first a
    warm-up). (start, end) perf_counter seconds each (a monotonic clock all local ranks share)."""
    rplan = plan_reshard(shapes, plan, roll_plan, dist.get_world_size())
    dst = {n: p.data for n, p in roll.named_parameters()}
    out = []
    for i in range(repeats + 1):
        step_gc.step_done(i)
        dist.barrier()
        arrive = time.perf_counter() + dist.get_rank() * STAGGER_S
        while time.perf_counter() < arrive:
            pass
        t0 = time.perf_counter()
        execute_reshard(rplan, shapes, optim.weights(), dst)
        out.append((t0, time.perf_counter()))
    return out


def wake_repeats(sync_repeats: int) -> int:
    """The staggered syncs' repeats: WAKE_REPEATS at the full set's SYNC_REPEATS, as few as the
    barrier-started syncs' for a quick set."""
    return WAKE_REPEATS if sync_repeats >= SYNC_REPEATS else sync_repeats


def staggered_window(runs: list[list[tuple[float, float]]]) -> tuple[float, tuple[float, ...]]:
    """(the window from the last rank's start to the first rank's end, as `earl validate` reads a
    step's sync (validate.measured_stages): the median of the faster half of the repeats, the
    warm-up skipped; each rank's median lead on the last arrival, ascending) of per-rank (start,
    end) series. The faster half: where ranks outnumber the cores the windows fall in two modes,
    the first rank to finish keeping its core or waiting out a time slice (+2-3 ms; 4 gloo ranks
    on 2 cores, 2026-12-06: 40-60% of repeats, from run to run, against ~35% of the runtime's
    steps), and a median of all sits between them, moving by 1 ms from run to run; the fast
    mode's median is stable (2.2-2.4 ms in three runs of 40) and is what the term prices."""
    windows, leads = [], []
    for i in range(1, len(runs[0])):
        starts, ends = [r[i][0] for r in runs], [r[i][1] for r in runs]
        windows.append(min(ends) - max(starts))
        leads.append(sorted(max(starts) - t for t in starts))
    fast = sorted(windows)[:max(1, len(windows) // 2)]
    return statistics.median(fast), tuple(statistics.median(col) for col in zip(*leads, strict=True))


def label(case) -> str:
    layers, seqs, longest, budget = case
    return f"{layers}L {seqs}x{longest} budget {budget}"


def measure(procs=PROCS, cases=TRAIN_CASES, repeats: int = REPEATS, sync_repeats: int = SYNC_REPEATS
            ) -> list[FsdpPoint]:
    """Spawn `procs` local gloo ranks (each count in turn) and measure every case and the sync."""

    points = []
    for n in procs:
        with CpuShare(procs=n) as load:
            res = run_local(worker, n, list(cases), repeats, sync_repeats, timeout_s=600, start_method=START_METHOD)

        probe_s = median_probe(x for r in res for x in r.get("probe", []))

        for case in cases:
            layers, seqs, longest, budget = case
            units = layers + 1  # one FSDP unit per layer + the root (earl.runtime.parallelize)
            mbs = max(len(pack_micro_batches([lengths(seqs, longest)[i] for i in rank_share(seqs, n, r)], budget))
                      for r in range(n))
            points.append(FsdpPoint(kind="train", procs=n, layers=layers, label=label(case), share=load.share(),
                                    probe_s=probe_s,
                                    measured_s=per_repeat([r["train"][case] for r in res], max),
                                    counts={"fsdp_unit_s": units * mbs,
                                            "fsdp_tensor_s": param_tensors(spec_of(layers))}))
        # every rank's own start (no rank waits for another before it): the ranks' median
        for case in res[0]["lead"]:
            points.append(FsdpPoint(kind="lead", procs=n, layers=case[0], label=f"{label(case)} start",
                                    share=load.share(), probe_s=probe_s,
                                    measured_s=statistics.median(x for r in res for x in r["lead"][case][1:]),
                                    counts={"train_lead_s": 1, "train_lead_tensor_s": param_tensors(spec_of(case[0]))}))
        for key in res[0]["sync"]:
            layers, wide = key
            runs = [r["sync"][key] for r in res]  # per rank: (wall, CPU) per repeat
            points.append(FsdpPoint(kind="sync", procs=n, layers=layers, wide=wide,
                                    label=f"weight sync {layers} layers{' wide' if wide else ''}",
                                    share=load.share(), probe_s=probe_s, counts=sync_counts(spec_of(layers, wide), n),
                                    measured_s=per_repeat([[t for t, _ in run] for run in runs], min),
                                    busy=statistics.median(c / t for run in runs for t, c in run[1:])))
        for key in res[0].get("wake", {}):
            layers, wide = key
            window, leads = staggered_window([r["wake"][key] for r in res])
            points.append(FsdpPoint(kind="wake", procs=n, layers=layers, wide=wide,
                                    label=f"weight sync {layers} layers{' wide' if wide else ''} staggered",
                                    share=load.share(), probe_s=probe_s, counts=sync_counts(spec_of(layers, wide), n),
                                    measured_s=window, leads=leads))
    return points


def per_repeat(series: list[list[float]], pick=max) -> float:
    """The median over repeats (the warm-up skipped) of `pick` (max or min) over the ranks'
    seconds. `earl validate` reads a training step as its slowest rank and the weight sync, a
    collective move, as its fastest from a common start: from the last rank's arrival to the
    first rank's end (earl.calibrate.validate.measured_stages); here every rank starts at a
    barrier, so the fastest rank's span is that window."""
    return statistics.median(pick(s[i] for s in series) for i in range(1, len(series[0])))


def price(profile: HardwareProfile, point: FsdpPoint, host_parallel: int, cases=TRAIN_CASES) -> FsdpPoint:
    """`point` with what `profile` prices for it (its FSDP host terms zeroed) and its stretch:
    the profile's host_share over the share its ranks got (measured, else theirs on an idle host
    of `host_parallel` CPUs), which at no other load is procs / host_parallel when above 1."""
    if point.kind == "lead":  # host work of one rank's own: nothing priced without the fitted terms
        return dataclasses.replace(point, priced_s=0.0, stretch=1.0)
    prof = dataclasses.replace(profile, **dict.fromkeys(FITTED, 0.0))
    cm = local_cost_model(prof, point.procs, spec_of(point.layers, point.wide))
    plan = ParallelPlan(dp=point.procs, sharded_optimizer=True)
    if point.kind in ("sync", "wake"):
        priced = cm.reshard(plan, ParallelPlan(dp=point.procs), fsdp=True).time_s
    else:
        _, seqs, longest, budget = next(c for c in cases if label(c) == point.label)
        ls = lengths(seqs, longest)
        groups = [sorted(ls[i] for i in rank_share(seqs, point.procs, r)) for r in range(point.procs)]
        head = sum(n - 8 for n in ls) / sum(ls)  # loss positions get logits (the chunked head)
        priced = cm.mixed_batch("train", plan, ls, padded=True, token_budget=budget, groups=groups, fsdp=True,
                                head_frac=head).time_s
    share = point.share if point.share is not None else min(1.0, host_parallel / point.procs)
    if point.kind == "wake":
        # as `earl validate` stretches a runtime step's sync: over the ranks still computing it
        # when the last arrives (its leads), the sync priced with `profile`'s fitted terms
        work = priced + sum(getattr(profile, f) * c for f, c in point.counts.items())
        return dataclasses.replace(point, priced_s=priced,
                                   stretch=sync_stretch(profile, point.procs, "cpu", share, list(point.leads), work))
    # the sync's ranks wait on one another: beyond the cores they fill each other's waits
    over = overlap_factor(profile.reshard_busy, point.procs, host_parallel) if point.kind == "sync" else 1.0
    return dataclasses.replace(point, priced_s=priced, stretch=max(profile.host_share / share * over, 1e-3))


def fit_constants(points: list[FsdpPoint], fields: tuple[str, ...]) -> dict[str, float]:
    """Non-negative least squares of residual = sum of constant x count over `fields`, each
    point weighted by 1 / its per-device measured seconds: relative errors, so the points at 4
    ranks (twice as long on 2 cores) do not outweigh those at 2."""
    if not points:
        return dict.fromkeys(fields, 0.0)

    w = np.array([p.stretch / max(p.measured_s, 1e-9) for p in points])
    x, _ = nnls(np.array([[p.counts[f] for f in fields] for p in points], dtype=float) * w[:, None],
                np.array([p.residual_s() for p in points], dtype=float) * w)
    return {f: float(v) for f, v in zip(fields, x, strict=True)}


def fit_fsdp_costs(profile: HardwareProfile, points: list[FsdpPoint],
                   host_parallel: int | None = None) -> tuple[dict[str, float], dict]:
    """({FITTED field: seconds}, quality) from measured points priced on `profile`."""
    hp = host_parallel or len(os.sched_getaffinity(0))
    # the sync's busy share where its ranks have a core each (`hostload.overlap_factor`)
    busy = [p.busy for p in points if p.kind == "sync" and p.procs <= hp and p.busy is not None]
    fields: dict[str, float] = {"reshard_busy": round(min(1.0, statistics.median(busy)), 4)} if busy else {}
    # a step's start is timed where every rank has a core of its own (beyond the cores its
    # ranks start at once after a barrier and share them, which the runtime's leavers do not)
    priced = [price(dataclasses.replace(profile, **fields), p, hp) for p in points
              if p.kind != "wake" and (p.kind != "lead" or p.procs <= hp)]
    for kind, names in FIELDS.items():
        fields.update(fit_constants([p for p in priced if p.kind == kind], names))
    # the staggered syncs, priced with the terms just fitted: what their window holds beyond that
    # where the ranks outnumber the cores is the first round's wake-ups (`reshard_wake_s`)
    staggered = [price(dataclasses.replace(profile, **fields), p, hp) for p in points if p.kind == "wake"]
    wake = [p.measured_s - p.predicted_s(fields) for p in staggered if p.procs > hp]
    fields["reshard_wake_s"] = max(0.0, statistics.median(wake)) if wake else 0.0
    rows, errs = [], []
    for p in priced + staggered:
        predicted = p.predicted_s(fields) + (fields["reshard_wake_s"] if p.kind == "wake" and p.procs > hp else 0.0)
        errs.append(abs(predicted - p.measured_s) / p.measured_s)
        rows.append({"kind": p.kind, "procs": p.procs, "label": p.label, "counts": p.counts, "share": p.share,
                     "stretch": p.stretch,
                     "measured_s": p.measured_s, "priced_without_s": p.priced_s * p.stretch,
                     "predicted_s": predicted})
    quality = {**fields, "fit_median_err": round(statistics.median(errs), 4) if errs else None,
               "fit_max_err": round(max(errs), 4) if errs else None,
               "host_parallel": hp,
               "load_avg_1m": os.getloadavg()[0], "points": rows}
    return fields, quality


def calibrate_fsdp(profile: HardwareProfile, budget_s: float = 30.0) -> HardwareProfile:
    """Measure (every case at 2 and 4 ranks when the budget allows, else QUICK_CASES at 2) and
    return `profile` with the FITTED constants and their fit quality (`fit_quality["fsdp"]`)."""
    full = budget_s >= QUICK_BUDGET_S
    points = measure(procs=PROCS if full else PROCS[:1], cases=TRAIN_CASES if full else QUICK_CASES,
                     repeats=REPEATS if full else 2, sync_repeats=SYNC_REPEATS if full else 2)
    fields, quality = fit_fsdp_costs(profile, points)
    quality["probe_s"] = {str(n): median_probe(p.probe_s for p in points if p.procs == n)
                          for n in sorted({p.procs for p in points})}
    return dataclasses.replace(profile, **fields, fit_quality={**profile.fit_quality, "fsdp": quality})


if __name__ == "__main__":

    prof = load_profile("cpu-measured")
    fields, q = fit_fsdp_costs(prof, measure())
    for r in q["points"]:
        print(f"{r['kind']:5s} n={r['procs']} {r['label']:25s} {r['counts']}: measured "
              f"{r['measured_s'] * 1e3:7.2f} ms, priced without {r['priced_without_s'] * 1e3:7.2f} ms, "
              f"fitted {r['predicted_s'] * 1e3:7.2f} ms")
    print(", ".join(f"{k} {v:.3g}" if k == "reshard_busy" else f"{k} {v * 1e6:.4g} us"
                    for k, v in fields.items()) + "; "
          f"median error {q['fit_median_err']:.0%}, max {q['fit_max_err']:.0%}, load {q['load_avg_1m']:.2f}")
