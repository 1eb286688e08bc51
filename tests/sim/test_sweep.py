"""Parallel sweeps: `--jobs N` gives the serial run's results, in order; `--jobs ray` without
Ray is a one-line error.

    python -m pytest tests/sim/test_sweep.py -q
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.sim.run import metrics_csv, simulate
from earl.sim.scenario import load_scenario
from earl.sim.sweep import parse_jobs, run_jobs

HAS_RAY = importlib.util.find_spec("ray") is not None
TINY = {"workload.episodes_per_step": "16", "scenario.steps": "2"}


def square(x: int) -> int:
    return x * x


def test_run_jobs_keeps_order_in_processes():
    seen = []
    assert run_jobs(square, range(5), 2, done=lambda i, r: seen.append(i)) == [0, 1, 4, 9, 16]
    assert sorted(seen) == list(range(5))


def test_parse_jobs():
    assert parse_jobs("3") == 3 and parse_jobs("ray") == "ray" and parse_jobs(None) >= 1
    for bad in ("0", "-2", "many"):
        with pytest.raises(ValueError, match="positive integer"):
            parse_jobs(bad)


def test_parallel_compare_equals_serial():
    sc = load_scenario("connect-four-small", TINY)
    serial = simulate(sc, compare=True, jobs=1)
    parallel = simulate(sc, compare=True, jobs=2)
    assert [r.label for r in parallel] == [r.label for r in serial]
    assert metrics_csv(parallel) == metrics_csv(serial)
    for a, b in zip(serial, parallel, strict=True):
        assert a.decisions == b.decisions and a.spans == b.spans and a.events == b.events


def test_cli_jobs(tmp_path):
    runner = CliRunner()
    args = ["simulate", "connect-four-small", "--compare", "--no-plots"] + \
        [x for k, v in TINY.items() for x in ("--set", f"{k}={v}")]
    one = runner.invoke(app, args + ["--jobs", "1", "--out", str(tmp_path / "a")])
    two = runner.invoke(app, args + ["--jobs", "2", "--out", str(tmp_path / "b")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()
    pol = [json.loads((tmp_path / d / "summary.json").read_text())["policies"] for d in "ab"]
    assert [p["throughput_tokens_per_gpu_s"] for p in pol[0]] == [p["throughput_tokens_per_gpu_s"] for p in pol[1]]
    bad = runner.invoke(app, args + ["--jobs", "zero", "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "positive integer" in bad.output


@pytest.mark.skipif(HAS_RAY, reason="checks the message shown when Ray is missing")
def test_jobs_ray_without_ray_is_one_line_error(tmp_path):
    res = CliRunner().invoke(app, ["simulate", "--compare", "--jobs", "ray", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert "pip install ray" in res.output and len(res.output.strip().splitlines()) == 1
