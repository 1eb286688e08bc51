"""Data types the policies produce and the simulator / runtime consume.

Pure Python (no torch, no simpy). A `Layout` says which ranks hold which samples under a
ParallelPlan; a `TransferPlan` says who sends what to whom (executed by the runtime, priced by
the simulator and cost model); a `ReshardPlan` does the same for weight slices; a `Decision` is
a selector's answer with its reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from earl.parallel import RankCoord, rank_coords
from earl.specs import TENSOR_BYTES_PER_SAMPLE, TENSOR_BYTES_PER_TOKEN, ParallelPlan, Stage  # noqa: F401 (re-export)


@dataclass(frozen=True)
class Sample:
    """One sequence of the batch: its id and length in tokens."""

    id: int
    tokens: int
    group: int = 0  # advantage-normalisation group (e.g. the prompt index in GRPO)


@dataclass(frozen=True)
class Layout:
    """A plan plus which samples each data-parallel group holds.

    `assignment[d]` lists the sample ids of dp group `d`. Every rank of that group needs those
    samples; with cp > 1 a rank needs only its `cp` share of each sample's tokens.
    """

    plan: ParallelPlan
    assignment: tuple[tuple[int, ...], ...]  # per dp group: sample ids
    base_rank: int = 0

    def __post_init__(self):
        if len(self.assignment) != self.plan.dp:
            raise ValueError(f"Layout has {len(self.assignment)} dp groups of samples but "
                             f"plan {self.plan.short()} has dp={self.plan.dp}")

    @property
    def coords(self) -> list[RankCoord]:
        return rank_coords(self.plan, self.base_rank)

    def ranks_of_group(self, dp: int) -> list[RankCoord]:
        return [c for c in self.coords if c.dp == dp]


@dataclass(frozen=True)
class Transfer:
    """Bytes of some tensors of some samples moving from `src` to `dst` (src == dst: local)."""

    src: int
    dst: int
    sample_ids: tuple[int, ...]
    tensors: tuple[str, ...]
    bytes: int
    # Per sample (parallel to sample_ids): the (start, stop) token range carried. Empty: whole
    # samples, or per-sample scalars such as rewards (earl.policies.dispatch.cp_token_range).
    token_ranges: tuple[tuple[int, int], ...] = ()


@dataclass
class TransferPlan:
    """A dispatcher's output. `controller` is the rank that coordinates (metadata only for
    layout-aware; all data for centralized). `phases` groups transfers that may run
    concurrently; phase k+1 starts after phase k finishes (centralized: gather, then scatter)."""

    kind: str
    controller: int
    phases: list[list[Transfer]] = field(default_factory=list)
    metadata_bytes: int = 0  # bytes of control messages through the controller
    reduce_bytes: int = 0  # bytes of scalar all-reduces (e.g. advantage statistics) per rank
    # the reductions those bytes take, one after another, each a gather to one rank and a
    # scatter back (earl.runtime.advantages.reduce_small): one for per-key sums, two where a
    # per-turn baseline first agrees on the turn count (AdvantageSpec.reductions)
    reductions: int = 1

    @property
    def transfers(self) -> list[Transfer]:
        return [t for ph in self.phases for t in ph]

    @property
    def total_bytes(self) -> int:
        """Bytes crossing between distinct ranks."""
        return sum(t.bytes for t in self.transfers if t.src != t.dst)

    @property
    def talking_phases(self) -> int:
        """Phases that send a message between ranks (a phase of local copies waits for no one)."""
        return sum(any(t.src != t.dst for t in ph) for ph in self.phases)

    @property
    def waits_for_peers(self) -> bool:
        """Whether executing the plan makes any rank wait for another: a phase that sends, or a
        statistics all-reduce. The rollout -> experience hand-off onto the layout aligned with
        the rollout's copies every episode where it was played and does neither."""
        return bool(self.talking_phases or self.reduce_bytes)


@dataclass(frozen=True)
class SliceTransfer:
    """A slice of one parameter (or optimizer state) tensor moving between ranks.

    `src_range` / `dst_range` are (start, stop) element offsets along dim `dim` of the full
    (unsharded) tensor, equal in length."""

    src: int
    dst: int
    name: str
    dim: int
    start: int
    stop: int
    bytes: int


@dataclass
class ReshardPlan:
    """Who sends which weight slices to whom to go from one plan to another."""

    src_plan: ParallelPlan
    dst_plan: ParallelPlan
    transfers: list[SliceTransfer] = field(default_factory=list)
    # the global ranks each plan's ranks 0, 1, ... are (two pools of one world); () = themselves
    src_ranks: tuple[int, ...] = ()
    dst_ranks: tuple[int, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers if t.src != t.dst)


@dataclass(frozen=True)
class Decision:
    """A selector's answer: the plan, whether it changed, and why."""

    stage: Stage
    plan: ParallelPlan
    switched: bool
    reason: str
    predicted: dict = field(default_factory=dict)  # e.g. {"tokens_per_gpu_s": ..., "memory_frac": ...}
