"""`earl validate`: run the runtime for a few steps, simulate the same config on its recorded
workload trace with a calibrated profile (and with the datasheet profile, for contrast), and
report predicted vs. measured time per stage, peak memory, and whether the simulator ranks
several config variants in the measured order (Kendall tau).

It is how the simulator earns trust: one run, one replay, a per-stage error. The runtime is the
single-process one or, with `--nproc 2|4`, the multi-process one under torchrun; the simulator
prices the same job on N devices of one node, from the runtime's own plans. How stage times are
measured and scored (slowest rank, last arrival, CPU share, the N / host_parallel stretch):
docs/calibration.md, "Design notes".

    earl validate --steps 4 --hardware earl/cost_model/profiles/cpu-measured.json --out /tmp/val
    earl validate --nproc 2 --steps 4 --set env.name=calculator --out /tmp/v2
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from rich.table import Table
from scipy.stats import kendalltau

from earl.calibrate.host import current_stamp, local_cluster, random_checkpoint, sim_engine, sim_kv_round
from earl.calibrate.hostload import (
    CpuShare,
    host_stretch,
    share_of,
    shared_makespan,
    sync_stretch,
)
from earl.config_machinery import parse_sets
from earl.cost_model import CostModel
from earl.cost_model.profile import HardwareProfile, check_stamp, datasheet_profile, load_profile
from earl.outputs import check_out_dir
from earl.runtime.advantages import AdvantageSpec
from earl.runtime.hf_model import BUILTIN_MODELS
from earl.runtime.hostprobe import STEP_ITERS as PROBE_ITERS
from earl.runtime.launch import launch
from earl.runtime.metrics import read_metrics
from earl.runtime.resolve import initial_plans, resolve_config
from earl.runtime.resources import check_resources
from earl.runtime.run import run_training
from earl.runtime.run_config import apply_overrides, from_dict
from earl.runtime.trainer import Trainer
from earl.sim.scenario import Scenario
from earl.sim.simulation import Simulation
from earl.sim.workload import WorkloadSpec, load_trace
from earl.specs import HARDWARE_CATALOG, MODEL_CATALOG, STEP_PHASES, ModelSpec, ParallelPlan, Stage
from earl.trace import atomic_write_text, read_chrome_trace

STAGES = STEP_PHASES  # the runtime's span stages, the rows of every table
# stages whose ranks wait for one another at their start (collective moves): each rank's span
# holds its wait for the slowest peer's previous stage, which the simulator already charges
# there (its stages last as long as their slowest group); the move itself starts when the last
# rank arrives (each is read from then, `measured_stages`)
COLLECTIVE_MOVES = ("dispatch", "reshard")
# ... of which those the dispatch path prices (earl.cost_model.dispatch: the executor from its
# last rank's start to its last rank's end, as `earl calibrate` times it since 2026-12-06,
# earl.calibrate.dispatchfit._timed_span; the slowest rank from a common start before) are read
# so: from the last rank's arrival to the last rank's end (`measured_stages`). The
# shortest span is the last arrival's own end, which at 4 ranks on 2 cores came ~2 ms (median)
# before the last end (2026-12-05 passes, docs/validate-history.md, twenty-third session)
DISPATCH_MOVES = ("dispatch",)
# ... and the weight sync, which `earl calibrate` times as its fastest rank after a barrier
# (earl.calibrate.fsdpfit._sync_times), is read so: from the last rank's arrival (the common
# start) to the first rank's end. After that end the rank that left starts its rollout, which
# takes cores from the ranks still unpacking: a stretch the next stage's work causes. The
# shortest span, the last arrival's own end, held it in most 4-rank steps of the 2026-12-05
# passes (docs/validate-history.md, twenty-fourth session)
SYNC_MOVES = ("reshard",)
# spans of other stages that are such moves where their `waits` arg says so: the rollout ->
# experience hand-off is a dispatch (earl.runtime.step.prepare_experience: `execute_dispatch`),
# which waits for its peers where a phase sends between ranks; onto the layout aligned with the
# rollout's it copies locally and, like the log-prob span after it, is the rank's own work
COLLECTIVE_SPANS = ("handoff",)
# spans with no wait for a peer in them (at tp 1): their CPU share (the runtime's per-span
# `cpu_s` over wall seconds) is the core a rank got while it computed, which the step's share
# (rank 0's step_cpu_s / step_s) reads low by the waits of the collective stages
COMPUTE_SPANS = ("rollout", "logprob")
# the experience stage's own work: its log-prob spans and the hand-offs that waited for no one.
# Its share is pooled from them alone, capped at one core, not at cores / nproc: the ranks reach
# the stage one after another (4 ranks on 2 cores, 2026-12-04: their spans' CPU over wall 0.8-1.0
# in most steps, starts up to ~10 ms apart), so "all ranks compute at once" overstated its stretch
EXPERIENCE_SPANS = ("logprob",)
# stages whose ranks' own work is read as the step's critical path, not as the slowest rank's
# sum: the last rank to reach the stage, its own spans, plus the time any earlier rank's ran on
# past them. Every rank starts the stage after the last rollout ended and the metadata
# all-gather that follows it released the rank (earl.runtime.step.run_step); 4 ranks on 2 cores,
# that gather releases them one after another (the first ~3 ms, the last ~7 ms after the last
# rollout's end, medians of cf142-cf145; the last rank waking while the early ones' hand-offs hold
# the cores). The early ranks' spans waited 1-3.5 ms for a core in ~15% of their steps (run-queue
# waits read from the kernel, span arg `wait_s`; 2.5% for the last arrival, whose peers mostly
# sleep in the dispatch); a wait that ends before the last rank's own work does not delay the
# step past it, and one that runs past it is counted. (Until 2026-12-07's thirty-sixth session
# this comment said the early ranks start while peers still roll out: none did, 322 of 322 4-rank
# steps of cf132-cf145)
CRITICAL_STAGES = ("experience",)
NPROCS = (1, 2, 4)  # process counts validated: the profile's dispatch path is fitted at 2 and 4
DTYPE_NAMES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """One config variant: measured per-step stage times and both predictions."""

    name: str  # e.g. "base" or "engine_batch=4"
    overrides: dict  # config overrides of this variant
    measured: list[dict]  # per scored step: stage -> seconds
    predicted: list[dict]  # same, calibrated profile
    datasheet: list[dict]  # same, datasheet profile
    peak_mem_measured: float  # bytes (CUDA: max_memory_allocated; CPU: process RSS)
    peak_mem_predicted: float  # bytes allocated at the predicted peak (reserve excluded)
    run_dir: str  # where the runtime wrote its outputs
    # per scored step: the process's CPU seconds / wall seconds (the runtime's step_cpu_s /
    # step_s; CPU device with one thread only, else 1): on a shared host other processes take
    # the rest, which the simulator (a dedicated device) does not model
    cpu_share: list[float] = field(default_factory=list)
    nproc: int = 1  # runtime processes (simulated devices)
    # wall-time predictions of rollout / experience / train / reshard are the simulator's x this:
    # the profile's host_share / each step's share, mean over the steps (`host_stretch`): nproc
    # processes and other tenants sharing the host's cores (1 on an idle host when they fit)
    host_stretch: float = 1.0
    run_share: float = 1.0  # the share of a core rank 0 got, mean over the scored steps (earl.calibrate.hostload)
    # the share of a core the ranks got in their COMPUTE_SPANS, mean over the scored steps
    # (`compute_shares`); the rollout and log-prob predictions are stretched by it
    compute_share: float = 1.0
    compute_stretch: float = 1.0  # host_stretch's counterpart for the rollout and log-prob work
    plan_mismatches: list[str] = field(default_factory=list)  # steps where sim and runtime plans differ
    # the host's speed during the run over its speed during the calibration (`host_speed`): the
    # run's median host-probe reading over the profile's at its process count, 1 where either
    # side has no reading (GPU runs, older runs and profiles). Recorded, not applied: scaling the
    # predictions by it did not beat leaving them (docs/validate-history.md, twelfth session); the
    # scorecard counts both.
    host_speed: float = 1.0
    host_probe_s: float | None = None  # the run's median reading, CPU s per probe iteration
    # never set here: it marks the report (validation.json) as one whose predictions are not x
    # host_speed; reports of 2026-12-03 written before the twelfth session's passes lack it and
    # were scaled (studies/cpu_fidelity_scorecard.py reads the mark)
    host_speed_applied: bool = False

    def predicted_dedicated(self) -> list[dict]:
        """The prediction for dedicated devices (the stretch for a shared host taken out)."""
        div = {k: self.compute_stretch if k in ("rollout", "experience") else self.host_stretch for k in STAGES}
        return [{k: v if k == "dispatch" else v / div[k] for k, v in r.items()} for r in self.predicted]

    def measured_cpu(self) -> list[dict]:
        """Measured stage times scaled by their step's CPU share: the seconds of CPU they got."""
        shares = self.cpu_share or [1.0] * len(self.measured)
        return [{k: v * f for k, v in r.items()} for r, f in zip(self.measured, shares, strict=True)]

    def total(self, which: str) -> float:
        rows = getattr(self, which)
        return sum(sum(r.values()) for r in rows)


@dataclass(frozen=True, kw_only=True)
class ValidationResult:
    variants: list[VariantResult]
    profile: str  # calibrated profile used
    datasheet: str  # datasheet profile used for contrast
    device: str  # cpu | cuda
    nproc: int  # runtime processes = simulated devices
    memory_comparable: bool  # CUDA: allocator peak vs. prediction; CPU RSS is not comparable
    table: list[dict] = field(default_factory=list)  # per-stage errors (see stage_table)
    kendall_tau: float | None = None  # calibrated prediction vs measurement over variants
    kendall_tau_datasheet: float | None = None


def _rel(p: float, m: float) -> float:
    return abs(p - m) / m if m > 0 else (0.0 if p == 0 else math.inf)


def level_fitted_err(predicted: list[float], measured: list[float]) -> float:
    """min over c > 0 of the median per-step |c x predicted / measured - 1|: the median error the
    per-step predictions would still have with their level fitted to this very run. What is
    left is step-to-step spread the predictions do not follow (on a shared host: scheduling),
    the floor under any rescaling of the model; the median error above it is the level's.
    0 for no steps."""
    r = np.array([p / m for p, m in zip(predicted, measured, strict=True) if p > 0 and m > 0])
    if not r.size:
        return 0.0
    # the optimum puts some c x r_k at 1 or halfway between two of them in log: candidates are
    # 1 / r_k and the geometric midpoints of neighbours, plus a fine log grid between
    inv = np.sort(1.0 / r)
    cands = np.concatenate([inv, np.sqrt(inv[:-1] * inv[1:]), np.geomspace(inv[0], inv[-1], 512)])
    return float(min(np.median(np.abs(c * r - 1.0)) for c in cands))


def stage_table(variants: list[VariantResult]) -> list[dict]:
    """Per stage: summed measured / predicted seconds and the median per-step relative error,
    against the wall time and against the CPU time the stage got (wall x its step's CPU share);
    `spread_err`: that error with the prediction's level fitted per variant (`level_fitted_err`,
    the largest over variants)."""
    out = []
    for stage in STAGES:
        m = [r[stage] for v in variants for r in v.measured]
        mc = [r[stage] for v in variants for r in v.measured_cpu()]
        p = [r[stage] for v in variants for r in v.predicted]
        pd = [r[stage] for v in variants for r in v.predicted_dedicated()]
        d = [r[stage] for v in variants for r in v.datasheet]
        if not any(m) and not any(p) and not any(d):
            continue
        out.append({"stage": stage, "measured_s": sum(m), "predicted_s": sum(p), "datasheet_s": sum(d),
                    "median_err": float(np.median([_rel(a, b) for a, b in zip(p, m, strict=True)])),
                    "spread_err": max(level_fitted_err([r[stage] for r in v.predicted], [r[stage] for r in v.measured])
                                      for v in variants),
                    "measured_cpu_s": sum(mc),
                    "cpu_median_err": float(np.median([_rel(a, b) for a, b in zip(pd, mc, strict=True)])),
                    "datasheet_median_err": float(np.median([_rel(a, b) for a, b in zip(d, m, strict=True)]))})
    return out


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2:
        return None

    tau = kendalltau(a, b).statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def device_of(cfg) -> str:
    """"cuda" or "cpu": the kind of device a run config's model runs on."""
    return "cuda" if str(cfg.model.device).startswith("cuda") else "cpu"


def check_nproc(nproc) -> int:
    """`--nproc`: one of NPROCS, else a ValueError naming the value and the valid choices."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc not in NPROCS:
        raise ValueError(f"--nproc {nproc!r} is not validated; valid: {', '.join(map(str, NPROCS))} (the "
                         "process counts the profile's dispatch path is fitted at, and one)")
    return nproc


def initial_run_plans(cfg, nproc: int) -> dict[str, ParallelPlan]:
    """stage -> the plan the runtime starts each stage on (earl.runtime.resolve.initial_plans)."""
    plans = initial_plans(cfg, nproc)
    return {s.value: plans.for_stage(s) for s in Stage}


def run_plans(rows: list[dict]) -> list[dict[str, ParallelPlan]]:
    """Per metrics row, stage -> the plan the runtime ran it on (its plan_* columns)."""
    return [{s.value: ParallelPlan.parse(r[f"plan_{s.value}"]) for s in Stage} for r in rows]


def _same_layout(a: ParallelPlan, b: ParallelPlan) -> bool:
    """Equal but for the micro-batch (the simulator packs by token budget, as the runtime does)."""
    return dataclasses.replace(a, micro_batch=1) == dataclasses.replace(b, micro_batch=1)


def plan_mismatches(measured: list[dict[str, ParallelPlan]], sim_rows: list[dict]) -> list[str]:
    """'step k stage: runtime PLAN, simulator PLAN' for each step and stage whose plans differ."""
    out = []
    for k, (m, r) in enumerate(zip(measured, sim_rows, strict=True)):
        for stage, plan in m.items():
            sim = ParallelPlan.parse(r[f"plan_{stage}"])
            if not _same_layout(plan, sim):
                out.append(f"step {k + 1} {stage}: runtime {plan.describe()}, simulator {sim.describe()}")
    return out


def logprob_passes(trainer_cfg) -> int:
    """Log-prob forwards of the runtime's experience stage: the old policy's unless its training
    forward stands for it (earl.runtime.trainer.Trainer.needs_old_logprobs), the reference
    model's with a KL coefficient."""
    old = Trainer.needs_old_logprobs.fget(SimpleNamespace(cfg=trainer_cfg))
    return int(old) + int(bool(trainer_cfg.kl_coef))


# the runtime's training step hands its dispatch every episode's reward and the step's most
# rewarded turns (the metadata all-gather): what `AdvantageSpec.reductions` needs to know of
# them is that they are there
RUNTIME_REWARDS: dict[int, float] = {}
RUNTIME_TURNS = 0


def advantage_spec(cfg) -> AdvantageSpec:
    """The advantage estimator the runtime's dispatch runs for `cfg` (earl.runtime.step.train):
    its reductions given RUNTIME_REWARDS and RUNTIME_TURNS are the simulator's `stat_reductions`."""
    return AdvantageSpec.of(cfg.trainer)


def runtime_reductions(cfg) -> int:
    """The statistics reductions the runtime's training dispatch issues for `cfg` now: none
    where the metadata all-gather carries the rewards (a group estimator) or every episode's key
    sums (REINFORCE++ without a KL penalty, `AdvantageSpec.summed_at_rollout`); one of the sums
    with the KL penalty in the rewards (the turn count still comes with the metadata)."""
    return advantage_spec(cfg).reductions(RUNTIME_REWARDS, RUNTIME_TURNS,
                                          summed=AdvantageSpec.summed_at_rollout(cfg.trainer))


def recorded_reductions(spans) -> int | None:
    """The statistics reductions a run's training dispatches issued, as its trace records them
    (the dispatch spans' `reductions`, the most of any rank); None for a run recorded before the
    runtime wrote them: that runtime issued `advantage_spec(cfg).reductions(RUNTIME_REWARDS)`
    (a per-turn baseline's turn count agreed in a round of its own)."""
    got = [int(sp.args["reductions"]) for sp in spans if sp.stage == "dispatch" and "reductions" in sp.args]
    return max(got) if got else None


def _simulate(cfg, spec: ModelSpec, trace: Path, prof: HardwareProfile, steps: int, nproc: int = 1,
              reductions: int | None = None) -> list[dict]:
    """The simulator's rows for the run of `cfg` whose workload is `trace`. `reductions`: the
    statistics reductions its dispatches issued (`recorded_reductions`; None: as the runtime
    issues them now)."""

    cm = CostModel(spec, local_cluster(prof, nproc), prof)
    episodes = cfg.episodes_per_step
    # the runtime packs sequences into micro-batches of token_budget padded tokens: so does the plan
    longest = max(sum(o + g for o, g, _ in turns) for line in load_trace(trace) for turns in line)
    plans = initial_run_plans(cfg, nproc)

    def packed(plan: ParallelPlan) -> str:
        per_rank = -(-episodes // plan.dp)
        mb = max(1, min(per_rank, cfg.trainer.token_budget // max(1, longest)))
        return dataclasses.replace(plan, micro_batch=mb).describe()

    adv = advantage_spec(cfg)
    reductions = runtime_reductions(cfg) if reductions is None else reductions
    sc = Scenario(name="validate", steps=steps, model=spec.name if spec.name in MODEL_CATALOG else "tiny",
                  hardware="cpu", nodes=1, gpus_per_node=nproc,
                  workload=WorkloadSpec(episodes_per_step=episodes, trace=str(trace),
                                        max_context=cfg.sampling.max_context),
                  rollout_plan=plans["rollout"].describe(), experience_plan=packed(plans["experience"]),
                  train_plan=packed(plans["train"]),
                  selector=cfg.policy.selector, dispatcher=cfg.policy.dispatcher,
                  max_num_seqs=cfg.engine_batch or episodes,
                  logprob_passes=logprob_passes(cfg.trainer))
    # the runtime engine's simulator model (continuous batching unless pytorch-static); the
    # runtime's micro-batches are padded
    sim = Simulation(sc, cfg.policy.selector, cfg.policy.dispatcher, cost_model=cm, engine=sim_engine(cfg.engine),
                     padded=True, token_budget=cfg.trainer.token_budget, fsdp=True, handoff=True,
                     head_on="generated", train_placement="balanced",
                     stat_reductions=reductions,  # none: the statistics came summed with the metadata
                     estimator=adv.priced_key(summed=reductions == 0),
                     prompt_group=cfg.group_size,  # the trainer's share: one process only (_shared_cost)
                     kv_round=sim_kv_round(cfg.engine)).run()
    # the hand-off's share of each step's experience stage where it waits for peers: a move over
    # gloo, priced by the dispatch path like the dispatch (and stretched like it,
    # `dispatch_stretch`); one that waits for no one is host work like the log-prob span's
    handoff: dict[int, float] = {}
    ranks: dict[int, list[float]] = {}  # step -> each replica's rollout seconds (`rollout_on_host`)
    for sp in sim.spans:
        if sp.stage == "experience" and sp.name.startswith("hand-off") and sp.args.get("waits", True):
            handoff[sp.step] = handoff.get(sp.step, 0.0) + sp.duration_s
        elif sp.name == "rollout" and sp.stage == "rollout":
            ranks.setdefault(sp.step, []).append(sp.duration_s)
    return [{**r, "handoff_s": handoff.get(r["step"], 0.0), "rollout_ranks_s": ranks.get(r["step"], [])}
            for r in sim.rows]


def rollout_on_host(row: dict, prof: HardwareProfile, nproc: int, device: str, stretch: float) -> float:
    """A simulated step's rollout seconds on this host: its replicas run on their own ranks,
    which on a CPU host with fewer cores than ranks share them (`shared_makespan`: a rank done
    early leaves its share to the others) instead of each taking the longest one's N / cores;
    the rest of the stage, and other tenants' load (`stretch` over the idle host's), stretch as
    every stage does."""
    works = row.get("rollout_ranks_s") or []
    over = max(1.0, nproc / prof.dispatch_path.host_parallel)
    if device != "cpu" or over == 1.0 or len(works) < 2:
        return float(row["rollout_s"]) * stretch
    longest = max(works)
    shared = shared_makespan(works, prof.dispatch_path.host_parallel)
    return stretch / over * (shared + (float(row["rollout_s"]) - longest) * over)


def _predicted_peak(rows: list[dict], cm_capacity: float, reserve: float) -> float:
    used = [(1 - r[k]) * cm_capacity - reserve for r in rows
            for k in ("headroom_experience", "headroom_train") if r.get(k) is not None]
    return max(used, default=0.0)


def measured_stages(spans, steps: list[int]) -> list[dict]:
    """Per step: stage -> seconds: each rank's spans of the stage summed, then the largest over
    ranks, and for collective moves (COLLECTIVE_MOVES and COLLECTIVE_SPANS that waited, which a
    trace from before the `waits` arg always did) the smallest, the two added; 0 for a stage no
    rank ran. Moves the dispatch path prices (DISPATCH_MOVES and the COLLECTIVE_SPANS that
    waited) are read as `earl calibrate` times them: each one (a rank's n-th such span in the
    step) from its last rank's start to its last rank's end, summed over them; the weight sync
    (SYNC_MOVES) likewise, to its first rank's end. A training dispatch that waited for no peer
    (local copies, nothing to reduce: `waits` false) is each rank's own work, the largest. The
    own work of CRITICAL_STAGES (the experience stage's log-prob passes and local hand-offs) is
    the last rank to start it: its sum, plus the time any earlier rank's spans ran past its end."""
    per: dict[tuple[int, str, bool, int], float] = {}
    window: dict[tuple[int, str, bool, int], tuple[float, float]] = {}  # CRITICAL_STAGES: (first start, last end)
    moves: dict[tuple[int, str, int], list] = {}  # (step, stage, n-th) -> the ranks' spans
    seen: dict[tuple[int, str, int], int] = {}
    for sp in sorted((sp for sp in spans if sp.stage in STAGES), key=lambda sp: sp.t_start):
        waits = sp.args.get("waits", True)  # a dispatch of local copies with nothing to reduce: no
        # peer's (earl.runtime.move_samples.DispatchStats.waited), each rank's own work
        if (sp.stage in DISPATCH_MOVES and waits) or sp.stage in SYNC_MOVES or (sp.name in COLLECTIVE_SPANS and waits):
            n = seen.get((sp.step, sp.stage, sp.rank), 0)
            seen[(sp.step, sp.stage, sp.rank)] = n + 1
            moves.setdefault((sp.step, sp.stage, n), []).append(sp)
            continue
        key = (sp.step, sp.stage, sp.stage in COLLECTIVE_MOVES and waits, sp.rank)
        per[key] = per.get(key, 0.0) + sp.duration_s
        if sp.stage in CRITICAL_STAGES:
            first, last = window.get(key, (sp.t_start, sp.t_end))
            window[key] = (min(first, sp.t_start), max(last, sp.t_end))
    out = []
    for step in steps:
        row = dict.fromkeys(STAGES, 0.0)
        for s in STAGES:
            for move in (False, True):
                got = {r: v for (k, st, m, r), v in per.items() if k == step and st == s and m == move}
                if not got:
                    continue
                if s in CRITICAL_STAGES and not move:
                    # the last rank to reach the stage: its own work, and the time any earlier
                    # rank's ran on past its end
                    win = {r: window[(step, s, move, r)] for r in got}
                    last = max(got, key=lambda r: win[r][0])
                    row[s] += got[last] + max(0.0, max(e for _, e in win.values()) - win[last][1])
                else:
                    row[s] += (min if move else max)(got.values())
        for (k, s, _), group in moves.items():
            if k == step:
                end = (min if s in SYNC_MOVES else max)(sp.t_end for sp in group)
                row[s] += max(0.0, end - max(sp.t_start for sp in group))
        out.append(row)
    return out


def sync_leads(spans, steps: list[int]) -> list[list[float]]:
    """Per step: how long before the weight sync's last arrival each rank reached it (seconds,
    0 for the last; each rank's first span of the stage SYNC_MOVES in the step); [] for a step
    with no sync (`active_ranks` reads them)."""
    first: dict[tuple[int, int], float] = {}
    for sp in spans:
        if sp.stage in SYNC_MOVES:
            key = (sp.step, sp.rank)
            first[key] = min(first.get(key, sp.t_start), sp.t_start)
    out = []
    for step in steps:
        got = [t for (k, _), t in first.items() if k == step]
        out.append([max(got) - t for t in got])
    return out


def in_share(sp, names: tuple[str, ...] = COMPUTE_SPANS, own: tuple[str, ...] = ()) -> bool:
    """Whether span `sp` is work a share counts (`compute_shares`): one of `names`, or one of
    `own` that waited for no peer (the experience stage's: `in_share(sp, EXPERIENCE_SPANS,
    COLLECTIVE_SPANS)`)."""
    return sp.name in names or (sp.name in own and not sp.args.get("waits", True))


def compute_shares(spans, steps: list[int], nproc: int, cores: int, names: tuple[str, ...] = COMPUTE_SPANS,
                   cap: float | None = None, own: tuple[str, ...] = (), last: bool = False) -> list[float | None]:
    """Per step: the share of a core the ranks got in their spans `names` (and those in `own`
    that waited for no peer; CPU seconds over wall seconds, all ranks' spans pooled), at most
    `cap`, by default min(1, cores / nproc): the share while all ranks compute, before those done
    early leave their cores to the rest (`rollout_on_host` prices that); None for a step whose
    spans carry no `cpu_s` (a trace from before the runtime recorded it). `last`: the spans of
    the rank that started them last only (a CRITICAL_STAGES stage's, as `measured_stages` reads it)."""
    cpu: dict[int, float] = {}
    wall: dict[int, float] = {}
    counted = [sp for sp in spans if in_share(sp, names, own)]
    if last:
        first: dict[tuple[int, int], float] = {}
        for sp in counted:
            first[(sp.step, sp.rank)] = min(first.get((sp.step, sp.rank), sp.t_start), sp.t_start)
        latest: dict[int, tuple[float, int]] = {}
        for (k, r), t in first.items():
            latest[k] = max(latest.get(k, (t, r)), (t, r))
        counted = [sp for sp in counted if latest[sp.step][1] == sp.rank]
    for sp in counted:
        if "cpu_s" in sp.args:
            cpu[sp.step] = cpu.get(sp.step, 0.0) + float(sp.args["cpu_s"])
            wall[sp.step] = wall.get(sp.step, 0.0) + sp.duration_s
    cap = min(1.0, cores / nproc) if cap is None else cap
    return [min(cap, share_of(cpu[k], wall[k], 1)) if wall.get(k) else None for k in steps]


def _run_runtime(cfg, run_dir: Path, nproc: int) -> tuple[list[dict], float]:
    """The runtime's metrics rows: in this process (one), or under torchrun as `earl run --nproc`;
    and the share of a core each rank got meanwhile (earl.calibrate.hostload)."""
    with CpuShare(procs=nproc * max(1, cfg.threads)) as load:
        if nproc == 1:
            rows = run_training(cfg, run_dir, progress=False, echo=lambda *_: None).metrics
        else:
            code = launch(dataclasses.replace(cfg, nproc=nproc), run_dir, stdout=subprocess.DEVNULL)
            if code != 0:
                raise ValueError(f"the {nproc}-process runtime run failed (exit code {code}); its output is in "
                                 f"{run_dir / 'launch.log'}")
            rows = read_metrics(run_dir)
    return rows, load.share()


def host_speed(spans, steps: list[int], prof: HardwareProfile, nproc: int, device: str) -> tuple[float, float | None]:
    """(the host's speed factor, the run's reading): the median over every rank and scored step
    of the run's host-probe readings (spans "host_probe", args `probe_s`: CPU seconds per
    iteration of earl/runtime/hostprobe.py's loop) over the calibration's reading of the same
    loop at the same process count (`probe_reference`). The hypothesis: a host that runs the
    loop 20% slower than while the constants were measured runs the job's host work 20% slower
    too. Within a pass the reading does follow the level (over 16 runs its log correlates 0.91
    with train's log measured / predicted, 0.54-0.69 with experience's, dispatch's and
    reshard's), but the calibration's readings did not place its constants' level, so validate
    records the factor without applying it. (1,
    reading) where the profile has no reading, (1, None) where the run has none or the device
    is not a CPU."""
    wanted = set(steps)
    got = [float(s.args["probe_s"]) for s in spans
           if s.name == "host_probe" and s.step in wanted and s.args.get("probe_s")]
    if device != "cpu" or not got:
        return 1.0, None
    run = float(np.median(got))
    ref = probe_reference(prof, nproc)
    return (run / ref if ref > 0 else 1.0), run


def probe_reference(prof: HardwareProfile, nproc: int) -> float:
    """The calibration's host-probe reading (CPU s per iteration; 0: none) for a run of `nproc`
    processes: one process, the one-process phases' (`host_probe_s`); N ranks, the gloo phases'
    at N ranks (`host_probe_ranks_s`), whose ranks slow one another's loop as a run's do (on the
    2-core VM, in one pass: runs of 4 ranks read 101-102 us, of 2 ranks 90), else `host_probe_s`."""
    ranks = prof.host_probe_ranks_s.get(str(nproc), 0.0) if nproc > 1 else 0.0
    return ranks or prof.host_probe_s


def hostload_share(row: dict, threads: int, fallback: float) -> float:
    """A metrics row's share of a core per thread of rank 0 (step_cpu_s / step_s / threads, at
    most 1); `fallback` where the row has no timing. At N > 1 rank 0's waits for its peers are
    in step_s and not in step_cpu_s: the share reads low by them."""
    if not row.get("step_s") or row.get("step_cpu_s") is None:
        return fallback
    return share_of(row["step_cpu_s"], row["step_s"], max(1, threads))


def reshard_on_host(sim_row: dict, prof: HardwareProfile, nproc: int, device: str, share: float,
                    leads: list[float]) -> float:
    """A simulated step's re-shard stage on this host: its re-shards and weight sync stretched
    by `sync_stretch` (`share`: a rank's share of a core in the step; `leads`: the ranks'
    arrivals at the sync), but for the sync's wake-ups of ranks asleep in it (the row's
    `sync_wake_s`, CostModel.sync_wake_s): a wait on the host's scheduler, not work a rank does,
    added as priced."""
    sync_s, wake = float(sim_row["sync_s"]), float(sim_row.get("sync_wake_s", 0.0))
    work = float(sim_row["reshard_s"]) + sync_s - wake
    return work * sync_stretch(prof, nproc, device, share, leads, sync_s - wake) + wake


def corun_stretch(prof: HardwareProfile, nproc: int, device: str) -> float:
    """How much slower the stages priced by one-process constants (rollout, experience) compute
    when the job's ranks compute at once on a CPU host: the profile's `corun_slowdown` at N > 1
    ranks (the calibration's figure: every core busy, which N >= host_parallel ranks make them;
    fewer ranks on a bigger host are charged the same, an upper bound), else 1."""
    return prof.corun_slowdown if device == "cpu" and nproc > 1 else 1.0


def dispatch_stretch(prof: HardwareProfile, nproc: int, device: str, share: float | None = None) -> float:
    """The same for dispatch, whose price models its own ranks' oversubscription (the
    dispatch path's terms): only other tenants' load, relative to the dispatch fit's."""
    own = host_stretch(dataclasses.replace(prof, host_share=1.0), nproc, device)
    return host_stretch(dataclasses.replace(prof, host_share=prof.dispatch_path.host_share), nproc, device,
                        share) / own


def run_variant(cfg, name: str, overrides: dict, out_dir: Path, prof: HardwareProfile,
                sheet: HardwareProfile, warmup_steps: int, nproc: int = 1) -> VariantResult:

    run_dir = out_dir / "runs" / name.replace("=", "-").replace(",", "_")
    device = device_of(cfg)
    if device == "cuda":


        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()  # each variant's own peak
    rows, share_run = _run_runtime(cfg, run_dir, nproc)
    return score_variant(cfg, name, overrides, run_dir, rows, share_run, prof, sheet, warmup_steps, nproc)


def score_variant(cfg, name: str, overrides: dict, run_dir: Path, rows: list[dict], share_run: float,
                  prof: HardwareProfile, sheet: HardwareProfile, warmup_steps: int, nproc: int = 1) -> VariantResult:
    """A runtime run's measured stages (its metrics rows and trace.json in `run_dir`) against the
    simulator's prices of its recorded workload with `prof` and `sheet`. `share_run`: the share
    of a core a rank got over the whole run, for steps that recorded none."""
    device = device_of(cfg)
    spans = read_chrome_trace(run_dir / "trace.json")
    measured = measured_stages(spans, [r["step"] for r in rows])
    spec = MODEL_CATALOG[cfg.model.path] if cfg.model.path in MODEL_CATALOG else \
        ModelSpec.from_hf_config(cfg.model.path)
    spec = dataclasses.replace(spec, dtype=DTYPE_NAMES[cfg.model.dtype])
    trace = run_dir / "workload.jsonl"

    # the share of a core rank 0 got in each scored step (the runtime's step_cpu_s / step_s per
    # thread; earl.calibrate.hostload): the load each step ran under; the whole run's (start-up
    # included) where a step did not record it
    shares = [hostload_share(r, cfg.threads, share_run) if device == "cpu" else 1.0 for r in rows[warmup_steps:]]
    # ... and the share the ranks got while they computed (`compute_shares`): the stretch of the
    # stages priced by one-process constants (a dedicated core's: HardwareProfile.host_share)
    per_step = compute_shares(spans, [r["step"] for r in rows[warmup_steps:]], nproc,
                              prof.dispatch_path.host_parallel) if device == "cpu" else []
    computing = [c if c is not None else s for c, s in zip(per_step, shares, strict=True)] if per_step else shares
    # ... and in the experience stage's own work (EXPERIENCE_SPANS): its log-prob passes' stretch
    per_exp = compute_shares(spans, [r["step"] for r in rows[warmup_steps:]], nproc,
                             prof.dispatch_path.host_parallel, names=EXPERIENCE_SPANS, cap=1.0, own=COLLECTIVE_SPANS,
                             last=True) \
        if device == "cpu" else []
    exp_computing = [c if c is not None else s for c, s in zip(per_exp, computing, strict=True)] if per_exp \
        else computing
    leads = sync_leads(spans, [r["step"] for r in rows[warmup_steps:]])
    reductions = recorded_reductions(spans)
    if reductions is None:  # recorded by a runtime that agreed on the turn count in a round
        reductions = advantage_spec(cfg).reductions(RUNTIME_REWARDS)

    def predicted(p: HardwareProfile) -> tuple[list[dict], list[dict], float, float]:
        """(the scored steps' stage seconds, all simulated rows, the mean host stretch, the mean
        compute stretch) for profile `p`; dispatch and the experience stage's hand-off carry
        their own oversubscription terms (`dispatch_stretch`)."""
        sim_rows = _simulate(cfg, spec, trace, p, len(rows), nproc, reductions)
        out, ks, kcs = [], [], []
        for sr, sh, sc, se, lead in zip(sim_rows[warmup_steps:], shares, computing, exp_computing, leads,
                                        strict=True):
            k, kd = host_stretch(p, nproc, device, sh), dispatch_stretch(p, nproc, device, sh)
            kc = host_stretch(p, nproc, device, sc) * corun_stretch(p, nproc, device)
            ke = host_stretch(p, nproc, device, se) * corun_stretch(p, nproc, device)
            row = {s: float(sr[f"{s}_s"]) * (kd if s == "dispatch" else k) for s in STAGES}
            row["rollout"] = rollout_on_host(sr, p, nproc, device, kc)
            row["reshard"] = reshard_on_host(sr, p, nproc, device, sh, lead)
            row["experience"] = (float(sr["experience_s"]) - float(sr["handoff_s"])) * ke + float(sr["handoff_s"]) * kd
            out.append(row)
            ks.append(k)
            kcs.append(kc)
        return out, sim_rows, float(np.mean(ks)) if ks else 1.0, float(np.mean(kcs)) if kcs else 1.0

    pred, sim_cal, stretch, compute_stretch = predicted(prof)
    speed, probe_run = host_speed(spans, [r["step"] for r in rows[warmup_steps:]], prof, nproc, device)
    sheet_pred, _, _, _ = predicted(sheet)
    cm = CostModel(spec, local_cluster(prof, nproc), prof)
    one_core = device == "cpu" and cfg.threads == 1
    share = [min(1.0, r["step_cpu_s"] / r["step_s"]) if one_core and r.get("step_s") else 1.0
             for r in rows[warmup_steps:]]
    return VariantResult(name=name, overrides=overrides, measured=measured[warmup_steps:], cpu_share=share,
                         predicted=pred, datasheet=sheet_pred, nproc=nproc, host_stretch=stretch,
                         run_share=float(np.mean(shares)) if shares else share_run,
                         compute_share=float(np.mean(computing)) if computing else 1.0,
                         compute_stretch=compute_stretch,
                         plan_mismatches=plan_mismatches(run_plans(rows), sim_cal)[:20],
                         host_speed=speed, host_probe_s=probe_run,
                         peak_mem_measured=float(max(r["peak_mem_bytes"] for r in rows)),
                         peak_mem_predicted=_predicted_peak(sim_cal, cm.capacity, cm.reserve),
                         run_dir=str(run_dir))


def parse_variants(text: str | None) -> list[tuple[str, dict]]:
    """`"engine_batch=4;engine_batch=16,reuse_kv=false"` -> named override sets; None: one."""
    if not text:
        return [("base", {})]
    out = []
    for part in (p.strip() for p in text.split(";") if p.strip()):
        out.append((part, parse_sets(part.split(","), flag="--variants")))
    return out


def validation_config(config_file: str | None = None, sets: dict | None = None, *, device: str | None = None,
                      dtype: str | None = None):
    """`earl validate`'s run config: the file (or the default), `--set`s, then `--device` (cuda
    defaults the dtype to bf16) and `--dtype`; a cuda device must be present."""

    overrides = dict(sets or {})
    if device is not None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}; valid: cpu, cuda")
        overrides["model.device"] = device
        if device == "cuda" and dtype is None:
            dtype = "bf16"
    if dtype is not None:
        overrides["model.dtype"] = dtype
    cfg = resolve_config(config_file, overrides=overrides)
    if str(cfg.model.device).startswith("cuda"):

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' is not available here; use --device cpu")
    return cfg


def run_validation(*, config, profile: str, steps: int = 4, warmup_steps: int = 1,
                   variants: list[tuple[str, dict]] | None = None, out_dir: str | Path,
                   model: str | None = None, progress=None, nproc: int = 1) -> ValidationResult:
    """Run each variant of `config` on the runtime and the simulator; write the report.
    `model`: a runtime model (built-in name or checkpoint dir) or any catalog name, for which
    a random-initialised checkpoint of that shape is written under `out_dir/model`. `nproc`: the
    runtime's processes (1, or 2 / 4 under torchrun); the simulator prices as many devices."""

    check_nproc(nproc)
    if steps < warmup_steps + 1:
        raise ValueError(f"--steps {steps} leaves nothing to score after {warmup_steps} warm-up "
                         f"step(s); use --steps >= {warmup_steps + 1}")

    out = check_out_dir(out_dir)
    prof = load_profile(profile)
    for _, ov in variants or []:
        apply_overrides(config, ov, where="--variants")  # a typo in a variant fails before anything runs
    if model and model.lower() in MODEL_CATALOG and model.lower() not in BUILTIN_MODELS:

        check_resources(config, MODEL_CATALOG[model.lower()], nproc)  # before writing a random checkpoint
        model = str(random_checkpoint(model.lower(), out / "model", config.model.dtype,
                                      str(config.model.device)))
    if model:
        config = apply_overrides(config, {"model.path": model})
    device = device_of(config)

    check_stamp(prof, current_stamp(device))  # a mismatch warns; it never silently guesses
    if device == "cpu" and prof.stamp.get("threads") and config.threads != prof.stamp["threads"]:
        # the profile describes one rank with this many threads; the runtime must match it
        config = apply_overrides(config, {"threads": prof.stamp["threads"]})
    sheet_name, sheet = contrast_sheet(prof)
    results = []
    for name, ov in variants or [("base", {})]:
        # throwaway runs: no checkpoints (a 1.5B model's fp32 masters and Adam states are ~20 GB each)
        # CPU runs read the host probe at each step (earl/runtime/hostprobe.py; `host_speed`)
        probe = {"host_probe": PROBE_ITERS} if device == "cpu" else {}
        cfg = apply_overrides(config, {**ov, "steps": steps, "plots": False, "checkpoints": False, **probe})
        results.append(run_variant(cfg, name, ov, out, prof, sheet, warmup_steps, nproc))
        if progress:
            progress(name)
    res = _result(results, str(profile), sheet_name, device, nproc)
    write_report(res, out)
    return res


def contrast_sheet(prof: HardwareProfile) -> tuple[str, HardwareProfile]:
    """The datasheet profile a calibrated one is shown against: its own hardware's, else H100's."""
    name = prof.hardware.name if prof.hardware.name in ("cpu", "a100-sxm-80gb", "h100-sxm-80gb",
                                                        "h200-sxm-141gb") else "h100-sxm-80gb"
    return name, datasheet_profile(HARDWARE_CATALOG[name])


def _result(results: list[VariantResult], profile: str, sheet_name: str, device: str, nproc: int) -> ValidationResult:
    meas = [v.total("measured") for v in results]
    return ValidationResult(
        variants=results, profile=profile, datasheet=sheet_name, device=device, nproc=nproc,
        memory_comparable=device == "cuda", table=stage_table(results),
        kendall_tau=kendall_tau(meas, [v.total("predicted") for v in results]),
        kendall_tau_datasheet=kendall_tau(meas, [v.total("datasheet") for v in results]))


def rescore_validation(*, source: str | Path, profile: str, out_dir: str | Path) -> ValidationResult:
    """Price the runs an earlier `earl validate` recorded (`source`: its --out folder) again with
    `profile`, without running anything: each variant's metrics, trace.json, workload trace and
    config as the run wrote them, its scored steps as scored then. The report goes to `out_dir`
    (new or empty); `source` is only read. How a recalibration moves the errors on the same
    measurements, apart from the run-to-run spread of new ones."""
    src = Path(source)
    try:
        report = json.loads((src / "validation.json").read_text())
        nproc = int(report["nproc"])
        recorded = [{"name": str(v["name"]), "overrides": dict(v["overrides"]), "run_dir": str(v["run_dir"]),
                     "measured": list(v["measured"]), "run_share": float(v.get("run_share", 1.0))}
                    for v in report["variants"]]
    except FileNotFoundError:
        raise ValueError(f"--rescore {source}: no validation.json there (the --out folder of an earl validate "
                         "run is needed)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--rescore {source}: validation.json is not an earl validate report ({e!r})") from None
    if not recorded:
        raise ValueError(f"--rescore {source}: its report holds no variants to re-price")
    runs = []
    for v in recorded:  # every run's files are checked before anything is written
        run_dir = src / "runs" / Path(v["run_dir"]).name  # the folder may have moved with its report
        missing = [f for f in ("config.json", "metrics.jsonl", "trace.json", "workload.jsonl")
                   if not (run_dir / f).is_file()]
        if missing:
            raise ValueError(f"--rescore {source}: run {run_dir} lacks {', '.join(missing)}")
        cfg = from_dict(json.loads((run_dir / "config.json").read_text()))
        model = cfg.model.path
        if model not in MODEL_CATALOG and not (Path(model) / "config.json").is_file():
            moved = src / "model"  # where `--model NAME` wrote its random checkpoint, moved with the report
            if not (moved / "config.json").is_file():
                raise ValueError(f"--rescore {source}: the run's model {model} has no config.json any more (the "
                                 "simulator prices its shape)")
            cfg = apply_overrides(cfg, {"model.path": str(moved)})
        rows = read_metrics(run_dir)
        runs.append((v, run_dir, cfg, rows, len(rows) - len(v["measured"])))
    out = check_out_dir(out_dir)
    prof = load_profile(profile)
    sheet_name, sheet = contrast_sheet(prof)
    device = device_of(runs[0][2])
    results = [score_variant(cfg, v["name"], v["overrides"], run_dir, rows, v["run_share"], prof, sheet, warmup, nproc)
               for v, run_dir, cfg, rows, warmup in runs]
    res = _result(results, str(profile), sheet_name, device, nproc)
    write_report(res, out)
    return res


def validation_table(res: ValidationResult, hardware: str, scored_steps: int):
    """Predicted vs measured time per stage and peak memory per variant (what the CLI prints)."""

    load = "" if res.device != "cpu" else ", " + "; ".join(
        f"core share {v.run_share:.2f} (computing {v.compute_share:.2f}), stretch x{v.host_stretch:.2f}"
        + (f", host probe x{v.host_speed:.2f} (not applied)" if v.host_probe_s else "")
        for v in res.variants[:2])
    t = Table(title=f"earl validate ({res.device} x{res.nproc}, profile {hardware}, {len(res.variants)} variant(s), "
                    f"{scored_steps} scored step(s) each{load})")
    for col in ("stage", "measured s", "predicted s", "median err", "level fitted", f"datasheet ({res.datasheet}) s",
                "datasheet err", "err vs CPU time"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    # "level fitted": the median error with the prediction's level fitted to the run (the
    # step-to-step spread it leaves); last column: measured x the step's CPU share
    for r in res.table:
        t.add_row(r["stage"], f"{r['measured_s']:.4f}", f"{r['predicted_s']:.4f}", f"{r['median_err']:.1%}",
                  f"{r['spread_err']:.1%}", f"{r['datasheet_s']:.4f}", f"{r['datasheet_median_err']:.1%}",
                  f"{r['cpu_median_err']:.1%}")
    for v in res.variants:
        err = abs(v.peak_mem_predicted - v.peak_mem_measured) / v.peak_mem_measured
        what = f"peak memory, {v.name}" + ("" if res.memory_comparable else " (CPU RSS: not comparable)")
        t.add_row(what, f"{v.peak_mem_measured / 2**30:.3f} GiB",
                  f"{v.peak_mem_predicted / 2**30:.3f} GiB", f"{err:.1%}" if res.memory_comparable else "-",
                  "", "", "", "")
    return t


def ranking_line(res: ValidationResult) -> str | None:
    """The Kendall tau of the variants' ranking, when there are several variants."""
    if len(res.variants) < 2:
        return None
    fmt = lambda x: "n/a" if x is None else f"{x:+.2f}"  # noqa: E731
    return (f"Kendall tau of the variants' total time, predicted vs measured: calibrated "
            f"{fmt(res.kendall_tau)}, datasheet {fmt(res.kendall_tau_datasheet)}")


def to_dict(res: ValidationResult) -> dict:
    return {"profile": res.profile, "datasheet": res.datasheet, "device": res.device, "nproc": res.nproc,
            "stages": res.table, "kendall_tau": res.kendall_tau,
            "kendall_tau_datasheet": res.kendall_tau_datasheet,
            "memory_comparable": res.memory_comparable,
            "variants": [dataclasses.asdict(v) for v in res.variants]}


def write_report(res: ValidationResult, out: Path) -> None:
    atomic_write_text(out / "validation.json", json.dumps(to_dict(res), indent=1) + "\n")
    lines = ["variant,step,stage,measured_s,predicted_s,datasheet_s,measured_cpu_s"]
    for v in res.variants:
        for i, (m, p, d, c) in enumerate(zip(v.measured, v.predicted, v.datasheet, v.measured_cpu(), strict=True)):
            lines += [f"{v.name},{i},{s},{m[s]:.6g},{p[s]:.6g},{d[s]:.6g},{c[s]:.6g}" for s in STAGES]
    atomic_write_text(out / "validation.csv", "\n".join(lines) + "\n")
    scatter_plot(res, out / "scatter.png")


def scatter_plot(res: ValidationResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5.5))
    lo, hi = math.inf, 0.0
    for which, marker, label in (("predicted", "o", "calibrated"), ("datasheet", "x", "datasheet")):
        for stage in STAGES[:4]:
            xs = [r[stage] for v in res.variants for r in v.measured]
            ys = [r[stage] for v in res.variants for r in getattr(v, which)]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
            if not pts:
                continue
            ax.scatter(*zip(*pts, strict=True), marker=marker, label=f"{stage} ({label})", alpha=0.8)
            lo = min(lo, *(min(p) for p in pts))
            hi = max(hi, *(max(p) for p in pts))
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="predicted = measured")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured s (per step)")
    ax.set_ylabel("predicted s (per step)")
    ax.set_title(f"earl validate: {res.device}, profile {Path(res.profile).stem}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
