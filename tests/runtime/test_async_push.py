"""The async weight push through the re-shard planner (earl.policies.reshard.plan_pool_push,
executed by earl.runtime.move_weights.execute_reshard; earl.runtime.weight_push.WeightPush): the
plan covers every replica's whole tensors from the training pool only, spreading the sends over
the training ranks, and on 4 gloo processes (training tp1-dp2, two tp1 replicas) every replica
receives training's weights bit for bit.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_async_push.py
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from earl.parallel import ParamShape
from earl.policies.reshard import plan_pool_push, price_reshard
from earl.runtime.async_rl import Learner, Pools, Replica
from earl.runtime.dist import run_local
from earl.runtime.resolve import model_spec, selector_cost_model
from earl.runtime.run_config import RunConfig, apply_overrides
from earl.runtime.weight_push import WeightPush, WeightReceiver, weights_digest
from earl.specs import ParallelPlan

SHAPES = {"a": ParamShape(shape=(8, 4), tp_dim=0), "b": ParamShape(shape=(6,), tp_dim=None),
          "c": ParamShape(shape=(4, 10), tp_dim=1)}


@pytest.mark.parametrize("train,roll", [(1, 1), (2, 2), (3, 1), (1, 3)])
def test_pool_push_plan_covers_each_replica_from_the_training_pool(train, roll):
    src, dst = tuple(range(train)), tuple(range(train, train + roll))
    plan = plan_pool_push(SHAPES, ParallelPlan(dp=train), src, ParallelPlan(dp=roll), dst)
    assert (plan.src_ranks, plan.dst_ranks) == (src, dst)
    for r in dst:  # every replica gets every tensor whole, once
        for name, p in SHAPES.items():
            got = sorted((t.start, t.stop) for t in plan.transfers if t.dst == r and t.name == name)
            n = p.shape[p.shard_dim]
            assert got[0][0] == 0 and got[-1][1] == n and all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))
    assert {t.src for t in plan.transfers} <= set(src) and {t.dst for t in plan.transfers} <= set(dst)
    whole = sum(p.bytes_per_index() * p.shape[p.shard_dim] for p in SHAPES.values())
    assert plan.total_bytes == roll * whole
    if train > 1 and roll > 1:  # the sends spread over the training replicas
        assert len({t.src for t in plan.transfers}) == train


def test_pool_push_plan_errors_and_price():
    with pytest.raises(ValueError, match="needs 2 ranks"):
        plan_pool_push(SHAPES, ParallelPlan(dp=2), (0,), ParallelPlan(dp=1), (1,))
    with pytest.raises(ValueError, match="distinct ranks"):
        plan_pool_push(SHAPES, ParallelPlan(dp=1), (0,), ParallelPlan(dp=2), (1, 1))
    spec = model_spec(RunConfig().model.path)
    plan = plan_pool_push(SHAPES, ParallelPlan(dp=1), (0,), ParallelPlan(dp=1), (1,))
    assert price_reshard(plan, selector_cost_model(spec, "cpu-measured", 2)) > 0  # the cost model prices it


def _push_4():
    """Ranks 0-1 train (tp1-dp2, identical weights), ranks 2-3 are replicas: two pushes."""
    cfg = apply_overrides(RunConfig(), {"groups": 1, "group_size": 1})
    pools = Pools(train_ranks=(0, 1), rollout_ranks=(2, 3), how="test")
    group = dist.new_group([0, 1, 2, 3])
    rank = dist.get_rank()
    if rank in pools.train_ranks:
        from earl.parallel import build_plan_groups

        lr = Learner(cfg, build_plan_groups(ParallelPlan(dp=2)))
        push = WeightPush(lr.model, pools, group)
        sent = []
        for v in (1, 2):
            with torch.no_grad():
                for i, p in enumerate(lr.model.parameters()):
                    p.add_(0.01 * v * (i + 1))  # the same update on both training ranks
            sent.append(push.send(lr.model, version=v))
        push.end()
        return weights_digest(lr.model), sent
    rep = Replica(cfg, version=0)
    recv = WeightReceiver(WeightPush(rep.model, pools, group))
    recv.start()
    rep.take_newest(recv, at_least=2)
    recv.join()
    return weights_digest(rep.model), rep.version


@pytest.mark.dist
def test_push_through_the_planner_is_bitwise_on_4_processes():
    (d0, s0), (d1, s1), (d2, v2), (d3, v3) = run_local(_push_4, 4, timeout_s=300)
    assert d0 == d1 == d2 == d3 and v2 == v3 == 2
    assert all(b > 0 for b in (*s0, *s1))  # both training ranks sent a share of each push
