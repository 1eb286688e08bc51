"""`earl validate` on the CPU: the runtime and the simulator on the same config and trace.

    pytest tests/calibrate/test_validate.py
"""

import json
import math

import pytest
from typer.testing import CliRunner

from earl.calibrate.overhead import ForwardPoint, fit_overhead
from earl.calibrate.validate import STAGES, kendall_tau, parse_variants, run_validation
from earl.cli import app
from earl.cost_model.profile import load_profile
from earl.runtime.run import resolve_config

SMALL = {"groups": 2, "group_size": 2}


def test_validation_runs_runtime_and_simulator(calibrated_profile, tmp_path):
    cfg = resolve_config(None, overrides=SMALL)
    res = run_validation(config=cfg, profile=calibrated_profile, steps=2, warmup_steps=1,
                         variants=parse_variants("engine_batch=0;engine_batch=1"), out_dir=tmp_path / "v")
    assert [v.name for v in res.variants] == ["engine_batch=0", "engine_batch=1"]
    for v in res.variants:
        assert len(v.measured) == len(v.predicted) == len(v.datasheet) == 1  # 2 steps, 1 warm-up
        for stage in ("rollout", "experience", "train"):
            assert v.measured[0][stage] > 0 and v.predicted[0][stage] > 0, stage
        assert v.predicted != v.datasheet  # the calibrated profile changes the prediction
        assert v.peak_mem_measured > 0 and v.peak_mem_predicted > 0
    stages = {r["stage"]: r for r in res.table}
    assert set(stages) <= set(STAGES) and {"rollout", "experience", "train"} <= set(stages)
    assert all(math.isfinite(r["median_err"]) for r in res.table)
    assert res.kendall_tau in (-1.0, 1.0)  # two variants: same or opposite order
    report = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert report["stages"] == res.table and report["profile"] == calibrated_profile
    assert (tmp_path / "v" / "scatter.png").stat().st_size > 1000
    assert (tmp_path / "v" / "validation.csv").read_text().startswith("variant,step,stage")


def test_kendall_tau_and_variants_parsing():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert kendall_tau([1.0], [2.0]) is None
    assert parse_variants("a=1,b=2;c=3") == [("a=1,b=2", {"a": "1", "b": "2"}), ("c=3", {"c": "3"})]
    with pytest.raises(ValueError, match="--variants expects key=value"):
        parse_variants("engine_batch")


def test_overhead_fit_recovers_a_known_per_op_cost():
    pts = [ForwardPoint(label=str(i), time_s=e + 18 * 40e-6, explained_s=e, ops=18)
           for i, e in enumerate([1e-4, 5e-4, 2e-3, 3e-5, 8e-4])]
    fit = fit_overhead(pts)
    assert fit.op_overhead_s == pytest.approx(40e-6)
    assert fit.heldout_median_err == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="need 3"):
        fit_overhead(pts[:2])


def _cli(*args):
    return CliRunner().invoke(app, ["validate", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "1"], "--steps 1 leaves nothing to score after 1 warm-up step(s)"),
    (["--variants", "engine_bach=2"], "unknown config key 'engine_bach'"),
    (["--device", "tpu"], "unknown device 'tpu'; valid: cpu, cuda"),
    (["--hardware", "h300"], "unknown hardware profile 'h300'"),
])
def test_cli_bad_input(tmp_path, args, message):
    r = _cli("--out", str(tmp_path / "v"), *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1


def test_cli_refuses_a_used_out_folder_and_a_broken_profile(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    r = _cli("--out", str(tmp_path / "used"))
    assert r.exit_code == 2 and "is not empty" in r.output
    d = load_profile("cpu").to_dict()
    del d["intra"]
    (tmp_path / "bad.json").write_text(json.dumps(d))
    r = _cli("--out", str(tmp_path / "v"), "--hardware", str(tmp_path / "bad.json"))
    assert r.exit_code == 2 and "is missing field 'intra'" in r.output


def test_cli_warns_when_the_profile_was_measured_elsewhere(calibration, tmp_path):
    d = calibration.profile.to_dict()
    d["stamp"]["torch"] = "2.0.0"
    (tmp_path / "old.json").write_text(json.dumps(d))
    r = _cli("--out", str(tmp_path / "v"), "--steps", "2", "--set", "groups=1", "--set", "group_size=2",
             "--hardware", str(tmp_path / "old.json"))
    assert r.exit_code == 0, r.output
    assert "stamp mismatch: torch: profile has '2.0.0'" in r.output
    assert "rollout" in r.output and (tmp_path / "v" / "validation.json").is_file()
