"""This host as calibrate and validate see it: its device name and driver, the stamp a profile
measured here would carry, the one-node loopback cluster of N local processes, random-weight
checkpoints of catalog shapes, and which simulator engine models which runtime engine.

Why it exists: runner, hostcost, dispatchfit, fsdpfit and validate all need these; kept one
floor below them, so no calibrate module imports a sibling for a helper (no import cycle).

    python -c "from earl.calibrate.host import current_stamp; print(current_stamp())"
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from earl.calibrate.timing import resolve_device
from earl.cost_model.model import CostModel
from earl.cost_model.profile import HardwareProfile, environment_stamp
from earl.runtime.engine.pytorch import KV_ROUND
from earl.runtime.hf_model import TORCH_DTYPES, Policy, hf_config_from_spec, save_hf
from earl.runtime.tokenizer import CharTokenizer
from earl.specs import MODEL_CATALOG, NETWORK_CATALOG, ClusterSpec, ModelSpec

# the simulator's rollout engine model (earl.sim.simulation.ENGINES) of each runtime engine
# (earl.runtime.engine.ENGINES): the built-in `pytorch` engine and vLLM batch continuously (a row
# whose turn ends leaves, steps its environment and rejoins while others decode); the static
# engine plays each turn in lockstep
SIM_ENGINE = {"pytorch": "continuous", "pytorch-static": "turn-sync", "vllm": "continuous"}


def sim_kv_round(runtime_engine: str) -> int:
    """Positions the simulator rounds a decode step's attended length up to for runtime engine
    `runtime_engine` (Simulation's `kv_round`): the built-in engine's slot cache attends every
    decode row over the longest one's length rounded up to KV_ROUND; the others none."""
    sim_engine(runtime_engine)  # refuses an unknown engine
    return KV_ROUND if runtime_engine == "pytorch" else 0


def sim_engine(runtime_engine: str) -> str:
    """The simulator engine model that prices runtime engine `runtime_engine`."""
    if runtime_engine not in SIM_ENGINE:
        raise ValueError(f"engine {runtime_engine!r} has no simulator model; valid: {', '.join(SIM_ENGINE)}")
    return SIM_ENGINE[runtime_engine]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def driver_version(device: torch.device) -> str:
    if device.type != "cuda":
        return "n/a"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.splitlines()[0].strip() if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def current_stamp(device: str = "cpu", attention_backend: str = "unknown") -> dict:
    """The stamp a profile measured here and now would carry (compare with `check_stamp`)."""
    dev = resolve_device(device)
    stamp = environment_stamp(device_name(dev), attention_backend)
    stamp["driver"] = driver_version(dev)
    return stamp


def local_cluster(profile: HardwareProfile, nproc: int) -> ClusterSpec:
    """`nproc` processes on this one host: one 'node' of `nproc` devices (whatever the profile's
    gpus_per_node says) joined by loopback: the topology the dispatch path is fitted on, and the
    one `earl validate --nproc N` simulates."""
    return ClusterSpec(hardware=profile.hardware, nodes=1, gpus_per_node=nproc, network=NETWORK_CATALOG["loopback"])


def local_cost_model(profile: HardwareProfile, nproc: int, spec: ModelSpec | None = None) -> CostModel:
    """The cost model of `nproc` processes on this one host (one 'node', loopback network)
    training `spec` (the tiny model by default)."""
    return CostModel(spec or MODEL_CATALOG["tiny"], local_cluster(profile, nproc), profile)


def random_checkpoint(name: str | ModelSpec, directory: Path, dtype: str, device: str = "cpu") -> Path:
    """A random-initialised HF checkpoint of a catalog model's shapes, or of a `ModelSpec`'s (no
    weights downloaded), with the runtime's built-in tokenizer, so the runtime can load a
    real-size model. The weights are initialised on `device` (a GPU does a 1.5B model in a
    second)."""
    if (directory / "config.json").is_file():
        return directory
    spec = MODEL_CATALOG[name] if isinstance(name, str) else name
    name = spec.name
    cfg = hf_config_from_spec(spec, dtype)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=TORCH_DTYPES[dtype])
    save_hf(Policy(model=model, tokenizer=CharTokenizer(), spec=spec, source=name), directory)
    return directory
