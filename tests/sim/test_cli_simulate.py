"""`earl simulate`: outputs, --compare table, bad input (exit 2, one line), nothing
half-written on failure.

    python -m pytest tests/sim/test_cli_simulate.py -q
"""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.trace import read_chrome_trace

FAST = ["connect-four-small", "--steps", "2", "--set", "workload.episodes_per_step=16"]


@pytest.fixture()
def runner():
    return CliRunner()


def test_simulate_compare_writes_every_output(runner, tmp_path):
    out = tmp_path / "study"
    res = runner.invoke(app, ["simulate", *FAST, "--compare", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "tokens/s/GPU" in res.output and "cost-model/layout-aware" in res.output
    names = {p.name for p in out.iterdir()}
    assert {"metrics.csv", "summary.json", "decisions.jsonl", "trace.json", "throughput.png",
            "stages.png", "memory.png"} <= names
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2 * 4  # steps x policies
    assert {r["policy"] for r in rows} == {"static/centralized", "earl-table/centralized",
                                           "cost-model/centralized", "cost-model/layout-aware"}
    for col in ("throughput_tokens_per_gpu_s", "step_time_s", "oom_events", "truncated_episodes",
                "dispatch_s", "reshard_s", "context_mean", "context_p95", "headroom_min",
                "plan_rollout", "plan_experience", "plan_train"):
        assert rows[0][col] != ""
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["policies"]) == 4 and summary["scenario"]["scenario.steps"] == 2
    spans = read_chrome_trace(out / "trace.json")
    assert {"rollout", "experience", "train", "dispatch", "select"} <= {s.stage for s in spans}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


@pytest.mark.parametrize("args, match", [
    (["--set", "cluster.nodez=2"], "unknown scenario key 'cluster.nodez'"),
    (["--set", "cluster.nodes=0"], "cluster.nodes must be an integer >= 1"),
    (["--set", "workload.env_latency_s=-0.5"], "env_latency_s must be >= 0"),
    (["--set", "plan.train=tp4-dp4"], "does not match the cluster"),
    (["--set", "policy.selector=magic"], "unknown selector 'magic'"),
    (["--set", "nodes"], "--set expects key=value"),
])
def test_bad_input_exits_2_with_one_line(runner, tmp_path, args, match):
    out = tmp_path / "o"
    res = runner.invoke(app, ["simulate", *FAST, "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    assert match in res.output
    assert "Traceback" not in res.output
    assert len([ln for ln in res.output.strip().splitlines() if ln.startswith("error")]) == 1
    assert not out.exists()


def test_missing_scenario_file(runner, tmp_path):
    res = runner.invoke(app, ["simulate", str(tmp_path / "nope.toml")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_existing_out_is_never_overwritten(runner, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = runner.invoke(app, ["simulate", *FAST, "--out", str(out)])
    assert res.exit_code == 2 and "is not empty" in res.output
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_failure_while_writing_leaves_nothing(runner, tmp_path, monkeypatch):
    import earl.sim.plots as plots

    def boom(rows, folder):
        raise ValueError("plotting failed")

    monkeypatch.setattr(plots, "write_plots", boom)
    out = tmp_path / "o"
    res = runner.invoke(app, ["simulate", *FAST, "--out", str(out)])
    assert res.exit_code == 2 and "plotting failed" in res.output
    assert list(tmp_path.iterdir()) == []
