"""`--jobs ray` for real: `earl simulate --compare` and `earl study` as Ray tasks write what the
serial run writes, file by file (wall-clock columns aside). Skipped only where ray is not
installed; one local Ray instance (2 CPUs) serves the whole module, and the study scripts, which
run in their own processes, join it through RAY_ADDRESS.

    pip install 'earl[ray]' && python -m pytest -m ray tests/sim/test_ray_jobs.py -q   # all, s5 too
    python -m pytest tests/sim/test_ray_jobs.py -q                                      # not slow
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from earl.cli import app

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

TINY = ["--steps", "2", "--set", "workload.episodes_per_step=16"]
# what a run measures of the machine (its wall and CPU time), the one thing the serial and the Ray
# run may differ in: the simulator's summary and the study CSVs' "sim wall s"
WALL = {"wall_s", "cpu_s", "events_per_wall_s", "simulated_tokens_per_wall_s", "sim wall s"}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RAY_ADDRESS", raising=False)  # a fresh local instance, not one this shell points at
        ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        mp.setenv("RAY_ADDRESS", ctx.address_info["address"])  # study processes join this instance
        yield ctx
    ray.shutdown()


def invoke(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def without_wall(value):
    """`value` (parsed JSON) without its measured-time fields."""
    if isinstance(value, dict):
        return {k: without_wall(v) for k, v in value.items() if k not in WALL}
    if isinstance(value, list):
        return [without_wall(v) for v in value]
    return value


def csv_rows(path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in WALL} for row in csv.DictReader(io.StringIO(path.read_text()))]


def test_simulate_compare_jobs_ray_equals_serial(tmp_path):
    base = ["simulate", "connect-four-small", "--compare", "--no-plots", *TINY]
    invoke(*base, "--jobs", "1", "--out", str(tmp_path / "serial"))
    invoke(*base, "--jobs", "ray", "--out", str(tmp_path / "ray"))
    serial, par = tmp_path / "serial", tmp_path / "ray"
    names = sorted(p.name for p in serial.iterdir())
    assert names == sorted(p.name for p in par.iterdir())
    assert {"metrics.csv", "summary.json", "decisions.jsonl", "trace.json"} <= set(names)
    assert (par / "metrics.csv").read_text() == (serial / "metrics.csv").read_text()
    assert (par / "decisions.jsonl").read_text() == (serial / "decisions.jsonl").read_text()
    for name in names:
        if name.startswith("trace"):
            assert (par / name).read_text() == (serial / name).read_text(), name
    one, two = (without_wall(json.loads((d / "summary.json").read_text())) for d in (serial, par))
    assert len(one["policies"]) == 4 and one == two


def test_simulate_jobs_ray_returns_the_serial_results():
    from earl.sim.run import simulate
    from earl.sim.scenario import load_scenario

    sc = load_scenario("connect-four-small", {"workload.episodes_per_step": "16", "scenario.steps": "2"})
    serial = simulate(sc, compare=True, jobs=1)
    finished = []
    par = simulate(sc, compare=True, jobs="ray", done=lambda res: finished.append(res.label))
    assert [r.label for r in par] == [r.label for r in serial]
    assert sorted(finished) == sorted(r.label for r in serial)
    for a, b in zip(serial, par, strict=True):
        assert a.rows == b.rows and a.decisions == b.decisions and a.spans == b.spans and a.events == b.events
        assert without_wall(a.summary) == without_wall(b.summary)


# s5 runs `simulate --compare` (covered above) on more steps: ~40 s on 2 idle cores, so `slow`
@pytest.mark.parametrize("study, stem", [("s9", "s9_async"),
                                         pytest.param("s5", "s5_end_to_end", marks=pytest.mark.slow)])
def test_study_jobs_ray_equals_serial(tmp_path, study, stem):
    invoke("study", study, "--quick", "--jobs", "1", "--out", str(tmp_path / "serial"))
    invoke("study", study, "--quick", "--jobs", "ray", "--out", str(tmp_path / "ray"))
    csvs = sorted(p.name for p in (tmp_path / "serial").glob("*.csv"))
    assert f"{stem}.csv" in csvs and csvs == sorted(p.name for p in (tmp_path / "ray").glob("*.csv"))
    for name in csvs:
        one, two = csv_rows(tmp_path / "serial" / name), csv_rows(tmp_path / "ray" / name)
        assert len(one) > 0 and one == two, name


def test_studies_side_by_side_as_ray_tasks_write_where_asked(tmp_path, monkeypatch):
    """`earl study all --jobs ray` runs each study as a Ray task. A task runs in its worker's
    folder (where the Ray instance started), so a relative --out must mean this process's folder."""
    from earl import studies

    quick = {k: v for k, v in studies.study_scripts().items() if k in ("s4_dispatch_latency", "s9_async")}
    monkeypatch.setattr(studies, "study_scripts", lambda: quick)
    monkeypatch.chdir(tmp_path)  # not where the Ray instance started
    lines = []
    assert studies.run_studies("all", out="rel", quick=True, jobs="ray", echo=lines.append) == []
    assert sorted(p.name for p in (tmp_path / "rel").glob("*.csv")) == [
        "s4_dispatch_latency.csv", "s9_async.csv", "s9_async_measured.csv", "s9_async_steps.csv"]
    assert len(lines) == 2 and all("--jobs 1" in line for line in lines)
