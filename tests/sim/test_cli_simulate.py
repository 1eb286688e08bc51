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


def test_default_puts_the_baseline_and_earl_side_by_side_and_explains_the_gain(runner, tmp_path):
    """No policy flag: the scenario's policy and EARL's cost-model/layout-aware on the same seeded
    workload, then the gain and what caused it; --single is the one-policy run it used to be."""
    out = tmp_path / "duel"
    res = runner.invoke(app, ["simulate", *FAST, "--no-plots", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "2 policies" in res.output and "gain: cost-model/layout-aware trains" in res.output
    assert "caused by:" in res.output and "stage s/step, static/centralized: rollout" in res.output
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["policy"] for r in rows] == ["static/centralized"] * 2 + ["cost-model/layout-aware"] * 2
    assert {r["episodes"] for r in rows} == {"16"}  # the same seeded workload for both

    one = tmp_path / "one"
    res = runner.invoke(app, ["simulate", *FAST, "--single", "--no-plots", "--out", str(one)])
    assert res.exit_code == 0, res.output
    assert "1 policy" in res.output and "gain:" not in res.output
    assert {r["policy"] for r in csv.DictReader((one / "metrics.csv").open())} == {"static/centralized"}


def test_default_with_earls_policy_as_the_scenarios_runs_it_once(runner, tmp_path):
    res = runner.invoke(app, ["simulate", *FAST, "--no-plots", "--set", "policy.selector=cost-model",
                              "--set", "policy.dispatcher=layout-aware", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "1 policy" in res.output and "gain:" not in res.output


def test_single_and_compare_together_is_one_line_exit_2(runner, tmp_path):
    res = runner.invoke(app, ["simulate", *FAST, "--single", "--compare", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "choose one" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def test_explain_gain_names_the_oom_events_avoided_and_the_stages_that_moved():
    from earl.cli import explain_gain, policy_duel

    assert policy_duel(("static", "centralized")) == [("static", "centralized"), ("cost-model", "layout-aware")]
    assert policy_duel(("cost-model", "layout-aware")) == [("cost-model", "layout-aware")]
    stages = dict.fromkeys(("rollout_s", "experience_s", "dispatch_s", "train_s", "reshard_s", "sync_s",
                            "restart_s"), 0.0)
    base_rows = [{**stages, "rollout_s": 10.0, "train_s": 4.0, "restart_s": 30.0}]
    earl_rows = [{**stages, "rollout_s": 10.0, "train_s": 3.0, "sync_s": 0.5}]
    base = {"policy": "static/centralized", "throughput_tokens_per_gpu_s": 80.0, "step_time_mean_s": 44.0,
            "oom_events": 5, "oom_steps": 4, "plan_switches": 0}
    earl = {"policy": "cost-model/layout-aware", "throughput_tokens_per_gpu_s": 100.0, "step_time_mean_s": 13.5,
            "oom_events": 0, "oom_steps": 0, "plan_switches": 2}
    text = explain_gain(base, earl, base_rows, earl_rows)
    assert "(1.25x)" in text and "OOM events 5 -> 0 (steps with one: 4 -> 0)" in text
    assert "restart 30.00 -> 0.00 s/step (saved 30.00)" in text and "train 4.00 -> 3.00" in text
    assert "sync 0.00 -> 0.50 s/step (added 0.50)" in text and "2 plan switches" in text
    assert "experience" not in text  # a stage neither policy spent time in is left out
