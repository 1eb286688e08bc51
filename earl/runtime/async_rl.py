"""Asynchronous RL in the runtime (`schedule.mode = "async"`): a rollout pool generating on its
own processes while a training pool trains, with bounded staleness (the design the simulator
prices in earl.sim.async_rl, with the same keys and the same pool-split policy).

The world splits into a training pool, ranks 0..T-1 (rank 0 writes the run's files), and a
rollout pool, ranks T..N-1, sized by `schedule.rollout_gpus` or, when 0, by
earl.policies.pools.choose_pool_split on the run's calibrated profile (the simulator's call).
Each rollout rank is an independent replica (tp1) playing its share of every step's episodes;
the training pool trains data-parallel over its ranks (tp1-dpT, ReplicatedAdamW).

Policy version v = optimizer steps taken. Step s trains on version s-1's weights and makes
version s. A rollout replica plays step after step, each with the newest version it holds, and
before starting step s waits until it holds at least version s-1-K (K = `max_staleness`): a
sample older than K is never generated, so none is ever dropped, and a replica faster than
training runs up to K steps ahead of it (it plays step s+K while training takes step s). Its
finished steps wait in a queue of at most K for a sender thread, which hands them to rank 0 in
step order (gloo's send blocks until rank 0 takes the step; the replica plays on meanwhile).
Each episode carries its version and its per-token behaviour log-probs (the engine's); training
takes step s's episodes (the oldest ones waiting) and corrects them with the decoupled-PPO weight
min(pi_prox / pi_behaviour, C) per token (earl.runtime.mismatch.tis_weights; pi_prox is the
policy before this step, C is `trainer.tis_cap`, or ASYNC_TIS_CAP when that is 0), on every
algorithm of the trainer.

After each optimizer step the training pool pushes the weights through the re-shard planner
(earl.runtime.weight_push.WeightPush: earl.policies.reshard.plan_pool_push from tp1-dpT on the
training ranks to tp1 replicas on the rollout ranks, executed in buckets by
earl.runtime.move_weights.execute_reshard); a thread on each rollout rank receives them into
staging tensors and the replica swaps them in between steps' episodes (the replica drains
first), or, with `schedule.partial_rollout`, between the engine's decode steps (its
`between_steps` callback), episodes in flight. Partial rollout keeps the KV cache (no
recompute): the K/V already cached were made by the old weights, as in PipelineRL (AReaL's
interruptible workers recompute them instead; the simulator's stream feed prices that); a
recompute would cost a prefill of every running episode at every push, while the extra
off-policyness is recorded token by token (each behaviour log-prob is the one of the weights
that sampled the token) and corrected by the same importance weight. Each episode records
(version_first, version_last); its staleness is its oldest token's, step - 1 - version_first, so
the gate above still bounds it by K.

Checkpoints: every `checkpoint_every` steps and at the end, whole on every rank (tp1-dpN), so
that both pools join DCP's collective; a rollout rank saves the push of that version it
received (not the weights it may be playing with), after every rank's copy is checked equal.
After each step rank 0 tells each rollout rank "go", "save" or "stop"; a listener thread on
the rollout rank hears it at once, whatever step the replica is playing, and on "save" joins the
checkpoint with the push of that version (so both pools meet each checkpoint in the same order
without the replica waiting for training). Threads and gloo: the weight push, the episode
channel and the words each have their own communicator (one process group used from two
threads at once is not safe), and the default group, used by the checkpoint, is the listener's
alone until the end. A checkpoint resumes in either mode, and an async run resumes from a sync
run's checkpoint too (DCP re-shards both ways). SIGTERM (any rank's: a rollout rank's rides
with its episodes) and a deadline stop the run after a step, as in the sync loop
(earl.runtime.control.vote_stop over the training pool, the console's Preemption); the steps the
replica played ahead are then dropped (those still queued on the replica, and those already
on their way, which rank 0 drains: `async.json`, `steps_drained`). A killed rank reaches the others as
a gloo error, and the launcher prints its one line and the resume hint.

    earl run --nproc 2 --steps 4 --set schedule.mode=async --set schedule.max_staleness=1
    earl run --nproc 2 --steps 4 --set schedule.mode=async --set schedule.partial_rollout=true
    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_async.py tests/runtime/test_async_partial.py
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from earl.parallel import build_plan_groups, deal
from earl.policies.pools import choose_pool_split
from earl.policies.types import Sample
from earl.runtime.advantages import AdvantageSpec, fill_advantages, local_stats
from earl.runtime.checkpoint import export_hf, find_checkpoint, load_checkpoint, rng_state, save_checkpoint
from earl.runtime.console import Preemption
from earl.runtime.control import fault_hook, vote_stop
from earl.runtime.dist import aligned_origin, comm_device
from earl.runtime.engine import as_stepper, make_engine, set_between_steps
from earl.runtime.gc_steps import StepGC
from earl.runtime.gloo_loops import batched_threads
from earl.runtime.hf_model import load_policy
from earl.runtime.metrics import RunRecorder
from earl.runtime.mismatch import SUM_KEYS, mismatch_metrics
from earl.runtime.optim import ReplicatedAdamW
from earl.runtime.resolve import check_out, initial_plans, model_spec, resolve_hardware, selector_cost_model
from earl.runtime.rollout import Trajectory
from earl.runtime.run_config import RunConfig, to_dict
from earl.runtime.step import (
    SampleMeta,
    episode_records,
    outcome_metrics,
    padded_batch,
    play_episodes,
    rollout_store,
    seeded_train_step,
    start_stats,
    trainable_samples,
    workload_stats,
)
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import Trainer, batch_logprobs
from earl.runtime.weight_push import END_OF_PUSHES, WeightPush, WeightReceiver, weights_digest
from earl.runtime.worker import action_token_ids, sampling_params
from earl.specs import ParallelPlan, Stage, StagePlan, WorkloadStats
from earl.trace import Span, atomic_write_text

ASYNC_TIS_CAP = 2.0  # the behaviour-weight cap when trainer.tis_cap is 0 (verl's default TIS cap)
ASYNC_JSON = "async.json"  # the pool split and the weight-push check, written by rank 0
HF_EXPORT = "hf"  # the run folder's HF export of the final policy (earl.runtime.run's)


@dataclass(frozen=True)
class Pools:
    train_ranks: tuple[int, ...]
    rollout_ranks: tuple[int, ...]
    how: str  # "given" (schedule.rollout_gpus) or the cost model's decision


def split_pools(cfg: RunConfig, world: int, hardware: str, spec, stats: WorkloadStats) -> Pools:
    """The rollout / training split: `schedule.rollout_gpus`, or when 0 choose_pool_split on the
    selector's cost model (the run's profile on `world` processes), as the simulator calls it."""
    n_roll = cfg.schedule.rollout_gpus
    how = "schedule.rollout_gpus"
    if not n_roll:
        cm = selector_cost_model(spec, hardware, world, cfg.model.dtype)
        open_dp = ParallelPlan(dp=-1)
        split = choose_pool_split(cm, StagePlan(rollout=open_dp, experience=open_dp, train=open_dp), stats, world,
                                  granularity=1)
        n_roll = split.rollout_gpus
        how = (f"choose_pool_split on {hardware}: rollout {split.rollout_s * 1e3:.1f} ms vs train "
               f"{split.train_s * 1e3:.1f} ms per batch predicted")
    t = world - n_roll
    return Pools(train_ranks=tuple(range(t)), rollout_ranks=tuple(range(t, world)), how=how)


class Replica:
    """A rollout rank: its own copy of the policy, its engine, the version it holds. With
    `schedule.partial_rollout` the engine calls back between its decode steps and the replica
    swaps in the newest pushed version there, episodes in flight (`attach`)."""

    def __init__(self, cfg: RunConfig, version: int):
        self.cfg = cfg
        self.policy = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype)
        self.model = self.policy.model.to(comm_device()).eval()  # where the weight push's collective runs
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.engine = make_engine(cfg.engine, self.model, self.policy.tokenizer, reuse_kv=cfg.reuse_kv,
                                  decode_steps=cfg.decode_steps, compile=cfg.compile_decode)
        self.params = sampling_params(cfg)
        self.version = version
        self.swaps = 0

    def attach(self, recv: WeightReceiver | None) -> None:
        """Partial rollout: between decode steps, swap in whatever push has arrived (never wait).
        None: detach."""
        if self.cfg.schedule.partial_rollout:
            set_between_steps(self.engine, None if recv is None else self._between_steps(recv))

    def _between_steps(self, recv: WeightReceiver):
        def between() -> None:
            slow_hook("EARL_SLOW_DECODE_S")
            self.take_newest(recv, at_least=self.version)
        return between

    def swap_in(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.engine.update_weights(weights.items())
        self.version, self.swaps = version, self.swaps + 1

    def take_newest(self, recv: WeightReceiver, at_least: int) -> bool:
        """Swap in the newest pushed version, waiting for pushes until it is >= `at_least`; False
        when the pushes ended first (the training pool stopped)."""
        newest = None
        while True:
            block = (newest[0] if newest else self.version) < at_least and not recv.ended
            try:
                got = recv.ready.get(block=block, timeout=weight_wait_s(self.cfg) if block else None)
            except queue.Empty:
                if block:
                    raise RuntimeError("timed out waiting for a weight push from the training pool") from None
                break
            if got[0] is None:
                raise RuntimeError(f"weight push failed: {recv.error}") from recv.error
            if got[0] != END_OF_PUSHES:
                newest = got
        if newest is not None:
            self.swap_in(newest[1], newest[0])
        return self.version >= at_least

    def play(self, step: int, share: list[int]) -> tuple[list[Trajectory], dict[int, tuple[int, int]]]:
        """Step `step`'s episodes `share`, and per episode id (version_first, version_last): the
        version held when it was submitted (its first token's is at least that) and the one its
        last token was generated with (equal unless a swap came mid-episode: partial rollout)."""
        log = _VersionLog(self)
        trajs = play_episodes(log, self.cfg, self.params, step, share)
        spans = [v for b in log.batches for v in zip(b.first, b.last, strict=True)]
        assert len(spans) == len(share)
        return trajs, dict(zip(share, spans, strict=True))


class _VersionLog:
    """The replica's engine as play_episodes sees it, recording for each episode batch it opens
    the version each row started on and the version its latest turn ended on."""

    def __init__(self, rep: Replica):
        self.rep, self.tokenizer, self.stats = rep, rep.engine.tokenizer, rep.engine.stats
        self.batches: list[_VersionedBatch] = []

    def open(self, n: int, seeds=None) -> _VersionedBatch:
        self.batches.append(_VersionedBatch(as_stepper(self.rep.engine.open(n, seeds)), n, self.rep))
        return self.batches[-1]


class _VersionedBatch:
    def __init__(self, inner, n: int, rep: Replica):
        self.inner, self.rep = inner, rep
        self.first = [rep.version] * n
        self.last = [rep.version] * n

    def submit(self, inputs, params) -> None:
        self.inner.submit(inputs, params)

    def step(self):
        done = self.inner.step()  # any swap comes at its start (between_steps): its tokens are rep.version's
        for r in done:
            self.last[r] = self.rep.version
        return done

    @property
    def busy(self) -> bool:
        return self.inner.busy

    def close(self, rows) -> None:
        self.inner.close(rows)


class EpisodeSender(threading.Thread):
    """A rollout rank's finished steps, (step, versions, trajectories, spans), to rank 0 in step order on
    `group` (the episode channel's own communicator: gloo's send blocks until rank 0 takes the
    step, and the replica plays on meanwhile). At most `k` finished steps wait in `box` (the
    staleness gate keeps the replica within that, so a put never waits long); None ends the
    channel, and a last None goes to rank 0. After rank 0's "stop" (`stopped`) the steps still
    waiting are dropped: none of them is trained."""

    def __init__(self, group, k: int, stopped: threading.Event, sigterm: Preemption):
        super().__init__(daemon=True)
        self.group, self.stopped, self.sigterm = group, stopped, sigterm
        self.box: queue.Queue = queue.Queue(maxsize=k)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while (item := self.box.get()) is not None:
                if not self.stopped.is_set():  # a rollout rank's SIGTERM rides with its episodes
                    dist.send_object_list([(*item, self.sigterm.requested)], dst=0, group=self.group)
            dist.send_object_list([None], dst=0, group=self.group)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = e

    def put(self, item) -> None:
        """Queue `item` (the main thread), waiting for room; raises what stopped the sender."""
        while True:
            if self.error is not None:
                raise RuntimeError(f"sending episodes to rank 0 failed: {self.error}") from self.error
            try:
                return self.box.put(item, timeout=1.0)
            except queue.Full:
                continue


class WordListener(threading.Thread):
    """A rollout rank's ear for rank 0's word after each training step, on `group` (the word
    channel's communicator), steps first..last in order: "save" joins the checkpoint of that
    step (a collective on the default group, which nothing else on this rank uses meanwhile)
    with the push of that version; "stop" ends it (`final`: the step, `preempted`: SIGTERM's).
    `stopped` is set at the end, by "stop" or an error (`error`). A rollout rank's injected
    fault at step s (EARL_FAULT_RANK_STEP) fires here on hearing the word on step s-1: the
    training pool's clock, since the replica itself may be up to K steps ahead."""

    def __init__(self, cfg: RunConfig, out: Path, rank: int, rep: Replica, recv: WeightReceiver, steps: range,
                 group):
        super().__init__(daemon=True)
        self.cfg, self.out, self.rank, self.rep, self.recv, self.steps, self.group = \
            cfg, out, rank, rep, recv, steps, group
        self.stopped = threading.Event()
        self.final, self.preempted = steps[-1], False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for step in self.steps:
                word, self.preempted = _hear(step, self.group)
                if word == STOP:
                    self.final = step
                    break
                fault_hook(self.rank, step + 1)
                if word == SAVE:
                    pushed = self.recv.weights_of(step, weight_wait_s(self.cfg))
                    save_mid_run(self.out, step, self.cfg, self.rep.model, pushed, None)
            else:
                raise AssertionError(f"no stop from rank 0 by step {self.steps[-1]}")
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = e
        finally:
            self.stopped.set()


def run_rollout_rank(cfg: RunConfig, pools: Pools, groups: dict, rank: int, first: int, last: int,
                     origin: float, out: Path, weights: dict | None) -> tuple[int, bool]:
    """Steps first..last of one rollout replica, or until the training pool says stop; returns
    the last step trained and whether SIGTERM stopped the run. The replica plays step after
    step, each once it holds version >= s-1-K, so up to K steps ahead of training; three threads
    beside it, each on its own communicator (`groups`: "push", "episodes", "words"): the weight
    receiver, the episode sender and the word listener (which joins the checkpoints)."""
    rep = Replica(cfg, version=first - 1)
    if weights is not None:
        load_weights(rep.model, weights)
    recv = WeightReceiver(WeightPush(rep.model, pools, groups["push"]))
    recv.start()
    rep.attach(recv)
    k, j = cfg.schedule.max_staleness, pools.rollout_ranks.index(rank)
    spans = []
    # SIGTERM reaches every rank: this one says so to rank 0 and goes on; the collector runs
    # between steps, as in the sync loop (earl.runtime.gc_steps)
    with Preemption() as sigterm, StepGC(cfg.gc_every) as step_gc:
        words = WordListener(cfg, out, rank, rep, recv, range(first, last + 1), groups["words"])
        sender = EpisodeSender(groups["episodes"], k, words.stopped, sigterm)
        words.start()
        sender.start()
        for step in range(first, last + 1):
            t0 = time.perf_counter()
            if words.stopped.is_set() or not rep.take_newest(recv, at_least=step - 1 - k):
                break  # training stopped: this step is not trained
            t1 = time.perf_counter()
            if t1 - t0 > 1e-3:
                spans.append(Span(name="wait_weights", stage="reshard", rank=rank, t_start=t0 - origin,
                                  t_end=t1 - origin, step=step))
            share = list(deal(cfg.episodes_per_step, len(pools.rollout_ranks))[j])
            v0 = rep.version
            trajs, versions = rep.play(step, share)
            t2 = time.perf_counter()
            spans.append(Span(name="rollout", stage="rollout", rank=rank, t_start=t1 - origin, t_end=t2 - origin,
                              step=step, tokens=sum(t.generated_tokens for t in trajs),
                              args={"version": v0, "version_end": rep.version}))
            sender.put((step, versions, trajs, spans))
            spans = []
            step_gc.step_done(step)
        sender.put(None)
        sender.join()
        words.join()
    for thread in (words, sender, recv):
        if thread.error is not None:
            raise RuntimeError(f"rollout rank {rank}: {type(thread).__name__}: {thread.error}") from thread.error
    rep.attach(None)
    rep.take_newest(recv, at_least=words.final)  # the final push: the test of push equality reads it
    recv.join()
    dist.gather_object((weights_digest(rep.model), rep.swaps, spans), None, dst=0)
    box = [None]
    dist.broadcast_object_list(box, src=0)  # rank 0's optimizer state, or None: no checkpoint
    if box[0] is not None:
        save_async_checkpoint(out, words.final, cfg, dist.get_world_size(), rep.model, *box[0], source="", stats={})
    return words.final, words.preempted


GO, SAVE, STOP = "go", "save", "stop"  # rank 0's word to the rollout ranks after each step


WORDS = (GO, SAVE, STOP)


def _say(step: int, word: str, preempted: bool, ranks: tuple[int, ...], group) -> list:
    """Rank 0: its word on `step` to the rollout `ranks` on `group`, without waiting for them to
    hear it (the sends to wait on; their tensor lives as long as they do)."""
    t = torch.tensor([step, WORDS.index(word), int(preempted)], dtype=torch.int64, device=comm_device())
    return [(dist.isend(t, dst=r, group=group), t) for r in ranks]


def _hear(step: int, group) -> tuple[str, bool]:
    """A rollout rank: rank 0's word on `step` (on `group`), and whether the run stops for SIGTERM."""
    t = torch.zeros(3, dtype=torch.int64, device=comm_device())
    dist.recv(t, src=0, group=group)
    got, word, preempted = t.tolist()
    assert got == step, (got, step)
    return WORDS[word], bool(preempted)


def _drain(ranks: tuple[int, ...], group) -> int:
    """Rank 0 after its last step: every rollout rank's steps still on their way (played ahead,
    not trained), up to each one's closing None; returns how many were dropped."""
    dropped = 0
    for r in ranks:
        while True:
            box = [None]
            dist.recv_object_list(box, src=r, group=group)
            if box[0] is None:
                break
            dropped += 1
    return dropped


def save_mid_run(out: Path, step: int, cfg: RunConfig, model: torch.nn.Module, params: dict[str, torch.Tensor],
                 state: tuple[dict, int] | None, source: str = "", stats: dict | None = None) -> Path:
    """Every rank's part of the checkpoint of `step` during an async run: `params`, this rank's
    copy of version `step` (a rollout rank's is the push it received, not necessarily the
    weights it plays with), checked equal on every rank first (DCP writes any one rank's copy
    of a replicated tensor), and `state`, rank 0's optimizer state (tensors, steps), sent to
    every rank. Collective; RuntimeError if the copies differ."""
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(params))
    if len(set(digests)) != 1:
        raise RuntimeError(f"checkpoint of step {step}: the ranks' copies of version {step} differ")
    box = [state]
    dist.broadcast_object_list(box, src=0)
    return save_async_checkpoint(out, step, cfg, dist.get_world_size(), model, *box[0], source=source,
                                 stats=stats or {}, params=params)


def weight_wait_s(cfg: RunConfig) -> float:
    """How long a replica waits for a weight version: a training step and its push, bounded like
    any wait on the other ranks (twice `collective_timeout_s`: 600 s by default)."""
    return 2 * cfg.collective_timeout_s


def slow_hook(name: str) -> None:
    """Test hooks that stretch one side: EARL_SLOW_TRAIN_S seconds more per training step (a
    rollout faster than training, so the replicas run ahead), EARL_SLOW_DECODE_S per decode step
    of a partial rollout (episodes long enough that every push lands mid-episode)."""
    if os.environ.get(name):
        time.sleep(float(os.environ[name]))


class Learner:
    """A training rank: the policy under tp1-dpT and its optimizer (from `state`, a loaded
    checkpoint's (params, optimizer slices, optimizer steps), when resuming)."""

    def __init__(self, cfg: RunConfig, groups, state: tuple[dict, dict, int] | None = None):
        self.cfg, self.groups = cfg, groups
        policy = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype)
        self.model, self.tokenizer, self.source = policy.model.to(comm_device()), policy.tokenizer, policy.source
        self.ref_model = None  # the KL term's frozen initial model (trainer.kl_coef > 0), as the sync Worker's
        if cfg.trainer.kl_coef:
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        if state is not None:
            load_weights(self.model, state[0])
        self.params = sampling_params(cfg)
        tcfg = cfg.trainer if cfg.trainer.tis_cap else dataclasses.replace(cfg.trainer, tis_cap=ASYNC_TIS_CAP)
        self.optim = ReplicatedAdamW(self.model, param_shapes(self.model), groups, tcfg)
        if state is not None:
            self.optim.load_state_tensors(state[1], state[2])
        self.trainer = Trainer(self.model, tcfg, temperature=self.params.logprob_temperature,
                               vocab_size=self.tokenizer.vocab_size, action_ids=action_token_ids(cfg, self.tokenizer))


def load_weights(model: torch.nn.Module, params: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])


def checkpoint_plan(world: int) -> ParallelPlan:
    """The layout an async checkpoint is saved and loaded under: every rank of the job holds the
    whole policy (replicated), so each pool joins DCP's collective with what it has; a sync run
    loads it into any plan (DCP re-shards)."""
    return ParallelPlan(dp=world)


def load_async_checkpoint(ckpt: Path, model: torch.nn.Module, rank: int, world: int):
    """(params, optimizer slices, optimizer steps, meta) of a checkpoint of either mode, whole on
    every rank. Collective."""
    got = load_checkpoint(ckpt, shapes=param_shapes(model), plan=checkpoint_plan(world), rank=rank, world=world)
    return got.params, got.optimizer, got.optimizer_step, got.meta


def save_async_checkpoint(out: Path, step: int, cfg: RunConfig, world: int, model: torch.nn.Module,
                          optimizer: dict, optimizer_step: int, source: str, stats: dict,
                          params: dict[str, torch.Tensor] | None = None) -> Path:
    """The run's checkpoint after `step`, by every rank (rollout ranks hold the pushed weights,
    equal to training's, and rank 0's optimizer state, broadcast to them); `params`: the
    weights to save when they are not `model`'s. Collective."""
    meta = {"config": to_dict(cfg), "plans": {s.value: initial_plans(cfg, world).for_stage(s).describe()
                                              for s in Stage},
            "world": world, "model_source": source, "stats": stats, "rng": rng_state(), "schedule": "async"}
    params = params if params is not None else {n: p.detach() for n, p in model.named_parameters()}
    return save_checkpoint(out, step, params=params, optimizer=optimizer, optimizer_step=optimizer_step,
                           shapes=param_shapes(model), plan=checkpoint_plan(world), meta=meta,
                           keep=cfg.keep_checkpoints)


def step_samples(lr: Learner, trajs: list[Trajectory]) -> tuple[list[Sample], list[int], set[int], int]:
    """The step's trainable episodes (earl.runtime.step.trainable_samples, the sync loop's rule:
    no env_error episode, and with `trainer.filter_uniform_groups` no group of equal rewards)
    and this training rank's share of them; returns (samples, share, filtered groups, env_error
    episodes dropped)."""
    samples, filtered, broken = trainable_samples(lr.cfg, [SampleMeta.of(t) for t in trajs])
    share = [samples[i].id for i in deal(len(samples), lr.groups.plan.dp)[lr.groups.dp_rank]]
    return samples, share, filtered, broken


def experience(lr: Learner, trajs: list[Trajectory], share: list[int], samples: list[Sample] | None = None):
    """This training rank's ExperienceBatch of `share` (episode ids) with advantages over the
    step's `samples` (default: every episode of `trajs`). With `trainer.kl_coef` > 0 the frozen
    initial model's log-probs of every sample (REINFORCE++'s KL penalty is part of the per-token
    rewards, so of every baseline; grpo / rloo put the KL term in the loss)."""
    cfg = lr.cfg
    meta = {t.episode_id: SampleMeta.of(t) for t in trajs}
    if samples is None:
        samples = [Sample(id=m.id, tokens=m.tokens, group=m.group) for m in meta.values()]
    store = rollout_store(trajs)
    temp, budget, vocab, pad = (lr.params.logprob_temperature, cfg.trainer.token_budget, lr.tokenizer.vocab_size,
                                lr.tokenizer.pad_id)
    if lr.ref_model is not None and samples:
        ids = [x.id for x in samples]
        whole = padded_batch(store, ids, meta, pad)
        ref = batch_logprobs(lr.ref_model, whole, temp, budget, vocab)
        old = batch_logprobs(lr.model, whole, temp, budget, vocab) if lr.trainer.needs_old_logprobs else None
        for r, i in enumerate(ids):
            k, item = store[i]["input_ids"].numel(), dict(store[i])
            item["ref_logprobs"] = ref[r, :k]
            if old is not None:  # the proximal policy: the weights before this step
                item["old_logprobs"] = old[r, :k]
            if cfg.trainer.algo == "reinforce++":
                item["token_rewards"] = item["token_rewards"] - cfg.trainer.kl_coef * (old[r, :k] - ref[r, :k]) \
                    * item["loss_mask"]
            store[i] = item
    spec = AdvantageSpec.of(cfg.trainer)
    fill_advantages(store, samples, local_stats(store, samples, spec), spec)
    batch = padded_batch(store, share, meta, pad)  # zeros where the store has no field
    if lr.ref_model is None:
        batch.ref_logprobs = None  # no KL term
    if not lr.trainer.needs_old_logprobs:
        batch.old_logprobs = None  # one optimizer step: the training forward is the proximal policy
    elif lr.ref_model is None:  # minibatches > 1: the proximal policy is the one before this step
        batch.old_logprobs = batch_logprobs(lr.model, batch, temp, budget, vocab)
    return batch, meta


def run_async(cfg: RunConfig, out: Path, rank: int, world: int, *, hardware: str, spec, stats: WorkloadStats,
              echo, resume: Path | None = None, stop_at: int | None = None, deadline_s: float | None = None,
              t_call: float | None = None) -> tuple[list[dict], Path | None, int, int, bool]:
    """The whole asynchronous run on this rank, from the start or from a checkpoint of either
    mode, to `cfg.steps` or `stop_at`, or the first step ending `deadline_s` after `t_call`, or
    SIGTERM; returns (rank 0: every metrics row, else []; the last checkpoint written; the first
    step; the last step; stopped by SIGTERM)."""
    pools = split_pools(cfg, world, hardware, spec, stats)
    train_groups = build_plan_groups(ParallelPlan(dp=len(pools.train_ranks)))  # collective, every rank
    # a communicator each for the weight push, the episode channel and rank 0's words, created in
    # this order on every rank: a rollout rank uses them from three threads at once
    with batched_threads(dist.get_backend()):  # their event-loop threads (earl.runtime.gloo_loops)
        groups = {name: dist.new_group(list(range(world))) for name in ("push", "episodes", "words")}
    origin = aligned_origin()  # one timeline for every rank's spans
    last, first, state = min(cfg.steps, stop_at or cfg.steps), 1, None
    if resume is not None:
        params, optimizer, optimizer_step, meta = load_async_checkpoint(find_checkpoint(resume),
                                                                        load_policy(cfg.model.path).model, rank, world)
        first, state = int(meta["step"]) + 1, (params, optimizer, optimizer_step)
        if first > cfg.steps:
            raise ValueError(f"the checkpoint is at step {first - 1} and steps={cfg.steps}: nothing to do "
                             "(raise --steps)")
    if rank in pools.rollout_ranks:
        step, preempted = run_rollout_rank(cfg, pools, groups, rank, first, last, origin, out,
                                           weights=state[0] if state is not None else None)
        return [], None, first, step, preempted
    lr = Learner(cfg, train_groups, state=state)
    push = WeightPush(lr.model, pools, groups["push"])
    rec = None
    every = cfg.checkpoint_every if cfg.checkpoints else 0
    if rank == 0:
        echo(f"earl run: schedule async, max_staleness {cfg.schedule.max_staleness}"
             f"{', partial rollout' if cfg.schedule.partial_rollout else ''}: rollout pool "
             f"{len(pools.rollout_ranks)} process(es) (ranks {pools.rollout_ranks[0]}-{pools.rollout_ranks[-1]}, "
             f"tp1 replicas), training pool {len(pools.train_ranks)} (tp1-dp{len(pools.train_ranks)}); split by "
             f"{pools.how}; behaviour-weight cap {lr.trainer.cfg.tis_cap:g}; steps {first}-{last}"
             + (f" from {resume}" if resume is not None else "")
             + (f"; a checkpoint every {every} steps and at the end" if every else
                "; a checkpoint at the end" if cfg.checkpoints else "; no checkpoints"))
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps(to_dict(cfg), indent=2))
        rec = RunRecorder(out, resume_step=first - 1 if resume is not None else None,
                          wandb_config=to_dict(cfg) if cfg.wandb else None)
    k = cfg.schedule.max_staleness
    t_prev = time.perf_counter()
    final_stats: dict = {}
    ckpt = None
    preempted = False
    saved: list[int] = []  # steps checkpointed mid-run, each after checking every rank's copy equal
    said: list = []  # rank 0's word on the last step, on its way to the replicas
    with Preemption() as sigterm, StepGC(cfg.gc_every) as step_gc:
        for step in range(first, last + 1):
            fault_hook(rank, step)
            t0 = time.perf_counter()
            for work, _ in said:  # the replicas' listeners hear the last word at once
                work.wait()
            said = []
            got = []
            if rank == 0:
                for r in pools.rollout_ranks:  # step s's episodes: the oldest waiting
                    box = [None]
                    dist.recv_object_list(box, src=r, group=groups["episodes"])
                    assert box[0][0] == step, (r, box[0][0], step)
                    got.append(box[0][1:])
            if len(pools.train_ranks) > 1:
                box = [got]
                dist.broadcast_object_list(box, src=0, group=train_groups.dp_group)
                got = box[0]
            versions = {e: v for vs, _, _, _ in got for e, v in vs.items()}  # id -> (version_first, version_last)
            trajs = sorted((t for _, ts, _, _ in got for t in ts), key=lambda t: t.episode_id)
            staleness = [step - 1 - versions[t.episode_id][0] for t in trajs]  # its oldest token's version
            assert max(staleness) <= k and min(staleness) >= 0, f"staleness {staleness} outside 0..{k}"
            t1 = time.perf_counter()
            samples, share, filtered, broken = step_samples(lr, trajs)
            batch, meta = experience(lr, trajs, share, samples)
            slow_hook("EARL_SLOW_TRAIN_S")
            tstats = seeded_train_step(lr.trainer, lr.optim, batch, cfg, step, train_groups.dp_rank)
            t2 = time.perf_counter()
            push_bytes = push.send(lr.model, version=step)
            t3 = time.perf_counter()
            # stop after this step? rank 0's clock, any rank's SIGTERM (a rollout rank's came with its episodes)
            past = deadline_s is not None and time.perf_counter() - (t_call or origin) > deadline_s
            past, stop = vote_stop(past, sigterm.requested or any(s for _, _, _, s in got), train_groups.dp_group)
            preempted = preempted or stop
            done = past or stop or step == last
            due = bool(every) and step % every == 0 and not done
            if rank == 0:
                said = _say(step, STOP if done else SAVE if due else GO, stop, pools.rollout_ranks, groups["words"])
                ordered = [meta[t.episode_id] for t in trajs]
                final_stats = dataclasses.asdict(workload_stats(ordered, step, cfg.sampling.max_context))
                rec.spans += _train_spans(origin, step, t0, t1, t2, t3, tstats)
                rec.spans += [sp for _, _, sps, _ in got for sp in sps]  # the replicas' spans ride with their episodes
                row = _metrics_row(cfg, lr, pools, step, ordered, share, tstats, staleness, versions, world,
                                   (t0, t1, t2, t3, t_prev))
                row.update(weight_push_sent_bytes=push_bytes,  # rank 0's share: the planner spreads the sends
                           samples_trained=len(samples), groups_filtered=len(filtered), env_errors_dropped=broken)
                t_prev = t3
                records = [{**r, "version_first": versions[r["id"]][0], "version_last": versions[r["id"]][1]}
                           for r in episode_records(ordered)]
                rec.log_step(row, records, [])
                rec.flush(with_trace=due or done)  # the trace with each checkpoint, as the sync loop writes it
                echo(f"step {step:4d}  reward {row['reward_mean']:+.3f}  loss {row['loss']:+.4f}  staleness mean "
                     f"{row['staleness_mean']:.2f} max {row['staleness_max']}  {row['step_s']:.2f}s/step")
            if due:
                ckpt = save_mid_run(out, step, cfg, lr.model, {n: p.detach() for n, p in lr.model.named_parameters()},
                                    (lr.optim.state_tensors(), lr.optim.step_count) if rank == 0 else None,
                                    source=lr.source, stats=final_stats)
                saved.append(step)
            if done:
                break
            step_gc.step_done(step)
    for work, _ in said:
        work.wait()
    push.end()
    if rank == 0:
        drained = _drain(pools.rollout_ranks, groups["episodes"])
        parts = [None] * world
        dist.gather_object(None, parts, dst=0)
        mine = weights_digest(lr.model)
        rollout_parts = [parts[r] for r in pools.rollout_ranks]
        for _, _, sp in rollout_parts:  # those of steps not trained, and waits after the last send
            rec.spans += sp
        rec.flush(with_trace=True)
        rec.close()
        info = {"train_ranks": list(pools.train_ranks), "rollout_ranks": list(pools.rollout_ranks),
                "split": pools.how, "max_staleness": k, "train_digest": mine,
                "rollout_digests": [p[0] for p in rollout_parts], "rollout_swaps": [p[1] for p in rollout_parts],
                "weights_equal": all(p[0] == mine for p in rollout_parts), "mid_run_checkpoints": saved,
                "steps_drained": drained}
        atomic_write_text(out / ASYNC_JSON, json.dumps(info, indent=2))
        box = [(lr.optim.state_tensors(), lr.optim.step_count) if cfg.checkpoints and info["weights_equal"] else None]
    else:
        dist.gather_object(None, None, dst=0)
        box = [None]
    dist.broadcast_object_list(box, src=0)
    if rank == 0 and not info["weights_equal"]:
        raise RuntimeError("after the final weight push a rollout replica's weights differ from training's")
    if box[0] is not None:
        ckpt = save_async_checkpoint(out, step, cfg, world, lr.model, *box[0], source=lr.source, stats=final_stats)
        if rank == 0 and not preempted:  # a preempted job's grace period is for the checkpoint only
            export_hf(out / HF_EXPORT, {n: p.detach() for n, p in lr.model.named_parameters()}, lr.model.config,
                      lr.tokenizer)
    return (rec.metrics.rows if rec is not None else []), ckpt, first, step, preempted


def _train_spans(origin: float, step: int, t0: float, t1: float, t2: float, t3: float, tstats: dict) -> list[Span]:
    return [Span(name="wait_samples", stage="dispatch", rank=0, t_start=t0 - origin, t_end=t1 - origin, step=step),
            Span(name="train_step", stage="train", rank=0, t_start=t1 - origin, t_end=t2 - origin, step=step,
                 tokens=int(tstats["train_tokens"])),
            Span(name="weight_push", stage="reshard", rank=0, t_start=t2 - origin, t_end=t3 - origin, step=step)]


def _metrics_row(cfg: RunConfig, lr: Learner, pools: Pools, step: int, ordered: list[SampleMeta], share: list[int],
                 tstats: dict, staleness: list[int], versions: dict, world: int, times: tuple) -> dict:
    t0, t1, t2, t3, t_prev = times
    gap = lr.trainer.gap[0] if share else dict.fromkeys(SUM_KEYS, 0.0)
    gen_tokens = sum(m.generated for m in ordered)
    return {"step": step, **outcome_metrics(ordered), **tstats,
            **mismatch_metrics(gap, lr.trainer.gap[1], lr.trainer.cfg.tis_cap),
            "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness),
            "episodes_spanning_versions": sum(a != b for a, b in versions.values()),
            "rollout_pool": len(pools.rollout_ranks), "train_pool": len(pools.train_ranks),
            "wait_samples_s": t1 - t0, "train_s": t2 - t1, "weight_push_s": t3 - t2,
            "step_s": t3 - t_prev, "gen_tokens_per_s": gen_tokens / max(t3 - t_prev, 1e-9),
            "world": world, "schedule": "async", "plan_rollout": "tp1-dp1 x " + str(len(pools.rollout_ranks)),
            "plan_train": f"tp1-dp{len(pools.train_ranks)}"}


def run_async_training(cfg: RunConfig, out: Path, rank: int, world: int, *, resume, echo, stop_at=None,
                       deadline_s=None, t_call=None) -> tuple[list[dict], Path | None, int, int, bool]:
    """`earl run` with `schedule.mode = "async"` on this rank (earl.runtime.run branches here):
    (metrics rows, the last checkpoint, the first step run, the last, stopped by SIGTERM)."""
    if rank == 0:
        check_out(out, resume)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    hw, _ = resolve_hardware(cfg)
    tokenizer = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype).tokenizer
    stats = start_stats(cfg, tokenizer, sampling_params(cfg).max_new_tokens)
    return run_async(cfg, out, rank, world, hardware=hw, spec=model_spec(cfg.model.path), stats=stats,
                     echo=echo, resume=resume, stop_at=stop_at, deadline_s=deadline_s, t_call=t_call)
