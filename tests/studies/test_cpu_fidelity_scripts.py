"""The CPU fidelity study's readers of recorded validations: the scorecard and the host-speed
check on the eleventh session's committed passes (docs/cpu/epyc-2026-12-03/), the scorecard and
the host-probe check on the twelfth's (docs/cpu/epyc-2026-12-03b/).

    OMP_NUM_THREADS=1 python -m pytest -q tests/studies/test_cpu_fidelity_scripts.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "cpu" / "epyc-2026-12-03"


def study(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_scorecard_counts_every_multi_process_run_and_matches_the_committed_one():
    passes = [str(DATA / "more" / f"cf{i}") for i in (16, 17, 18, 19)] + [str(DATA)]
    r = study("studies/cpu_fidelity_scorecard.py", *passes)
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"nproc[24]-calculator-run[12]", r.stdout)) == 20
    total = re.search(r"within 25%: (\d+) of (\d+) stage-runs \(level-fitted: (\d+);", r.stdout)
    assert total and int(total[2]) == 100 and int(total[1]) <= int(total[3]) <= 100
    assert r.stdout.strip() == (DATA / "scorecard-all.txt").read_text().strip()
    # one level per pass (the two runs of a pass and process count share it) lies between the
    # as-priced count (x1 is one of the levels tried) and the runs' count; one level for every
    # run given (--common, the same lines with it appended) reaches no more than one per pass
    r = study("studies/cpu_fidelity_scorecard.py", "--common", *passes)
    assert r.returncode == 0, r.stderr
    for key in re.findall(r"nproc [24] \w+ +(\d+) of (\d+) +\(level-fitted \d+, one level per pass (\d+)\) "
                          r"one level for all (\d+) \(x[\d.]+\)", r.stdout):
        got, n, per_pass, common = map(int, key)
        assert got <= per_pass <= n and common <= per_pass
    assert len(re.findall(r"one level for all \d+", r.stdout)) == 10
    bad = study("studies/cpu_fidelity_scorecard.py", str(DATA / "more"))
    assert bad.returncode == 2 and "no nproc*/validation.json" in bad.stderr


def test_hostspeed_reads_each_run_and_scaling_by_it_never_loses_a_count_here():
    r = study("studies/cpu_fidelity_hostspeed.py", str(DATA / "more" / "median5"), str(DATA))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("20 runs;")
    got = dict(re.findall(r"(as priced|scaled by the reading): (\d+) of 100", r.stdout))
    assert int(got["as priced"]) == 58  # the committed median5/scorecard.txt's count
    assert f"within 25%: {got['as priced']} of 100" in (DATA / "more" / "median5" / "scorecard.txt").read_text()
    assert int(got["scaled by the reading"]) > int(got["as priced"])
    for n in (2, 4):
        corr = re.search(rf"nproc {n}: .*train (-?[\d.]+)", r.stdout)
        assert corr and float(corr[1]) > 0.5


# the twelfth session's passes, whose runs read the host probe (cf23: validate applied its
# factor; cf24-cf26: recorded only)
PROBED = ROOT / "docs" / "cpu" / "epyc-2026-12-03b"


def test_scorecard_of_probed_passes_counts_each_run_the_other_way_too():
    passes = sorted(str(p) for p in PROBED.glob("cf*"))
    r = study("studies/cpu_fidelity_scorecard.py", *passes)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (PROBED / "scorecard-all.txt").read_text().strip()
    assert "(16 runs read the host probe; each the other way (4 applied it):" in r.stdout
    assert r.stdout.count("(not applied)") == 12


def test_probe_study_agrees_with_the_scorecard_and_refuses_a_pass_without_readings():
    recorded = [str(PROBED / f"cf{n}") for n in (24, 25, 26)]
    card = study("studies/cpu_fidelity_scorecard.py", *recorded).stdout
    r = study("studies/cpu_fidelity_probe.py", *recorded)
    assert r.returncode == 0, r.stderr
    got = {k.strip(): int(v) for k, v in re.findall(r"^(.+?)\s+(\d+) of 60 stage-runs", r.stdout, re.M)}
    assert set(got) == {"as priced", "one-process ref", "N-rank ref", "stage's phase ref", "sqrt N-rank"}
    # two readers of the same runs: validate's recorded factor is the N-rank rule
    assert f"within 25%: {got['as priced']} of 60" in card
    assert f"with its factor: {got['N-rank ref']} within" in card
    bad = study("studies/cpu_fidelity_probe.py", str(DATA))  # the eleventh session's: no probe
    assert bad.returncode == 2 and "did not read the host probe" in bad.stderr


def test_heldout_forward_study_prices_each_profile_and_its_rows_zero_twin(tmp_path):
    """studies/cpu_heldout_forward.py times real eager forwards (here the tiny model, to be
    quick) and prices each with every profile given, a profile with a row penalty also without
    it; each section ends with its median error and count within 25%."""
    import dataclasses

    from earl.cost_model.profile import load_profile

    pen = dataclasses.replace(load_profile("cpu"), gemm_rows_half=8.0).save(tmp_path / "pen.json")
    r = study("studies/cpu_heldout_forward.py", "cpu", str(pen), "--model", "tiny", "--gemm-sequence")
    assert r.returncode == 0, r.stderr
    sections = re.findall(r"^(\S.*):\n((?:  .*\n?)+)", r.stdout.split("\n", 1)[1], flags=re.M)
    assert [s[0] for s in sections] == ["cpu", str(pen), f"{pen} (rows 0)"]
    # --gemm-sequence: per decode batch the step, its 15 Linear layers (2 layers x 7 + the
    # tied head) timed in order, and each profile given (not the rows-0 twin) pricing them
    seq = re.findall(r"^  decode b=(\d+) +step +([\d.]+) ms, its GEMMs +([\d.]+) ms .*priced / measured: (.*)$",
                     r.stdout, re.M)
    assert "tiny: 15 Linear layers" in r.stdout and [int(b) for b, *_ in seq] == [1, 2, 4, 8, 16]
    for _, step, gemms, prices in seq:
        assert 0 < float(gemms) < float(step)
        assert re.fullmatch(rf"cpu: x[\d.]+ {re.escape(str(pen))}: x[\d.]+", prices), prices
    for _, body in sections:
        ratios = [float(x) for x in re.findall(r"predicted/measured x([\d.]+)", body)]
        assert len(ratios) == 7 and all(x > 0 for x in ratios)
        assert re.search(r"within 25%: \d of 7", body)
    bad = study("studies/cpu_heldout_forward.py", "cpu", "--model", "nope")
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr
    (tmp_path / "broken.json").write_text('{"version": 1}')
    for arg, msg in ((str(tmp_path / "none.json"), "no profile file at"),
                     (str(tmp_path / "broken.json"), "missing field")):
        bad = study("studies/cpu_heldout_forward.py", arg, "--model", "tiny")
        assert bad.returncode == 2 and msg in bad.stderr and "Traceback" not in bad.stderr


def test_host_states_study_reads_the_probe_and_refuses_no_time():
    """studies/host_states.py: back-to-back probe readings, their modes and per-second medians,
    steal time where /proc/stat has it, and the reading beside a neighbour on the other CPUs."""
    r = study("studies/host_states.py", "--seconds", "1")
    assert r.returncode == 0, r.stderr
    head = re.match(r"(\d+) readings in 1 s: us per iteration p10 ([\d.]+), median ([\d.]+)", r.stdout)
    assert head and int(head[1]) > 10 and 0 < float(head[2]) <= float(head[3])
    assert re.search(r"fast mode \(< 70 us\): \d+% of readings", r.stdout)
    assert re.search(r"per-second medians \(us\): \d+", r.stdout)
    bad = study("studies/host_states.py", "--seconds", "0")
    assert bad.returncode == 2 and "--seconds must be > 0, got 0.0" in bad.stderr


def test_calibration_spread_lists_every_fitted_constant_of_the_committed_passes(tmp_path):
    """studies/cpu_calibration_spread.py over the eight committed calibrations of 2026-12-03/04:
    op_overhead_s 68.4-172 us (x2.52), each constant's values in the passes' order, the count of
    constants no single level can hold within 25%; fewer than two profiles or a folder without
    one is a usage error."""
    folders = [*sorted(PROBED.glob("cf*")), *sorted((ROOT / "docs/cpu/epyc-2026-12-04").glob("cf*")),
               *sorted((ROOT / "docs/cpu/epyc-2026-12-04b").glob("cf*"))]
    r = study("studies/cpu_calibration_spread.py", *map(str, folders))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("8 calibrations: cf23, cf24, cf25, cf26, cf27, cf28, cf29, cf30")
    row = re.search(r"^op_overhead_s +x +([\d.]+) +(\d+)%  (.+)$", r.stdout, re.M)
    assert row and row[1] == "2.52" and len(row[3].split()) == 8
    assert re.search(r"^matmul asymptote +x +[\d.]+", r.stdout, re.M)
    spreads = [float(x) for x in re.findall(r" x *([\d.]+) +\d+%  ", r.stdout)]
    assert spreads == sorted(spreads, reverse=True) and min(spreads) >= 1.0
    tail = re.search(r"(\d+) of (\d+) constants fitted in every calibration spread more than x1.67", r.stdout)
    assert tail and int(tail[1]) == sum(x > 1.25 / 0.75 for x in spreads) and int(tail[2]) == len(spreads)
    for args, msg in (([str(folders[0])], "at least two profiles, got 1"),
                      ([str(folders[0]), str(tmp_path)], "no profile")):
        bad = study("studies/cpu_calibration_spread.py", *args)
        assert bad.returncode == 2 and msg in bad.stderr and "Traceback" not in bad.stderr


# the sixteenth session's re-pricing of the twelve passes (run_dir: the committed runs)
RESCORED = ROOT / "docs" / "cpu" / "epyc-2026-12-04d" / "rescored"


def test_experience_modes_reads_every_run_and_separates_the_two_modes():
    passes = [str(p) for p in sorted(RESCORED.glob("cf*"))]
    r = study("studies/cpu_experience_modes.py", *passes)
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"nproc[24]-calculator-run[12] +steps with a preempted rank \d of 8", r.stdout)) == 48
    assert r.stdout.strip() == (RESCORED.parent / "experience-modes.txt").read_text().strip()
    # four ranks on two cores: a step with a preempted rank takes about twice its own work, one
    # without about its own work; two ranks on two cores rarely preempt
    modes = {n: re.search(rf"nproc {n}: none preempted: (\d+) steps, slowest / own work median x([\d.]+).*"
                          rf"one or more: (\d+) steps, slowest / own work median x([\d.]+)", r.stdout)
             for n in (2, 4)}
    assert all(modes.values())
    assert float(modes[4][2]) < 1.3 < 1.8 < float(modes[4][4])
    assert int(modes[2][3]) < int(modes[2][1]) // 10
    bad = study("studies/cpu_experience_modes.py", str(RESCORED))
    assert bad.returncode == 2 and "no nproc*/validation.json" in bad.stderr


def test_experience_modes_counts_what_the_ranks_own_work_lost_by_arrival():
    """Runs whose spans carry run-queue waits (the thirty-fifth session's passes): the ranks
    that reach the experience stage before the last lose over 1 ms of it, waiting for a core,
    far more often than the last one, which validate reads the stage from."""
    passes = [str(p) for p in sorted((ROOT / "docs" / "cpu" / "xeon-2026-12-07").glob("cf14[2-5]"))]
    assert len(passes) == 4
    r = study("studies/cpu_experience_modes.py", *passes)
    assert r.returncode == 0, r.stderr
    got = re.search(r"nproc 4, own work that lost over 1 ms to other than its CPU: ranks before the last "
                    r"(\d+) of (\d+) \((\d+) mostly waiting for a core\), the last rank (\d+) of (\d+)", r.stdout)
    assert got, r.stdout
    early, n_early, queued, last, n_last = map(int, got.groups())
    assert (n_early, n_last) == (192, 64)  # 3 ranks before the last x 8 scored steps x 8 runs
    assert (early, queued, last) == (28, 28, 3)
    assert early / n_early > 2 * last / n_last
    held = study("studies/cpu_experience_modes.py", "--runs", "heldout-nproc", *passes)
    assert held.returncode == 0, held.stderr
    assert "nproc 4, own work that lost over 1 ms to other than its CPU: ranks before the last 12 of 48 " \
           "(11 mostly waiting for a core), the last rank 0 of 16" in held.stdout
    # traces from before the spans carried `wait_s` print no such line
    old = study("studies/cpu_experience_modes.py", str(sorted(RESCORED.glob("cf*"))[0]))
    assert old.returncode == 0 and "own work that lost" not in old.stdout


def test_gloo_loop_study_times_each_op_and_reads_a_runs_threads(tmp_path):
    from earl.trace import Span, write_chrome_trace

    r = study("studies/cpu_gloo_loop.py", "--ops", "--nproc", "2", "--repeats", "3")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^  (\w+) +([\d.]+)ms +([\d.]+)ms +([\d.]+)ms +(\d+) of +(\d+)", r.stdout, re.M)
    assert [row[0] for row in rows] == ["barrier", "all_reduce", "send_recv", "dispatch"]
    assert all(0 < float(med) <= float(slow) and int(calls) == 6 for _, med, slow, _, _, calls in rows)
    # a run's trace: the spans' own-thread CPU against the process's, per stage
    run = tmp_path / "run"
    run.mkdir()
    write_chrome_trace([Span(name="train_step", stage="train", rank=k, t_start=0.0, t_end=0.2, step=1,
                             args={"cpu_s": 0.1, "thread_cpu_s": 0.08}) for k in (0, 1)], run / "trace.json")
    r = study("studies/cpu_gloo_loop.py", str(run))
    assert r.returncode == 0, r.stderr
    assert re.search(r"train +train_step +2 +400.0 +0.50 +0.40 +10.0%", r.stdout), r.stdout
    # a trace from before the thread's CPU was recorded, and no input at all: one line, exit 2
    old = ROOT / "docs" / "cpu" / "epyc-2026-12-04d" / "cf37" / "nproc2-calculator-run1" / "runs" / "base"
    bad = study("studies/cpu_gloo_loop.py", str(old))
    assert bad.returncode == 2 and "carry no thread_cpu_s" in bad.stderr
    assert study("studies/cpu_gloo_loop.py").returncode == 2


def test_scorecard_of_the_held_out_models_runs_is_apart_from_the_tiny_models():
    """cpu_fidelity.sh (since the eighteenth session) also runs the held-out model at 2 and 4
    ranks (heldout-nprocN); the default scorecard counts only the tiny model's runs, `--runs
    heldout-nproc` only those, each as the pass printed it."""
    cf43 = ROOT / "docs" / "cpu" / "epyc-2026-12-04f" / "cf43"
    tiny = study("studies/cpu_fidelity_scorecard.py", str(cf43))
    held = study("studies/cpu_fidelity_scorecard.py", "--runs", "heldout-nproc", str(cf43))
    assert tiny.returncode == held.returncode == 0, tiny.stderr + held.stderr
    assert tiny.stdout.strip() == (cf43 / "scorecard.txt").read_text().strip()
    assert held.stdout.strip() == (cf43 / "scorecard-heldout.txt").read_text().strip()
    assert "heldout" not in tiny.stdout and "of 20 stage-runs" in tiny.stdout
    assert len(re.findall(r"heldout-nproc[24] ", held.stdout)) == 2 and "of 10 stage-runs" in held.stdout
    bad = study("studies/cpu_fidelity_scorecard.py", "--runs", "nproc8", str(cf43))
    assert bad.returncode == 2 and "nproc8" in bad.stderr


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_allgather_study_times_each_group(op):
    """studies/cpu_allgather_ranks.py: real gloo ranks, each gathered (reduced) size timed
    (fastest <= slowest rank, CPU per rank > 0); the ratio column is each world's CPU over the
    first's."""
    r = study("studies/cpu_allgather_ranks.py", "--worlds", "2", "--reps", "3", "--op", op)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"gloo {op}_{'into_tensor' if op == 'all_gather' else 'tensor'}, ")
    row = r"^ranks 2 +([\d.]+) MiB +fastest +([\d.]+) ms +slowest +([\d.]+) ms +CPU/rank +([\d.]+) ms +x1\.00$"
    rows = re.findall(row, r.stdout, re.M)
    assert [float(row[0]) for row in rows] == [0.25, 1.0, 4.0, 16.0, 64.0]
    assert all(0 < float(f) <= float(s) and float(c) > 0 for _, f, s, c in rows)


def test_allgather_study_refuses_bad_input():
    """studies/cpu_allgather_ranks.py: a bad group, repeat count or op exits 2 naming the option."""
    for bad in (["--worlds", "1,2"], ["--worlds", "two"], ["--reps", "1"], ["--op", "broadcast"]):
        got = study("studies/cpu_allgather_ranks.py", *bad)
        assert got.returncode == 2 and f"--{bad[0][2:]}" in got.stderr, got.stderr


def test_dispatch_cold_study_times_each_case_four_ways_and_refuses_bad_input():
    """studies/cpu_dispatch_cold.py: real gloo ranks, every case timed warm and cold, by the
    executor's own clock and around the call (after a barrier of its own: never shorter)."""
    r = study("studies/cpu_dispatch_cold.py", "--worlds", "2", "--reps", "3")
    assert r.returncode == 0, r.stderr
    num = r"([-+]?[\d.]+)"
    row = (rf"^ranks 2 +(\d+) x +(\d+) +warm +{num} +cold +{num} +cold-warm +{num} +\| +wall warm +{num} +"
           rf"cold +{num} +\| +cold wall - warm +{num}$")
    rows = re.findall(row, r.stdout, re.M)
    assert [(int(a), int(b)) for a, b, *_ in rows] == [(1, 512), (4, 2048), (8, 256)]
    for _, _, warm, cold, diff, warm_wall, cold_wall, wall_diff in rows:
        warm, cold, warm_wall, cold_wall = map(float, (warm, cold, warm_wall, cold_wall))
        assert 0 < warm <= warm_wall and 0 < cold <= cold_wall
        assert float(diff) == pytest.approx(cold - warm, abs=0.011)
        assert float(wall_diff) == pytest.approx(cold_wall - warm, abs=0.011)
    for bad in (["--worlds", "1"], ["--worlds", "x"], ["--reps", "2"]):
        got = study("studies/cpu_dispatch_cold.py", *bad)
        assert got.returncode == 2 and ("--worlds" in got.stderr or "--reps" in got.stderr), got.stderr


def test_fsdp_refit_reprices_a_committed_calibrations_points(tmp_path):
    """studies/cpu_fsdp_refit.py: the recorded fsdp points of cf44's calibration refitted under
    the current prices; the profile written with the new constants loads, and a profile with
    no fsdp fit is refused in one line."""
    from earl.cost_model.profile import load_profile

    src = ROOT / "docs" / "cpu" / "epyc-2026-12-04f" / "cf44" / "profile-cpu.json"
    r = study("studies/cpu_fsdp_refit.py", str(src), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    syncs = re.findall(r"(\d)r (\d) layers( wide)? x([\d.]+)", r.stdout)
    assert sorted(n for n, *_ in syncs) == ["2"] * 3 + ["4"] * 3
    assert all(0.5 < float(x) < 2 for *_, x in syncs)
    got = load_profile(tmp_path / "cf44.json")
    printed = dict(re.findall(r"(reshard_byte_s|reshard_tensor_s|fsdp_unit_s|fsdp_tensor_s) \S+ -> (\S+)", r.stdout))
    assert len(printed) == 4
    assert all(float(v) == pytest.approx(getattr(got, f), rel=1e-2) for f, v in printed.items())
    assert got.reshard_busy == load_profile(src).reshard_busy
    bad = study("studies/cpu_fsdp_refit.py", str(ROOT / "earl" / "cost_model" / "profiles" / "h200-measured.json"))
    assert bad.returncode == 2 and "no recorded fsdp points" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "file").write_text("x")
    bad = study("studies/cpu_fsdp_refit.py", str(src), "--out", str(tmp_path / "file" / "sub"))
    assert bad.returncode == 2 and "cannot create it" in bad.stderr and "Traceback" not in bad.stderr


def test_fsdp_refit_reads_a_calibration_with_step_start_points_and_fits_the_four_sync_terms(tmp_path):
    """A calibration of 2026-12-07 (cf179: training-step-start points, which the study could not
    parse before): refitted, its sync points are counted as the fit counts them now, the four
    sync terms come out, and each sync point is priced within 25% of its measured time."""
    from earl.calibrate.fsdpfit import FIELDS
    from earl.cost_model.profile import load_profile

    src = ROOT / "docs" / "cpu" / "epyc-2026-12-07" / "cf179" / "profile-cpu.json"
    r = study("studies/cpu_fsdp_refit.py", str(src), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = load_profile(tmp_path / "cf179.json")
    assert got.reshard_fixed_s > 0 and got.reshard_shard_byte_s > 0
    for f in FIELDS["sync"]:
        assert re.search(rf"{f} \S+ -> \S+", r.stdout), f
    syncs = [float(x) for x in re.findall(r"\dr \d layers(?: wide)? x([\d.]+)", r.stdout)]
    assert len(syncs) == 6 and all(0.75 <= x <= 1.25 for x in syncs), syncs


def test_dispatch_reading_study_reads_each_step_three_ways_and_refuses_a_folder_without_runs():
    passes = [ROOT / "docs" / "cpu" / "epyc-2026-12-05" / p for p in ("cf54", "cf56")] + \
        [ROOT / "docs" / "cpu" / "epyc-2026-12-05b" / p for p in ("cf57", "cf58", "cf59")]
    r = study("studies/cpu_dispatch_reading.py", *map(str, passes))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (ROOT / "docs" / "cpu" / "epyc-2026-12-05c" / "dispatch-reading.txt").read_text().strip()
    got = {(m, int(n)): (int(k), *map(float, xs)) for m, n, k, *xs in re.findall(
        r"(tiny|held-out) model, nproc (\d), (\d+) steps: shortest span ([\d.]+) ms .*last arrival -> last end "
        r"([\d.]+) ms .*slowest executor ([\d.]+) ms .*ends apart ([\d.]+) ms", r.stdout)}
    assert set(got) == {(m, n) for m in ("tiny", "held-out") for n in (2, 4)}
    assert got[("tiny", 2)][0] == got[("tiny", 4)][0] == 80  # ten runs x eight scored steps
    for _steps, shortest, last, executor, _apart in got.values():
        assert last >= shortest > 0 and executor > 0  # the last arrival's span ends by the last end
    # four ranks on two cores end ~2 ms apart; two ranks at once
    assert got[("tiny", 4)][4] > 1.0 > 0.2 > got[("tiny", 2)][4]
    bad = study("studies/cpu_dispatch_reading.py", str(ROOT / "docs"))
    assert bad.returncode == 2 and "no multi-process" in bad.stderr


def test_sync_reading_study_reads_the_weight_sync_from_the_last_arrival():
    """`--stage reshard`: the committed reading of the twenty-third session's passes; per step
    the last arrival -> first end window is at most the shortest span, which is at most the last
    arrival -> last end; at 4 ranks on 2 cores the first rank arrives well before the last."""
    passes = [ROOT / "docs" / "cpu" / "epyc-2026-12-05c" / f"cf6{i}" for i in range(5)]
    r = study("studies/cpu_dispatch_reading.py", "--stage", "reshard", *map(str, passes))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (ROOT / "docs" / "cpu" / "epyc-2026-12-05d" / "sync-reading.txt").read_text().strip()
    got = {(m, int(n)): tuple(map(float, xs)) for m, n, *xs in re.findall(
        r"(tiny|held-out) model, nproc (\d), \d+ steps: shortest span ([\d.]+) ms .*last arrival -> first end "
        r"([\d.]+) ms .*last arrival -> last end ([\d.]+) ms .*first arrived ([\d.]+) ms .*rank CPU ([\d.]+) ms",
        r.stdout)}
    assert set(got) == {(m, n) for m in ("tiny", "held-out") for n in (2, 4)}
    for shortest, first_end, last_end, _first, cpu in got.values():
        assert 0 < first_end <= shortest <= last_end and cpu > 0
    assert got[("tiny", 4)][3] > 2 * got[("tiny", 4)][4]  # arrivals spread over more than the work
    assert got[("held-out", 4)][3] < got[("held-out", 4)][4] / 2  # ... and well within it


def test_gemm_rows_study_times_and_prices_each_row_count_and_refuses_an_unknown_model():
    r = study("studies/cpu_gemm_rows.py", "--hardware", "cpu-measured", "--model", "tiny")
    assert r.returncode == 0, r.stderr
    summed = re.findall(r"rows +(\d+): one layer's GEMMs \+ LM head measured ([\d.]+) ms, priced ([\d.]+) ms", r.stdout)
    assert [int(n) for n, _, _ in summed] == [1, 2, 3, 4, 8, 16]
    assert all(float(m) > 0 and float(p) > 0 for _, m, p in summed)
    assert len(re.findall(r"rows +\d+ \(k \d+, n \d+\): measured", r.stdout)) == 5 * 6  # 4 projections + LM head
    bad = study("studies/cpu_gemm_rows.py", "--model", "no-such-model")
    assert bad.returncode == 2 and "no-such-model" in bad.stderr


def test_scorecard_of_the_held_out_models_one_process_runs():
    """`--runs model` scores the held-out model's one-process runs (model-tictactoe,
    model-calculator: four stages each, no weight sync), as the pass printed it
    (cpu_fidelity.sh's scorecard-model.txt, since 2026-12-08); the other scorecards leave them out."""
    cf198 = ROOT / "docs" / "cpu" / "epyc-2026-12-08" / "cf198"
    one = study("studies/cpu_fidelity_scorecard.py", "--runs", "model", str(cf198))
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == (cf198 / "scorecard-model.txt").read_text().strip()
    assert len(re.findall(r"model-(tictactoe|calculator) ", one.stdout)) == 2 and "of 8 stage-runs" in one.stdout
    assert "resh" not in one.stdout and "nproc 1 experience" in one.stdout
    assert "model-" not in study("studies/cpu_fidelity_scorecard.py", str(cf198)).stdout
    cf190 = ROOT / "docs" / "cpu" / "epyc-2026-12-07" / "cf190"  # its one-process runs kept no validation.json
    bad = study("studies/cpu_fidelity_scorecard.py", "--runs", "model", str(cf190))
    assert bad.returncode == 2 and "one-process run" in bad.stderr
