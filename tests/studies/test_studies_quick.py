"""Every study runs in quick mode (few points) and writes a sane CSV and a PNG, so none rots.

    pytest tests/studies -q
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

STUDIES = Path(__file__).resolve().parents[2] / "studies"
NAMES = sorted((p.stem for p in STUDIES.glob("s[0-9]*_*.py")), key=lambda n: int(n[1:].split("_")[0]))


@pytest.fixture(scope="module", autouse=True)
def studies_on_path():
    sys.path.insert(0, str(STUDIES))
    yield
    sys.path.remove(str(STUDIES))


def run_quick(name: str, out: Path) -> pd.DataFrame:
    mod = importlib.import_module(name)
    df = mod.run(out, quick=True)
    csv = out / f"{name}.csv"
    png = out / f"{name}.png"
    assert csv.is_file() and png.is_file()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    back = pd.read_csv(csv)
    assert len(back) == len(df) > 0
    assert not any(p.name.startswith(".") for p in out.iterdir()), "temp files left behind"
    return back


def test_every_study_is_tested():
    assert NAMES == ["s1_context_growth", "s2_data_volume", "s3_decode_tp", "s4_dispatch_latency",
                     "s5_end_to_end", "s6_train_plans", "s7_scale", "s8_sensitivity", "s9_async",
                     "s10_fidelity"]


def test_s1_context_growth(tmp_path):
    df = run_quick("s1_context_growth", tmp_path)
    assert (df["episode ctx max"] <= 32768).all()
    assert (df["episode ctx mean"] <= df["episode ctx p95"]).all()
    assert (df["turn ctx mean"] < df["episode ctx mean"]).all()
    assert df["episode ctx mean"].iloc[-1] > 2 * df["episode ctx mean"].iloc[0]  # the context grows
    assert df["truncated %"].between(0, 100).all()


def test_s2_data_volume(tmp_path):
    df = run_quick("s2_data_volume", tmp_path)
    # bytes scale with context; centralized is slower than layout-aware; TCP no faster than RDMA
    assert df["payload GiB"].iloc[-1] / df["payload GiB"].iloc[0] == pytest.approx(32, rel=0.01)
    assert (df["centralized TCP s"] > df["layout-aware TCP s"]).all()
    assert (df["centralized TCP s"] >= df["centralized RDMA s"]).all()
    assert (df["layout-aware TCP s"] > df["layout-aware RDMA s"]).all()
    # the object-store controller moves every byte it handles at no more than 0.8 GB/s
    through = df["centralized controller GiB"] * 2**30 / 0.8e9
    assert (df["centralized TCP object-store s"] >= through * (1 - 1e-5)).all()  # CSV keeps 6 digits
    assert (df["centralized TCP object-store s"] > df["centralized TCP s"]).all()


def test_s3_decode_tp(tmp_path):
    df = run_quick("s3_decode_tp", tmp_path)
    short = df[(df["context"] == 1024) & (df["responses"] == 8)].iloc[0]
    long = df[(df["context"] == 32768) & (df["responses"] == 128)].iloc[0]
    assert short["tp4 status"] == "fits" and long["tp4 status"] == "preempting"
    assert short["speedup tp8/tp4"] < 1 < long["speedup tp8/tp4"]
    # EARL Fig. 3 (as read): TP4 ahead by 20-32% at 1K x 8; the model within 8 pp there
    assert short["paper gain % (reading)"] == -30
    assert abs(short["model gain %"] - short["paper gain % (reading)"]) <= 8
    assert long["paper gain % (reading)"] != long["paper gain % (reading)"]  # NaN: TP4 out of memory in the paper


def test_s3_full_grid_against_fig3_reading(tmp_path):
    """Issue #24's goal on the whole 30-cell grid: < 8 pp mean absolute error against the reading
    of EARL Fig. 3 (29 cells; TP4 out of memory in the paper in the 30th), 27 signs of 29."""
    df = importlib.import_module("s3_decode_tp").run(tmp_path)
    both = df.dropna(subset=["paper gain % (reading)"])
    assert len(df) == 30 and len(both) == 29
    assert both["error pp"].abs().mean() < 8
    assert ((both["model gain %"] > 0) == (both["paper gain % (reading)"] > 0)).sum() >= 27
    # TP4's lead where both fit stays in the paper's 20-32% at 1-4K x 8-64; TP4 preempts deep at 32K
    fit = both[(both["context"] <= 4096) & (both["responses"] <= 64)]
    assert fit["model gain %"].between(-32, -20).all()
    assert (df[df["context"] == 32768]["tp4 recomputed tokens"].iloc[1:] > 0).all()


def test_s4_dispatch_latency(tmp_path):
    df = run_quick("s4_dispatch_latency", tmp_path)
    assert set(df["network"]) == {"TCP", "RDMA"}
    assert (df["speedup"] > 1).all()
    parts = df["gather s"] + df["scatter s"] + df["controller advantages s"]
    assert ((parts - df["centralized s"]).abs() <= 1e-3 * df["centralized s"]).all()  # + metadata, planning
    assert (df["centralized object-store s"] > df["centralized s"]).all()
    tcp = df[df["network"] == "TCP"]
    assert ((tcp["speedup"] / tcp["paper speedup"] - 1).abs() <= 0.30).all()  # the paper's Fig. 4


def test_s5_end_to_end(tmp_path):
    df = run_quick("s5_end_to_end", tmp_path)
    assert len(df) == 12  # 2 starts x 3 selectors x 2 dispatchers
    assert (df["throughput tok/s/GPU"] > 0).all()
    assert (df["OOM events"] >= 0).all()
    static = df[df["selector"] == "static"]
    assert (static["plan switches"] == 0).all() and (static["total reshard s"] == 0).all()
    assert (tmp_path / "s5_end_to_end_steps.csv").is_file()
    # the stacked parts (OOM restarts included) account for the whole simulated run
    parts = df[[c for c in df.columns if c.startswith("total ") and c.endswith(" s")]].sum(axis=1)
    steps = len(pd.read_csv(tmp_path / "s5_end_to_end_steps.csv")) / len(df)
    assert ((parts - df["step time mean s"] * steps).abs() <= 1e-3 * parts).all()


def test_s6_train_plans(tmp_path):
    df = run_quick("s6_train_plans", tmp_path)
    assert (df["best tok/s/GPU"] > 0).all()
    assert (df["best MFU"].between(0.05, 0.9)).all()
    assert df["gain vs tuned for longest"].iloc[0] >= 1.0


def test_s7_scale(tmp_path):
    df = run_quick("s7_scale", tmp_path)
    assert list(df["gpus"]) == [128, 1024]
    # weak scaling: centralized dispatch grows with the cluster (every byte through one controller),
    # layout-aware stays in milliseconds; the two scales may pick training plans with different
    # tp (copies per sample), so compare growth rather than assume identical layouts
    c = df["dispatch centralized s"]
    la = df["dispatch layout-aware s"]
    assert c.iloc[1] > 5 * c.iloc[0]
    assert la.iloc[1] / la.iloc[0] < 0.25 * c.iloc[1] / c.iloc[0]
    assert (la < 0.05).all()
    assert (df["dispatch centralized object-store s"] > df["dispatch centralized s"]).all()


def test_s8_sensitivity(tmp_path):
    df = run_quick("s8_sensitivity", tmp_path)
    assert list(df["variant"])[:3] == ["baseline", "all curves x0.8", "all curves x1.2"]
    assumed = {"TCP incast 1.0 (none)", "controller object-store", "OOM restart 0 s", "DP overlap off"}
    assert assumed <= set(df["variant"])
    curves = df[df["variant"].str.startswith(("baseline", "all curves"))]
    assert curves["s4 layout-aware speedup, 32K TCP"].nunique() == 1  # dispatch does not depend on compute
    by = df.set_index("variant")
    # the assumptions the dispatch headline rests on move it; the object store multiplies it
    assert by.loc["controller object-store", "s4 layout-aware speedup, 32K TCP"] > 10 * by.loc[
        "baseline", "s4 layout-aware speedup, 32K TCP"]
    assert by.loc["TCP incast 1.0 (none)", "s4 |error vs paper 11.2x| (%)"] > 30
    # the Megatron rows' assumed constants: the baseline within 15% at 96 and 4,608 GPUs, and
    # not without TP overlap or without interleaving (the conclusion rests on them)
    mega = pd.read_csv(tmp_path / "s8_sensitivity_megatron.csv")
    assert len(mega) == 4 and mega["baseline"].sum() == 1
    assert mega[mega["baseline"]]["within 15% at both"].all()
    assert not mega[(mega["TP overlap"] == 0) | (mega["virtual stages"] == 1)]["within 15% at both"].any()


def test_cli_study_list_and_unknown():
    out = subprocess.run([sys.executable, "-m", "earl.cli", "study", "--list"], capture_output=True, text=True)
    assert out.returncode == 0 and "s2_data_volume" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "earl.cli", "study", "s99"], capture_output=True, text=True)
    assert bad.returncode == 2 and "valid: s1_context_growth" in bad.stderr


def test_cli_study_runs_one(tmp_path):
    out = subprocess.run([sys.executable, "-m", "earl.cli", "study", "s4", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "s4_dispatch_latency.csv").is_file()


def test_s10_fidelity(tmp_path):
    df = run_quick("s10_fidelity", tmp_path)
    earl = df[df["reference"].str.startswith("EARL")]
    assert len(earl) == 1 and (earl["error"].abs() <= 0.30).all()  # the paper's Fig. 4 at 32K
    mega = df[df["reference"].str.startswith("Megatron")]
    assert (mega["predicted"].between(0.2, 0.8)).all() and (mega["published"] == 0.47).all()
    # the published plan (tp4 pp8, distributed optimizer) within 15% with Megatron's TP overlap
    pub = mega[mega["quantity"].str.contains("published plan, TP overlap")]
    assert len(pub) == 1 and (pub["error"].abs() <= 0.15).all()
    assert pub["setting"].str.contains("tp8-pp6-dp2-mb1-v4-zero").all()  # the README's model table plan
    kern = df[df["reference"].str.startswith("Vidur")]
    assert len(kern) == 2 and (kern["unit"] == "us").all() and (kern["error"].abs() <= 0.25).all()
    table = pd.read_csv(tmp_path / "s10_fidelity_kernels.csv")
    assert len(table) == 384 and table["error"].abs().median() <= 0.05


def test_megatron_published_plan_at_both_scales():
    """Issue #24: MFU on Megatron's published GPT-3 175B plan (tp8 pp6, DP = GPUs / 48, batch
    1,152) within 15% of the README's 47% / 42% at 96 / 4,608 H100, and of the model table's 44%
    at 2,304, with the assumed TP overlap 0.5 and 4 virtual stages."""
    s10 = importlib.import_module("s10_fidelity")
    for gpus, paper in {**s10.MEGATRON_MFU, **s10.MEGATRON_TABLE_MFU}.items():
        plan, est = s10.megatron_published(gpus)
        assert (plan.tp, plan.pp, plan.dp, plan.virtual_stages) == (8, 6, gpus // 48, 4)
        assert abs(est.mfu / paper - 1) <= 0.15, (gpus, est.mfu)
    # MFU falls with scale, as measured (more pipeline bubble per step: 12 micro-batches per pipeline)
    assert s10.megatron_published(4608)[1].mfu < s10.megatron_published(96)[1].mfu


def test_s9_async(tmp_path):
    df = run_quick("s9_async", tmp_path)
    assert df["variant"].iloc[0] == "sync colocated" and df["vs sync"].iloc[0] == 1
    a = df[df["mode"] == "async"]
    assert (a["staleness max"] <= a["max staleness"]).all()
    assert (a[a["max staleness"] == 0]["staleness mean"] == 0).all()
    assert (a["rollout GPUs"] < 128).all() and (a["rollout GPUs"] > 0).all()
    # the training pool is smaller than the cluster: less memory headroom than colocated
    assert (a["min headroom train %"] < df["min headroom train %"].iloc[0]).all()


def test_earl_study_jobs_runs_studies_side_by_side(tmp_path):
    from typer.testing import CliRunner

    from earl.cli import app

    res = CliRunner().invoke(app, ["study", "s9", "--quick", "--jobs", "2", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s9_async.csv").is_file()
    bad = CliRunner().invoke(app, ["study", "s9", "--jobs", "nope"])
    assert bad.exit_code == 2 and "positive integer" in bad.output
