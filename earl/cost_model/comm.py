"""Communication costs: alpha-beta collectives on a two-level topology (NVLink inside a node,
NICs across nodes).

Collective volumes follow Thakur, Rabenseifner & Gropp (2005) and NCCL's bus-bandwidth notes:
ring all-reduce moves 2(p-1)/p of the message per rank in 2(p-1) steps; all-gather,
reduce-scatter and all-to-all move (p-1)/p in p-1 steps.

    python -c "from earl.cost_model.comm import *; help(allreduce_s)"
"""

from __future__ import annotations

import math

from earl.cost_model.profile import COLLECTIVES, HardwareProfile, LinkParams
from earl.specs import ClusterSpec


def inter_node_link(cluster: ClusterSpec, ranks_per_node_sharing: int) -> LinkParams:
    """Per-rank link across nodes when `ranks_per_node_sharing` ranks of a node use the NICs
    at once (they split the node's bandwidth)."""
    net = cluster.network
    share = max(1, min(ranks_per_node_sharing, cluster.gpus_per_node))
    return LinkParams(alpha_s=net.latency_s, bw_bytes_s=net.node_bw_bytes_s / share)


def in_node(cluster: ClusterSpec, group_size: int, stride: int = 1) -> bool:
    """Whether a group of `group_size` ranks spaced `stride` apart fits inside one node."""
    return (group_size - 1) * stride < cluster.gpus_per_node


def group_link(cluster: ClusterSpec, profile: HardwareProfile, group_size: int, stride: int = 1,
               concurrent_groups: bool = True, collective: str = "p2p") -> LinkParams:
    """The bottleneck link of a group of `group_size` ranks spaced `stride` apart.

    A group that fits inside one node uses NVLink. One that spans nodes is limited by the NICs;
    when every GPU of a node is in some such group at once (`concurrent_groups`), the node's
    bandwidth is split among its GPUs. Inside a node, a calibrated profile may carry a link
    fitted for this `collective`."""
    if group_size <= 1:
        return LinkParams(alpha_s=0.0, bw_bytes_s=float("inf"))
    if in_node(cluster, group_size, stride):
        return profile.link_for(collective)
    sharing = cluster.gpus_per_node if concurrent_groups else max(1, cluster.gpus_per_node // stride)
    return inter_node_link(cluster, sharing)


def allreduce_s(nbytes: float, p: int, link: LinkParams, switched: bool = False) -> float:
    """The faster of a ring (bandwidth-optimal) and a tree / recursive-doubling all-reduce
    (latency-optimal, 2 log2 p steps of the whole message), as NCCL picks by size.
    `switched`: the p GPUs sit on one full-crossbar switch (NVSwitch), where a two-shot
    all-reduce (reduce-scatter then all-gather, each rank addressing every peer at once: NCCL's
    NVLS algorithm, vLLM's custom all-reduce) pays the ring's bytes but two latencies, not
    2(p - 1)."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    ring = 2 * (p - 1) / p * nbytes / link.bw_bytes_s + 2 * (p - 1) * link.alpha_s
    tree = 2 * math.ceil(math.log2(p)) * (link.alpha_s + nbytes / link.bw_bytes_s)
    if switched:
        return min(ring, tree, 2 * (p - 1) / p * nbytes / link.bw_bytes_s + 2 * link.alpha_s)
    return min(ring, tree)


def allgather_s(nbytes: float, p: int, link: LinkParams, bytes_p: int | None = None) -> float:
    """`nbytes` is the size of the gathered (full) result. `bytes_p`: the group size whose
    (p - 1) / p share of the bytes a rank moves (default p; see `bytes_group`)."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    q = p if bytes_p is None else bytes_p
    return (q - 1) / q * nbytes / link.bw_bytes_s + (p - 1) * link.alpha_s


# Ranks that move a collective's bytes with their own CPU (gloo over loopback on one host) do
# about a whole gathered tensor's work each, whatever the group: all-gathers of 16 / 64 MiB on
# the 2-vCPU EPYC (2026-12-04, studies/cpu_allgather_ranks.py, two runs) took 6.6-7.5 / 50-52
# ms of CPU a rank at 2 ranks and +5-18% at 4 (a ring's (p - 1) / p share says +50%; the
# 0.25-4 MiB sizes scatter x0.55-1.48 run to run); on the 2-vCPU Xeon (2026-12-07, three runs)
# x0.90-1.44 at 4-16 MiB and x1.02-1.07 at 64 MiB. Its link is fitted between 2 ranks
# (earl.calibrate.collectives), so the bytes stay at the 2-rank share there; where the ranks
# outnumber the cores, the oversubscription stretch prices the rest (earl.calibrate.hostload). A
# reduce-scatter is not so: each rank adds what it receives, and its CPU a rank grew in every run,
# x1.26-1.45 at 4-16 MiB and x1.14-1.18 at 64 MiB from 2 to 4 ranks (the Xeon, 2026-12-07, three
# runs, `studies/cpu_allgather_ranks.py --op reduce_scatter`; a ring says x1.5): its bytes keep
# the group's share (REDUCING; docs/validate-history.md, thirty-sixth session)
HOST_COPY_BYTES_P = 2
REDUCING = ("reducescatter",)


def bytes_group(cluster: ClusterSpec, profile: HardwareProfile, p: int, stride: int = 1,
                collective: str = "allgather") -> int:
    """The group size whose byte share a `collective` of `p` ranks spaced `stride` apart is
    priced at: p over a device link (`DispatchPath.full_duplex`: NVLink), across nodes (a NIC) or
    for a collective that reduces what it receives (REDUCING), at most HOST_COPY_BYTES_P where the
    group shares one host whose ranks copy the bytes with their own CPUs (`full_duplex` False: a
    CPU host)."""
    if profile.dispatch_path.full_duplex or not in_node(cluster, p, stride) or collective in REDUCING:
        return p
    return min(p, HOST_COPY_BYTES_P)


reducescatter_s = allgather_s
alltoall_s = allgather_s


def p2p_s(nbytes: float, link: LinkParams) -> float:
    return 0.0 if nbytes <= 0 else link.alpha_s + nbytes / link.bw_bytes_s


def collective_s(kind: str, nbytes: float, p: int, link: LinkParams) -> float:
    """Time of one collective by name (see COLLECTIVES)."""
    if kind == "allreduce":
        return allreduce_s(nbytes, p, link)
    if kind in ("allgather", "reducescatter", "alltoall"):
        return allgather_s(nbytes, p, link)
    if kind == "p2p":
        return p2p_s(nbytes, link)
    raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(COLLECTIVES)}")
