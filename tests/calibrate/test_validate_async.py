"""`earl validate --schedule async`: an async run next to a sync one under torchrun, measured
and simulated (tokens/s and their ratio, staleness, per-pool stage times); bad input exits 2.

    OMP_NUM_THREADS=1 python -m pytest -q tests/calibrate/test_validate_async.py [-m slow]
"""

from __future__ import annotations

import json
import math
import os

import pytest
from typer.testing import CliRunner

from earl.calibrate.validate_async import POOL_STAGES, check_async_nproc, check_schedule, handoff_spans
from earl.cli import app
from earl.trace import Span


def _cli(*args):
    return CliRunner().invoke(app, ["validate", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--schedule", "later"], "--schedule 'later' unknown; valid: sync, async"),
    (["--schedule", "async", "--nproc", "1"], "--nproc 1 with --schedule async; valid: 2, 4"),
    (["--schedule", "async", "--nproc", "2", "--steps", "2"], "use --steps >= 3"),
    (["--schedule", "async", "--variants", "engine_batch=4"], "--variants and --model are for --schedule sync"),
])
def test_bad_async_input_is_one_line_and_exit_2(tmp_path, args, message):
    r = _cli("--out", str(tmp_path / "v"), *args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())


def test_checks_name_the_value_and_the_choices():
    assert check_schedule("async") == "async" and check_async_nproc(4) == 4
    with pytest.raises(ValueError, match="valid: 2, 4"):
        check_async_nproc(True)


def test_handoff_is_the_gap_after_each_rollout():
    spans = [Span(name="rollout", stage="rollout", rank=1, t_start=0.0, t_end=1.0, step=1),
             Span(name="wait_weights", stage="reshard", rank=1, t_start=1.5, t_end=2.0, step=2),
             Span(name="rollout", stage="rollout", rank=1, t_start=2.0, t_end=3.0, step=2),
             Span(name="rollout", stage="rollout", rank=1, t_start=3.25, t_end=4.0, step=3)]
    got = [(s.step, s.t_start, s.t_end) for s in handoff_spans(spans)]
    assert got == [(1, 1.0, 1.5), (2, 3.0, 3.25)]


@pytest.mark.slow
@pytest.mark.dist
def test_async_validation_on_two_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = _cli("--out", str(tmp_path / "v"), "--schedule", "async", "--nproc", "2", "--steps", "3",
             "--set", "groups=2", "--set", "group_size=2", "--set", "schedule.max_staleness=1")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "v" / "async_validation.json").read_text())
    assert report["nproc"] == 2 and report["pools"] == {"rollout": 1, "train": 1}
    rows = {row["what"]: row for row in report["rows"]}
    wanted = ["sync generated tokens/s", "async generated tokens/s", "async / sync tokens/s", "staleness mean",
              "staleness max"] + [f"{pool}: {what} s/step" for what, _, pool in POOL_STAGES]
    assert list(rows) == wanted
    for what, row in rows.items():
        assert math.isfinite(row["measured"]) and math.isfinite(row["simulated"]), what
    for what in wanted[:3] + ["rollout pool: rollout s/step", "training pool: train s/step",
                              "training pool: weight push s/step"]:
        assert rows[what]["measured"] > 0 and rows[what]["simulated"] > 0, what
    assert rows["staleness max"]["measured"] <= 1 and rows["staleness max"]["simulated"] <= 1
    assert "async / sync tokens/s" in r.output and (tmp_path / "v" / "async_validation.csv").is_file()
