"""Execute a dispatcher's TransferPlan on torch.distributed: the experience tensors of every
sample move from the ranks that produced them to the training ranks that need them.

Both dispatchers of `earl.policies.dispatch` run here, from the same executor: `centralized`
gathers on the controller (which computes the advantages) and scatters; `layout-aware`
computes advantages in place and sends each consumer its share point-to-point. Each phase posts
all its sends and receives at once; what a rank ends up holding is checked against the plan
(exactly once, exactly what its layout needs). Tensors the plans do not price can ride along
(`extra`, `carry_along`). More: docs/runtime.md, "Design notes".

    OMP_NUM_THREADS=1 python benchmarks/bench_dispatch.py
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from earl.policies.dispatch import required_sets
from earl.policies.types import TENSOR_BYTES_PER_SAMPLE, Layout, Sample, TransferPlan
from earl.runtime.advantages import (
    AdvantageSpec,
    Store,
    distributed_advantages,
    fill_advantages,
    local_stats,
)
from earl.runtime.dist import comm_device

TENSOR_DTYPES: dict[str, torch.dtype] = {
    "input_ids": torch.int64,
    "loss_mask": torch.bool,
    "old_logprobs": torch.float32,
    "engine_logprobs": torch.float32,  # the rollout engine's sampling log-probs
    "ref_logprobs": torch.float32,
    "advantages": torch.float32,
    "rewards": torch.float32,  # one value per sample
    "token_rewards": torch.float32,  # REINFORCE++ inputs, staged at the controller (centralized)
    "turn_ids": torch.int64,
    "legal_bits": torch.int64,  # the env's legal actions per move (trainer.legal_coef), bits over env.actions
}
# What the rollout -> experience hand-off moves per episode (the same executor, other tensors).
HANDOFF_TENSORS: tuple[str, ...] = ("input_ids", "loss_mask", "engine_logprobs", "token_rewards", "turn_ids",
                                    "rewards")
# The tensor whose routes `extra` tensors follow (the last pipeline stage's, staged at a controller too).
CARRIER = "old_logprobs"


@dataclass(frozen=True, kw_only=True)
class DispatchStats:
    """What one rank did during one dispatch."""

    kind: str  # dispatcher name
    # wall time on this rank, s: from entering the executor (or its start barrier's end) to the last unpack
    seconds: float
    phase_s: tuple[float, ...]  # per phase
    advantage_s: float  # computing advantages (incl. the stats all-reduce for layout-aware)
    bytes_sent: int
    bytes_recv: int
    messages: int
    # whether this rank waited for peers (a barrier, a phase that sends, a statistics all-reduce);
    # False for a plan of local copies (TransferPlan.waits_for_peers) or one process
    waited: bool = False
    reductions: int = 0  # statistics reductions issued between ranks (0 in one process)


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------
def _pieces(transfer, tokens: dict[int, int]):
    """(sample id, start, stop) for each sample of a transfer."""
    ranges = transfer.token_ranges or tuple((0, tokens[i]) for i in transfer.sample_ids)
    return list(zip(transfer.sample_ids, ranges, strict=True))


def _nbytes(name: str, a: int, b: int) -> int:
    if name in TENSOR_BYTES_PER_SAMPLE:
        return TENSOR_BYTES_PER_SAMPLE[name]
    return (b - a) * torch.empty((), dtype=TENSOR_DTYPES[name]).element_size()


def pack_transfer(transfer, store: Store, tokens: dict[int, int]) -> torch.Tensor:
    """One transfer's pieces of `store` (its samples' token ranges of its tensors) as one flat
    buffer, the message the executor sends (`unpack_transfer` reads it back)."""
    parts = []
    for i, (a, b) in _pieces(transfer, tokens):
        for name in transfer.tensors:
            t = store[i][name]
            t = t.reshape(1) if name in TENSOR_BYTES_PER_SAMPLE else t[a:b]
            parts.append(t.contiguous().view(torch.uint8))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def unpack_transfer(transfer, buf: torch.Tensor, tokens: dict[int, int], out: Store,
                    counts: dict[tuple[int, str], int]) -> None:
    """Write the pieces of a `pack_transfer` buffer into `out` (`counts`: pieces received per
    (sample, tensor))."""
    off = 0
    for i, (a, b) in _pieces(transfer, tokens):
        for name in transfer.tensors:
            n = _nbytes(name, a, b)
            out.setdefault(i, {})[name] = buf[off:off + n].cpu().clone().view(TENSOR_DTYPES[name])
            counts[(i, name)] = counts.get((i, name), 0) + 1
            off += n


def _copy(transfer, store: Store, tokens: dict[int, int], out: Store,
          counts: dict[tuple[int, str], int]) -> None:
    for i, (a, b) in _pieces(transfer, tokens):
        for name in transfer.tensors:
            t = store[i][name]
            out.setdefault(i, {})[name] = t.reshape(1) if name in TENSOR_BYTES_PER_SAMPLE else t[a:b]  # a view
            counts[(i, name)] = counts.get((i, name), 0) + 1


def carry_along(tplan: TransferPlan, extra: tuple[str, ...]) -> TransferPlan:
    """`tplan` with the per-token tensors `extra` added to every transfer that carries the old
    log-probs, its bytes counted."""
    if not extra:
        return tplan
    per_token = sum(torch.empty((), dtype=TENSOR_DTYPES[name]).element_size() for name in extra)

    def extend(tr):
        if CARRIER not in tr.tensors:
            return tr
        ntok = sum(b - a for a, b in tr.token_ranges)
        return dataclasses.replace(tr, tensors=tr.tensors + tuple(extra), bytes=tr.bytes + ntok * per_token)

    return dataclasses.replace(tplan, phases=[[extend(tr) for tr in phase] for phase in tplan.phases])


# --------------------------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------------------------
def execute_dispatch(tplan: TransferPlan, store: Store, samples: list[Sample], src: Layout, dst: Layout, *,
                     advantages: AdvantageSpec = AdvantageSpec(), tensors: tuple[str, ...] | None = None,
                     extra: tuple[str, ...] = (), rank: int | None = None,
                     check: bool = True, rewards: dict[int, float] | None = None,
                     turns: int | None = None,
                     stats: dict[int, torch.Tensor] | None = None,
                     start_barrier: bool = False) -> tuple[Store, DispatchStats]:
    """Run `tplan` from this rank's `store` (the samples it produced, with rewards). Returns
    the samples this rank needs for training under `dst` (per-token tensors + advantages) and
    timings. Collective over every rank of the world.

    With `tensors`, the plan's routes carry those tensors instead and no advantages are
    computed: the rollout -> experience hand-off (`HANDOFF_TENSORS`) runs on the same plan.
    `extra` per-token tensors travel with the old log-probs (`carry_along`). `rewards`: every
    sample's episode reward, known to every rank (the runtime's metadata all-gather): a group
    estimator's statistics then need no round between ranks (`AdvantageSpec.stats_from`), and
    the plan's statistics reduce (`TransferPlan.reduce_bytes`) is not run. `turns`: the most
    rewarded turns of any sample, known to every rank (the same all-gather): a per-turn
    baseline's keys then need no agreement round (`AdvantageSpec.reductions`). `stats`: the
    batch statistics themselves, known to every rank (`summed_stats` of the episodes' key sums
    in that all-gather): no round at all. `start_barrier`: line the ranks up first, so that
    `seconds` times the moves, not the arrival skew (the executor until 2026-12-06; a round every
    dispatch pays, which the moves do not need: a rank that arrives early waits in its first
    receives instead; benchmarks/bench_dispatch_barrier.py measures both)."""
    rank = (dist.get_rank() if dist.is_initialized() else 0) if rank is None else rank
    if tensors is not None:
        tplan = dataclasses.replace(tplan, phases=[
            [dataclasses.replace(tr, tensors=tuple(tensors)) for tr in phase] for phase in tplan.phases])
    tplan = carry_along(tplan, extra)
    device = comm_device()
    tokens = {s.id: s.tokens for s in samples}
    if tensors is not None or stats is not None or advantages.stats_from(rewards):  # no advantages,
        tplan = dataclasses.replace(tplan, reduce_bytes=0)  # or no round for their statistics
    waited = dist.is_initialized() and dist.get_world_size() > 1 and tplan.waits_for_peers
    if waited and start_barrier:  # never where the plan waits for no one: local copies, no statistics
        dist.barrier()
    t_start = time.perf_counter()
    adv_s = 0.0
    reductions = 0
    if tplan.kind != "centralized" and tensors is None:
        t0 = time.perf_counter()
        issued = distributed_advantages(store, samples, src, advantages, rank, rewards=rewards, turns=turns,
                                        stats=stats)
        adv_s = time.perf_counter() - t0
        if dist.is_initialized() and dist.get_world_size() > 1:  # between ranks
            reductions = issued
    held: Store = {i: dict(v) for i, v in store.items()}  # grows with staged data (centralized)
    phase_s = []
    sent = recv = msgs = 0
    delivered: Store = {}
    counts: dict[tuple[int, str], int] = {}
    for k, phase in enumerate(tplan.phases):
        t0 = time.perf_counter()
        final = k == len(tplan.phases) - 1
        out: Store = delivered if final else held
        phase_counts: dict[tuple[int, str], int] = counts if final else {}
        if not final and advantages.inputs and tensors is None:  # the controller computes advantages:
            # stage their inputs
            phase = [dataclasses.replace(tr, tensors=tr.tensors + advantages.inputs)
                     if "input_ids" in tr.tensors else tr for tr in phase]
        tag_of: dict[tuple[int, int], int] = defaultdict(int)
        works, inbox = [], []
        for tr in phase:  # receives first, then sends; tags count transfers per pair
            tag = tag_of[(tr.src, tr.dst)]
            tag_of[(tr.src, tr.dst)] += 1
            if tr.dst == rank and tr.src != rank:
                n = sum(_nbytes(name, a, b) for _, (a, b) in _pieces(tr, tokens) for name in tr.tensors)
                buf = torch.empty(n, dtype=torch.uint8, device=device)
                works.append(dist.irecv(buf, src=tr.src, tag=tag))
                inbox.append((tr, buf))
                recv += n
                msgs += 1
        tag_of.clear()
        for tr in phase:
            tag = tag_of[(tr.src, tr.dst)]
            tag_of[(tr.src, tr.dst)] += 1
            if tr.src == rank and tr.dst != rank:
                buf = pack_transfer(tr, held, tokens).to(device)
                works.append(dist.isend(buf, dst=tr.dst, tag=tag))
                sent += buf.numel()
                msgs += 1
            elif tr.src == rank:
                _copy(tr, held, tokens, out, phase_counts)
        for w in works:
            w.wait()
        for tr, buf in inbox:
            unpack_transfer(tr, buf, tokens, out, phase_counts)
        if not final and tplan.kind == "centralized" and rank == tplan.controller and tensors is None:
            t1 = time.perf_counter()
            fill_advantages(held, samples, local_stats(held, samples, advantages), advantages)
            adv_s += time.perf_counter() - t1
        phase_s.append(time.perf_counter() - t0)
    stats = DispatchStats(kind=tplan.kind, seconds=time.perf_counter() - t_start, phase_s=tuple(phase_s),
                          advantage_s=adv_s, bytes_sent=sent, bytes_recv=recv, messages=msgs, waited=waited,
                          reductions=reductions)
    if check:
        check_delivery(counts, dst, samples, rank, tensors, extra)
    return delivered, stats


def check_delivery(counts: dict[tuple[int, str], int], dst: Layout, samples: list[Sample],
                   rank: int, tensors: tuple[str, ...] | None = None, extra: tuple[str, ...] = ()) -> None:
    """Exactly once, exactly what the layout needs (raises RuntimeError otherwise)."""
    need = set(required_sets(dst, samples).get(rank, {}))
    if tensors is not None:
        need = {(i, name) for i in {i for i, _ in need} for name in tensors}
    need |= {(i, name) for i, carried in need if carried == CARRIER for name in extra}
    twice = sorted(k for k, c in counts.items() if c > 1)
    missing = sorted(need - counts.keys())
    extra = sorted(counts.keys() - need)
    if twice or missing or extra:
        raise RuntimeError(f"rank {rank}: dispatch delivered {len(twice)} tensors twice (e.g. {twice[:3]}), "
                           f"missed {len(missing)} (e.g. {missing[:3]}), {len(extra)} unneeded (e.g. {extra[:3]})")
