"""Span records shared by the simulator and the runtime, and their exports.

Both `earl simulate` and `earl run` emit `Span`s; calibrating the simulator is a diff between
the two traces. Exports: Chrome trace JSON (open in https://ui.perfetto.dev) and a pandas
DataFrame / CSV.

    python -c "from earl.trace import Span, write_chrome_trace as w; \
        w([Span(name='x', stage='rollout', rank=0, t_start=0, t_end=1)], '/tmp/t.json')"
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from earl.specs import SPAN_STAGES


@dataclass(frozen=True, kw_only=True)
class Span:
    """One timed piece of work on one rank."""

    name: str  # e.g. "decode", "prefill", "ref_logprob", "all_to_all"
    stage: str  # one of SPAN_STAGES
    rank: int  # global rank (sim: GPU index)
    t_start: float  # seconds since the run's origin
    t_end: float  # seconds since the run's origin
    step: int = 0  # training step
    bytes: int = 0  # bytes moved (transfers)
    tokens: int = 0  # tokens processed
    args: dict = field(default_factory=dict)  # free-form extras (plan, reason, ...)

    def __post_init__(self):
        if self.stage not in SPAN_STAGES:
            raise ValueError(f"Span.stage {self.stage!r}; valid: {', '.join(SPAN_STAGES)}")
        if self.t_end < self.t_start:
            raise ValueError(f"Span {self.name!r} ends before it starts: {self.t_start} > {self.t_end}")

    @property
    def duration_s(self) -> float:
        return self.t_end - self.t_start


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def to_chrome_trace(spans: list[Span]) -> dict:
    """Chrome trace-event JSON: one process per stage family, one thread per rank."""
    events = []
    for s in spans:
        events.append({
            "name": s.name, "cat": s.stage, "ph": "X", "pid": 0, "tid": s.rank,
            "ts": s.t_start * 1e6, "dur": max(s.duration_s * 1e6, 0.001),
            "args": {"step": s.step, "bytes": s.bytes, "tokens": s.tokens, **s.args},
        })
    ranks = sorted({s.rank for s in spans})
    meta = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
            for r in ranks]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: list[Span], path: str | Path) -> None:
    atomic_write_text(path, json.dumps(to_chrome_trace(spans), default=str))


def read_chrome_trace(path: str | Path) -> list[Span]:
    """Read back a trace written by `write_chrome_trace`."""
    data = json.loads(Path(path).read_text())
    out = []
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            continue
        args = dict(e.get("args", {}))
        step, nbytes, tokens = args.pop("step", 0), args.pop("bytes", 0), args.pop("tokens", 0)
        t0 = e["ts"] / 1e6
        out.append(Span(name=e["name"], stage=e["cat"], rank=e["tid"], t_start=t0,
                        t_end=t0 + e["dur"] / 1e6, step=step, bytes=nbytes, tokens=tokens,
                        args=args))
    return out


def spans_to_dataframe(spans: list[Span]):
    """A pandas DataFrame with one row per span and a `duration_s` column."""
    import pandas as pd

    rows = []
    for s in spans:
        d = dataclasses.asdict(s)
        d["duration_s"] = s.duration_s
        d["args"] = json.dumps(s.args, default=str)
        rows.append(d)
    return pd.DataFrame(rows, columns=["name", "stage", "rank", "t_start", "t_end", "step",
                                       "bytes", "tokens", "args", "duration_s"])


def stage_totals(spans: list[Span]) -> dict[tuple[int, str], float]:
    """Wall time per (step, stage): from the first start to the last end across ranks."""
    lo: dict = {}
    hi: dict = {}
    for s in spans:
        k = (s.step, s.stage)
        lo[k] = min(lo.get(k, s.t_start), s.t_start)
        hi[k] = max(hi.get(k, s.t_end), s.t_end)
    return {k: hi[k] - lo[k] for k in lo}
