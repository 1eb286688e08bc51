"""Run outputs: per-step metrics (CSV + JSONL), the workload trace the simulator replays, span
traces (Chrome JSON), episode transcripts (episodes.jsonl, printed by `earl show RUN`),
TensorBoard when installed, and PNG plots at the end.

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
EPISODES_JSONL = "episodes.jsonl"


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class JsonlTable:
    """Rows with a "step" key, kept in memory and rewritten atomically to `path`. Each row is
    encoded once, when appended (a run's flushes rewrite the file, not re-encode every row:
    at 600 steps x 128 episodes the workload's re-encoding was a third of a demo run's time)."""

    def __init__(self, path: Path, keep_until_step: int | None = None):
        self.path = path
        self.rows: list[dict] = []
        self._lines: list[str] = []  # rows[i] as written
        if keep_until_step is not None and path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    if row["step"] <= keep_until_step:
                        self.rows.append(row)
                        self._lines.append(line + "\n")

    def append(self, row: dict) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self.rows.append(row)
        self._lines.append(json.dumps(row, default=str) + "\n")

    def write(self) -> None:
        atomic_write_text(self.path, "".join(self._lines))


class RunRecorder:
    """Everything `earl run` writes per step, in one place."""

    def __init__(self, out_dir: Path, *, resume_step: int | None = None, tensorboard: bool = True,
                 wandb_config: dict | None = None):
        self.out = out_dir
        self.metrics = JsonlTable(out_dir / METRICS_JSONL, resume_step)
        self.workload = JsonlTable(out_dir / WORKLOAD_JSONL, resume_step)
        self.decisions = JsonlTable(out_dir / DECISIONS_JSONL, resume_step)
        self.episodes = JsonlTable(out_dir / EPISODES_JSONL, resume_step)
        self._csv = CsvRows()
        self.spans: list[Span] = []
        if resume_step is not None and (out_dir / TRACE_JSON).is_file():
            self.spans = [s for s in read_chrome_trace(out_dir / TRACE_JSON) if s.step <= resume_step]
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: CSV/JSONL only
                SummaryWriter = None
            if SummaryWriter is not None:  # on resume, TensorBoard too forgets the steps after the checkpoint
                self.tb = SummaryWriter(str(out_dir / "tensorboard"),
                                        purge_step=None if resume_step is None else resume_step + 1)
        self.wb = None
        if wandb_config is not None:  # wandb = true: offline unless WANDB_MODE says otherwise
            import os

            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            self.wb = wandb.init(project="earl", dir=str(out_dir), name=out_dir.name, config=wandb_config)

    def log_step(self, row: dict, episodes: list[dict], decisions: list[dict]) -> None:
        self.metrics.append(row)
        self.workload.append({"step": row["step"], "episodes": episodes})
        for d in decisions:
            self.decisions.append({"step": row["step"], **d})
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step" and v == v:
                    self.tb.add_scalar(k, v, row["step"])
        if self.wb is not None:
            self.wb.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step" and v == v},
                        step=row["step"])

    def log_transcripts(self, step: int, trajs: list, k: int) -> None:
        """`k` of the episodes this rank played (evenly spread over episode ids) as transcripts."""
        trajs = sorted(trajs, key=lambda t: t.episode_id)
        m = min(k, len(trajs))
        for j in sorted({round(i * (len(trajs) - 1) / max(m - 1, 1)) for i in range(m)}):
            self.episodes.append(transcript(trajs[j], step))

    def flush(self, with_trace: bool = True) -> None:
        self.episodes.write()
        self.metrics.write()
        self.workload.write()
        self.decisions.write()
        atomic_write_text(self.out / METRICS_CSV, self._csv.text(self.metrics.rows))
        if with_trace:
            write_chrome_trace(self.spans, self.out / TRACE_JSON)
        if self.tb is not None:
            self.tb.flush()

    def close(self, failed: bool = False) -> None:
        """`failed`: the run stopped on an exception (Ctrl-C included); wandb then marks it crashed."""
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish(exit_code=1 if failed else 0)


def transcript(t, step: int) -> dict:
    """One episode (an earl.runtime.rollout.Trajectory) as a JSON-able transcript; assistant
    messages carry the tool calls parsed from them."""
    from earl.runtime.envs.tools import parse_tool_calls

    msgs = []
    for m in t.messages:
        m = dict(m)
        if m["role"] == "assistant" and (calls := parse_tool_calls(m["content"])):
            m["tool_calls"] = [{"name": c.name, "arguments": c.arguments, **({"error": c.error} if c.error else {})}
                               for c in calls]
        msgs.append(m)
    return {"step": step, "episode": t.episode_id, "group": t.group_id, "reward": t.reward,
            "outcome": t.outcome, "turns": len(t.turns), "invalid_actions": t.invalid_actions,
            "tokens": len(t.token_ids), "generated_tokens": t.generated_tokens, "messages": msgs}


def format_transcripts(run_dir: str | Path, *, episodes: int = 4, step: int | None = None) -> str:
    """The latest (or step `step`'s) transcripts of a run folder, as text for a terminal."""
    p = Path(run_dir) / EPISODES_JSONL
    if not Path(run_dir).is_dir():
        raise ValueError(f"run folder {str(run_dir)!r} not found")
    if not p.is_file():
        raise ValueError(f"{run_dir} has no {EPISODES_JSONL} (transcript_every=0, or a run from before transcripts)")
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{p} holds no transcripts yet")
    steps = sorted({r["step"] for r in rows})
    want = steps[-1] if step is None else step
    if want not in steps:
        raise ValueError(f"no transcripts at step {want}; steps with transcripts: {', '.join(map(str, steps))}")
    lines = []
    for r in [r for r in rows if r["step"] == want][:episodes]:
        lines.append(f"== step {r['step']}  episode {r['episode']} (group {r['group']})  reward {r['reward']:+.3f}  "
                     f"{r['outcome'] or '-'}  {r['turns']} turn(s), {r['invalid_actions']} invalid, "
                     f"{r['tokens']} tokens")
        for m in r["messages"]:
            body = m["content"].rstrip("\n").replace("\n", "\n" + " " * 12)
            lines.append(f"  {m['role']:>9}: {body}")
            for c in m.get("tool_calls", ()):
                what = c.get("error") or json.dumps(c["arguments"])
                lines.append(f"  {'':>9}  -> tool call {c['name'] or '?'}: {what}")
    return "\n".join(lines)


class CsvRows:
    """Rows as CSV text, columns in first-seen order; each row is encoded once, as long as no
    later row brings a new column (then all are re-encoded under the wider header), so a run's
    per-step flush costs one row, not the whole run."""

    def __init__(self) -> None:
        self.cols: list[str] = []
        self.lines: list[str] = []

    def _encode(self, rows: list[dict]) -> list[str]:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.cols, lineterminator="\n")
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in self.cols})
        return buf.getvalue().splitlines(keepends=True)

    def text(self, rows: list[dict]) -> str:
        """The CSV of `rows`; an earlier call's rows must be a prefix of them (a resumed run's
        rows are a prefix of the file it started from: it starts a new CsvRows)."""
        if len(rows) < len(self.lines):
            self.cols, self.lines = [], []
        new = rows[len(self.lines):]
        wider = [k for r in new for k in r if k not in self.cols]
        if wider:
            self.cols += list(dict.fromkeys(wider))
            self.lines = self._encode(rows)
        else:
            self.lines += self._encode(new)
        if not self.cols:
            return ""
        head = io.StringIO()
        csv.writer(head, lineterminator="\n").writerow(self.cols)
        return head.getvalue() + "".join(self.lines)


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
