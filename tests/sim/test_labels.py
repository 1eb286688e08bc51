"""What `earl simulate` prints and plots says what it is: per-step means apart from run totals,
restart time counted, a replayed trace named as a trace, and the network names of `earl estimate`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from earl.cli import app
from earl.sim import report
from earl.sim.plots import STAGE_COLUMNS
from earl.sim.run import METRIC_COLUMNS


def test_table_headers_say_mean_or_sum_and_restart_is_a_stage(tmp_path):
    r = CliRunner().invoke(app, ["simulate", "connect-four-small", "--steps", "2", "--no-plots", "--set",
                                 "cluster.network=rdma-400gx8", "--out", str(tmp_path / "o")],
                           env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "s/step" in r.output and "sync s total" in r.output and "rdma-400gx8" in r.output
    assert "restart_s" in STAGE_COLUMNS and "restart_s" in METRIC_COLUMNS
    assert "restart_s" in (tmp_path / "o" / "metrics.csv").read_text().splitlines()[0]


def test_replayed_trace_is_labelled_as_a_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"step": 0, "episodes": [{"id": 0, "turns": [[10, 5, 0.1]]}]}) + "\n")
    sc, pairs = report.prepare("connect-four-small", {"workload.trace": str(trace)}, steps=1, fine=False,
                               compare=False)
    assert f"trace {trace}" in report.headline(sc, pairs)
    assert "replayed trace" in report.results_table(sc, []).title
