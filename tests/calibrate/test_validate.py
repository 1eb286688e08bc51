"""`earl validate` on the CPU: the runtime and the simulator on the same config and trace.

    pytest tests/calibrate/test_validate.py
"""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from earl.calibrate.host import local_cluster
from earl.calibrate.overhead import ForwardPoint, fit_overhead
from earl.calibrate.validate import (
    COLLECTIVE_SPANS,
    EXPERIENCE_SPANS,
    NPROCS,
    RUNTIME_REWARDS,
    RUNTIME_TURNS,
    STAGES,
    advantage_spec,
    check_nproc,
    compute_shares,
    host_stretch,
    hostload_share,
    initial_run_plans,
    kendall_tau,
    level_fitted_err,
    logprob_passes,
    measured_stages,
    parse_variants,
    plan_mismatches,
    recorded_reductions,
    rescore_validation,
    reshard_on_host,
    run_plans,
    run_validation,
    runtime_reductions,
    sync_leads,
    sync_stretch,
)
from earl.cli import app
from earl.cost_model import CostModel
from earl.cost_model.profile import load_profile
from earl.runtime.hf_model import hf_config_from_spec
from earl.runtime.resolve import resolve_config
from earl.runtime.run_config import TrainerConfig
from earl.specs import MODEL_CATALOG, ClusterSpec, ParallelPlan
from earl.trace import Span

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
    # one scored step: a fitted level predicts it exactly
    assert all(r["spread_err"] == pytest.approx(0.0, abs=1e-9) for r in res.table)
    assert res.kendall_tau in (-1.0, 1.0)  # two variants: same or opposite order
    report = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert report["stages"] == res.table and report["profile"] == calibrated_profile
    assert (tmp_path / "v" / "scatter.png").stat().st_size > 1000
    assert (tmp_path / "v" / "validation.csv").read_text().startswith("variant,step,stage")

    # --rescore: the recorded runs priced again, nothing run. Same profile: the same report;
    # the datasheet: the same measurements, other predictions; the source folder untouched
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "v").rglob("*") if p.is_file()}
    same = rescore_validation(source=tmp_path / "v", profile=calibrated_profile, out_dir=tmp_path / "again")
    assert same.table == res.table and [v.predicted for v in same.variants] == [v.predicted for v in res.variants]
    # the host probe: every scored step read it; validate records the run's speed over the
    # calibration's and does not scale the predictions by it (docs/validate-history.md, twelfth session)
    assert all(v.host_probe_s and not v.host_speed_applied for v in res.variants)
    slow = json.loads(open(calibrated_profile).read())
    assert slow["host_probe_s"] > 0
    slow["host_probe_s"] *= 2
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    halved = rescore_validation(source=tmp_path / "v", profile=str(tmp_path / "slow.json"), out_dir=tmp_path / "slow")
    assert [v.predicted for v in halved.variants] == [v.predicted for v in res.variants]
    assert [v.host_speed for v in halved.variants] == pytest.approx([v.host_speed / 2 for v in res.variants])
    other = rescore_validation(source=tmp_path / "v", profile="cpu", out_dir=tmp_path / "sheet")
    assert [v.measured for v in other.variants] == [v.measured for v in res.variants]
    assert [v.predicted for v in other.variants] != [v.predicted for v in res.variants]
    assert json.loads((tmp_path / "sheet" / "validation.json").read_text())["profile"] == "cpu"
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "v").rglob("*") if p.is_file()} == before
    r = _cli("--rescore", str(tmp_path / "v"), "--out", str(tmp_path / "cli"))
    assert r.exit_code == 0, r.output
    assert "level fitted" in r.output and (tmp_path / "cli" / "validation.json").is_file()
    # a checkpoint model whose recorded path is gone: the report folder's own model/ is priced
    # (validate --model NAME writes it there; the folder may have been moved or committed)
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "v", moved)
    hf_config_from_spec(MODEL_CATALOG["tiny"], "fp32").save_pretrained(moved / "model")
    for run in (moved / "runs").iterdir():
        saved = json.loads((run / "config.json").read_text())
        saved["model"]["path"] = str(tmp_path / "gone")
        (run / "config.json").write_text(json.dumps(saved))
    again = rescore_validation(source=moved, profile=calibrated_profile, out_dir=tmp_path / "moved-out")
    assert [v.measured for v in again.variants] == [v.measured for v in res.variants]
    shutil.rmtree(moved / "model")
    with pytest.raises(ValueError, match="gone has no config.json any more"):
        rescore_validation(source=moved, profile=calibrated_profile, out_dir=tmp_path / "moved-out2")
    assert not (tmp_path / "moved-out2").exists()


def test_level_fitted_error_is_the_spread_a_rescaled_prediction_leaves():
    # a prediction right in shape, wrong in level: nothing left once the level is fitted
    assert level_fitted_err([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0)
    # a flat prediction of bimodal steps (half at 1, half at 3): the best level still misses
    # one mode; it can never beat the plain median error
    meas, pred = [1.0, 1.0, 3.0, 3.0, 1.0, 3.0], [2.0] * 6
    fitted = level_fitted_err(pred, meas)
    assert 0.3 < fitted <= float(np.median([abs(p / m - 1) for p, m in zip(pred, meas, strict=True)]))
    # by brute force over levels
    best = min(np.median([abs(c * p / m - 1) for p, m in zip(pred, meas, strict=True)])
               for c in np.geomspace(0.1, 10, 20001))
    assert fitted == pytest.approx(best, abs=1e-3)
    assert level_fitted_err([], []) == 0.0


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


def test_rescore_bad_input_is_one_line_and_writes_nothing(tmp_path):
    r = _cli("--rescore", str(tmp_path / "nowhere"), "--out", str(tmp_path / "v"))
    assert r.exit_code == 2 and "no validation.json there" in r.output and len(r.output.strip().splitlines()) == 1
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "validation.json").write_text("[1, 2]")
    r = _cli("--rescore", str(tmp_path / "junk"), "--out", str(tmp_path / "v"))
    assert r.exit_code == 2 and "is not an earl validate report" in r.output
    (tmp_path / "junk" / "validation.json").write_text(json.dumps({"nproc": 1, "variants": [{"name": "a"}]}))
    r = _cli("--rescore", str(tmp_path / "junk"), "--out", str(tmp_path / "v"))
    assert r.exit_code == 2 and "is not an earl validate report (KeyError('overrides'))" in r.output
    report = {"nproc": 1, "variants": [{"name": "base", "overrides": {}, "run_dir": "x", "measured": []}]}
    (tmp_path / "junk" / "validation.json").write_text(json.dumps(report))
    r = _cli("--rescore", str(tmp_path / "junk"), "--out", str(tmp_path / "v"))
    assert r.exit_code == 2 and "lacks config.json, metrics.jsonl, trace.json, workload.jsonl" in r.output
    r = _cli("--rescore", str(tmp_path / "junk"), "--out", str(tmp_path / "v"), "--nproc", "2", "--steps", "5")
    assert r.exit_code == 2 and "--steps, --nproc does not apply (valid with it: --hardware, --out)" in r.output
    assert not (tmp_path / "v").exists()


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


# ---- the multi-process runtime (--nproc) ---------------------------------------------------------
def test_validation_cluster_is_the_jobs_own_node():
    prof = load_profile("cpu-measured")  # gpus_per_node 2: for_gpus would cut 4 devices into 2 nodes
    assert prof.hardware.gpus_per_node == 2
    for n in NPROCS:
        c = local_cluster(prof, n)
        assert (c.nodes, c.gpus_per_node, c.num_gpus, c.network.name) == (1, n, n, "loopback")
    with pytest.raises(ValueError, match="not a whole number"):
        ClusterSpec.for_gpus(prof.hardware, 3)
    assert host_stretch(prof, 4, "cpu") == 2.0 and host_stretch(prof, 2, "cpu") == 1.0
    assert host_stretch(prof, 4, "cuda") == 1.0


@pytest.mark.parametrize("bad", [0, 3, 8, -1, "2", 2.0, True])
def test_check_nproc_names_the_value_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"--nproc .* is not validated; valid: 1, 2, 4"):
        check_nproc(bad)
    assert [check_nproc(n) for n in NPROCS] == list(NPROCS)


def test_run_plans_and_plan_mismatches():
    rows = [{"plan_rollout": "tp1-dp2", "plan_experience": "tp1-dp2-zero", "plan_train": "tp1-dp2-zero"},
            {"plan_rollout": "tp1-dp2", "plan_experience": "tp1-dp2-zero", "plan_train": "tp2-dp1"}]
    plans = run_plans(rows)
    assert plans[1]["train"] == ParallelPlan(tp=2, dp=1) and plans[0]["experience"].sharded_optimizer
    cfg = resolve_config(None, overrides=SMALL)
    assert {k: p.describe() for k, p in initial_run_plans(cfg, 2).items()} == \
        {k: p.describe() for k, p in plans[0].items()}  # the runtime's defaults for 2 processes
    # the simulator's micro-batch (token-budget packing) is not a different plan
    sim = [{"plan_rollout": "tp1-dp2", "plan_experience": "tp1-dp2-mb4-zero", "plan_train": "tp1-dp2-mb4-zero"}] * 2
    assert plan_mismatches(plans, sim) == \
        ["step 2 train: runtime tp2-dp1-mb1, simulator tp1-dp2-mb4-zero"]


def test_measured_stage_slowest_rank_or_last_to_arrive_for_moves():
    spans = [Span(name="a", stage="train", rank=0, t_start=0, t_end=1, step=1),
             Span(name="b", stage="train", rank=0, t_start=1, t_end=3, step=1),  # rank 0: 3 s
             Span(name="a", stage="train", rank=1, t_start=0, t_end=2.5, step=1),
             Span(name="s", stage="reshard", rank=1, t_start=0, t_end=0.5, step=1),
             Span(name="s", stage="reshard", rank=0, t_start=0, t_end=0.75, step=1),  # waited longer
             Span(name="s", stage="select", rank=1, t_start=0, t_end=9, step=1),  # not a scored stage
             Span(name="d", stage="dispatch", rank=1, t_start=0, t_end=0.25, step=2)]
    # the hand-off is a move (it starts with a barrier) the dispatch path prices: from its last
    # rank's arrival (rank 1, at 0.5) to its last rank's end (rank 0, 1.25); then each rank's
    # own log-prob work, the slowest
    spans += [Span(name="handoff", stage="experience", rank=0, t_start=0, t_end=1.25, step=2),  # waited
              Span(name="handoff", stage="experience", rank=1, t_start=0.5, t_end=1.0, step=2),
              Span(name="logprob", stage="experience", rank=0, t_start=2, t_end=2.5, step=2),
              Span(name="logprob", stage="experience", rank=1, t_start=2, t_end=3, step=2)]
    got = measured_stages(spans, [1, 2])
    assert got[0] == {"rollout": 0.0, "experience": 0.0, "dispatch": 0.0, "train": 3.0, "reshard": 0.5}
    assert got[1]["dispatch"] == 0.25 and got[1]["train"] == 0.0
    assert got[1]["experience"] == 0.75 + 1.0
    # a hand-off that waited for no one (onto the aligned layout: `waits` false) is the rank's
    # own work, like its log-prob span: the last rank to start the stage (rank 1, at 0.5), its sum
    for sp in spans[-4:-2]:
        sp.args["waits"] = False
    assert measured_stages(spans, [1, 2])[1]["experience"] == 0.5 + 1.0


def test_measured_experience_is_the_last_arrivals_own_work_and_any_earlier_ranks_overrun():
    """The experience stage's own work is read as the step's critical path: an early rank's
    spans, stretched while the last rank still woke from the metadata all-gather, end before the
    last arrival's and do not delay the step past its own work; one that ends after it adds the
    difference."""
    def exp(rank, t0, t1, t2, t3, step=5):
        return [Span(name="handoff", stage="experience", rank=rank, t_start=t0, t_end=t1, step=step,
                     args={"waits": False}),
                Span(name="logprob", stage="experience", rank=rank, t_start=t2, t_end=t3, step=step)]
    early = exp(0, 0.0, 1.0, 1.0, 4.0)  # 4 s: waited for a core held by the peers
    spans = early + exp(1, 5.0, 5.75, 6.0, 6.25)  # the last to arrive: 1 s of its own
    assert measured_stages(spans, [5])[0]["experience"] == 1.0
    # the early rank runs on 0.5 s past the last arrival's end: the step waited for it
    late = exp(0, 0.0, 1.0, 5.5, 6.75) + exp(1, 5.0, 5.75, 6.0, 6.25)
    assert measured_stages(late, [5])[0]["experience"] == 1.0 + 0.5
    # one rank: its own sum, gaps between its spans left out
    assert measured_stages(exp(0, 0.0, 1.0, 2.0, 2.5), [5])[0]["experience"] == 1.5


def test_measured_dispatch_from_the_last_arrival_to_the_last_end_each_move_apart():
    """A dispatch is read as `earl calibrate` times the executor (the slowest rank from a common
    start): the last rank's arrival to the last rank's end, not the shortest span (the last
    arrival's own end); a retried dispatch (the rank's second span in the step) adds its own."""
    spans = [Span(name="d", stage="dispatch", rank=0, t_start=0.0, t_end=1.0, step=3),  # waited 0.5
             Span(name="d", stage="dispatch", rank=1, t_start=0.5, t_end=0.875, step=3),
             Span(name="d", stage="dispatch", rank=1, t_start=2.0, t_end=2.5, step=3),  # the retry
             Span(name="d", stage="dispatch", rank=0, t_start=2.25, t_end=2.5, step=3)]
    assert measured_stages(spans, [3])[0]["dispatch"] == (1.0 - 0.5) + (2.5 - 2.25)
    # a dispatch of local copies with nothing to reduce (`waits` false) waited for no peer: each
    # rank's own work, the slowest rank's
    local = [Span(name="d", stage="dispatch", rank=0, t_start=0.0, t_end=0.25, step=4, args={"waits": False}),
             Span(name="d", stage="dispatch", rank=1, t_start=1.0, t_end=1.375, step=4, args={"waits": False})]
    assert measured_stages(local, [4])[0]["dispatch"] == 0.375


def test_measured_weight_sync_from_the_last_arrival_to_the_first_end():
    """The weight sync is read as `earl calibrate` times it (its fastest rank after a barrier):
    from the last rank's arrival to the first rank's end. The last arrival's own span (0.5 s
    here) holds the time after the first rank left for its rollout."""
    spans = [Span(name="train_to_rollout", stage="reshard", rank=0, t_start=0.0, t_end=0.625, step=4),
             Span(name="train_to_rollout", stage="reshard", rank=1, t_start=0.25, t_end=0.75, step=4),
             Span(name="train_to_rollout", stage="reshard", rank=2, t_start=0.125, t_end=0.875, step=4)]
    assert measured_stages(spans, [4])[0]["reshard"] == 0.625 - 0.25
    assert sync_leads(spans, [4, 5]) == [[0.25, 0.0, 0.125], []]


def test_sync_stretch_counts_the_ranks_still_computing_when_the_last_arrives():
    """4 ranks on 2 cores: ranks that reached the sync more than its work before the last one
    sleep in their receives, so a short sync pays no oversubscription and a long one all of it."""
    prof = dataclasses.replace(load_profile("cpu-measured"), host_share=1.0, reshard_busy=0.75)
    prof = dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, host_parallel=2))
    leads = [0.010, 0.006, 0.003, 0.0]
    # rank 0's share in the step 0.5 (4 ranks on 2 cores, no other load)
    assert sync_stretch(prof, 4, "cpu", 0.5, leads, 0.002) == 1.0  # only the last rank computes
    assert sync_stretch(prof, 4, "cpu", 0.5, leads, 0.004) == 1.0  # two ranks: one core each
    # three ranks (the 0.010 s one long done) on 2 cores: 3/2 x the overlap of their waits
    assert sync_stretch(prof, 4, "cpu", 0.5, leads, 0.008) == pytest.approx(1.5 * 0.75)
    assert sync_stretch(prof, 4, "cpu", 0.5, leads, 1.0) == pytest.approx(2.0 * 0.75)  # all four
    assert sync_stretch(prof, 4, "cpu", 0.5, [], 0.002) == pytest.approx(2.0 * 0.75)  # no trace: all
    # other tenants' load stays: rank 0 got 0.4 of a core where 0.5 was its due
    assert sync_stretch(prof, 4, "cpu", 0.4, leads, 0.002) == pytest.approx(1 / 0.8)
    assert sync_stretch(prof, 4, "cuda", 0.5, leads, 0.002) == 1.0


def test_the_syncs_wake_up_wait_is_added_as_priced_and_the_rest_stretched():
    """A step's re-shard stage on a host where 4 ranks share 2 cores: the re-shards and the
    sync's work stretched over the ranks still computing it, its wake-up term (a wait on the
    scheduler, CostModel.sync_wake_s) added as priced; a row from before the term: as before."""
    prof = dataclasses.replace(load_profile("cpu-measured"), host_share=1.0, reshard_busy=0.75)
    prof = dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, host_parallel=2))
    row = {"reshard_s": 0.001, "sync_s": 0.0095, "sync_wake_s": 0.0015}
    leads = [0.010, 0.006, 0.003, 0.0]  # the sync's work (8 ms) outlasts three ranks' leads
    k = sync_stretch(prof, 4, "cpu", 0.5, leads, 0.008)
    assert k == pytest.approx(1.5 * 0.75)
    assert reshard_on_host(row, prof, 4, "cpu", 0.5, leads) == pytest.approx(0.009 * k + 0.0015)
    before = {"reshard_s": 0.001, "sync_s": 0.008}
    assert reshard_on_host(before, prof, 4, "cpu", 0.5, leads) == pytest.approx(0.009 * k)
    assert reshard_on_host(row, prof, 4, "cuda", 0.5, leads) == pytest.approx(0.0105)


def test_token_budget_packing_per_data_parallel_group():
    from earl.cost_model import CostModel

    prof = load_profile("cpu-measured")
    cm = CostModel(MODEL_CATALOG["tiny"], local_cluster(prof, 2), prof)
    share = [20, 30, 41, 41]
    one = cm.mixed_batch("logprob", ParallelPlan(dp=1), share, padded=True, token_budget=128)
    two = cm.mixed_batch("logprob", ParallelPlan(dp=2), share * 2, padded=True, token_budget=128,
                         groups=[share, share])
    assert two.breakdown["stream"] == pytest.approx(one.breakdown["stream"])  # each group packs its own
    slower = cm.mixed_batch("logprob", ParallelPlan(dp=2), share + [20], padded=True, token_budget=128,
                            groups=[share, [20]])
    assert slower.breakdown["stream"] == pytest.approx(one.breakdown["stream"])  # the slowest group's
    with pytest.raises(ValueError, match="lengths held by each of the plan's 2 data-parallel groups"):
        cm.mixed_batch("logprob", ParallelPlan(dp=2), share, padded=True, token_budget=128)


@pytest.mark.slow
@pytest.mark.dist
def test_validation_on_two_processes(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("PYTHONPATH", os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cfg = resolve_config(None, overrides=SMALL)
    r = _cli("--out", str(tmp_path / "v"), "--nproc", "2", "--steps", "2", "--set", "groups=2",
             "--set", "group_size=2")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert report["nproc"] == 2 and cfg.groups == 2
    stages = {row["stage"]: row for row in report["stages"]}
    for stage in ("rollout", "experience", "dispatch", "train", "reshard"):
        assert stage in stages, stage
        assert stages[stage]["measured_s"] > 0 and math.isfinite(stages[stage]["median_err"]), stage
    assert stages["dispatch"]["predicted_s"] > 0 and stages["reshard"]["predicted_s"] > 0
    v = report["variants"][0]
    assert v["nproc"] == 2 and v["plan_mismatches"] == []
    # the profile's share of a core over each step's (earl.calibrate.hostload): 1 on an idle host
    assert 0 < v["run_share"] <= 1 and v["host_stretch"] >= load_profile("cpu-measured").host_share / 1.0
    assert v["host_stretch"] == pytest.approx(1.0) or v["run_share"] < 1
    assert (tmp_path / "v" / "runs" / "base" / "launch-config.json").is_file()  # ran under torchrun


def test_each_runtime_engine_has_one_simulator_model_and_it_is_the_right_one():
    """earl.calibrate.host.SIM_ENGINE is the one mapping validate uses: the built-in `pytorch`
    engine and vLLM batch continuously, only `pytorch-static` plays turns in lockstep."""
    from earl.calibrate import validate
    from earl.calibrate.host import SIM_ENGINE, sim_engine
    from earl.runtime.engine import ENGINES as RUNTIME_ENGINES
    from earl.sim.simulation import ENGINES as SIM_ENGINES

    assert set(SIM_ENGINE) == set(RUNTIME_ENGINES) and set(SIM_ENGINE.values()) <= set(SIM_ENGINES)
    assert sim_engine("pytorch") == "continuous" and sim_engine("vllm") == "continuous"
    assert sim_engine("pytorch-static") == "turn-sync"
    assert validate.sim_engine is sim_engine
    with pytest.raises(ValueError, match="valid: pytorch, pytorch-static, vllm"):
        sim_engine("tgi")


def test_calibrate_has_no_import_cycle_and_imports_at_the_top():
    """Helpers several calibrate modules share live one floor down (earl.calibrate.host), so no
    module imports a sibling that imports it back; imports sit at module level except the few
    lazy on purpose (matplotlib for the plot, a torch-version probe, type-only names)."""
    import ast
    from pathlib import Path

    import earl.calibrate

    root = Path(earl.calibrate.__file__).parent
    deps, local = {}, []
    for p in root.glob("*.py"):
        tree = ast.parse(p.read_text())
        deps[p.stem] = {n.module.rsplit(".", 1)[1] for n in tree.body
                        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("earl.calibrate.")}
        deps[p.stem] |= {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "earl.calibrate"
                         for a in n.names}
        top = {id(n) for n in tree.body}
        local += [p.stem for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top]

    def reaches(a, b, seen=()):
        return any(d == b or (d not in seen and reaches(d, b, (*seen, d))) for d in deps.get(a, ()))

    assert not [m for m in deps if reaches(m, m)]
    assert sorted(local) == ["__init__", "bench", "report", "report", "validate", "validate"]


def test_step_share_is_rank_zeros_cpu_per_wall_second_per_thread():
    assert hostload_share({"step_s": 2.0, "step_cpu_s": 0.5}, 1, 0.9) == 0.25
    assert hostload_share({"step_s": 2.0, "step_cpu_s": 3.0}, 2, 0.9) == 0.75
    assert hostload_share({"step_s": 2.0, "step_cpu_s": 5.0}, 1, 0.9) == 1.0
    assert hostload_share({"step_s": 0.0, "step_cpu_s": 0.0}, 1, 0.9) == 0.9  # untimed: the run's


def test_compute_share_pools_the_ranks_compute_spans_and_caps_at_the_cores_split():
    """The share of a core ranks got while computing: CPU over wall seconds of their rollout and
    log-prob spans, all ranks pooled, never above cores / nproc; collective spans (their waits)
    and other steps do not count; None for a step whose spans carry no cpu_s."""
    def sp(name, stage, rank, step, wall, cpu=None):
        return Span(name=name, stage=stage, rank=rank, t_start=0.0, t_end=wall, step=step,
                    args={} if cpu is None else {"cpu_s": cpu})
    spans = [sp("rollout", "rollout", 0, 1, 1.0, 0.9), sp("rollout", "rollout", 1, 1, 2.0, 1.9),
             sp("logprob", "experience", 0, 1, 1.0, 0.8), sp("train_to_rollout", "reshard", 0, 1, 5.0, 0.1),
             sp("rollout", "rollout", 0, 2, 1.0, 1.0), sp("rollout", "rollout", 0, 3, 1.0)]
    assert compute_shares(spans, [1, 2, 3], 2, 2) == [pytest.approx(3.6 / 4.0), 1.0, None]
    # four ranks on two cores: the share while all compute is at most a half
    assert compute_shares(spans, [1], 4, 2) == [0.5]


def test_experience_share_is_its_own_spans_uncapped_with_the_local_hand_off():
    """The experience stage's share: its log-prob spans and the hand-offs that waited for no
    one (a local copy, the rank's own work), all ranks pooled and capped at one core, not at
    cores / nproc: ranks reach it one after another (traces of 2026-12-04, docs/validate-history.md)."""
    def sp(name, rank, wall, cpu, waits=None):
        args = {"cpu_s": cpu} | ({} if waits is None else {"waits": waits})
        return Span(name=name, stage="experience", rank=rank, t_start=0.0, t_end=wall, step=1, args=args)
    spans = [sp("logprob", 0, 1.0, 0.9), sp("logprob", 1, 1.0, 1.0), sp("handoff", 0, 2.0, 1.0, waits=False),
             sp("handoff", 1, 3.0, 0.1, waits=True), sp("handoff", 2, 3.0, 0.1)]  # no arg: a wait
    got = compute_shares(spans, [1], 4, 2, names=EXPERIENCE_SPANS, cap=1.0, own=COLLECTIVE_SPANS)
    assert got == [pytest.approx(2.9 / 4.0)]  # above cores / nproc = 0.5
    assert compute_shares([sp("logprob", 0, 1.0, 1.2)], [1], 4, 2, names=EXPERIENCE_SPANS, cap=1.0) == [1.0]


def test_experience_share_of_the_last_rank_to_start_it():
    """`last=True`: only the spans of the rank that started the stage last (the critical path
    `measured_stages` reads): an early rank's log-prob pass that waited for a core behind its
    peers' rollouts does not stretch the last rank's price."""
    def sp(name, rank, t0, t1, cpu, step=1):
        return Span(name=name, stage="experience", rank=rank, t_start=t0, t_end=t1, step=step,
                    args={"cpu_s": cpu, "waits": False})
    spans = [sp("handoff", 0, 0.0, 1.0, 1.0), sp("logprob", 0, 1.0, 4.0, 0.5),  # early, preempted
             sp("handoff", 1, 5.0, 5.5, 0.5), sp("logprob", 1, 5.5, 6.5, 0.75),  # last to start
             sp("logprob", 0, 0.0, 1.0, 0.25, step=2)]
    kw = dict(names=EXPERIENCE_SPANS, cap=1.0, own=COLLECTIVE_SPANS)
    assert compute_shares(spans, [1, 2], 4, 2, last=True, **kw) == [pytest.approx(1.25 / 1.5), 0.25]
    assert compute_shares(spans, [1], 4, 2, **kw) == [pytest.approx(2.75 / 5.5)]  # pooled


def test_simulated_log_prob_passes_are_the_runtimes():
    """One optimizer step and no KL: the runtime's experience stage runs no log-prob forward
    (Trainer.needs_old_logprobs), so the simulator prices none; the old policy's pass with
    several mini-batches, the reference model's with a KL coefficient."""
    t = TrainerConfig()
    assert (t.minibatches, t.kl_coef) == (1, 0.0) and logprob_passes(t) == 0
    assert logprob_passes(dataclasses.replace(t, minibatches=2)) == 1
    assert logprob_passes(dataclasses.replace(t, kl_coef=0.1, algo="grpo")) == 1  # the reference's only
    assert logprob_passes(dataclasses.replace(t, kl_coef=0.1, algo="grpo", minibatches=2)) == 2
    assert logprob_passes(dataclasses.replace(t, kl_coef=0.1, algo="reinforce++")) == 2  # KL in the rewards
    cm = CostModel(MODEL_CATALOG["tiny"], local_cluster(load_profile("cpu-measured"), 1), load_profile("cpu-measured"))
    none = cm.mixed_batch("logprob", ParallelPlan(), [40, 60], passes=0, padded=True)
    one = cm.mixed_batch("logprob", ParallelPlan(), [40, 60], passes=1, padded=True)
    assert 0 < none.time_s < one.time_s and none.time_s == pytest.approx(none.breakdown["host"])


@pytest.mark.parametrize("over,reductions,grouped,now", [
    ({}, 2, False, 0), ({"trainer.baseline": "batch"}, 1, False, 0), ({"trainer.algo": "grpo"}, 1, True, 0),
    ({"trainer.kl_coef": 0.1}, 2, False, 1), ({"trainer.kl_coef": 0.1, "trainer.algo": "grpo"}, 1, True, 0)])
def test_the_simulated_dispatch_reduces_what_the_runtimes_estimator_does(over, reductions, grouped, now):
    """validate prices the runtime's own estimator (`runtime_reductions`): its default
    (REINFORCE++, per-turn baseline) and a batch baseline reduce nothing, their episodes' key
    sums known from the metadata; with a KL penalty in the rewards the per-turn sums are reduced
    once (the turn count known; twice where unknown); a group estimator's statistics come with
    the rewards (no reduction in the runtime, `stat_reductions=0` in the simulator)."""
    cfg = resolve_config(None, overrides={**SMALL, **over})
    spec = advantage_spec(cfg)
    assert (spec.reductions(), spec.grouped) == (reductions, grouped)
    assert spec.reductions(RUNTIME_REWARDS, RUNTIME_TURNS) == (0 if grouped else 1)
    assert runtime_reductions(cfg) == now
    assert spec.priced_key(summed=now == 0) == spec.key + ("/summed" if now == 0 and not grouped else "")


def test_a_run_is_priced_with_the_reductions_its_trace_records():
    """`recorded_reductions`: the most any rank's training dispatch span records; None for a
    trace from before the runtime wrote them (validate then prices the per-turn baseline's
    turn-count round those runs did issue)."""
    def span(stage, args, rank=0):
        return Span(name="layout-aware", stage=stage, rank=rank, t_start=0.0, t_end=1.0, step=1, args=args)

    assert recorded_reductions([span("dispatch", {"reductions": 1}), span("dispatch", {"reductions": 0}, 1),
                                span("experience", {"reductions": 5})]) == 1
    assert recorded_reductions([span("dispatch", {"transfers": 4})]) is None
    old = advantage_spec(resolve_config(None, overrides=SMALL)).reductions(RUNTIME_REWARDS)
    assert old == 2


def test_rescore_prices_a_recorded_multi_process_run_of_a_checkpoint_kept_as_its_config(tmp_path):
    """A committed `earl validate --nproc 2 --model qwen2-27m` run (studies/cpu_fidelity.sh keeps
    the random checkpoint's config.json, not its weights): re-priced with the pass's own profile,
    nothing run, it reproduces the recorded prediction (the dispatch's with its cold start: the
    run's hand-off copied locally, so its executor rounds start cold, as they were priced then);
    the plan search reads the shapes from the config alone (it refused the directory for its
    missing weights before)."""
    pass_dir = Path(__file__).resolve().parents[2] / "docs" / "cpu" / "epyc-2026-12-04f" / "cf43"
    recorded = json.loads((pass_dir / "heldout-nproc2" / "validation.json").read_text())
    assert not list((pass_dir / "heldout-nproc2" / "model").glob("*.safetensors"))
    again = rescore_validation(source=pass_dir / "heldout-nproc2", profile=str(pass_dir / "profile-cpu.json"),
                               out_dir=tmp_path / "again")
    assert again.nproc == 2
    [v] = again.variants
    for got, want in zip(v.measured, recorded["variants"][0]["measured"], strict=True):
        # the dispatch is read from its last rank's arrival to its last rank's end since the
        # twenty-third session, at least the shortest span read before; the experience stage's
        # own work as the critical path's since the thirty-fifth (the last rank to start it, not
        # the slowest rank's sum): here never more
        moved = ("dispatch", "experience")
        assert {k: x for k, x in got.items() if k not in moved} == {k: x for k, x in want.items() if k not in moved}
        assert got["dispatch"] >= want["dispatch"]
        assert 0 < got["experience"] <= want["experience"]
    for got, want in zip(v.predicted, recorded["variants"][0]["predicted"], strict=True):
        # the executor's start barrier is priced no more since the twenty-eighth session: one
        # round (and its cold start) less than the run was priced with; since the thirtieth the
        # rollout's decode steps attend the longest row's length rounded up (the engine's slot
        # cache, Simulation's `kv_round`): a few % more; since the thirty-fifth the experience
        # stage is stretched by the share its last rank got (`compute_shares(last=True)`), not
        # every rank's pooled; the rest the same
        moved = ("dispatch", "rollout", "experience")
        assert {k: x for k, x in got.items() if k not in moved} == \
            pytest.approx({k: x for k, x in want.items() if k not in moved}, rel=1e-9)
        assert 0.5 * want["experience"] < got["experience"] < 1.5 * want["experience"]
        assert 0.5 * want["dispatch"] < got["dispatch"] < want["dispatch"]
        assert want["rollout"] < got["rollout"] < 1.05 * want["rollout"]
