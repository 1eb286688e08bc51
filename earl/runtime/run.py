"""`earl run`'s driver: set up one rank (any world size), resume, loop over the RL step
(earl.runtime.step.run_step), record, checkpoint, and stop cleanly.

One process is a world of size 1 with a real (gloo) process group of one rank, so the step and
every collective are the same code for one process or many. The configuration arrives resolved
and checked (earl.runtime.resolve); checkpoints are earl.runtime.checkpoint's, terminal output
earl.runtime.console's. Under torchrun each rank runs earl.runtime.launch.worker_main, which
calls `run_training`. Rank 0 alone writes the run's files (earl.runtime.metrics).

    earl run --steps 20 --out runs/demo
    earl run --nproc 2 --steps 4 --out runs/demo2
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from earl.runtime.async_rl import run_async_training
from earl.runtime.checkpoint import export_policy, find_checkpoint, load_run, save_run
from earl.runtime.console import Preemption, Progress, library_progress_bars, step_line
from earl.runtime.control import fault_hook, vote_stop
from earl.runtime.defaults import describe_defaults
from earl.runtime.dist import aligned_origin, process_group
from earl.runtime.gc_steps import StepGC
from earl.runtime.metrics import RunRecorder, plot_run
from earl.runtime.resolve import (
    check_config,
    check_out,
    resolve_hardware,
    resume_plans,
)
from earl.runtime.run_config import RunConfig, to_dict
from earl.runtime.step import first_stats, run_step, step_context
from earl.runtime.worker import Worker
from earl.specs import Stage
from earl.trace import atomic_write_text

HF_EXPORT = "hf"  # the run folder's HF export of the final policy


@dataclass
class RunResult:
    out_dir: Path
    first_step: int  # first step this call ran
    last_step: int  # last step completed
    metrics: list[dict]  # all rows of metrics.jsonl (including earlier runs when resumed)
    last_checkpoint: Path | None
    preempted: bool = False  # stopped early by SIGTERM (after a finished, checkpointed step)


PREEMPTED_EXIT = 143  # 128 + SIGTERM: what `earl run` exits with after a preemption


def run_training(cfg: RunConfig, out_dir: str | Path, *, resume: str | Path | None = None, progress: bool = True,
                 echo=print, stop_at: int | None = None, deadline_s: float | None = None) -> RunResult:
    """Run (or continue) training on this rank; rank 0 writes everything under `out_dir`.

    `stop_at` ends this call after that step and `deadline_s` after the first step that ends
    past that many seconds; either way a checkpoint is written, and `--resume` continues the
    same schedule (the learning-rate decay follows `cfg.steps`, not the stopping point)."""
    with process_group(cfg.collective_timeout_s) as (rank, world), library_progress_bars(progress):
        return _run(cfg, out_dir, rank, world, resume=resume, progress=progress, echo=echo, stop_at=stop_at,
                    deadline_s=deadline_s)


def _run(cfg: RunConfig, out_dir: str | Path, rank: int, world: int, *, resume, progress, echo, stop_at,
         deadline_s) -> RunResult:
    t_call = time.perf_counter()
    check_config(cfg, world)
    out = Path(out_dir)
    if cfg.schedule.mode == "async":
        rows, ckpt, first, step, preempted = run_async_training(cfg, out, rank, world, resume=resume, echo=echo,
                                                                stop_at=stop_at, deadline_s=deadline_s, t_call=t_call)
        return RunResult(out_dir=out, first_step=first, last_step=step, metrics=rows, last_checkpoint=ckpt,
                         preempted=preempted)
    ckpt = find_checkpoint(resume) if resume is not None else None
    if rank == 0:  # the one writer; later ranks would see its first files
        check_out(out, resume)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    worker = Worker(cfg, resume_plans(cfg, ckpt, world), rank=rank, world=world,
                    memory_budget_bytes=cfg.plan.memory_budget_mb * 2**20)
    start, prev = load_run(worker, ckpt) if ckpt is not None else (0, None)
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint is at step {start} and steps={cfg.steps}: nothing to do (raise --steps)")
    hw, how = resolve_hardware(cfg)
    ctx = step_context(worker, hw)
    prev = prev or first_stats(worker)
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
    # one origin for every rank's spans (a resumed run's trace continues after its last span)
    worker.origin = aligned_origin(max((s.t_end for s in rec.spans), default=0.0) if rec is not None else 0.0)
    bar = Progress(cfg.steps, start, enabled=progress and rank == 0)
    last_ckpt, step = ckpt, start
    last = min(cfg.steps, stop_at or cfg.steps)
    failed = True  # until the loop ends without an exception (Ctrl-C included)
    preemption = Preemption()
    preempted = False
    step_gc = StepGC(cfg.gc_every)
    try:
        preemption.__enter__()
        step_gc.__enter__()
        for step in range(start + 1, last + 1):
            fault_hook(rank, step)
            row, prev, decisions, episodes = run_step(worker, ctx, step, prev)
            past = deadline_s is not None and time.perf_counter() - t_call > deadline_s
            stop = preemption.requested
            past, stop = vote_stop(past, stop)  # every rank stops after the same step
            preempted = preempted or stop
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
                last_ckpt = save_run(worker, out, step, prev)
            if row is not None:
                bar.update(step, row)
                if not bar.enabled and (world > 1 or step % max(1, cfg.steps // 10) == 0 or step == last):
                    echo(step_line(row))
            step_gc.step_done(step)
            if step == last:
                break
        failed = False
    finally:
        step_gc.__exit__()
        preemption.__exit__()
        bar.stop()
        worker.close_engine()  # an external engine's processes (vLLM) end with the run, not after it
        if rec is not None:
            rec.flush()
            rec.close(failed=failed)
    if cfg.checkpoints and not preempted:  # a preempted job's grace period is for the checkpoint only
        export_policy(worker, out / HF_EXPORT)
    if rec is not None and cfg.plots and not preempted:
        plot_run(out)
    return RunResult(out_dir=out, first_step=start + 1, last_step=step,
                     metrics=rec.metrics.rows if rec is not None else [], last_checkpoint=last_ckpt,
                     preempted=preempted)


if __name__ == "__main__":  # the rank entry point moved; an old torchrun command must not exit 0 having done nothing
    print("error: a rank of `earl run` is `python -m earl.runtime.launch --config FILE --out DIR` "
          "(earl.runtime.run has no command line)", file=sys.stderr)
    sys.exit(2)
