"""Asynchronous RL in the runtime (`schedule.mode = "async"`): a rollout pool generating on its
own processes while a training pool trains, with bounded staleness (the design the simulator
prices in earl.sim.async_rl, with the same keys and the same pool-split policy).

The world splits into a training pool, ranks 0..T-1 (rank 0 writes the run's files), and a
rollout pool, ranks T..N-1, sized by `schedule.rollout_gpus` or, when 0, by
earl.policies.pools.choose_pool_split on the run's calibrated profile (the simulator's call).
Each rollout rank is an independent replica (tp1) playing its share of every step's episodes;
the training pool trains data-parallel over its ranks (tp1-dpT, ReplicatedAdamW).

Policy version v = optimizer steps taken. Step s trains on version s-1's weights and makes
version s. A rollout replica plays step s's episodes with the newest version it holds, and
before starting them waits until it holds at least version s-1-K (K = `max_staleness`): a sample
older than K is never generated, so none is ever dropped. Each episode carries its version and
its per-token behaviour log-probs (the engine's); training takes step s's episodes (the oldest
ones waiting) and corrects them with the decoupled-PPO weight min(pi_prox / pi_behaviour, C)
per token (earl.runtime.mismatch.tis_weights; pi_prox is the policy before this step, C is
`trainer.tis_cap`, or ASYNC_TIS_CAP when that is 0), on every algorithm of the trainer.

After each optimizer step rank 0 broadcasts the weights, in buckets, to a group of itself and
the rollout ranks; a thread on each rollout rank receives them into a staging buffer and the
replica swaps them in between steps' episodes (no partial rollout: the replica drains first).
A checkpoint is written at the end of the run (not every `checkpoint_every` steps yet), whole
on every rank (tp1-dpN), so that both pools join DCP's collective; it resumes in either mode,
and an async run resumes from a sync run's checkpoint too (DCP re-shards both ways).

    earl run --nproc 2 --steps 4 --set schedule.mode=async --set schedule.max_staleness=1
    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_async.py
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import queue
import sys
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
from earl.runtime.dist import comm_device
from earl.runtime.engine import make_engine
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
    workload_stats,
)
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import Trainer, batch_logprobs
from earl.runtime.worker import sampling_params
from earl.specs import ParallelPlan, Stage, StagePlan, WorkloadStats
from earl.trace import Span, atomic_write_text

ASYNC_TIS_CAP = 2.0  # the behaviour-weight cap when trainer.tis_cap is 0 (verl's default TIS cap)
PUSH_BUCKET_BYTES = 32 * 2**20  # one weight-push broadcast carries at most this many bytes
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


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in order (bitwise equality of two copies)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
    return h.hexdigest()


def _buckets(numel: int, itemsize: int) -> list[tuple[int, int]]:
    per = max(1, PUSH_BUCKET_BYTES // itemsize)
    return [(a, min(numel, a + per)) for a in range(0, numel, per)]


def push_weights(model: torch.nn.Module, group) -> None:
    """Rank 0: the training weights to the rollout ranks of `group`, bucket by bucket."""
    flat = _flat(model)
    for a, b in _buckets(flat.numel(), flat.element_size()):
        dist.broadcast(flat[a:b].contiguous(), src=0, group=group)


class WeightReceiver(threading.Thread):
    """A rollout rank's receiver of `pushes` weight versions: each arrives in a fresh staging
    buffer and waits in `ready` (version, flat tensor) until the replica swaps it in."""

    def __init__(self, like: torch.Tensor, group, pushes: int, first_version: int):
        super().__init__(daemon=True)
        self.like, self.group, self.pushes, self.first = like, group, pushes, first_version
        self.ready: queue.Queue = queue.Queue()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for k in range(self.pushes):
                buf = torch.empty_like(self.like)
                for a, b in _buckets(buf.numel(), buf.element_size()):
                    part = buf[a:b]
                    dist.broadcast(part, src=0, group=self.group)
                self.ready.put((self.first + k, buf))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = e
            self.ready.put((None, None))


class Replica:
    """A rollout rank: its own copy of the policy, its engine, the version it holds."""

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

    def swap_in(self, flat: torch.Tensor, version: int) -> None:
        off = 0
        with torch.no_grad():
            for p in self.model.parameters():
                n = p.numel()
                p.copy_(flat[off:off + n].view_as(p))
                off += n
        self.version, self.swaps = version, self.swaps + 1

    def take_newest(self, recv: WeightReceiver, at_least: int) -> None:
        """Swap in the newest pushed version, waiting for pushes until it is >= `at_least`."""
        newest = None
        while True:
            block = (newest[0] if newest else self.version) < at_least
            try:
                got = recv.ready.get(block=block, timeout=600 if block else None)
            except queue.Empty:
                if block:
                    raise RuntimeError("timed out waiting for a weight push from the training pool") from None
                break
            if got[0] is None:
                raise RuntimeError(f"weight push failed: {recv.error}") from recv.error
            newest = got
        if newest is not None:
            self.swap_in(newest[1], newest[0])

    def play(self, step: int, share: list[int]) -> list[Trajectory]:
        return play_episodes(self.engine, self.cfg, self.params, step, share)


def run_rollout_rank(cfg: RunConfig, pools: Pools, push_group, rank: int, first: int, last: int,
                     origin: float, out: Path, weights: dict | None) -> list[Span]:
    """Steps first..last of one rollout replica; returns its spans. Pushes arrive after every
    training step (versions first..last)."""
    rep = Replica(cfg, version=first - 1)
    if weights is not None:
        load_weights(rep.model, weights)
    recv = WeightReceiver(_flat(rep.model), push_group, pushes=last - first + 1, first_version=first)
    recv.start()
    k, j = cfg.schedule.max_staleness, pools.rollout_ranks.index(rank)
    spans = []
    for step in range(first, last + 1):
        fault_hook(rank, step)
        t0 = time.perf_counter()
        rep.take_newest(recv, at_least=step - 1 - k)  # never generate a sample staler than K
        t1 = time.perf_counter()
        if t1 - t0 > 1e-3:
            spans.append(Span(name="wait_weights", stage="reshard", rank=rank, t_start=t0 - origin,
                              t_end=t1 - origin, step=step))
        share = list(deal(cfg.episodes_per_step, len(pools.rollout_ranks))[j])
        trajs = rep.play(step, share)
        t2 = time.perf_counter()
        spans.append(Span(name="rollout", stage="rollout", rank=rank, t_start=t1 - origin, t_end=t2 - origin,
                          step=step, tokens=sum(t.generated_tokens for t in trajs), args={"version": rep.version}))
        dist.send_object_list([(rep.version, trajs)], dst=0)
    rep.take_newest(recv, at_least=last)  # the final push: the test of push equality reads it
    recv.join()
    dist.gather_object((weights_digest(rep.model), rep.swaps, spans), None, dst=0)
    box = [None]
    dist.broadcast_object_list(box, src=0)  # rank 0's optimizer state, or None: no checkpoint
    if box[0] is not None:
        save_async_checkpoint(out, last, cfg, dist.get_world_size(), rep.model, *box[0], source="", stats={})
    return spans


def fault_hook(rank: int, step: int) -> None:
    """The fault-injection test hook of the sync loop (EARL_FAULT_RANK_STEP=RANK:STEP)."""
    if os.environ.get("EARL_FAULT_RANK_STEP") == f"{rank}:{step}":
        print(f"rank {rank}: injected fault at step {step}", file=sys.stderr, flush=True)
        os._exit(17)


class Learner:
    """A training rank: the policy under tp1-dpT and its optimizer (from `state`, a loaded
    checkpoint's (params, optimizer slices, optimizer steps), when resuming)."""

    def __init__(self, cfg: RunConfig, groups, state: tuple[dict, dict, int] | None = None):
        self.cfg, self.groups = cfg, groups
        policy = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype)
        self.model, self.tokenizer, self.source = policy.model.to(comm_device()), policy.tokenizer, policy.source
        if state is not None:
            load_weights(self.model, state[0])
        self.params = sampling_params(cfg)
        tcfg = cfg.trainer if cfg.trainer.tis_cap else dataclasses.replace(cfg.trainer, tis_cap=ASYNC_TIS_CAP)
        self.optim = ReplicatedAdamW(self.model, param_shapes(self.model), groups, tcfg)
        if state is not None:
            self.optim.load_state_tensors(state[1], state[2])
        self.trainer = Trainer(self.model, tcfg, temperature=self.params.logprob_temperature,
                               vocab_size=self.tokenizer.vocab_size)


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
                          optimizer: dict, optimizer_step: int, source: str, stats: dict) -> Path:
    """The run's checkpoint after `step`, by every rank (rollout ranks hold the pushed weights,
    equal to training's, and rank 0's optimizer state, broadcast to them). Collective."""
    meta = {"config": to_dict(cfg), "plans": {s.value: initial_plans(cfg, world).for_stage(s).describe()
                                              for s in Stage},
            "world": world, "model_source": source, "stats": stats, "rng": rng_state(), "schedule": "async"}
    return save_checkpoint(out, step, params={n: p.detach() for n, p in model.named_parameters()},
                           optimizer=optimizer, optimizer_step=optimizer_step, shapes=param_shapes(model),
                           plan=checkpoint_plan(world), meta=meta, keep=cfg.keep_checkpoints)


def experience(lr: Learner, trajs: list[Trajectory], share: list[int]):
    """This training rank's ExperienceBatch of `share` (episode ids) with advantages over the
    whole step's episodes."""
    cfg = lr.cfg
    meta = {t.episode_id: SampleMeta.of(t) for t in trajs}
    samples = [Sample(id=m.id, tokens=m.tokens, group=m.group) for m in meta.values()]
    store = rollout_store(trajs)
    spec = AdvantageSpec(estimator=cfg.trainer.algo, per_turn=cfg.trainer.baseline == "per-turn",
                         gamma=cfg.trainer.gamma)
    fill_advantages(store, samples, local_stats(store, samples, spec), spec)
    batch = padded_batch(store, share, meta, lr.tokenizer.pad_id)  # zeros where the store has no field
    batch.ref_logprobs = None  # no reference model (check_schedule: kl_coef 0)
    batch.old_logprobs = None  # one optimizer step: the training forward is the proximal policy
    if lr.trainer.needs_old_logprobs:  # minibatches > 1: the proximal policy is the one before this step
        batch.old_logprobs = batch_logprobs(lr.model, batch, lr.params.logprob_temperature,
                                            cfg.trainer.token_budget, lr.tokenizer.vocab_size)
    return batch, meta


def run_async(cfg: RunConfig, out: Path, rank: int, world: int, *, hardware: str, spec, stats: WorkloadStats,
              echo, resume: Path | None = None) -> tuple[list[dict], Path | None, int]:
    """The whole asynchronous run on this rank, from the start or from a checkpoint of either
    mode; returns (rank 0: every metrics row, else []; the checkpoint written; the first step)."""
    pools = split_pools(cfg, world, hardware, spec, stats)
    train_groups = build_plan_groups(ParallelPlan(dp=len(pools.train_ranks)))  # collective, every rank
    push_group = dist.new_group([0, *pools.rollout_ranks])
    origin = time.perf_counter()
    last, first, state = cfg.steps, 1, None
    if resume is not None:
        params, optimizer, optimizer_step, meta = load_async_checkpoint(find_checkpoint(resume),
                                                                        load_policy(cfg.model.path).model, rank, world)
        first, state = int(meta["step"]) + 1, (params, optimizer, optimizer_step)
        if first > last:
            raise ValueError(f"the checkpoint is at step {first - 1} and steps={last}: nothing to do (raise --steps)")
    if rank in pools.rollout_ranks:
        run_rollout_rank(cfg, pools, push_group, rank, first, last, origin, out,
                         weights=state[0] if state is not None else None)
        return [], None, first
    lr = Learner(cfg, train_groups, state=state)
    rec = None
    if rank == 0:
        echo(f"earl run: schedule async, max_staleness {cfg.schedule.max_staleness}: rollout pool "
             f"{len(pools.rollout_ranks)} process(es) (ranks {pools.rollout_ranks[0]}-{pools.rollout_ranks[-1]}, "
             f"tp1 replicas), training pool {len(pools.train_ranks)} (tp1-dp{len(pools.train_ranks)}); split by "
             f"{pools.how}; behaviour-weight cap {lr.trainer.cfg.tis_cap:g}; steps {first}-{last}"
             + (f" from {resume}" if resume is not None else "") + "; a checkpoint at the end only")
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps(to_dict(cfg), indent=2))
        rec = RunRecorder(out, resume_step=first - 1 if resume is not None else None,
                          wandb_config=to_dict(cfg) if cfg.wandb else None)
    k = cfg.schedule.max_staleness
    rows, spans = [], []
    t_prev = time.perf_counter()
    final_stats: dict = {}
    for step in range(first, last + 1):
        fault_hook(rank, step)
        t0 = time.perf_counter()
        got = []
        if rank == 0:
            for r in pools.rollout_ranks:  # step s's episodes: the oldest waiting
                box = [None]
                dist.recv_object_list(box, src=r)
                got.append(box[0])
        if len(pools.train_ranks) > 1:
            box = [got]
            dist.broadcast_object_list(box, src=0, group=train_groups.dp_group)
            got = box[0]
        version_of = {t.episode_id: v for v, trajs in got for t in trajs}
        trajs = sorted((t for _, ts in got for t in ts), key=lambda t: t.episode_id)
        staleness = [step - 1 - version_of[t.episode_id] for t in trajs]
        assert max(staleness) <= k and min(staleness) >= 0, f"staleness {staleness} outside 0..{k}"
        t1 = time.perf_counter()
        share = list(deal(len(trajs), len(pools.train_ranks))[train_groups.dp_rank])
        batch, meta = experience(lr, trajs, share)
        tstats = seeded_train_step(lr.trainer, lr.optim, batch, cfg, step, train_groups.dp_rank)
        t2 = time.perf_counter()
        if rank == 0:
            push_weights(lr.model, push_group)
        t3 = time.perf_counter()
        if rank != 0:
            continue
        spans += [Span(name="wait_samples", stage="dispatch", rank=0, t_start=t0 - origin, t_end=t1 - origin,
                       step=step),
                  Span(name="train_step", stage="train", rank=0, t_start=t1 - origin, t_end=t2 - origin, step=step,
                       tokens=int(tstats["train_tokens"])),
                  Span(name="weight_push", stage="reshard", rank=0, t_start=t2 - origin, t_end=t3 - origin,
                       step=step)]
        ordered = [meta[t.episode_id] for t in trajs]
        final_stats = dataclasses.asdict(workload_stats(ordered, step, cfg.sampling.max_context))
        gap = lr.trainer.gap[0] if share else dict.fromkeys(SUM_KEYS, 0.0)
        gen_tokens = sum(m.generated for m in ordered)
        row = {"step": step, **outcome_metrics(ordered), **tstats,
               **mismatch_metrics(gap, lr.trainer.gap[1], lr.trainer.cfg.tis_cap),
               "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness),
               "rollout_pool": len(pools.rollout_ranks), "train_pool": len(pools.train_ranks),
               "wait_samples_s": t1 - t0, "train_s": t2 - t1, "weight_push_s": t3 - t2,
               "step_s": t3 - t_prev, "gen_tokens_per_s": gen_tokens / max(t3 - t_prev, 1e-9),
               "world": world, "schedule": "async", "plan_rollout": "tp1-dp1 x " + str(len(pools.rollout_ranks)),
               "plan_train": f"tp1-dp{len(pools.train_ranks)}", "samples_trained": len(trajs)}
        t_prev = t3
        rows.append(row)
        rec.log_step(row, episode_records(ordered), [])
        rec.flush(with_trace=False)
        echo(f"step {step:4d}  reward {row['reward_mean']:+.3f}  loss {row['loss']:+.4f}  staleness mean "
             f"{row['staleness_mean']:.2f} max {row['staleness_max']}  {row['step_s']:.2f}s/step")
    if rank == 0:
        parts = [None] * world
        dist.gather_object(None, parts, dst=0)
        mine = weights_digest(lr.model)
        rollout_parts = [parts[r] for r in pools.rollout_ranks]
        for _, _, sp in rollout_parts:
            spans += sp
        rec.spans += spans
        rec.flush(with_trace=True)
        rec.close()
        info = {"train_ranks": list(pools.train_ranks), "rollout_ranks": list(pools.rollout_ranks),
                "split": pools.how, "max_staleness": k, "train_digest": mine,
                "rollout_digests": [p[0] for p in rollout_parts], "rollout_swaps": [p[1] for p in rollout_parts],
                "weights_equal": all(p[0] == mine for p in rollout_parts)}
        atomic_write_text(out / ASYNC_JSON, json.dumps(info, indent=2))
        box = [(lr.optim.state_tensors(), lr.optim.step_count) if cfg.checkpoints and info["weights_equal"] else None]
    else:
        dist.gather_object(None, None, dst=0)
        box = [None]
    dist.broadcast_object_list(box, src=0)
    if rank == 0 and not info["weights_equal"]:
        raise RuntimeError("after the final weight push a rollout replica's weights differ from training's")
    ckpt = None
    if box[0] is not None:
        ckpt = save_async_checkpoint(out, last, cfg, world, lr.model, *box[0], source=lr.source, stats=final_stats)
        if rank == 0:
            export_hf(out / HF_EXPORT, {n: p.detach() for n, p in lr.model.named_parameters()}, lr.model.config,
                      lr.tokenizer)
    return (rec.metrics.rows if rec is not None else []), ckpt, first


def run_async_training(cfg: RunConfig, out: Path, rank: int, world: int, *, resume,
                       echo) -> tuple[list[dict], Path | None, int]:
    """`earl run` with `schedule.mode = "async"` on this rank (earl.runtime.run branches here):
    (metrics rows, the last checkpoint, the first step run)."""
    if rank == 0:
        check_out(out, resume)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    hw, _ = resolve_hardware(cfg)
    tokenizer = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype).tokenizer
    stats = start_stats(cfg, tokenizer, sampling_params(cfg).max_new_tokens)
    return run_async(cfg, out, rank, world, hardware=hw, spec=model_spec(cfg.model.path), stats=stats,
                     echo=echo, resume=resume)
