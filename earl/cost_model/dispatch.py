"""The one dispatch price: a dispatcher's TransferPlan on the link model plus explicit host paths.

`earl estimate dispatch`, the studies, the simulator and the dispatch benchmark all call
`price_transfer_plan` on the plan `dispatcher.plan(...)` returned (earl.policies.dispatch_cost
builds the layouts and the plan); nothing else prices a dispatch. Each phase lasts as long as
its slowest node (host work or NIC); then advantages, metadata and fixed costs. Parameters live
in the profile (`HardwareProfile.dispatch_path`, fitted by `earl calibrate`) and the network
(`NetworkSpec`). The per-phase terms one by one: docs/cost-model.md, "Design notes".

    earl estimate dispatch --model qwen2.5-72b --gpus 128 --tp 4 --batch 1024 --context 8192 \
        --dispatcher centralized --network tcp-200g
"""

from __future__ import annotations

import dataclasses
import math
from operator import attrgetter

import numpy as np

from earl.cost_model import comm
from earl.cost_model.model import CostModel, Estimate


def _first_seen(ranks: np.ndarray, size: int) -> np.ndarray:
    """The distinct values (0 <= value < size) of `ranks` in the order they first appear."""
    first = np.full(size, len(ranks))
    np.minimum.at(first, ranks, np.arange(len(ranks)))
    seen = np.flatnonzero(first < len(ranks))
    return seen[np.argsort(first[seen], kind="stable")]


def _phase_s(cm: CostModel, phase, central_rank: int | None, ppn: int) -> tuple[float, dict]:
    """Seconds of one phase and a few counters: {'busiest_bytes', 'messages', 'sent_bytes' (between
    distinct ranks), 'controller_bytes' (of those, to or from `central_rank`)}.

    Each transfer charges host work to its ranks (a local copy to its rank alone), its bytes to
    the ranks' NVLink ports (same node) or to the nodes' NICs; the phase lasts as long as its
    slowest node. Vectorised over the transfers; every sum adds its terms in the order of the
    transfers (per rank) and of the ranks' first appearance (per node), so the result is the
    same float as a loop over the transfers."""
    if not phase:
        return 0.0, {"busiest_bytes": 0.0, "messages": 0, "sent_bytes": 0.0, "controller_bytes": 0.0}
    path = cm.profile.dispatch_path
    g = cm.cluster.gpus_per_node
    intra = cm.profile.intra
    wire_bw = path.wire_bw_bytes_s or intra.bw_bytes_s
    m = len(phase)
    src, dst = (np.fromiter(map(attrgetter(k), phase), np.int64, m) for k in ("src", "dst"))
    nbytes = np.fromiter(map(attrgetter("bytes"), phase), np.float64, m)  # exact below 2**53
    pieces = np.fromiter(map(len, map(attrgetter("sample_ids"), phase)), np.int64, m) * \
        np.fromiter(map(len, map(attrgetter("tensors"), phase)), np.int64, m)
    local = src == dst
    sent = ~local
    # host work in the loop's order: the sender's term, the sender's as controller, the
    # receiver's, the receiver's as controller (a local copy: its one term; zeros add nothing)
    per_end = (path.message_s + pieces * path.object_s) + nbytes / path.copy_bw_bytes_s
    cols = 2 if central_rank is None else 4
    terms = np.zeros((m, cols))
    ends = np.empty((m, cols), np.int64)
    terms[:, 0] = np.where(local, pieces * path.object_s + nbytes / path.copy_bw_bytes_s, per_end)
    terms[:, cols // 2] = np.where(sent, per_end, 0.0)
    ends[:, : cols // 2], ends[:, cols // 2:] = src[:, None], dst[:, None]
    if central_rank is not None:
        ctrl = nbytes / path.controller_bw_bytes_s + pieces * path.controller_object_s
        terms[:, 1] = np.where(sent & (src == central_rank), ctrl, 0.0)
        terms[:, 3] = np.where(sent & (dst == central_rank), ctrl, 0.0)
    ends = ends.ravel()
    size = int(max(src.max(), dst.max())) + 1
    host = np.bincount(ends, weights=terms.ravel(), minlength=size)
    moved = np.bincount(np.concatenate([src[sent], dst[sent]]),
                        weights=np.concatenate([nbytes[sent], nbytes[sent]]), minlength=size)
    a, b = src // g, dst // g
    same = sent & (a == b)
    intra_out = np.bincount(src[same], weights=nbytes[same], minlength=size)
    intra_in = np.bincount(dst[same], weights=nbytes[same], minlength=size)
    wire = np.maximum(intra_in, intra_out) if path.full_duplex else intra_in + intra_out
    busy = host + np.where(wire > 0, intra.alpha_s + wire / wire_bw, 0.0)
    ranks = _first_seen(ends, size)  # the ranks with host work, in the loop's order
    nodes_of = ranks // g
    n_nodes = int(nodes_of.max()) + 1
    t_sum = np.bincount(nodes_of, weights=busy[ranks], minlength=n_nodes)
    t_max = np.full(n_nodes, -np.inf)
    np.maximum.at(t_max, nodes_of, busy[ranks])
    cross = sent & (a != b)
    nic_out = np.bincount(a[cross], weights=nbytes[cross], minlength=n_nodes)
    nic_in = np.bincount(b[cross], weights=nbytes[cross], minlength=n_nodes)
    pairs = np.unique(b[cross] * n_nodes + a[cross])  # (receiving node, sending node), distinct
    senders = np.bincount(pairs // n_nodes, minlength=n_nodes)
    net = cm.cluster.network
    node_bw = net.node_bw_bytes_s
    stretch = (ppn / path.host_parallel) ** path.oversubscribed_exp if ppn > path.host_parallel else 1.0
    present = np.unique(nodes_of)
    t_host = np.maximum(stretch * t_max[present], t_sum[present] / path.host_parallel)
    in_bw = np.where(senders[present] > 1, node_bw * net.incast_efficiency, node_bw)
    t_nic = np.maximum(nic_out[present] / node_bw, nic_in[present] / in_bw)
    worst = float(max(t_host.max(), (t_nic + np.where(t_nic > 0, net.latency_s, 0.0)).max(), 0.0))
    at_ctrl = sent & ((src == central_rank) | (dst == central_rank)) if central_rank is not None else np.zeros(m, bool)
    return worst, {"busiest_bytes": float(moved.max()) if sent.any() else 0.0, "messages": int(sent.sum()),
                   "sent_bytes": float(nbytes[sent].sum()), "controller_bytes": float(nbytes[at_ctrl].sum())}


def delivered(tplan) -> dict[int, tuple[int, int]]:
    """Rank -> (samples, tokens) its plan's last phase delivers to it (a sample split over
    context-parallel ranks counts once per rank, with the tokens of its share)."""
    out: dict[int, tuple[int, int]] = {}
    for tr in tplan.phases[-1] if tplan.phases else ():
        n, tok = out.get(tr.dst, (0, 0))
        out[tr.dst] = (n + len(tr.sample_ids), tok + sum(b - a for a, b in tr.token_ranges))
    return out or {0: (0, 0)}


def _local(tplan, br: dict[str, float], samples: int, world: int, plan) -> Estimate:
    """The estimate of a plan no executor round prices: host work only, nothing moved, no
    rank waits for another (`extras["waits"]`)."""
    return Estimate(stage="dispatch", time_s=sum(br.values()), feasible=True, gpus=world, plan=plan, breakdown=br,
                    extras={"dispatcher": tplan.kind, "moved_bytes": 0.0, "controller_bytes": 0.0,
                            "busiest_rank_bytes": 0.0, "messages": 0, "transfers": len(tplan.transfers),
                            "samples": samples, "waits": False})


def sync_rounds(tplan) -> int:
    """Rounds of the executor (earl.runtime.move_samples.execute_dispatch) at which every rank
    waits for its peers: each phase that sends a message between ranks, and per reduction of
    the advantage statistics (`TransferPlan.reductions`, when the plan reduces them) its gather
    to one rank and scatter back. A phase of local copies waits for no one. The executor lines
    its ranks up with no barrier first (until 2026-12-06 it did, one round more: an early rank
    now waits in its first receives, which the moves' first round is)."""
    if not tplan.waits_for_peers:
        return 0
    return tplan.talking_phases + (2 * tplan.reductions if tplan.reduce_bytes else 0)


def stat_reductions(tplan) -> int:
    """The statistics reductions among `sync_rounds`' rounds (two rounds each): the plan's
    `reductions` where it reduces statistics and waits for its peers, else none."""
    return tplan.reductions if tplan.reduce_bytes and tplan.waits_for_peers else 0


def price_transfer_plan(cm: CostModel, tplan, *, samples: int, producers: int, world: int,
                        plan=None, control: bool = True, advantages: bool = True, cold: bool = True,
                        estimator: str | None = None, host_factor: float = 1.0, lead_s: float = 0.0) -> Estimate:
    """Price `tplan` (an earl.policies TransferPlan: `kind`, `controller`, `phases` of transfers
    with src, dst, bytes, sample_ids, tensors; `metadata_bytes`, `reduce_bytes`) moving
    `samples` samples made by `producers` data-parallel groups among `world` ranks.
    `control=False` leaves out the control plane (planning, metadata to the controller), the
    cold start of the executor (`DispatchPath.cold_round_s` a round, `cold_byte_s` a byte of the
    busiest rank) and the wake-ups of ranks
    that come to its rounds from other work (`DispatchPath.wake_sync_s`): what a benchmark that
    plans before it starts its clock and runs dispatches back to back measures.
    `advantages=False`: the executor moves the plan's tensors and computes no advantages (the
    runtime's rollout -> experience hand-off, `execute_dispatch(tensors=...)`): no advantage host
    work, no statistics all-reduce and none of its synchronising rounds.
    `cold=False`: the executor starts on warm caches (no `cold_round_s`): a training dispatch
    with no log-prob pass since the hand-off, which ran the same executor just before it.
    `estimator`: the advantage estimator the executor runs (AdvantageSpec.key), priced per
    sample and token by `HardwareProfile.advantage_s` (None: `sample_s`).
    `host_factor`: the multiplier on a hand-off's calibrated host work where it waits for no one
    (`CostModel.host_cold_factor` of the rollout's plan: right after a rollout whose weights the
    caches cannot hold), and on a CPU host on the executor's own work (its phases and the
    advantages) where it waits; its rounds and wake-ups are waits and keep their price.
    `lead_s`: host seconds each rank does after it leaves the dispatch before its next
    collective (a runtime training dispatch: its share of the batch collated, then the FSDP2
    step's start, `CostModel.dispatch_lead_s`);
    with the control plane, where the node's ranks outnumber its cores, the ranks that leave
    first do it on the cores the last one still needs (`leavers` in the breakdown)."""
    if not advantages:
        tplan = dataclasses.replace(tplan, reduce_bytes=0)
    if samples < 1 or producers < 1 or world < 1:
        raise ValueError(f"price_transfer_plan needs samples, producers and world >= 1, got "
                         f"{samples}, {producers}, {world}")
    prof = cm.profile
    if not advantages and (world == 1 or not tplan.waits_for_peers) and \
            prof.handoff_fixed_s + prof.handoff_seq_s + prof.handoff_token_s + prof.handoff_sample_s > 0:
        # a hand-off that waits for no one: every rank builds and copies its own episodes'
        # rows and plans and checks the whole step's, the calibrated host work of the busiest
        # (earl.calibrate.hostcost), the slowest of the ranks' spread (`CostModel.slowest_of`)
        local = host_factor * (max(prof.handoff_seq_s * n + prof.handoff_token_s * tok
                                   for n, tok in delivered(tplan).values())
                               + prof.handoff_sample_s * samples) * cm.slowest_of(world)
        return _local(tplan, {"local": local, **({"planning": host_factor * prof.handoff_fixed_s} if control else {})},
                      samples, world, plan)
    if world == 1:
        # one process: the runtime plans and copies rows locally (earl.runtime.step), no
        # executor runs; its calibrated host cost (earl.calibrate.hostcost) is the price
        return _local(tplan, {"local": prof.dispatch_seq_s * samples,
                              **({"planning": prof.dispatch_fixed_s} if control else {})}, samples, world, plan)
    path = cm.profile.dispatch_path
    g = cm.cluster.gpus_per_node
    ppn = min(world, g)  # processes on the busiest node
    central = tplan.controller if tplan.kind == "centralized" else None
    phase_s, busiest, messages, sent, at_ctrl = [], 0.0, 0, 0.0, 0.0
    for phase in tplan.phases:
        t, info = _phase_s(cm, phase, central, ppn)
        phase_s.append(t)
        busiest = max(busiest, info["busiest_bytes"])
        messages += info["messages"]
        sent += info["sent_bytes"]
        at_ctrl += info["controller_bytes"]
    br: dict[str, float] = {}
    tokens = 0.0  # per delivered sample, read only where the estimator is priced per token
    if advantages and estimator in prof.estimator_s:
        got = delivered(tplan).values()
        tokens = sum(tok for _, tok in got) / max(1, sum(n for n, _ in got))
    per_sample = prof.advantage_s(estimator, tokens)
    if central is not None:
        adv_s = samples * per_sample  # the controller alone, between its phases
        names = ("gather", "scatter") if len(phase_s) == 2 else tuple(f"phase{i}" for i in range(len(phase_s)))
    else:
        per = math.ceil(samples / producers) * per_sample
        adv_s = max(per, per * ppn / path.host_parallel)
        names = ("alltoall",) if len(phase_s) == 1 else tuple(f"phase{i}" for i in range(len(phase_s)))
    # on a host whose sends and receives are the ranks' own CPU work (not full duplex: a CPU
    # host), the executor's work after a rollout the caches could not hold runs as cold as the
    # hand-off's (`host_factor`; the held-out model's 2-rank dispatch ran x1.2-1.5 its hot price,
    # docs/validate-history.md, thirty-fourth session)
    cold_host = 1.0 if path.full_duplex else host_factor
    if advantages:
        br["advantages"] = adv_s * cold_host
    br.update(zip(names, [t * cold_host for t in phase_s], strict=True))
    # every rank waits for its peers at each of the executor's rounds: where the profile
    # measured a round (DispatchPath.round_cost_s) it is their price, and a statistics
    # reduction's two rounds are priced as the profile measured that reduction
    # (DispatchPath.reduce_cost_s, timed in the runtime's advantage code); both stand for the
    # links' latency. With its control plane (a runtime step's dispatch) the ranks come to the
    # rounds from other work, asleep on their sockets (`DispatchPath.wake_sync_s` where they
    # outnumber the cores), or the weight sync's wake-up term where larger: both are ranks asleep
    # in a gloo receive until a late peer sends, and the sync's is timed on ranks arriving apart
    # as the runtime's do (`HardwareProfile.reshard_wake_s`). Under the runtime's SCHED_BATCH loop
    # threads (earl.runtime.gloo_loops) the back-to-back barrier loop no longer spins and reads
    # 0.18-0.34 ms at 4 ranks on 2 cores, the staggered sync 0-1.2 ms (median 0.83 over eight
    # calibrations; docs/validate-history.md, thirty-fourth session). Without it, the executor called back
    # to back keeps them awake
    round_s = path.round_cost_s(ppn, asleep=control, wake_s=prof.reshard_wake_s) if world > 1 else 0.0
    rounds = sync_rounds(tplan)
    reductions = stat_reductions(tplan)
    if tplan.reduce_bytes and world > 1:
        link = comm.group_link(cm.cluster, cm.profile, world, collective="allreduce")
        if round_s:
            link = dataclasses.replace(link, alpha_s=0.0)
        br["advantage_stats"] = comm.allreduce_s(tplan.reduce_bytes, world, link) + \
            (reductions * path.reduce_cost_s(ppn) if round_s else 0.0)
    if round_s and rounds > 2 * reductions:
        br["rounds"] = (rounds - 2 * reductions) * round_s
    if control:
        if cold and world > 1 and (path.cold_round_s or path.cold_byte_s) and rounds:
            # the executor's rounds, started on cold caches, once per kind: a second statistics
            # reduction runs on what the first warmed (at 2 gloo ranks here the runtime's two took
            # ~0.4 ms more cold than warm, not 2 x 2 rounds); and the busiest rank's buffers refill
            br["cold_start"] = sync_rounds(dataclasses.replace(tplan, reductions=min(tplan.reductions, 1))) \
                * path.cold_round_s + busiest * path.cold_byte_s
        if tplan.metadata_bytes and world > 1:
            far = world - 1 if tplan.controller == 0 else 0
            br["metadata"] = cm.transfer_time_s(tplan.metadata_bytes, far, tplan.controller)
        # every rank plans the same dispatch (earl.runtime.step.train) as it reaches it: one
        # process's host work (calibrated alone). The window runs from the last rank's start, and
        # the ranks reach a runtime dispatch apart: the ones before it have planned and sleep in
        # their first receives (300 4-rank dispatches of the fifteen Xeon passes of 2026-12-07:
        # in 299 at most one other rank started within 0.6 ms before the last, 80 of 80 in four
        # EPYC passes; so no more ranks plan at once than 2 cores hold; until the thirty-eighth
        # session this was shared over the cores as if all planned at once: x ppn / host_parallel)
        br["planning"] = cm.profile.dispatch_fixed_s
        if lead_s and world > 1 and ppn > path.host_parallel:
            # the first ranks out start their next stage on the cores the last one still needs:
            # while they do `lead_s` each, ppn ranks share host_parallel cores, so the last one
            # runs at host_parallel / ppn of a core and loses lead_s x (ppn / host_parallel - 1)
            # (4 gloo ranks on 2 EPYC vCPUs, a dispatch followed by 0-1 ms of busy work before an
            # all-reduce: its window grew ~1 ms per ms of it up to ~1 ms, thirty-eighth session)
            br["leavers"] = lead_s * (ppn / path.host_parallel - 1.0)
    ctrl_bytes = at_ctrl if central is not None else float(tplan.metadata_bytes)
    return Estimate(stage="dispatch", time_s=sum(br.values()), feasible=True, gpus=world, plan=plan,
                    breakdown=br,
                    extras={"dispatcher": tplan.kind, "moved_bytes": sent,
                            "controller_bytes": float(ctrl_bytes), "busiest_rank_bytes": busiest,
                            "messages": messages, "transfers": sum(map(len, tplan.phases)), "samples": samples,
                            "waits": rounds > 0})
