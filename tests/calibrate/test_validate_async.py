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


def test_pool_stretch_is_the_harmonic_mean_over_the_other_pools_busy_time():
    """On 2 cores, a 1-rank rollout pool next to a 3-rank training pool: alone (training idle)
    it has a core (x1), with all 4 ranks busy half a core (x2); training with the replica always
    busy shares with all 4 (x2); half the time busy gives the harmonic mean 1 / (0.5/2 + 0.5/1)."""
    import dataclasses

    from earl.calibrate.validate_async import pool_stretch
    from earl.cost_model.profile import load_profile

    prof = load_profile("cpu-measured")
    prof = dataclasses.replace(prof, host_share=1.0,
                               dispatch_path=dataclasses.replace(prof.dispatch_path, host_parallel=2))
    pools = {"rollout": 1, "train": 3}
    assert pool_stretch(prof, pools, (1.0, 0.0), "cpu") == pytest.approx((1.0, 2.0))
    assert pool_stretch(prof, pools, (1.0, 1.0), "cpu") == pytest.approx((2.0, 2.0))
    assert pool_stretch(prof, pools, (1.0, 0.5), "cpu")[0] == pytest.approx(1 / (0.25 + 0.5))
    assert pool_stretch(prof, {"rollout": 1, "train": 1}, (1.0, 1.0), "cpu") == pytest.approx((1.0, 1.0))
    assert pool_stretch(prof, pools, (1.0, 1.0), "cuda") == (1.0, 1.0)

