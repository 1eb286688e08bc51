"""The host-load term shared by `earl calibrate` and `earl validate` (earl.calibrate.hostload):
the share of a core a busy process gets, and how the FSDP2 fit and validate's stretch use it."""

import dataclasses
import time

import pytest

from earl.calibrate import fsdpfit, hostload
from earl.calibrate.validate import dispatch_stretch, host_stretch
from earl.cost_model.profile import DispatchPath, HardwareProfile, load_profile

PROF = load_profile("cpu-measured")


def test_share_is_cores_over_runnable_threads_at_most_one():
    assert hostload.share_of(1, 1, 2) == 1.0  # an idle 2-core host
    assert hostload.share_of(4, 4, 2) == 0.5  # 4 ranks on 2 cores, nothing else
    assert hostload.share_of(14, 4, 2) == pytest.approx(1 / 7)  # and 10 other runnable threads
    assert hostload.share_of(0.5, 2, 2) == 1.0  # fewer sampled than ours: ours count
    with pytest.raises(ValueError, match="cores=0"):
        hostload.share_of(1, 1, 0)


def test_sampler_reads_procs_running_less_the_reader(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nprocs_running 9\nprocs_blocked 0\n")
    monkeypatch.setattr(hostload, "PROC_STAT", str(stat))
    assert hostload.runnable_now() == 8
    with hostload.LoadSampler(ours=2, ncores=2) as s:
        time.sleep(0.1)
        with s.paused():
            n = len(s.samples)
            time.sleep(0.1)
            assert len(s.samples) == n  # nothing sampled while paused
    assert s.samples and s.runnable() == 8 and s.share() == pytest.approx(0.25)
    assert hostload.measure_share(0.05, ours=2) == pytest.approx(min(1, hostload.cores() / 10))  # the caller's 2 added
    monkeypatch.setattr(hostload, "PROC_STAT", str(tmp_path / "absent"))
    with hostload.LoadSampler() as s:
        time.sleep(0.05)
    assert s.runnable() is None and s.share() == 1.0  # no /proc: a dedicated core


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


def test_validate_stretch_is_the_profiles_share_over_the_runs():
    idle = dataclasses.replace(PROF, host_share=1.0)
    cores = idle.dispatch_path.host_parallel
    assert cores == 2
    # no share measured: an idle host, nproc / cores above 1
    assert host_stretch(idle, 4, "cpu") == 2.0 and host_stretch(idle, 2, "cpu") == 1.0
    # measured: 4 ranks and 10 other threads on 2 cores, the profile measured at share 0.5
    loaded = dataclasses.replace(PROF, host_share=0.5)
    run = hostload.share_of(14, 4, cores)
    assert host_stretch(loaded, 4, "cpu", run) == pytest.approx(0.5 * 7)
    assert host_stretch(loaded, 4, "cuda", run) == 1.0
    # dispatch models its own ranks' oversubscription: only the other load is left
    assert dispatch_stretch(idle, 4, "cpu", hostload.share_of(4, 4, cores)) == pytest.approx(1.0)
    path = dataclasses.replace(PROF.dispatch_path, host_share=0.5)
    prof = dataclasses.replace(loaded, dispatch_path=path)
    assert dispatch_stretch(prof, 4, "cpu", run) == pytest.approx(0.5 * 7 / 2)


def test_fsdp_fit_recovers_constants_from_points_measured_under_load():
    """Synthetic points at per-point shares (10 other threads at 2 ranks, 6 at 4): the wall time
    is the profile-share time x host_share / share; the fit recovers the constants exactly."""
    truth = {"fsdp_unit_s": 2.5e-3, "fsdp_tensor_s": 9e-4, "reshard_tensor_s": 3e-4}
    prof = dataclasses.replace(PROF, host_share=0.4)
    points = []
    for n, others in ((2, 10), (4, 6)):
        share = hostload.share_of(n + others, n, 2)
        for case in fsdpfit.TRAIN_CASES:
            layers, seqs, longest, budget = case
            mbs = max(len(fsdpfit.pack_micro_batches(
                [fsdpfit.lengths(seqs, longest)[i] for i in fsdpfit.rank_share(seqs, n, r)], budget))
                for r in range(n))
            points.append(fsdpfit.FsdpPoint(kind="train", procs=n, layers=layers, label=fsdpfit.label(case),
                                            measured_s=0.0, share=share,
                                            counts={"fsdp_unit_s": (layers + 1) * mbs,
                                                    "fsdp_tensor_s": 12 * layers + 2}))
        for layers in (2, 4):
            points.append(fsdpfit.FsdpPoint(kind="sync", procs=n, layers=layers, label="sync", measured_s=0.0,
                                            share=share, counts={"reshard_tensor_s": (12 * layers + 2) * (n - 1)}))
    synth = []
    for p in points:
        priced = fsdpfit.price(prof, p, host_parallel=2)
        assert priced.stretch == pytest.approx(0.4 / p.share)
        synth.append(dataclasses.replace(p, measured_s=(priced.priced_s + sum(
            truth[f] * c for f, c in p.counts.items())) * priced.stretch))
    fields, quality = fsdpfit.fit_fsdp_costs(prof, synth, host_parallel=2)
    for k, v in truth.items():
        assert fields[k] == pytest.approx(v, rel=1e-6), k
    assert quality["fit_max_err"] < 1e-6
