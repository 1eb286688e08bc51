"""The collective benchmark on 2 real gloo processes.

    pytest tests/calibrate/test_collectives.py
"""

import pytest

from earl.calibrate.collectives import OPS, run_collectives
from earl.calibrate.linkfit import fit_link


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


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown collective backend 'mpi'"):
        run_collectives(backend="mpi")
    with pytest.raises(ValueError, match="needs >= 2 ranks"):
        run_collectives(world=1)
