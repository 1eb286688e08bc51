"""The collective benchmark on 2 real gloo processes.

    pytest tests/calibrate/test_collectives.py
"""

import pytest

from earl.calibrate.collectives import OPS, CollectiveResult, run_collectives
from earl.calibrate.linkfit import fit_link, predict_s
from earl.cost_model.profile import LinkParams


@pytest.mark.dist
def test_two_gloo_ranks_give_positive_alpha_beta():
    # up to 16 MiB: a message whose transfer outweighs the few ms a loaded host's scheduler adds
    res = run_collectives(backend="gloo", world=2, sizes=tuple(4**e for e in range(5, 13)), budget_s=1.5)
    assert set(res.times) == set(OPS) and res.world == 2
    for op, pts in res.times.items():
        assert [b for b, _ in pts] == [4**e for e in range(5, 13)], op
        assert all(t > 0 for _, t in pts), op
        # a 16 MiB message takes longer than the faster of the 1 and 4 KiB ones (a shared machine)
        assert pts[-1][1] > min(pts[0][1], pts[1][1]), op
    lf = fit_link(res)
    for op, ol in lf.ops.items():
        assert ol.link.alpha_s > 0 and ol.link.bw_bytes_s > 0, op
    assert 1e6 < lf.link.bw_bytes_s < 1e12  # p2p bandwidth: plausible for loopback
    assert 1e-7 < lf.link.alpha_s < 1e-2
    # FSDP2's gradient reduce-scatter is timed and fitted on its own, not priced as an all-gather
    assert lf.collective_links["reducescatter"] == lf.ops["reduce_scatter"].link
    assert lf.collective_links["allgather"] == lf.ops["all_gather"].link


def test_a_benchmark_without_reduce_scatter_prices_it_on_the_all_gathers_link():
    """Measurements from before 2026-12-07 timed no reduce-scatter: it keeps the all-gather's
    link (same formula); one that timed it gets its own, fitted through that formula."""
    sizes = [4**e for e in range(5, 13)]
    ag, rs = LinkParams(alpha_s=1.5e-4, bw_bytes_s=1e9), LinkParams(alpha_s=2.5e-4, bw_bytes_s=6e8)
    times = {"all_gather": [(b, predict_s("all_gather", b, 2, ag)) for b in sizes],
             "reduce_scatter": [(b, predict_s("reduce_scatter", b, 2, rs)) for b in sizes]}
    old = fit_link(CollectiveResult(backend="gloo", world=2, times={"all_gather": times["all_gather"]}, wall_s=1.0))
    assert set(old.collective_links) == {"allgather", "reducescatter"}
    assert old.collective_links["reducescatter"] == old.collective_links["allgather"]
    new = fit_link(CollectiveResult(backend="gloo", world=2, times=times, wall_s=1.0)).collective_links
    assert new["reducescatter"].alpha_s == pytest.approx(rs.alpha_s, rel=1e-3)
    assert new["reducescatter"].bw_bytes_s == pytest.approx(rs.bw_bytes_s, rel=1e-3)
    assert new["allgather"].bw_bytes_s == pytest.approx(ag.bw_bytes_s, rel=1e-3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown collective backend 'mpi'"):
        run_collectives(backend="mpi")
    with pytest.raises(ValueError, match="needs >= 2 ranks"):
        run_collectives(world=1)
