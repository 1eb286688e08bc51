"""The `earl` command line: simulate | run | calibrate | validate | plan | estimate | study.

    earl --help

Each command is a thin wrapper: it parses options into specs and calls into the package.
User mistakes (ValueError / TypeError / FileNotFoundError raised as ValueError) are printed as
one line and exit with code 2, without a traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="EARL: efficient agentic RL: cost model, policies, simulator, runtime.")
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, soft_wrap=True)


class UserError(ValueError):
    """A mistake in the user's input; printed in one line, exit code 2."""


def user_errors(fn):
    """Turn ValueError/TypeError into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            err_console.print(f"[bold red]error:[/] {msg}", markup=True, highlight=False)
            raise typer.Exit(code=2) from None

    return wrapper


def parse_sets(items: Optional[list[str]]) -> dict[str, str]:
    """`--set key=value` pairs into a dict (values stay strings; callers convert)."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# ============================================================================================
# estimate / plan  (earl/cost_model, earl/policies)
# ============================================================================================
# <estimate-plan>
def _fmt_s(t: float) -> str:
    if t == float("inf"):
        return "inf"
    return f"{t * 1e3:.3f} ms" if t < 1 else f"{t:.3f} s"


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def _print_estimate(est, title: str) -> None:
    from rich.table import Table

    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value")
    t.add_row("plan", est.plan.describe() if est.plan else "-")
    t.add_row("feasible", "[green]yes[/]" if est.feasible else "[red]no[/]")
    if est.reason:
        t.add_row("note" if est.feasible else "reason", est.reason)
    t.add_row("time", _fmt_s(est.time_s))
    if est.tokens and est.feasible:
        t.add_row("tokens/s/GPU", f"{est.tokens_per_gpu_s:,.1f}")
    if est.flops:
        t.add_row("TFLOP/s/GPU", f"{est.tflops_per_gpu:.1f}")
        t.add_row("MFU", f"{est.mfu:.1%}")
    if est.memory:
        t.add_row("memory/GPU", f"{_gib(est.memory.total)} of {_gib(est.memory.capacity)}")
        for c in est.memory.COMPONENTS:
            v = getattr(est.memory, c)
            if v:
                t.add_row(f"  {c}", _gib(v))
    for k, v in est.breakdown.items():
        if v:
            t.add_row(f"  time: {k}", _fmt_s(v))
    for k, v in est.extras.items():
        t.add_row(f"  {k}", f"{v:,.4g}" if isinstance(v, float) else str(v))
    console.print(t)


@app.command("estimate")
@user_errors
def estimate_cmd(
    stage: str = typer.Argument(..., help="prefill | decode | logprob | train | reshard | dispatch"),
    model: str = typer.Option("qwen2.5-7b", help="catalog name or path to an HF config.json / checkpoint dir"),
    hardware: str = typer.Option("h100-sxm-80gb", help="hardware profile name or profile JSON path"),
    gpus: int = typer.Option(8, help="GPUs the stage runs on"),
    tp: int = typer.Option(1, help="tensor parallel"),
    pp: int = typer.Option(1, help="pipeline parallel"),
    dp: int = typer.Option(-1, help="data parallel (-1: infer from --gpus)"),
    cp: int = typer.Option(1, help="context parallel"),
    batch: int = typer.Option(64, help="sequences (decode: spread over all replicas; train: global batch)"),
    context: int = typer.Option(4096, help="tokens per sequence"),
    micro_batch: int = typer.Option(1, help="sequences per micro-batch"),
    recompute: str = typer.Option("none", help="none | selective | full"),
    sharded_optimizer: bool = typer.Option(False, help="shard grads + optimizer over dp (ZeRO-2)"),
    to: Optional[str] = typer.Option(None, help="reshard / dispatch: destination plan, e.g. tp4-dp2"),
    dispatcher: str = typer.Option("layout-aware", help="dispatch: centralized | layout-aware"),
    network: Optional[str] = typer.Option(None, help="inter-node network: tcp-200g, rdma-200g, rdma-400gx8, ..."),
    optimizer_state: bool = typer.Option(False, help="reshard: move optimizer states too"),
    json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
):
    """Price one stage of an RL iteration (time, memory, throughput, MFU)."""
    import json

    from earl.cost_model.model import STAGES
    from earl.cost_model.resolve import make_cost_model
    from earl.specs import ParallelPlan

    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    cm = make_cost_model(model, hardware, gpus, network)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=micro_batch, recompute=recompute,
                        sharded_optimizer=sharded_optimizer).resolve(gpus)
    if stage in ("reshard", "dispatch"):
        dst = ParallelPlan.parse(to).resolve(gpus) if to else plan
        est = (cm.reshard(plan, dst, include_optimizer=optimizer_state) if stage == "reshard"
               else cm.dispatch(dispatcher, plan, dst, batch, context))
    else:
        est = cm.estimate(stage, plan, batch, context)
    if json_out:
        print(json.dumps(est.to_dict(), indent=2, default=str))
    else:
        _print_estimate(est, f"{stage}: {cm.model.name} on {gpus} x {cm.profile.name}, "
                             f"batch {batch} x {context} tokens")


@app.command("plan")
@user_errors
def plan_cmd(
    stage: str = typer.Argument(..., help="prefill | decode | logprob | train"),
    model: str = typer.Option("qwen2.5-7b", help="catalog name or path to an HF config.json / checkpoint dir"),
    hardware: str = typer.Option("h100-sxm-80gb", help="hardware profile name or profile JSON path"),
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
    import time

    from rich.table import Table

    from earl.cost_model.resolve import make_cost_model
    from earl.cost_model.search import rank_plans

    cm = make_cost_model(model, hardware, gpus, network)
    t0 = time.perf_counter()
    ranked = rank_plans(cm, stage, gpus, batch, context)
    elapsed = time.perf_counter() - t0
    decision = None
    if selector:
        decision = _select_for_plan_cmd(cm, selector, stage, gpus, batch, context, current,
                                        context_p95, context_max, ranked)
    shown = ranked[:top] if top else ranked
    if json_out:
        out = {"stage": stage, "plans_evaluated": len(ranked), "search_s": elapsed,
               "plans": [e.to_dict() for _, e in shown]}
        if decision is not None:
            out["decision"] = {"plan": decision.plan.describe(), "switched": decision.switched,
                               "reason": decision.reason, "predicted": decision.predicted}
        print(json.dumps(out, indent=2, default=str))
        return
    n_ok = sum(e.feasible for _, e in ranked)
    t = Table(title=f"{stage}: {cm.model.name} on {gpus} x {cm.profile.name}, batch {batch} x {context}: "
                    f"{len(ranked)} plans ({n_ok} feasible) in {elapsed * 1e3:.0f} ms", title_justify="left")
    for col in ("#", "plan", "tokens/s/GPU", "time", "MFU", "mem/GPU", "why not"):
        t.add_column(col, justify="right" if col not in ("plan", "why not") else "left")
    for i, (p, e) in enumerate(shown, 1):
        t.add_row(str(i), p.describe(), f"{e.tokens_per_gpu_s:,.0f}" if e.feasible else "-", _fmt_s(e.time_s),
                  f"{e.mfu:.1%}" if e.feasible and e.flops else "-",
                  _gib(e.memory.total) if e.memory else "-", "" if e.feasible else e.reason)
    console.print(t)
    if decision is not None:
        from earl.policies import format_decision

        console.print(format_decision(decision))


def _select_for_plan_cmd(cm, selector, stage, gpus, batch, context, current, p95, mx, ranked):
    """The selector's decision for `stage`, starting from `current` (default: the slowest
    feasible plan, so the selector has something to improve on)."""
    from earl.policies import explain_selection
    from earl.specs import ParallelPlan, Stage, WorkloadStats

    stage_map = {"decode": Stage.ROLLOUT, "prefill": Stage.ROLLOUT, "logprob": Stage.EXPERIENCE,
                 "train": Stage.TRAIN}
    if current:
        cur = ParallelPlan.parse(current).resolve(gpus)
    else:
        feasible = [p for p, e in ranked if e.feasible]
        cur = feasible[-1] if feasible else ranked[0][0]
    stats = WorkloadStats(num_responses=batch, context_mean=context, context_p95=p95 or int(1.5 * context),
                          context_max=mx or 2 * context)
    return explain_selection(selector, cm, stage_map[stage], stats, cur)
# </estimate-plan>

# ============================================================================================
# simulate / study  (earl/sim, studies/)
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
    fine: bool = typer.Option(False, "--fine", help="one event per decode iteration (slow)"),
    exact: bool = typer.Option(False, "--exact", help="simulate every rollout replica and transfer "
                               "(no replica classes; slow at thousands of GPUs)"),
    jobs: Optional[str] = typer.Option(None, "--jobs", help="processes for --compare's policies: "
                                       "N, 'ray', default the core count"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="write PNG plots"),
) -> None:
    """Discrete-event simulation of agentic RL training on a GPU cluster."""
    import datetime
    import time

    started = time.perf_counter()

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from earl.sim.run import check_out_dir, write_outputs
    from earl.sim.run import simulate as run_simulation
    from earl.sim.scenario import load_scenario
    from earl.sim.sweep import parse_jobs, require_ray

    sets = parse_sets(set_)
    if steps is not None:
        sets["scenario.steps"] = str(steps)
    if fine:
        sets["engine.fine"] = "true"
    if exact:
        sets["engine.exact"] = "true"
    n_jobs = parse_jobs(jobs)
    if n_jobs == "ray":
        require_ray()
    sc = load_scenario(scenario, sets)
    pairs = sc.policies(compare)
    n_jobs = 1 if len(pairs) == 1 else n_jobs
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = check_out_dir(out or f"runs/sim-{stamp}")
    console.print(f"[bold]{sc.name}[/]: {sc.model} on {sc.cluster_spec().num_gpus} x {sc.hardware} "
                  f"({sc.network}), workload {sc.workload.name}, {sc.steps} steps, "
                  f"{len(pairs)} polic{'y' if len(pairs) == 1 else 'ies'}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("simulating", total=sc.steps * len(pairs))

        def progress(label: str, step: int) -> None:
            bar.update(task, advance=1, description=f"{label} step {step + 1}/{sc.steps}")

        def done(res) -> None:
            if n_jobs != 1:
                bar.update(task, advance=sc.steps, description=f"{res.label} done")

        results = run_simulation(sc, compare=compare, progress=progress, jobs=n_jobs, done=done)
    table = Table(title=f"{sc.name}: {sc.steps} steps, same seeded workload")
    for col in ("policy", "tokens/s/GPU", "step time s", "OOM events", "truncated", "dispatch s",
                "re-shard s", "sync s", "final plans (rollout | experience | train)"):
        table.add_column(col, justify="left" if col.startswith(("policy", "final")) else "right")
    for r in results:
        s = r.summary
        fp = s["final_plans"]
        table.add_row(s["policy"], f"{s['throughput_tokens_per_gpu_s']:.1f}",
                      f"{s['step_time_mean_s']:.1f}", str(s["oom_events"]),
                      str(s["truncated_episodes"]), f"{s['dispatch_s']:.2f}",
                      f"{s['reshard_s']:.1f}", f"{s['sync_s']:.1f}",
                      f"{fp.get('rollout')} | {fp.get('experience')} | {fp.get('train')}")
    console.print(table)
    path = write_outputs(sc, results, out_dir, plots=plots)
    events = sum(r.events for r in results)
    wall = sum(r.wall_s for r in results)
    how = f" over {n_jobs} {'processes' if n_jobs != 'ray' else 'Ray tasks'}" if n_jobs != 1 else ""
    console.print(f"wrote {path}/ (metrics.csv, summary.json, decisions.jsonl, trace.json"
                  f"{', plots' if plots else ''}); {events:,} events in {wall:.1f} s of simulation"
                  f"{how}, {time.perf_counter() - started:.1f} s wall")
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
    env: Optional[str] = typer.Option(None, "--env", help="connect-four | tic-tac-toe | calculator"),
    model: Optional[str] = typer.Option(None, "--model", help="local HF checkpoint dir, or tiny"),
    steps: Optional[int] = typer.Option(None, "--steps", help="training steps"),
    out: Optional[str] = typer.Option(None, "--out", help="output folder (default runs/run-<time>)"),
    resume: Optional[str] = typer.Option(None, "--resume", help="run folder or checkpoint to continue"),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="config override key=value, e.g. "
                                             "trainer.lr=3e-3 (repeatable)"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar; a line every 10% of the run"),
    nproc: int = typer.Option(1, "--nproc", help="processes (torch.distributed under torchrun, gloo on CPU / "
                              "NCCL on GPU); 1: this process"),
    rollout_plan: Optional[str] = typer.Option(None, help="--nproc: rollout plan, e.g. tp2-dp1"),
    experience_plan: Optional[str] = typer.Option(None, help="--nproc: log-prob plan (default: the train plan)"),
    train_plan: Optional[str] = typer.Option(None, help="--nproc: training plan, e.g. tp1-dp2-zero"),
    memory_budget_mb: float = typer.Option(0.0, help="--nproc: per-rank memory budget the runtime enforces "
                                           "from its own accounting (0: none)"),
    schedule: Optional[list[str]] = typer.Option(None, help="--nproc: forced plan switch STEP:stage:PLAN "
                                                 "(repeatable)"),
):
    """Train a policy with agentic RL: one process (CPU or one GPU), or --nproc N processes with
    per-stage parallel plans that the selector may switch in flight."""
    import os

    dist_args = {"--rollout-plan": rollout_plan, "--experience-plan": experience_plan,
                 "--train-plan": train_plan}
    if nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        argv = [config] if config else []
        for flag, value in (("--env", env), ("--model", model), ("--steps", steps), ("--out", out),
                            ("--resume", resume), *dist_args.items()):
            if value is not None:
                argv += [flag, str(value)]
        if memory_budget_mb:
            argv += ["--memory-budget-mb", str(memory_budget_mb)]
        for item in schedule or []:
            argv += ["--schedule", item]
        for item in sets or []:
            argv += ["--set", item]
        if nproc > 1:  # start the processes here
            from earl.runtime.launch import launch

            raise typer.Exit(code=launch(nproc, argv))
        from earl.runtime.dist_loop import main as dist_main  # already under torchrun

        dist_main(argv)
        return
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    given = [f for f, v in dist_args.items() if v] + (["--memory-budget-mb"] if memory_budget_mb else []) + \
        (["--schedule"] if schedule else [])
    if given:
        raise ValueError(f"{', '.join(given)} only apply with --nproc N (N >= 2)")
    from earl.runtime.loop import check_config, default_out_dir, resolve_config, summarize, train

    overrides: dict = parse_sets(sets)
    for key, value in (("env.name", env), ("model.path", model), ("steps", steps)):
        if value is not None:
            overrides[key] = value
    cfg = resolve_config(config, resume=resume, overrides=overrides)
    check_config(cfg)
    out_dir = out or default_out_dir(resume)
    try:
        result = train(cfg, out_dir, resume=resume, progress=not quiet and console.is_terminal,
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
    console.print(summarize(result))
# </run>

# ============================================================================================
# calibrate / validate
# ============================================================================================
# <calibrate>
@app.command("calibrate")
@user_errors
def calibrate_cmd(
    device: str = typer.Option("cpu", help="cpu | cuda"),
    budget_s: float = typer.Option(90.0, "--budget-s", help="seconds to spend measuring (cpu >= 8, cuda >= 20)"),
    out: Optional[str] = typer.Option(None, help="profile JSON to write (default ./earl-profile-<device>.json)"),
    phases: str = typer.Option("all", help="all, or a comma list of matmul,attention,memory,"
                                           "collectives,overhead,runtime"),
    dtype: str = typer.Option("auto", help="auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16"),
    threads: int = typer.Option(0, help="CPU threads per rank (0: 1, as one runtime rank uses)"),
    base: Optional[str] = typer.Option(None, help="profile (name or path) supplying what is not measured"),
    measurements: Optional[str] = typer.Option(None, help="also write the raw points to this JSON file"),
    seed: int = typer.Option(0, help="seed of the benchmark inputs"),
):
    """Measure this device (GEMMs, attention, copies, collectives), fit the cost model's
    efficiency curves and links, and write a version-stamped hardware profile."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    from earl.calibrate import Progress, run_calibration
    from earl.calibrate.report import quality_table, write_measurements
    from earl.calibrate.runner import default_out, parse_phases

    chosen = parse_phases(phases)
    out_path = out or default_out(device)
    if not out_path.endswith(".json"):
        raise ValueError(f"--out {out_path!r} must name a .json file")

    class Bar(Progress):
        def __init__(self, rich_progress):
            self.p, self.tasks = rich_progress, {}

        def phase(self, name, total):
            self.tasks[name] = self.p.add_task(name, total=total, label="")

        def step(self, name, label):
            self.p.update(self.tasks[name], advance=1, label=label)

    columns = (TextColumn("{task.description:12s}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[label]}"))
    with RichProgress(*columns, console=err_console, transient=False) as rp:
        res = run_calibration(device=device, budget_s=budget_s, phases=chosen, dtype=dtype,
                              threads=threads, base=base, seed=seed, progress=Bar(rp))
    res.profile.save(out_path)
    console.print(quality_table(res))
    if measurements:
        write_measurements(res, measurements)
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
):
    """Run the runtime for a few steps and the simulator on the same config and workload trace;
    print predicted vs. measured time per stage and peak memory, and the Kendall tau of the
    variants' ranking."""
    from rich.table import Table

    from earl.calibrate.validate import parse_variants, run_validation
    from earl.runtime.loop import resolve_config

    overrides = parse_sets(sets)
    if device is not None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}; valid: cpu, cuda")
        overrides["model.device"] = device
        if device == "cuda" and dtype is None:
            dtype = "bf16"
    if dtype is not None:
        overrides["model.dtype"] = dtype
    cfg = resolve_config(config, overrides=overrides)
    if str(cfg.model.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' is not available here; use --device cpu")
    import warnings

    with console.status("validating: runtime and simulator..."), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run_validation(config=cfg, profile=hardware, steps=steps, warmup_steps=warmup_steps,
                             variants=parse_variants(variants), out_dir=out, model=model)
    for w in caught:
        if "stamp mismatch" in str(w.message):
            err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False)
    t = Table(title=f"earl validate ({res.device}, profile {hardware}, {len(res.variants)} variant(s), "
                    f"{steps - warmup_steps} scored step(s) each)")
    for col in ("stage", "measured s", "predicted s", "median err", f"datasheet ({res.datasheet}) s",
                "datasheet err", "err vs CPU time"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for r in res.table:  # last column: measured x the step's CPU share (other processes excluded)
        t.add_row(r["stage"], f"{r['measured_s']:.4f}", f"{r['predicted_s']:.4f}", f"{r['median_err']:.1%}",
                  f"{r['datasheet_s']:.4f}", f"{r['datasheet_median_err']:.1%}", f"{r['cpu_median_err']:.1%}")
    for v in res.variants:
        err = abs(v.peak_mem_predicted - v.peak_mem_measured) / v.peak_mem_measured
        what = f"peak memory, {v.name}" + ("" if res.memory_comparable else " (CPU RSS: not comparable)")
        t.add_row(what, f"{v.peak_mem_measured / 2**30:.3f} GiB",
                  f"{v.peak_mem_predicted / 2**30:.3f} GiB", f"{err:.1%}" if res.memory_comparable else "-",
                  "", "", "")
    console.print(t)
    if len(res.variants) > 1:
        fmt = lambda x: "n/a" if x is None else f"{x:+.2f}"  # noqa: E731
        console.print(f"Kendall tau of the variants' total time, predicted vs measured: calibrated "
                      f"{fmt(res.kendall_tau)}, datasheet {fmt(res.kendall_tau_datasheet)}")
    console.print(f"wrote {out}/validation.json, validation.csv, scatter.png")
# </calibrate>


# ============================================================================================
# study  (studies/ at the repository root; earl never imports it, it runs the scripts)
# ============================================================================================
# <study>
def _studies_dir():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "studies"


def _study_scripts() -> dict:
    """{stem: path} of every study script (studies/s<N>_<name>.py), in study order."""
    folder = _studies_dir()
    if not folder.is_dir():
        raise ValueError(f"no studies folder at {folder}: `earl study` runs the scripts of a repository checkout")
    scripts = sorted(folder.glob("s[0-9]*_*.py"), key=lambda p: int(p.stem[1:].split("_")[0]))
    return {p.stem: p for p in scripts}


def resolve_study(name: str, scripts: dict) -> list:
    """`s2`, `2`, `data_volume`, `s2_data_volume` or `all` -> the scripts to run."""
    key = name.lower().replace("-", "_")
    if key == "all":
        return list(scripts.values())
    for stem, path in scripts.items():
        num, _, rest = stem.partition("_")
        if key in (stem, num, num[1:], rest):
            return [path]
    raise ValueError(f"unknown study {name!r}; valid: {', '.join(scripts)} (or s<N>, <N>, all)")


def _run_study(job: tuple) -> tuple[int, str]:
    """Run one study script: (exit code, its output when `capture`, else "")."""
    import subprocess

    cmd, capture = job
    if not capture:
        return subprocess.run(cmd, check=False).returncode, ""
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


@app.command("study")
@user_errors
def study_cmd(
    name: Optional[str] = typer.Argument(None, help="study to run: s1..s8, its full name, or all"),
    out: Optional[str] = typer.Option(None, help="output folder (default: docs/figures of the checkout)"),
    quick: bool = typer.Option(False, help="few points, seconds instead of minutes"),
    list_: bool = typer.Option(False, "--list", help="list the studies and exit"),
    jobs: Optional[str] = typer.Option(None, "--jobs", help="processes: several studies run side by "
                                       "side, one study runs its variants in parallel; N, 'ray', "
                                       "default the core count"),
):
    """Run an evaluation study: writes its CSV and PNG and prints its key table."""
    import ast

    from earl.sim.sweep import parse_jobs, require_ray, run_jobs

    n_jobs = parse_jobs(jobs)
    if n_jobs == "ray":
        require_ray()
    scripts = _study_scripts()
    if list_ or name is None:
        for stem, path in scripts.items():
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            summary = " ".join(doc.split("\n\n")[0].split())
            console.print(f"[bold]{stem}[/]  {summary[:100] + ('...' if len(summary) > 100 else '')}",
                          highlight=False)
        return
    paths = resolve_study(name, scripts)
    # several studies: they run side by side, each serially; one study: its variants in parallel
    inner = n_jobs if len(paths) == 1 else 1
    cmds = [[sys.executable, str(path)] + (["--out", out] if out else []) + (["--quick"] if quick else [])
            + ["--jobs", str(inner)] for path in paths]
    failed = []
    if n_jobs == 1 or len(paths) == 1:
        for path, cmd in zip(paths, cmds, strict=True):
            console.print(f"[dim]$ {' '.join(cmd)}[/]", highlight=False)
            if _run_study((cmd, False))[0] != 0:
                failed.append(path.stem)
    else:
        def done(i: int, result: tuple) -> None:
            console.print(f"[dim]$ {' '.join(cmds[i])}[/]", highlight=False)
            sys.stdout.write(result[1])
            sys.stdout.flush()
            if result[0] != 0:
                failed.append(paths[i].stem)

        run_jobs(_run_study, [(cmd, True) for cmd in cmds], n_jobs, done=done)
    if failed:
        err_console.print(f"[bold red]failed:[/] {', '.join(failed)}")
        raise typer.Exit(code=1)
# </study>


def main() -> None:
    app(prog_name="earl")


if __name__ == "__main__":
    sys.exit(main())
