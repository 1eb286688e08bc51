"""The multi-process RL loop: `earl run --nproc N` (via earl.runtime.launch) or plain torchrun.

Every rank holds a training copy of the policy (tp-sharded by the train plan, ZeRO-1 over its
dp) and a rollout copy (tp-sharded by the rollout plan). Per step:
1. the selector is asked for each stage's plan; a switched, runnable plan is applied in flight:
   weights (train plan: plus optimizer state) are re-sharded to it, no restart;
2. train weights -> rollout layout (earl.runtime.reshard), every step;
3. rollout: each rollout dp replica plays its share of the episodes (tp peers in lockstep);
4. experience: replica leaders send each experience rank the trajectories of its share (point
   to point; metadata goes to every rank), each experience dp group computes old log-probs of
   its share (the train model itself when the experience plan's tp x dp equals
   the train plan's, else its own copy, re-sharded from training every step);
5. dispatch: the configured dispatcher's TransferPlan is executed (earl.runtime.dispatch),
   with distributed GRPO advantages;
6. train: runtime-1's loss + ShardedAdamW (earl.runtime.dist_train).
A per-rank memory budget (CPU: from the runtime's own accounting of weights, gradients,
optimizer state and activations) is checked before training; over budget, the runtime
re-plans to a more memory-sparing train plan, re-shards, and retries the step's training on
the same samples. Per-rank state and switches: earl.runtime.dist_state; checkpoints (resume on
the same or another plan): earl.runtime.checkpoint. A failed peer stops every rank with
one clear message.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m earl.runtime.dist_loop \
        --out runs/dist --rollout-plan tp2-dp1 --train-plan tp1-dp2 --set steps=4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from earl.cost_model import CostModel
from earl.parallel import check_tp_dp, validate_plan
from earl.policies import make_dispatcher, make_selector
from earl.policies.balance import balance_samples
from earl.policies.types import Layout, Sample
from earl.runtime.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from earl.runtime.config import RunConfig, to_dict
from earl.runtime.dispatch import execute_dispatch
from earl.runtime.dist import (
    comm_device,
    exchange_objects,
    init_distributed,
    print0,
    shutdown,
)
from earl.runtime.dist_advantages import Store
from earl.runtime.dist_state import DistOptions, DistRun, MemoryBudgetExceeded, check_supported, runnable
from earl.runtime.dist_train import dist_train_step
from earl.runtime.envs import env_options, make_env
from earl.runtime.loop import (
    check_config,
    default_out_dir,
    episode_records,
    mix_seed,
    outcome_metrics,
    resolve_config,
    workload_stats,
)
from earl.runtime.metrics import RunRecorder, plot_run
from earl.runtime.rollout import rollout
from earl.runtime.trainer import ExperienceBatch, batch_logprobs, collate
from earl.specs import MODEL_CATALOG, ClusterSpec, HardwareSpec, ModelSpec, ParallelPlan, Stage, WorkloadStats
from earl.trace import atomic_write_text


# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------
def _local_batch(delivered: Store, ids: list[int], meta: dict[int, tuple], pad_id: int) -> ExperienceBatch:
    """This rank's training rows, built only from what the dispatcher delivered (plus the
    per-sample group and reward from the step's metadata); fields the loss does not read
    (engine log-probs, per-token rewards, ...) are zeros."""
    n, width = len(ids), max(delivered[i]["input_ids"].numel() for i in ids)
    rows = {"input_ids": torch.full((n, width), pad_id, dtype=torch.long),
            "attention_mask": torch.zeros(n, width, dtype=torch.bool),
            "loss_mask": torch.zeros(n, width, dtype=torch.bool)}
    for name in ("old_logprobs", "ref_logprobs", "advantages"):
        rows[name] = torch.zeros(n, width)
    for r, i in enumerate(ids):
        d, k = delivered[i], delivered[i]["input_ids"].numel()
        rows["input_ids"][r, :k] = d["input_ids"]
        rows["attention_mask"][r, :k] = True
        rows["loss_mask"][r, :k] = d["loss_mask"]
        rows["old_logprobs"][r, :k] = d["old_logprobs"]
        rows["ref_logprobs"][r, :k] = d["ref_logprobs"]
        rows["advantages"][r, :k] = d["advantages"] * d["loss_mask"]
    fields = {"sample_ids": torch.tensor(ids), "group_ids": torch.tensor([meta[i][1] for i in ids]),
              "rewards": torch.tensor([meta[i][2] for i in ids], dtype=torch.float32), **rows}
    for f in dataclasses.fields(ExperienceBatch):  # anything else runtime-1 adds: zeros [N, T]
        if f.name not in fields and f.default is dataclasses.MISSING:
            fields[f.name] = torch.zeros(n, width)
    return ExperienceBatch(**fields)


def _hand_off(run: DistRun, local: list, exp_assign) -> dict[int, object]:
    """Rollout -> experience: each rollout replica sends every experience rank the trajectories
    of its share, point to point. Returns {episode id: trajectory} this rank needs."""
    eg_plan = run.plans.experience
    want_of = {d * eg_plan.tp + t: set(ids) for d, ids in enumerate(exp_assign) for t in range(eg_plan.tp)}
    outgoing: dict[int, list] = {}
    for t in local:
        for dst, ids in want_of.items():
            if t.episode_id in ids:
                outgoing.setdefault(dst, []).append(t)
    got = exchange_objects(outgoing)
    mine = {t.episode_id: t for part in got.values() for t in part}
    need = want_of.get(run.rank, set())
    assert set(mine) == need, f"rank {run.rank}: hand-off delivered {sorted(mine)[:5]}.., needs {sorted(need)[:5]}.."
    return mine


def run_step(run: DistRun, step: int, prev_stats, dispatcher, selector) -> tuple[dict, object, list, list]:
    cfg, world = run.cfg, run.world
    t_step = time.perf_counter()
    run.events = []
    decisions = []
    for stage in Stage:
        t0 = time.perf_counter()
        plan, why = None, ""
        if selector is not None:
            dec = selector.select(stage, dataclasses.replace(prev_stats, step=step), run.plans.for_stage(stage))
            bad = runnable(dec.plan, world, run.policy.model.config) if dec.switched else ""
            decisions.append({"stage": stage.value, "plan": dec.plan.describe(), "switched": dec.switched,
                              "applied": dec.switched and not bad, "reason": dec.reason,
                              **({"not_applied": bad} if bad else {})})
            if dec.switched and not bad:
                plan, why = dec.plan, dec.reason
        for s_step, s_stage, s_plan in run.opts.schedule:
            if s_step == step and s_stage == stage.value:
                plan, why = ParallelPlan.parse(s_plan), f"scheduled switch at step {step}"
        run.span(f"select_{stage.value}", "select", t0, step)
        if plan is not None and plan != run.plans.for_stage(stage):
            {Stage.TRAIN: run.switch_train, Stage.ROLLOUT: run.switch_rollout,
             Stage.EXPERIENCE: run.switch_experience}[stage](plan, why, step)

    run.sync_weights(Stage.ROLLOUT, step)

    # rollout: episode e goes to replica e % dp; tp peers play it in lockstep
    t0 = time.perf_counter()
    rg = run.roll_groups
    seeds, groups = [], []
    for g in range(cfg.groups):
        for _ in range(cfg.group_size):
            seeds.append(mix_seed(cfg.seed, step, g) % (2**31))
            groups.append(g)
    mine = [e for e in range(len(seeds)) if e % run.plans.rollout.dp == rg.dp_rank]
    gen = torch.Generator().manual_seed(mix_seed(cfg.seed, step, 1_000_001, rg.dp_rank))
    env_factory = lambda: make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))
    local = rollout(run.engine, env_factory, seeds=[seeds[e] for e in mine], group_ids=[groups[e] for e in mine],
                    params=run.params, generator=gen, max_context=cfg.sampling.max_context,
                    engine_batch=cfg.engine_batch)
    for e, t in zip(mine, local, strict=True):
        t.episode_id = e
    run.span("rollout", "rollout", t0, step, tokens=sum(t.generated_tokens for t in local))
    local = local if rg.tp_rank == 0 else []  # tp peers hold identical copies; replica leaders send
    # metadata to every rank (id, tokens, group, reward); full trajectories only to rank 0 (metrics,
    # workload trace) and, point to point, to the experience ranks that need them
    metas: list = [None] * world
    dist.all_gather_object(metas, [(t.episode_id, len(t.token_ids), t.group_id, t.reward) for t in local])
    meta = {m[0]: m for part in metas for m in part}
    assert sorted(meta) == list(range(len(seeds))), "an episode was lost"
    samples = [Sample(id=i, tokens=meta[i][1], group=meta[i][2]) for i in sorted(meta)]
    everything: list | None = [None] * world if run.rank == 0 else None
    dist.gather_object(local, everything, dst=0)
    trajs = sorted((t for part in everything for t in part), key=lambda t: t.episode_id) if everything else []
    box = [workload_stats(trajs, step, cfg.sampling.max_context) if run.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # every rank's selector must see the same stats
    stats = box[0]

    train_once = None
    for _attempt in range(4):  # memory-budget re-plans retry the step on the same samples
        tg, plan = run.train_groups, run.plans.train
        eg, exp_plan = run.exp_groups, run.plans.experience
        run.sync_weights(Stage.EXPERIENCE, step)
        # experience: each experience dp group computes old log-probs of its share
        t0 = time.perf_counter()
        exp_assign = tuple(tuple(s.id for s in samples[d::exp_plan.dp]) for d in range(exp_plan.dp))
        by_id = _hand_off(run, local, exp_assign)
        mine_exp = [by_id[i] for i in exp_assign[eg.dp_rank]]
        batch = collate(mine_exp, run.policy.tokenizer.pad_id)
        old = batch_logprobs(run.exp_model or run.train_model, batch, run.params.logprob_temperature,
                             cfg.trainer.token_budget)
        store: Store = {}
        for r, t in enumerate(mine_exp):
            k = len(t.token_ids)
            store[t.episode_id] = {"input_ids": batch.input_ids[r, :k], "loss_mask": batch.loss_mask[r, :k],
                                   "old_logprobs": old[r, :k], "ref_logprobs": old[r, :k],
                                   "rewards": torch.tensor([t.reward]),
                                   "token_rewards": batch.token_rewards[r, :k], "turn_ids": batch.turn_ids[r, :k]}
        run.span("logprob", "experience", t0, step, tokens=sum(len(t.token_ids) for t in mine_exp))
        # dispatch to the training layout
        t0 = time.perf_counter()
        src = Layout(exp_plan, exp_assign)
        dst = Layout(plan, balance_samples(samples, plan.dp)[0])
        tplan = dispatcher.plan(src, dst, samples)
        delivered, dstats = execute_dispatch(tplan, store, samples, src, dst, advantages=run.advantages)
        run.span(tplan.kind, "dispatch", t0, step, bytes=dstats.bytes_sent)
        ids = list(dst.assignment[tg.dp_rank])
        local_batch = _local_batch(delivered, ids, meta, run.policy.tokenizer.pad_id)
        try:
            run.check_budget(int(local_batch.attention_mask.sum()), local_batch.input_ids.shape[1], step)
        except MemoryBudgetExceeded as e:
            nxt = run.sparing_plan(int(local_batch.attention_mask.sum()), local_batch.input_ids.shape[1])
            if nxt is None:
                raise MemoryBudgetExceeded(f"{e}; no runnable train plan needs less") from None
            run.switch_train(nxt, f"memory budget: {e}", step)
            continue
        t0 = time.perf_counter()
        train_once = dist_train_step(run.trainer, run.optim, local_batch,
                                     progress=(step - 1) / max(cfg.steps - 1, 1))
        run.span("train_step", "train", t0, step, tokens=int(train_once["train_tokens"]))
        break
    if train_once is None:
        raise MemoryBudgetExceeded(f"step {step}: still over the memory budget after re-planning")
    row = {"step": step, **(outcome_metrics(trajs) if trajs else {}), **train_once,
           "step_s": time.perf_counter() - t_step,
           "world": world, "plan_rollout": run.plans.rollout.describe(),
           "plan_experience": run.plans.experience.describe(), "plan_train": run.plans.train.describe(),
           "plan_switches": len(run.events), "replans": sum("memory budget" in e["reason"] for e in run.events),
           "switch_reasons": "; ".join(f"{e['stage']}: {e['from']} -> {e['to']} ({e['reason']})"
                                       for e in run.events),
           "dispatcher": tplan.kind, "dispatch_bytes": tplan.total_bytes,
           "samples_trained": len(samples) if train_once["train_tokens"] > 0 else 0,
           "memory_accounted_bytes": run.memory_bytes(run.plans.train, int(local_batch.attention_mask.sum()),
                                                      local_batch.input_ids.shape[1])}
    for stage in ("rollout", "experience", "dispatch", "train", "reshard"):  # this rank's stage times
        row[f"{stage}_s"] = sum(sp.duration_s for sp in run.spans if sp.stage == stage and sp.step == step)
    return row, stats, decisions, episode_records(trajs)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
def run_distributed(cfg: RunConfig, out_dir: str | Path, opts: DistOptions, *,
                    resume: str | Path | None = None) -> list[dict]:
    """The loop on this rank (inside torchrun); returns rank 0's metric rows."""
    env = init_distributed()
    if env.world < 2:
        raise ValueError("run_distributed needs torchrun with >= 2 processes (use `earl run` for one)")
    out = Path(out_dir)
    ckpt = find_checkpoint(resume) if resume is not None else None
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    run = DistRun(cfg, opts, out, env.rank, env.world)
    start = _load_checkpoint(run, ckpt) if ckpt is not None else 0
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint is at step {start} and steps={cfg.steps}: nothing to do (raise --steps)")
    rec = None
    if env.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps(to_dict(cfg), indent=2))
        atomic_write_text(out / "dist.json", json.dumps({
            "world": env.world, "plans": {st.value: run.plans.for_stage(st).describe() for st in Stage},
            "memory_budget_bytes": opts.memory_budget_bytes, "schedule": [list(x) for x in opts.schedule]}))
        rec = RunRecorder(out, resume_step=start if ckpt is not None else None, tensorboard=False)
    spec = run.policy.spec
    cm = CostModel(spec, ClusterSpec.for_gpus(HardwareSpec.from_name("cpu"), env.world))
    selector = make_selector(cfg.selector, cost_model=cm, initial=run.plans, stage_gpus=env.world) \
        if cfg.selector != "static" else None
    dispatcher = make_dispatcher(cfg.dispatcher)
    first = len(run.policy.tokenizer.encode(make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env)).reset(0)))
    prev = WorkloadStats(num_responses=cfg.episodes_per_step, context_mean=first + run.params.max_new_tokens,
                         context_p95=first + run.params.max_new_tokens, context_max=first + run.params.max_new_tokens,
                         max_context=cfg.sampling.max_context)
    step = start
    stage = "setup"
    try:
        for step in range(start + 1, cfg.steps + 1):
            stage = f"step {step}"
            if os.environ.get("EARL_FAULT_RANK_STEP") == f"{env.rank}:{step}":  # fault-injection test hook
                print(f"rank {env.rank}: injected fault at step {step}", file=sys.stderr, flush=True)
                os._exit(17)
            row, prev, decisions, episodes = run_step(run, step, prev, dispatcher, selector)
            spans: list = [None] * env.world
            dist.all_gather_object(spans, run.spans)
            run.spans = []
            if rec is not None:
                rec.spans.extend(s for part in spans for s in part)
                rec.log_step(row, episodes, decisions + run.events)
                rec.flush()
                print0(f"step {step:4d}  reward {row['reward_mean']:+.3f}  loss {row['loss']:+.4f}  "
                       f"rollout {row['plan_rollout']}  train {row['plan_train']}  {row['step_s']:.2f}s")
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 or step == cfg.steps:
                stage = f"checkpoint at step {step}"
                _save_checkpoint(run, step, prev)
    except (RuntimeError, ConnectionError) as e:
        if isinstance(e, MemoryBudgetExceeded):
            raise
        last = _last_checkpoint(out)
        msg = (f"earl run: rank {env.rank} lost contact with a peer during {stage} "
               f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); stopping. "
               f"Last complete checkpoint: {last or 'none'}"
               + (f"; continue with --resume {out}" if last else ""))
        print(msg, file=sys.stderr, flush=True)
        raise SystemExit(3) from None
    if rec is not None and cfg.plots:
        plot_run(out)
    return rec.metrics.rows if rec is not None else []


def _save_checkpoint(run: DistRun, step: int, stats: WorkloadStats) -> None:
    """Every rank writes its train-plan shards (weights and ZeRO-1 optimizer slices)."""
    meta = {"config": to_dict(run.cfg), "plans": {s.value: run.plans.for_stage(s).describe() for s in Stage},
            "world": run.world, "model_source": run.policy.source, "stats": dataclasses.asdict(stats)}
    save_checkpoint(run.out, step, params={n: p.detach() for n, p in run.train_model.named_parameters()},
                    optimizer=run.optim.state_tensors(), optimizer_step=run.optim.step_count, shapes=run.shapes,
                    plan=run.plans.train, meta=meta, keep=run.cfg.keep_checkpoints)


def _load_checkpoint(run: DistRun, ckpt: Path) -> int:
    """Each rank reads its shards under the current train plan (any plan or world it was saved on)."""
    got = load_checkpoint(ckpt, shapes=run.shapes, plan=run.plans.train, rank=run.rank, world=run.world,
                          device=comm_device())
    run._build_train(run.plans.train, state=({**got.params, **got.optimizer}, got.optimizer_step))
    return int(got.meta["step"])


def _last_checkpoint(out: Path) -> str:
    try:
        return str(find_checkpoint(out))
    except ValueError:
        return ""


def dist_options(world: int, *, rollout_plan: str | None = None, train_plan: str | None = None,
                 experience_plan: str | None = None, memory_budget_mb: float = 0.0,
                 schedule: list[str] | tuple[str, ...] = ()) -> DistOptions:
    """DistOptions from command-line strings (what `earl run` passes when WORLD_SIZE > 1).
    Defaults: rollout tp1-dpN, training tp1-dpN with a ZeRO-1 optimizer."""
    if memory_budget_mb < 0:
        raise ValueError(f"--memory-budget-mb must be >= 0, got {memory_budget_mb}")
    sched = []
    for item in schedule:
        parts = item.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in ("rollout", "experience", "train"):
            raise ValueError(f"--schedule {item!r}: expected STEP:rollout|experience|train:PLAN, "
                             "e.g. 3:train:tp2-dp1")
        sched.append((int(parts[0]), parts[1], ParallelPlan.parse(parts[2]).describe()))
    return DistOptions(
        rollout_plan=ParallelPlan.parse(rollout_plan) if rollout_plan else ParallelPlan(dp=world),
        train_plan=ParallelPlan.parse(train_plan) if train_plan else ParallelPlan(dp=world, sharded_optimizer=True),
        experience_plan=ParallelPlan.parse(experience_plan) if experience_plan else None,
        memory_budget_bytes=memory_budget_mb * 2**20, schedule=tuple(sched))


def parse_args(argv: list[str], world: int | None = None) -> tuple[RunConfig, Path, DistOptions, str | None]:
    """`earl run`'s arguments ([CONFIG] --env --model --steps --out --resume --set) plus the
    multi-process ones (--rollout-plan --train-plan --memory-budget-mb --schedule)."""
    ap = argparse.ArgumentParser(prog="earl run --nproc N", description="multi-process EARL run")
    ap.add_argument("config", nargs="?", default=None)
    ap.add_argument("--env", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", default=None, help="run folder (default: the --resume folder)")
    ap.add_argument("--resume", default=None)
    ap.add_argument("--rollout-plan", default=None, help="e.g. tp2-dp1 (default: tp1-dpN)")
    ap.add_argument("--train-plan", default=None, help="e.g. tp1-dp2-zero (default: tp1-dpN-zero)")
    ap.add_argument("--experience-plan", default=None, help="e.g. tp2-dp1 (default: the train plan)")
    ap.add_argument("--memory-budget-mb", type=float, default=0.0, help="per-rank budget; 0 = none")
    ap.add_argument("--schedule", action="append", default=[],
                    help="STEP:rollout|experience|train:PLAN scripted switch")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args(argv)
    if a.out is None and a.resume is None:
        raise ValueError("give --out DIR (or --resume DIR to continue a run)")
    sets = {}
    for item in a.sets:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, val = item.split("=", 1)
        sets[key.strip()] = val.strip()
    for key, val in (("env.name", a.env), ("model.path", a.model), ("steps", a.steps)):
        if val is not None:
            sets[key] = str(val)
    cfg = resolve_config(a.config, resume=a.resume, overrides=sets)
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    opts = dist_options(world, rollout_plan=a.rollout_plan,
                        train_plan=a.train_plan, experience_plan=a.experience_plan,
                        memory_budget_mb=a.memory_budget_mb, schedule=a.schedule)
    out = Path(a.out) if a.out else default_out_dir(a.resume)  # a resumed checkpoint's run folder
    return cfg, out, opts, a.resume


def check_launch(nproc: int, argv: list[str]) -> list[str]:
    """Validate a multi-process run's arguments before any process starts (ValueError: one
    line for the user); returns them with an explicit --out (all ranks must agree on it)."""
    if not any(a == "--out" or a.startswith("--out=") for a in argv) and \
            not any(a == "--resume" or a.startswith("--resume=") for a in argv):
        argv = [*argv, "--out", str(default_out_dir(None))]
    cfg, out, opts, _ = parse_args(argv, world=nproc)
    check_config(cfg)
    spec = (ModelSpec.from_name(cfg.model.path) if cfg.model.path in MODEL_CATALOG
            else ModelSpec.from_hf_config(cfg.model.path))
    plans = [opts.rollout_plan, opts.train_plan] + ([opts.experience_plan] if opts.experience_plan else [])
    plans += [ParallelPlan.parse(p) for _, _, p in opts.schedule]
    for plan in plans:
        check_tp_dp(validate_plan(plan, spec, world=nproc), nproc)
    check_supported(cfg)
    return argv


def main(argv: list[str] | None = None) -> None:
    code = 0
    try:
        cfg, out, opts, resume = parse_args(sys.argv[1:] if argv is None else argv)
        run_distributed(cfg, out, opts, resume=resume)
    except ValueError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        code = 2
    except SystemExit as e:
        code = int(e.code or 0)
    shutdown(code)


if __name__ == "__main__":
    main()
