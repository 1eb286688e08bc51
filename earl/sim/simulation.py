"""The simulated RL iteration: select -> sync -> rollout -> experience -> dispatch -> train.

One `Simulation` runs one (selector, dispatcher) pair over the scenario's steps on a SimPy
clock. Its stage services (`begin_step`, `select`, `reshard`, `play`, `learn`, `finish_step`)
have two clients: the synchronous scheduler here (`_step`) and the asynchronous one
(earl/sim/async_rl.py). Each step walks the iteration the runtime walks (ARCHITECTURE.md),
calling the selector at the same points with the same statistics; rollout runs one
continuous-batching `Replica` per rollout dp group, experience and training are priced by the
cost model, and the dispatcher's TransferPlan by the one dispatch price. The four steps in
detail, length buckets and OOM events: docs/simulator.md, "Design notes".

    python -c "from earl.sim.simulation import Simulation; from earl.sim.scenario import load_scenario; \
s = Simulation(load_scenario(None, {'scenario.steps': '2'}), 'static', 'centralized'); s.run(); print(s.rows[-1])"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import simpy

from earl.cost_model import CostModel
from earl.cost_model.dispatch import price_transfer_plan
from earl.cost_model.model import SHARE_MIN_FRAC
from earl.cost_model.profile import load_profile
from earl.policies import Layout, Sample, balance_aligned, make_dispatcher, make_selector
from earl.policies.balance import assignment_of, balance_samples, balance_tokens, imbalance_ratio
from earl.policies.dispatch_cost import dispatch_layouts
from earl.specs import ParallelPlan, Stage, WorkloadStats
from earl.trace import Span

from .async_rl import ASYNC_FEEDS, choose_split, run_async
from .cluster import Cluster
from .replica_classes import ReplicaChoice, choose_replicas, deal, kv_drops, scaled
from .rollout_engine import AffineCache, DecodeClock, Replica, TurnSyncReplica
from .scenario import Scenario
from .workload import Draw, Workload, stats_of

MAX_BUCKETS = 8  # length buckets a mixed batch is priced in
DISPATCH_CONTEXT_QUANTUM = 1024  # tokens: aggregated mode prices a what-if plan at the mean context rounded up to this
DISPATCH_WIDE_TOKENS = 1 << 15  # context (tokens) up to which the what-if dispatch price is first checked affine
HEAD_ON = ("all", "generated")  # positions that get LM-head logits in log-prob / train passes
ENGINES = ("continuous", "turn-sync")  # rollout engine models: vLLM-like, or the PyTorch runtime's
# where a dispatch places the training samples: token-balanced keeping each experience group's
# samples together (balance_aligned, the default), or token-balanced alone (balance_samples, the
# PyTorch runtime's earl.runtime.step.train)
TRAIN_PLACEMENTS = ("aligned", "balanced")


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
                 padded: bool = False, token_budget: int = 0, fsdp: bool = False, handoff: bool = False,
                 head_on: str = "all", train_placement: str = "aligned", async_feed: str = "stream",
                 rollout_cost_model: CostModel | None = None, stat_reductions: int = 1, prompt_group: int = 0,
                 estimator: str | None = None, kv_round: int = 0):
        # `engine` "turn-sync", `padded` and `token_budget` model the single-process PyTorch
        # runtime for `earl validate`: its engine plays turns in lockstep (sim.rollout_engine.
        # TurnSyncReplica); its log-prob / train micro-batches are right-padded to their longest
        # sequence and packed up to `token_budget` padded tokens (CostModel.mixed_batch); `fsdp`:
        # its `zero` plans with dp > 1 run FSDP2, weights sharded too (CostModel.train, .reshard);
        # `handoff`: its experience stage first moves the episodes from the rollout replicas to the
        # experience layout through the dispatcher (`_handoff`); `head_on` "generated": its LM
        # head runs on the generated (trained) positions only; `train_placement` "balanced": a
        # dispatch places the training samples as the runtime does (TRAIN_PLACEMENTS), and with
        # `handoff` it starts from the hand-off's experience layout, where the runtime's samples are;
        # `rollout_cost_model` (async only): the rollout pool's own prices where its devices differ
        # from the training pool's (slower ones, or a smaller share of a CPU host's cores:
        # earl.calibrate.validate_async); None: `cost_model`'s. `stat_reductions`: the reductions
        # a dispatch's advantage statistics take (earl.runtime.advantages.AdvantageSpec.reductions:
        # two for a per-turn baseline; 0 where a group estimator computes them from the rewards
        # the metadata all-gather gave every rank: no statistics reduce and none of its rounds);
        # `estimator`: the advantage estimator a dispatch computes (AdvantageSpec.key, priced by
        # HardwareProfile.advantage_s; None: dispatch_path.sample_s);
        # `prompt_group` > 1: episodes id // prompt_group share their prompt (a GRPO group): the
        # rollout engine prefills it once per group among the members it admits together
        # (`Replica`; not the turn-sync engine), and the log-prob and training forwards run it
        # once per group (`_shared_cost`; the runtime's trainer does so where its parameters are
        # plain tensors: a one-device plan here, no FSDP2 / DTensor); `kv_round` > 0: the
        # rollout engine's decode rows each attend the longest one's length rounded up to it
        # (the runtime engine's slot cache: sim.rollout_engine.Replica; 0: their own contexts)
        if not isinstance(kv_round, int) or kv_round < 0:
            raise ValueError(f"kv_round must be an int >= 0 (0: each row its own context), got {kv_round!r}")
        self.kv_round = kv_round
        if not isinstance(stat_reductions, int) or stat_reductions < 0:
            raise ValueError(f"stat_reductions must be an int >= 0 (0: statistics from the rewards), "
                             f"got {stat_reductions!r}")
        if engine not in ENGINES:
            raise ValueError(f"unknown rollout engine model {engine!r}; valid: {', '.join(ENGINES)}")
        if async_feed not in ASYNC_FEEDS:  # async mode: "per-step" models the runtime's replicas
            raise ValueError(f"unknown async_feed {async_feed!r}; valid: {', '.join(ASYNC_FEEDS)}")
        self.async_feed = async_feed
        if train_placement not in TRAIN_PLACEMENTS:
            raise ValueError(f"unknown train_placement {train_placement!r}; valid: {', '.join(TRAIN_PLACEMENTS)}")
        self.train_placement = train_placement
        self._exp_assign: tuple | None = None  # this step's hand-off destination (experience layout)
        self._handoff_waited = False  # whether this step's hand-off ran the executor's rounds
        if head_on not in HEAD_ON:
            raise ValueError(f"unknown head_on {head_on!r}; valid: {', '.join(HEAD_ON)}")
        self.head_on = head_on
        self._head_frac: float | None = None  # this step's generated / context tokens (head_on "generated")
        self.replica_cls = TurnSyncReplica if engine == "turn-sync" else Replica
        self.padded = padded
        self.token_budget = token_budget
        self.fsdp = fsdp
        self.handoff = handoff
        self.wake_s = 0.0  # the part of the last re-shard that waits on ranks asleep in it (`reshard`)
        self.stat_reductions = stat_reductions
        self.estimator = estimator
        if not isinstance(prompt_group, int) or prompt_group < 0:
            raise ValueError(f"prompt_group must be an int >= 0 (0: no shared prompts), got {prompt_group!r}")
        self.prompt_group = prompt_group
        self._prompt_of: dict[int, int] = {}  # this step's episode id -> prompt tokens (`prompt_group`)
        self.sc = scenario
        self.env = simpy.Environment()
        if cost_model is None:
            profile = load_profile(scenario.profile) if scenario.profile else None
            cost_model = CostModel(scenario.model_spec(), scenario.cluster_spec(), profile)
        self.cm = cost_model
        if rollout_cost_model is not None and scenario.mode != "async":
            raise ValueError(f"rollout_cost_model prices an async run's rollout pool; mode is {scenario.mode!r}")
        self.rollout_cm = rollout_cost_model or cost_model
        self.cluster = Cluster(self.env, cost_model.cluster, cost_model)
        self.gpus = self.cluster.num_gpus
        self.workload = Workload(scenario.workload_spec(), seed=scenario.seed,
                                 compact_above=scenario.compact_draw_above)
        self.split = None  # async with schedule.rollout_gpus = 0: the cost model's PoolSplit
        if scenario.mode == "async" and not scenario.rollout_gpus:
            self.split = choose_split(scenario, cost_model, self.workload)
        pools = scenario.pool_gpus(self.split.rollout_gpus if self.split else None)
        self.stage_gpus = {s: pools[s.value] for s in Stage}  # GPUs each stage runs on
        self.initial = scenario.stage_plan(pools["rollout"])
        self.selector_name, self.dispatcher_name = selector, dispatcher
        self.label = f"{selector}/{dispatcher}"
        # async: the rollout plan stays (engines stream); the selector plans the training pool
        planned = self.initial if scenario.mode == "sync" else \
            dataclasses.replace(self.initial, rollout=scenario.open_plans().rollout)
        self.selector = make_selector(selector, cost_model=cost_model, initial=planned,
                                      stage_gpus=pools["train"], logprob_passes=scenario.logprob_passes)
        self.dispatcher = make_dispatcher(dispatcher)
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
        self._placements: dict = {}  # this step's balance_tokens results
        self._what_if: dict = {}  # what-if dispatches priced: (key, context) -> (seconds, bytes)
        wide = max(scenario.workload.max_context, DISPATCH_WIDE_TOKENS)
        self._dispatch_s = AffineCache(self._what_if_dispatch_s, wide_hi=wide)
        self._dispatch_bytes = AffineCache(self._what_if_dispatch_bytes, wide_hi=wide)
        if self.split is not None:
            sp = self.split
            self.decisions.append({
                "policy": self.label, "step": 0, "stage": "pools", "switched": False,
                "plan": f"rollout {sp.rollout_gpus} GPUs / train {sp.train_gpus} GPUs",
                "reason": f"cost model: slower pool {sp.period_s:.1f} s over the batches priced (rollout "
                          f"{sp.rollout_s:.1f} s, log-probs + train {sp.train_s:.1f} s), fastest of "
                          f"{len(sp.table)} splits"})

    # ---- stage services: the sync scheduler (`_step`) and the async one (earl/sim/async_rl.py)
    # both call these: begin_step, select, reshard, play, learn (experience, dispatch, train),
    # finish_step, step_done, span
    def begin_step(self) -> None:
        """Forget the previous step's placements and hand-off."""
        self._placements = {}
        self._exp_assign = None
        self._handoff_waited = False

    def clock(self, tp: int) -> DecodeClock:
        if tp not in self._clocks:
            self._clocks[tp] = DecodeClock(self.cm, tp, exact=self.fine)
        return self._clocks[tp]

    def span(self, name: str, stage: str, rank: int, t0: float, t1: float, step: int, **kw) -> None:
        self.spans.append(Span(name=name, stage=stage, rank=rank, t_start=t0, t_end=t1, step=step, **kw))

    def select(self, stage: Stage, stats: WorkloadStats, step: int) -> ParallelPlan:
        # the headroom this stage's plan left last time it ran (what the runtime measures); the
        # rollout engine fills its KV cache by design, so rollout reports none
        stats = dataclasses.replace(stats, memory_headroom_frac=self._headroom.get(stage))
        dec = self.selector.select(stage, stats, self.plans[stage])
        plan = dec.plan.resolve(self.stage_gpus[stage])
        now = self.env.now
        self.decisions.append({"policy": self.label, "step": step, "stage": stage.value,
                               "plan": plan.describe(), "switched": dec.switched, "reason": dec.reason})
        self.span(f"select {stage.value}", "select", 0, now, now, step,
                   args={"plan": plan.describe(), "switched": dec.switched, "reason": dec.reason})
        self.plans[stage] = plan
        return plan

    def reshard(self, name: str, stage: str, src: ParallelPlan, dst: ParallelPlan, step: int,
                 include_optimizer: bool = False):
        """SimPy process: charge a weight (and optimizer) re-shard; returns its seconds."""
        self.wake_s = 0.0  # the part of the last re-shard that waits on ranks asleep in it
        if src == dst:
            return 0.0
        # the runtime's ranks come to it from other work (CostModel.sync_wake_s)
        est = self.cm.reshard(src, dst, include_optimizer=include_optimizer, fsdp=self.fsdp, asleep=True)
        self.wake_s = est.breakdown.get("wake", 0.0)
        t0 = self.env.now
        yield self.env.timeout(est.time_s)
        self.events += 1
        self.span(name, stage, 0, t0, self.env.now, step,
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

    def _balance(self, dp: int, ids: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token-balanced placement (`balance_tokens`) of samples on `dp` groups: (group of each
        sample, tokens per group); memoised for the step (log-probs, training and dispatch often
        place the same samples on the same dp)."""
        key = (dp, ids.tobytes())
        if key not in self._placements:
            self._placements[key] = balance_tokens(tokens, dp, ids)
        return self._placements[key]

    def stage_cost(self, stage: str, plan: ParallelPlan, ids: np.ndarray, tokens: np.ndarray) -> StageCost:
        """Price log-probs ('logprob') or one optimizer step ('train') of a mixed-length batch
        (`tokens[i]`: context tokens of sample `ids[i]`)."""
        longest, total = int(tokens.max()), int(tokens.sum())
        # a sample stands for the batch: its samples are balanced on as many dp groups as hold
        # that many in the whole batch, each length counts `weight` times, and the lengths are
        # scaled to the batch's own token total (the sample gives the shape, the batch the mean)
        ids, tokens, weight = self.priced_sample(ids, tokens)
        owner, loads = self._balance(max(1, round(plan.dp / weight)), ids, tokens)
        imbalance = imbalance_ratio(loads.tolist())
        passes = self.sc.logprob_passes if stage == "logprob" else 1
        # token-budget packing: each dp group packs the sequences the placement gave it
        groups = [np.sort(tokens[owner == d]).tolist() for d in range(plan.dp)] if self.token_budget else None
        lengths = np.sort(tokens)
        if weight != 1.0:
            edges = np.rint(np.arange(len(lengths) + 1) * weight).astype(np.int64)
            lengths = np.repeat(lengths, np.diff(edges))
            lengths = np.maximum(np.rint(lengths * (total / lengths.sum())), 1).astype(np.int64)
        shared = self._shared_cost(stage, plan, ids, tokens, passes) if weight == 1.0 else None
        if shared is None:
            est = self.cm.mixed_batch(stage, plan, lengths, buckets=MAX_BUCKETS, passes=passes,
                                      imbalance=imbalance, padded=self.padded, token_budget=self.token_budget,
                                      groups=groups, fsdp=self.fsdp, head_frac=self._head_frac)
            assert est.feasible, f"{stage} {plan.describe()} infeasible at {longest} tokens after OOM filter"
        mem = self.cm.memory(stage, plan, plan.dp, longest)
        return StageCost(time_s=est.time_s if shared is None else shared, memory_bytes=mem.total,
                         headroom_frac=mem.headroom_frac, imbalance=imbalance,
                         group_tokens=tuple(loads.tolist()))

    def _shared_cost(self, stage: str, plan: ParallelPlan, ids: np.ndarray, tokens: np.ndarray,
                     passes: int) -> float | None:
        """Seconds of the stage with each group's prompt run once (`prompt_group`), as the
        runtime's trainer runs it (earl.runtime.trainer._shared_prefixes): a prefix pass over one
        row per group (the tokens before the first position that gets logits: the prompt less
        one), then every row's suffix attending to it, both right-padded, their host work once.
        None where the runtime would not share: no `prompt_group`, one process's plan only
        (dp = tp = 1), logits on every position (`head_on` "all"), or under SHARE_MIN_FRAC of the
        tokens saved."""
        if self.prompt_group < 2 or plan.world_size != 1 or self._head_frac is None or not self._prompt_of:
            return None
        prefix = np.array([max(0, min(self._prompt_of.get(int(i), 0) - 1, int(n) - 1))
                           for i, n in zip(ids, tokens, strict=True)], dtype=np.int64)
        group = ids // self.prompt_group
        leaders = {}
        for g, p in zip(group.tolist(), prefix.tolist(), strict=True):
            leaders[g] = max(leaders.get(g, 0), p)
        lead = np.array([p for p in leaders.values() if p > 0], dtype=np.int64)
        if not lead.size or prefix.sum() - lead.sum() < SHARE_MIN_FRAC * tokens.sum():
            return None
        suffix = np.sort(tokens - prefix)
        heads = self._head_frac * float(tokens.sum())  # the positions that get logits: all in the suffixes
        kw = dict(buckets=MAX_BUCKETS, passes=passes, padded=self.padded, token_budget=self.token_budget,
                  fsdp=self.fsdp)
        rest = self.cm.mixed_batch(stage, plan, suffix, head_frac=min(1.0, heads / max(1.0, float(suffix.sum()))),
                                   **kw)
        pre = self.cm.mixed_batch(stage, plan, np.sort(lead), head_frac=0.0, **kw)
        once = "grad_sync_optimizer" if stage == "train" else "host"
        return rest.time_s + pre.time_s - pre.breakdown[once]

    def _prompt_stats(self, drawn: Draw, step: int) -> WorkloadStats:
        """What is known before the first rollout: the prompts."""
        n = len(drawn.ids)
        return stats_of(drawn.prompts, np.ones(n, np.int64), np.zeros(n, np.int64), step=step,
                        max_context=self.sc.workload.max_context)

    def aggregated(self, episodes: int) -> bool:
        """Replica classes for a step of `episodes` episodes (see earl/sim/replica_classes.py)."""
        return not self.sc.exact and episodes > self.sc.exact_up_to

    def priced_sample(self, ids: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """The samples a stage is priced on and how many of the batch each stands for: with
        replica classes, a batch of more than `engine.sample_episodes` is priced on an evenly
        strided sample of about that many (its samples are i.i.d. draws), else on all of it."""
        m = self.sc.sample_episodes
        if self.token_budget or len(ids) <= m or not self.aggregated(len(ids)):
            return ids, tokens, 1.0
        stride = -(-len(ids) // m)
        ids_s, tok_s = ids[::stride], tokens[::stride]
        return ids_s, tok_s, len(ids) / len(ids_s)

    # ---- the iteration ----------------------------------------------------------------------
    def run(self) -> Simulation:
        self.env.process(run_async(self) if self.sc.mode == "async" else self._loop())
        self.env.run()
        return self

    def _loop(self):
        for step in range(self.sc.steps):
            yield from self._step(step)
            self.step_done(step)

    def step_done(self, step: int) -> None:
        if self.progress is not None:
            self.progress(self, step)

    def _step(self, step: int):
        """One synchronous step: every stage in turn on the whole cluster (the sync scheduler)."""
        env = self.env
        t_step = env.now
        self.begin_step()
        drawn = self.workload.draw(step)
        drawn = drawn.rows(drawn.turns > 0)
        n = len(drawn.ids)
        if self.prompt_group > 1:
            self._prompt_of = dict(zip(drawn.ids.tolist(), drawn.prompts.tolist(), strict=True))
        aggregated = self.aggregated(n)
        stats_before = self._stats or self._prompt_stats(drawn, step)
        row: dict = {"episodes": n, "truncated_episodes": int(drawn.truncated.sum())}

        # 1. rollout plan, weight sync from the training layout
        ro = self.select(Stage.ROLLOUT, stats_before, step)
        row["sync_s"] = yield from self.reshard("weight sync", "sync", self.train_layout, ro, step)
        # its part that waits on ranks asleep (CostModel.sync_wake_s): not stretched by host load
        row["sync_wake_s"] = self.wake_s

        # 2. rollout
        t0 = env.now
        rollout = yield from self.play(ro, drawn, aggregated, step)
        row["rollout_s"] = env.now - t0
        done = ~rollout.pop("dropped")
        row.update(rollout)
        ro_mem = self.cm.memory("decode", ro, ro.dp, max(row["peak_kv_tokens"], 1))
        row["headroom_rollout"] = ro_mem.headroom_frac
        self.cluster.hold_all("rollout", ro_mem.total)

        # 3.-4. experience preparation, dispatch, training
        yield from self.learn(drawn.ids[done], drawn.context[done], drawn.turns[done],
                               drawn.generated[done], step, row, aggregated)
        yield from self.finish_step(row, ro, drawn.context, t_step, step)

    def learn(self, ids: np.ndarray, ctx: np.ndarray, turns: np.ndarray, generated: np.ndarray,
               step: int, row: dict, aggregated: bool):
        """SimPy process: log-probs, dispatch and the optimizer step on the rolled-out episodes
        (`ctx[i]` context tokens of episode `ids[i]`); fills the row's stage columns."""
        row.update(experience_oom=0, train_oom=0, experience_s=0.0, dispatch_s=0.0, train_s=0.0,
                   reshard_s=0.0, trained_tokens=0, trained_episodes=0,
                   plan_experience=self.plans[Stage.EXPERIENCE].describe(),
                   plan_train=self.plans[Stage.TRAIN].describe())
        if not len(ids):
            return
        stats = stats_of(ctx, turns, generated, step=step, max_context=self.sc.workload.max_context)
        ex = self.select(Stage.EXPERIENCE, stats, step)
        row["plan_experience"] = ex.describe()
        row["reshard_s"] += yield from self.reshard("re-shard train->experience", "reshard",
                                                     self.train_layout, ex, step)
        keep = ctx <= self.max_fit_context("logprob", ex)
        if self.head_on == "generated":
            self._head_frac = min(1.0, float(generated[keep].sum()) / max(1.0, float(ctx[keep].sum())))
        row["experience_oom"] = int((~keep).sum())
        ids, ctx = ids[keep], ctx[keep]
        self._stats = stats
        if not len(ids):
            return
        yield from self._run_stage(Stage.EXPERIENCE, ex, ids, ctx, step, row, aggregated)
        if self.handoff:
            row["experience_s"] += yield from self._handoff(self.plans[Stage.ROLLOUT], ex, ids, ctx, step)

        tr = self.select(Stage.TRAIN, stats, step)
        row["plan_train"] = tr.describe()
        row["reshard_s"] += yield from self.reshard("re-shard optimizer", "reshard", self.train_layout,
                                                     tr, step, include_optimizer=True)
        self.train_layout = tr
        fits = ctx <= self.max_fit_context("train", tr)
        row["train_oom"] = int((~fits).sum())
        row["dispatch_s"] = yield from self._dispatch(ex, tr, ids, ctx, fits, step, aggregated)
        if fits.any():
            yield from self._run_stage(Stage.TRAIN, tr, ids[fits], ctx[fits], step, row, aggregated)
            row.update(trained_tokens=int(ctx[fits].sum()), trained_episodes=int(fits.sum()))

    def _run_stage(self, stage: Stage, plan: ParallelPlan, ids: np.ndarray, ctx: np.ndarray, step: int,
                   row: dict, aggregated: bool):
        """SimPy process: log-probs (EXPERIENCE) or the optimizer step (TRAIN) on `plan`."""
        kind, span = ("logprob", "log-probs") if stage is Stage.EXPERIENCE else ("train", "train step")
        cost = self.stage_cost(kind, plan, ids, ctx)
        t0 = self.env.now
        yield self.env.timeout(cost.time_s)
        self.events += 1
        row[f"{stage.value}_s"] = cost.time_s
        self._group_spans(span, stage.value, plan, cost, t0, step, aggregated)
        row[f"headroom_{stage.value}"] = self._headroom[stage] = cost.headroom_frac
        self.cluster.hold_all(stage.value, cost.memory_bytes)

    def finish_step(self, row: dict, ro: ParallelPlan, context: np.ndarray, t_step: float, step: int):
        """SimPy process: an OOM restart if the step had OOM events, then the step's row."""
        env, sc = self.env, self.sc
        oom_events = row["rollout_oom"] + row["experience_oom"] + row["train_oom"]
        restart_s = 0.0
        if oom_events and sc.oom_restart_s > 0:
            # an OOM kills the job: it restarts from the last checkpoint before going on
            t0 = env.now
            yield env.timeout(sc.oom_restart_s)
            restart_s = sc.oom_restart_s
            self.span("restart after OOM", "other", 0, t0, env.now, step, args={"oom_events": oom_events})
        step_s = env.now - t_step
        ctx = context if len(context) else np.zeros(1, np.int64)
        heads = [row.get(k) for k in ("headroom_rollout", "headroom_experience", "headroom_train")]
        row.update(
            policy=self.label, selector=self.selector_name, dispatcher=self.dispatcher_name, step=step,
            step_time_s=step_s, oom_events=oom_events, restart_s=restart_s,
            throughput_tokens_per_gpu_s=row["trained_tokens"] / step_s / self.gpus if step_s > 0 else 0.0,
            generated_tokens_per_gpu_s=row["generated_tokens"] / step_s / self.gpus if step_s else 0.0,
            context_mean=float(ctx.mean()), context_p95=float(np.percentile(ctx, 95)),
            context_max=int(ctx.max()),
            headroom_min=min(h for h in heads if h is not None),
            plan_rollout=ro.describe(), sim_time_s=env.now, rollout_gpus=self.stage_gpus[Stage.ROLLOUT])
        row.setdefault("staleness_mean", 0.0)
        row.setdefault("staleness_max", 0)
        row.setdefault("headroom_experience", None)
        row.setdefault("headroom_train", None)
        self.rows.append(row)

    def play(self, ro: ParallelPlan, drawn: Draw, aggregated: bool, step: int):
        """SimPy process: the rollout on `ro.dp` replicas (every one, or the classes of
        earl/sim/replica_classes.py); returns the row's rollout columns plus `dropped` (per episode)."""
        env, cm, sc = self.env, self.cm, self.sc
        t0 = env.now
        clock = self.clock(ro.tp)
        per_replica = min(-(-len(drawn.ids) // ro.dp), sc.max_num_seqs)
        mean_ctx = float(drawn.context.mean()) if len(drawn.ids) else 0.0
        if aggregated:
            choice = choose_replicas(drawn, ro.dp, clock.step(per_replica, per_replica * mean_ctx / 2))
        else:
            every = tuple(range(ro.dp))
            choice = ReplicaChoice(simulated=every, representatives=every, replicas=ro.dp)
        reps = {i: self.replica_cls(env, cost_model=cm, tp=ro.tp, episodes=deal(drawn, ro.dp, i).episodes(),
                                    clock=clock, max_num_seqs=sc.max_num_seqs, fine=self.fine,
                                    log=self.log, name=f"replica{i}", prompt_group=self.prompt_group,
                                    kv_round=self.kv_round)
                for i in choice.simulated}
        yield env.all_of([r.process for r in reps.values()])
        t_end = max(r.stats.t_end for r in reps.values())
        if t_end > env.now:
            yield env.timeout(t_end - env.now)
        for i, r in reps.items():
            st = r.stats
            self.events += st.events
            self.span("rollout", "rollout", i * ro.tp, t0, max(st.t_end, t0), step,
                       tokens=st.generated_tokens,
                       args={"plan": ro.describe(), "preemptions": st.preemptions,
                             "evictions": st.evictions, "oom": len(st.oom_episodes),
                             "peak_kv_tokens": st.peak_kv_tokens, "busy_s": st.busy_s,
                             "class": "every replica" if choice.all else
                             ("representative" if i in choice.representatives else "straggler")})
        cap = next(iter(reps.values())).cap
        if choice.all:
            oom_ids = [e for r in reps.values() for e in r.stats.oom_episodes]
            dropped = np.isin(drawn.ids, oom_ids)
            generated = sum(r.stats.generated_tokens for r in reps.values())
        else:
            dropped, gen = kv_drops(drawn, cap)
            generated = int(gen.sum())
        sample = [reps[i].stats for i in choice.representatives]
        return {"dropped": dropped, "rollout_oom": int(dropped.sum()),
                "preemptions": scaled(sum(st.preemptions for st in sample), choice),
                "evictions": scaled(sum(st.evictions for st in sample), choice),
                "recompute_tokens": scaled(sum(st.recompute_tokens for st in sample), choice),
                "generated_tokens": generated, "kv_capacity_tokens": cap,
                "peak_kv_tokens": max(r.stats.peak_kv_tokens for r in reps.values()),
                "replicas_simulated": len(reps)}

    def _group_spans(self, name: str, stage: str, plan: ParallelPlan, cost: StageCost, t0: float,
                     step: int, aggregated: bool = False) -> None:
        """One span per dp group, as long as its share of the tokens makes it (aggregated: the
        slowest group's only)."""
        top = max(cost.group_tokens) or 1
        groups = [cost.group_tokens.index(top)] if aggregated else range(len(cost.group_tokens))
        for d in groups:
            tokens = cost.group_tokens[d]
            self.span(name, stage, d * plan.model_parallel, t0, t0 + cost.time_s * tokens / top,
                       step, tokens=tokens, args={"plan": plan.describe()})

    def _priced(self, tplan):
        """The dispatch plan as the modelled runtime executes it: its statistics in
        `stat_reductions` reductions (TransferPlan.reductions), none where there are none."""
        if not self.stat_reductions:
            return dataclasses.replace(tplan, reduce_bytes=0)
        return dataclasses.replace(tplan, reductions=self.stat_reductions)

    def what_if_dispatch(self, src: ParallelPlan, dst: ParallelPlan, samples: int, context: int
                         ) -> tuple[float, float]:
        """(seconds, moved bytes) of the what-if dispatch of `samples` samples of `context`
        tokens (`estimate_dispatch`'s price). Every sample's bytes grow with its context, so both
        are affine in it above a floor of fixed costs: priced at a few contexts, the line checked
        at the midpoint (`AffineCache`), then read off it; priced directly where it is not affine."""
        key = (src, dst, samples)
        return self._dispatch_s(key, context), self._dispatch_bytes(key, context)

    def _what_if_dispatch(self, key: tuple, context: int) -> tuple[float, float]:
        """(seconds, moved bytes) of the dispatcher's plan for a what-if batch
        (`dispatch_layouts`), memoised (the plans themselves are large and not kept)."""
        if (key, context) not in self._what_if:
            src, dst, n = key
            samples, s_layout, d_layout = dispatch_layouts(src, dst, n, context)
            tplan = self._priced(make_dispatcher(self.dispatcher_name).plan(s_layout, d_layout, samples))
            est = price_transfer_plan(self.cm, tplan, samples=n, producers=src.dp,
                                      world=max(src.world_size, dst.world_size), plan=dst,
                                      cold=self.sc.logprob_passes > 0, estimator=self.estimator,
                                      host_factor=self.cm.host_cold_factor(src),  # as `_dispatch`
                                      lead_s=self.cm.dispatch_lead_s(dst, n, n * context, self.fsdp))
            self._what_if[(key, context)] = est.time_s, float(est.extras.get("moved_bytes", 0))
        return self._what_if[(key, context)]

    def _what_if_dispatch_s(self, key: tuple, context: float) -> float:
        """The what-if dispatch price (seconds) of `key` = (src plan, dst plan, samples) at
        `context` tokens per sample. Every sample's bytes grow with the context, so the price is
        affine in it: `_dispatch_s` (an AffineCache) prices a few contexts and proves the line."""
        return self._what_if_dispatch(key, int(context))[0]

    def _what_if_dispatch_bytes(self, key: tuple, context: float) -> float:
        return self._what_if_dispatch(key, int(context))[1]

    def _handoff(self, ro: ParallelPlan, ex: ParallelPlan, ids: np.ndarray, tokens: np.ndarray, step: int):
        """SimPy process: the PyTorch runtime's rollout -> experience hand-off (earl.runtime.step.
        experience): the dispatcher's TransferPlan from the rollout replicas (episode i on replica
        i % dp) to the experience layout, priced as the one dispatch price without advantages (the
        hand-off moves tensors only); returns seconds."""
        t0 = self.env.now
        samples = [Sample(i, t) for i, t in zip(ids.tolist(), tokens.tolist(), strict=True)]
        src_assign = tuple(tuple(s.id for s in samples if s.id % ro.dp == d) for d in range(ro.dp))
        dst_assign, _ = balance_aligned(samples, ex.dp, src_assign)
        self._exp_assign = tuple(tuple(g) for g in dst_assign)
        tplan = self.dispatcher.plan(Layout(ro, src_assign), Layout(ex, self._exp_assign), samples)
        est = price_transfer_plan(self.cm, tplan, samples=len(samples), producers=ro.dp,
                                  world=max(ro.world_size, ex.world_size), plan=ex, advantages=False,
                                  host_factor=self.cm.host_cold_factor(ro))
        self.events += 1
        self._handoff_waited = est.extras["waits"]
        yield self.env.timeout(est.time_s)
        # `waits`: the ranks waited for one another (else local copies, each rank's own host work)
        self.span(f"hand-off ({tplan.kind})", "experience", tplan.controller, t0, self.env.now, step,
                   bytes=tplan.total_bytes, args={"transfers": len(tplan.transfers), "waits": est.extras["waits"]})
        return est.time_s

    def _dispatch(self, ex: ParallelPlan, tr: ParallelPlan, ids: np.ndarray, tokens: np.ndarray,
                  fits: np.ndarray, step: int, aggregated: bool = False):
        """SimPy process: price the dispatcher's TransferPlan (the cost model's one dispatch
        price: links, host paths, advantages, metadata and planning, on the plan the runtime
        would execute) and hold the step for it; returns seconds. `ids` / `tokens`: the
        experience batch; `fits`: those the training plan can hold. Aggregated (replica
        classes): the plan of a what-if batch of the same size at the mean context rounded up to
        DISPATCH_CONTEXT_QUANTUM tokens (cached across steps), not the batch's own plan."""
        if not fits.any():
            return 0.0
        t0 = self.env.now
        n = int(fits.sum())
        if aggregated:
            ctx = -(-int(tokens[fits].sum()) // n)
            ctx = -(-ctx // DISPATCH_CONTEXT_QUANTUM) * DISPATCH_CONTEXT_QUANTUM
            time_s, moved = self.what_if_dispatch(ex, tr, n, ctx)
            self.events += 1
            yield self.env.timeout(time_s)
            self.span(f"dispatch ({self.dispatcher_name}, what-if plan)", "dispatch", 0, t0, self.env.now, step,
                      bytes=int(round(moved)), args={"context_tokens": ctx})
            return self.env.now - t0
        kept_ids, kept_tok = ids[fits], tokens[fits]
        samples = [Sample(i, t) for i, t in zip(kept_ids.tolist(), kept_tok.tolist(), strict=True)]
        owner, _ = self._balance(ex.dp, kept_ids, kept_tok)
        src_assign = assignment_of(owner, kept_tok, ex.dp, kept_ids)
        if self.train_placement == "balanced" and self._exp_assign is not None and fits.all():
            src_assign = self._exp_assign  # the runtime's experience layout: the hand-off put them there
        # training groups keep producers' samples where balance allows (fewer, local transfers),
        # or (the runtime's) are token-balanced alone
        dst_assign = balance_samples(samples, tr.dp)[0] if self.train_placement == "balanced" else \
            balance_aligned(samples, tr.dp, src_assign)[0]
        src = Layout(ex, src_assign)
        dst = Layout(tr, tuple(tuple(g) for g in dst_assign))
        tplan = self._priced(self.dispatcher.plan(src, dst, samples))
        # the executor's rounds start warm only right after the hand-off ran them (a hand-off
        # that waited for its peers) with no log-prob pass since; after local copies only, they
        # start as cold as the rollout left them (docs/validate-history.md, twentieth and twenty-third
        # sessions)
        est = price_transfer_plan(self.cm, tplan, samples=len(samples), producers=ex.dp,
                                  world=max(ex.world_size, tr.world_size), plan=tr,
                                  cold=self.sc.logprob_passes > 0 or not self._handoff_waited,
                                  estimator=self.estimator,
                                  host_factor=self.cm.host_cold_factor(ex),  # after the rollout, cold
                                  # its share's batch and the training step's start
                                  lead_s=self.cm.dispatch_lead_s(tr, len(samples), int(kept_tok.sum()), self.fsdp))
        self.events += 1
        yield self.env.timeout(est.time_s)
        self.span(f"dispatch ({tplan.kind})", "dispatch", tplan.controller, t0, self.env.now, step,
                   bytes=tplan.total_bytes,
                   args={"transfers": len(tplan.transfers), "phases": len(tplan.phases),
                         "metadata_bytes": tplan.metadata_bytes, "reduce_bytes": tplan.reduce_bytes,
                         "breakdown_s": est.breakdown})
        return self.env.now - t0

