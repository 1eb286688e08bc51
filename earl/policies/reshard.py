"""Re-shard planner: who sends which slices of which tensors to whom when a plan changes.

Pure Python (no torch): the runtime executes the plan with torch.distributed
(`earl.runtime.reshard.execute_reshard`), the cost model and the simulator price it.

Layout of one tensor under a resolved `ParallelPlan` (pp = cp = 1; rank = base + dp*tp + tp):
- weights: rank (d, t) holds chunk t of `tp` along the tensor's `tp_dim` (the whole tensor when
  `tp_dim` is None, i.e. replicated); every dp replica holds a copy.
- optimizer state with `sharded_optimizer` and dp > 1 (ZeRO-1): the tp chunk is cut again into
  dp sub-chunks along the same dim (dim 0 for replicated tensors), rank (d, t) holds sub-chunk
  t*dp + d of tp*dp; without `sharded_optimizer` the state follows the weight layout.
Chunk boundaries are balanced: chunk i of k over n elements is [i*n//k, (i+1)*n//k).

    python -c "from earl.policies.reshard import *; from earl.specs import ParallelPlan as P; \
print(plan_reshard({'w': ParamShape(shape=(8, 4), tp_dim=0)}, P(tp=2, dp=2), P(tp=4), 4).total_bytes)"
"""

from __future__ import annotations

from dataclasses import dataclass

from earl.policies.types import ReshardPlan, SliceTransfer
from earl.specs import ParallelPlan

OPT_SEP = "/"  # optimizer-state tensors are named "<param>/<state>", e.g. "w/exp_avg"


@dataclass(frozen=True, kw_only=True)
class ParamShape:
    """What the planner needs to know about one full (unsharded) tensor."""

    shape: tuple[int, ...]  # full shape, elements per dim
    tp_dim: int | None  # dim split by tensor parallelism; None: replicated on every tp rank
    itemsize: int = 4  # bytes per element

    def __post_init__(self):
        if not self.shape or any(int(s) < 0 for s in self.shape):
            raise ValueError(f"ParamShape.shape must be a non-empty tuple of sizes, got {self.shape!r}")
        if self.tp_dim is not None and not (0 <= self.tp_dim < len(self.shape)):
            raise ValueError(f"ParamShape.tp_dim {self.tp_dim} out of range for shape {self.shape}")
        if self.itemsize < 1:
            raise ValueError(f"ParamShape.itemsize must be >= 1, got {self.itemsize}")

    @property
    def shard_dim(self) -> int:
        return 0 if self.tp_dim is None else self.tp_dim

    def bytes_per_index(self) -> int:
        """Bytes of one index along `shard_dim` (a row for dim 0, a column for dim 1, ...)."""
        n = self.itemsize
        for d, s in enumerate(self.shape):
            if d != self.shard_dim:
                n *= s
        return n


def shard_bounds(n: int, k: int, i: int) -> tuple[int, int]:
    """Balanced chunk i of k over n elements: [i*n//k, (i+1)*n//k)."""
    if not (0 <= i < k):
        raise ValueError(f"chunk index {i} out of range for {k} chunks")
    return i * n // k, (i + 1) * n // k


def check_plan(plan: ParallelPlan, world: int, what: str = "plan") -> None:
    """Re-sharding supports tp x dp plans (pp = cp = 1) within the world."""
    if plan.pp != 1 or plan.cp != 1:
        raise ValueError(f"{what} {plan.short()}: re-sharding supports pp=1 and cp=1 only")
    if plan.world_size > world:
        raise ValueError(f"{what} {plan.short()} needs {plan.world_size} ranks but the world has {world}")


def holdings(p: ParamShape, plan: ParallelPlan, *, optimizer: bool) -> dict[int, tuple[int, int]]:
    """rank -> (start, stop) along `p.shard_dim` of the full tensor it holds under `plan`."""
    n = p.shape[p.shard_dim]
    out = {}
    for d in range(plan.dp):
        for t in range(plan.tp):
            rank = d * plan.tp + t
            if p.tp_dim is None:
                lo, hi = 0, n
                if optimizer and plan.sharded_optimizer and plan.dp > 1:
                    lo, hi = shard_bounds(n, plan.dp, d)
            else:
                lo, hi = shard_bounds(n, plan.tp, t)
                if optimizer and plan.sharded_optimizer and plan.dp > 1:
                    a, b = shard_bounds(hi - lo, plan.dp, d)
                    lo, hi = lo + a, lo + b
            out[rank] = (lo, hi)
    return out


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
                 optimizer_states: tuple[str, ...] = ()) -> ReshardPlan:
    """The slices each rank sends to go from `src_plan`'s layout to `dst_plan`'s.

    `optimizer_states` (e.g. ("exp_avg", "exp_avg_sq")) adds one tensor per state and param,
    named "<param>/<state>", laid out by the optimizer rule of each plan."""
    check_plan(src_plan, world, "source plan")
    check_plan(dst_plan, world, "destination plan")
    load = {r: 0 for r in range(world)}
    transfers: list[SliceTransfer] = []
    for name in sorted(param_shapes):
        p = param_shapes[name]
        transfers += _plan_tensor(name, p, holdings(p, src_plan, optimizer=False),
                                  holdings(p, dst_plan, optimizer=False), load)
        for state in optimizer_states:
            transfers += _plan_tensor(f"{name}{OPT_SEP}{state}", p,
                                      holdings(p, src_plan, optimizer=True),
                                      holdings(p, dst_plan, optimizer=True), load)
    return ReshardPlan(src_plan=src_plan, dst_plan=dst_plan, transfers=transfers)


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
