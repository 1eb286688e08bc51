"""Run outputs: per-step metrics (CSV + JSONL), the workload trace the simulator replays, span
traces (Chrome JSON), TensorBoard when installed, and PNG plots at the end.

Every file is rewritten atomically (temp file, then rename), so a crash or Ctrl-C never leaves
half a line; on `--resume` the rows after the checkpoint's step are dropped.

    python -c "from earl.runtime.metrics import plot_run; plot_run('runs/latest')"
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from earl.trace import Span, atomic_write_text, read_chrome_trace, write_chrome_trace

METRICS_CSV = "metrics.csv"
METRICS_JSONL = "metrics.jsonl"
WORKLOAD_JSONL = "workload.jsonl"
DECISIONS_JSONL = "decisions.jsonl"
TRACE_JSON = "trace.json"


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class JsonlTable:
    """Rows with a "step" key, kept in memory and rewritten atomically to `path`."""

    def __init__(self, path: Path, keep_until_step: int | None = None):
        self.path = path
        self.rows: list[dict] = []
        if keep_until_step is not None and path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    if row["step"] <= keep_until_step:
                        self.rows.append(row)

    def append(self, row: dict) -> None:
        self.rows.append({k: _clean(v) for k, v in row.items()})

    def write(self) -> None:
        atomic_write_text(self.path, "".join(json.dumps(r, default=str) + "\n" for r in self.rows))


class RunRecorder:
    """Everything `earl run` writes per step, in one place."""

    def __init__(self, out_dir: Path, *, resume_step: int | None = None, tensorboard: bool = True):
        self.out = out_dir
        self.metrics = JsonlTable(out_dir / METRICS_JSONL, resume_step)
        self.workload = JsonlTable(out_dir / WORKLOAD_JSONL, resume_step)
        self.decisions = JsonlTable(out_dir / DECISIONS_JSONL, resume_step)
        self.spans: list[Span] = []
        if resume_step is not None and (out_dir / TRACE_JSON).is_file():
            self.spans = [s for s in read_chrome_trace(out_dir / TRACE_JSON) if s.step <= resume_step]
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: CSV/JSONL only
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tb = SummaryWriter(str(out_dir / "tensorboard"))

    def log_step(self, row: dict, episodes: list[dict], decisions: list[dict]) -> None:
        self.metrics.append(row)
        self.workload.append({"step": row["step"], "episodes": episodes})
        for d in decisions:
            self.decisions.append({"step": row["step"], **d})
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step" and v == v:
                    self.tb.add_scalar(k, v, row["step"])

    def flush(self, with_trace: bool = True) -> None:
        self.metrics.write()
        self.workload.write()
        self.decisions.write()
        atomic_write_text(self.out / METRICS_CSV, rows_to_csv(self.metrics.rows))
        if with_trace:
            write_chrome_trace(self.spans, self.out / TRACE_JSON)
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def rows_to_csv(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return buf.getvalue()


def read_metrics(out_dir: str | Path) -> list[dict]:
    p = Path(out_dir) / METRICS_JSONL
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def plot_run(out_dir: str | Path) -> list[Path]:
    """PNG plots of a run's metrics: learning curves and stage times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    rows = read_metrics(out)
    if not rows:
        return []
    steps = [r["step"] for r in rows]

    def series(key):
        return [r.get(key) if r.get(key) is not None else float("nan") for r in rows]

    (out / "plots").mkdir(exist_ok=True)
    paths = []
    panels = [("reward_mean", "episode return"), ("outcome_rates", "outcome rate"),
              ("loss", "loss / kl / entropy"), ("context", "tokens per episode")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        if key == "outcome_rates":
            for k in ("win_rate", "draw_rate", "loss_rate", "invalid_rate", "correct_rate"):
                if any(r.get(k) is not None for r in rows):
                    label = "ended by invalid move" if k == "invalid_rate" else k.removesuffix("_rate")
                    ax.plot(steps, series(k), label=label)
            ax.set_ylim(-0.02, 1.02)
        elif key == "loss":
            for k in ("loss", "kl", "entropy"):
                ax.plot(steps, series(k), label=k)
        elif key == "context":
            ax.plot(steps, series("context_mean"), label="mean")
            ax.plot(steps, series("context_max"), label="max")
        else:
            ax.plot(steps, series(key), label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "plots" / "learning.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(8, 4))
    for k in ("rollout_s", "experience_s", "dispatch_s", "train_s"):
        ax.plot(steps, series(k), label=k)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("stage times")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "plots" / "stage_times.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths
