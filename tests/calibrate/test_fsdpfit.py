"""The FSDP2 host-cost terms: each a counted quantity priced as count x a profile constant
(earl.cost_model.model), and the fit that recovers the constants (earl.calibrate.fsdpfit)."""

import dataclasses
import math

import pytest

from earl.calibrate import fsdpfit
from earl.calibrate.hostload import overlap_factor
from earl.cost_model import comm, memory
from earl.cost_model.compute import param_tensors
from earl.cost_model.model import FSDP_SHARD_BYTES, FSDP_STEP_ALLREDUCES, SCALAR_BYTES, SYNC_BUCKET_BYTES, CostModel
from earl.cost_model.profile import HardwareProfile, load_profile
from earl.specs import MODEL_CATALOG, ParallelPlan

PROF = load_profile("cpu-measured")
ZERO = dataclasses.replace(PROF, fsdp_unit_s=0.0, fsdp_tensor_s=0.0, reshard_tensor_s=0.0, reshard_byte_s=0.0,
                           reshard_fixed_s=0.0, reshard_shard_byte_s=0.0)


def _cm(prof: HardwareProfile, n: int = 2) -> CostModel:
    return fsdpfit.local_cost_model(prof, n, fsdpfit.spec_of(2))


@pytest.mark.parametrize("dp", [2, 4])
def test_fsdp_train_terms_are_counts_times_constants(dp):
    plan = ParallelPlan(dp=dp, sharded_optimizer=True, micro_batch=2)
    spec = MODEL_CATALOG["tiny"]
    base = _cm(ZERO, dp).train(plan, batch=8 * dp, context=96, fsdp=True)
    unit, tensor = 1e-3, 5e-4
    got = _cm(dataclasses.replace(ZERO, fsdp_unit_s=unit, fsdp_tensor_s=tensor), dp).train(
        plan, batch=8 * dp, context=96, fsdp=True)
    m = base.extras["micro_batches"]
    units = spec.num_layers + 1
    assert m == 4 and base.breakdown["fsdp_host"] == 0.0
    assert got.breakdown["fsdp_host"] == pytest.approx(m * units * unit)
    assert got.time_s - base.time_s == pytest.approx(m * units * unit + param_tensors(spec) * tensor)
    # the step's small all-reduces: counted, priced on the fitted all-reduce link
    link = PROF.link_for("allreduce")
    assert base.breakdown["step_collectives"] == pytest.approx(
        FSDP_STEP_ALLREDUCES * comm.allreduce_s(SCALAR_BYTES, dp, link))
    # none of it without FSDP2 (the studies' default), nor on one rank
    for est in (_cm(PROF, dp).train(plan, batch=8 * dp, context=96),
                _cm(PROF, 1).train(ParallelPlan(sharded_optimizer=True), batch=8, context=96, fsdp=True)):
        assert est.breakdown["fsdp_host"] == est.breakdown["step_collectives"] == 0.0
    assert _cm(PROF, dp).train(plan, batch=8 * dp, context=96).time_s == \
        _cm(ZERO, dp).train(plan, batch=8 * dp, context=96).time_s


@pytest.mark.parametrize("dp", [2, 4])
def test_fsdp_weight_sync_gathers_in_buckets_each_a_measured_round(dp):
    """The tiny model's shards fit one bucket: one all-gather of the whole tp shard; a host that
    measured a synchronising round pays it once per gather in place of the link's latency."""
    src, dst = ParallelPlan(dp=dp, sharded_optimizer=True), ParallelPlan(dp=dp)
    spec = MODEL_CATALOG["tiny"]
    whole = spec.num_params * FSDP_SHARD_BYTES
    assert whole / dp < SYNC_BUCKET_BYTES
    quiet = dataclasses.replace(ZERO, dispatch_path=dataclasses.replace(ZERO.dispatch_path, round_s=0.0, sync_s=0.0))
    cm = _cm(quiet, dp)
    link = comm.group_link(cm.cluster, quiet, dp, 1, collective="allgather")
    # a CPU host's ranks copy the bytes themselves: the 2-rank share of them whatever dp
    assert not quiet.dispatch_path.full_duplex
    assert cm.reshard(src, dst, fsdp=True).breakdown["dp_gather"] == pytest.approx(
        whole / 2 / link.bw_bytes_s + (dp - 1) * link.alpha_s)
    rounds = dataclasses.replace(quiet, dispatch_path=dataclasses.replace(quiet.dispatch_path, round_s=1e-3))
    got = _cm(rounds, dp).reshard(src, dst, fsdp=True).breakdown["dp_gather"]
    assert got == pytest.approx(whole / 2 / link.bw_bytes_s + 1e-3)
    # over a full-duplex device link a ring's (dp - 1) / dp of them
    duplex = dataclasses.replace(quiet, dispatch_path=dataclasses.replace(quiet.dispatch_path, full_duplex=True))
    assert _cm(duplex, dp).reshard(src, dst, fsdp=True).breakdown["dp_gather"] == pytest.approx(
        comm.allgather_s(whole, dp, link))


def test_collective_bytes_on_a_cpu_host_stay_at_the_fitted_two_rank_share():
    """gloo over loopback: a rank's work in an all-gather is about the whole tensor whatever the
    group (measured +10-18% from 2 to 4 ranks, not a ring's +50%), so its link, fitted between 2
    ranks, prices the bytes at 2; device links keep (p - 1) / p. A reduce-scatter, whose ranks
    add what they receive, keeps the ring's share on a CPU host too (measured x1.26-1.45 at 4-16
    MiB from 2 to 4 ranks over three runs, 2026-12-07)."""
    link = comm.LinkParams(alpha_s=1e-4, bw_bytes_s=1e9)
    duplex_prof = dataclasses.replace(PROF, dispatch_path=dataclasses.replace(PROF.dispatch_path, full_duplex=True))
    one_host = _cm(PROF, 8).cluster  # one node of 8 ranks
    assert [comm.bytes_group(one_host, PROF, p) for p in (1, 2, 4, 8)] == [1, 2, 2, 2]
    assert [comm.bytes_group(one_host, duplex_prof, p) for p in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert [comm.bytes_group(one_host, PROF, p, collective="reducescatter") for p in (1, 2, 4, 8)] == [1, 2, 4, 8]
    # a group across nodes goes over their NICs: a wire, (p - 1) / p of the bytes
    two_hosts = dataclasses.replace(one_host, nodes=2)
    assert two_hosts.gpus_per_node == 8 and comm.bytes_group(two_hosts, PROF, 4, stride=4) == 4
    assert comm.bytes_group(two_hosts, PROF, 4, stride=2) == 2  # ranks 0, 2, 4, 6: one host
    assert comm.allgather_s(1e6, 4, link, bytes_p=2) == pytest.approx(0.5e-3 + 3e-4)
    assert comm.allgather_s(1e6, 4, link) == pytest.approx(0.75e-3 + 3e-4)
    # the FSDP2 training step's gathers follow the same rule, its reduce-scatters (fp32
    # gradients, on their own link) the ring's share
    plan = ParallelPlan(dp=4, sharded_optimizer=True, micro_batch=2)
    ag, rs = comm.LinkParams(alpha_s=1e-4, bw_bytes_s=1e9), comm.LinkParams(alpha_s=2e-4, bw_bytes_s=5e8)
    links = dataclasses.replace(ZERO, collective_links={**ZERO.collective_links, "allgather": ag, "reducescatter": rs})
    est = _cm(links, 4).train(plan, batch=32, context=96, fsdp=True)
    spec = MODEL_CATALOG["tiny"]
    units, p_local = spec.num_layers + 1, memory.params_per_gpu(spec, plan)
    per_mb = (2 * units - 1) * comm.allgather_s(p_local / units * spec.dtype_bytes, 4, ag, bytes_p=2) + \
        units * comm.allgather_s(p_local / units * 4, 4, rs)
    assert est.breakdown["fsdp_comm"] == pytest.approx(est.extras["micro_batches"] * per_mb)
    duplex = dataclasses.replace(links, dispatch_path=dataclasses.replace(ZERO.dispatch_path, full_duplex=True))
    on_device = _cm(duplex, 4).train(plan, batch=32, context=96, fsdp=True).breakdown["fsdp_comm"]
    assert 0 < est.breakdown["fsdp_comm"] < on_device


@pytest.mark.parametrize("dp", [2, 4])
def test_fsdp_weight_sync_prices_the_sync_each_gathered_tensor_and_byte(dp):
    src, dst = ParallelPlan(dp=dp, sharded_optimizer=True), ParallelPlan(dp=dp)
    base = _cm(ZERO, dp).reshard(src, dst, fsdp=True)
    terms = dataclasses.replace(ZERO, reshard_fixed_s=7e-4, reshard_tensor_s=2e-4, reshard_shard_byte_s=3e-9)
    got = _cm(terms, dp).reshard(src, dst, fsdp=True)
    spec = MODEL_CATALOG["tiny"]
    tensors, whole = param_tensors(spec), spec.num_params * FSDP_SHARD_BYTES  # the model's fp32 bytes
    assert PROF.reshard_fixed_s > 0 and PROF.reshard_shard_byte_s > 0  # the shipped calibration fitted them
    assert fsdpfit.sync_counts(fsdpfit.spec_of(2), dp) == {"reshard_fixed_s": 1, "reshard_tensor_s": tensors,
                                                          "reshard_byte_s": whole, "reshard_shard_byte_s": whole / dp}
    assert base.breakdown["host"] == 0.0
    priced = 7e-4 + tensors * 2e-4 + whole / dp * 3e-9  # the rank's own shard's bytes
    assert got.breakdown["host"] == pytest.approx(priced)
    assert got.time_s - base.time_s == pytest.approx(priced)
    assert _cm(terms, dp).reshard(src, dst).breakdown["host"] == 0.0  # not FSDP2: no gather, no term
    # the sync's fixed part is paid once, whatever the model: twice the layers, the same term
    deep = fsdpfit.sync_counts(fsdpfit.spec_of(2 * spec.num_layers), dp)
    got_deep = fsdpfit.local_cost_model(terms, dp, fsdpfit.spec_of(2 * spec.num_layers)).reshard(src, dst, fsdp=True)
    assert got_deep.breakdown["host"] == pytest.approx(
        7e-4 + deep["reshard_tensor_s"] * 2e-4 + deep["reshard_shard_byte_s"] * 3e-9)
    # the whole model's bytes are paid whatever the ranks, the shard's over them
    both = _cm(dataclasses.replace(terms, reshard_byte_s=1e-9), dp).reshard(src, dst, fsdp=True)
    assert both.breakdown["host"] == pytest.approx(priced + whole * 1e-9)
    # the wide sync point's tensors are the tiny model's, each ~30x the bytes: the terms separate
    wide = fsdpfit.sync_counts(fsdpfit.spec_of(2, wide=True), dp)
    assert wide["reshard_tensor_s"] == tensors and wide["reshard_byte_s"] > 30 * whole
    assert wide["reshard_fixed_s"] == 1


def _synthetic_points(truth: dict[str, float], host_parallel: int, prof: HardwareProfile = PROF,
                      shares: dict[int, float] | None = None) -> list:
    """Points whose measured time is what `truth`'s constants predict on `prof` (stretched like
    validate's); `shares`: the share of a core each point's ranks got, per process count
    (None: fsdpfit.PROCS on an idle host)."""
    points = []
    for n, share in (shares or dict.fromkeys(fsdpfit.PROCS)).items():
        for case in fsdpfit.TRAIN_CASES:
            layers, seqs, longest, budget = case
            mbs = max(len(fsdpfit.pack_micro_batches(
                [fsdpfit.lengths(seqs, longest)[i] for i in fsdpfit.rank_share(seqs, n, r)], budget))
                for r in range(n))
            points.append(fsdpfit.FsdpPoint(kind="train", procs=n, layers=layers, label=fsdpfit.label(case),
                                            measured_s=0.0, share=share,
                                            counts={"fsdp_unit_s": (layers + 1) * mbs,
                                                    "fsdp_tensor_s": 12 * layers + 2}))
        for layers, wide in ((2, False), (4, False), (2, True)):
            points.append(fsdpfit.FsdpPoint(kind="sync", procs=n, layers=layers, wide=wide, label="sync",
                                            measured_s=0.0, share=share,
                                            counts=fsdpfit.sync_counts(fsdpfit.spec_of(layers, wide), n)))
    out = []
    for p in points:
        priced = fsdpfit.price(prof, p, host_parallel=host_parallel)
        out.append(dataclasses.replace(p, measured_s=priced.predicted_s(truth)))
    return out


@pytest.mark.parametrize("fixed", [0.0, 8e-4])
def test_fit_recovers_known_constants_from_synthetic_measurements(fixed):
    truth = {"fsdp_unit_s": 3.5e-3, "fsdp_tensor_s": 1.6e-3, "reshard_fixed_s": fixed, "reshard_tensor_s": 4e-4,
             "reshard_byte_s": 6e-10, "reshard_shard_byte_s": 1.2e-9}
    points = _synthetic_points(truth, host_parallel=2)
    assert [p.counts["fsdp_tensor_s"] for p in points[:4]] == [26, 26, 26, 50]  # the tiny model's 26
    fields, quality = fsdpfit.fit_fsdp_costs(PROF, points, host_parallel=2)
    for k, v in truth.items():
        assert fields[k] == pytest.approx(v, rel=1e-6), k
    assert quality["fit_max_err"] < 1e-6 and len(quality["points"]) == len(points)
    # the 4-rank points were stretched by 4 / 2 cores; the fit divided it out
    assert all(r["predicted_s"] == pytest.approx(r["measured_s"]) for r in quality["points"])
    # a term the measurements do not need fits to 0, never negative
    fields0, _ = fsdpfit.fit_fsdp_costs(PROF, _synthetic_points(dict.fromkeys(truth, 0.0), 2), host_parallel=2)
    assert all(v == pytest.approx(0.0, abs=1e-9) for v in fields0.values())


def test_profile_reads_and_checks_the_new_fields(tmp_path):
    prof = dataclasses.replace(PROF, fsdp_unit_s=1e-3, fsdp_tensor_s=2e-3, reshard_tensor_s=3e-4, reshard_byte_s=1e-9)
    assert load_profile(str(prof.save(tmp_path / "p.json"))) == prof
    with pytest.raises(ValueError, match="fsdp_unit_s"):
        dataclasses.replace(PROF, fsdp_unit_s=-1.0)
    d = prof.to_dict()
    del d["fsdp_unit_s"]
    del d["reshard_byte_s"]
    old = HardwareProfile.from_dict(d)  # profiles written before them: 0
    assert old.fsdp_unit_s == old.reshard_byte_s == 0.0
    with pytest.raises(ValueError, match="reshard_byte_s"):
        dataclasses.replace(PROF, reshard_byte_s=-1e-9)
    assert not math.isnan(PROF.fsdp_unit_s)


def test_fit_weighs_points_by_their_relative_error():
    """The 4-rank points run about twice as long on 2 cores; an absolute fit let them set the
    constant and left the 2-rank weight sync under-priced by ~2x. Weighted by 1 / measured, a
    2-rank sync measured 30% above the truth and a 4-rank one 30% below miss by about as
    much each way."""
    truth = {"fsdp_unit_s": 3.5e-3, "fsdp_tensor_s": 1.6e-3, "reshard_fixed_s": 0.0, "reshard_tensor_s": 1e-3,
             "reshard_byte_s": 0.0, "reshard_shard_byte_s": 0.0}
    points = [dataclasses.replace(p, measured_s=p.measured_s * (1.3 if p.procs == 2 else 0.7))
              if p.kind == "sync" else p for p in _synthetic_points(truth, host_parallel=2)]
    _, quality = fsdpfit.fit_fsdp_costs(PROF, points, host_parallel=2)
    errs = {r["procs"]: r["predicted_s"] / r["measured_s"] - 1 for r in quality["points"] if r["kind"] == "sync"}
    assert errs[2] < 0 < errs[4]
    assert 0.5 < -errs[2] / errs[4] < 2, errs


def test_the_weight_sync_pays_its_wake_ups_once_where_ranks_outnumber_cores_and_come_from_work():
    """`asleep` (a runtime step's sync, whose early ranks sleep in its first all-gather): one
    `reshard_wake_s` where the node's ranks outnumber its cores; none at a core each, none from
    a common start (the calibration's barrier-started syncs), none without an FSDP2 gather."""
    prof = dataclasses.replace(PROF, reshard_wake_s=6e-4)
    src, dst = ParallelPlan(dp=4, sharded_optimizer=True), ParallelPlan(dp=4)
    woken = _cm(prof, 4).reshard(src, dst, fsdp=True, asleep=True)
    plain = _cm(prof, 4).reshard(src, dst, fsdp=True)
    assert woken.time_s - plain.time_s == pytest.approx(6e-4) == woken.breakdown["wake"]
    assert plain.breakdown["wake"] == 0.0
    two = ParallelPlan(dp=2, sharded_optimizer=True)
    assert _cm(prof, 2).reshard(two, ParallelPlan(dp=2), fsdp=True, asleep=True).breakdown["wake"] == 0.0
    assert _cm(prof, 4).reshard(src, dst, asleep=True).breakdown["wake"] == 0.0  # the cost model's own zero
    assert PROF.reshard_wake_s > 0  # the shipped calibration measured it ...
    unmeasured = dataclasses.replace(PROF, reshard_wake_s=0.0)  # ... one calibrated before the term did not
    assert _cm(unmeasured, 4).reshard(src, dst, fsdp=True, asleep=True).breakdown["wake"] == 0.0


def test_staggered_window_reads_from_the_last_arrival_to_the_first_end_over_the_faster_half():
    """Per repeat (the first a warm-up): the last start to the first end; the median of the
    faster half of them (the fast mode of two); each rank's median lead on the last arrival."""
    def rank(start, ends):  # (start, end) per repeat; starts 4 ms apart, the warm-up's odd
        return [(0.0, 9.0)] + [(start + 1.0 * i, start + 1.0 * i + e) for i, e in enumerate(ends, 1)]
    runs = [rank(0.000, [0.015, 0.015, 0.015, 0.015]), rank(0.004, [0.013, 0.013, 0.013, 0.013]),
            rank(0.008, [0.0045, 0.0050, 0.0090, 0.0095])]
    window, leads = fsdpfit.staggered_window(runs)
    # windows (the last start at +8 ms, the first end rank 2's or rank 0's at +15 ms): 4.5, 5.0,
    # 7.0, 7.0 ms; the faster half: 4.5, 5.0 -> 4.75 ms
    assert window == pytest.approx(0.00475)
    assert leads == pytest.approx((0.0, 0.004, 0.008))


def test_fit_reads_the_wake_term_from_staggered_syncs_beyond_the_cores():
    """Staggered syncs measured at their validate price plus 0.7 ms at 4 ranks on 2 cores (and
    at their price at 2): the fit's `reshard_wake_s` is 0.7 ms, the other constants as before;
    no staggered point beyond the cores (a quick set): 0."""
    truth = {"fsdp_unit_s": 3.5e-3, "fsdp_tensor_s": 1.6e-3, "reshard_fixed_s": 5e-4, "reshard_tensor_s": 4e-4,
             "reshard_byte_s": 6e-10, "reshard_shard_byte_s": 1.2e-9}
    points = _synthetic_points(truth, host_parallel=2)
    known = dataclasses.replace(PROF, **truth)
    for n in fsdpfit.PROCS:
        for layers, wide in ((2, False), (4, False), (2, True)):
            p = fsdpfit.FsdpPoint(kind="wake", procs=n, layers=layers, wide=wide, label="staggered",
                                  measured_s=0.0, leads=tuple(0.004 * i for i in range(n)),
                                  counts=fsdpfit.sync_counts(fsdpfit.spec_of(layers, wide), n))
            priced = fsdpfit.price(known, p, host_parallel=2)
            points.append(dataclasses.replace(p, measured_s=priced.predicted_s(truth) + (7e-4 if n > 2 else 0.0)))
    fields, quality = fsdpfit.fit_fsdp_costs(PROF, points, host_parallel=2)
    assert fields["reshard_wake_s"] == pytest.approx(7e-4)
    for k, v in truth.items():
        assert fields[k] == pytest.approx(v, rel=1e-6), k
    assert quality["fit_max_err"] < 1e-6  # the wake points' rows carry the term where it applies
    quick, _ = fsdpfit.fit_fsdp_costs(PROF, [p for p in points if p.procs == 2], host_parallel=2)
    assert quick["reshard_wake_s"] == 0.0


def test_overlap_factor_charges_waits_only_where_ranks_outnumber_cores():
    assert overlap_factor(0.7, 2, 2) == overlap_factor(0.2, 1, 2) == 1.0  # a core each: no sharing
    assert overlap_factor(0.7, 4, 2) == pytest.approx(0.7)  # 4 on 2: x2 x 0.7 = x1.4 the dedicated wall
    assert overlap_factor(0.3, 4, 2) == pytest.approx(0.5)  # never faster than a core each
    assert overlap_factor(1.0, 8, 2) == 1.0 == overlap_factor(1.5, 4, 2)  # always busy: the whole stretch


def test_sync_busy_is_measured_where_ranks_fit_and_stretches_only_the_oversubscribed_syncs():
    """Synthetic points whose 4-rank syncs ran at 0.6 x the oversubscription stretch: the fit
    reads the busy share from the 2-rank syncs (the median) and recovers the constants."""
    truth = {"fsdp_unit_s": 3.5e-3, "fsdp_tensor_s": 1.6e-3, "reshard_fixed_s": 3e-4, "reshard_tensor_s": 4e-4,
             "reshard_byte_s": 6e-10, "reshard_shard_byte_s": 1.2e-9}
    busy = dataclasses.replace(PROF, reshard_busy=0.6)
    points = []
    for p in _synthetic_points(truth, host_parallel=2, prof=busy):
        if p.kind == "sync":
            p = dataclasses.replace(p, busy=0.6 if p.procs == 2 else 0.35)  # at 4 ranks: not read
        points.append(p)
    for p in points:
        got = fsdpfit.price(busy, p, host_parallel=2).stretch
        plain = fsdpfit.price(dataclasses.replace(busy, reshard_busy=1.0), p, host_parallel=2).stretch
        assert got == pytest.approx(plain * (0.6 if p.kind == "sync" and p.procs == 4 else 1.0))
    fields, quality = fsdpfit.fit_fsdp_costs(PROF, points, host_parallel=2)
    assert fields["reshard_busy"] == pytest.approx(0.6)
    for k, v in truth.items():
        assert fields[k] == pytest.approx(v, rel=1e-6), k
    assert quality["fit_max_err"] < 1e-6
    # a profile reads it back; outside (0, 1] it is refused; profiles before it: 1 (no overlap)
    with pytest.raises(ValueError, match="reshard_busy"):
        dataclasses.replace(PROF, reshard_busy=0.0)
    d = busy.to_dict()
    del d["reshard_busy"]
    assert HardwareProfile.from_dict(d).reshard_busy == 1.0


def test_a_training_steps_start_is_a_fixed_part_and_one_per_parameter_tensor():
    """`CostModel.train_lead_s`: train_lead_s + train_lead_tensor_s per parameter tensor of a
    pipeline stage, for an FSDP2 plan only (a `zero` plan with dp > 1 run with fsdp)."""
    prof = dataclasses.replace(PROF, train_lead_s=3e-4, train_lead_tensor_s=6e-6)
    spec = MODEL_CATALOG["qwen2-27m"]
    cm = fsdpfit.local_cost_model(prof, 4, spec)
    zero = ParallelPlan(dp=4, sharded_optimizer=True)
    assert param_tensors(spec) == 98
    assert cm.train_lead_s(zero, fsdp=True) == pytest.approx(3e-4 + 98 * 6e-6)
    assert cm.train_lead_s(ParallelPlan(dp=2, pp=2, sharded_optimizer=True), fsdp=True) == \
        pytest.approx(3e-4 + 49 * 6e-6)
    for plan, fsdp in ((zero, False), (ParallelPlan(dp=4), True), (ParallelPlan(tp=4, sharded_optimizer=True), True)):
        assert cm.train_lead_s(plan, fsdp=fsdp) == 0.0
    assert PROF.train_lead_s > 0 and PROF.train_lead_tensor_s > 0  # the shipped calibration fitted both
    unmeasured = dataclasses.replace(PROF, train_lead_s=0.0, train_lead_tensor_s=0.0)  # calibrated before them
    assert fsdpfit.local_cost_model(unmeasured, 4, spec).train_lead_s(zero, fsdp=True) == 0.0


def test_a_rank_leaving_the_training_dispatch_collates_its_share_then_starts_the_step():
    """`CostModel.dispatch_lead_s`: the rank's share of the batch collated at the profile's
    `experience_*` terms (fixed, per sequence of its share, per token of its share) and the
    training step's start (`train_lead_s`, FSDP2 only); the share is ceil(seqs / dp) sequences
    and tokens / dp tokens. Datasheet profiles carry none of it."""
    prof = dataclasses.replace(PROF, train_lead_s=3e-4, train_lead_tensor_s=6e-6, experience_fixed_s=2e-4,
                               experience_seq_s=1e-5, experience_token_s=1e-7)
    spec = MODEL_CATALOG["tiny"]
    cm = fsdpfit.local_cost_model(prof, 4, spec)
    zero = ParallelPlan(dp=4, sharded_optimizer=True)
    collate = 2e-4 + 5 * 1e-5 + 1000 / 4 * 1e-7  # 18 sequences over dp 4: 5 on the busiest rank
    assert cm.collate_s(5, 250) == pytest.approx(collate)
    assert cm.dispatch_lead_s(zero, 18, 1000, fsdp=True) == pytest.approx(collate + cm.train_lead_s(zero, fsdp=True))
    assert cm.dispatch_lead_s(ParallelPlan(dp=4), 18, 1000) == pytest.approx(collate)  # no FSDP2 start
    sheet = CostModel(spec, cm.cluster, load_profile("h100-sxm-80gb"))
    assert sheet.dispatch_lead_s(zero, 18, 1000, fsdp=True) == 0.0


def test_the_start_is_fitted_where_ranks_have_a_core_each():
    """Lead points (a step's start to its first collective, one rank's own work) fit the fixed
    and per-tensor terms from the points whose ranks fit the cores; those beyond them (ranks
    started together at a barrier share the cores) are left out of the fit and its rows."""
    truth = (2.5e-4, 7e-6)
    points = []
    for n in fsdpfit.PROCS:
        for layers in (2, 4, fsdpfit.LEAD_CASE[0]):
            tensors = param_tensors(fsdpfit.spec_of(layers))
            points.append(fsdpfit.FsdpPoint(kind="lead", procs=n, layers=layers, label=f"{layers}L start",
                                            measured_s=(truth[0] + truth[1] * tensors) * (n / 2 if n > 2 else 1),
                                            counts={"train_lead_s": 1, "train_lead_tensor_s": tensors}))
    fields, quality = fsdpfit.fit_fsdp_costs(PROF, points, host_parallel=2)
    assert (fields["train_lead_s"], fields["train_lead_tensor_s"]) == pytest.approx(truth, rel=1e-6)
    rows = [r for r in quality["points"] if r["kind"] == "lead"]
    assert {r["procs"] for r in rows} == {2} and len(rows) == 3
    assert all(r["predicted_s"] == pytest.approx(r["measured_s"]) for r in rows)
    assert param_tensors(fsdpfit.spec_of(fsdpfit.LEAD_CASE[0])) == param_tensors(MODEL_CATALOG["qwen2-27m"])


def test_timed_step_notes_the_first_collective_of_the_runtimes_own_step():
    """Two real gloo ranks run the runtime's FSDP2 training step: the start is a positive part
    of the step, the step trains (the weights move), and the optimizer's own `dp_sum` is back."""
    from earl.runtime.dist import run_local

    got = run_local(_two_rank_step, 2, timeout_s=300, start_method="spawn")
    for lead, wall, moved, restored in got:
        assert 0 < lead < wall and moved and restored


def _two_rank_step():
    import torch
    import torch.distributed as dist

    from earl.parallel import build_plan_groups
    from earl.runtime.run_config import TrainerConfig
    from earl.runtime.trainer import Trainer

    torch.set_num_threads(1)
    plan = ParallelPlan(dp=2, sharded_optimizer=True)
    groups = build_plan_groups(plan)
    base = TrainerConfig(algo="grpo", lr=1e-3)
    spec = fsdpfit.spec_of(2)
    model, _, _, optim = fsdpfit._fsdp_model(spec, plan, groups, base)
    trainer = Trainer(model, base, temperature=1.0, lockstep=groups.dp_group)
    local = fsdpfit._batch(8, 32, spec.vocab_size).select(fsdpfit.rank_share(8, 2, dist.get_rank()))
    before = {n: p.to_local().clone() for n, p in model.named_parameters()}
    wall, lead = fsdpfit.timed_step(trainer, optim, local)
    moved = any(not torch.equal(before[n], p.to_local()) for n, p in model.named_parameters())
    return lead, wall, moved, "dp_sum" not in vars(optim)
