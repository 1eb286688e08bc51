"""The simulated RL iteration: select -> sync -> rollout -> experience -> dispatch -> train.

One `Simulation` runs one (selector, dispatcher) pair over the scenario's steps on a SimPy
clock. Each step walks the iteration the runtime walks (ARCHITECTURE.md), calling the selector
at the same points with the same statistics:

1. `select(ROLLOUT, stats of the previous step)`; weights sync from the training layout to the
   rollout plan (`cm.reshard`, zero when the layouts match).
2. Rollout: one continuous-batching `Replica` per rollout dp group, episodes dealt round-robin.
3. `select(EXPERIENCE, stats of this rollout)`; weights re-shard train -> experience layout;
   reference and old-policy log-probs priced by `cm.logprob`.
4. `select(TRAIN, ...)`; optimizer states re-shard when the training plan changes; the
   dispatcher's TransferPlan from the experience layout to the training layout is priced by
   the cost model's one dispatch price (earl.cost_model.dispatch: per-node link and NIC
   contention, host paths); one optimizer step priced by `cm.train`.

Training state (weights, optimizer) lives in the training layout. Sequences of mixed lengths
are priced in a few length buckets (equal counts, each priced at its mean length) and the
slowest dp group's token share (the token-balanced assignment's imbalance) stretches the
stage. A sequence longer than the plan can hold (`cm.memory` at micro-batch size) is an OOM
event for that stage and leaves the batch; a rollout OOM comes from the engine.

    python -c "from earl.sim.iteration import Simulation; from earl.sim.scenario import load_scenario; \
s = Simulation(load_scenario(None, {'scenario.steps': '2'}), 'static', 'centralized'); s.run(); print(s.rows[-1])"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import simpy

from earl.cost_model import CostModel
from earl.cost_model.dispatch import price_transfer_plan
from earl.cost_model.profile import load_profile
from earl.policies import Layout, Sample, balance_aligned, balance_samples, make_dispatcher, make_selector
from earl.specs import ParallelPlan, Stage, WorkloadStats
from earl.trace import Span

from .cluster import Cluster
from .engine import DecodeClock, Replica, TurnSyncReplica
from .scenario import Scenario
from .workload import Episode, Workload

MAX_BUCKETS = 8  # length buckets a mixed batch is priced in
ENGINES = ("continuous", "turn-sync")  # rollout engine models: vLLM-like, or the PyTorch runtime's


@dataclass(frozen=True, kw_only=True)
class StageCost:
    time_s: float  # wall time of the stage
    memory_bytes: float  # per-GPU peak at the longest surviving sequence
    headroom_frac: float  # 1 - memory_bytes / device memory
    imbalance: float  # max / mean tokens over dp groups
    group_tokens: tuple[int, ...]  # tokens per dp group


class Simulation:
    """One policy pair on one scenario. `run()` fills `rows` (one dict per step) and `spans`."""

    def __init__(self, scenario: Scenario, selector: str, dispatcher: str, *,
                 cost_model: CostModel | None = None, log: list | None = None,
                 fine: bool | None = None, progress=None, engine: str = "continuous",
                 padded: bool = False, token_budget: int = 0):
        # `engine` "turn-sync", `padded` and `token_budget` model the single-process PyTorch
        # runtime for `earl validate`: its engine plays turns in lockstep (sim.engine.
        # TurnSyncReplica); its log-prob / train micro-batches are right-padded to their longest
        # sequence and packed up to `token_budget` padded tokens (CostModel.mixed_batch)
        if engine not in ENGINES:
            raise ValueError(f"unknown rollout engine model {engine!r}; valid: {', '.join(ENGINES)}")
        self.replica_cls = TurnSyncReplica if engine == "turn-sync" else Replica
        self.padded = padded
        self.token_budget = token_budget
        self.sc = scenario
        self.env = simpy.Environment()
        if cost_model is None:
            profile = load_profile(scenario.profile) if scenario.profile else None
            cost_model = CostModel(scenario.model_spec(), scenario.cluster_spec(), profile)
        self.cm = cost_model
        self.cluster = Cluster(self.env, cost_model.cluster, cost_model)
        self.gpus = self.cluster.num_gpus
        self.initial = scenario.stage_plan()
        self.selector_name, self.dispatcher_name = selector, dispatcher
        self.label = f"{selector}/{dispatcher}"
        self.selector = make_selector(selector, cost_model=cost_model, initial=self.initial,
                                      stage_gpus=self.gpus, logprob_passes=scenario.logprob_passes)
        self.dispatcher = make_dispatcher(dispatcher)
        self.workload = Workload(scenario.workload, seed=scenario.seed)
        self.fine = scenario.fine if fine is None else fine
        self.log = log
        self.progress = progress
        self.plans = {s: self.initial.for_stage(s) for s in Stage}
        self.train_layout = self.initial.train  # where weights and optimizer states live
        self.rows: list[dict] = []
        self.spans: list[Span] = []
        self.decisions: list[dict] = []
        self.events = 0
        self._clocks: dict[int, DecodeClock] = {}
        self._fit_cache: dict[tuple, int] = {}
        self._stats: WorkloadStats | None = None
        self._headroom: dict[Stage, float] = {}  # stage -> free memory fraction when it last ran

    # ---- helpers ----------------------------------------------------------------------------
    def clock(self, tp: int) -> DecodeClock:
        if tp not in self._clocks:
            self._clocks[tp] = DecodeClock(self.cm, tp, exact=self.fine)
        return self._clocks[tp]

    def _span(self, name: str, stage: str, rank: int, t0: float, t1: float, step: int, **kw) -> None:
        self.spans.append(Span(name=name, stage=stage, rank=rank, t_start=t0, t_end=t1, step=step, **kw))

    def _select(self, stage: Stage, stats: WorkloadStats, step: int) -> ParallelPlan:
        # the headroom this stage's plan left last time it ran (what the runtime measures); the
        # rollout engine fills its KV cache by design, so rollout reports none
        stats = dataclasses.replace(stats, memory_headroom_frac=self._headroom.get(stage))
        dec = self.selector.select(stage, stats, self.plans[stage])
        plan = dec.plan.resolve(self.gpus)
        now = self.env.now
        self.decisions.append({"policy": self.label, "step": step, "stage": stage.value,
                               "plan": plan.describe(), "switched": dec.switched, "reason": dec.reason})
        self._span(f"select {stage.value}", "select", 0, now, now, step,
                   args={"plan": plan.describe(), "switched": dec.switched, "reason": dec.reason})
        self.plans[stage] = plan
        return plan

    def _reshard(self, name: str, stage: str, src: ParallelPlan, dst: ParallelPlan, step: int,
                 include_optimizer: bool = False):
        """SimPy process: charge a weight (and optimizer) re-shard; returns its seconds."""
        if src == dst:
            return 0.0
        est = self.cm.reshard(src, dst, include_optimizer=include_optimizer)
        t0 = self.env.now
        yield self.env.timeout(est.time_s)
        self.events += 1
        self._span(name, stage, 0, t0, self.env.now, step,
                   bytes=int(est.extras.get("bytes_total", 0)),
                   args={"src": src.describe(), "dst": dst.describe()})
        return est.time_s

    def max_fit_context(self, stage: str, plan: ParallelPlan) -> int:
        """Longest sequence (tokens) a micro-batch of `plan` holds in memory for `stage`."""
        key = (stage, plan)
        if key not in self._fit_cache:
            lo, hi = 0, 4 * self.sc.workload.max_context if self.sc.workload.max_context else 1 << 22
            if self.cm.memory(stage, plan, plan.dp, hi).fits:
                lo = hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.cm.memory(stage, plan, plan.dp, mid).fits:
                    lo = mid
                else:
                    hi = mid
            self._fit_cache[key] = lo
        return self._fit_cache[key]

    def stage_cost(self, stage: str, plan: ParallelPlan, episodes: list[Episode]) -> StageCost:
        """Price log-probs ('logprob') or one optimizer step ('train') of a mixed-length batch."""
        ctx = sorted(e.context_tokens for e in episodes)
        samples = [Sample(e.id, e.context_tokens) for e in episodes]
        assignment, imbalance = balance_samples(samples, plan.dp)
        tok = {s.id: s.tokens for s in samples}
        group_tokens = tuple(sum(tok[i] for i in g) for g in assignment)
        passes = self.sc.logprob_passes if stage == "logprob" else 1
        est = self.cm.mixed_batch(stage, plan, ctx, buckets=MAX_BUCKETS, passes=passes, imbalance=imbalance,
                                  padded=self.padded, token_budget=self.token_budget)
        assert est.feasible, f"{stage} {plan.describe()} infeasible at {ctx[-1]} tokens after OOM filter"
        mem = self.cm.memory(stage, plan, plan.dp, ctx[-1])
        return StageCost(time_s=est.time_s, memory_bytes=mem.total,
                         headroom_frac=mem.headroom_frac, imbalance=imbalance,
                         group_tokens=group_tokens)

    def _prompt_stats(self, episodes: list[Episode], step: int) -> WorkloadStats:
        """What is known before the first rollout: the prompts."""
        prompts = [Episode(id=e.id, turns=(e.turns[0][:1] + (0, 0.0),)) for e in episodes if e.turns]
        return Workload.stats(prompts, step=step, max_context=self.sc.workload.max_context)

    # ---- the iteration ----------------------------------------------------------------------
    def run(self) -> Simulation:
        self.env.process(self._loop())
        self.env.run()
        return self

    def _loop(self):
        for step in range(self.sc.steps):
            yield from self._step(step)
            if self.progress is not None:
                self.progress(self, step)

    def _step(self, step: int):
        env, cm, sc = self.env, self.cm, self.sc
        t_step = env.now
        drawn = [e for e in self.workload.episodes(step) if e.turns]
        stats_before = self._stats or self._prompt_stats(drawn, step)
        row: dict = {"policy": self.label, "selector": self.selector_name,
                     "dispatcher": self.dispatcher_name, "step": step, "episodes": len(drawn),
                     "truncated_episodes": sum(e.truncated for e in drawn)}

        # 1. rollout plan, weight sync from the training layout
        ro = self._select(Stage.ROLLOUT, stats_before, step)
        sync_s = yield from self._reshard("weight sync", "sync", self.train_layout, ro, step)

        # 2. rollout
        t0 = env.now
        clock = self.clock(ro.tp)
        reps = [self.replica_cls(env, cost_model=cm, tp=ro.tp, episodes=drawn[i::ro.dp], clock=clock,
                        max_num_seqs=sc.max_num_seqs, fine=self.fine, log=self.log,
                        name=f"replica{i}") for i in range(ro.dp)]
        yield env.all_of([r.process for r in reps])
        t_end = max(r.stats.t_end for r in reps)
        if t_end > env.now:
            yield env.timeout(t_end - env.now)
        rollout_s = env.now - t0
        oom_ids = {i for r in reps for i in r.stats.oom_episodes}
        done = [e for e in drawn if e.id not in oom_ids]
        for i, r in enumerate(reps):
            st = r.stats
            self.events += st.events
            self._span("rollout", "rollout", i * ro.tp, t0, max(st.t_end, t0), step,
                       tokens=st.generated_tokens,
                       args={"plan": ro.describe(), "preemptions": st.preemptions,
                             "evictions": st.evictions, "oom": len(st.oom_episodes),
                             "peak_kv_tokens": st.peak_kv_tokens, "busy_s": st.busy_s})
        peak_kv = max(r.stats.peak_kv_tokens for r in reps)
        ro_mem = cm.memory("decode", ro, ro.dp, max(peak_kv, 1))
        row.update(rollout_oom=len(oom_ids), preemptions=sum(r.stats.preemptions for r in reps),
                   evictions=sum(r.stats.evictions for r in reps),
                   generated_tokens=sum(r.stats.generated_tokens for r in reps),
                   recompute_tokens=sum(r.stats.recompute_tokens for r in reps),
                   kv_capacity_tokens=reps[0].cap, peak_kv_tokens=peak_kv,
                   headroom_rollout=ro_mem.headroom_frac)
        for g in self.cluster.gpus:
            g.hold("rollout", ro_mem.total)

        # 3. experience preparation
        ex_oom = tr_oom = 0
        experience_s = dispatch_s = train_s = reshard_s = 0.0
        ex = self.plans[Stage.EXPERIENCE]
        tr = self.plans[Stage.TRAIN]
        trained: list[Episode] = []
        if done:
            stats = Workload.stats(done, step=step, max_context=sc.workload.max_context)
            ex = self._select(Stage.EXPERIENCE, stats, step)
            reshard_s += yield from self._reshard("re-shard train->experience", "reshard",
                                                  self.train_layout, ex, step)
            fit = self.max_fit_context("logprob", ex)
            kept = [e for e in done if e.context_tokens <= fit]
            ex_oom = len(done) - len(kept)
            if kept:
                cost = self.stage_cost("logprob", ex, kept)
                t0 = env.now
                yield env.timeout(cost.time_s)
                self.events += 1
                experience_s = cost.time_s
                self._group_spans("log-probs", "experience", ex, cost, t0, step)
                row["headroom_experience"] = self._headroom[Stage.EXPERIENCE] = cost.headroom_frac
                for g in self.cluster.gpus:
                    g.hold("experience", cost.memory_bytes)

                # 4. training plan, optimizer re-shard, dispatch, optimizer step
                tr = self._select(Stage.TRAIN, stats, step)
                reshard_s += yield from self._reshard("re-shard optimizer", "reshard",
                                                      self.train_layout, tr, step,
                                                      include_optimizer=True)
                self.train_layout = tr
                fit = self.max_fit_context("train", tr)
                trained = [e for e in kept if e.context_tokens <= fit]
                tr_oom = len(kept) - len(trained)
                dispatch_s = yield from self._dispatch(ex, tr, kept, trained, step)
                if trained:
                    cost = self.stage_cost("train", tr, trained)
                    t0 = env.now
                    yield env.timeout(cost.time_s)
                    self.events += 1
                    train_s = cost.time_s
                    self._group_spans("train step", "train", tr, cost, t0, step)
                    row["headroom_train"] = self._headroom[Stage.TRAIN] = cost.headroom_frac
                    for g in self.cluster.gpus:
                        g.hold("train", cost.memory_bytes)
            self._stats = stats

        oom_events = len(oom_ids) + ex_oom + tr_oom
        restart_s = 0.0
        if oom_events and sc.oom_restart_s > 0:
            # an OOM kills the job: it restarts from the last checkpoint before going on
            t0 = env.now
            yield env.timeout(sc.oom_restart_s)
            restart_s = sc.oom_restart_s
            self._span("restart after OOM", "other", 0, t0, env.now, step, args={"oom_events": oom_events})
        step_s = env.now - t_step
        trained_tokens = sum(e.context_tokens for e in trained)
        ctx = np.array([e.context_tokens for e in drawn] or [0])
        heads = [row.get(k) for k in ("headroom_rollout", "headroom_experience", "headroom_train")]
        row.update(
            step_time_s=step_s, rollout_s=rollout_s, experience_s=experience_s,
            dispatch_s=dispatch_s, train_s=train_s, reshard_s=reshard_s, sync_s=sync_s,
            experience_oom=ex_oom, train_oom=tr_oom, oom_events=oom_events, restart_s=restart_s,
            trained_episodes=len(trained), trained_tokens=trained_tokens,
            throughput_tokens_per_gpu_s=trained_tokens / step_s / self.gpus if step_s > 0 else 0.0,
            generated_tokens_per_gpu_s=row["generated_tokens"] / step_s / self.gpus if step_s else 0.0,
            context_mean=float(ctx.mean()), context_p95=float(np.percentile(ctx, 95)),
            context_max=int(ctx.max()),
            headroom_min=min(h for h in heads if h is not None),
            plan_rollout=ro.describe(), plan_experience=ex.describe(), plan_train=tr.describe(),
            sim_time_s=env.now)
        row.setdefault("headroom_experience", None)
        row.setdefault("headroom_train", None)
        self.rows.append(row)

    def _group_spans(self, name: str, stage: str, plan: ParallelPlan, cost: StageCost, t0: float,
                     step: int) -> None:
        """One span per dp group, as long as its share of the tokens makes it."""
        top = max(cost.group_tokens) or 1
        for d, tokens in enumerate(cost.group_tokens):
            self._span(name, stage, d * plan.model_parallel, t0, t0 + cost.time_s * tokens / top,
                       step, tokens=tokens, args={"plan": plan.describe()})

    def _dispatch(self, ex: ParallelPlan, tr: ParallelPlan, kept: list[Episode],
                  trained: list[Episode], step: int):
        """SimPy process: price the dispatcher's TransferPlan (the cost model's one dispatch
        price) and hold the step for it; returns seconds."""
        if not trained:
            return 0.0
        keep = {e.id for e in trained}
        samples = [Sample(e.id, e.context_tokens) for e in kept if e.id in keep]
        src_assign, _ = balance_samples(samples, ex.dp)
        # training groups keep producers' samples where balance allows (fewer, local transfers)
        dst_assign, _ = balance_aligned(samples, tr.dp, src_assign)
        src = Layout(ex, tuple(tuple(g) for g in src_assign))
        dst = Layout(tr, tuple(tuple(g) for g in dst_assign))
        tplan = self.dispatcher.plan(src, dst, samples)
        t0 = self.env.now
        # the one dispatch price (earl.cost_model.dispatch): links, host paths, advantages,
        # metadata and planning, on the same plan the runtime would execute
        est = price_transfer_plan(self.cm, tplan, samples=len(samples), producers=ex.dp,
                                  world=max(ex.world_size, tr.world_size), plan=tr)
        self.events += 1
        yield self.env.timeout(est.time_s)
        self._span(f"dispatch ({tplan.kind})", "dispatch", tplan.controller, t0, self.env.now, step,
                   bytes=tplan.total_bytes,
                   args={"transfers": len(tplan.transfers), "phases": len(tplan.phases),
                         "metadata_bytes": tplan.metadata_bytes, "reduce_bytes": tplan.reduce_bytes,
                         "breakdown_s": est.breakdown})
        return self.env.now - t0
