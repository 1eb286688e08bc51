"""Frozen, validated descriptions of models, hardware, clusters, parallel plans and workloads.

Everything else in `earl` (cost model, policies, simulator, runtime) speaks these types. They
are plain data: constructors do no I/O (loading a model's `config.json` is the explicit
`ModelSpec.from_hf_config`), derived quantities are properties, and every `__post_init__`
raises `ValueError` naming the bad value and what would be valid.

    python -c "from earl.specs import ModelSpec; print(ModelSpec.from_name('qwen2.5-7b').num_params)"
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECOMPUTE_MODES = ("none", "selective", "full")

# Intermediate tensors handed from experience preparation to training, bytes per token.
# Token ids int64 as PyTorch holds them; masks bool; per-token floats fp32.
TENSOR_BYTES_PER_TOKEN: dict[str, int] = {
    "input_ids": 8,
    "loss_mask": 1,
    "old_logprobs": 4,
    "ref_logprobs": 4,
    "advantages": 4,
}
# Per-sample scalars (rewards) travel too; bytes per sample.
TENSOR_BYTES_PER_SAMPLE: dict[str, int] = {"rewards": 4}


class Stage(str, enum.Enum):
    """The three RL stages a selector chooses a plan for."""

    ROLLOUT = "rollout"
    EXPERIENCE = "experience"
    TRAIN = "train"


# The one stage vocabulary. A step's timed phases, in order: the three planned stages and the two
# moves between their layouts (trajectories to training, weights back to rollout). The runtime's
# and the simulator's spans, the step rows' `<phase>_s` columns and validate's tables use these.
STEP_PHASES = (Stage.ROLLOUT.value, Stage.EXPERIENCE.value, "dispatch", Stage.TRAIN.value, "reshard")
# A span's stage: a step phase, or the bookkeeping around them
SPAN_STAGES = (*STEP_PHASES, "sync", "select", "other")
# The operations the cost model prices (earl.cost_model.CostModel.estimate): rollout is priced as
# prefill + decode and experience as logprob; the first four take a plan, the last two a move
PRICED_STAGES = ("prefill", "decode", "logprob", Stage.TRAIN.value, "reshard", "dispatch")


def unknown_name_error(kind: str, name: str, known) -> ValueError:
    """A one-line error for an unknown catalog name, listing the known ones."""
    known = sorted(known)
    close = difflib.get_close_matches(str(name).lower(), known, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}")


def _check_positive(obj, *names: str, integer: tuple[str, ...] = ()) -> None:
    """Each field a finite number > 0 (nan and inf included in the refusal); those named in
    `integer` whole numbers too."""
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{type(obj).__name__}.{n} must be a positive number, got {v!r}")
        if n in integer and not isinstance(v, int):
            raise ValueError(f"{type(obj).__name__}.{n} must be a whole number, got {v!r}")


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (Llama / Qwen2 family) described by its shapes."""

    name: str
    num_layers: int  # decoder layers
    hidden_size: int  # model width d
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA); == num_heads for MHA
    head_dim: int  # per-head width
    ffn_hidden: int  # MLP intermediate width
    vocab_size: int  # rows of the embedding / LM head
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs. plain MLP (2 matrices)
    tied_embeddings: bool = False  # LM head shares the embedding matrix
    qkv_bias: bool = False  # Qwen2 has biases on q/k/v projections
    dtype: str = "bf16"  # parameter / activation dtype

    def __post_init__(self):
        ints = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden", "vocab_size")
        _check_positive(self, *ints, integer=ints)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec {self.name!r}: num_heads={self.num_heads} is not a "
                             f"multiple of num_kv_heads={self.num_kv_heads}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"ModelSpec.dtype {self.dtype!r} unknown; valid: {', '.join(DTYPE_BYTES)}")

    # ---- derived sizes --------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_attention(self) -> int:
        """Parameters of one layer's attention block (q, k, v, o and q/k/v biases)."""
        h = self.hidden_size
        p = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            p += self.q_dim + 2 * self.kv_dim
        return p

    @property
    def params_mlp(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.ffn_hidden

    @property
    def params_per_layer(self) -> int:
        return self.params_attention + self.params_mlp + 2 * self.hidden_size  # + 2 RMSNorms

    @property
    def params_embedding(self) -> int:
        """Embedding plus (untied) LM head plus the final norm."""
        emb = self.vocab_size * self.hidden_size
        return emb * (1 if self.tied_embeddings else 2) + self.hidden_size

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.params_embedding

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes for one token across all layers (K and V), unsharded."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes

    # ---- constructors ---------------------------------------------------------------------
    @staticmethod
    def from_name(name: str) -> ModelSpec:
        key = name.lower()
        if key not in MODEL_CATALOG:
            raise unknown_name_error("model", name, MODEL_CATALOG)
        return MODEL_CATALOG[key]

    @staticmethod
    def from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
        """Read an HF `config.json` (the file or the checkpoint directory holding it)."""
        p = Path(path)
        cfg_path = p / "config.json" if p.is_dir() else p
        if not cfg_path.is_file():
            raise ValueError(f"no config.json at {cfg_path}")
        try:
            cfg = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"{cfg_path}: not valid JSON ({str(e).splitlines()[0]})") from None
        except OSError as e:
            raise ValueError(f"{cfg_path} cannot be read ({e})") from None
        return ModelSpec.from_hf_dict(cfg, name=name or p.name, source=str(cfg_path))

    @staticmethod
    def from_hf_dict(cfg: dict, *, name: str, source: str = "<dict>") -> ModelSpec:
        """The shapes of an HF config dict; every value type- and range-checked, each error
        naming `source`, the key, the value and what is allowed."""
        from earl.config_machinery import convert

        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: a model config must be a JSON object of keys to values, got "
                             f"{type(cfg).__name__} {str(cfg)[:40]!r}")

        def get(key: str, typ: type = int, default=None, required: bool = True):
            if key not in cfg or cfg[key] is None:
                if required and default is None:
                    raise ValueError(f"{source}: missing key {key!r}")
                return default
            v = convert(key, cfg[key], typ, where=source)
            if typ is int and v <= 0:
                raise ValueError(f"{key} = {cfg[key]!r} in {source}: expected a positive integer")
            return v

        heads, hidden = get("num_attention_heads"), get("hidden_size")
        model_type = str(cfg.get("model_type", "llama"))  # optional: only picks defaults
        dtype_key = "dtype" if cfg.get("dtype") is not None else "torch_dtype"  # transformers 5 writes dtype
        dtype_name = cfg.get(dtype_key) or "bfloat16"
        if not isinstance(dtype_name, str) or dtype_name not in HF_DTYPES:
            raise ValueError(f"{dtype_key} = {dtype_name!r} in {source}: expected one of {', '.join(HF_DTYPES)}")
        head_dim = get("head_dim", required=False)
        if head_dim is None:
            if hidden % heads:
                raise ValueError(f"{source}: hidden_size={hidden} is not a multiple of num_attention_heads="
                                 f"{heads} and there is no head_dim")
            head_dim = hidden // heads
        try:
            return ModelSpec(
                name=name,
                num_layers=get("num_hidden_layers"),
                hidden_size=hidden,
                num_heads=heads,
                num_kv_heads=get("num_key_value_heads", default=heads),
                head_dim=head_dim,
                ffn_hidden=get("intermediate_size"),
                vocab_size=get("vocab_size"),
                gated_mlp=True,
                tied_embeddings=get("tie_word_embeddings", bool, default=False),
                qkv_bias=get("attention_bias", bool, default=model_type == "qwen2"),
                dtype=HF_DTYPES[dtype_name],
            )
        except ValueError as e:
            msg = str(e).splitlines()[0]
            raise ValueError(msg if source in msg else f"{source}: {msg}") from None

    def to_hf_dict(self) -> dict:
        """An HF config dict (Qwen2 when it has qkv bias, else Llama) of these shapes."""
        qwen = self.qkv_bias
        return {
            "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
            "model_type": "qwen2" if qwen else "llama",
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn_hidden,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tied_embeddings,
            "torch_dtype": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[self.dtype],
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
        }


HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}  # HF config dtype -> ModelSpec.dtype


def _qwen(name, layers, hidden, heads, kv, ffn, vocab, tied):
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=kv, head_dim=hidden // heads, ffn_hidden=ffn,
                     vocab_size=vocab, tied_embeddings=tied, qkv_bias=True)


def _llama(name, layers, hidden, heads, kv, ffn, vocab):
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=kv, head_dim=hidden // heads, ffn_hidden=ffn,
                     vocab_size=vocab, tied_embeddings=False, qkv_bias=False)


# Shapes from each model's published HF config.json (Qwen/Qwen2.5-*, meta-llama/Llama-3.1-*).
MODEL_CATALOG: dict[str, ModelSpec] = {m.name: m for m in [
    _qwen("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, True),
    _qwen("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, True),
    _qwen("qwen2.5-3b", 36, 2048, 16, 2, 11008, 151936, True),
    _qwen("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, False),
    _qwen("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064, False),
    _qwen("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, False),
    _qwen("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, False),
    _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256),
    _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
    # Tiny models for tests and CPU runs (vocab matches earl.runtime's built-in tokenizer).
    _qwen("tiny", 2, 64, 4, 2, 128, 64, True),
    _qwen("tiny-wide", 2, 128, 8, 4, 256, 64, True),
    _llama("tiny-llama", 2, 64, 4, 2, 128, 64),
    # A Qwen2-shaped model of ~27M parameters (not a published checkpoint): the held-out model of
    # `earl validate` on CPU, larger than every shape the CPU calibration runs.
    _qwen("qwen2-27m", 8, 512, 8, 2, 1408, 8192, True),
]}


# --------------------------------------------------------------------------------------------
# Hardware and network
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """Datasheet facts of one accelerator and its node."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float  # device memory, bytes
    hbm_bw_bytes_s: float  # device memory bandwidth, bytes/s
    gpus_per_node: int  # accelerators per node
    intra_bw_bytes_s: float  # intra-node link bandwidth per GPU per direction, bytes/s
    intra_latency_s: float  # intra-node per-message latency, s

    def __post_init__(self):
        _check_positive(self, "peak_flops", "hbm_bytes", "hbm_bw_bytes_s", "gpus_per_node",
                        "intra_bw_bytes_s", "intra_latency_s", integer=("gpus_per_node",))

    @staticmethod
    def from_name(name: str) -> HardwareSpec:
        key = name.lower()
        if key not in HARDWARE_CATALOG:
            raise unknown_name_error("hardware", name, HARDWARE_CATALOG)
        return HARDWARE_CATALOG[key]


GB = 1e9
GIB = 2**30
# NVIDIA A100 datasheet (2021): 312 TFLOP/s dense bf16, 80 GB HBM2e at 2,039 GB/s, NVLink 3
#   600 GB/s total -> 300 GB/s per direction.
# NVIDIA H100 SXM5 datasheet (2023): 989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 4
#   900 GB/s total -> 450 GB/s per direction.
# NVIDIA H200 SXM datasheet (2024): same compute as H100, 141 GB HBM3e at 4.8 TB/s.
HARDWARE_CATALOG: dict[str, HardwareSpec] = {h.name: h for h in [
    HardwareSpec(name="a100-sxm-80gb", peak_flops=312e12, hbm_bytes=80 * GB,
                 hbm_bw_bytes_s=2039 * GB, gpus_per_node=8, intra_bw_bytes_s=300 * GB,
                 intra_latency_s=5e-6),
    HardwareSpec(name="h100-sxm-80gb", peak_flops=989e12, hbm_bytes=80 * GB,
                 hbm_bw_bytes_s=3350 * GB, gpus_per_node=8, intra_bw_bytes_s=450 * GB,
                 intra_latency_s=4e-6),
    HardwareSpec(name="h200-sxm-141gb", peak_flops=989e12, hbm_bytes=141 * GB,
                 hbm_bw_bytes_s=4800 * GB, gpus_per_node=8, intra_bw_bytes_s=450 * GB,
                 intra_latency_s=4e-6),
    # This 2-core CI/dev machine: rough numbers until `earl calibrate` fits real ones.
    HardwareSpec(name="cpu", peak_flops=100e9, hbm_bytes=24 * GIB, hbm_bw_bytes_s=10 * GB,
                 gpus_per_node=2, intra_bw_bytes_s=2 * GB, intra_latency_s=50e-6),
]}


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """The inter-node network: NICs per node, their speed, protocol efficiency and latency."""

    name: str
    nic_bw_bytes_s: float  # line rate of one NIC, bytes/s
    nics_per_node: int  # NICs per node (1 for a shared node link, 8 for rail-optimised)
    efficiency: float  # achievable fraction of line rate for large messages (TCP < RDMA)
    latency_s: float  # per-message latency, s
    protocol: str = "rdma"  # "tcp" | "rdma" (informational; efficiency/latency carry the cost)
    # fraction of `efficiency` a node's receiving NICs keep when several nodes send to them at
    # once (many-to-one incast: TCP loses throughput to drops and retransmit timeouts; RDMA with
    # lossless flow control keeps most of it); an assumption, varied by study s8
    incast_efficiency: float = 1.0

    def __post_init__(self):
        _check_positive(self, "nic_bw_bytes_s", "nics_per_node", "efficiency", "latency_s", "incast_efficiency",
                        integer=("nics_per_node",))
        if self.efficiency > 1:
            raise ValueError(f"NetworkSpec.efficiency must be in (0, 1], got {self.efficiency}")
        if self.incast_efficiency > 1:
            raise ValueError(f"NetworkSpec.incast_efficiency must be in (0, 1], got {self.incast_efficiency}")
        if self.protocol not in ("tcp", "rdma"):
            raise ValueError(f"NetworkSpec.protocol {self.protocol!r}; valid: tcp, rdma")

    @property
    def node_bw_bytes_s(self) -> float:
        """Achievable bytes/s in or out of one node."""
        return self.nic_bw_bytes_s * self.nics_per_node * self.efficiency

    @staticmethod
    def from_name(name: str) -> NetworkSpec:
        key = name.lower()
        if key not in NETWORK_CATALOG:
            raise unknown_name_error("network", name, NETWORK_CATALOG)
        return NETWORK_CATALOG[key]


# Many-to-one TCP loses goodput to drops and retransmission timeouts (incast: Phanishayee et al.,
# FAST 2008; Vasudevan et al., SIGCOMM 2009). 0.5 is an assumption, not a measurement: with it the
# EARL paper's Fig. 4 ratios come out within ~10%; with 1.0 they are ~1.7x too high (study s8).
TCP_INCAST_EFFICIENCY = 0.5
# TCP efficiency/latency: kernel TCP on 100-200 GbE typically reaches ~50-70% of line rate per
# stream with tens of microseconds per message; RDMA (IB/RoCE) ~90% with a few microseconds.
NETWORK_CATALOG: dict[str, NetworkSpec] = {n.name: n for n in [
    NetworkSpec(name="tcp-200g", nic_bw_bytes_s=25 * GB, nics_per_node=1, efficiency=0.6,
                latency_s=30e-6, protocol="tcp", incast_efficiency=TCP_INCAST_EFFICIENCY),
    NetworkSpec(name="rdma-200g", nic_bw_bytes_s=25 * GB, nics_per_node=1, efficiency=0.9,
                latency_s=3e-6, protocol="rdma"),
    NetworkSpec(name="ib-ndr400x8", nic_bw_bytes_s=50 * GB, nics_per_node=8, efficiency=0.9,
                latency_s=3e-6, protocol="rdma"),
    NetworkSpec(name="loopback", nic_bw_bytes_s=2 * GB, nics_per_node=1, efficiency=1.0,
                latency_s=50e-6, protocol="tcp"),
]}


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """`nodes` x `gpus_per_node` accelerators of one kind joined by `network`."""

    hardware: HardwareSpec
    nodes: int = 1
    gpus_per_node: int = 0  # 0: the hardware's own gpus_per_node
    network: NetworkSpec = field(default_factory=lambda: NETWORK_CATALOG["rdma-200g"])

    def __post_init__(self):
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"ClusterSpec.nodes must be >= 1, got {self.nodes!r}")
        if self.gpus_per_node < 0:
            raise ValueError(f"ClusterSpec.gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.gpus_per_node == 0:
            object.__setattr__(self, "gpus_per_node", self.hardware.gpus_per_node)

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @staticmethod
    def for_gpus(hardware: HardwareSpec, gpus: int, network: NetworkSpec | None = None,
                 gpus_per_node: int | None = None) -> ClusterSpec:
        """The smallest cluster of whole nodes (or one partial node) holding `gpus` GPUs, with
        the hardware's GPUs per node, or `gpus_per_node` (a job's own topology, e.g. a local
        `earl run --nproc N`: N processes on one node)."""
        if gpus < 1:
            raise ValueError(f"number of GPUs must be >= 1, got {gpus}")
        if gpus_per_node is not None and gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
        per = gpus_per_node or hardware.gpus_per_node
        if gpus <= per:
            nodes, per = 1, gpus
        elif gpus % per:
            raise ValueError(f"{gpus} GPUs is not a whole number of {per}-GPU nodes")
        else:
            nodes = gpus // per
        net = network or NETWORK_CATALOG["rdma-200g"]
        return ClusterSpec(hardware=hardware, nodes=nodes, gpus_per_node=per, network=net)


# --------------------------------------------------------------------------------------------
# Parallel plans
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """Degrees of parallelism for one stage. Rank order is tp fastest, then cp, pp, dp
    (so tp groups are contiguous ranks and stay inside a node when tp <= gpus_per_node).
    At most one degree may be -1: `resolve(world)` infers it. Checking a plan against a model
    (heads, key/value heads, layers) is `earl.parallel.validate_plan`."""

    tp: int = 1  # tensor parallel
    pp: int = 1  # pipeline parallel
    dp: int = 1  # data parallel (rollout: independent engine replicas)
    cp: int = 1  # context (sequence) parallel
    micro_batch: int = 1  # sequences per micro-batch (train / logprob)
    recompute: str = "none"  # activation recompute: none | selective | full
    sharded_optimizer: bool = False  # ZeRO/FSDP-style sharding of grads+optimizer over dp
    # interleaved 1F1B (Narayanan et al. 2021): model chunks per pipeline rank; the bubble
    # shrinks by this factor and the stage-to-stage sends grow by it (1: plain 1F1B)
    virtual_stages: int = 1

    def __post_init__(self):
        degrees = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp}
        for n, v in degrees.items():
            if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1):
                raise ValueError(f"ParallelPlan.{n} must be a positive int or -1, got {v!r}")
        if sum(v == -1 for v in degrees.values()) > 1:
            raise ValueError(f"ParallelPlan: at most one degree may be -1, got {degrees}")
        if not isinstance(self.micro_batch, int) or self.micro_batch < 1:
            raise ValueError(f"ParallelPlan.micro_batch must be >= 1, got {self.micro_batch!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"ParallelPlan.recompute {self.recompute!r}; valid: "
                             f"{', '.join(RECOMPUTE_MODES)}")
        if not isinstance(self.virtual_stages, int) or self.virtual_stages < 1:
            raise ValueError(f"ParallelPlan.virtual_stages must be an int >= 1, got {self.virtual_stages!r}")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError(f"ParallelPlan.virtual_stages={self.virtual_stages} needs pp > 1 (interleaved 1F1B)")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def model_parallel(self) -> int:
        """GPUs holding one model replica."""
        return self.tp * self.pp * self.cp

    def resolve(self, world: int) -> ParallelPlan:
        """Fill a -1 degree so the product equals `world`; check the product."""
        degrees = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp}
        unknown = [n for n, v in degrees.items() if v == -1]
        if unknown:
            known = math.prod(v for v in degrees.values() if v != -1)
            if world % known:
                raise ValueError(f"cannot infer {unknown[0]}: {world} GPUs is not divisible by "
                                 f"the other degrees' product {known}")
            return dataclasses.replace(self, **{unknown[0]: world // known})
        if self.world_size != world:
            raise ValueError(f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} = "
                             f"{self.world_size}, but the stage has {world} GPUs")
        return self

    def short(self) -> str:
        s = f"tp{self.tp}"
        if self.pp > 1:
            s += f"-pp{self.pp}"
        if self.cp > 1:
            s += f"-cp{self.cp}"
        s += f"-dp{self.dp}"
        return s

    def describe(self) -> str:
        extra = [f"mb{self.micro_batch}"]
        if self.virtual_stages > 1:
            extra.append(f"v{self.virtual_stages}")
        if self.recompute != "none":
            extra.append(f"rc-{self.recompute}")
        if self.sharded_optimizer:
            extra.append("zero")
        return self.short() + "-" + "-".join(extra)

    @staticmethod
    def parse(text: str) -> ParallelPlan:
        """Parse the `short()`/`describe()` form, e.g. `tp4-dp2`, `tp2-cp2-dp4-mb2-rc-full-zero`,
        `tp8-pp4-dp2-mb1-v2` (interleaved 1F1B, 2 model chunks per pipeline rank)."""
        kw: dict = {}
        parts = text.lower().split("-")
        i = 0
        while i < len(parts):
            p = parts[i]
            if p == "rc" and i + 1 < len(parts):
                kw["recompute"] = parts[i + 1]
                i += 2
                continue
            if p == "zero":
                kw["sharded_optimizer"] = True
            elif p.startswith("mb") and p[2:].lstrip("-").isdigit():
                kw["micro_batch"] = int(p[2:])
            elif p.startswith("v") and p[1:].isdigit():
                kw["virtual_stages"] = int(p[1:])
            elif p[:2] in ("tp", "pp", "dp", "cp") and p[2:].lstrip("-").isdigit():
                kw[p[:2]] = int(p[2:])
            else:
                raise ValueError(f"cannot parse plan {text!r} at {p!r}; expected e.g. "
                                 "'tp4-pp1-cp1-dp2-mb1-rc-selective-zero'")
            i += 1
        return ParallelPlan(**kw)


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """One ParallelPlan per RL stage."""

    rollout: ParallelPlan
    experience: ParallelPlan
    train: ParallelPlan

    def for_stage(self, stage: Stage | str) -> ParallelPlan:
        return getattr(self, Stage(stage).value)

    def with_stage(self, stage: Stage | str, plan: ParallelPlan) -> StagePlan:
        return dataclasses.replace(self, **{Stage(stage).value: plan})


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class WorkloadStats:
    """What a selector sees before a stage: the observed (runtime) or drawn (sim) workload."""

    step: int = 0  # training step index
    num_responses: int  # sequences (episodes x samples) in the batch
    context_mean: float  # tokens per sequence (prompt + all turns), mean
    context_p95: float  # 95th percentile
    context_max: float  # maximum
    turns_mean: float = 1.0  # turns per episode
    response_tokens_mean: float = 0.0  # model-generated tokens per sequence
    max_context: int = 0  # configured cap (0: none)
    memory_headroom_frac: float | None = None  # measured free fraction of device memory

    def __post_init__(self):
        if self.num_responses < 1:
            raise ValueError(f"WorkloadStats.num_responses must be >= 1, got {self.num_responses}")
        if not (0 < self.context_mean <= self.context_p95 <= self.context_max):
            raise ValueError("WorkloadStats needs 0 < context_mean <= context_p95 <= context_max, "
                             f"got {self.context_mean}, {self.context_p95}, {self.context_max}")
