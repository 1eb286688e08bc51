"""The `cost-model` selector: per stage, the plan with the best predicted throughput that
still fits memory, with a safety margin, at the context the workload is heading to.

It goes past the EARL table (which keys on the average context only): it smooths noisy
statistics, checks memory at the projected tail so it switches before an OOM, charges the
re-shard of a switch and the per-step weight sync, uses hysteresis so it does not flap, and for
training picks tp/pp/cp/dp, micro-batch, recompute and optimizer sharding together. Each of
these rules and its parameters: docs/policies.md, "Design notes".

    python -c "from earl.policies.explain import demo; demo('cost-model')"
"""

from __future__ import annotations

import math
from collections import deque

from earl.policies.selectors import PlanScore, Selector
from earl.policies.types import Decision
from earl.specs import ParallelPlan, Stage, WorkloadStats

TOP_CANDIDATES = 5  # alternatives reported with each decision


def _fit(points: list[tuple[int, float]]) -> tuple[float, bool]:
    """Least-squares growth per step of (step, value) points, and whether it is significant
    (more than twice its standard error: steady growth, not noise). (0, False) below 3 steps."""
    n = len(points)
    if n < 2:
        return 0.0, False
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    if var == 0:
        return 0.0, False
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / var
    if n < 3:
        return slope, False
    resid = sum((p[1] - my - slope * (p[0] - mx)) ** 2 for p in points) / (n - 2)
    return slope, slope * slope > 4 * resid / var


class CostModelSelector(Selector):
    """Maximise predicted throughput subject to projected memory, with switch cost and
    hysteresis. All stages."""

    name = "cost-model"

    def __init__(self, *, margin: float = 0.10, lookahead_steps: float = 2.0, history: int = 8,
                 trend_steps: int = 4, charge_sync: bool = True,
                 hysteresis: float = 0.10, patience: int = 2, amortize_steps: float = 8.0, **kw):
        super().__init__(**kw)
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if (lookahead_steps < 0 or history < 1 or trend_steps < 2 or hysteresis < 0 or patience < 1
                or amortize_steps <= 0):
            raise ValueError("cost-model selector needs lookahead_steps >= 0, history >= 1, trend_steps >= 2, "
                             f"hysteresis >= 0, patience >= 1, amortize_steps > 0; got {lookahead_steps}, "
                             f"{history}, {trend_steps}, {hysteresis}, {patience}, {amortize_steps}")
        self.margin = margin  # fraction of device memory kept free
        self.lookahead_steps = lookahead_steps  # how far ahead the context tail is projected
        self.hysteresis = hysteresis  # relative gain a switch must promise
        self.patience = patience  # consecutive calls a better plan must win
        self.amortize_steps = amortize_steps  # steps a switch's re-shard cost is spread over
        self.trend_steps = trend_steps  # recent steps the growth rate is fitted on
        self.charge_sync = charge_sync  # add the per-step train -> rollout/experience weight sync
        self._history: deque[tuple[int, float, float, float]] = deque(maxlen=history)
        self._pending: dict[Stage, tuple[ParallelPlan, int]] = {}
        self._mem_scale: dict[Stage, float] = {}

    # ---- workload projection -------------------------------------------------------------
    def _observe(self, stats: WorkloadStats) -> None:
        point = (stats.step, stats.context_mean, stats.context_p95, stats.context_max)
        if self._history and self._history[-1][0] == stats.step:
            self._history[-1] = point  # the same step seen again (another stage)
        else:
            self._history.append(point)

    def project(self, stats: WorkloadStats) -> tuple[list[float], float, dict]:
        """(throughput contexts, memory context, trend figures) for the coming step. The
        throughput contexts are the recent steps' means carried forward along the trend: one
        point under steady growth, a spread under noise."""
        hist = list(self._history)
        recent = hist[-self.trend_steps:]
        fits = [_fit([(h[0], h[k]) for h in recent]) for k in (1, 2, 3)]
        # memory: any recent growth counts (safety); throughput: only steady growth shifts the
        # recent means forward, otherwise they stand as a sample of the noise
        growth = [max(0.0, f[0]) for f in fits]
        steady = growth[0] if fits[0][1] else 0.0
        ctx_points = [h[1] + steady * (stats.step + 1 - h[0]) for h in (recent if steady else hist)]
        ctx_tput = stats.context_mean + steady
        ctx_mem = max(stats.context_max,
                      stats.context_p95 + growth[1] * self.lookahead_steps,
                      stats.context_max + growth[2] * self.lookahead_steps)
        if stats.max_context:
            ctx_mem = max(stats.context_max, min(ctx_mem, stats.max_context))
            ctx_tput = min(ctx_tput, ctx_mem)
            ctx_points = [min(c, ctx_mem) for c in ctx_points]
        # where the tail is heading over a switch's amortisation horizon
        ctx_long = ctx_mem + max(growth[1], growth[2]) * max(0.0, self.amortize_steps - self.lookahead_steps)
        if stats.max_context:
            ctx_long = max(ctx_mem, min(ctx_long, stats.max_context))
        trend = {"context_throughput": ctx_tput, "context_memory": ctx_mem, "context_horizon": ctx_long,
                 "growth_mean_per_step": growth[0], "growth_p95_per_step": growth[1],
                 "growth_max_per_step": growth[2]}
        return ctx_points, ctx_mem, trend

    def _calibrate_memory(self, stage: Stage, stats: WorkloadStats, current: ParallelPlan) -> float:
        if stats.memory_headroom_frac is not None:
            predicted = self.scorer.score(stage, current, stats, ctx_tput=stats.context_mean,
                                          ctx_mem=stats.context_max).memory_frac
            measured = 1.0 - stats.memory_headroom_frac
            if predicted > 0:
                self._mem_scale[stage] = max(1.0, measured / predicted)
        return self._mem_scale.get(stage, 1.0)

    # ---- the decision ----------------------------------------------------------------------
    def _select(self, stage: Stage, stats: WorkloadStats, current: ParallelPlan) -> Decision:
        self._observe(stats)
        ctx_points, ctx_mem, trend = self.project(stats)
        scale = self._calibrate_memory(stage, stats, current)

        def score(p: ParallelPlan) -> PlanScore:
            return self.scorer.score(stage, p, stats, ctx_tput=ctx_points, ctx_mem=ctx_mem,
                                     margin=self.margin, mem_scale=scale)

        cur = score(current)

        def sync(p: ParallelPlan) -> float:
            return self.scorer.sync_s(stage, p, self.in_use) if self.charge_sync else 0.0

        cur_time = cur.stage_time_s + sync(current)
        ctx_long = trend["context_horizon"]
        feasible = [cur if p == current else score(p) for p in self.scorer.candidates(stage)]
        feasible = sorted((s for s in feasible if s.feasible), key=lambda s: s.stage_time_s)
        # Branch and bound: a switch only adds time, so once a plan's bare stage time exceeds
        # the best effective time found (and we hold enough rows to report), the rest lose too.
        # This keeps the (costly) re-shard pricing to the few plans that could win.
        ranked: list[tuple[float, PlanScore, float]] = []  # (effective time, score, reshard_s)
        best_eff = math.inf
        for s in feasible:
            if s.stage_time_s > best_eff and len(ranked) >= TOP_CANDIDATES:
                break
            sw = self.scorer.reshard_s(stage, current, s.plan)
            steps = self.amortize_steps
            if sw > 0 and ctx_long > ctx_mem and not self.scorer.fits(
                    stage, s.plan, ctx_long, margin=self.margin, mem_scale=scale):
                # the growing tail will push it out again before the switch pays off
                steps = max(1.0, min(steps, self.lookahead_steps))
            eff = s.stage_time_s + sync(s.plan) + sw / steps
            best_eff = min(best_eff, eff)
            ranked.append((eff, s, sw))
        ranked.sort(key=lambda r: (r[0], -r[1].tokens_per_gpu_s, r[1].plan.describe()))
        rows = [dict(r[1].to_dict(), reshard_s=r[2], sync_s=sync(r[1].plan), effective_time_s=r[0])
                for r in ranked[:TOP_CANDIDATES]]
        extra = {**trend, "memory_scale": scale, "current": dict(cur.to_dict(), sync_s=sync(current)),
                 "candidates": rows}
        if not ranked:
            self._pending.pop(stage, None)
            return self._decision(stage, current, cur, cur, 0.0, False, extra,
                                  f"no {stage.value} plan fits {ctx_mem:,.0f} tokens with a "
                                  f"{self.margin:.0%} memory margin; keeping {current.short()} "
                                  f"({cur.reason or 'fits'})")
        eff, best, sw = ranked[0]
        if not cur.feasible:
            self._pending.pop(stage, None)
            return self._decision(stage, current, best, cur, sw, True, extra,
                                  f"{current.describe()} would not fit ahead ({cur.reason}; context "
                                  f"growing {trend['growth_max_per_step']:,.0f} tokens/step): switch "
                                  f"to {best.plan.describe()} ({best.tokens_per_gpu_s:,.0f} tokens/s/GPU)")
        if best.plan == current:
            self._pending.pop(stage, None)
            runner = ranked[1][1].plan.describe() if len(ranked) > 1 else "none"
            return self._decision(stage, current, cur, cur, 0.0, False, extra,
                                  f"keep {current.describe()}: best predicted throughput "
                                  f"{cur.tokens_per_gpu_s:,.0f} tokens/s/GPU, {cur.memory_frac:.0%} of "
                                  f"memory at {ctx_mem:,.0f} tokens (runner-up {runner})")
        gain = cur_time / eff - 1.0
        if gain <= self.hysteresis:
            self._pending.pop(stage, None)
            return self._decision(stage, current, cur, cur, 0.0, False, extra,
                                  f"keep {current.describe()}: {best.plan.describe()} would gain only "
                                  f"{gain:+.1%} after re-shard {sw:.2f}s/{self.amortize_steps:g} steps "
                                  f"(threshold {self.hysteresis:.0%})")
        prev, count = self._pending.get(stage, (None, 0))
        count = count + 1 if prev == best.plan else 1
        if count < self.patience:
            self._pending[stage] = (best.plan, count)
            return self._decision(stage, current, cur, cur, 0.0, False, extra,
                                  f"keep {current.describe()} for now: {best.plan.describe()} gains "
                                  f"{gain:+.1%} ({count}/{self.patience} confirmations)")
        self._pending.pop(stage, None)
        return self._decision(stage, current, best, cur, sw, True, extra,
                              f"switch to {best.plan.describe()}: {gain:+.1%} predicted stage time gain "
                              f"incl. re-shard {sw:.2f}s amortised over {self.amortize_steps:g} steps "
                              f"({best.tokens_per_gpu_s:,.0f} vs {cur.tokens_per_gpu_s:,.0f} tokens/s/GPU)")

    def _decision(self, stage: Stage, current: ParallelPlan, chosen: PlanScore, cur: PlanScore,
                  reshard_s: float, switched: bool, extra: dict, reason: str) -> Decision:
        gain = (cur.stage_time_s / chosen.stage_time_s - 1.0
                if switched and math.isfinite(cur.stage_time_s) and chosen.stage_time_s > 0 else 0.0)
        predicted = {"selector": self.name, **chosen.to_dict(), "reshard_s": reshard_s,
                     "gain": gain, **extra}
        return Decision(stage=stage, plan=chosen.plan, switched=switched and chosen.plan != current,
                        reason=reason, predicted=predicted)
