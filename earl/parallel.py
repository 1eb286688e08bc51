"""The one home of layout math: plan validation against a model, rank coordinates, shard
bounds, and the process groups / device mesh of a plan (in the spirit of torchtitan's
`ParallelDims`). The cost model, the policies and the runtime all call these functions.

Rank order is tp fastest, then cp, pp, dp: rank = ((dp * pp_n + pp) * cp_n + cp) * tp_n + tp,
so tp groups are contiguous ranks (inside a node when tp <= gpus_per_node).

Shard bounds follow `torch.chunk` / DTensor `Shard` semantics: part i of `parts` over n
elements is [min(i*c, n), min(i*c + c, n)) with c = ceil(n / parts); trailing parts may be
short or empty. Local tensor-parallel slices and sharded-optimizer slices (FSDP2's shards) therefore map exactly
onto DTensor placements (`placements`, `build_mesh`), which is what checkpoints rely on.

Pure Python at import time (earl.policies imports it and never imports torch); the group and
mesh builders import torch when called.

    python -c "from earl.parallel import *; from earl.specs import ParallelPlan as P; \
print(rank_coords(P(tp=2, dp=2))[3], shard_bounds(10, 4, 3))"
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from earl.specs import ModelSpec, ParallelPlan

MESH_DIMS = ("dp", "tp")  # device-mesh dim names of a tp x dp plan, slowest first
OPTIMIZER_MESH_DIMS = ("tp", "dp")  # sharded-optimizer slices: tp chunk first, then its dp sub-chunk


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------
def check_tp_divides(tp: int, *, num_heads: int, num_kv_heads: int, ffn_hidden: int, name: str = "the model") -> None:
    """Whole query heads, whole key/value heads and whole MLP columns per tp rank."""
    for what, n in (("attention heads", num_heads), ("key/value heads", num_kv_heads),
                    ("MLP width", ffn_hidden)):
        if n % tp:
            valid = [d for d in range(1, num_kv_heads + 1)
                     if num_heads % d == 0 and num_kv_heads % d == 0 and ffn_hidden % d == 0]
            raise ValueError(f"tp={tp} does not divide {name}'s {n} {what}; valid tp: "
                             f"{', '.join(map(str, valid))}")


def validate_plan(plan: ParallelPlan, model: ModelSpec | None = None, *, world: int | None = None,
                  seq_len: int | None = None) -> ParallelPlan:
    """The plan resolved to `world` (a -1 degree inferred; the product checked) and checked
    against `model` (tp divides query and key/value heads and the MLP width; pp <= layers) and
    `seq_len` (cp divides it). Returns the resolved plan; ValueError names the bad value."""
    plan = plan.resolve(world) if world is not None else plan
    if model is not None:
        check_tp_divides(plan.tp, num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                 ffn_hidden=model.ffn_hidden, name=model.name)
        if plan.pp * plan.virtual_stages > model.num_layers:
            stages = f"pp={plan.pp}" + (f" x virtual_stages={plan.virtual_stages}" if plan.virtual_stages > 1 else "")
            raise ValueError(f"{stages} exceeds {model.name}'s {model.num_layers} layers")
    if seq_len is not None and seq_len % plan.cp:
        raise ValueError(f"cp={plan.cp} does not divide the sequence length {seq_len}")
    return plan


def check_tp_dp(plan: ParallelPlan, world: int, what: str = "plan") -> None:
    """The runtime (groups, re-sharding, checkpoints) runs tp x dp plans within the world."""
    if plan.pp != 1 or plan.cp != 1:
        raise ValueError(f"{what} {plan.short()}: the runtime runs tp x dp plans (pp=1, cp=1)")
    if plan.world_size > world:
        raise ValueError(f"{what} {plan.short()} needs {plan.world_size} ranks but the world has {world}")


# --------------------------------------------------------------------------------------------
# Rank coordinates
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankCoord:
    """Where a global rank sits in a plan's mesh (rank order: tp fastest, then cp, pp, dp)."""

    rank: int
    dp: int
    pp: int
    cp: int
    tp: int


def rank_of(plan: ParallelPlan, *, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0, base_rank: int = 0) -> int:
    """The global rank at a mesh coordinate."""
    for n, v, size in (("dp", dp, plan.dp), ("pp", pp, plan.pp), ("cp", cp, plan.cp), ("tp", tp, plan.tp)):
        if not 0 <= v < size:
            raise ValueError(f"{n} coordinate {v} out of range for plan {plan.short()} ({n}={size})")
    return base_rank + ((dp * plan.pp + pp) * plan.cp + cp) * plan.tp + tp


def coord_of(plan: ParallelPlan, rank: int, base_rank: int = 0) -> RankCoord:
    """The mesh coordinate of a global rank (inverse of `rank_of`)."""
    r = rank - base_rank
    if not 0 <= r < plan.world_size:
        raise ValueError(f"rank {rank} is outside plan {plan.short()} "
                         f"(ranks {base_rank}..{base_rank + plan.world_size - 1})")
    tp, r = r % plan.tp, r // plan.tp
    cp, r = r % plan.cp, r // plan.cp
    pp, dp = r % plan.pp, r // plan.pp
    return RankCoord(rank=rank, dp=dp, pp=pp, cp=cp, tp=tp)


def rank_coords(plan: ParallelPlan, base_rank: int = 0) -> list[RankCoord]:
    """Coordinates of every rank of a resolved plan, in rank order."""
    return [coord_of(plan, base_rank + r, base_rank) for r in range(plan.world_size)]


# --------------------------------------------------------------------------------------------
# Dealing items (episodes) to replicas
# --------------------------------------------------------------------------------------------
def deal(n_items: int, n_bins: int) -> list[list[int]]:
    """Items 0..n_items-1 dealt round-robin to `n_bins` bins: item i goes to bin i mod n_bins.
    The one rule by which rollout episodes reach rollout replicas (dp groups): the runtime plays
    what it deals, the simulator simulates it and dispatch pricing prices it."""
    if n_bins < 1 or n_items < 0:
        raise ValueError(f"deal needs n_items >= 0 and n_bins >= 1, got {n_items}, {n_bins}")
    return [list(range(b, n_items, n_bins)) for b in range(n_bins)]


def serving_peer(first_rank: int, tp: int, consumer: int) -> int:
    """The rank of the tp group starting at `first_rank` (ranks first_rank..first_rank+tp-1, all
    holding the same data) that sends to `consumer`: the consumer itself when it is one of them
    (a local copy), else the peer at the consumer's tp offset, so consumers spread over peers."""
    return consumer if 0 <= consumer - first_rank < tp else first_rank + consumer % tp


# --------------------------------------------------------------------------------------------
# Shard bounds
# --------------------------------------------------------------------------------------------
def shard_bounds(n: int, parts: int, i: int) -> tuple[int, int]:
    """Part i of `parts` over n elements, torch.chunk / DTensor Shard semantics:
    chunk = ceil(n / parts), start = min(i * chunk, n), stop = min(start + chunk, n)."""
    if parts < 1 or not 0 <= i < parts:
        raise ValueError(f"chunk index {i} out of range for {parts} chunks")
    chunk = -(-n // parts)
    start = min(i * chunk, n)
    return start, min(start + chunk, n)


@dataclass(frozen=True, kw_only=True)
class ParamShape:
    """What layout math needs to know about one full (unsharded) tensor."""

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
        """The dim tp (and FSDP2 over dp) cut: `tp_dim`, or 0 for replicated tensors."""
        return 0 if self.tp_dim is None else self.tp_dim

    def bytes_per_index(self) -> int:
        """Bytes of one index along `shard_dim` (a row for dim 0, a column for dim 1, ...)."""
        n = self.itemsize
        for d, s in enumerate(self.shape):
            if d != self.shard_dim:
                n *= s
        return n


def local_bounds(p: ParamShape, plan: ParallelPlan, rank: int, *, optimizer: bool) -> tuple[int, int]:
    """(start, stop) along `p.shard_dim` of the full tensor that `rank` holds under a tp x dp
    `plan`: weights are tp chunk t (the whole tensor when replicated); optimizer state with
    `sharded_optimizer` and dp > 1 (FSDP2's shard) is dp sub-chunk d of that; ranks outside the plan
    hold (0, 0)."""
    if plan.pp != 1 or plan.cp != 1:
        raise ValueError(f"plan {plan.short()}: tensor layouts are defined for tp x dp plans (pp=1, cp=1)")
    if not 0 <= rank < plan.world_size:
        return 0, 0
    c = coord_of(plan, rank)
    n = p.shape[p.shard_dim]
    lo, hi = (0, n) if p.tp_dim is None else shard_bounds(n, plan.tp, c.tp)
    if optimizer and plan.sharded_optimizer and plan.dp > 1:
        a, b = shard_bounds(hi - lo, plan.dp, c.dp)
        lo, hi = lo + a, lo + b
    return lo, hi


def holdings(p: ParamShape, plan: ParallelPlan, *, optimizer: bool) -> dict[int, tuple[int, int]]:
    """rank -> (start, stop) along `p.shard_dim` of the full tensor it holds under `plan`."""
    return {r: local_bounds(p, plan, r, optimizer=optimizer) for r in range(plan.world_size)}


def local_shape(p: ParamShape, plan: ParallelPlan, rank: int, *, optimizer: bool) -> tuple[int, ...]:
    lo, hi = local_bounds(p, plan, rank, optimizer=optimizer)
    shape = list(p.shape)
    shape[p.shard_dim] = hi - lo
    return tuple(shape)


@functools.lru_cache(maxsize=1 << 16)
def model_slice(plan: ParallelPlan, rank: int, *, num_layers: int, width: int,
                optimizer: bool = False) -> tuple[tuple[int, int], tuple[int, int]]:
    """The part of a whole model a rank holds, for pricing: its layer range (pp chunk of
    `num_layers`) and its range of `width` elements per layer (tp chunk; with `optimizer` and a
    sharded optimizer cut again among the dp x cp ranks sharing the weights, ZeRO). Cached: a
    selector prices the same candidate plans' re-shards every step."""
    c = coord_of(plan, rank)
    layers = shard_bounds(num_layers, plan.pp, c.pp)
    lo, hi = shard_bounds(width, plan.tp, c.tp)
    if optimizer and plan.sharded_optimizer:
        a, b = shard_bounds(hi - lo, plan.dp * plan.cp, c.dp * plan.cp + c.cp)
        lo, hi = lo + a, lo + b
    return layers, (lo, hi)


# --------------------------------------------------------------------------------------------
# Process groups and device meshes (torch imported on call)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanGroups:
    """This rank's place in a tp x dp plan and the process groups it talks over.

    `tp_group` joins the tp ranks of this rank's replica; `dp_group` joins the ranks holding the
    same tp shard in every replica. Ranks outside the plan (plan smaller than the world) have
    `active=False` and None groups."""

    plan: ParallelPlan
    rank: int
    active: bool
    tp_rank: int
    dp_rank: int
    tp_group: object
    dp_group: object
    tp_ranks: tuple[int, ...]
    dp_ranks: tuple[int, ...]


_GROUP_CACHE: dict[tuple[int, ...], object] = {}
_MESH_CACHE: dict[tuple, object] = {}


def _group(ranks: tuple[int, ...]):
    """A process group over `ranks`, created once. Every rank calls this for every group in
    the same order (torch.distributed.new_group is collective)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    key = (id(dist.group.WORLD), *ranks)  # a new default group (after destroy/init) gets new groups
    if key not in _GROUP_CACHE:
        from earl.runtime.gloo_loops import batched_threads  # a leaf module (os only)

        with batched_threads(dist.get_backend()):  # a gloo group starts its own event-loop thread
            _GROUP_CACHE[key] = dist.new_group(list(ranks))
    return _GROUP_CACHE[key]


def build_plan_groups(plan: ParallelPlan, rank: int | None = None) -> PlanGroups:
    """tp and dp groups of `plan` (ranks 0..plan.world_size-1). Collective: every rank of the
    world calls it with the same plan. Without a process group: world 1, None groups."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    check_tp_dp(plan, world)
    rank = (dist.get_rank() if dist.is_initialized() else 0) if rank is None else rank
    mine_tp = mine_dp = None
    for d in range(plan.dp):  # every rank creates every group, in the same order
        ranks = tuple(rank_of(plan, dp=d, tp=t) for t in range(plan.tp))
        g = _group(ranks)
        if rank in ranks:
            mine_tp = (ranks, g)
    for t in range(plan.tp):
        ranks = tuple(rank_of(plan, dp=d, tp=t) for d in range(plan.dp))
        g = _group(ranks)
        if rank in ranks:
            mine_dp = (ranks, g)
    if mine_tp is None or mine_dp is None:
        return PlanGroups(plan, rank, False, 0, 0, None, None, (), ())
    c = coord_of(plan, rank)
    return PlanGroups(plan, rank, True, c.tp, c.dp, mine_tp[1], mine_dp[1], mine_tp[0], mine_dp[0])


def build_mesh(plan: ParallelPlan, *, device_type: str = "cpu", dims: tuple[str, str] = MESH_DIMS):
    """A DeviceMesh over the plan's ranks with named dims, `("dp", "tp")` by default (the
    mesh's rank layout is the plan's: tp fastest). `dims=("tp", "dp")` transposes it, the mesh
    sharded-optimizer slices are placed on (tp chunk first, then its dp sub-chunk). Collective
    on first use; cached per default group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if sorted(dims) != sorted(MESH_DIMS):
        raise ValueError(f"mesh dims {dims!r}; valid: {MESH_DIMS} or {OPTIMIZER_MESH_DIMS}")
    world = dist.get_world_size() if dist.is_initialized() else 1
    check_tp_dp(plan, world)
    if plan.world_size != world:
        raise ValueError(f"a device mesh spans the world: plan {plan.short()} has {plan.world_size} "
                         f"ranks, the world {world}")
    key = (id(dist.group.WORLD) if dist.is_initialized() else None, plan.dp, plan.tp, device_type, dims)
    if key not in _MESH_CACHE:
        ranks = torch.arange(world).reshape(plan.dp, plan.tp)  # == rank_of(plan, dp=d, tp=t)
        if dims != MESH_DIMS:
            ranks = ranks.T.contiguous()
        from earl.runtime.gloo_loops import batched_threads  # a leaf module (os only)

        with batched_threads(dist.get_backend() if dist.is_initialized() else "gloo"):  # its sub-groups
            _MESH_CACHE[key] = DeviceMesh(device_type, ranks, mesh_dim_names=dims)
    return _MESH_CACHE[key]


def placements(p: ParamShape, plan: ParallelPlan, *, optimizer: bool) -> tuple[tuple[str, str], tuple]:
    """(mesh dims, DTensor placements) under which this rank's `local_bounds` slice of `p` is
    exactly its DTensor local shard: weights on the ("dp", "tp") mesh, replicated over dp and
    sharded over tp along `tp_dim`; sharded-optimizer slices on the ("tp", "dp") mesh, sharded
    first over tp, then over dp along `shard_dim`."""
    from torch.distributed.tensor import Replicate, Shard

    tp_pl = Replicate() if p.tp_dim is None else Shard(p.tp_dim)
    if optimizer and plan.sharded_optimizer and plan.dp > 1:
        return OPTIMIZER_MESH_DIMS, (tp_pl, Shard(p.shard_dim))
    return MESH_DIMS, (Replicate(), tp_pl)

