"""Parallelism selectors: which ParallelPlan each RL stage runs with, and why.

Every selector answers `select(stage, stats, current) -> Decision` before rollout, experience
preparation and training. This module holds the shared plan scoring (`PlanScorer`: one cost
model query per plan, cached on a context grid so calling a selector every step is cheap) and
the two simple selectors:

* `static`: one fixed StagePlan, the baseline most RL systems use today.
* `earl-table`: the EARL prototype. At construction it profiles every candidate rollout plan
  per context-length range through the cost model, keeps the best per range, and before each
  rollout picks the plan of the range the average context length falls in. Rollout only.

The `cost-model` selector (all stages, tail- and trend-aware, hysteresis) is in
`earl.policies.cost_selector`.

    python -c "from earl.policies.explain import demo; demo()"
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from earl.cost_model import CostModel, enumerate_plans
from earl.policies.types import Decision
from earl.specs import ParallelPlan, Stage, StagePlan, WorkloadStats

# The cost model's name for the work each RL stage does.
COST_STAGE = {Stage.ROLLOUT: "decode", Stage.EXPERIENCE: "logprob", Stage.TRAIN: "train"}
CONTEXT_ALIGN = 16  # contexts are padded to a multiple of every cp degree searched (1..16)
GRID_STEPS_PER_OCTAVE = 8  # cache grid for contexts: 2**(1/8) apart (~9%), rounded up
GIB = 2**30


def quantize_context(tokens: float) -> int:
    """Round a context length up to the scoring grid (geometric, then a multiple of 16)."""
    if tokens <= CONTEXT_ALIGN:
        return CONTEXT_ALIGN

    def point(k: int) -> int:
        return int(math.ceil(2 ** (k / GRID_STEPS_PER_OCTAVE) / CONTEXT_ALIGN) * CONTEXT_ALIGN)

    k = math.ceil(math.log2(tokens) * GRID_STEPS_PER_OCTAVE - 1e-9)
    while point(k - 1) >= tokens:  # grid points are rounded up: stay idempotent
        k -= 1
    return point(k)


@dataclass(frozen=True, kw_only=True)
class PlanScore:
    """One plan's predicted cost for one stage of one step."""

    plan: ParallelPlan
    feasible: bool  # runs at the throughput context and fits at the memory context
    reason: str  # why not feasible ('' if it is)
    tokens_per_gpu_s: float  # predicted throughput at the throughput context
    stage_time_s: float  # predicted wall time of the stage for this step (inf if infeasible)
    memory_bytes: float  # predicted peak bytes per GPU at the memory context
    memory_frac: float  # memory_bytes / device capacity

    def to_dict(self) -> dict:
        return {"plan": self.plan.describe(), "feasible": self.feasible, "infeasible_reason": self.reason,
                "tokens_per_gpu_s": self.tokens_per_gpu_s, "stage_time_s": self.stage_time_s,
                "memory_gib": self.memory_bytes / GIB, "memory_frac": self.memory_frac}


class PlanScorer:
    """Scores plans of a stage through the cost model, memoised on a context grid.

    Throughput comes from the stage estimate at the (typical) throughput context; memory from
    `cm.memory` at the (tail) memory context: for rollout, one sequence of that length per
    replica (the longest sequence must fit its replica's KV cache); for log-probs and training,
    a micro-batch of sequences that long."""

    def __init__(self, cm: CostModel, gpus: int, *, logprob_passes: int = 2, train_steps: int = 1,
                 can_run: Callable[[Stage, ParallelPlan], str] | None = None):
        if gpus < 1:
            raise ValueError(f"stage_gpus must be >= 1, got {gpus}")
        self.cm = cm
        self.gpus = gpus
        self.can_run = can_run  # '' if the executor can run a plan for a stage, else why not
        self.logprob_passes = logprob_passes  # forward passes per sample (ref + old policy)
        self.train_steps = train_steps  # optimizer steps per RL iteration
        self._candidates: dict[Stage, list[ParallelPlan]] = {}
        self._est: dict[tuple, tuple[bool, str, float, float]] = {}
        self._mem: dict[tuple, float] = {}
        self._reshard: dict[tuple, float] = {}

    def candidates(self, stage: Stage) -> list[ParallelPlan]:
        """Every valid plan for the stage on `gpus` GPUs that `can_run` accepts (cached)."""
        if stage not in self._candidates:
            gpn = self.cm.cluster.gpus_per_node
            plans = enumerate_plans(COST_STAGE[stage], self.cm.model, self.gpus, None, gpn)
            self._candidates[stage] = [p for p in plans if self.can_run is None or not self.can_run(stage, p)]
        return self._candidates[stage]

    def _estimate(self, stage: Stage, plan: ParallelPlan, batch: int, ctx: int):
        key = (stage, plan, batch, ctx)
        hit = self._est.get(key)
        if hit is None:
            try:
                if stage is Stage.EXPERIENCE:
                    est = self.cm.logprob(plan, batch, ctx, passes=self.logprob_passes)
                else:
                    est = self.cm.estimate(COST_STAGE[stage], plan, batch, ctx)
            except ValueError as e:  # the plan does not suit the model (e.g. tp vs heads)
                hit = (False, str(e), 0.0, math.inf)
            else:
                hit = (est.feasible, est.reason if not est.feasible else "", est.tokens_per_gpu_s,
                       est.time_s)
            self._est[key] = hit
        return hit

    def _memory(self, stage: Stage, plan: ParallelPlan, ctx: int) -> float:
        key = (stage, plan, ctx)
        hit = self._mem.get(key)
        if hit is None:
            try:
                hit = self.cm.memory(COST_STAGE[stage], plan, plan.dp, ctx).total
            except ValueError:
                hit = math.inf
            self._mem[key] = hit
        return hit

    def score(self, stage: Stage, plan: ParallelPlan, stats: WorkloadStats, *,
              ctx_tput: float | Sequence[float], ctx_mem: float, margin: float = 0.0,
              mem_scale: float = 1.0) -> PlanScore:
        """Score `plan` for `stats.num_responses` sequences: throughput at `ctx_tput` tokens
        (several contexts: the mean stage time over them, so one noisy observation does not
        decide), memory at `ctx_mem` tokens (times `mem_scale`); feasible if that leaves
        `margin` of the device free."""
        points = [ctx_tput] if isinstance(ctx_tput, (int, float)) else list(ctx_tput)
        cap = self.cm.capacity
        mem = self._memory(stage, plan, quantize_context(ctx_mem)) * mem_scale
        ok, why, tput, t = True, "", 0.0, 0.0
        if mem > (1.0 - margin) * cap:
            ok, why = False, (f"needs {mem / GIB:.1f} GiB/GPU at {ctx_mem:,.0f} tokens, over "
                              f"{(1 - margin) * 100:.0f}% of {cap / GIB:.0f} GiB")
        for c in points:
            if not ok:
                break
            ok, why, tp, tm = self._estimate(stage, plan, stats.num_responses, quantize_context(c))
            tput += tp / len(points)
            t += tm / len(points)
        if stage is Stage.ROLLOUT:  # one decode iteration -> every generated token
            t *= max(1.0, stats.response_tokens_mean or stats.context_mean)
        elif stage is Stage.TRAIN:
            t *= self.train_steps
        return PlanScore(plan=plan, feasible=ok, reason=why, tokens_per_gpu_s=tput if ok else 0.0,
                         stage_time_s=t if ok else math.inf, memory_bytes=mem, memory_frac=mem / cap)

    def fits(self, stage: Stage, plan: ParallelPlan, ctx_mem: float, *, margin: float = 0.0,
             mem_scale: float = 1.0) -> bool:
        """Whether the plan's memory at `ctx_mem` tokens leaves `margin` of the device free."""
        mem = self._memory(stage, plan, quantize_context(ctx_mem)) * mem_scale
        return mem <= (1.0 - margin) * self.cm.capacity

    def sync_s(self, stage: Stage, plan: ParallelPlan, in_use: dict[Stage, ParallelPlan]) -> float:
        """Per-step weight sync this plan implies: rollout and experience receive the weights
        from the training layout every step; a training plan sends them to both."""
        if stage is Stage.TRAIN:
            return (self.reshard_s(Stage.ROLLOUT, plan, in_use[Stage.ROLLOUT])
                    + self.reshard_s(Stage.ROLLOUT, plan, in_use[Stage.EXPERIENCE]))
        return self.reshard_s(Stage.ROLLOUT, in_use[Stage.TRAIN], plan)

    def reshard_s(self, stage: Stage, src: ParallelPlan, dst: ParallelPlan) -> float:
        """Seconds to move weights (training: and optimizer states) from `src` to `dst`."""
        if src == dst:
            return 0.0
        key = (stage, src, dst)
        if key not in self._reshard:
            self._reshard[key] = self.cm.reshard(src, dst, include_optimizer=stage is Stage.TRAIN).time_s
        return self._reshard[key]


class Selector:
    """`select(stage, stats, current) -> Decision`. Subclasses implement `_select`."""

    name = ""

    def __init__(self, *, cost_model: CostModel, initial: StagePlan, stage_gpus: int,
                 logprob_passes: int = 2, train_steps: int = 1,
                 can_run: Callable[[Stage, ParallelPlan], str] | None = None):
        self.cm = cost_model
        self.gpus = stage_gpus
        self.scorer = PlanScorer(cost_model, stage_gpus, logprob_passes=logprob_passes,
                                 train_steps=train_steps, can_run=can_run)
        self.initial = StagePlan(**{s.value: initial.for_stage(s).resolve(stage_gpus) for s in Stage})
        self.in_use: dict[Stage, ParallelPlan] = {s: self.initial.for_stage(s) for s in Stage}

    def select(self, stage: Stage | str, stats: WorkloadStats, current: ParallelPlan | None = None
               ) -> Decision:
        stage = Stage(stage)
        current = (current or self.initial.for_stage(stage)).resolve(self.gpus)
        self.in_use[stage] = current
        decision = self._select(stage, stats, current)
        self.in_use[stage] = decision.plan  # what the other stages' decisions assume next
        return decision

    def _select(self, stage: Stage, stats: WorkloadStats, current: ParallelPlan) -> Decision:
        raise NotImplementedError

    def _decide(self, stage: Stage, stats: WorkloadStats, current: ParallelPlan, plan: ParallelPlan,
                reason: str, **extra) -> Decision:
        """A Decision for `plan` with its predicted numbers at the observed stats."""
        score = self.scorer.score(stage, plan, stats, ctx_tput=stats.context_mean,
                                  ctx_mem=stats.context_max)
        predicted = {"selector": self.name, **score.to_dict(),
                     "reshard_s": self.scorer.reshard_s(stage, current, plan), **extra}
        return Decision(stage=stage, plan=plan, switched=plan != current, reason=reason,
                        predicted=predicted)


class StaticSelector(Selector):
    """Never switches on its own: the plan in force stays (the initial StagePlan, unless the
    runtime moved it for another reason: a scripted switch or a memory-budget re-plan)."""

    name = "static"

    def _select(self, stage: Stage, stats: WorkloadStats, current: ParallelPlan) -> Decision:
        return self._decide(stage, stats, current, current, f"static plan {current.describe()}")


DEFAULT_RANGES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)  # range edges, tokens


class EarlTableSelector(Selector):
    """The EARL prototype's table: best rollout plan per average-context range, profiled once.

    Options: `ranges` (increasing range edges in tokens), `profile_batch` (sequences the
    profile assumes in flight; default: the rollout batch of the first call is not known at
    construction, so 256)."""

    name = "earl-table"

    def __init__(self, *, ranges: tuple[int, ...] = DEFAULT_RANGES, profile_batch: int = 256, **kw):
        super().__init__(**kw)
        edges = tuple(int(r) for r in ranges)
        if not edges or any(b <= a for a, b in zip(edges, edges[1:], strict=False)) or edges[0] <= 0:
            raise ValueError(f"earl-table ranges must be positive and increasing, got {ranges!r}")
        if profile_batch < 1:
            raise ValueError(f"profile_batch must be >= 1, got {profile_batch}")
        self.edges = edges
        self.table: list[tuple[ParallelPlan, float, int]] = []  # per range: plan, tok/s/GPU, probe
        lows = (0,) + edges
        highs = edges + (2 * edges[-1],)
        probe_stats = WorkloadStats(num_responses=profile_batch, context_mean=1, context_p95=1,
                                    context_max=1)
        current = self.initial.rollout
        for lo, hi in zip(lows, highs, strict=True):
            # the geometric middle of the range, on the scoring grid
            probe = quantize_context(math.sqrt(max(lo, CONTEXT_ALIGN) * hi))
            scores = [self.scorer.score(Stage.ROLLOUT, p, probe_stats, ctx_tput=probe, ctx_mem=probe)
                      for p in self.scorer.candidates(Stage.ROLLOUT)]
            feasible = [s for s in scores if s.feasible]
            if feasible:
                best = max(feasible, key=lambda s: s.tokens_per_gpu_s)
                current = best.plan
                self.table.append((best.plan, best.tokens_per_gpu_s, probe))
            else:  # nothing fits: keep the previous range's plan (the runtime will report it)
                self.table.append((current, 0.0, probe))

    def range_of(self, context: float) -> int:
        return bisect.bisect_right(self.edges, context)

    def range_text(self, i: int) -> str:
        lo = 0 if i == 0 else self.edges[i - 1]
        hi = f"{self.edges[i]:,}" if i < len(self.edges) else "inf"
        return f"[{lo:,}, {hi})"

    def _select(self, stage: Stage, stats: WorkloadStats, current: ParallelPlan) -> Decision:
        if stage is not Stage.ROLLOUT:
            return self._decide(stage, stats, current, current,
                                "earl-table selects the rollout plan only; keeping the current plan")
        i = self.range_of(stats.context_mean)
        plan, tput, probe = self.table[i]
        verb = "switch to" if plan != current else "keep"
        reason = (f"average context {stats.context_mean:,.0f} tokens is in range {self.range_text(i)}: "
                  f"{verb} {plan.short()} (profiled {tput:,.0f} tokens/s/GPU at {probe:,} tokens)")
        return self._decide(stage, stats, current, plan, reason, table_range=self.range_text(i),
                            table_tokens_per_gpu_s=tput)
