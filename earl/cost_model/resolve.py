"""Turn user-facing names and paths into specs and a CostModel (shared by every CLI command).

    python -c "from earl.cost_model.resolve import make_cost_model as m; print(m('tiny', 'cpu', 1))"
"""

from __future__ import annotations

import re
from pathlib import Path

from earl.cost_model.memory import MIXED_PRECISION, TrainPrecision
from earl.cost_model.model import CostModel
from earl.cost_model.profile import load_profile
from earl.specs import (
    GB,
    MODEL_CATALOG,
    NETWORK_CATALOG,
    TCP_INCAST_EFFICIENCY,
    ClusterSpec,
    ModelSpec,
    NetworkSpec,
    unknown_name_error,
)

_NET_RE = re.compile(r"^(tcp|rdma)-(\d+(?:\.\d+)?)g(?:x(\d+))?$")


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name, or a path to an HF `config.json` / checkpoint directory."""
    if name_or_path.lower() in MODEL_CATALOG:
        return MODEL_CATALOG[name_or_path.lower()]
    p = Path(name_or_path)
    if p.exists():
        return ModelSpec.from_hf_config(p)
    raise unknown_name_error("model", name_or_path, MODEL_CATALOG)


def resolve_network(text: str) -> NetworkSpec:
    """A catalog name, or `tcp-<Gbps>g[x<NICs>]` / `rdma-<Gbps>g[x<NICs>]` (e.g. `tcp-100g`,
    `rdma-400gx8`): TCP at 60% of line rate, 30 us and incast efficiency
    TCP_INCAST_EFFICIENCY; RDMA at 90%, 3 us and no incast loss."""
    key = text.lower()
    if key in NETWORK_CATALOG:
        return NETWORK_CATALOG[key]
    m = _NET_RE.match(key)
    if not m:
        names = ", ".join(sorted(NETWORK_CATALOG))
        raise ValueError(f"unknown network {text!r}; use one of {names} or tcp-<Gbps>g[x<NICs>] / "
                         "rdma-<Gbps>g[x<NICs>]")
    proto, gbps, nics = m.group(1), float(m.group(2)), int(m.group(3) or 1)
    tcp = proto == "tcp"
    return NetworkSpec(name=key, nic_bw_bytes_s=gbps / 8 * GB, nics_per_node=nics,
                       efficiency=0.6 if tcp else 0.9, latency_s=30e-6 if tcp else 3e-6, protocol=proto,
                       incast_efficiency=TCP_INCAST_EFFICIENCY if tcp else 1.0)


# Training-cluster presets: (hardware profile, network). The EARL paper's cluster, and the two
# common DGX builds (one 200G HDR or 400G NDR InfiniBand NIC per GPU, rail-optimised).
CLUSTER_PRESETS: dict[str, tuple[str, str]] = {
    "earl-paper": ("h100-sxm-80gb", "tcp-200g"),  # 16 x 8 H100, one 200 Gbps Ethernet NIC per node, TCP
    "dgx-h100-ndr": ("h100-sxm-80gb", "ib-ndr400x8"),  # 8 x 400 Gb/s NDR per node
    "dgx-a100-hdr": ("a100-sxm-80gb", "rdma-200gx8"),  # 8 x 200 Gb/s HDR per node
}


def resolve_preset(preset: str | None, hardware: str | None, network: str | None) -> tuple[str, str | None]:
    """(hardware, network) from a cluster preset; explicit options win over the preset's."""
    if preset is None:
        return hardware or "h100-sxm-80gb", network
    if preset not in CLUSTER_PRESETS:
        raise unknown_name_error("cluster preset", preset, CLUSTER_PRESETS)
    hw, net = CLUSTER_PRESETS[preset]
    return hardware or hw, network or net


def make_cost_model(model: str | ModelSpec, hardware: str, gpus: int, network: str | None = None, *,
                    gpus_per_node: int | None = None, precision: TrainPrecision = MIXED_PRECISION) -> CostModel:
    """CostModel for `gpus` GPUs of `hardware` (profile name or JSON path), `gpus_per_node` per
    node (default: the hardware's); without `network`, the cluster's default
    (ClusterSpec.for_gpus: rdma-200g), which every command names in its output. `precision`: the
training memory layout priced (`earl run`'s selector: the runtime's, earl.cost_model.memory)."""
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    profile = load_profile(hardware)
    net = resolve_network(network) if network else None
    cluster = ClusterSpec.for_gpus(profile.hardware, gpus, net, gpus_per_node)
    return CostModel(spec, cluster, profile, precision=precision)
