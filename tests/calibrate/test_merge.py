"""`earl calibrate --median-of`: several calibrations of one host merged, each number the median."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from earl.calibrate.merge import median_profile
from earl.cli import app
from earl.cost_model.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
# three calibrations of the 2-core VM made minutes apart (docs/cpu/epyc-2026-12-04d)
PASSES = [ROOT / "docs" / "cpu" / "epyc-2026-12-04d" / f"cf{i}" / "profile-cpu.json" for i in (35, 36, 37)]


def calibrate(*args: str):
    return CliRunner().invoke(app, ["calibrate", *args])


def test_each_number_is_the_median_of_the_calibrations():
    a = {"hardware": {"name": "cpu", "gpus_per_node": 2, "peak_flops": 1.0}, "corun_slowdown": 1.6,
         "dispatch_path": {"round_s": 3e-4, "full_duplex": False}, "stamp": {"device": "X", "date": "1"},
         "fit_quality": {"corun": {"ratios": [1.0]}}}
    b = {**a, "hardware": {**a["hardware"], "gpus_per_node": 4, "peak_flops": 3.0}, "corun_slowdown": 1.2,
         "dispatch_path": {"round_s": 5e-4, "full_duplex": True}, "stamp": {"device": "X", "date": "3"}}
    c = {**a, "hardware": {**a["hardware"], "peak_flops": 2.0}, "corun_slowdown": 1.3,
         "stamp": {"device": "X", "date": "2"}}
    m = median_profile([a, b, c], ["a", "b", "c"])
    assert m["corun_slowdown"] == 1.3 and m["hardware"]["peak_flops"] == 2.0
    assert m["hardware"]["gpus_per_node"] == 2 and isinstance(m["hardware"]["gpus_per_node"], int)
    assert m["dispatch_path"] == {"round_s": 3e-4, "full_duplex": False}  # flags from the first
    assert m["hardware"]["name"] == "cpu" and m["stamp"]["date"] == "3"
    assert m["stamp"]["median_of"] == ["a", "b", "c"] and "median_of" in m["fit_quality"]
    assert m["fit_quality"]["corun"] == {"ratios": [1.0]}  # point lists from the first
    spread = m["fit_quality"]["median_of"]["min_median_max"]
    assert spread["corun_slowdown"] == [1.2, 1.3, 1.6] and "hardware.name" not in spread
    # a key only later calibrations fit (an older one's empty mapping, or none at all) is the
    # median of theirs, whichever calibration comes first
    rows = [{**a, "gemm_row_factors": {}}, {**b, "gemm_row_factors": {"2": 1.9, "3": 1.7}},
            {**c, "gemm_row_factors": {"2": 2.1, "3": 1.8}}, {**c}]
    assert median_profile(rows)["gemm_row_factors"] == {"2": 2.0, "3": 1.75}
    assert median_profile(rows[::-1])["gemm_row_factors"] == {"2": 2.0, "3": 1.75}
    # a pair of numbers (estimator_s: s per sample, s per token) is merged element by element
    pairs = [{**a, "estimator_s": {"grpo": [1.0, 9.0]}}, {**b, "estimator_s": {"grpo": [3.0, 7.0]}},
             {**c, "estimator_s": {"grpo": [2.0, 8.0]}}]
    assert median_profile(pairs)["estimator_s"] == {"grpo": [2.0, 8.0]}
    with pytest.raises(ValueError, match="at least 2 calibrations, got 1"):
        median_profile([a])
    with pytest.raises(ValueError, match="differ in device"):
        median_profile([a, {**b, "stamp": {"device": "Y"}}])


def test_cli_merges_real_calibrations_into_a_profile_that_loads(tmp_path):
    out = tmp_path / "median.json"
    r = calibrate("--median-of", ",".join(map(str, PASSES)), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "median of 3 calibrations" in r.output
    merged, ones = load_profile(out), [load_profile(p) for p in PASSES]
    assert merged.corun_slowdown == pytest.approx(statistics.median(p.corun_slowdown for p in ones))
    assert merged.reshard_tensor_s == pytest.approx(statistics.median(p.reshard_tensor_s for p in ones))
    assert merged.dispatch_path.round_s == pytest.approx(statistics.median(p.dispatch_path.round_s for p in ones))
    assert merged.matmul.peak_frac == pytest.approx(statistics.median(p.matmul.peak_frac for p in ones))
    assert merged.stamp["source"] == "calibrated" and merged.stamp["median_of"] == list(map(str, PASSES))
    assert "load_avg_1m" not in merged.stamp  # one calibration's run conditions are not the merge's
    # an existing --out is kept unless --force; a bad input names itself; nothing is written then
    before = out.read_text()
    r = calibrate("--median-of", ",".join(map(str, PASSES)), "--out", str(out))
    assert r.exit_code == 2 and "already exists" in r.output and out.read_text() == before
    missing = tmp_path / "nope.json"
    r = calibrate("--median-of", f"{PASSES[0]},{missing}", "--out", str(tmp_path / "m2.json"))
    assert r.exit_code == 2 and "nope.json" in r.output and not (tmp_path / "m2.json").exists()
    r = calibrate("--median-of", str(PASSES[0]), "--out", str(tmp_path / "m3.json"))
    assert r.exit_code == 2 and "at least 2 calibrations" in r.output
    assert len(json.loads(before)["stamp"]["median_of"]) == 3
