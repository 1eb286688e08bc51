"""The RL step: one skeleton for one process or many (one process is a world of size 1).

Per step, on every rank (the same points at which the simulator calls the same policies):
1. plans: `selector.select(stage, stats, current)` for rollout, experience and training (and
   scripted switches); a changed, runnable plan is applied in flight (`Worker.switch`);
2. rollout: training weights -> the rollout layout; each rollout replica (dp group) plays its
   share of the episodes, tp peers in lockstep; every episode samples from its own counter-based
   stream, so the tokens do not depend on the world size or the engine batch;
3. metadata: ids, lengths, groups, rewards, outcomes and per-turn counts go to every rank (the
   control plane, earl.runtime.control), and without a KL penalty each episode's REINFORCE++
   statistics (a few sums per turn); token tensors never do;
4. hand-off to experience: the dispatcher's TransferPlan moves each episode's tokens from its
   rollout replica to the experience rank(s) that need them;
5. experience: old log-probs (and reference log-probs with a KL term) of this rank's share, and
   their gap to the engine's sampling log-probs (earl.runtime.mismatch);
6. dispatch to training: the dispatcher's TransferPlan, advantages from per-key scalars (summed
   from the metadata, or reduced once where a KL penalty changed the rewards);
7. training: the loss and the optimizer strategy on this rank's share (a memory-budget check
   first; over budget, re-plan to a sparing plan and retry on the same samples);
8. metrics: rank 0 builds the row from metadata and reduced scalars and gathers the spans.
The stage functions are `select_plans` (1), `play` (2), `prepare_experience` (4-5) and `train`
(6-7); `run_step` calls them in that order. Their spans use earl.specs.STEP_PHASES.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_step.py
"""

from __future__ import annotations

import dataclasses
import itertools
import resource
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from earl.parallel import deal
from earl.policies import Dispatcher, Selector, make_dispatcher, make_selector
from earl.policies.balance import balance_aligned, balance_samples
from earl.policies.types import Layout, Sample
from earl.runtime.advantages import AdvantageSpec, Store, episode_key_sums, summed_stats
from earl.runtime.control import ControlBytes, all_gather_objects, gather_objects, reduce_scalars
from earl.runtime.envs import OUTCOMES, env_options, make_env
from earl.runtime.envs.dataset import LAST_REWARD_ERROR
from earl.runtime.losses import uniform_groups
from earl.runtime.mismatch import SUM_KEYS, mismatch_metrics, mismatch_sums
from earl.runtime.move_samples import HANDOFF_TENSORS, DispatchStats, carry_along, execute_dispatch
from earl.runtime.resolve import parse_schedule, selector_cost_model
from earl.runtime.rollout import Trajectory, rollout
from earl.runtime.run_config import RunConfig
from earl.runtime.seeds import SAMPLE_STREAM, SHUFFLE_STREAM, mix_seed
from earl.runtime.trainer import ExperienceBatch, batch_logprobs, train_step, turn_fields
from earl.runtime.worker import MemoryBudgetExceeded, Worker, runnable, span_start
from earl.specs import STEP_PHASES, ParallelPlan, Stage, WorkloadStats

OUTCOME_RATES = OUTCOMES


@dataclass(frozen=True)
class SampleMeta:
    """What the control plane carries about one episode: no tokens."""

    id: int
    group: int
    tokens: int  # context length
    generated: int  # tokens the model generated
    reward: float
    outcome: str
    actions: int
    invalid: int
    turns: tuple[tuple[int, int, float], ...]  # per turn (observation tokens, generated tokens, env s)
    reward_turns: int  # turns with a reward (Trajectory.step_rewards): the per-turn baseline's keys are below it
    # REINFORCE++: (key, sum, sum of squares, count) this episode adds to the advantage statistics
    # (earl.runtime.advantages.episode_key_sums); None where they are not final at the rollout's end
    key_sums: tuple[tuple[int, float, float, float], ...] | None = None

    @staticmethod
    def of(t: Trajectory, key_sums: tuple[tuple[int, float, float, float], ...] | None = None) -> SampleMeta:
        return SampleMeta(id=t.episode_id, group=t.group_id, tokens=len(t.token_ids),
                          generated=t.generated_tokens, reward=t.reward, outcome=t.outcome,
                          actions=t.actions, invalid=t.invalid_actions,
                          turns=tuple((u.obs_tokens, u.gen_tokens, round(u.env_latency_s, 7)) for u in t.turns),
                          reward_turns=len(t.step_rewards), key_sums=key_sums)


@dataclass
class StepContext:
    """What the step needs besides the worker: the run's policies and the previous statistics."""

    selector: Selector
    dispatcher: Dispatcher
    schedule: tuple[tuple[int, str, str], ...] = ()  # scripted (step, stage, plan) switches
    control: ControlBytes = dataclasses.field(default_factory=ControlBytes)


def workload_stats(meta: list[SampleMeta], step: int, max_context: int) -> WorkloadStats:
    ctx = sorted(m.tokens for m in meta)
    n = len(ctx)
    mean = sum(ctx) / n
    p95 = max(float(ctx[min(n - 1, int(0.95 * n))]), mean)  # a heavy tail can lift the mean above
    return WorkloadStats(step=step, num_responses=n, context_mean=mean, context_p95=p95,
                         context_max=float(ctx[-1]), turns_mean=sum(len(m.turns) for m in meta) / n,
                         response_tokens_mean=sum(m.generated for m in meta) / n, max_context=max_context)


def episode_records(meta: list[SampleMeta]) -> list[dict]:
    """The workload-trace form: per turn [obs_tokens, gen_tokens, env_latency_s]."""
    return [{"id": m.id, "turns": [list(u) for u in m.turns]} for m in meta]


def outcome_metrics(meta: list[SampleMeta]) -> dict:
    n = len(meta)
    rewards = torch.tensor([m.reward for m in meta], dtype=torch.float64)
    actions = sum(m.actions for m in meta)
    turn_ctx = []
    for m in meta:
        ctx = 0
        for obs, gen, _ in m.turns:
            ctx += obs
            turn_ctx.append(ctx)
            ctx += gen
    out = {"episodes": n, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
           "invalid_move_rate": sum(m.invalid for m in meta) / max(actions, 1),
           "turns_mean": sum(len(m.turns) for m in meta) / n,
           "context_mean": sum(m.tokens for m in meta) / n, "context_max": max(m.tokens for m in meta),
           "turn_context_mean": sum(turn_ctx) / max(len(turn_ctx), 1),
           "gen_tokens_mean": sum(m.generated for m in meta) / n, "tokens": sum(m.tokens for m in meta)}
    for o in OUTCOME_RATES:
        out[f"{o}_rate"] = sum(m.outcome == o for m in meta) / n
    return out


_REPORTED: set[str] = set()


def check_reward_errors(cfg, meta: list[SampleMeta], step: int) -> None:
    """Stop the run (ValueError: exit code 2) when the step's reward_error_rate reaches
    env.max_reward_error_rate, rather than train on zeros; every rank sees the same episodes."""
    bad = sum(m.outcome == "reward_error" for m in meta)
    if not bad:
        return
    last = LAST_REWARD_ERROR.get(cfg.env.reward, "on another rank")
    if bad / len(meta) < cfg.env.max_reward_error_rate:
        if last not in _REPORTED and len(_REPORTED) < 8:  # each distinct failure once per process
            _REPORTED.add(last)
            print(f"earl run: step {step}: the reward function {cfg.env.reward} failed on {bad} of {len(meta)} "
                  f"episodes ({last}); reward 0, counted in reward_error_rate", file=sys.stderr, flush=True)
        return
    raise ValueError(f"step {step}: the reward function {cfg.env.reward} failed on {bad} of {len(meta)} episodes "
                     f"(env.max_reward_error_rate={cfg.env.max_reward_error_rate:g}); last error: {last}; "
                     "nothing of this step was trained on")


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


# --------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------
def select_plans(w: Worker, ctx: StepContext, step: int, stats: WorkloadStats) -> list[dict]:
    """Ask the selector for each stage's plan; apply runnable switches (and scripted ones)."""
    decisions = []
    for stage in Stage:
        t0 = span_start()
        dec = ctx.selector.select(stage, dataclasses.replace(stats, step=step), w.plans.for_stage(stage))
        bad = runnable(dec.plan, w.world, w.policy.model.config, w.shapes, stage, w.cfg.engine) if dec.switched else ""
        plan, why = (dec.plan, dec.reason) if dec.switched and not bad else (None, "")
        for s_step, s_stage, s_plan in ctx.schedule:
            if s_step == step and s_stage == stage.value:
                plan, why = ParallelPlan.parse(s_plan), f"scheduled switch at step {step}"
        decisions.append({"stage": stage.value, "plan": dec.plan.describe(), "switched": dec.switched,
                          "applied": plan is not None and plan != w.plans.for_stage(stage),
                          "reason": why or dec.reason, **({"not_applied": bad} if bad else {}),
                          "predicted": {k: v for k, v in dec.predicted.items()
                                        if isinstance(v, (int, float, str, bool))}})
        w.span(f"select_{stage.value}", "select", t0, step, args={"plan": dec.plan.describe()})
        if plan is not None and plan != w.plans.for_stage(stage):
            w.switch(stage, plan, why, step)
    return decisions


def seeded_train_step(trainer, optim, local: ExperienceBatch, cfg, step: int, dp_rank: int) -> dict:
    """`trainer.train_step` at this step's point of the schedule, with the mini-batch shuffle of
    (run seed, step, dp rank): the sync step and the async training pool train alike."""
    gen = torch.Generator().manual_seed(mix_seed(cfg.seed, step, SHUFFLE_STREAM, dp_rank))
    return train_step(trainer, optim, local, progress=(step - 1) / max(cfg.steps - 1, 1), generator=gen)


def play_episodes(engine, cfg, params, step: int, episode_ids: list[int]) -> list[Trajectory]:
    """Episodes `episode_ids` of `step` on `engine`: each group's environment seed and each
    episode's sampling stream derive from (run seed, step, id) only, so any replica, pool or
    world size plays the same episode the same way (earl.runtime.seeds)."""
    groups = [e // cfg.group_size for e in episode_ids]
    env_factory = lambda: make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))
    return rollout(engine, env_factory, seeds=[mix_seed(cfg.seed, step, g) % (2**31) for g in groups],
                   group_ids=groups, episode_ids=episode_ids, params=params,
                   sample_seeds=[mix_seed(cfg.seed, step, SAMPLE_STREAM, e) for e in episode_ids],
                   max_context=cfg.sampling.max_context, engine_batch=cfg.engine_batch,
                   legal_bits=bool(cfg.trainer.legal_coef))


def play(w: Worker, step: int) -> tuple[list[Trajectory], dict]:
    """This rollout replica's episodes (every tp peer plays them; each keeps a copy)."""
    cfg, rg = w.cfg, w.roll_groups
    w.sync_weights(Stage.ROLLOUT, step)
    n = cfg.groups * cfg.group_size
    mine = deal(n, w.plans.rollout.dp)[rg.dp_rank]
    t0 = span_start()
    es0 = dataclasses.replace(w.engine.stats)
    trajs = play_episodes(w.engine, cfg, w.params, step, mine)
    w.played = trajs  # rank 0 writes transcripts of the episodes it played itself
    es = w.engine.stats
    counts = {"prefill_tokens": es.prefill_tokens - es0.prefill_tokens,
              "decode_tokens": es.decode_tokens - es0.decode_tokens,
              "generated_tokens": es.generated_tokens - es0.generated_tokens,
              "env_s": sum(u.env_latency_s for t in trajs for u in t.turns)}
    w.span("rollout", "rollout", t0, step, tokens=counts["generated_tokens"],
           args={"prefill_tokens": counts["prefill_tokens"], "env_s": counts["env_s"],
                 "prefill_s": es.prefill_s - es0.prefill_s, "decode_s": es.decode_s - es0.decode_s,
                 "host_syncs": es.host_syncs - es0.host_syncs,
                 "compiled_shapes": es.extra.get("compiled_shapes", 0)})
    return trajs, counts


def rollout_store(trajs: list[Trajectory]) -> Store:
    """Per episode, the 1-D tensors the experience stage needs (views into a few flat tensors)."""
    if not trajs:
        return {}
    lengths = [len(t.token_ids) for t in trajs]
    total = sum(lengths)

    def flat(field: str, dtype) -> torch.Tensor:  # every episode's list end to end (np.fromiter:
        # a quarter of torch.tensor's time on a list of Python numbers)
        return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(getattr(t, field) for t in trajs),
                                            dtype=dtype, count=total))

    ids, mask = flat("token_ids", np.int64), flat("loss_mask", np.bool_)
    engine_lp, legal = flat("logprobs", np.float32), flat("legal_per_token", np.int64)
    tok_r, turn_ids = turn_fields(trajs, mask)
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    parts = {"input_ids": ids.split(lengths), "loss_mask": mask.split(lengths),
             "engine_logprobs": engine_lp.split(lengths),
             "token_rewards": tok_r.split(lengths), "turn_ids": turn_ids.split(lengths),
             "legal_bits": legal.split(lengths)}
    return {t.episode_id: {**{k: v[j] for k, v in parts.items()}, "rewards": rewards[j:j + 1]}
            for j, t in enumerate(trajs)}


def rollout_key_sums(cfg, trajs: list[Trajectory]) -> dict[int, tuple]:
    """Per episode of `trajs`, its key sums of REINFORCE++'s advantage statistics
    (`episode_key_sums`) where they are final when the rollout ends
    (`AdvantageSpec.summed_at_rollout`); empty otherwise (and for the group estimators, whose
    statistics are the rewards the metadata carries anyway)."""
    spec = AdvantageSpec.of(cfg.trainer)
    if spec.grouped or not trajs or not AdvantageSpec.summed_at_rollout(cfg.trainer):
        return {}
    lengths = [len(t.token_ids) for t in trajs]
    mask = torch.from_numpy(np.fromiter(itertools.chain.from_iterable(t.loss_mask for t in trajs), dtype=np.bool_,
                                        count=sum(lengths)))
    tok_r, turn_ids = turn_fields(trajs, mask)
    items = {t.episode_id: {"token_rewards": r, "turn_ids": k, "loss_mask": m} for t, r, k, m in
             zip(trajs, tok_r.split(lengths), turn_ids.split(lengths), mask.split(lengths), strict=True)}
    return episode_key_sums(items, spec)


def padded_batch(store: Store, ids: list[int], meta: dict[int, SampleMeta], pad_id: int) -> ExperienceBatch:
    """Right-padded rows of `ids` from per-sample 1-D tensors; absent fields are zeros. Each
    field is filled with one masked assignment of all its samples' tokens."""
    n = len(ids)
    lengths = torch.tensor([store[i]["input_ids"].numel() for i in ids], dtype=torch.long)
    width = int(lengths.max()) if n else 0
    attn = torch.arange(width)[None, :] < lengths[:, None]
    rows = {"input_ids": torch.full((n, width), pad_id, dtype=torch.long), "attention_mask": attn,
            "loss_mask": torch.zeros(n, width, dtype=torch.bool),
            "turn_ids": torch.full((n, width), -1, dtype=torch.long),
            "legal_bits": torch.zeros(n, width, dtype=torch.long)}
    for name in ("engine_logprobs", "token_rewards", "old_logprobs", "ref_logprobs", "advantages"):
        rows[name] = torch.zeros(n, width)
    present = set(store[ids[0]]) if n else set()
    for name in present & set(rows) - {"attention_mask"}:
        rows[name][attn] = torch.cat([store[i][name] for i in ids]).to(rows[name].dtype)
    rows["advantages"] *= rows["loss_mask"]
    return ExperienceBatch(sample_ids=torch.tensor(ids, dtype=torch.long),
                           group_ids=torch.tensor([meta[i].group for i in ids], dtype=torch.long),
                           rewards=torch.tensor([meta[i].reward for i in ids], dtype=torch.float32), **rows)


def trainable_samples(cfg, ordered: list[SampleMeta]) -> tuple[list[Sample], set[int], int]:
    """The episodes the step trains on: all but those a broken environment ended (`env_error`:
    their reward 0 says nothing of the policy, so they leave the batch and their groups'
    baselines) and, with `trainer.filter_uniform_groups`, the groups whose remaining rewards are
    all equal. Returns (samples, filtered groups, env_error episodes dropped). A step with
    nothing left keeps its episodes (a filtered group's group-relative advantages are 0)."""
    kept = [m for m in ordered if m.outcome != "env_error"] or list(ordered)
    filtered = uniform_groups([m.group for m in kept], [m.reward for m in kept]) \
        if cfg.trainer.filter_uniform_groups else set()
    if len({m.group for m in kept}) == len(filtered):  # nothing would be left: train on all
        filtered = set()
    samples = [Sample(id=m.id, tokens=m.tokens, group=m.group) for m in kept if m.group not in filtered]
    return samples, filtered, len(ordered) - len(kept)


def hand_off(dispatcher: Dispatcher, trajs: list[Trajectory], samples: list[Sample], roll_plan: ParallelPlan,
             exp_plan: ParallelPlan, episodes: int, *, tensors: tuple[str, ...] = HANDOFF_TENSORS,
             rank: int | None = None) -> tuple[Store, DispatchStats, Layout]:
    """The rollout -> experience hand-off of this rank (`rank`, None: the process group's):
    its `trajs` (the episodes it played, `deal`t over the rollout replicas from `episodes` in
    the step) to the experience layout of `samples` (the step's kept episodes), planned over
    all of them by `dispatcher`. Returns the delivered store, the executor's stats and the
    experience layout. Every rank plans and checks the whole step's episodes and copies or
    sends only its own: `earl calibrate` times it at a rank's share in one process
    (earl.calibrate.hostcost), the way each rank of a multi-process step runs it."""
    kept = {s.id for s in samples}  # the episodes play dealt, less any filtered group
    roll_assign = tuple(tuple(i for i in b if i in kept) for b in deal(episodes, roll_plan.dp))
    src = Layout(roll_plan, roll_assign)
    dst = Layout(exp_plan, balance_aligned(samples, exp_plan.dp, roll_assign)[0])
    store = rollout_store(trajs)  # tp peers of a replica hold the same episodes: any may send
    tplan = dispatcher.plan(src, dst, samples)
    got, hstats = execute_dispatch(tplan, store, samples, src, dst, tensors=tensors, rank=rank)
    return got, hstats, dst


def prepare_experience(w: Worker, ctx: StepContext, step: int, trajs: list[Trajectory], samples: list[Sample],
               meta: dict[int, SampleMeta]) -> tuple[Store, Layout, dict]:
    """Hand the episodes to the experience layout (a TransferPlan), then old / reference
    log-probs of this rank's share and their gap to the engine's. Returns the experience store,
    its layout and stats (the gap as this rank's `mismatch_sums`, counted on tp rank 0 only)."""
    cfg = w.cfg
    legal = ("legal_bits",) if w.trainer.uses_legal_bits else ()  # trainer.legal_coef's input
    t0 = span_start()
    got, hstats, dst = hand_off(ctx.dispatcher, trajs, samples, w.plans.rollout, w.plans.experience,
                                cfg.groups * cfg.group_size, tensors=HANDOFF_TENSORS + legal)
    # `waits`: whether the hand-off waited for peers; onto the aligned layout it copies locally
    # and is the rank's own work (earl.calibrate.validate)
    w.span("handoff", "experience", t0, step, bytes=hstats.bytes_sent, args={"waits": hstats.waited})

    w.sync_weights(Stage.EXPERIENCE, step)
    t0 = span_start()
    ids = list(dst.assignment[w.exp_groups.dp_rank])
    batch = padded_batch(got, ids, meta, w.policy.tokenizer.pad_id)
    temp, budget, vocab = w.params.logprob_temperature, cfg.trainer.token_budget, w.policy.tokenizer.vocab_size
    # with one optimizer step the training forward is the old policy: no pass here (a placeholder
    # travels as the dispatch carrier; Trainer.needs_old_logprobs)
    skip_old = not w.trainer.needs_old_logprobs
    old = batch_logprobs(w.logprob_model(), batch, temp, budget, vocab) if ids and not skip_old \
        else torch.zeros_like(batch.engine_logprobs)
    ref = batch_logprobs(w.ref_model, batch, temp, budget, vocab) if ids and w.ref_model is not None else old
    out: Store = {}
    for r, i in enumerate(ids):
        k = got[i]["input_ids"].numel()
        item = dict(got[i])
        item["old_logprobs"], item["ref_logprobs"] = old[r, :k], ref[r, :k]
        if w.ref_model is not None and cfg.trainer.kl_coef and cfg.trainer.algo == "reinforce++":
            # REINFORCE++'s KL penalty is part of each generated token's reward
            item["token_rewards"] = item["token_rewards"] - cfg.trainer.kl_coef * (old[r, :k] - ref[r, :k]) \
                * item["loss_mask"]
        out[i] = item
    w.span("logprob", "experience", t0, step, tokens=int(batch.attention_mask.sum()))
    counted = batch.loss_mask if w.exp_groups.tp_rank == 0 else torch.zeros_like(batch.loss_mask)  # tp peers: once
    gap = None if skip_old else mismatch_sums(old, batch.engine_logprobs, counted, cfg.trainer.tis_cap)
    return out, dst, {"handoff_bytes": hstats.bytes_sent, "mismatch": gap}


def train(w: Worker, ctx: StepContext, step: int, store: Store, src: Layout, samples: list[Sample],
          meta: dict[int, SampleMeta]) -> tuple[dict, dict, ExperienceBatch]:
    """Dispatch to the training layout, then the training step (re-planning on a memory-budget
    miss and retrying on the same samples)."""
    cfg = w.cfg
    spec = AdvantageSpec.of(cfg.trainer)
    skip_old = not w.trainer.needs_old_logprobs
    # TIS's behaviour policy; the engine gap, when the training forward measures it
    extra = ("engine_logprobs",) if cfg.trainer.tis_cap or skip_old else ()
    extra += ("legal_bits",) if w.trainer.uses_legal_bits else ()
    # every rank holds every episode's reward, turn count and (REINFORCE++ without a KL penalty)
    # key sums: the metadata all-gather after the rollout. A group estimator's statistics then
    # need no round of the dispatch (AdvantageSpec.stats_from), nor REINFORCE++'s (summed_stats,
    # the same on every rank); with a KL penalty a per-turn baseline needs none to agree on its keys
    rewards = {s.id: meta[s.id].reward for s in samples}
    turns = max((meta[s.id].reward_turns for s in samples), default=0)
    summed = bool(samples) and all(meta[s.id].key_sums is not None for s in samples)
    known = None
    for _attempt in range(4):
        plan, tg = w.plans.train, w.train_groups
        t0 = span_start()
        if summed and known is None:  # adding up the episodes' sums is the dispatch's advantage work
            known = summed_stats({s.id: meta[s.id].key_sums for s in samples}, samples)
        dst = Layout(plan, balance_samples(samples, plan.dp)[0])
        tplan = ctx.dispatcher.plan(src, dst, samples)
        delivered, dstats = execute_dispatch(tplan, {i: dict(v) for i, v in store.items()}, samples, src, dst,
                                             advantages=spec, extra=extra, rewards=rewards, turns=turns,
                                             stats=known)
        # where the time went: the executor's own seconds (an early rank's wait for its peers in
        # its first receives included), of which advantages (their statistics' rounds included;
        # the centralized controller's run inside its phases) and each phase; the rest of the
        # span is planning
        w.span(tplan.kind, "dispatch", t0, step, bytes=dstats.bytes_sent,
               args={"transfers": len(tplan.transfers), "reductions": dstats.reductions, "waits": dstats.waited,
                     "moved_s": round(dstats.seconds, 6),
                     "advantage_s": round(dstats.advantage_s, 6), "phase_s": [round(x, 6) for x in dstats.phase_s]})
        local = padded_batch(delivered, list(dst.assignment[tg.dp_rank]), meta, w.policy.tokenizer.pad_id)
        if skip_old:  # the experience stage sent placeholders (Trainer.needs_old_logprobs)
            local.old_logprobs = None
            local.ref_logprobs = local.ref_logprobs if w.ref_model is not None else None
        tokens, longest = int(local.attention_mask.sum()), local.input_ids.shape[1]
        try:
            w.check_budget(tokens, longest)
        except MemoryBudgetExceeded as e:
            nxt = w.sparing_plan(tokens, longest)
            if nxt is None:
                raise MemoryBudgetExceeded(f"{e}; no runnable train plan needs less") from None
            w.switch_train(nxt, f"memory budget: {e}", step)
            continue
        t0 = span_start()
        stats = seeded_train_step(w.trainer, w.optim, local, cfg, step, tg.dp_rank)
        w.span("train_step", "train", t0, step, tokens=int(stats["train_tokens"]))
        info = {"dispatcher": tplan.kind, "dispatch_transfers": len(tplan.transfers),
                "dispatch_bytes": carry_along(tplan, extra).total_bytes,
                "memory_accounted_bytes": w.memory_bytes(plan, tokens, longest)}
        return stats, info, local
    raise MemoryBudgetExceeded(f"step {step}: still over the memory budget after re-planning")


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------
def run_step(w: Worker, ctx: StepContext, step: int,
             prev: WorkloadStats) -> tuple[dict | None, WorkloadStats, list, list]:
    """One RL step on this rank. Returns (metrics row on rank 0 else None, the step's workload
    statistics, decisions, episode records)."""
    cfg = w.cfg
    t_step, cpu0 = time.perf_counter(), time.process_time()
    w.events = []
    ctx.control.reset()
    if cfg.host_probe:  # the host's speed now, for `earl validate` (earl/runtime/hostprobe.py)
        t0 = span_start()
        per_iter = w.host_probe.time(cfg.host_probe)
        w.span("host_probe", "other", t0, step, args={"probe_s": per_iter, "iters": cfg.host_probe})
    decisions = select_plans(w, ctx, step, prev)

    trajs, counts = play(w, step)
    t0 = span_start()
    sums = rollout_key_sums(cfg, trajs) if w.roll_groups.tp_rank == 0 else {}
    local_meta = [SampleMeta.of(t, sums.get(t.episode_id)) for t in trajs] if w.roll_groups.tp_rank == 0 else []
    parts = all_gather_objects(local_meta, ctx.control, "metadata")
    # the ranks meet here after their rollouts (each first sums its episodes' statistics): a span
    # of no scored stage, so the trace shows it
    w.span("metadata", "other", t0, step)
    meta = {m.id: m for part in parts for m in part}
    assert sorted(meta) == list(range(cfg.groups * cfg.group_size)), "an episode was lost"
    ordered = [meta[i] for i in sorted(meta)]
    stats = workload_stats(ordered, step, cfg.sampling.max_context)
    check_reward_errors(cfg, ordered, step)
    samples, filtered, broken = trainable_samples(cfg, ordered)

    store, exp_layout, hand = prepare_experience(w, ctx, step, trajs, samples, meta)
    tstats, info, _local = train(w, ctx, step, store, exp_layout, samples, meta)
    if hand["mismatch"] is None:  # measured by the training forward, counted once per tp group
        got, top = w.trainer.gap
        hand["mismatch"] = (got if w.train_groups.tp_rank == 0 else dict.fromkeys(SUM_KEYS, 0.0), top)

    # metrics: scalars reduced over ranks; spans gathered on rank 0
    lead = w.roll_groups.tp_rank == 0
    sums = reduce_scalars([counts[k] if lead else 0.0 for k in ("prefill_tokens", "decode_tokens",
                                                                "generated_tokens", "env_s")]
                          + [float(hand["handoff_bytes"])] + [hand["mismatch"][0][k] for k in SUM_KEYS],
                          ctx.control, "scalars")
    peak, gap_max = reduce_scalars([float(peak_memory_bytes(w.device)), hand["mismatch"][1]], ctx.control,
                                   "scalars", op="max")
    spans = gather_objects(w.spans, ctx.control, "spans")
    w.spans = []
    if dist.get_rank() != 0:
        return None, stats, decisions, []
    stage_s = dict.fromkeys(STEP_PHASES, 0.0)
    mine = [sp for sp in spans[0] if sp.step == step]
    for sp in mine:
        if sp.stage in stage_s:
            stage_s[sp.stage] += sp.duration_s
    rollout_s = stage_s["rollout"]
    gap = mismatch_metrics(dict(zip(SUM_KEYS, sums[5:], strict=True)), gap_max, cfg.trainer.tis_cap)
    row = {"step": step, **outcome_metrics(ordered), **tstats, **gap,
           "prefill_tokens": int(sums[0]), "decode_tokens": int(sums[1]),
           **{f"{k}_s": v for k, v in stage_s.items()}, "env_s": sums[3],
           "step_s": time.perf_counter() - t_step, "step_cpu_s": time.process_time() - cpu0,
           "gen_tokens_per_s": sums[2] / max(rollout_s, 1e-9), "peak_mem_bytes": int(peak),
           **info, "handoff_bytes": int(sums[4]), "world": w.world,
           "plan_rollout": w.plans.rollout.describe(), "plan_experience": w.plans.experience.describe(),
           "plan_train": w.plans.train.describe(), "plan_switches": len(w.events),
           "replans": sum("memory budget" in e["reason"] for e in w.events),
           "switch_reasons": "; ".join(f"{e['stage']}: {e['from']} -> {e['to']} ({e['reason']})" for e in w.events),
           "samples_trained": len(samples) if tstats["train_tokens"] > 0 else 0,
           "groups_filtered": len(filtered), "env_errors_dropped": broken,
           "control_recv_bytes": ctx.control.total}
    row["_spans"] = [sp for part in spans for sp in part]
    return row, stats, decisions + [dict(e, event="switch") for e in w.events], episode_records(ordered)


def step_context(worker: Worker, hardware: str) -> StepContext:
    """The run's selector (pricing plans on `hardware` with the job's topology), dispatcher and
    scripted plan switches."""
    cfg, world = worker.cfg, worker.world
    config = worker.policy.model.config
    selector = make_selector(
        cfg.policy.selector, cost_model=selector_cost_model(worker.policy.spec, hardware, world, cfg.model.dtype),
        initial=worker.plans, stage_gpus=world,
        can_run=lambda stage, plan: runnable(plan, world, config, worker.shapes, stage, cfg.engine))
    return StepContext(selector=selector, dispatcher=make_dispatcher(cfg.policy.dispatcher),
                       schedule=parse_schedule(cfg.plan.schedule))


def first_stats(worker: Worker) -> WorkloadStats:
    """The workload the selector plans the first step for: every episode at the first prompt's
    length plus the sampling budget."""
    return start_stats(worker.cfg, worker.policy.tokenizer, worker.params.max_new_tokens)


def start_stats(cfg: RunConfig, tokenizer, max_new_tokens: int) -> WorkloadStats:
    """`first_stats` from the tokenizer and the sampling budget."""
    prompt = make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env)).reset(0)
    n = len(tokenizer.encode(prompt)) + max_new_tokens
    return WorkloadStats(step=0, num_responses=cfg.episodes_per_step, context_mean=n, context_p95=n,
                         context_max=n, max_context=cfg.sampling.max_context)
