"""SimPy entities of the cluster: GPUs with memory accounting, NVLink ports and node NICs.

Links are SimPy resources, so concurrent transfers through the same port queue behind each
other (a store-and-forward approximation of bandwidth sharing: n flows of b bytes through one
port finish after n * b / bandwidth, as with fair sharing, though the first ones finish
earlier). Intra-node transfers hold the sender's NVLink egress and the receiver's NVLink
ingress; inter-node transfers hold the sending node's NIC egress and the receiving node's NIC
ingress (capacity = NICs per node). Each transfer's duration is the cost model's uncontended
point-to-point time; contention comes only from queueing.

    python -c "import simpy; from earl.sim.cluster import Cluster; help(Cluster)"
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import simpy

from earl.specs import ClusterSpec


@dataclass
class Gpu:
    """One accelerator: its place in the cluster."""

    rank: int
    node: int
    hbm_bytes: float  # device memory, bytes


@dataclass
class HeldMemory:
    """What each GPU holds: every stage runs on the whole cluster with one per-GPU footprint (the
    cost model's MemoryBreakdown.total), so one record stands for all GPUs."""

    hbm_bytes: float  # device memory, bytes
    used_bytes: float = 0.0  # held by the running stage, bytes
    peak_bytes: float = 0.0  # most ever held, bytes
    peak_by_stage: dict = field(default_factory=dict)  # stage -> most held in it, bytes

    @property
    def headroom_frac(self) -> float:
        return 1.0 - self.used_bytes / self.hbm_bytes


class Port:
    """One direction of a link (an NVLink port or a node's NICs): a resource plus counters."""

    def __init__(self, env: simpy.Environment, name: str, capacity: int = 1):
        self.name = name
        self.res = simpy.Resource(env, capacity=capacity)
        self.busy_s = 0.0  # seconds some transfer held it
        self.bytes = 0  # bytes that crossed it


@dataclass(frozen=True)
class TransferRecord:
    src: int
    dst: int
    bytes: int
    t_start: float  # when the transfer was issued (s)
    t_begin: float  # when it got its links (after queueing) (s)
    t_end: float  # when it finished (s)


class Ports(dict):
    """Ports of one kind by index (GPU rank or node), each made when first used."""

    def __init__(self, env: simpy.Environment, name: str, capacity: int = 1):
        super().__init__()
        self._env, self._name, self._capacity = env, name, capacity

    def __missing__(self, index: int) -> Port:
        port = self[index] = Port(self._env, f"{self._name}{index}", self._capacity)
        return port


class Cluster:
    """GPUs, NVLink ports and NICs of a `ClusterSpec`, with transfers priced by `cost_model`."""

    def __init__(self, env: simpy.Environment, spec: ClusterSpec, cost_model):
        if spec.num_gpus < 1:
            raise ValueError(f"the cluster has no GPUs ({spec.nodes} x {spec.gpus_per_node})")
        self.env = env
        self.spec = spec
        self.cm = cost_model
        per = spec.gpus_per_node
        self.gpus = [Gpu(rank=r, node=r // per, hbm_bytes=spec.hardware.hbm_bytes)
                     for r in range(spec.num_gpus)]
        # ports are made on first use: a 131,072-GPU cluster whose transfers are priced, not
        # simulated, never builds its 300K SimPy resources
        nics = spec.network.nics_per_node
        self.nvlink_out = Ports(env, "nvlink-out")
        self.nvlink_in = Ports(env, "nvlink-in")
        self.nic_out = Ports(env, "nic-out", nics)
        self.nic_in = Ports(env, "nic-in", nics)
        self.records: list[TransferRecord] = []
        self.memory = HeldMemory(hbm_bytes=spec.hardware.hbm_bytes)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def hold_all(self, stage: str, nbytes: float) -> None:
        """Every GPU holds the running stage's per-GPU footprint (stages use the whole cluster)."""
        m = self.memory
        m.used_bytes = nbytes
        m.peak_bytes = max(m.peak_bytes, nbytes)
        m.peak_by_stage[stage] = max(m.peak_by_stage.get(stage, 0.0), nbytes)

    def node_of(self, rank: int) -> int:
        return self.gpus[rank].node

    def path(self, src: int, dst: int) -> tuple[Port, Port]:
        """The two ports a transfer holds: egress first, then ingress (a fixed order, so two
        transfers can never wait on each other in a cycle)."""
        a, b = self.node_of(src), self.node_of(dst)
        if a == b:
            return self.nvlink_out[src], self.nvlink_in[dst]
        return self.nic_out[a], self.nic_in[b]

    def transfer(self, src: int, dst: int, nbytes: int):
        """SimPy process: move `nbytes` from `src` to `dst` over the link model."""
        if not (0 <= src < self.num_gpus and 0 <= dst < self.num_gpus):
            raise ValueError(f"transfer {src}->{dst} outside the cluster's {self.num_gpus} GPUs")
        t0 = self.env.now
        if src == dst or nbytes <= 0:
            return
        ports = list(self.path(src, dst))
        dt = self.cm.transfer_time_s(nbytes, src, dst)
        reqs = []
        try:
            for p in ports:  # fixed order: egress, ingress (no cycles)
                req = p.res.request()
                reqs.append((p, req))
                yield req
            t1 = self.env.now
            yield self.env.timeout(dt)
            for p in ports:
                p.busy_s += dt
                p.bytes += nbytes
        finally:
            for p, req in reqs:
                p.res.release(req)
        self.records.append(TransferRecord(src, dst, nbytes, t0, t1, self.env.now))

    def run_phases(self, phases: Iterable[Iterable[tuple[int, int, int]]]):
        """SimPy process: phases of (src, dst, bytes) run one after another; the transfers of a
        phase run concurrently (aggregated per (src, dst) pair: one message per pair)."""
        for phase in phases:
            per_pair: dict[tuple[int, int], int] = defaultdict(int)
            for src, dst, nbytes in phase:
                if src != dst and nbytes > 0:
                    per_pair[(src, dst)] += nbytes
            if not per_pair:
                continue
            procs = [self.env.process(self.transfer(s, d, b)) for (s, d), b in
                     sorted(per_pair.items())]
            yield self.env.all_of(procs)

    def link_utilisation(self, elapsed_s: float) -> dict[str, float]:
        """Busiest port of each class as a fraction of `elapsed_s`."""
        if elapsed_s <= 0:
            return {}
        out = {}
        for cls, ports in (("nvlink", [*self.nvlink_out.values(), *self.nvlink_in.values()]),
                           ("nic", [*self.nic_out.values(), *self.nic_in.values()])):
            busiest = max((p.busy_s / p.res.capacity for p in ports), default=0.0)
            out[cls] = busiest / elapsed_s
        return out
