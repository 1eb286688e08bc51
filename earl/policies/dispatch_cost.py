"""Price a dispatch the one way: build the layouts, ask the dispatcher for its TransferPlan, and
price that plan (earl.cost_model.dispatch.price_transfer_plan). `earl estimate dispatch` and the
studies call `estimate_dispatch`; the simulator and the benchmark build their own layouts and
call the pricing function on the plan they make.

Layouts for a what-if (`dispatch_layouts`): `batch` samples of `context` tokens, GRPO groups of
`group_size`; producer dp group d holds what rollout deals it (`earl.parallel.deal`: sample i on
replica i mod dp, as the runtime and the simulator deal episodes); the training layout gives dp
group d a contiguous block of them (token-balanced for equal lengths, and independent of who
produced them: the general case a re-shard creates, where most samples change hands).

    earl estimate dispatch --model qwen2.5-72b --gpus 128 --tp 4 --batch 1024 --context 16384 \
        --dispatcher layout-aware --network tcp-200g
"""

from __future__ import annotations

from functools import lru_cache

from earl.cost_model.dispatch import price_transfer_plan
from earl.cost_model.model import CostModel, Estimate
from earl.parallel import deal, validate_plan
from earl.policies.registry import make_dispatcher
from earl.policies.types import Layout, Sample
from earl.specs import ParallelPlan


def dispatch_layouts(src: ParallelPlan, dst: ParallelPlan, batch: int, context: int, group_size: int = 8
                     ) -> tuple[list[Sample], Layout, Layout]:
    """(samples, producer layout, training layout) of a what-if dispatch (see module doc)."""
    if batch < 1 or context < 1:
        raise ValueError(f"dispatch needs batch >= 1 and context >= 1, got {batch}, {context}")
    samples = [Sample(id=i, tokens=context, group=i // group_size) for i in range(batch)]
    src_assign = tuple(tuple(b) for b in deal(batch, src.dp))
    block = -(-batch // dst.dp)
    dst_assign = tuple(tuple(range(d * block, min(batch, (d + 1) * block))) for d in range(dst.dp))
    return samples, Layout(src, src_assign), Layout(dst, dst_assign)


@lru_cache(maxsize=16)
def _what_if_plan(kind: str, src: ParallelPlan, dst: ParallelPlan, batch: int, context: int):
    """The dispatcher's plan for a what-if (cached: studies price one plan on several networks;
    callers never mutate it)."""
    samples, s_layout, d_layout = dispatch_layouts(src, dst, batch, context)
    return make_dispatcher(kind).plan(s_layout, d_layout, samples)


def estimate_dispatch(cm: CostModel, kind: str, src: ParallelPlan, dst: ParallelPlan, batch: int,
                      context: int) -> Estimate:
    """Move the experience tensors of `batch` sequences from `src`'s layout to `dst`'s with
    dispatcher `kind`, priced on `cm`'s links and host paths."""
    validate_plan(dst, cm.model)
    tplan = _what_if_plan(kind, src, dst, batch, context)
    est = price_transfer_plan(cm, tplan, samples=batch, producers=src.dp,
                              world=max(src.world_size, dst.world_size), plan=dst)
    est.tokens = batch * context
    return est
