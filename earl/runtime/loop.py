"""The single-process RL loop behind `earl run`.

Per step, the same path the multi-process runtime and the simulator walk: the selector is asked
for a plan before rollout, experience preparation and training (its Decision is logged); the
rollout plays multi-turn episodes with the engine; the experience stage computes old/reference
log-probs and advantages; the dispatcher plans the hand-off of the experience batch to the
training layout (on one process every transfer is local) and the plan is executed; the trainer
updates the very module the engine runs. Outputs: see `earl.runtime.metrics`; checkpoints: see
`earl.runtime.checkpoint`.

    earl run --steps 20 --out runs/demo
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from earl.runtime.checkpoint import find_checkpoint, load_model_checkpoint, read_meta, save_model_checkpoint
from earl.runtime.config import RunConfig, apply_overrides, from_dict, load_config_file, to_dict
from earl.runtime.engine import SamplingParams, make_engine
from earl.runtime.envs import ENVS, env_options, make_env
from earl.runtime.metrics import RunRecorder, plot_run
from earl.runtime.model import check_dtype, check_model_path, frozen_copy, load_policy
from earl.runtime.rollout import Trajectory, rollout
from earl.runtime.trainer import ExperienceBatch, Trainer, collate
from earl.specs import ParallelPlan, Stage, StagePlan, WorkloadStats, unknown_name_error
from earl.trace import Span, atomic_write_text

OUTCOME_RATES = ("win", "draw", "loss", "invalid", "correct", "wrong", "truncated")


@dataclass
class RunResult:
    out_dir: Path
    first_step: int  # first step this call ran
    last_step: int  # last step completed
    metrics: list[dict]  # all rows of metrics.jsonl (including earlier runs when resumed)
    last_checkpoint: Path | None


def resolve_config(config_file: str | Path | None = None, *, resume: str | Path | None = None,
                   overrides: dict | None = None) -> RunConfig:
    """Default, or the checkpoint's config when resuming, or a file; then `overrides`."""
    if resume is not None:
        cfg = from_dict(read_meta(find_checkpoint(resume))["config"])
        if config_file is not None:
            raise ValueError("give either a CONFIG file or --resume (the run's config is in its checkpoint)")
    elif config_file is not None:
        cfg = load_config_file(config_file)
    else:
        cfg = RunConfig()
    return apply_overrides(cfg, overrides or {})


def default_out_dir(resume: str | Path | None) -> Path:
    """The run folder of a checkpoint being resumed, else a new runs/run-<time>."""
    if resume is not None:
        ckpt = find_checkpoint(resume)
        return ckpt.parent.parent
    return Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")


def summarize(result: RunResult) -> str:
    """First-10 vs last-10 steps of the run, and where its outputs are."""
    rows = result.metrics
    head, tail = rows[:10], rows[-10:]

    def avg(rs, k):
        vals = [r[k] for r in rs if r.get(k) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    keys = [k for k in ("reward_mean", "win_rate", "draw_rate", "loss_rate", "correct_rate",
                        "invalid_move_rate") if any(r.get(k) for r in rows)]
    lines = [f"steps {rows[0]['step']}-{rows[-1]['step']}: first 10 -> last 10"]
    lines += [f"  {k:18s} {avg(head, k):+.3f} -> {avg(tail, k):+.3f}" for k in keys]
    lines.append(f"outputs in {result.out_dir}: metrics.csv, metrics.jsonl, workload.jsonl, "
                 f"decisions.jsonl, trace.json, plots/, checkpoints/ (last: {result.last_checkpoint})")
    return "\n".join(lines)


def sampling_params(cfg: RunConfig) -> SamplingParams:
    env_cls = ENVS[cfg.env.name]
    s = cfg.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p,
                          max_new_tokens=s.max_new_tokens or env_cls.max_new_tokens,
                          stop=tuple(s.stop) or tuple(env_cls.stop))


def mix_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (splitmix64 rounds)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x & 0x7FFFFFFFFFFFFFFF


def workload_stats(trajs: list[Trajectory], step: int, max_context: int) -> WorkloadStats:
    ctx = sorted(len(t.token_ids) for t in trajs)
    n = len(ctx)
    mean = sum(ctx) / n
    p95 = max(float(ctx[min(n - 1, int(0.95 * n))]), mean)  # a heavy tail can lift the mean above
    return WorkloadStats(step=step, num_responses=n, context_mean=mean,
                         context_p95=p95, context_max=float(ctx[-1]),
                         turns_mean=sum(len(t.turns) for t in trajs) / n,
                         response_tokens_mean=sum(t.generated_tokens for t in trajs) / n,
                         max_context=max_context)


def episode_records(trajs: list[Trajectory]) -> list[dict]:
    """The workload-trace form: per turn [obs_tokens, gen_tokens, env_latency_s]."""
    return [{"id": t.episode_id, "turns": [[u.obs_tokens, u.gen_tokens, round(u.env_latency_s, 7)]
                                           for u in t.turns]} for t in trajs]


def outcome_metrics(trajs: list[Trajectory]) -> dict:
    n = len(trajs)
    rewards = torch.tensor([t.reward for t in trajs])
    actions = sum(t.actions for t in trajs)
    turn_ctx = []
    for t in trajs:
        ctx = 0
        for u in t.turns:
            ctx += u.obs_tokens
            turn_ctx.append(ctx)
            ctx += u.gen_tokens
    ctx = [len(t.token_ids) for t in trajs]
    out = {"episodes": n, "reward_mean": float(rewards.mean()),
           "reward_std": float(rewards.std(unbiased=False)),
           "invalid_move_rate": sum(t.invalid_actions for t in trajs) / max(actions, 1),
           "turns_mean": sum(len(t.turns) for t in trajs) / n,
           "context_mean": sum(ctx) / n, "context_max": max(ctx),
           "turn_context_mean": sum(turn_ctx) / max(len(turn_ctx), 1),
           "gen_tokens_mean": sum(t.generated_tokens for t in trajs) / n,
           "tokens": sum(ctx)}
    for o in OUTCOME_RATES:
        out[f"{o}_rate"] = sum(t.outcome == o for t in trajs) / n
    return out


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class Policies:
    """The selector and dispatcher of a run, and the plans in force."""

    def __init__(self, cfg: RunConfig, spec):
        from earl.cost_model import CostModel
        from earl.policies import make_dispatcher, make_selector
        from earl.specs import ClusterSpec, HardwareSpec

        one = ParallelPlan()
        self.plans = StagePlan(rollout=one, experience=one, train=one)
        hw = "cpu" if cfg.model.device == "cpu" else "h100-sxm-80gb"
        cm = CostModel(spec, ClusterSpec.for_gpus(HardwareSpec.from_name(hw), 1))
        self.selector = make_selector(cfg.selector, cost_model=cm, initial=self.plans, stage_gpus=1)
        self.dispatcher = make_dispatcher(cfg.dispatcher)

    def select(self, stage: Stage, stats: WorkloadStats) -> dict:
        dec = self.selector.select(stage, stats, self.plans.for_stage(stage))
        applied = dec.plan.world_size == 1  # one process: only single-rank plans can run
        if applied:
            self.plans = self.plans.with_stage(stage, dec.plan)
        return {"stage": stage.value, "plan": dec.plan.describe(), "switched": dec.switched,
                "applied": applied, "reason": dec.reason,
                "predicted": {k: v for k, v in dec.predicted.items()
                              if isinstance(v, (int, float, str, bool))}}

    def dispatch(self, batch: ExperienceBatch) -> tuple[ExperienceBatch, dict]:
        """Plan the experience -> train hand-off and execute it (all local on one process)."""
        from earl.policies import balance_samples
        from earl.policies.types import Layout, Sample

        ids = batch.sample_ids.tolist()
        samples = [Sample(i, int(n)) for i, n in zip(ids, batch.lengths.tolist(), strict=True)]
        src = Layout(plan=self.plans.experience, assignment=(tuple(ids),))
        assignment, imbalance = balance_samples(samples, self.plans.train.dp)
        dst = Layout(plan=self.plans.train, assignment=assignment)
        tplan = self.dispatcher.plan(src, dst, samples)
        delivered: dict[int, int] = {}
        for tr in tplan.transfers:
            assert tr.src == 0 and tr.dst == 0, f"transfer {tr} leaves the single process"
            for sid in tr.sample_ids:
                delivered[sid] = delivered.get(sid, 0) + 1
        missing = set(ids) - set(delivered)
        assert not missing, f"dispatch plan lost samples {sorted(missing)[:5]}"
        row = {sid: r for r, sid in enumerate(ids)}
        order = [row[s] for s in assignment[0]]
        info = {"kind": tplan.kind, "transfers": len(tplan.transfers), "bytes": tplan.total_bytes,
                "imbalance": imbalance}
        return batch.select(order), info


def check_config(cfg: RunConfig) -> None:
    """Fail early (ValueError) on an unknown env, bad env options or sampling settings."""
    if cfg.env.name not in ENVS:
        raise unknown_name_error("env", cfg.env.name, ENVS)
    make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))  # checks the env options
    check_model_path(cfg.model.path)
    check_dtype(cfg.model.dtype)
    sampling_params(cfg)


def train(cfg: RunConfig, out_dir: str | Path, *, resume: str | Path | None = None,
          progress: bool = True, echo=print, stop_at: int | None = None,
          deadline_s: float | None = None) -> RunResult:
    """Run (or continue) training; write everything under `out_dir`.

    `stop_at` ends this call after that step and `deadline_s` after the first step that ends
    past that many seconds; either way a checkpoint is written, and `--resume` continues the
    same schedule (the learning-rate decay follows `cfg.steps`, not the stopping point)."""
    t_call = time.perf_counter()
    check_config(cfg)
    out = Path(out_dir)
    ckpt = find_checkpoint(resume) if resume is not None else None
    if ckpt is None and (out / "checkpoints").is_dir():
        raise ValueError(f"{out} already holds a run; pass --resume {out} or another --out")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.model.device)
    policy = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype)
    model = policy.model.to(device)
    ref = frozen_copy(model) if cfg.trainer.kl_coef else None  # the initial weights
    params = sampling_params(cfg)
    engine = make_engine(cfg.engine, model, policy.tokenizer, reuse_kv=cfg.reuse_kv,
                         model_path=cfg.model.path)
    trainer = Trainer(model, cfg.trainer, temperature=params.logprob_temperature, ref_model=ref)
    pol = Policies(cfg, policy.spec)
    start = 0
    if ckpt is not None:
        state = load_model_checkpoint(ckpt, model=model, optimizer=trainer.optimizer)
        start = int(state["step"])
        plans = {k: ParallelPlan.parse(v) for k, v in state["plans"].items()}  # one process: 1-rank plans only
        pol.plans = StagePlan(**{k: p if p.world_size == 1 else ParallelPlan() for k, p in plans.items()})
        resumed_stats = WorkloadStats(**state["stats"])
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint is at step {start} and steps={cfg.steps}: nothing to do "
                         "(raise --steps)")
    echo(f"earl run: {cfg.model.path} on {cfg.env.name}, steps {start + 1}-{cfg.steps} x "
         f"{cfg.episodes_per_step} episodes, {cfg.trainer.algo} -> {out}")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", json.dumps(to_dict(cfg), indent=2))
    rec = RunRecorder(out, resume_step=start if ckpt is not None else None)
    t_offset = max((s.t_end for s in rec.spans), default=0.0)
    origin = time.perf_counter() - t_offset
    env_factory = lambda: make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))
    prompt_len = len(policy.tokenizer.encode(env_factory().reset(0)))
    prev_stats = WorkloadStats(step=0, num_responses=cfg.episodes_per_step,
                               context_mean=prompt_len + params.max_new_tokens,
                               context_p95=prompt_len + params.max_new_tokens,
                               context_max=prompt_len + params.max_new_tokens,
                               max_context=cfg.sampling.max_context)
    if ckpt is not None:
        prev_stats = resumed_stats
    last_ckpt = ckpt
    bar = _Progress(cfg.steps, start, enabled=progress)
    step = start
    last = min(cfg.steps, stop_at or cfg.steps)
    try:
        for step in range(start + 1, last + 1):
            row, prev_stats = _one_step(cfg, step, engine, trainer, pol, rec, env_factory, params,
                                        prev_stats, origin, device)
            if deadline_s is not None and time.perf_counter() - t_call > deadline_s:
                last = step
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 or step == last:
                rec.flush()
                extra = {"plans": {s.value: pol.plans.for_stage(s).describe() for s in Stage},
                         "model_source": policy.source, "stats": dataclasses.asdict(prev_stats)}
                last_ckpt = save_model_checkpoint(out, step, model=model, optimizer=trainer.optimizer,
                                                  meta={"config": to_dict(cfg), **extra}, keep=cfg.keep_checkpoints)
            else:
                rec.flush(with_trace=False)
            bar.update(step, row)
            if not progress and (step % max(1, cfg.steps // 10) == 0 or step == last):
                echo(_summary(row))
            if step == last:
                break
    finally:
        bar.stop()
        rec.flush()
        rec.close()
    if cfg.plots:
        plot_run(out)
    return RunResult(out_dir=out, first_step=start + 1, last_step=step, metrics=rec.metrics.rows,
                     last_checkpoint=last_ckpt)


def _one_step(cfg, step, engine, trainer, pol: Policies, rec: RunRecorder, env_factory, params,
              prev_stats, origin, device):
    t_step, cpu0 = time.perf_counter(), time.process_time()
    spans: list[Span] = []
    decisions: list[dict] = []

    def span(name, stage, t0, t1, **kw):
        spans.append(Span(name=name, stage=stage, rank=0, t_start=t0 - origin, t_end=t1 - origin,
                          step=step, **kw))

    def select(stage, stats):
        t0 = time.perf_counter()
        d = pol.select(stage, stats)
        span(f"select_{stage.value}", "select", t0, time.perf_counter(),
             args={"plan": d["plan"], "switched": d["switched"]})
        decisions.append(d)

    # rollout
    select(Stage.ROLLOUT, dataclasses.replace(prev_stats, step=step))
    seeds, groups = [], []
    for g in range(cfg.groups):
        for _ in range(cfg.group_size):
            seeds.append(mix_seed(cfg.seed, step, g) % (2**31))
            groups.append(g)
    gen = torch.Generator(device=device).manual_seed(mix_seed(cfg.seed, step, 1_000_001))
    st0 = dataclasses.replace(engine.stats)
    t0 = time.perf_counter()
    trajs = rollout(engine, env_factory, seeds=seeds, group_ids=groups, params=params, generator=gen,
                    max_context=cfg.sampling.max_context, engine_batch=cfg.engine_batch)
    t1 = time.perf_counter()
    es = engine.stats
    env_s = sum(u.env_latency_s for t in trajs for u in t.turns)
    span("rollout", "rollout", t0, t1, tokens=es.generated_tokens - st0.generated_tokens,
         args={"prefill_tokens": es.prefill_tokens - st0.prefill_tokens,
               "prefill_s": es.prefill_s - st0.prefill_s, "decode_s": es.decode_s - st0.decode_s,
               "env_s": env_s})
    stats = workload_stats(trajs, step, cfg.sampling.max_context)

    # experience preparation
    select(Stage.EXPERIENCE, stats)
    t2 = time.perf_counter()
    batch = trainer.prepare(collate(trajs, engine.tokenizer.pad_id))
    t3 = time.perf_counter()
    span("logprob", "experience", t2, t3, tokens=int(batch.attention_mask.sum()))

    # hand-off and training
    select(Stage.TRAIN, stats)
    t4 = time.perf_counter()
    batch, disp = pol.dispatch(batch)
    t5 = time.perf_counter()
    span(disp["kind"], "dispatch", t4, t5, bytes=disp["bytes"], args={"transfers": disp["transfers"]})
    train_gen = torch.Generator().manual_seed(mix_seed(cfg.seed, step, 2_000_003))
    tstats = trainer.step(batch, generator=train_gen, progress=(step - 1) / max(cfg.steps - 1, 1))
    t6 = time.perf_counter()
    span("train_step", "train", t5, t6, tokens=int(tstats["train_tokens"]))
    if getattr(engine, "model", None) is not trainer.model:  # e.g. vLLM: push the new weights
        engine.update_weights((n, p.detach()) for n, p in trainer.model.named_parameters())
        span("weight_sync", "sync", t6, time.perf_counter())

    row = {"step": step, **outcome_metrics(trajs), **tstats,
           "prefill_tokens": es.prefill_tokens - st0.prefill_tokens,
           "decode_tokens": es.decode_tokens - st0.decode_tokens,
           "rollout_s": t1 - t0, "env_s": env_s, "experience_s": t3 - t2, "dispatch_s": t5 - t4,
           "train_s": t6 - t5, "step_s": time.perf_counter() - t_step,
           "step_cpu_s": time.process_time() - cpu0,
           "gen_tokens_per_s": (es.generated_tokens - st0.generated_tokens) / max(t1 - t0, 1e-9),
           "peak_mem_bytes": peak_memory_bytes(device),
           "dispatch_transfers": disp["transfers"], "dispatch_bytes": disp["bytes"],
           "plan_rollout": pol.plans.rollout.describe(), "plan_train": pol.plans.train.describe(),
           "plan_switches": sum(d["switched"] for d in decisions)}
    rec.spans.extend(spans)
    rec.log_step(row, episode_records(trajs), decisions)
    return row, stats


def _summary(row: dict) -> str:
    rates = " ".join(f"{k.removesuffix('_rate')} {row[k]:.2f}" for k in
                     ("win_rate", "draw_rate", "loss_rate", "correct_rate") if row.get(k))
    return (f"step {row['step']:4d}  reward {row['reward_mean']:+.3f}  {rates}  "
            f"invalid-move {row['invalid_move_rate']:.3f}  ctx {row['context_mean']:.0f}  "
            f"{row['step_s']:.2f}s/step")


class _Progress:
    """A rich progress bar with the latest step's numbers (no-op when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.p = None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("[bold]earl run"), BarColumn(), MofNCompleteColumn(),
                          TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
        self.task = self.p.add_task("run", total=total, completed=done, info="")
        self.p.start()

    def update(self, step: int, row: dict) -> None:
        if self.p is not None:
            self.p.update(self.task, completed=step, info=_summary(row))

    def stop(self) -> None:
        if self.p is not None:
            self.p.stop()
