"""What `earl run` prints and hears: the progress bar (or a line every tenth of the run under --quiet), the
summary at the end, and the line a preempted run stops with, SIGTERM (a scheduler's "stop after this step"); and the
libraries' own progress bars (transformers' "Loading weights") switched off when the run's is.

Every function here formats or shows; the driver (earl.runtime.run) decides when. `result` is
the driver's RunResult.

    earl run --steps 4 --quiet
"""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def library_progress_bars(enabled: bool):
    """With `enabled` false, transformers' and huggingface_hub's tqdm bars off for the duration
    (then as they were); with it true, left as they are."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def preempted_message(result) -> str:
    """The one line a preempted run ends with: where it stopped and the resume command."""
    if result.last_checkpoint is None:
        return (f"earl run: stopped by SIGTERM after step {result.last_step}; no checkpoint was written "
                f"(checkpoints=false); start again with another --out")
    return (f"earl run: stopped by SIGTERM after step {result.last_step}; checkpoint {result.last_checkpoint}; "
            f"continue with earl run --resume {result.out_dir}")


def summarize(result) -> str:
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


def step_line(row: dict) -> str:
    rates = " ".join(f"{k.removesuffix('_rate')} {row[k]:.2f}" for k in
                     ("win_rate", "draw_rate", "loss_rate", "correct_rate") if row.get(k))
    return (f"step {row['step']:4d}  reward {row['reward_mean']:+.3f}  {rates}  "
            f"invalid-move {row['invalid_move_rate']:.3f}  loss {row['loss']:+.4f}  ctx {row['context_mean']:.0f}  "
            f"train {row['plan_train']}  {row['step_s']:.2f}s/step")


class Progress:
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
            self.p.update(self.task, completed=step, info=step_line(row))

    def stop(self) -> None:
        if self.p is not None:
            self.p.stop()


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
