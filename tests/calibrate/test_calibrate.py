"""A tiny real calibration, the profile it writes, the `earl calibrate` CLI's errors and the
GPU-check script's CPU path.

    pytest tests/calibrate/test_calibrate.py
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from earl.calibrate import current_stamp, hostcost, run_calibration
from earl.cli import app
from earl.cost_model import CostModel
from earl.cost_model.profile import check_stamp, load_profile
from earl.specs import ClusterSpec, ModelSpec, ParallelPlan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.dist
def test_tiny_calibration_writes_a_loadable_stamped_profile(calibration, tmp_path):
    res = calibration
    path = res.profile.save(tmp_path / "cpu.json")
    loaded = load_profile(str(path))
    assert loaded == res.profile
    stamp = loaded.stamp
    for key in ("device", "driver", "torch", "cuda", "attention", "date", "host", "dtype"):
        assert stamp[key], key
    assert stamp["source"] == "calibrated" and stamp["dtype"] == "float32"
    assert stamp["measured"] == ["attention", "attention_decode", "collectives", "dispatch", "fsdp", "matmul",
                                 "memory", "overhead", "runtime"]
    assert check_stamp(loaded, current_stamp("cpu")) == []
    # every fit reports its held-out error, and the profile carries the measured numbers
    for kind in ("matmul", "attention", "attention_decode", "memory"):
        q = loaded.fit_quality[kind]
        assert q["n_held"] >= 1 and q["n_fit"] >= 3 and q["heldout_median_err"] >= 0
    assert loaded.hardware.peak_flops == pytest.approx(res.fits["matmul"].rate)
    assert loaded.matmul.peak_frac == pytest.approx(1.0)
    # the GEMMs carry their rows, so the row penalty is fitted with the curve (0 is a choice too)
    assert all(m.rows > 0 for m in res.measurements if m.kind == "matmul")
    assert loaded.gemm_rows_half == loaded.fit_quality["matmul"]["rows_half"] >= 0
    assert loaded.hardware.hbm_bw_bytes_s == pytest.approx(res.fits["memory"].rate)
    assert loaded.attention_decode is not None
    # a counted operator of a real eager forward costs at least a bare operator (the fit's
    # floor; whether it costs more is a noisy 8-second fit here, test_hostcost checks the fit)
    q = loaded.fit_quality["op_overhead"]
    assert loaded.op_overhead_s >= q["bare_op_s"] == q["floor_s"] > 0
    # the runtime's engine does work beyond the forward each iteration; its stage code beyond
    # the forwards (phase runtime): every host cost measured, each point of it recorded
    assert loaded.step_overhead_s == res.engine.step_overhead_s
    # per decode iteration at batch 16 and its cached tokens (the fit may put the cost on any of
    # its three terms: on a loaded host the per-token one alone has carried it)
    ctx = 16 * (16 + 12)
    assert loaded.step_overhead_s + 16 * loaded.step_seq_overhead_s + ctx * loaded.step_kv_token_s > 0
    for name, value in res.host.profile_fields().items():
        assert getattr(loaded, name) == value >= 0, name
    assert loaded.optimizer_step_s + 26 * loaded.optimizer_tensor_s > 0
    assert loaded.experience_fixed_s + loaded.experience_seq_s + loaded.experience_token_s > 0
    assert loaded.dispatch_fixed_s + loaded.dispatch_seq_s > 0
    assert loaded.handoff_fixed_s + loaded.handoff_seq_s + loaded.handoff_token_s > 0
    assert {"optimizer", "experience", "logprob", "train", "dispatch", "rollout", "handoff"} <= set(
        loaded.fit_quality["host_costs"]["points"])
    # the experience stage run again after a rollout of a model past the caches, once per case:
    # the factor is the median of the cases' cold / warm times (their ratios recorded as measured
    # / explained)
    cold = loaded.fit_quality["host_costs"]["points"]["experience_cold"]
    cold_rollouts = loaded.fit_quality["host_costs"]["points"]["rollout_cold"]
    assert len(cold_rollouts) == len(cold) and all(p["measured_s"] > 0 for p in cold_rollouts)
    assert cold_rollouts[0]["label"].startswith("tiny-cold 68 MiB")
    assert cold_rollouts[0]["label"].endswith(f"n={2 * hostcost.GROUP}")  # the cold worker's episodes
    assert hostcost.COLD_MODEL.num_params * 4 > max(64 << 20, loaded.host_cache_bytes)
    assert len(cold) == len(loaded.fit_quality["host_costs"]["points"]["handoff"])
    ratios = sorted(p["measured_s"] / p["explained_s"] for p in cold)
    assert loaded.host_cold_factor == pytest.approx(max(0.5, statistics.median(ratios)), abs=1e-3)
    assert loaded.host_cache_bytes >= 0
    assert loaded.elementwise is None or 0 < loaded.elementwise.peak_frac <= 1.5
    # the co-run slowdown: a quick calibration's five pairs, kept with the profile
    corun = loaded.fit_quality["corun"]
    assert len(corun["ratios"]) == (5 if corun["procs"] > 1 else 0)
    assert loaded.corun_slowdown == pytest.approx(corun["corun_slowdown"], abs=1e-4) and loaded.corun_slowdown >= 1
    # the host probe read between the one-process phases' cases, one reading per case
    probe = loaded.fit_quality["host_probe"]["by_phase"]
    assert set(probe) <= {"matmul", "attention", "memory", "overhead", "runtime"}
    assert sum(map(len, probe.values())) >= 10
    assert 0 < loaded.host_probe_s < 0.1
    # ... and on the gloo ranks of phases fsdp and dispatch, between their timed repeats, per
    # process count (a quick calibration runs 2 ranks only)
    assert set(loaded.host_probe_ranks_s) == {"2"} and 0 < loaded.host_probe_ranks_s["2"] < 0.1
    by = loaded.fit_quality["host_probe"]["ranks_by_phase"]
    assert set(by) == {"fsdp", "dispatch"} and all(0 < v["2"] < 0.1 for v in by.values())
    assert loaded.intra.alpha_s > 0 and loaded.intra.bw_bytes_s > 0
    # the dispatch path fitted from gloo runs of the runtime's dispatch executor
    assert loaded.fit_quality["dispatch_path"]["n"] >= 6 and not loaded.dispatch_path.full_duplex
    assert loaded.dispatch_path.message_s > 0 and loaded.dispatch_path.sample_s > 0
    assert loaded.link_for("allreduce") == res.link.ops["all_reduce"].link
    # the FSDP2 host costs fitted from the runtime's training step and weight sync on gloo ranks
    q = loaded.fit_quality["fsdp"]
    assert {p["kind"] for p in q["points"]} == {"train", "sync", "wake", "lead"}
    # a training step's start before its first collective: some time, at two tensor counts
    assert len({p["counts"]["train_lead_tensor_s"] for p in q["points"] if p["kind"] == "lead"}) >= 2
    assert loaded.train_lead_s + loaded.train_lead_tensor_s > 0 and min(loaded.train_lead_s,
                                                                         loaded.train_lead_tensor_s) >= 0
    # the staggered syncs' wake-up term: only where some ran more ranks than cores
    assert loaded.reshard_wake_s >= 0
    assert loaded.reshard_wake_s == 0.0 or any(p["procs"] > q["host_parallel"] for p in q["points"]
                                               if p["kind"] == "wake")
    assert loaded.fsdp_unit_s >= 0 and loaded.fsdp_tensor_s >= 0 and loaded.reshard_tensor_s >= 0
    # positive where the points leave time unexplained; both 0 only where they do not: then
    # 0 is the least-squares optimum (no count-weighted residual left above 0). On a loaded host
    # the points' share of a core (their stretch) can explain all of it
    train = [p for p in q["points"] if p["kind"] == "train"]
    pull = {f: sum(p["counts"][f] * (p["measured_s"] - p["priced_without_s"]) / p["stretch"] for p in train)
            for f in ("fsdp_unit_s", "fsdp_tensor_s")}
    assert loaded.fsdp_unit_s + loaded.fsdp_tensor_s > 0 or max(pull.values()) <= 1e-12, pull
    # the share of a core the probes got (earl.calibrate.hostload): the one-process phases', the
    # dispatch runs' beyond their own ranks, each FSDP2 point's; what validate stretches by
    assert 0 < loaded.host_share <= 1 and 0 < loaded.dispatch_path.host_share <= 1
    assert all(0 < p["share"] <= 1 for p in q["points"])
    # the cost model prices with it
    cm = CostModel(ModelSpec.from_name("tiny"), ClusterSpec.for_gpus(loaded.hardware, 2), loaded)
    est = cm.decode(ParallelPlan(tp=1, dp=2), batch=4, context=64)
    assert est.feasible and 0 < est.time_s < 1


def test_stamp_mismatch_warns(calibration, tmp_path):
    d = calibration.profile.to_dict()
    d["stamp"]["torch"] = "1.0.0"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    with pytest.warns(UserWarning, match="torch: profile has '1.0.0'"):
        assert check_stamp(load_profile(str(path)), current_stamp("cpu"))


def _cli(*args):
    return CliRunner().invoke(app, ["calibrate", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "tpu"], "unknown device 'tpu'; valid: cpu, cuda"),
    (["--budget-s", "2"], "--budget-s 2 is too small to fit anything on cpu; need at least 8 s"),
    (["--phases", "matmul,disk"], "unknown calibration phase 'disk'"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
    (["--out", "profile.txt"], "must name a .json file"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    r = _cli(*args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_cuda_without_a_gpu():
    r = _cli("--device", "cuda")
    assert r.exit_code == 2 and "device 'cuda' is not available here" in r.output


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("memory"), "is missing field 'memory'"),
    (lambda d: d.update(version=99), "profile version 99 is not supported"),
])
def test_cli_bad_base_profile(tmp_path, edit, message):
    d = load_profile("cpu").to_dict()
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    r = _cli("--base", str(path), "--out", str(tmp_path / "p.json"))
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "p.json").exists()


def test_shipped_cpu_profile_loads_by_name():
    prof = load_profile("cpu-measured")
    assert prof.stamp["source"] == "calibrated" and prof.hardware.name == "cpu"
    assert prof.fit_quality["matmul"]["heldout_median_err"] < 1.0


@pytest.mark.slow
def test_gpu_check_script_cpu_path(tmp_path):
    """The whole script on the CPU (~40 s): calibration, then validation with its profile."""
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "studies" / "gpu_check.sh")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    prof = load_profile(str(tmp_path / "profile-cpu.json"))
    assert prof.stamp["source"] == "calibrated"
    assert "memory" in prof.fit_quality and "links" not in prof.fit_quality
    points = json.loads((tmp_path / "measurements-cpu.json").read_text())["measurements"]
    assert {p["kind"] for p in points} == {"matmul", "attention", "attention_decode", "memory"}
    assert "fit quality" in (tmp_path / "calibrate.log").read_text()
    report = json.loads((tmp_path / "validate" / "validation.json").read_text())
    assert {r["stage"] for r in report["stages"]} >= {"rollout", "experience", "train"}
    assert len(report["variants"]) == 2 and (tmp_path / "validate" / "scatter.png").is_file()
    timings = (tmp_path / "timings.txt").read_text()
    assert all(f"{name}: " in timings for name in ("decode-compiled", "decode-eager", "calibrate", "validate"))


@pytest.mark.slow
def test_gpu_check_script_keeps_its_deadline(tmp_path):
    """A deadline shorter than the phases: each phase runs under the time left, the ones with
    under 10 s left are skipped (status 1), and the script ends near the deadline (~15 s)."""
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "DEADLINE_S": "14"}
    t0 = time.perf_counter()
    r = subprocess.run(["bash", str(REPO / "studies" / "gpu_check.sh")], env=env, capture_output=True,
                       text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in (tmp_path / "timings.txt").read_text().splitlines())
    first = lines["decode-compiled"]  # skipped too when a loaded host took > 4 s to import torch
    assert first.startswith("skipped") or int(first.split("limit ")[1].split(" s")[0]) <= 14, first
    assert lines["validate"].startswith("skipped") and lines["calibrate"].startswith("skipped")
    assert wall < 14 + 10 + 15  # the deadline, timeout's kill grace, interpreter start-ups


def test_a_phase_subset_keeps_what_the_base_measured(calibrated_profile):
    """`--phases memory --base PROFILE`: the memory curve is measured anew and everything else a
    calibrated base holds (the runtime's host costs, the forward overhead, the dispatch path,
    the FSDP2 constants) is the base's. It used to be rebuilt from nothing, so re-running one
    phase zeroed the others' constants."""
    base = load_profile(calibrated_profile)
    marked = dataclasses.replace(base, experience_seq_s=1.25e-4, reshard_tensor_s=7.5e-4, op_overhead_s=3.5e-5,
                                 dispatch_path=dataclasses.replace(base.dispatch_path, round_s=6e-4),
                                 stamp={**base.stamp, "measured": sorted({*base.stamp["measured"], "overhead"})})
    path = marked.save(Path(calibrated_profile).with_name("marked.json"))
    got = run_calibration(device="cpu", budget_s=8.0, phases=("memory",), base=str(path)).profile
    assert (got.experience_seq_s, got.reshard_tensor_s, got.op_overhead_s) == (1.25e-4, 7.5e-4, 3.5e-5)
    assert got.dispatch_path == marked.dispatch_path and got.matmul == marked.matmul
    assert got.stamp["measured"] == ["memory"] and got.gemm_norm is None
