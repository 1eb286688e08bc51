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

import math
from collections import defaultdict

from earl.cost_model import comm
from earl.cost_model.model import CostModel, Estimate


def _phase_s(cm: CostModel, phase, central_rank: int | None, ppn: int) -> tuple[float, dict]:
    """Seconds of one phase and a few counters: {'busiest_bytes', 'messages'}."""
    path = cm.profile.dispatch_path
    g = cm.cluster.gpus_per_node
    intra = cm.profile.intra
    wire_bw = path.wire_bw_bytes_s or intra.bw_bytes_s
    host: dict[int, float] = defaultdict(float)
    moved: dict[int, float] = defaultdict(float)  # bytes sent + received (ranks)
    intra_in: dict[int, float] = defaultdict(float)
    intra_out: dict[int, float] = defaultdict(float)
    nic_in: dict[int, float] = defaultdict(float)
    nic_out: dict[int, float] = defaultdict(float)
    senders: dict[int, set] = defaultdict(set)  # receiving node -> sending nodes
    messages = 0
    for t in phase:
        pieces = len(t.sample_ids) * len(t.tensors)
        if t.src == t.dst:  # a local copy: one piece read and written by the rank itself
            host[t.src] += pieces * path.object_s + t.bytes / path.copy_bw_bytes_s
            continue
        messages += 1
        for r in (t.src, t.dst):  # packed by the sender, unpacked by the receiver
            host[r] += path.message_s + pieces * path.object_s + t.bytes / path.copy_bw_bytes_s
            moved[r] += t.bytes
            if r == central_rank:
                host[r] += t.bytes / path.controller_bw_bytes_s + pieces * path.controller_object_s
        a, b = t.src // g, t.dst // g
        if a == b:
            intra_out[t.src] += t.bytes
            intra_in[t.dst] += t.bytes
        else:
            nic_out[a] += t.bytes
            nic_in[b] += t.bytes
            senders[b].add(a)
    if not host:
        return 0.0, {"busiest_bytes": 0.0, "messages": 0}
    by_node: dict[int, list[float]] = defaultdict(list)
    for r, h in host.items():
        wire = max(intra_in[r], intra_out[r]) if path.full_duplex else intra_in[r] + intra_out[r]
        by_node[r // g].append(h + (intra.alpha_s + wire / wire_bw if wire else 0.0))
    net = cm.cluster.network
    node_bw = net.node_bw_bytes_s
    worst = 0.0
    stretch = (ppn / path.host_parallel) ** path.oversubscribed_exp if ppn > path.host_parallel else 1.0
    for n in by_node.keys() | nic_in.keys() | nic_out.keys():
        times = by_node.get(n, [])
        t_host = max(stretch * max(times, default=0.0), sum(times) / path.host_parallel)
        in_bw = node_bw * (net.incast_efficiency if len(senders[n]) > 1 else 1.0)
        t_nic = max(nic_out[n] / node_bw, nic_in[n] / in_bw)
        worst = max(worst, t_host, t_nic + (net.latency_s if t_nic else 0.0))
    if ppn > path.host_parallel:
        worst += path.sync_s
    return worst, {"busiest_bytes": max(moved.values(), default=0.0), "messages": messages}


def sync_rounds(tplan) -> int:
    """Rounds of the executor (earl.runtime.move_samples.execute_dispatch) at which every rank
    waits for its peers: the start barrier, each phase, and the advantage statistics' gather to
    one rank and scatter back (when the plan reduces them)."""
    return 1 + len(tplan.phases) + (2 if tplan.reduce_bytes else 0)


def price_transfer_plan(cm: CostModel, tplan, *, samples: int, producers: int, world: int,
                        plan=None, control: bool = True) -> Estimate:
    """Price `tplan` (an earl.policies TransferPlan: `kind`, `controller`, `phases` of transfers
    with src, dst, bytes, sample_ids, tensors; `metadata_bytes`, `reduce_bytes`) moving
    `samples` samples made by `producers` data-parallel groups among `world` ranks.
    `control=False` leaves out the control plane (planning, metadata to the controller) and the
    cold start of the executor's rounds (`DispatchPath.cold_round_s`): what a benchmark that
    plans before it starts its clock and runs dispatches back to back measures."""
    if samples < 1 or producers < 1 or world < 1:
        raise ValueError(f"price_transfer_plan needs samples, producers and world >= 1, got "
                         f"{samples}, {producers}, {world}")
    if world == 1:
        # one process: the runtime plans and copies rows locally (earl.runtime.step), no
        # executor runs; its calibrated host cost (earl.calibrate.hostcost) is the price
        prof = cm.profile
        br = {"local": prof.dispatch_seq_s * samples, **({"planning": prof.dispatch_fixed_s} if control else {})}
        return Estimate(stage="dispatch", time_s=sum(br.values()), feasible=True, gpus=1, plan=plan, breakdown=br,
                        extras={"dispatcher": tplan.kind, "moved_bytes": 0.0, "controller_bytes": 0.0,
                                "busiest_rank_bytes": 0.0, "messages": 0, "transfers": len(tplan.transfers),
                                "samples": samples})
    path = cm.profile.dispatch_path
    g = cm.cluster.gpus_per_node
    ppn = min(world, g)  # processes on the busiest node
    oversubscribed = ppn > path.host_parallel
    central = tplan.controller if tplan.kind == "centralized" else None
    phase_s, busiest, messages = [], 0.0, 0
    for phase in tplan.phases:
        t, info = _phase_s(cm, phase, central, ppn)
        phase_s.append(t)
        busiest = max(busiest, info["busiest_bytes"])
        messages += info["messages"]
    br: dict[str, float] = {}
    if central is not None:
        br["advantages"] = samples * path.sample_s  # the controller alone, between its phases
        names = ("gather", "scatter") if len(phase_s) == 2 else tuple(f"phase{i}" for i in range(len(phase_s)))
    else:
        per = math.ceil(samples / producers) * path.sample_s
        br["advantages"] = max(per, per * ppn / path.host_parallel)
        names = ("alltoall",) if len(phase_s) == 1 else tuple(f"phase{i}" for i in range(len(phase_s)))
    br.update(zip(names, phase_s, strict=True))
    if tplan.reduce_bytes and world > 1:
        link = comm.group_link(cm.cluster, cm.profile, world, collective="allreduce")
        rounds = 2 * math.ceil(math.log2(world))
        br["advantage_stats"] = comm.allreduce_s(tplan.reduce_bytes, world, link) + \
            (rounds * path.sync_s if oversubscribed else 0.0)
    if control:
        if world > 1 and path.cold_round_s:  # the executor's rounds, started on cold caches
            br["cold_start"] = sync_rounds(tplan) * path.cold_round_s
        if tplan.metadata_bytes and world > 1:
            far = world - 1 if tplan.controller == 0 else 0
            br["metadata"] = cm.transfer_time_s(tplan.metadata_bytes, far, tplan.controller)
        br["planning"] = cm.profile.dispatch_fixed_s
    ctrl_bytes = sum(t.bytes for t in tplan.transfers if t.src != t.dst and tplan.controller in (t.src, t.dst)) \
        if central is not None else float(tplan.metadata_bytes)
    return Estimate(stage="dispatch", time_s=sum(br.values()), feasible=True, gpus=world, plan=plan,
                    breakdown=br,
                    extras={"dispatcher": tplan.kind, "moved_bytes": float(tplan.total_bytes),
                            "controller_bytes": float(ctrl_bytes), "busiest_rank_bytes": busiest,
                            "messages": messages, "transfers": len(tplan.transfers), "samples": samples})
