"""Re-shard planner properties (pure) and bit-exact round trips on real gloo ranks.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_reshard.py
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from earl.parallel import ParamShape, holdings
from earl.policies.reshard import max_rank_bytes, plan_reshard
from earl.runtime.dist import run_local
from earl.specs import ParallelPlan

STATES = ("exp_avg", "exp_avg_sq")


def _plans(world: int):
    out = []
    for tp in (1, 2, 4):
        for dp in (1, 2, 4):
            if tp * dp <= world:
                out.append(ParallelPlan(tp=tp, dp=dp))
                out.append(ParallelPlan(tp=tp, dp=dp, sharded_optimizer=True))
    return out


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 13), cols=st.integers(1, 7), tp_dim=st.sampled_from([None, 0, 1]),
       src=st.sampled_from(_plans(4)), dst=st.sampled_from(_plans(4)))
def test_plan_covers_every_destination_slice_exactly_once(rows, cols, tp_dim, src, dst):
    shapes = {"w": ParamShape(shape=(rows, cols), tp_dim=tp_dim)}
    plan = plan_reshard(shapes, src, dst, 4, optimizer_states=STATES)
    for name, opt in (("w", False), ("w/exp_avg", True), ("w/exp_avg_sq", True)):
        need = holdings(shapes["w"], dst, optimizer=opt)
        have = holdings(shapes["w"], src, optimizer=opt)
        got: dict[int, list[tuple[int, int]]] = {}
        for t in plan.transfers:
            if t.name != name:
                continue
            s, e = have[t.src]
            assert s <= t.start < t.stop <= e, "a rank sends a slice it does not hold"
            assert t.bytes == (t.stop - t.start) * 4 * (cols if (tp_dim in (None, 0)) else rows)
            got.setdefault(t.dst, []).append((t.start, t.stop))
        for r, (lo, hi) in need.items():
            pieces = sorted(got.get(r, []))
            pos = lo
            for a, b in pieces:
                assert a == pos, f"gap or overlap at rank {r}: {pieces} for [{lo}, {hi})"
                pos = b
            assert pos == hi or (lo == hi and not pieces)


def test_same_plan_moves_nothing_and_bound_counts_busiest_rank():
    shapes = {"w": ParamShape(shape=(8, 8), tp_dim=0), "b": ParamShape(shape=(8,), tp_dim=None)}
    p = ParallelPlan(tp=2, dp=2)
    assert plan_reshard(shapes, p, p, 4).total_bytes == 0
    plan = plan_reshard(shapes, ParallelPlan(tp=1, dp=1), ParallelPlan(tp=4), 4)
    # rank 0 holds everything and sends 3/4 of w plus b three times
    assert max_rank_bytes(plan) == 3 * (2 * 8 * 4) + 3 * 8 * 4


def test_bad_plans_raise():
    shapes = {"w": ParamShape(shape=(8, 8), tp_dim=0)}
    with pytest.raises(ValueError, match="needs 8 ranks"):
        plan_reshard(shapes, ParallelPlan(tp=8), ParallelPlan(), 4)
    with pytest.raises(ValueError, match="pp=1"):
        plan_reshard(shapes, ParallelPlan(pp=2), ParallelPlan(), 4)


def _roundtrip_worker(train: ParallelPlan, rollout: ParallelPlan):
    import torch.distributed as dist

    from earl.runtime.hf_model import build_builtin
    from earl.runtime.move_weights import allocate_local, execute_reshard, local_range
    from earl.runtime.tp import param_shapes

    rank = dist.get_rank()
    model = build_builtin("tiny-wide", seed=0).model
    full = {n: p.detach() for n, p in model.named_parameters()}
    shapes = param_shapes(model)
    names = list(full)
    opt_names = [f"{n}/{s}" for n in names for s in STATES]
    gen = torch.Generator().manual_seed(1)
    full_opt = {n: torch.randn(shapes[n.split("/")[0]].shape, generator=gen) for n in opt_names}

    def local(plan, name, source):
        p = shapes[name.split("/")[0]]
        lo, hi = local_range(shapes, plan, rank, name)
        return source[name].narrow(p.shard_dim, lo, hi - lo).clone()

    train_w = {n: local(train, n, full) for n in names}
    train_o = {n: local(train, n, full_opt) for n in opt_names}
    # train -> rollout (weights only), rollout -> train (weights), train -> new train (+ optimizer)
    to_roll = plan_reshard(shapes, train, rollout, dist.get_world_size())
    roll_w = allocate_local(shapes, rollout, rank, names)
    execute_reshard(to_roll, shapes, train_w, roll_w, bucket_bytes=4096)
    ok_roll = all(torch.equal(roll_w[n], local(rollout, n, full)) for n in names)
    back = allocate_local(shapes, train, rank, names)
    execute_reshard(plan_reshard(shapes, rollout, train, dist.get_world_size()), shapes, roll_w, back)
    ok_back = all(torch.equal(back[n], train_w[n]) for n in names)
    both = {**train_w, **train_o}
    moved = allocate_local(shapes, rollout, rank, names + opt_names)
    fwd = plan_reshard(shapes, train, rollout, dist.get_world_size(), optimizer_states=STATES)
    stats = execute_reshard(fwd, shapes, both, moved)
    again = allocate_local(shapes, train, rank, names + opt_names)
    execute_reshard(plan_reshard(shapes, rollout, train, dist.get_world_size(), optimizer_states=STATES),
                    shapes, moved, again)
    ok_opt = all(torch.equal(again[n], both[n]) for n in both)
    ok_opt_mid = all(torch.equal(moved[n], local(rollout, n, {**full, **full_opt})) for n in moved)
    return ok_roll, ok_back, ok_opt, ok_opt_mid, stats.messages


@pytest.mark.dist
@pytest.mark.parametrize("train,rollout", [
    (ParallelPlan(tp=2, dp=2, sharded_optimizer=True), ParallelPlan(tp=4)),
    (ParallelPlan(tp=1, dp=4, sharded_optimizer=True), ParallelPlan(tp=2, dp=2)),
])
def test_roundtrip_train_rollout_train_is_bit_exact(train, rollout):
    results = run_local(_roundtrip_worker, 4, train, rollout, timeout_s=120)
    for rank, (ok_roll, ok_back, ok_opt, ok_opt_mid, _) in enumerate(results):
        assert ok_roll, f"rank {rank}: rollout weights differ from the full model's slices"
        assert ok_back, f"rank {rank}: train -> rollout -> train changed weights"
        assert ok_opt_mid, f"rank {rank}: optimizer state landed in the wrong place"
        assert ok_opt, f"rank {rank}: optimizer state round trip not bit-exact"
    assert sum(r[4] for r in results) > 0


def test_cost_model_prices_the_plan_by_its_busiest_rank():
    from earl.cost_model import CostModel
    from earl.policies.reshard import price_reshard
    from earl.specs import HARDWARE_CATALOG, MODEL_CATALOG, ClusterSpec

    cm = CostModel(MODEL_CATALOG["tiny"], ClusterSpec(hardware=HARDWARE_CATALOG["cpu"], gpus_per_node=4))
    shapes = {"w": ParamShape(shape=(64, 64), tp_dim=0)}
    p = ParallelPlan(tp=2, dp=2)
    assert price_reshard(plan_reshard(shapes, p, p, 4), cm) == 0.0
    plan = plan_reshard(shapes, ParallelPlan(tp=1, dp=1), ParallelPlan(tp=4), 4)
    # rank 0 alone holds the tensor and sends a quarter to each of the three others in turn
    want = 3 * cm.transfer_time_s(16 * 64 * 4, 0, 1)
    assert price_reshard(plan, cm) == pytest.approx(want)
