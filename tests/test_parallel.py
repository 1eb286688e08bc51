"""earl.parallel, the one home of layout math: shard bounds (torch.chunk / DTensor semantics),
rank coordinates, plan validation, groups and the device mesh, and its torch-free import.

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_parallel.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from earl.parallel import (
    MESH_DIMS,
    ParamShape,
    check_tp_dp,
    coord_of,
    holdings,
    local_bounds,
    local_shape,
    placements,
    rank_coords,
    rank_of,
    shard_bounds,
    validate_plan,
)
from earl.specs import MODEL_CATALOG, ModelSpec, ParallelPlan

sizes = st.integers(min_value=0, max_value=200)
parts_st = st.integers(min_value=1, max_value=12)


@settings(max_examples=300, deadline=None)
@given(sizes, parts_st)
def test_shard_bounds_cover_disjoint_chunk_semantics(n, parts):
    bounds = [shard_bounds(n, parts, i) for i in range(parts)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n  # cover, in order, no gaps or overlaps
    for (a, b), (c, d) in zip(bounds, bounds[1:], strict=False):
        assert a <= b == c <= d
    chunk = -(-n // parts)
    size = [b - a for a, b in bounds]
    assert size == sorted(size, reverse=True) and sum(0 < k < chunk for k in size) <= 1  # full, short, empty
    # torch.chunk returns the non-empty parts with the same sizes
    got = [c.numel() for c in torch.arange(n).chunk(parts)] if n else []
    assert got == [b - a for a, b in bounds if b > a]


@settings(max_examples=300, deadline=None)
@given(sizes, parts_st)
def test_shard_bounds_equal_dtensor_1d(n, parts):
    from torch.distributed.tensor import Shard

    for i in range(parts):
        shape, offset = _compute_local_shape_and_global_offset((n,), (parts,), [i], [Shard(0)])
        lo, hi = shard_bounds(n, parts, i)
        assert shape == (hi - lo,)
        assert offset == (lo,) or hi == lo  # an empty shard's offset is immaterial


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.booleans(), st.integers(0, 40), st.integers(1, 9),
       st.sampled_from([None, 0, 1]))
def test_local_bounds_are_dtensor_placements(tp, dp, zero, rows, cols, tp_dim):
    """Weights and ZeRO-1 optimizer slices: a rank's (start, stop) is exactly the local shard
    DTensor computes for `placements` on the mesh they name (tp x dp, uneven sizes included)."""
    plan = ParallelPlan(tp=tp, dp=dp, sharded_optimizer=zero)
    p = ParamShape(shape=(rows, cols), tp_dim=tp_dim)
    for optimizer in (False, True):
        dims, pl = placements(p, plan, optimizer=optimizer)
        mesh_shape = tuple(getattr(plan, d) for d in dims)
        for rank in range(plan.world_size):
            c = coord_of(plan, rank)
            coord = [getattr(c, d) for d in dims]
            shape, offset = _compute_local_shape_and_global_offset(p.shape, mesh_shape, coord, pl)
            lo, hi = local_bounds(p, plan, rank, optimizer=optimizer)
            assert shape == local_shape(p, plan, rank, optimizer=optimizer)
            assert shape[p.shard_dim] == hi - lo
            if hi > lo:
                assert offset[p.shard_dim] == lo


@given(st.integers(1, 4), st.integers(1, 3), st.booleans(), st.integers(1, 50))
def test_holdings_cover_the_tensor_per_replica(tp, dp, zero, n):
    plan = ParallelPlan(tp=tp, dp=dp, sharded_optimizer=zero)
    p = ParamShape(shape=(n,), tp_dim=0)
    w = holdings(p, plan, optimizer=False)
    o = holdings(p, plan, optimizer=True)
    for d in range(dp):  # each replica's tp chunks tile the tensor
        rs = [rank_of(plan, dp=d, tp=t) for t in range(tp)]
        assert sum(w[r][1] - w[r][0] for r in rs) == n
    if zero and dp > 1:  # the optimizer slices tile it once across the whole world
        assert sorted(o.values())[0][0] == 0 and sum(b - a for a, b in o.values()) == n
        for r, (a, b) in o.items():  # and sit inside the rank's own weight chunk
            assert w[r][0] <= a <= b <= w[r][1] or a == b
    else:
        assert o == w


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 5))
def test_rank_coords_round_trip(tp, pp, cp, dp, base):
    plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=dp)
    coords = rank_coords(plan, base)
    assert [c.rank for c in coords] == list(range(base, base + plan.world_size))
    for c in coords:
        assert rank_of(plan, dp=c.dp, pp=c.pp, cp=c.cp, tp=c.tp, base_rank=base) == c.rank
        assert coord_of(plan, c.rank, base) == c
    if plan.world_size > 1:  # tp fastest
        assert coords[1].tp == (1 if tp > 1 else 0)
    with pytest.raises(ValueError, match=f"rank {base + plan.world_size} is outside plan"):
        coord_of(plan, base + plan.world_size, base)


def test_validation_names_the_bad_value():
    six = ModelSpec(name="six", num_layers=2, hidden_size=48, num_heads=6, num_kv_heads=2, head_dim=8,
                    ffn_hidden=96, vocab_size=64)
    with pytest.raises(ValueError, match="tp=3 does not divide six's 2 key/value heads; valid tp: 1, 2"):
        validate_plan(ParallelPlan(tp=3), six)
    with pytest.raises(ValueError, match="tp=8 does not divide qwen2.5-7b's 28 attention heads"):
        validate_plan(ParallelPlan(tp=8), MODEL_CATALOG["qwen2.5-7b"])
    with pytest.raises(ValueError, match="pp=3 exceeds six's 2 layers"):
        validate_plan(ParallelPlan(pp=3), six)
    with pytest.raises(ValueError, match="tp\\*pp\\*dp\\*cp = 2\\*1\\*1\\*1 = 2, but the stage has 4"):
        validate_plan(ParallelPlan(tp=2), six, world=4)
    assert validate_plan(ParallelPlan(tp=2, dp=-1), six, world=4) == ParallelPlan(tp=2, dp=2)
    with pytest.raises(ValueError, match="plan tp1-pp2-dp1: the runtime runs tp x dp plans"):
        check_tp_dp(ParallelPlan(pp=2), 2)
    with pytest.raises(ValueError, match="needs 4 ranks but the world has 2"):
        check_tp_dp(ParallelPlan(dp=4), 2)


def test_tp_check_on_hf_config_is_the_same_rule():
    from earl.runtime.hf_model import build_builtin
    from earl.runtime.tp import check_tp

    cfg = build_builtin("tiny", seed=0).model.config  # 4 heads, 2 key/value heads
    with pytest.raises(ValueError, match="tp=4 does not divide the model's 2 key/value heads"):
        check_tp(cfg, 4)


@pytest.mark.parametrize("module", ["earl.parallel", "earl.policies"])
def test_imports_without_torch(module):
    code = ("import sys; sys.modules['torch'] = None; sys.modules['simpy'] = None\n"
            f"import {module}\n"
            "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _groups_and_mesh():
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from earl.parallel import build_mesh, build_plan_groups

    plan = ParallelPlan(tp=2, dp=2, sharded_optimizer=True)
    g = build_plan_groups(plan)
    mesh = build_mesh(plan)
    opt_mesh = build_mesh(plan, dims=("tp", "dp"))
    rank = dist.get_rank()
    # a ZeRO-1 slice of a 7-row tensor as a DTensor gathers back to the full tensor
    p = ParamShape(shape=(7, 3), tp_dim=0)
    full = torch.arange(21.0).reshape(7, 3)
    lo, hi = local_bounds(p, plan, rank, optimizer=True)
    _, pl = placements(p, plan, optimizer=True)
    dt = DTensor.from_local(full[lo:hi].clone(), opt_mesh, pl, run_check=False, shape=full.shape,
                            stride=full.stride())
    return {"tp_ranks": g.tp_ranks, "dp_ranks": g.dp_ranks, "tp_rank": g.tp_rank, "dp_rank": g.dp_rank,
            "mesh_tp": tuple(dist.get_process_group_ranks(mesh.get_group("tp"))),
            "mesh_dp": tuple(dist.get_process_group_ranks(mesh.get_group("dp"))),
            "names": mesh.mesh_dim_names, "full_ok": bool(torch.equal(dt.full_tensor(), full))}


@pytest.mark.dist
def test_groups_and_mesh_agree():
    from earl.runtime.dist import run_local

    out = run_local(_groups_and_mesh, 4)
    for rank, o in enumerate(out):
        assert o["names"] == MESH_DIMS
        assert o["tp_ranks"] == o["mesh_tp"] == (rank - rank % 2, rank - rank % 2 + 1)
        assert o["dp_ranks"] == o["mesh_dp"] == (rank % 2, rank % 2 + 2)
        assert (o["dp_rank"], o["tp_rank"]) == divmod(rank, 2)
        assert o["full_ok"]


def test_fsdp_shard_error_lists_a_big_model_valid_dp_briefly():
    """A 7B-wide row-parallel weight (3584 input features) has 20 valid dp values: the error
    names the first 12 and says how many there are."""
    from earl.runtime.parallelize import fsdp_shard_error

    shapes = {"o.weight": ParamShape(shape=(3584, 3584), tp_dim=1)}
    msg = fsdp_shard_error(ParallelPlan(dp=3, sharded_optimizer=True), shapes)
    assert msg.endswith("valid dp with tp=1 and `zero`: 1, 2, 4, 7, 8, 14, 16, 28, 32, 56, 64, 112, ... "
                        "(20 values: the divisors of 3584) (or drop `zero`)"), msg


def test_deal_is_round_robin_and_covers_every_item_once():
    from earl.parallel import deal

    assert deal(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert deal(2, 4) == [[0], [1], [], []]
    assert deal(0, 2) == [[], []]
    for n, k in ((10, 1), (33, 8), (5, 5)):
        bins = deal(n, k)
        assert sorted(i for b in bins for i in b) == list(range(n))
        assert all(i % k == b for b, items in enumerate(bins) for i in items)
    with pytest.raises(ValueError, match="n_bins >= 1"):
        deal(3, 0)


def test_serving_peer_prefers_the_consumer_then_spreads_by_tp_offset():
    from earl.parallel import serving_peer

    assert serving_peer(4, 2, 5) == 5  # the consumer holds the data itself
    assert [serving_peer(4, 2, r) for r in (0, 1, 2, 3, 8)] == [4, 5, 4, 5, 4]
    assert serving_peer(0, 1, 7) == 0
