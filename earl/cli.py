"""The `earl` command line: simulate | run | calibrate | validate | plan | estimate | study.

    earl --help

Each command only declares its options and calls into the layer that owns the work; that layer
returns results (or rich tables) and raises ValueError for a user mistake. `user_errors` is the
one place that turns such an error into one line on stderr and exit code 2, without a traceback.
Configuration (files, `--set key=value`, key and type checks) is earl.config_machinery.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from earl import __version__
from earl.config_machinery import parse_sets

# plain (click) help: typer's rich help prints a `<bool>` placeholder after every flag
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="EARL: efficient agentic RL: cost model, policies, simulator, runtime.")
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, soft_wrap=True)


def user_errors(fn):
    """Turn ValueError/TypeError into a one-line message on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            err_console.print(f"[bold red]error:[/] {escape(msg)}", markup=True, highlight=False)
            raise typer.Exit(code=2) from None

    return wrapper


def _version(value: bool) -> None:
    if value:
        print(f"earl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """EARL: efficient agentic RL: cost model, policies, simulator, runtime."""


# ============================================================================================
# estimate / plan  (earl/cost_model/report.py, earl/policies/explain.py)
# ============================================================================================
# <estimate-plan>
PRESET_HELP = ("training-cluster preset (sets --hardware and --network unless given): earl-paper | "
               "dgx-h100-ndr | dgx-a100-hdr")


@app.command("estimate")
@user_errors
def estimate_cmd(
    stage: str = typer.Argument(..., help="prefill | decode | logprob | train | reshard | dispatch | rollout"),
    model: str = typer.Option("qwen2.5-7b", help="catalog name or path to an HF config.json / checkpoint dir"),
    hardware: Optional[str] = typer.Option(None, help="hardware profile name or profile JSON path "
                                                      "(default h100-sxm-80gb)"),
    cluster: Optional[str] = typer.Option(None, help=PRESET_HELP),
    gpus: int = typer.Option(8, help="GPUs the stage runs on"),
    tp: int = typer.Option(1, help="tensor parallel"),
    pp: int = typer.Option(1, help="pipeline parallel"),
    dp: int = typer.Option(-1, help="data parallel (-1: infer from --gpus)"),
    cp: int = typer.Option(1, help="context parallel"),
    batch: int = typer.Option(64, help="sequences (decode: spread over all replicas; train: global batch)"),
    context: int = typer.Option(4096, help="tokens per sequence"),
    prompt: int = typer.Option(0, help="rollout: prompt tokens per sequence (each grows from them to --context)"),
    micro_batch: int = typer.Option(1, help="sequences per micro-batch"),
    recompute: str = typer.Option("none", help="none | selective | full"),
    sharded_optimizer: bool = typer.Option(False, help="shard grads + optimizer over dp (ZeRO-2)"),
    to: Optional[str] = typer.Option(None, help="reshard / dispatch: destination plan, e.g. tp4-dp2"),
    dispatcher: str = typer.Option("layout-aware", help="dispatch: centralized | layout-aware"),
    controller_path: Optional[str] = typer.Option(
        None, help="dispatch: the single controller's serialisation path: packing (default: packs like any "
                   "rank) | object-store (0.8 GB/s, the EARL paper's '~1 TB took over 20 minutes')"),
    network: Optional[str] = typer.Option(None, help="inter-node network: tcp-200g, rdma-200g, rdma-400gx8, ..."),
    optimizer_state: bool = typer.Option(False, help="reshard: move optimizer states too"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
):
    """Price one stage of an RL iteration (time, memory, throughput, MFU)."""
    import json

    from earl.cost_model.report import cost_model_for, estimate_stage, estimate_table, network_note
    from earl.specs import ParallelPlan

    cm = cost_model_for(model, hardware=hardware, gpus=gpus, network=network, cluster=cluster,
                        controller_path=controller_path)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=micro_batch, recompute=recompute,
                        sharded_optimizer=sharded_optimizer)
    if stage == "dispatch":  # priced on the dispatcher's own TransferPlan (earl/policies)
        from earl.policies.dispatch_cost import estimate_dispatch

        src = plan.resolve(gpus)
        est = estimate_dispatch(cm, dispatcher, src, ParallelPlan.parse(to).resolve(gpus) if to else src, batch,
                                context)
    else:
        est = estimate_stage(stage, cm, plan, gpus=gpus, batch=batch, context=context, to=to,
                             optimizer_state=optimizer_state, prompt=prompt)
    if json_out:
        print(json.dumps({**est.to_dict(), "network": cm.cluster.network.name, "nodes": cm.cluster.nodes},
                         indent=2, default=str))
    else:
        console.print(estimate_table(est, f"{stage}: {cm.model.name} on {gpus} x {cm.profile.name}, "
                                          f"batch {batch} x {context} tokens; {network_note(cm)}"))


@app.command("plan")
@user_errors
def plan_cmd(
    stage: str = typer.Argument(..., help="prefill | decode | logprob | train"),
    model: str = typer.Option("qwen2.5-7b", help="catalog name or path to an HF config.json / checkpoint dir"),
    hardware: Optional[str] = typer.Option(None, help="hardware profile name or profile JSON path "
                                                      "(default h100-sxm-80gb)"),
    cluster: Optional[str] = typer.Option(None, help=PRESET_HELP),
    gpus: int = typer.Option(8, help="GPUs the stage runs on"),
    batch: int = typer.Option(64, help="sequences"),
    context: int = typer.Option(4096, help="tokens per sequence (mean, for --selector)"),
    top: int = typer.Option(10, help="rows to show (0: all)"),
    network: Optional[str] = typer.Option(None, help="inter-node network: tcp-200g, rdma-200g, ..."),
    selector: Optional[str] = typer.Option(None, help="also show this selector's decision: static | earl-table | "
                                                      "cost-model"),
    current: Optional[str] = typer.Option(None, help="--selector: the plan in use now, e.g. tp4-dp2"),
    context_p95: Optional[int] = typer.Option(None, help="--selector: p95 context (default: 1.5 x --context)"),
    context_max: Optional[int] = typer.Option(None, help="--selector: max context (default: 2 x --context)"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
):
    """Enumerate every valid plan for a stage and rank them by predicted throughput."""
    import json

    from earl.cost_model.report import cost_model_for, ranking_dict, ranking_table, timed_ranking
    from earl.policies.explain import decision_dict, explain_for_ranking, format_decision

    cm = cost_model_for(model, hardware=hardware, gpus=gpus, network=network, cluster=cluster)
    ranked, elapsed_s = timed_ranking(cm, stage, gpus, batch, context)
    decision = None if not selector else explain_for_ranking(
        selector, cm, stage, gpus, batch, context, ranked, current=current, context_p95=context_p95,
        context_max=context_max)
    if json_out:
        out = ranking_dict(cm, stage, ranked, elapsed_s, top)
        if decision is not None:
            out["decision"] = decision_dict(decision)
        print(json.dumps(out, indent=2, default=str))
        return
    console.print(ranking_table(cm, stage, gpus, batch, context, ranked, elapsed_s, top))
    if decision is not None:
        console.print(format_decision(decision))
# </estimate-plan>

# ============================================================================================
# simulate  (earl/sim)
# ============================================================================================
# <simulate>
@app.command()
@user_errors
def simulate(
    scenario: Optional[str] = typer.Argument(
        None, help="scenario file (.toml/.yaml) or built-in name; default: the EARL paper setting"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="override a key: section.key=value"),
    steps: Optional[int] = typer.Option(None, "--steps", help="training steps (scenario.steps)"),
    out: Optional[str] = typer.Option(None, "--out", help="output folder (default runs/sim-<time>)"),
    compare: bool = typer.Option(False, "--compare", help="run every policy of policy.compare"),
    single: bool = typer.Option(False, "--single", help="run only the scenario's policy (policy.selector/"
                                "policy.dispatcher); default: it and EARL's cost-model/layout-aware side "
                                "by side"),
    fine: bool = typer.Option(False, "--fine", help="one event per decode iteration (slow)"),
    exact: bool = typer.Option(False, "--exact", help="simulate every rollout replica and transfer "
                               "(no replica classes; slow at thousands of GPUs)"),
    jobs: Optional[str] = typer.Option(None, "--jobs", help="processes for the policies: "
                                       "N, 'ray', default the core count"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="write PNG plots"),
) -> None:
    """Discrete-event simulation of agentic RL training on a GPU cluster. By default the
    scenario's policy (the baseline) and EARL's selector + dispatcher run side by side on the same
    seeded workload, and the gain is explained; --single runs one policy, --compare them all."""
    import time

    started = time.perf_counter()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from earl.sim import report
    from earl.sim.run import check_out_dir, simulate_job, simulate_policy, write_outputs
    from earl.sim.sweep import parse_jobs, require_ray, run_jobs

    if compare and single:
        raise ValueError("--compare runs every policy of policy.compare and --single only the scenario's: "
                         "choose one")
    n_jobs = parse_jobs(jobs)
    if n_jobs == "ray":
        require_ray()
    sc, pairs = report.prepare(scenario, parse_sets(set_), steps=steps, fine=fine, exact=exact, compare=compare)
    if not compare and not single:
        pairs = policy_duel(pairs[0])
    # a small scenario runs here: starting a process costs more than simulating it
    n_jobs = 1 if len(pairs) == 1 or (n_jobs != "ray" and sc.steps * sc.workload.episodes_per_step
                                      < PARALLEL_EPISODES) else n_jobs
    out_dir = check_out_dir(out or report.default_out_dir())
    console.print(report.headline(sc, pairs))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("simulating", total=sc.steps * len(pairs))
        if n_jobs == 1:
            results = [simulate_policy(sc, sel, disp, progress=lambda label, step: bar.update(
                task, advance=1, description=f"{label} step {step + 1}/{sc.steps}")) for sel, disp in pairs]
        else:  # parallel variants report once, when they finish
            results = run_jobs(simulate_job, [(sc, sel, disp, None) for sel, disp in pairs], n_jobs,
                               done=lambda i, res: bar.update(task, advance=sc.steps, description=f"{res.label} done"))
    console.print(report.results_table(sc, results))
    if not compare and not single and len(results) == 2:
        console.print(explain_gain(results[0].summary, results[1].summary, results[0].rows, results[1].rows))
    console.print(report.outputs_line(write_outputs(sc, results, out_dir, plots=plots), results, plots,
                                      jobs=n_jobs, wall_s=time.perf_counter() - started))


PARALLEL_EPISODES = 512  # simulated episodes (steps x per step) from which the policies run in parallel
GAIN_STAGES = ("rollout_s", "experience_s", "dispatch_s", "train_s", "reshard_s", "sync_s", "restart_s")


def policy_duel(baseline: tuple[str, str]) -> list[tuple[str, str]]:
    """`earl simulate`'s default policies: the scenario's (the baseline), then EARL's selector and
    dispatcher; one policy when the scenario's already is EARL's."""
    from earl.policies.registry import EARL_POLICY

    return [baseline] if tuple(baseline) == EARL_POLICY else [tuple(baseline), EARL_POLICY]


def explain_gain(base: dict, earl: dict, base_rows: list[dict], earl_rows: list[dict]) -> str:
    """What EARL's policy gained over the baseline and what caused it: throughput, OOM events
    avoided, and the stages whose time moved most (mean seconds per step)."""
    b_tp, e_tp = base["throughput_tokens_per_gpu_s"], earl["throughput_tokens_per_gpu_s"]
    ratio = f"{e_tp / b_tp:.2f}x" if b_tp else "n/a"
    lines = [f"[bold]gain[/]: {earl['policy']} trains {e_tp:.1f} tokens/s/GPU vs {b_tp:.1f} for "
             f"{base['policy']} ({ratio}); s/step {base['step_time_mean_s']:.1f} -> {earl['step_time_mean_s']:.1f}"]

    def per_step(rows: list[dict], col: str) -> float:
        return sum(r[col] for r in rows) / len(rows) if rows else 0.0

    causes = []
    if base["oom_events"] != earl["oom_events"]:
        causes.append(f"OOM events {base['oom_events']} -> {earl['oom_events']}"
                      f" (steps with one: {base['oom_steps']} -> {earl['oom_steps']})")
    moved = sorted(((per_step(base_rows, c) - per_step(earl_rows, c), c) for c in GAIN_STAGES),
                   key=lambda x: -abs(x[0]))
    for delta, col in moved[:3]:
        if abs(delta) >= 0.005:
            causes.append(f"{col.removesuffix('_s')} {per_step(base_rows, col):.2f} -> "
                          f"{per_step(earl_rows, col):.2f} s/step ({'saved' if delta > 0 else 'added'} "
                          f"{abs(delta):.2f})")
    if earl["plan_switches"]:
        n = earl["plan_switches"]
        causes.append(f"{n} plan switch{'es' if n != 1 else ''} by the selector")
    lines.append("  caused by: " + ("; ".join(causes) if causes else "nothing measurable: the policies "
                                    "chose the same plans on this workload"))
    used = [c for c in GAIN_STAGES if per_step(base_rows, c) or per_step(earl_rows, c)]

    def stage_cells(rows: list[dict]) -> str:
        return ", ".join(f"{c.removesuffix('_s')} {per_step(rows, c):.2f}" for c in used)

    lines.append(f"  stage s/step, {base['policy']}: {stage_cells(base_rows)}")
    lines.append(f"  stage s/step, {earl['policy']}: {stage_cells(earl_rows)}")
    return "\n".join(lines)
# </simulate>

# ============================================================================================
# run  (earl/runtime)
# ============================================================================================
# <run>
@app.command("run")
@user_errors
def run_cmd(
    config: Optional[str] = typer.Argument(None, help="TOML/YAML run config (default: the built-in "
                                           "tiny model playing Tic-Tac-Toe vs a random opponent)"),
    env: Optional[str] = typer.Option(None, "--env", help="connect-four | tic-tac-toe | calculator | "
                                      "openspiel:GAME (e.g. openspiel:connect_four) | jsonl:PATH "
                                      "(.jsonl or .parquet prompts; needs --reward) | reasoning-gym:TASK | "
                                      "your class FILE.py:Class or package.module:Class (docs/environments.md)"),
    reward: Optional[str] = typer.Option(None, "--reward", help="reward function FILE.py:FUNC, called as "
                                         "FUNC(sample, messages) -> float (= env.reward)"),
    model: Optional[str] = typer.Option(None, "--model", help="local HF checkpoint dir, or tiny"),
    steps: Optional[int] = typer.Option(None, "--steps", help="training steps"),
    out: Optional[str] = typer.Option(None, "--out", help="output folder (default runs/run-<time>)"),
    resume: Optional[str] = typer.Option(None, "--resume", help="run folder or checkpoint to continue"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="profile the selector prices plans with: "
                                           "a name (cpu-measured, h100-sxm-80gb, ...) or a JSON path from "
                                           "earl calibrate (default: auto, a calibrated profile for this "
                                           "device when one is shipped, else its datasheet)"),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="config override key=value, e.g. "
                                             "trainer.lr=3e-3 (repeatable)"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar; a line every 10% of the run"),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="processes (torch.distributed under torchrun, "
                                        "gloo on CPU / NCCL on GPU); 1: this process"),
    rollout_plan: Optional[str] = typer.Option(None, help="rollout plan, e.g. tp2-dp1 (= plan.rollout)"),
    experience_plan: Optional[str] = typer.Option(None, help="log-prob plan (= plan.experience; default: "
                                                  "the train plan)"),
    train_plan: Optional[str] = typer.Option(None, help="training plan, e.g. tp1-dp2-zero (= plan.train)"),
    memory_budget_mb: Optional[float] = typer.Option(None, help="per-rank memory budget the runtime enforces "
                                                     "from its own accounting (= plan.memory_budget_mb)"),
    schedule: Optional[list[str]] = typer.Option(None, help="forced plan switch STEP:stage:PLAN (repeatable; "
                                                 "= plan.schedule)"),
):
    """Train a policy with agentic RL: one process (CPU or one GPU), or --nproc N processes with
    per-stage parallel plans that the selector may switch in flight. The same step runs either way."""
    import os

    from earl.runtime.console import summarize
    from earl.runtime.resolve import check_config, default_out_dir, resolve_config
    from earl.runtime.run import run_training

    overrides: dict = parse_sets(sets)
    for key, value in (("env.name", env), ("env.reward", reward), ("model.path", model), ("steps", steps),
                       ("nproc", nproc),
                       ("hardware.profile", hardware), ("plan.rollout", rollout_plan),
                       ("plan.experience", experience_plan), ("plan.train", train_plan),
                       ("plan.memory_budget_mb", memory_budget_mb)):
        if value is not None:
            overrides[key] = value
    if schedule:
        overrides["plan.schedule"] = ",".join(schedule)
    under_torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if resume is not None and nproc is None and not under_torchrun:
        overrides.setdefault("nproc", 1)  # a resumed run takes this call's process count
    cfg = resolve_config(config, resume=resume, overrides=overrides)
    out_dir = out or default_out_dir(resume)
    if cfg.nproc > 1 and not under_torchrun:  # start the processes here
        from earl.runtime.launch import launch

        raise typer.Exit(code=launch(cfg, out_dir, resume=resume, progress=not quiet and console.is_terminal))
    if not under_torchrun:
        check_config(cfg, 1)
    try:
        result = run_training(cfg, out_dir, resume=resume, progress=not quiet and console.is_terminal,
                       echo=console.print)
    except KeyboardInterrupt:
        from earl.runtime.checkpoint import find_checkpoint

        try:
            last = str(find_checkpoint(out_dir))
        except ValueError:
            last = "none yet"
        err_console.print(f"interrupted; last complete checkpoint: {last}; continue with "
                          f"earl run --resume {out_dir}")
        raise typer.Exit(code=130) from None
    if result.preempted:
        from earl.runtime.console import preempted_message
        from earl.runtime.run import PREEMPTED_EXIT

        err_console.print(preempted_message(result), markup=False, highlight=False)
        raise typer.Exit(code=PREEMPTED_EXIT)
    if result.metrics:
        console.print(summarize(result))
# </run>

# ============================================================================================
# calibrate / validate  (earl/calibrate)
# ============================================================================================
# <calibrate>
@app.command("calibrate")
@user_errors
def calibrate_cmd(
    device: str = typer.Option("cpu", help="cpu | cuda"),
    budget_s: float = typer.Option(90.0, "--budget-s", help="seconds to spend measuring (cpu >= 8, cuda >= 20)"),
    out: Optional[str] = typer.Option(None, help="profile JSON to write (default ./earl-profile-<device>.json)"),
    phases: str = typer.Option("all", help="all, or a comma list of matmul,attention,memory,"
                                           "collectives,overhead,runtime,dispatch"),
    dtype: str = typer.Option("auto", help="auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16"),
    threads: int = typer.Option(0, help="CPU threads per rank (0: 1, as one runtime rank uses)"),
    base: Optional[str] = typer.Option(None, help="profile (name or path) supplying what is not measured"),
    measurements: Optional[str] = typer.Option(None, help="also write the raw points to this JSON file"),
    seed: int = typer.Option(0, help="seed of the benchmark inputs"),
    force: bool = typer.Option(False, "--force", help="replace an existing --out / --measurements file"),
    median_of: Optional[str] = typer.Option(None, "--median-of", help="measure nothing: merge these calibrated "
                                            "profiles (comma-separated paths or names) into --out, each "
                                            "fitted number the median of theirs"),
):
    """Measure this device (GEMMs, attention, copies, collectives), fit the cost model's
    efficiency curves and links, and write a version-stamped hardware profile. Or, with
    --median-of, merge several calibrations of one host into one (earl/calibrate/merge.py)."""
    from earl.calibrate.report import quality_table
    from earl.calibrate.runner import calibrate_to_file, default_out

    if median_of is not None:
        from earl.calibrate.merge import merge_profile_files

        paths = [p.strip() for p in median_of.split(",") if p.strip()]
        out_path = out or default_out(device)
        _, spread = merge_profile_files(paths, out_path, force=force)
        # the widest relative spreads among numbers that are not ~0 in every calibration
        moved = sorted(((k, v) for k, v in spread.items() if v[2] > 1e-9 and v[0] > 0),
                       key=lambda kv: kv[1][2] / kv[1][0], reverse=True)
        console.print(f"median of {len(paths)} calibrations; {len(spread)} numbers differed between them"
                      + (", the widest: " + ", ".join(f"{k} {lo:.3g}..{hi:.3g}" for k, (lo, _, hi) in moved[:3])
                         if moved else ""))
        console.print(f"wrote {out_path} (load with --hardware {out_path})")
        return

    res, out_path = calibrate_to_file(device=device, budget_s=budget_s, out=out, phases=phases, dtype=dtype,
                                      threads=threads, base=base, seed=seed, measurements=measurements,
                                      console=err_console, force=force)
    console.print(quality_table(res))
    console.print(f"wrote {out_path} (load with --hardware {out_path})")


@app.command("validate")
@user_errors
def validate_cmd(
    config: Optional[str] = typer.Argument(None, help="run config file (TOML/YAML), as for earl run"),
    hardware: str = typer.Option("cpu-measured", help="calibrated profile: name or JSON path"),
    out: str = typer.Option(..., help="folder for the runs and the report (must be new or empty)"),
    steps: int = typer.Option(4, help="runtime steps per variant"),
    warmup_steps: int = typer.Option(1, help="first steps reported but not scored"),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the config's)"),
    model: Optional[str] = typer.Option(None, help="runtime model, or any catalog name (random weights)"),
    dtype: Optional[str] = typer.Option(None, help="fp32 | bf16 | fp16 (default: bf16 on cuda, else config's)"),
    variants: Optional[str] = typer.Option(None, help="config variants to rank, e.g. 'engine_batch=0;engine_batch=4'"),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="config override key=value (repeatable)"),
    nproc: int = typer.Option(1, help="runtime processes: 1, or 2 / 4 under torchrun (simulated as N devices)"),
    schedule: str = typer.Option("sync", help="sync | async: an async run next to a sync one (--nproc 2 or 4)"),
    rescore: Optional[str] = typer.Option(None, help="an earlier validate --out folder: price its recorded runs "
                                          "again with --hardware, running nothing"),
):
    """Run the runtime for a few steps and the simulator on the same config and workload trace;
    print predicted vs. measured time per stage and peak memory, and the Kendall tau of the
    variants' ranking (`--schedule async`: async vs sync tokens/s, staleness, per-pool stages).
    `--rescore DIR`: the same report for the runs DIR recorded, priced with --hardware."""
    import warnings

    from earl.calibrate.validate import validation_config
    from earl.calibrate.validate_async import async_table, check_schedule, run_async_validation

    if rescore is not None:
        from earl.calibrate.validate import ranking_line, rescore_validation, validation_table

        given = [flag for flag, on in (("CONFIG", config is not None), ("--steps", steps != 4),
                                       ("--warmup-steps", warmup_steps != 1), ("--device", device is not None),
                                       ("--model", model is not None), ("--dtype", dtype is not None),
                                       ("--variants", variants is not None), ("--set", bool(sets)),
                                       ("--nproc", nproc != 1), ("--schedule", schedule != "sync")) if on]
        if given:
            raise ValueError(f"--rescore re-prices the recorded runs as they ran; {', '.join(given)} does not apply "
                             "(valid with it: --hardware, --out)")
        res = rescore_validation(source=rescore, profile=hardware, out_dir=out)
        scored = len(res.variants[0].measured)
        console.print(validation_table(res, hardware, scored))
        if ranking_line(res):
            console.print(ranking_line(res))
        console.print(f"wrote {out}/validation.json, validation.csv, scatter.png (runs of {rescore})")
        return

    if check_schedule(schedule) == "async":
        if variants or model:
            raise ValueError("--variants and --model are for --schedule sync; with async, set the model "
                             "with --set model.path=...")
        cfg = validation_config(config, parse_sets(sets), device=device, dtype=dtype)
        with console.status("validating: sync and async runs, simulator..."):
            res = run_async_validation(config=cfg, profile=hardware, steps=steps, warmup_steps=warmup_steps,
                                       out_dir=out, nproc=nproc)
        console.print(async_table(res))
        console.print(f"wrote {out}/async_validation.json, async_validation.csv")
        return

    from earl.calibrate.validate import parse_variants, ranking_line, run_validation, validation_table

    cfg = validation_config(config, parse_sets(sets), device=device, dtype=dtype)
    with console.status("validating: runtime and simulator..."), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run_validation(config=cfg, profile=hardware, steps=steps, warmup_steps=warmup_steps,
                             variants=parse_variants(variants), out_dir=out, model=model, nproc=nproc)
    for w in caught:
        if "stamp mismatch" in str(w.message):
            err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False)
    console.print(validation_table(res, hardware, steps - warmup_steps))
    if ranking_line(res):
        console.print(ranking_line(res))
    for v in res.variants:
        if v.plan_mismatches:  # the simulator's selector chose other plans than the runtime's
            console.print(f"plans differ ({v.name}): " + "; ".join(v.plan_mismatches), highlight=False)
    console.print(f"wrote {out}/validation.json, validation.csv, scatter.png")
# </calibrate>


# ============================================================================================
# show  (earl/runtime/metrics.py formats the transcripts a run wrote)
# ============================================================================================
# <show>
@app.command("show")
@user_errors
def show_cmd(
    run: str = typer.Argument(..., help="run folder (what earl run --out wrote)"),
    episodes: int = typer.Option(4, "--episodes", "-n", help="transcripts to print"),
    step: Optional[int] = typer.Option(None, "--step", help="a step with transcripts (default: the latest)"),
):
    """Print a run's latest episode transcripts: roles, messages, tool calls and rewards."""
    from earl.runtime.metrics import format_transcripts

    console.print(format_transcripts(run, episodes=episodes, step=step), markup=False, highlight=False)
# </show>


# ============================================================================================
# study  (earl/studies.py runs the scripts of studies/ at the repository root)
# ============================================================================================
# <study>
@app.command("study")
@user_errors
def study_cmd(
    name: Optional[str] = typer.Argument(None, help="study to run: s1..s8, its full name, or all"),
    out: Optional[str] = typer.Option(None, help="output folder (default: runs/study-<time>; the committed "
                                      "figures change only with --out docs/figures)"),
    quick: bool = typer.Option(False, help="few points, seconds instead of minutes"),
    list_: bool = typer.Option(False, "--list", help="list the studies and exit"),
    jobs: Optional[str] = typer.Option(None, "--jobs", help="processes: several studies run side by "
                                       "side, one study runs its variants in parallel; N, 'ray', "
                                       "default the core count"),
):
    """Run an evaluation study: writes its CSV and PNG and prints its key table."""
    from earl.studies import run_studies, study_summaries

    if list_ or name is None:
        for stem, summary in study_summaries():
            console.print(f"[bold]{stem}[/]  {summary}", highlight=False)
        return
    failed = run_studies(name, out=out, quick=quick, jobs=jobs,
                         echo=lambda line: console.print(f"[dim]{line}[/]", highlight=False))
    if failed:
        err_console.print(f"[bold red]failed:[/] {', '.join(failed)}")
        raise typer.Exit(code=1)
# </study>


def main() -> None:
    app(prog_name="earl")


if __name__ == "__main__":
    sys.exit(main())
