"""studies/cpu_refit_dispatch.py: a calibration's dispatch path refitted on its recorded points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAL = ROOT / "docs" / "cpu" / "epyc-2026-12-05b" / "cf57" / "profile-cpu.json"  # timed no reduction


def refit(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, "studies/cpu_refit_dispatch.py", str(CAL), str(out), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return r, (json.loads(out.read_text()) if out.exists() else {})


def test_refit_without_a_reduction_reproduces_the_calibrations_path(tmp_path):
    r, got = refit(tmp_path)
    assert r.returncode == 0, r.stderr
    before = json.loads(CAL.read_text())["dispatch_path"]
    for k, v in before.items():
        if k == "cold_round_s":  # fitted with the bytes since the thirtieth session (`fit_cold`)
            continue
        assert got["dispatch_path"][k] == pytest.approx(v, rel=1e-3, abs=1e-9), k  # least squares, same start
    cold = got["fit_quality"]["dispatch_path"]["points"]
    assert got["dispatch_path"]["cold_byte_s"] > 0 and all(p["cold_predicted_s"] > p["predicted_s"] for p in cold)
    assert got["fit_quality"]["dispatch_path"]["fit_median_err"] == \
        json.loads(CAL.read_text())["fit_quality"]["dispatch_path"]["fit_median_err"]


def test_refit_with_a_reduction_sets_its_terms_and_moves_the_fitted_ones(tmp_path):
    r, got = refit(tmp_path, "--reduce-ms", "0.26,1.08")
    assert r.returncode == 0, r.stderr
    path, q = got["dispatch_path"], got["fit_quality"]["dispatch_path"]
    assert (path["reduce_s"], path["reduce_sync_s"]) == (pytest.approx(2.6e-4), pytest.approx(8.2e-4))
    assert "0.260 ms within the cores, 1.080 ms beyond" in q["refit"]
    # a reduction priced below two barrier rounds leaves time the per-message cost now explains
    assert path["message_s"] > json.loads(CAL.read_text())["dispatch_path"]["message_s"]
    assert "reduce_s" in r.stdout and "wrote" in r.stdout


@pytest.mark.parametrize("bad", ["0.26", "x,1", "0.26,-1", "from:" + str(CAL)])
def test_bad_reduction_figures_exit_2_with_one_line(tmp_path, bad):
    r, got = refit(tmp_path, "--reduce-ms", bad)
    assert r.returncode == 2 and not got
    assert "--reduce-ms" in r.stderr or "reduce_s is 0" in r.stderr


def test_an_existing_or_unreachable_out_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("keep me")
    cmd = [sys.executable, "studies/cpu_refit_dispatch.py", str(CAL)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([*cmd, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "exists; pass --force" in r.stderr and out.read_text() == "keep me"
    r = subprocess.run([*cmd, str(tmp_path / "no" / "out.json")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and "is not a folder" in r.stderr
