"""The one dispatch price (earl.cost_model.dispatch): what it prices is the dispatcher's plan;
its path terms; the EARL paper's Fig. 4 reproduction; the simulator uses it; the dispatch-path
fit recovers known parameters.

    python -m pytest -q tests/cost_model/test_dispatch_price.py
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from earl.calibrate import dispatchfit
from earl.cost_model import comm
from earl.cost_model.dispatch import price_transfer_plan, stat_reductions, sync_rounds
from earl.cost_model.profile import HardwareProfile, load_profile, with_controller_path
from earl.cost_model.resolve import make_cost_model
from earl.policies import make_dispatcher
from earl.policies.dispatch_cost import dispatch_layouts, estimate_dispatch
from earl.specs import ParallelPlan


def _cpu_profile() -> HardwareProfile:
    """The shipped CPU calibration with the dispatch-side terms these tests do not set themselves
    at their "not measured" values (a cold start's per-byte part, the hand-off's per-sample part,
    the weight sync's wake-up, the ranks' spread and cold-cache factor): each test prices the terms
    it names, against a profile where the rest are the model's zeros."""
    prof = load_profile("cpu-measured")
    return dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, cold_byte_s=0.0),
                               handoff_sample_s=0.0, reshard_wake_s=0.0, host_spread=0.0, host_cold_factor=1.0)

# EARL paper (Tan et al. 2025, Fig. 4): centralized / layout-aware dispatch latency measured on
# 128 H100 over 200 Gbps TCP, Qwen2.5-72B, tp4, batch 1024
PAPER_FIG4 = {8192: 9.7, 16384: 11.0, 32768: 11.2}


def paper_cm(network="tcp-200g"):
    return make_cost_model("qwen2.5-72b", "h100-sxm-80gb", 128, network)


@pytest.mark.parametrize("context", sorted(PAPER_FIG4))
def test_paper_fig4_ratio_within_30_percent(context):
    cm = paper_cm()
    plan = ParallelPlan(tp=4, dp=-1).resolve(128)
    c = estimate_dispatch(cm, "centralized", plan, plan, 1024, context)
    a = estimate_dispatch(cm, "layout-aware", plan, plan, 1024, context)
    assert c.time_s / a.time_s == pytest.approx(PAPER_FIG4[context], rel=0.30)


def test_paper_ratio_rests_on_tcp_incast_and_controller_path():
    """The assumptions move the headline: no incast loss or an object-store controller make the
    ratio much larger (study s8 reports by how much)."""
    plan = ParallelPlan(tp=4, dp=-1).resolve(128)
    base = paper_cm()

    def ratio(cm):
        return (estimate_dispatch(cm, "centralized", plan, plan, 1024, 32768).time_s
                / estimate_dispatch(cm, "layout-aware", plan, plan, 1024, 32768).time_s)

    no_incast = make_cost_model("qwen2.5-72b", "h100-sxm-80gb", 128, "rdma-200g")
    store = base.with_profile(with_controller_path(base.profile, "object-store"))
    assert ratio(no_incast) > 1.5 * ratio(base)
    assert ratio(store) > 10 * ratio(base)
    # the object store caps the controller: every byte it moves at <= 0.8 GB/s
    c = estimate_dispatch(store, "centralized", plan, plan, 1024, 32768)
    assert c.time_s >= c.extras["controller_bytes"] / 0.8e9


def test_priced_bytes_are_the_plans_bytes_first_stage_gets_only_ids():
    cm = paper_cm()
    src = ParallelPlan(tp=8, dp=-1).resolve(128)
    dst = ParallelPlan(tp=8, pp=4, dp=-1).resolve(128)
    samples, s_layout, d_layout = dispatch_layouts(src, dst, 512, 8192)
    for kind in ("centralized", "layout-aware"):
        tplan = make_dispatcher(kind).plan(s_layout, d_layout, samples)
        est = estimate_dispatch(cm, kind, src, dst, 512, 8192)
        assert est.extras["moved_bytes"] == tplan.total_bytes
    # the last stage's tp ranks need 21 B/token, the first stage's only the 8 B of input_ids:
    # far less than charging every tensor to both pipeline edges (the removed closed form)
    la = estimate_dispatch(cm, "layout-aware", src, dst, 512, 8192)
    full = 512 * 8192 * 21 * 8 * 2
    assert la.extras["moved_bytes"] < 0.8 * full


def test_layout_aware_wins_at_scale_and_controller_carries_only_metadata():
    cm = paper_cm()
    plan = ParallelPlan(tp=8, dp=-1).resolve(128)
    c = estimate_dispatch(cm, "centralized", plan, plan, 512, 16384)
    a = estimate_dispatch(cm, "layout-aware", plan, plan, 512, 16384)
    assert c.time_s > 5 * a.time_s
    assert c.extras["controller_bytes"] > 1000 * a.extras["controller_bytes"]
    assert set(c.breakdown) >= {"gather", "scatter", "advantages"}
    assert set(a.breakdown) >= {"alltoall", "advantage_stats", "advantages"}


def test_host_parallel_caps_a_node_and_oversubscription_adds_rounds():
    prof = _cpu_profile()
    path = prof.dispatch_path
    one = dataclasses.replace(prof, dispatch_path=dataclasses.replace(path, host_parallel=1))
    many = dataclasses.replace(prof, dispatch_path=dataclasses.replace(path, host_parallel=64, sync_s=0.0))
    t_one = dispatchfit.predict(one, 8, 4, 8192)["layout-aware"]
    t_many = dispatchfit.predict(many, 8, 4, 8192)["layout-aware"]
    assert t_one > 2 * t_many  # eight processes on one core vs. on their own cores


def test_price_needs_positive_counts():
    cm = paper_cm()
    plan = ParallelPlan(tp=4, dp=-1).resolve(128)
    samples, s, d = dispatch_layouts(plan, plan, 64, 128)
    tplan = make_dispatcher("layout-aware").plan(s, d, samples)
    with pytest.raises(ValueError, match="samples, producers and world"):
        price_transfer_plan(cm, tplan, samples=0, producers=1, world=128)


def test_profile_round_trips_dispatch_path_with_infinite_controller(tmp_path):
    prof = load_profile("h100-sxm-80gb")
    assert prof.dispatch_path.controller_bw_bytes_s == float("inf")
    path = prof.save(tmp_path / "p.json")
    assert json.loads(path.read_text())["dispatch_path"]["controller_bw_bytes_s"] is None
    back = load_profile(path)
    assert back.dispatch_path == prof.dispatch_path
    store = with_controller_path(prof, "object-store")
    assert HardwareProfile.from_dict(json.loads(json.dumps(store.to_dict()))).dispatch_path == store.dispatch_path
    with pytest.raises(ValueError, match="controller path"):
        with_controller_path(prof, "carrier-pigeon")


def test_shipped_cpu_profile_has_a_fitted_dispatch_path():
    prof = load_profile("cpu-measured")
    assert "dispatch" in prof.stamp["measured"]
    assert not prof.dispatch_path.full_duplex and prof.dispatch_path.host_parallel >= 1
    assert prof.fit_quality["dispatch_path"]["n"] >= 10


@pytest.mark.parametrize("loop_extra", [0.0, 1.5e-3])
def test_fit_recovers_known_parameters_from_synthetic_points(loop_extra):
    """The rounds' terms come from the points' measured rounds (2 processes on 2 cores: round_s;
    4: round_s + sync_s); the fit then recovers the per-message cost through the one price, and
    the oversubscribed round from the executor's runs themselves where the barrier loop measured
    a worse one (`loop_extra` above the truth: the loop's every rank asleep at every round)."""
    prof = _cpu_profile()
    truth = dataclasses.replace(prof.dispatch_path, message_s=150e-6, round_s=4e-4, sync_s=1e-3, host_parallel=2,
                                full_duplex=False, reduce_s=3e-4, reduce_sync_s=6e-4)
    true_prof = dataclasses.replace(prof, dispatch_path=truth)
    points = []
    for n in (2, 4):
        for per, ctx in dispatchfit.CASES:
            for kind, t in dispatchfit.predict(true_prof, n, per, ctx).items():
                points.append(dispatchfit.DispatchPoint(procs=n, per_rank=per, context=ctx, kind=kind,
                                                        seconds=t, busiest_bytes=0.0,
                                                        round_s=truth.round_cost_s(n) + loop_extra * (n > 2),
                                                        reduce_s=truth.reduce_cost_s(n)))
    host = {"object_s": truth.object_s, "copy_bw_bytes_s": truth.copy_bw_bytes_s, "sample_s": truth.sample_s}
    path, quality = dispatchfit.fit_dispatch_path(prof, points, host, host_parallel=2)
    assert quality["fit_max_err"] < 1e-3
    assert path.message_s == pytest.approx(150e-6, rel=0.02)
    assert (path.round_s, path.sync_s) == (pytest.approx(4e-4), pytest.approx(1e-3, rel=0.02))
    assert (quality["round_s"], quality["sync_s"]) == (path.round_s, path.sync_s)
    assert quality["sync_s_loop"] == pytest.approx(1e-3 + loop_extra)
    # the loop's figure is kept for the runtime's rounds, whose ranks arrive asleep
    assert path.wake_sync_s == quality["sync_s_loop"] == pytest.approx(1e-3 + loop_extra)
    # the reduction's terms are the loop's, as measured (2: reduce_s; 4: reduce_s + reduce_sync_s)
    assert (path.reduce_s, path.reduce_sync_s) == (pytest.approx(3e-4), pytest.approx(6e-4))
    assert (quality["reduce_s"], quality["reduce_sync_s"]) == (path.reduce_s, path.reduce_sync_s)
    # points without round or reduction measurements keep the profile's terms
    plain = [dataclasses.replace(p, round_s=float("nan"), reduce_s=float("nan")) for p in points]
    kept = dispatchfit.fit_dispatch_path(true_prof, plain, host, host_parallel=2)[0]
    assert (kept.round_s, kept.sync_s, kept.reduce_s, kept.reduce_sync_s, kept.wake_sync_s) == \
        (truth.round_s, truth.sync_s, truth.reduce_s, truth.reduce_sync_s, truth.wake_sync_s)


def test_a_runtime_dispatchs_rounds_beyond_the_cores_cost_the_wake_up_loop():
    """With its control plane (a runtime step's dispatch, whose ranks come to its rounds from
    other work) a round of more processes than cores costs round_s + the larger of sync_s and
    wake_sync_s (the barrier loop's figure); the executor alone (control=False, as the
    calibration's points and the benchmarks run it back to back) pays sync_s; at or under the
    cores, and on a profile that measured no wake-up (0), nothing changes."""
    prof = _cpu_profile()
    path = dataclasses.replace(prof.dispatch_path, round_s=5e-4, sync_s=2e-4, wake_sync_s=1.8e-3, host_parallel=2)
    woken = dataclasses.replace(prof, dispatch_path=path)
    plain = dataclasses.replace(prof, dispatch_path=dataclasses.replace(path, wake_sync_s=0.0))
    assert (path.round_cost_s(4), path.round_cost_s(4, asleep=True)) == (7e-4, pytest.approx(2.3e-3))
    assert path.round_cost_s(2, asleep=True) == path.round_cost_s(2) == 5e-4
    assert dataclasses.replace(path, sync_s=3e-3).round_cost_s(4, asleep=True) == pytest.approx(3.5e-3)
    for n in (2, 4):
        tplan = dispatchfit.runtime_plans(n, 4, 2048)["layout-aware"]
        rounds = sync_rounds(tplan)
        assert rounds >= 1
        price = {(p is woken, control): price_transfer_plan(dispatchfit.local_cost_model(p, n), tplan,
                                                             samples=4 * n, producers=n, world=n, control=control)
                 for p in (woken, plain) for control in (True, False)}
        extra = rounds * (1.8e-3 - 2e-4) if n > 2 else 0.0
        woken_rounds, plain_rounds = price[(True, True)].breakdown["rounds"], price[(False, True)].breakdown["rounds"]
        assert woken_rounds == pytest.approx(plain_rounds + extra)
        assert price[(True, True)].time_s == pytest.approx(price[(False, True)].time_s + extra)
        assert price[(True, False)].time_s == price[(False, False)].time_s  # back to back: sync_s


def test_a_runtime_dispatchs_asleep_rounds_take_the_weight_syncs_wake_term_where_larger():
    """The staggered weight sync's wake-up term (HardwareProfile.reshard_wake_s, ranks asleep in a
    gloo receive until a late peer sends) prices a runtime dispatch's rounds beyond the cores where
    it exceeds the barrier loop's wake_sync_s (as under SCHED_BATCH loop threads); where it is
    smaller, at or under the cores, and for the executor alone (control=False), nothing changes."""
    prof = _cpu_profile()
    path = dataclasses.replace(prof.dispatch_path, round_s=5e-4, sync_s=2e-4, wake_sync_s=3e-4, host_parallel=2)
    assert path.round_cost_s(4, asleep=True, wake_s=1.1e-3) == pytest.approx(5e-4 + 1.1e-3)
    assert path.round_cost_s(4, asleep=True, wake_s=1e-4) == pytest.approx(5e-4 + 3e-4)
    assert path.round_cost_s(4, wake_s=1.1e-3) == pytest.approx(7e-4)  # awake: sync_s
    assert path.round_cost_s(2, asleep=True, wake_s=1.1e-3) == 5e-4
    base = dataclasses.replace(prof, dispatch_path=path, reshard_wake_s=0.0)
    for n in (2, 4):
        tplan = dispatchfit.runtime_plans(n, 4, 2048)["layout-aware"]
        rounds = sync_rounds(tplan)
        for wake in (1.1e-3, 1e-4):
            woken = dataclasses.replace(base, reshard_wake_s=wake)
            price = {(p is woken, control): price_transfer_plan(dispatchfit.local_cost_model(p, n), tplan,
                                                                 samples=4 * n, producers=n, world=n, control=control)
                     for p in (woken, base) for control in (True, False)}
            extra = rounds * max(0.0, wake - 3e-4) if n > 2 else 0.0
            assert price[(True, True)].time_s == pytest.approx(price[(False, True)].time_s + extra)
            assert price[(True, False)].time_s == price[(False, False)].time_s


def test_every_synchronising_round_costs_the_measured_round():
    """A dispatch over N processes pays each of its sync_rounds at DispatchPath.round_cost_s(N):
    round_s while the node's processes fit its cores, + sync_s beyond; a statistics reduction's
    two rounds at DispatchPath.reduce_cost_s(N), two rounds where the profile measured no
    reduction; the measured rounds stand for the statistics all-reduce's latency (the link's
    alpha)."""
    prof = _cpu_profile()
    path = dataclasses.replace(prof.dispatch_path, round_s=5e-4, sync_s=2e-3, host_parallel=2, reduce_s=0.0,
                               reduce_sync_s=0.0)
    with_rounds = dataclasses.replace(prof, dispatch_path=path)
    reduced = dataclasses.replace(prof, dispatch_path=dataclasses.replace(path, reduce_s=3e-4, reduce_sync_s=7e-4))
    none = dataclasses.replace(prof, dispatch_path=dataclasses.replace(path, round_s=0.0, sync_s=0.0, wake_sync_s=0.0))
    assert (path.round_cost_s(2), path.round_cost_s(4)) == (5e-4, 2.5e-3)
    assert (path.reduce_cost_s(2), path.reduce_cost_s(4)) == (1e-3, 5e-3)  # not measured: two rounds
    assert (reduced.dispatch_path.reduce_cost_s(2), reduced.dispatch_path.reduce_cost_s(4)) == (3e-4, 1e-3)
    for n in (2, 4):
        for kind, tplan in dispatchfit.transfer_plans(n, 4, 2048).items():
            a, b, c = (price_transfer_plan(dispatchfit.local_cost_model(p, n), tplan, samples=4 * n, producers=n,
                                           world=n) for p in (with_rounds, none, reduced))
            k = stat_reductions(tplan)
            assert k == (1 if tplan.reduce_bytes else 0), kind
            assert a.breakdown["rounds"] == pytest.approx((sync_rounds(tplan) - 2 * k) * path.round_cost_s(n)), kind
            assert c.breakdown["rounds"] == a.breakdown["rounds"]
            assert "rounds" not in b.breakdown
            assert {k: v for k, v in a.breakdown.items() if k not in ("rounds", "advantage_stats")} == \
                {k: v for k, v in b.breakdown.items() if k != "advantage_stats"}
            if tplan.reduce_bytes:  # the link's bytes term without its alpha, and the measured reduction
                link = comm.group_link(dispatchfit.local_cost_model(prof, n).cluster, prof, n, collective="allreduce")
                moved = comm.allreduce_s(tplan.reduce_bytes, n, dataclasses.replace(link, alpha_s=0.0))
                assert a.breakdown["advantage_stats"] == pytest.approx(moved + 2 * path.round_cost_s(n))
                red = reduced.dispatch_path.reduce_cost_s(n)
                assert c.breakdown["advantage_stats"] == pytest.approx(moved + red)
                assert a.time_s == pytest.approx(c.time_s + 2 * path.round_cost_s(n) - red)
    one = price_transfer_plan(dispatchfit.local_cost_model(with_rounds, 1), tplan, samples=4, producers=1, world=1)
    assert "rounds" not in one.breakdown  # one process: no executor runs


def test_reduce_seconds_times_the_runtimes_reduction_on_gloo_ranks():
    """The calibration's reading of a statistics reduction: the runtime's own per-turn advantage
    code on real gloo ranks (the turn count known, as the runtime's metadata gives it: one
    reduction), less its local work; every rank returns the same slowest-rank figure, a
    positive time well under a second."""
    from earl.runtime.dist import run_local

    got = run_local(dispatchfit.reduce_seconds, 2, 3, 8, timeout_s=120)
    assert len(got) == 2 and got[0] == got[1]
    assert 0 < got[0] < 0.5


def test_quick_fit_keeps_the_oversubscription_terms():
    """Two processes on two cores never oversubscribe: a quick (2-process) fit moves only the
    per-message cost and keeps the base profile's sync_s (no point measured a round beyond the
    cores) and oversubscribed_exp (a full fit once returned it at its starting guess)."""
    prof = _cpu_profile()
    truth = dataclasses.replace(prof.dispatch_path, message_s=150e-6, host_parallel=2, full_duplex=False)
    true_prof = dataclasses.replace(prof, dispatch_path=truth)
    points = [dispatchfit.DispatchPoint(procs=2, per_rank=per, context=ctx, kind=kind, seconds=t, busiest_bytes=0.0)
              for per, ctx in dispatchfit.CASES[:3]
              for kind, t in dispatchfit.predict(true_prof, 2, per, ctx).items()]
    host = {"object_s": truth.object_s, "copy_bw_bytes_s": truth.copy_bw_bytes_s, "sample_s": truth.sample_s}
    path, _ = dispatchfit.fit_dispatch_path(prof, points, host, host_parallel=2, message_only=True)
    assert path.message_s == pytest.approx(150e-6, rel=0.02)
    assert (path.sync_s, path.oversubscribed_exp) == (prof.dispatch_path.sync_s, prof.dispatch_path.oversubscribed_exp)


def _skewed_span_worker():
    """Rank 1 starts 0.1 s after rank 0 and runs 0.05 s; rank 0 runs 0.2 s (both from a common
    barrier): read as the calibration reads a dispatch."""
    import time

    import torch.distributed as dist

    dist.barrier()
    base = time.perf_counter()
    late = dist.get_rank() == 1
    if late:
        time.sleep(0.1)
    t0 = time.perf_counter()
    time.sleep(0.05 if late else 0.2)
    return dispatchfit._last_start_to_end(t0, time.perf_counter(), float(dist.get_rank() + 7)), \
        time.perf_counter() - base


def test_a_point_is_read_from_the_last_start_to_the_last_end():
    """`earl calibrate` reads a dispatch as `earl validate` reads the runtime's: from the last
    rank's start (here the late rank's, 0.1 s in) to the last rank's end (the early rank's, 0.2
    s in), 0.1 s, not the slowest rank's 0.2 s; every rank gets the same reading and the largest
    `extra`, in float64 (seconds since boot)."""
    from earl.runtime.dist import run_local

    got = run_local(_skewed_span_worker, 2, timeout_s=120)
    (a, extra_a), _ = got[0]
    (b, extra_b), _ = got[1]
    assert a == b and extra_a == extra_b == 8.0
    assert 0.08 < a < 0.14, a


def _timed_worker():
    """One calibration dispatch per dispatcher on this gloo rank, timed as `measure` times it."""
    import torch.distributed as dist

    samples, src, dst = dispatchfit.layouts(dist.get_world_size(), 2, 256)
    store = dispatchfit._store(samples, src, dist.get_rank())
    rewards = {s.id: dispatchfit.sample_reward(s.id) for s in samples}
    out = {}
    for kind, tplan in dispatchfit.runtime_plans(dist.get_world_size(), 2, 256).items():
        _, stats = dispatchfit._timed_call(tplan, store, samples, src, dst, check=True, rewards=rewards)
        out[kind] = (stats.reductions, stats.waited)
    return out


def test_the_gloo_points_dispatch_as_the_runtime_does_and_old_points_keep_their_reduction():
    """The calibration's gloo points run the training dispatch as the runtime now does (every
    rank holds the statistics: no reduction, still a phase that sends), and the fit
    prices them so (`runtime_plans`); points recorded before (one reduction each,
    `DispatchPoint.reductions`) are priced with theirs, and the fit recovers the same path from
    either."""
    from earl.runtime.dist import run_local

    got = run_local(_timed_worker, 2, timeout_s=120)
    assert got[0] == got[1] == {"centralized": (0, True), "layout-aware": (0, True)}
    prof = _cpu_profile()
    truth = dataclasses.replace(prof.dispatch_path, message_s=150e-6, round_s=4e-4, sync_s=1e-3, host_parallel=2,
                                full_duplex=False, reduce_s=3e-4, reduce_sync_s=6e-4)
    true_prof = dataclasses.replace(prof, dispatch_path=truth)
    fits = {}
    for reductions in (0, 1):
        points = []
        for n in (2, 4):
            cm = dispatchfit.local_cost_model(true_prof, n)
            plans = (dispatchfit.transfer_plans if reductions else dispatchfit.runtime_plans)(n, 4, 2048)
            assert bool(plans["layout-aware"].reduce_bytes) == bool(reductions)
            for per, ctx in dispatchfit.CASES:
                for kind, tp in (dispatchfit.transfer_plans if reductions else dispatchfit.runtime_plans)(
                        n, per, ctx).items():
                    t = price_transfer_plan(cm, tp, samples=n * per, producers=n, world=n, control=False).time_s
                    points.append(dispatchfit.DispatchPoint(
                        procs=n, per_rank=per, context=ctx, kind=kind, seconds=t, busiest_bytes=0.0,
                        round_s=truth.round_cost_s(n), reduce_s=truth.reduce_cost_s(n), reductions=reductions))
        host = {"object_s": truth.object_s, "copy_bw_bytes_s": truth.copy_bw_bytes_s, "sample_s": truth.sample_s}
        path, quality = dispatchfit.fit_dispatch_path(prof, points, host, host_parallel=2)
        assert quality["fit_max_err"] < 1e-3 and quality["reductions"] == reductions
        fits[reductions] = path
    assert fits[0].message_s == pytest.approx(150e-6, rel=0.02) == fits[1].message_s
    assert fits[0].sync_s == pytest.approx(fits[1].sync_s, rel=0.02)


@pytest.mark.slow
def test_gloo_measurement_runs_both_dispatchers():
    pts = dispatchfit.measure(procs=(2,), cases=((2, 256),), repeats=1, trials=1)
    assert {p.kind for p in pts} == {"centralized", "layout-aware"}
    assert all(p.seconds > 0 and p.busiest_bytes > 0 for p in pts)


def test_one_process_dispatch_is_its_calibrated_host_cost():
    """On one process the runtime re-orders rows in place: dispatch_fixed_s + dispatch_seq_s."""
    prof = _cpu_profile()
    cm = dispatchfit.local_cost_model(prof, 1)
    samples, s, d = dispatch_layouts(ParallelPlan(), ParallelPlan(), 16, 150)
    est = price_transfer_plan(cm, make_dispatcher("layout-aware").plan(s, d, samples), samples=16, producers=1,
                              world=1)
    assert est.time_s == pytest.approx(prof.dispatch_fixed_s + 16 * prof.dispatch_seq_s)


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_a_handoff_that_waits_for_no_one_is_its_calibrated_host_work(dp):
    """The hand-off onto the aligned layout (or any on one process) runs no executor round:
    each rank builds and copies its own episodes' rows and plans and checks the whole step's,
    priced handoff_fixed_s + per episode + per token of the busiest rank + per episode of the
    step (earl.calibrate.hostcost fits them in one process, at rank shares too);
    a hand-off that moves episodes keeps the dispatch price, and a profile fitted before the
    terms existed (all 0) prices every hand-off as the dispatch it is."""
    from earl.cost_model.dispatch import delivered
    from earl.policies.balance import balance_aligned
    from earl.policies.types import Layout, Sample

    prof = dataclasses.replace(_cpu_profile(), handoff_fixed_s=1e-3, handoff_seq_s=2e-4,
                               handoff_token_s=1e-6, handoff_sample_s=3e-5)
    samples = [Sample(id=i, tokens=100 + 37 * i, group=i // 4) for i in range(16)]
    plan = ParallelPlan(dp=dp)
    src = tuple(tuple(i for i in range(16) if i % dp == d) for d in range(dp))
    aligned = Layout(plan, tuple(tuple(g) for g in balance_aligned(samples, dp, src)[0]))
    hand = make_dispatcher("layout-aware").plan(Layout(plan, src), aligned, samples)
    held = {r: (len(aligned.assignment[r]), sum(samples[i].tokens for i in aligned.assignment[r]))
            for r in range(dp)}
    assert delivered(hand) == held
    cm = dispatchfit.local_cost_model(prof, dp)
    est = price_transfer_plan(cm, hand, samples=16, producers=dp, world=dp, advantages=False)
    assert est.time_s == pytest.approx(1e-3 + max(2e-4 * n + 1e-6 * t for n, t in held.values()) + 16 * 3e-5)
    assert est.extras["moved_bytes"] == 0 and "rounds" not in est.breakdown and not est.extras["waits"]
    # without the terms: the dispatch price (one process: dispatch_fixed_s + dispatch_seq_s)
    old = dataclasses.replace(prof, handoff_fixed_s=0.0, handoff_seq_s=0.0, handoff_token_s=0.0,
                              handoff_sample_s=0.0)
    before = price_transfer_plan(dispatchfit.local_cost_model(old, dp), hand, samples=16, producers=dp, world=dp,
                                 advantages=False)
    assert before.time_s != pytest.approx(est.time_s)
    if dp == 1:
        assert before.time_s == pytest.approx(old.dispatch_fixed_s + 16 * old.dispatch_seq_s)
        return
    # a hand-off that sends between ranks waits for its peers: the dispatch price, rounds and all
    moved = make_dispatcher("layout-aware").plan(Layout(plan, src), Layout(plan, src[1:] + src[:1]), samples)
    assert moved.talking_phases == 1
    a, b = (price_transfer_plan(dispatchfit.local_cost_model(p, dp), moved, samples=16, producers=dp, world=dp,
                                advantages=False) for p in (prof, old))
    assert a.time_s == pytest.approx(b.time_s) and a.breakdown["rounds"] > 0 and a.extras["waits"]


def test_handoff_is_priced_without_advantages():
    """The rollout -> experience hand-off runs the same plan with tensors only
    (`execute_dispatch(tensors=...)`): no advantage host work, no statistics all-reduce and
    none of its two synchronising rounds; the moves themselves cost the same."""
    prof = _cpu_profile()
    cm = dispatchfit.local_cost_model(prof, 2)
    for kind, tplan in dispatchfit.transfer_plans(2, 4, 2048).items():
        full = price_transfer_plan(cm, tplan, samples=8, producers=2, world=2)
        hand = price_transfer_plan(cm, tplan, samples=8, producers=2, world=2, advantages=False)
        assert "advantages" in full.breakdown and "advantages" not in hand.breakdown
        assert "advantage_stats" not in hand.breakdown
        rounds = len(tplan.phases)  # each phase talks; no start barrier
        assert hand.breakdown["cold_start"] == pytest.approx(rounds * prof.dispatch_path.cold_round_s)
        moves = [k for k in hand.breakdown if k in ("alltoall", "gather", "scatter")]
        assert moves and all(hand.breakdown[k] == full.breakdown[k] for k in moves), kind
        assert hand.time_s < full.time_s
        assert tplan.reduce_bytes == 0 or "advantage_stats" in full.breakdown


@pytest.mark.parametrize("dp", [2, 4])
def test_a_phase_of_local_copies_is_no_round(dp):
    """The runtime's hand-off onto the layout aligned with the rollout's (`balance_aligned`, as
    earl.runtime.step.prepare_experience builds it) copies every episode where it was played:
    its one phase sends nothing between ranks and it reduces no statistics, so it waits for no
    one: no round; a dispatch whose phase sends is one, plus the statistics' two."""
    from earl.policies.balance import balance_aligned, balance_samples
    from earl.policies.types import Layout, Sample

    samples = [Sample(id=i, tokens=100 + 37 * i) for i in range(16)]
    plan = ParallelPlan(dp=dp)
    src = tuple(tuple(i for i in range(16) if i % dp == d) for d in range(dp))
    aligned = Layout(plan, tuple(tuple(g) for g in balance_aligned(samples, dp, src)[0]))
    hand = make_dispatcher("layout-aware").plan(Layout(plan, src), aligned, samples)
    assert hand.transfers and all(tr.src == tr.dst for tr in hand.transfers)
    assert hand.talking_phases == 0 and hand.waits_for_peers  # the plan's statistics: a dispatch's
    assert sync_rounds(dataclasses.replace(hand, reduce_bytes=0)) == 0  # the hand-off reduces none
    moved = make_dispatcher("layout-aware").plan(aligned, Layout(plan, balance_samples(samples, dp)[0]), samples)
    assert any(tr.src != tr.dst for tr in moved.transfers)
    assert sync_rounds(moved) == len(moved.phases) + (2 if moved.reduce_bytes else 0)
    prof = _cpu_profile()
    est = price_transfer_plan(dispatchfit.local_cost_model(prof, dp), hand, samples=16, producers=dp, world=dp,
                              advantages=False)
    assert "rounds" not in est.breakdown and "cold_start" not in est.breakdown
    full = price_transfer_plan(dispatchfit.local_cost_model(prof, dp), moved, samples=16, producers=dp, world=dp)
    assert full.breakdown["rounds"] == pytest.approx((sync_rounds(moved) - 2 * stat_reductions(moved))
                                                     * prof.dispatch_path.round_cost_s(dp, asleep=True))


def _cold_points(prof, per_round: float, per_byte: float):
    """Gloo points of `prof`'s dispatch path (2 and 4 processes, the calibration's cases) whose
    cold runs took warm + rounds x `per_round` + the busiest rank's bytes x `per_byte`, and the
    host terms to fit them with."""
    truth = dataclasses.replace(prof.dispatch_path, host_parallel=2, full_duplex=False)
    true_prof = dataclasses.replace(prof, dispatch_path=truth)
    points = []
    for n in (2, 4):
        for per, ctx in dispatchfit.CASES:
            plans = dispatchfit.runtime_plans(n, per, ctx)
            for kind, t in dispatchfit.predict(true_prof, n, per, ctx).items():
                moved = price_transfer_plan(dispatchfit.local_cost_model(true_prof, n), plans[kind], samples=n * per,
                                            producers=n, world=n, control=False).extras["busiest_rank_bytes"]
                extra = sync_rounds(plans[kind]) * per_round + moved * per_byte
                points.append(dispatchfit.DispatchPoint(procs=n, per_rank=per, context=ctx, kind=kind, seconds=t,
                                                        busiest_bytes=0.0, cold_seconds=t + extra))
    return points, {"object_s": truth.object_s, "copy_bw_bytes_s": truth.copy_bw_bytes_s, "sample_s": truth.sample_s}


def test_cold_start_is_rounds_times_a_fitted_constant():
    """A dispatch inside a step (control=True) pays `cold_round_s` per synchronising round of
    the executor (sync_rounds: its phases, the advantage statistics' two rounds);
    a benchmark's back-to-back dispatch (control=False) does not; the fit recovers the constant
    from the cold runs' extra time."""
    prof = _cpu_profile()
    cold = dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, cold_round_s=5e-4))
    warm = dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, cold_round_s=0.0))
    for kind, tplan in dispatchfit.transfer_plans(2, 4, 2048).items():
        rounds = sync_rounds(tplan)
        assert rounds == len(tplan.phases) + (2 if tplan.reduce_bytes else 0)  # every phase talks
        assert rounds == {"centralized": 2, "layout-aware": 3}[kind]
        c, w = (price_transfer_plan(dispatchfit.local_cost_model(p, 2), tplan, samples=8, producers=2, world=2)
                for p in (cold, warm))
        assert c.time_s - w.time_s == pytest.approx(rounds * 5e-4)
        assert c.breakdown["cold_start"] == pytest.approx(rounds * 5e-4) and "cold_start" not in w.breakdown
        back_to_back = price_transfer_plan(dispatchfit.local_cost_model(cold, 2), tplan, samples=8, producers=2,
                                           world=2, control=False)
        assert "cold_start" not in back_to_back.breakdown
        # no log-prob pass since the hand-off ran the executor: it starts warm, nothing else moves
        after_handoff = price_transfer_plan(dispatchfit.local_cost_model(cold, 2), tplan, samples=8, producers=2,
                                            world=2, cold=False)
        assert "cold_start" not in after_handoff.breakdown and after_handoff.time_s == pytest.approx(w.time_s)
    one = price_transfer_plan(dispatchfit.local_cost_model(cold, 1), tplan, samples=8, producers=1, world=1)
    assert "cold_start" not in one.breakdown  # one process: no executor runs
    # the fit: cold runs measured at warm + rounds x 0.7 ms
    points, host = _cold_points(prof, 7e-4, 0.0)
    path, quality = dispatchfit.fit_dispatch_path(prof, points, host, host_parallel=2)
    assert path.cold_round_s == pytest.approx(7e-4, rel=0.02) and quality["cold_round_s"] == path.cold_round_s
    # points measured without cold runs keep the profile's constant
    plain = [dataclasses.replace(p, cold_seconds=float("nan")) for p in points]
    assert dispatchfit.fit_dispatch_path(cold, plain, host, host_parallel=2)[0].cold_round_s == 5e-4


def test_cold_start_also_pays_per_byte_and_the_fit_separates_rounds_from_bytes():
    """`cold_byte_s`: a cold dispatch pays rounds x cold_round_s + the busiest rank's bytes x
    cold_byte_s; `fit_cold` recovers both from (rounds, bytes, cold - warm) points, and a single
    repeat that met a spinning loop (+2 ms) does not pull them; the calibration's fit stores both."""
    prof = _cpu_profile()
    path = dataclasses.replace(prof.dispatch_path, cold_round_s=1e-4, cold_byte_s=2e-11)
    cold = dataclasses.replace(prof, dispatch_path=path)
    tplan = dispatchfit.transfer_plans(2, 4, 2048)["layout-aware"]
    est = price_transfer_plan(dispatchfit.local_cost_model(cold, 2), tplan, samples=8, producers=2, world=2)
    busiest = est.extras["busiest_rank_bytes"]
    assert busiest > 0
    assert est.breakdown["cold_start"] == pytest.approx(sync_rounds(tplan) * 1e-4 + busiest * 2e-11)
    with pytest.raises(ValueError, match="cold_byte_s"):
        dataclasses.replace(path, cold_byte_s=-1.0)
    pts = [(r, b, r * 1e-4 + b * 2e-11) for r in (1, 2, 3) for b in (2e4, 1e6, 8e6, 1.6e7)]
    pts.append((1, 1e6, 1e-4 + 1e6 * 2e-11 + 2e-3))  # one outlier
    a, b = dispatchfit.fit_cold(pts)
    assert a == pytest.approx(1e-4, rel=0.1) and b == pytest.approx(2e-11, rel=0.1)  # the outlier: a few %
    assert dispatchfit.fit_cold([(1, 1e6, -1e-4), (2, 2e6, -2e-4)]) == pytest.approx((0.0, 0.0), abs=1e-12)  # >= 0
    # the calibration's fit: cold runs at warm + rounds x 0.3 ms + bytes x 50 ps
    points, host = _cold_points(prof, 3e-4, 5e-11)
    fitted, quality = dispatchfit.fit_dispatch_path(prof, points, host, host_parallel=2)
    assert fitted.cold_round_s == pytest.approx(3e-4, rel=0.05) and fitted.cold_byte_s == pytest.approx(5e-11, rel=0.05)
    assert quality["cold_byte_s"] == fitted.cold_byte_s


def test_what_if_producers_hold_what_rollout_deals():
    """The what-if's producer layout is the one dealing rule (earl.parallel.deal) the runtime
    plays and the simulator simulates: sample i on rollout replica i mod dp, not in blocks."""
    from earl.parallel import deal
    from earl.policies.balance import round_robin_samples

    src, dst = ParallelPlan(tp=2, dp=4), ParallelPlan(tp=1, dp=8)
    samples, s_layout, d_layout = dispatch_layouts(src, dst, 10, 64)
    assert s_layout.assignment == ((0, 4, 8), (1, 5, 9), (2, 6), (3, 7))
    assert [list(g) for g in s_layout.assignment] == deal(10, 4)
    assert s_layout.assignment == round_robin_samples(samples, 4)[0]
    assert sorted(i for g in d_layout.assignment for i in g) == list(range(10))


def _phase_s_by_loop(cm, phase, central, ppn):
    """The phase price written as a plain loop over the transfers (the reference the vectorised
    `_phase_s` must equal to the last bit)."""
    from collections import defaultdict
    path, g, intra, net = cm.profile.dispatch_path, cm.cluster.gpus_per_node, cm.profile.intra, cm.cluster.network
    host, moved = defaultdict(float), defaultdict(float)
    w_in, w_out, n_in, n_out = (defaultdict(float) for _ in range(4))
    senders = defaultdict(set)
    for t in phase:
        pieces = len(t.sample_ids) * len(t.tensors)
        if t.src == t.dst:
            host[t.src] += pieces * path.object_s + t.bytes / path.copy_bw_bytes_s
            continue
        for r in (t.src, t.dst):
            host[r] += path.message_s + pieces * path.object_s + t.bytes / path.copy_bw_bytes_s
            moved[r] += t.bytes
            if r == central:
                host[r] += t.bytes / path.controller_bw_bytes_s + pieces * path.controller_object_s
        if t.src // g == t.dst // g:
            w_out[t.src] += t.bytes
            w_in[t.dst] += t.bytes
        else:
            n_out[t.src // g] += t.bytes
            n_in[t.dst // g] += t.bytes
            senders[t.dst // g].add(t.src // g)
    by_node = defaultdict(list)
    for r, h in host.items():
        wire = max(w_in[r], w_out[r]) if path.full_duplex else w_in[r] + w_out[r]
        by_node[r // g].append(h + (intra.alpha_s + wire / (path.wire_bw_bytes_s or intra.bw_bytes_s) if wire else 0.0))
    stretch = (ppn / path.host_parallel) ** path.oversubscribed_exp if ppn > path.host_parallel else 1.0
    worst = 0.0
    for n, times in by_node.items():
        in_bw = net.node_bw_bytes_s * (net.incast_efficiency if len(senders[n]) > 1 else 1.0)
        t_nic = max(n_out[n] / net.node_bw_bytes_s, n_in[n] / in_bw)
        worst = max(worst, stretch * max(times), sum(times) / path.host_parallel,
                    t_nic + (net.latency_s if t_nic else 0.0))
    return worst, max(moved.values(), default=0.0)


def test_vectorised_phase_price_is_the_loop_to_the_last_bit():
    """`_phase_s` (numpy over the transfers, so 131,072-GPU what-if plans price in a fraction of a
    second) gives the same float as the loop, on random lengths over tp / cp / pp layouts on 4
    nodes, both dispatchers, with and without a controller and host oversubscription."""
    import itertools
    import random

    from earl.cost_model.dispatch import _phase_s
    from earl.policies import Layout, Sample, balance_aligned
    rnd = random.Random(0)
    cms = [make_cost_model("qwen2.5-72b", "h100-sxm-80gb", 32, "tcp-200g"),
           make_cost_model("qwen2.5-0.5b", "cpu-measured", 32, "tcp-200g")]
    P = ParallelPlan
    plans = [P(dp=32), P(tp=4, pp=2, dp=4), P(tp=2, cp=2, dp=8), P(tp=8, dp=4), P(tp=2, pp=2, cp=2, dp=4)]
    checked = 0
    for (src, dst), kind in itertools.product(itertools.product(plans, plans), ("centralized", "layout-aware")):
        n = rnd.randint(5, 60)
        samples = [Sample(i, rnd.randint(1, 5000), i // 4) for i in range(n)]
        src_assign = tuple(tuple(range(d, n, src.dp)) for d in range(src.dp))
        dst_assign = tuple(tuple(x) for x in balance_aligned(samples, dst.dp, src_assign)[0])
        tplan = make_dispatcher(kind).plan(Layout(src, src_assign), Layout(dst, dst_assign), samples)
        for cm, ppn, phase, central in itertools.product(cms, (1, 8), tplan.phases, (None, tplan.controller)):
            t, info = _phase_s(cm, phase, central, ppn)
            assert (t, info["busiest_bytes"]) == _phase_s_by_loop(cm, phase, central, ppn)
            checked += 1
    assert checked == 600 and _phase_s(cms[0], [], None, 8)[0] == 0.0


@pytest.mark.parametrize("reduce_s", [0.0, 3e-4])
def test_each_statistics_reduction_is_a_gather_and_a_scatter_cold_once(reduce_s):
    """A plan whose statistics take two reductions (a per-turn baseline: the turn count first,
    TransferPlan.reductions) pays one more reduction than one of a single reduction, at
    reduce_cost_s(N) (two rounds at round_cost_s(N) where the profile measured none), and no
    more cold start: the second runs on what the first warmed."""
    prof = _cpu_profile()
    path = dataclasses.replace(prof.dispatch_path, round_s=5e-4, sync_s=2e-3, cold_round_s=7e-4, host_parallel=2,
                               reduce_s=reduce_s, reduce_sync_s=7e-4)
    prof = dataclasses.replace(prof, dispatch_path=path)
    for n in (2, 4):
        tplan = dispatchfit.transfer_plans(n, 4, 2048)["layout-aware"]
        assert tplan.reduce_bytes and tplan.reductions == 1
        two = dataclasses.replace(tplan, reductions=2)
        assert sync_rounds(two) == sync_rounds(tplan) + 2
        a, b = (price_transfer_plan(dispatchfit.local_cost_model(prof, n), p, samples=4 * n, producers=n, world=n)
                for p in (tplan, two))
        assert b.breakdown["rounds"] == a.breakdown["rounds"]
        assert b.time_s - a.time_s == pytest.approx(path.reduce_cost_s(n))
        assert path.reduce_cost_s(n) == (reduce_s + 7e-4 * (n > 2) if reduce_s else 2 * path.round_cost_s(n))
        assert b.breakdown["cold_start"] == a.breakdown["cold_start"] == pytest.approx(sync_rounds(tplan) * 7e-4)
        # none reduced (the hand-off, or statistics from the rewards): the count is moot
        assert sync_rounds(dataclasses.replace(two, reduce_bytes=0)) == sync_rounds(dataclasses.replace(tplan,
                                                                                                       reduce_bytes=0))


def test_the_last_rank_plans_alone_and_pays_for_the_leavers_start_beyond_the_cores():
    """The control plane's planning (dispatch_fixed_s) is one process's host work at any rank
    count: the window starts at the last rank, and the ranks before it planned as they arrived.
    `lead_s` (what each rank does after the dispatch before its next collective) costs the last
    rank lead_s x (ranks / cores - 1) where the ranks outnumber the cores, nothing where they
    fit, and nothing without the control plane (a benchmark's back-to-back dispatches)."""
    prof = dataclasses.replace(_cpu_profile(), dispatch_fixed_s=1e-3)
    prof = dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, host_parallel=2))

    def est(n, **kw):
        return price_transfer_plan(dispatchfit.local_cost_model(prof, n), dispatchfit.transfer_plans(n, 4, 2048)[
            "layout-aware"], samples=4 * n, producers=n, world=n, **kw)

    assert {n: est(n).breakdown["planning"] for n in (2, 4, 8)} == pytest.approx({2: 1e-3, 4: 1e-3, 8: 1e-3})
    for n, leavers in ((2, None), (4, 7e-4), (8, 3 * 7e-4)):
        with_lead, without = est(n, lead_s=7e-4), est(n)
        assert with_lead.breakdown.get("leavers") == (None if leavers is None else pytest.approx(leavers))
        assert with_lead.time_s - without.time_s == pytest.approx(leavers or 0.0)
        assert "leavers" not in est(n, lead_s=7e-4, control=False).breakdown


def test_the_estimator_the_run_computes_prices_its_advantages(tmp_path):
    """A dispatch's advantage work costs the estimator's per-sample and per-token seconds
    (HardwareProfile.estimator_s, keyed by AdvantageSpec.key); an estimator the profile did not
    time, or none named, costs dispatch_path.sample_s. The pair round-trips through the file
    and a bad one is refused by name."""
    from earl.runtime.advantages import AdvantageSpec

    base = _cpu_profile()
    prof = dataclasses.replace(base, estimator_s={"reinforce++/per-turn": (40e-6, 5e-8), "grpo": (15e-6, 1e-9)})
    cm = dispatchfit.local_cost_model(prof, 2)
    tplan = dispatchfit.transfer_plans(2, 4, 2048)["layout-aware"]
    last = tplan.phases[-1]  # per sample delivered (a sample a tp pair shares counts at both)
    tokens = sum(b - a for t in last for a, b in t.token_ranges) / sum(len(t.sample_ids) for t in last)
    key = AdvantageSpec(estimator="reinforce++", per_turn=True).key
    assert key == "reinforce++/per-turn"
    got = price_transfer_plan(cm, tplan, samples=8, producers=2, world=2, estimator=key).breakdown["advantages"]
    assert got == pytest.approx(4 * (40e-6 + 5e-8 * tokens))  # 8 samples over 2 producers
    plain = price_transfer_plan(cm, tplan, samples=8, producers=2, world=2).breakdown["advantages"]
    assert plain == pytest.approx(4 * base.dispatch_path.sample_s)
    assert price_transfer_plan(cm, tplan, samples=8, producers=2, world=2, estimator="rloo"
                               ).breakdown["advantages"] == pytest.approx(plain)  # not timed: sample_s
    back = load_profile(prof.save(tmp_path / "p.json"))
    assert back.estimator_s == prof.estimator_s
    bad = json.loads((tmp_path / "p.json").read_text())
    bad["estimator_s"]["grpo"] = [1e-5]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"estimator_s.grpo must be \[s per sample, s per token\]"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="estimator_s"):
        dataclasses.replace(base, estimator_s={"grpo": (-1.0, 0.0)})


def test_estimator_keys_and_their_fit():
    """AdvantageSpec.key names what the cost model prices apart; `fit_estimator` recovers a
    planted per-sample and per-token cost; `measure_host` times every key."""
    from earl.runtime.advantages import AdvantageSpec

    assert [AdvantageSpec(estimator=e).key for e in ("grpo", "rloo", "reinforce++")] == ["grpo", "rloo", "reinforce++"]
    assert AdvantageSpec(estimator="reinforce++", per_turn=True, gamma=0.9).key == "reinforce++/per-turn/discounted"
    assert AdvantageSpec(estimator="grpo", per_turn=True, gamma=0.9).key == "grpo"  # group statistics only
    tokens = [64.0, 512.0, 8192.0, 65536.0]
    a, b = dispatchfit.fit_estimator(tokens, [40e-6 + 5e-8 * t for t in tokens])
    assert (a, b) == (pytest.approx(40e-6, rel=1e-6), pytest.approx(5e-8, rel=1e-6))
    host = dispatchfit.measure_host(repeats=1)
    summed = {sp.priced_key(summed=True) for sp in dispatchfit.ESTIMATOR_SPECS.values() if not sp.grouped}
    assert summed == {k + "/summed" for k in dispatchfit.ESTIMATOR_SPECS if k.startswith("reinforce++")}
    assert set(host["estimator_s"]) == set(dispatchfit.ESTIMATOR_SPECS) | summed
    assert all(x >= 0 for pair in host["estimator_s"].values() for x in pair)
    # a profile from before the filling-in was timed apart prices it as the whole estimator
    prof = _cpu_profile()
    old = dataclasses.replace(prof, estimator_s={k: v for k, v in prof.estimator_s.items() if k not in summed})
    assert old.advantage_s("reinforce++/per-turn/summed", 200) == old.advantage_s("reinforce++/per-turn", 200)
    assert old.advantage_s("grpo", 200) == prof.advantage_s("grpo", 200)


def test_a_waiting_dispatchs_own_work_runs_cold_on_a_cpu_host_after_a_rollout_past_the_cache():
    """`host_factor` (CostModel.host_cold_factor after a rollout whose weights the caches cannot
    hold) multiplies a waiting dispatch's own work on a CPU host (its phases and the advantages)
    and nothing else: its rounds, wake-ups, cold start, metadata and planning keep their price;
    a full-duplex (GPU) path's phases are link time and keep theirs."""
    prof = _cpu_profile()
    assert not prof.dispatch_path.full_duplex
    for n in (2, 4):
        tplan = dispatchfit.runtime_plans(n, 4, 2048)["layout-aware"]
        assert tplan.waits_for_peers
        cm = dispatchfit.local_cost_model(prof, n)
        hot, cold = (price_transfer_plan(cm, tplan, samples=4 * n, producers=n, world=n, host_factor=f)
                     for f in (1.0, 1.5))
        own = [k for k in hot.breakdown if k == "advantages" or k == "alltoall" or k.startswith("phase")]
        assert own and all(hot.breakdown[k] > 0 for k in own)
        for k, v in hot.breakdown.items():
            assert cold.breakdown[k] == pytest.approx(v * (1.5 if k in own else 1.0)), k
        duplex = dispatchfit.local_cost_model(
            dataclasses.replace(prof, dispatch_path=dataclasses.replace(prof.dispatch_path, full_duplex=True)), n)
        a, b = (price_transfer_plan(duplex, tplan, samples=4 * n, producers=n, world=n, host_factor=f)
                for f in (1.0, 1.5))
        assert a.time_s == pytest.approx(b.time_s)
