"""The host-load term shared by `earl calibrate` and `earl validate` (earl.calibrate.hostload):
the share of a core a busy process gets, and how the FSDP2 fit and validate's stretch use it."""

import dataclasses
import subprocess
import sys
import time

import pytest

from earl.calibrate import fsdpfit, hostload
from earl.calibrate.validate import corun_stretch, dispatch_stretch, host_speed, host_stretch
from earl.cost_model.profile import DispatchPath, HardwareProfile, load_profile
from earl.runtime.hostprobe import HostProbe, median_probe
from earl.trace import Span
from tests.calibrate.test_fsdpfit import _synthetic_points

PROF = load_profile("cpu-measured")


def test_share_is_cpu_seconds_per_wall_second_per_process():
    assert hostload.share_of(2.0, 2.0, 1) == 1.0  # a dedicated core
    assert hostload.share_of(4.0, 2.0, 4) == 0.5  # 4 ranks on 2 cores, nothing else
    assert hostload.share_of(1.0, 2.0, 4) == 0.125  # and other tenants taking 3 of every 4 of their seconds
    assert hostload.share_of(9.0, 2.0, 1) == 1.0 and hostload.share_of(0.0, 2.0, 1) == hostload.MIN_SHARE
    assert hostload.share_of(0.0, 0.0, 3) == 1.0  # nothing measured
    with pytest.raises(ValueError, match="procs >= 1, got 0"):
        hostload.share_of(1.0, 1.0, 0)


def _spin(cpu_s: float) -> None:
    """Busy until this process has had `cpu_s` more CPU seconds."""
    t0 = time.process_time()
    while time.process_time() - t0 < cpu_s:
        pass


def test_cpu_share_counts_this_process_and_its_finished_children():
    """A busy loop gets at most a core; sleeping gets none; a child's CPU counts once it is
    waited for (spawned ranks, torchrun); a paused window counts for neither."""
    with hostload.CpuShare() as busy:
        _spin(0.3)
    with hostload.CpuShare() as idle:
        time.sleep(0.3)
    assert busy.cpu_s == pytest.approx(0.3, abs=0.05) and busy.wall_s >= busy.cpu_s - 0.02
    assert busy.share() == pytest.approx(min(1.0, busy.cpu_s / busy.wall_s)) and idle.share() < 0.2  # capped at a core
    with hostload.CpuShare(procs=2) as kids:
        subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"], check=True)
    assert kids.cpu_s >= 0.28  # the child's 0.3 CPU seconds
    assert kids.share() == pytest.approx(min(1.0, kids.cpu_s / (2 * kids.wall_s)))
    with hostload.CpuShare() as part:
        with part.paused():
            _spin(0.3)
        time.sleep(0.1)
    assert part.wall_s < 0.3 and part.cpu_s < 0.1


def test_profiles_carry_the_share_and_check_it(tmp_path):
    prof = dataclasses.replace(PROF, host_share=0.3,
                               dispatch_path=dataclasses.replace(PROF.dispatch_path, host_share=0.6))
    assert load_profile(str(prof.save(tmp_path / "p.json"))) == prof
    d = prof.to_dict()
    del d["host_share"], d["dispatch_path"]["host_share"]
    old = HardwareProfile.from_dict(d)
    assert old.host_share == 1.0 and old.dispatch_path.host_share == 1.0  # written before it: dedicated
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="host_share"):
            dataclasses.replace(PROF, host_share=bad)
        with pytest.raises(ValueError, match="host_share"):
            DispatchPath(host_share=bad)


def test_corun_slowdown_is_measured_kept_and_charged_to_the_one_process_stages(tmp_path):
    # measured: one loop alone, then on both cores at once; a ratio per pair; the slowdown is
    # the summed slowest concurrent time over the summed lone time, at least 1
    got = hostload.corun_slowdown(procs=2, iters=200, repeats=3)
    assert got["procs"] == 2 and len(got["ratios"]) == len(got["alone_s"]) == 3
    assert all(r > 0 for r in got["ratios"]) and all(a > 0 for a in got["alone_s"])
    summed = sum(r * a for r, a in zip(got["ratios"], got["alone_s"], strict=True)) / sum(got["alone_s"])
    assert got["corun_slowdown"] == pytest.approx(max(1.0, summed), rel=1e-3)
    assert min(1.0, min(got["ratios"])) - 1e-3 <= got["corun_slowdown"] <= max(1.0, max(got["ratios"])) + 1e-3
    # the host probe's CPU seconds per iteration, alone and on each process of a co-run
    assert len(got["probe_alone_s"]) == 3 and len(got["probe_corun_s"]) == 6
    assert all(0 < c < 0.1 for c in got["probe_alone_s"] + got["probe_corun_s"])
    assert hostload.corun_slowdown(procs=1) == {"corun_slowdown": 1.0, "procs": 1, "ratios": [], "alone_s": [],
                                                "probe_alone_s": [], "probe_corun_s": []}
    # kept: profiles carry it (1 where written before it), and refuse a speed-up
    prof = dataclasses.replace(PROF, corun_slowdown=1.3)
    assert load_profile(str(prof.save(tmp_path / "p.json"))).corun_slowdown == 1.3
    d = prof.to_dict()
    del d["corun_slowdown"]
    assert HardwareProfile.from_dict(d).corun_slowdown == 1.0
    for bad in (0.9, float("inf")):
        with pytest.raises(ValueError, match="corun_slowdown must be a finite number >= 1"):
            dataclasses.replace(PROF, corun_slowdown=bad)
    # charged: to CPU ranks that compute at once, not to one process nor to a GPU per rank
    assert (corun_stretch(prof, 2, "cpu"), corun_stretch(prof, 4, "cpu")) == (1.3, 1.3)
    assert corun_stretch(prof, 1, "cpu") == corun_stretch(prof, 4, "cuda") == 1.0


def test_validate_stretch_is_the_profiles_share_over_the_runs():
    idle = dataclasses.replace(PROF, host_share=1.0,
                               dispatch_path=dataclasses.replace(PROF.dispatch_path, host_share=1.0))
    cores = idle.dispatch_path.host_parallel
    assert cores == 2
    # no share measured: an idle host, nproc / cores above 1
    assert host_stretch(idle, 4, "cpu") == 2.0 and host_stretch(idle, 2, "cpu") == 1.0
    # measured: 4 ranks and 10 other threads on 2 cores, the profile measured at share 0.5
    loaded = dataclasses.replace(PROF, host_share=0.5)
    run = 1 / 7
    assert host_stretch(loaded, 4, "cpu", run) == pytest.approx(0.5 * 7)
    assert host_stretch(loaded, 4, "cuda", run) == 1.0
    # dispatch models its own ranks' oversubscription: only the other load is left
    assert dispatch_stretch(idle, 4, "cpu", 0.5) == pytest.approx(1.0)
    path = dataclasses.replace(PROF.dispatch_path, host_share=0.5)
    prof = dataclasses.replace(loaded, dispatch_path=path)
    assert dispatch_stretch(prof, 4, "cpu", run) == pytest.approx(0.5 * 7 / 2)


def test_fsdp_fit_recovers_constants_from_points_measured_under_load():
    """Synthetic points at per-point shares (1/6 of a core at 2 ranks, 1/5 at 4): the wall time
    is the profile-share time x host_share / share; the fit recovers the constants exactly."""
    truth = {"fsdp_unit_s": 2.5e-3, "fsdp_tensor_s": 9e-4,
             "reshard_fixed_s": 6e-4, "reshard_tensor_s": 3e-4, "reshard_byte_s": 8e-10,
             "reshard_shard_byte_s": 1.6e-9}
    # reshard_busy 1: the sync's ranks overlap nothing (the overlap factor has its own tests)
    prof = dataclasses.replace(PROF, host_share=0.4, reshard_busy=1.0)
    synth = _synthetic_points(truth, 2, prof, shares={2: 1 / 6, 4: 1 / 5})
    for p in synth:
        assert fsdpfit.price(prof, p, host_parallel=2).stretch == pytest.approx(0.4 / p.share)
    fields, quality = fsdpfit.fit_fsdp_costs(prof, synth, host_parallel=2)
    for k, v in truth.items():
        assert fields[k] == pytest.approx(v, rel=1e-6), k
    assert quality["fit_max_err"] < 1e-6


def test_shared_makespan_gives_an_early_finishers_share_to_the_rest():
    """Processor sharing on 2 cores: 4 equal works of 1 s take 2 s (all at half a core); works
    of 1, 1, 1, 3 s: three finish at 2 s (half a core each until then, the long one too), the
    long one's last 2 s run on a core of its own: 4 s, not 4/2 x 3 = 6 s; on enough cores the
    longest sets it."""
    assert hostload.shared_makespan([1, 1, 1, 1], 2) == pytest.approx(2.0)
    assert hostload.shared_makespan([3, 1, 1, 1], 2) == pytest.approx(4.0)
    assert hostload.shared_makespan([3, 1, 1, 1], 4) == pytest.approx(3.0)
    assert hostload.shared_makespan([], 2) == 0.0
    with pytest.raises(ValueError, match="cores > 0"):
        hostload.shared_makespan([1], 0)


def test_rollout_on_host_shares_the_cores_between_ranks_only_when_oversubscribed():
    """`earl validate`'s rollout on a CPU host: 4 replicas of 1, 1, 1, 3 s on 2 cores take the
    shared makespan (4 s) plus the stage's common part (0.5 s) stretched x2, times other
    tenants' load (stretch 2.2 over the idle host's 2: x1.1); on 4 cores, or on a GPU, the
    stage's seconds times the stretch, as every other stage."""
    import dataclasses

    from earl.calibrate.validate import rollout_on_host
    from earl.cost_model.profile import load_profile

    prof = load_profile("cpu-measured")
    two = dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, host_parallel=2))
    row = {"rollout_s": 3.5, "rollout_ranks_s": [1.0, 1.0, 1.0, 3.0]}
    assert rollout_on_host(row, two, 4, "cpu", 2.2) == pytest.approx(1.1 * (4.0 + 0.5 * 2))
    assert rollout_on_host(row, two, 2, "cpu", 1.0) == pytest.approx(3.5)
    assert rollout_on_host(row, two, 4, "cuda", 1.0) == pytest.approx(3.5)


def test_host_probe_reads_the_host_and_validate_scales_by_run_over_calibration(tmp_path):
    # the loop: positive CPU seconds per iteration, the same work each time (within the host's noise)
    probe = HostProbe()
    got = probe.sample(repeats=5)
    assert len(got) == 5 and all(0 < g < 0.1 for g in got)
    assert max(got) < 5 * min(got)
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        probe.time(0)
    assert median_probe([3e-4, 1e-4, 2e-4, 0.0]) == 2e-4 and median_probe([]) is None
    # the profile keeps its readings (none where written before them) and refuses a bad one
    prof = dataclasses.replace(PROF, host_probe_s=1e-4, host_probe_ranks_s={"2": 1.25e-4, "4": 2e-4})
    back = load_profile(str(prof.save(tmp_path / "p.json")))
    assert (back.host_probe_s, back.host_probe_ranks_s) == (1e-4, {"2": 1.25e-4, "4": 2e-4})
    d = prof.to_dict()
    del d["host_probe_s"], d["host_probe_ranks_s"]
    old = HardwareProfile.from_dict(d)
    assert (old.host_probe_s, old.host_probe_ranks_s) == (0.0, {})
    with pytest.raises(ValueError, match=r"host_probe_ranks_s\['2'\] must be a finite number >= 0"):
        dataclasses.replace(PROF, host_probe_ranks_s={"2": -1.0})
    with pytest.raises(ValueError, match="keys are process counts >= 2"):
        dataclasses.replace(PROF, host_probe_ranks_s={"one": 1e-4})
    # validate: the scored steps' median reading (every rank) over the calibration's at the
    # run's process count (the gloo phases' ranks), one process's for one process
    spans = [Span(name="host_probe", stage="other", rank=r, t_start=0, t_end=1, step=st, args={"probe_s": v})
             for st, r, v in ((0, 0, 9e-4), (1, 0, 1.2e-4), (1, 1, 1.5e-4), (2, 0, 1.5e-4), (2, 1, 1.6e-4))]
    assert host_speed(spans, [1, 2], prof, 2, "cpu") == (pytest.approx(1.2), 1.5e-4)
    assert host_speed(spans, [1, 2], prof, 4, "cpu")[0] == pytest.approx(0.75)
    assert host_speed(spans, [1, 2], prof, 1, "cpu")[0] == pytest.approx(1.5)
    no_gloo = dataclasses.replace(PROF, host_probe_s=1e-4, host_probe_ranks_s={})  # phases fsdp and dispatch not run
    assert host_speed(spans, [1, 2], no_gloo, 4, "cpu")[0] == pytest.approx(1.5)
    assert host_speed(spans, [1, 2], prof, 2, "cuda") == (1.0, None)  # a GPU: no host term
    assert host_speed([], [1, 2], prof, 2, "cpu") == (1.0, None)  # a run that did not read it
    unread = dataclasses.replace(PROF, host_probe_s=0.0, host_probe_ranks_s={})
    assert host_speed(spans, [1, 2], unread, 2, "cpu") == (1.0, 1.5e-4)  # a profile that did not
