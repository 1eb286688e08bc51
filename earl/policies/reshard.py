"""Re-shard planner: who sends which slices of which tensors to whom when a plan changes.

Pure Python (no torch): the runtime executes the plan with torch.distributed
(`earl.runtime.move_weights.execute_reshard`), the cost model and the simulator price it.

Which rank holds which slice of a tensor under a plan (weights: tp chunks; ZeRO-1 optimizer
state: dp sub-chunks of those; torch.chunk boundaries) is `earl.parallel.local_bounds`.

    python -c "from earl.policies.reshard import *; from earl.specs import ParallelPlan as P; \
print(plan_reshard({'w': ParamShape(shape=(8, 4), tp_dim=0)}, P(tp=2, dp=2), P(tp=4), 4).total_bytes)"
"""

from __future__ import annotations

from earl.parallel import ParamShape, check_tp_dp, holdings
from earl.policies.types import ReshardPlan, SliceTransfer
from earl.specs import ParallelPlan

OPT_SEP = "/"  # optimizer-state tensors are named "<param>/<state>", e.g. "w/exp_avg"


def opt_name(param: str, state: str) -> str:
    """The name of optimizer state `state` of parameter `param`: "w", "exp_avg" -> "w/exp_avg"."""
    return f"{param}{OPT_SEP}{state}"


def param_of(name: str) -> tuple[str, bool]:
    """The parameter a tensor name belongs to, and whether it is optimizer state:
    "w/exp_avg" -> ("w", True); "w" -> ("w", False)."""
    param, sep, _ = name.partition(OPT_SEP)
    return param, bool(sep)


def _plan_tensor(name: str, p: ParamShape, src: dict[int, tuple[int, int]],
                 dst: dict[int, tuple[int, int]], load: dict[int, int]) -> list[SliceTransfer]:
    """Cover every destination range from source ranges; prefer a local copy, else the least
    loaded holder (spreads the sends over source replicas)."""
    per_index = p.bytes_per_index()
    cuts = sorted({b for r in src.values() for b in r})
    out = []
    for dst_rank, (lo, hi) in sorted(dst.items()):
        if hi <= lo:
            continue
        edges = [lo] + [c for c in cuts if lo < c < hi] + [hi]
        for a, b in zip(edges, edges[1:], strict=False):
            holders = [r for r, (s, e) in sorted(src.items()) if s <= a and b <= e]
            assert holders, f"no source rank holds {name}[{a}:{b}]"
            if dst_rank in holders:
                chosen = dst_rank
            else:
                chosen = min(holders, key=lambda r: (load[r], (r - dst_rank) % (max(src) + 1)))
                load[chosen] += (b - a) * per_index
            out.append(SliceTransfer(src=chosen, dst=dst_rank, name=name, dim=p.shard_dim,
                                     start=a, stop=b, bytes=(b - a) * per_index))
    return out


def plan_reshard(param_shapes: dict[str, ParamShape], src_plan: ParallelPlan,
                 dst_plan: ParallelPlan, world: int, *,
                 optimizer_states: tuple[str, ...] = (), optimizer_itemsize: int | None = None) -> ReshardPlan:
    """The slices each rank sends to go from `src_plan`'s layout to `dst_plan`'s.

    `optimizer_states` (e.g. ("exp_avg", "exp_avg_sq")) adds one tensor per state and param,
    named "<param>/<state>", laid out by the optimizer rule of each plan, with
    `optimizer_itemsize` bytes per element (default: the parameter's; fp32 state of a bf16
    model is 4)."""
    check_tp_dp(src_plan, world, "source plan")
    check_tp_dp(dst_plan, world, "destination plan")
    load = {r: 0 for r in range(world)}
    transfers: list[SliceTransfer] = []
    for name in sorted(param_shapes):
        p = param_shapes[name]
        transfers += _plan_tensor(name, p, holdings(p, src_plan, optimizer=False),
                                  holdings(p, dst_plan, optimizer=False), load)
        q = p if optimizer_itemsize is None else ParamShape(shape=p.shape, tp_dim=p.tp_dim,
                                                            itemsize=optimizer_itemsize)
        for state in optimizer_states:
            transfers += _plan_tensor(opt_name(name, state), q,
                                      holdings(q, src_plan, optimizer=True),
                                      holdings(q, dst_plan, optimizer=True), load)
    return ReshardPlan(src_plan=src_plan, dst_plan=dst_plan, transfers=transfers)


def plan_pool_push(param_shapes: dict[str, ParamShape], src_plan: ParallelPlan, src_ranks: tuple[int, ...],
                   dst_plan: ParallelPlan, dst_ranks: tuple[int, ...]) -> ReshardPlan:
    """The weight slices that go from `src_plan`'s layout on the global ranks `src_ranks` to
    `dst_plan`'s on `dst_ranks`: two pools of one world, e.g. an async run's training pool
    (tp1-dpT on ranks 0..T-1) to its rollout replicas (R replicas of tp1: dp=R on ranks T..N-1).
    Plan rank i of each plan is global rank ranks[i]; each destination slice comes from the
    least loaded source holding it, so the sends spread over the source replicas."""
    for plan, ranks, what in ((src_plan, src_ranks, "source"), (dst_plan, dst_ranks, "destination")):
        check_tp_dp(plan, len(ranks), f"{what} plan")
        if plan.world_size != len(ranks) or len(set(ranks)) != len(ranks):
            raise ValueError(f"{what} plan {plan.short()} needs {plan.world_size} distinct ranks, got {ranks}")
    load = dict.fromkeys((*src_ranks, *dst_ranks), 0)
    transfers: list[SliceTransfer] = []
    for name in sorted(param_shapes):
        p = param_shapes[name]
        src = {src_ranks[i]: b for i, b in holdings(p, src_plan, optimizer=False).items()}
        dst = {dst_ranks[i]: b for i, b in holdings(p, dst_plan, optimizer=False).items()}
        transfers += _plan_tensor(name, p, src, dst, load)
    return ReshardPlan(src_plan=src_plan, dst_plan=dst_plan, transfers=transfers, src_ranks=tuple(src_ranks),
                       dst_ranks=tuple(dst_ranks))


def max_rank_bytes(plan: ReshardPlan) -> int:
    """The largest number of bytes any one rank sends or receives (the bandwidth bound's
    numerator: a rank's link moves its bytes one after another)."""
    sent: dict[int, int] = {}
    recv: dict[int, int] = {}
    for t in plan.transfers:
        if t.src != t.dst:
            sent[t.src] = sent.get(t.src, 0) + t.bytes
            recv[t.dst] = recv.get(t.dst, 0) + t.bytes
    return max([0, *sent.values(), *recv.values()])


def price_reshard(plan: ReshardPlan, cost_model, bucket_bytes: int = 32 * 2**20) -> float:
    """Seconds the cost model gives this exact plan: each rank sends its buckets to one peer
    after another and receives likewise (`cost_model.transfer_time_s` per message: latency +
    bytes over the link the two ranks share); ranks work in parallel, the slowest sets the time."""
    pair_bytes: dict[tuple[int, int], int] = {}
    for t in plan.transfers:
        if t.src != t.dst:
            pair_bytes[(t.src, t.dst)] = pair_bytes.get((t.src, t.dst), 0) + t.bytes
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    for (s, d), nbytes in pair_bytes.items():
        messages = max(1, -(-nbytes // bucket_bytes))
        t = sum(cost_model.transfer_time_s(nbytes / messages, s, d) for _ in range(messages))
        send[s] = send.get(s, 0.0) + t
        recv[d] = recv.get(d, 0.0) + t
    return max([0.0, *send.values(), *recv.values()])
