"""Per-GPU memory: weights, gradients, optimizer states, activations, KV cache, logits, reserve.

Activation memory follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", Table 2), per layer, in bytes, for 2-byte activations:

    no parallelism                 sbh (34 + 5as/h)
    tensor parallel                sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel     sbh (34/t + 5as/(ht))
    tensor parallel + selective    sbh (10 + 24/t)
    tensor + sequence + selective  sbh (34/t)
    full recompute                 sbh (2)

(s: sequence, b: micro-batch, h: hidden, a: heads, t: tensor-parallel size.) With a fused
attention kernel (FlashAttention / SDPA) the 5as/h score term is never stored, so the cost
model treats `none` like `selective` for memory when `flash_attention` is on.

    python -c "from earl.cost_model.memory import korthikanti_activation_bytes as f; \
        print(f(4096, 1, 8192, 64, 8, True, 'none'))"
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from earl.specs import ModelSpec, ParallelPlan

# Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO): bf16 weights (2 B) + bf16 grads (2 B)
# + fp32 master weights, momentum and variance (12 B) per parameter.
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12
LOGIT_BYTES = 4  # logits are upcast to fp32 for the softmax / log-prob
FP32_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class TrainPrecision:
    """Bytes per parameter a training step keeps, by component, and how a `zero` plan shards them.
    The one memory account's knobs: the simulator and `earl estimate` use ZeRO's mixed precision
    (`MIXED_PRECISION`); `earl run`'s selector and its budget check use `runtime_precision`."""

    weights: float = WEIGHT_BYTES  # the training model's copy
    grads: float = GRAD_BYTES
    optimizer: float = OPTIMIZER_BYTES  # moments (+ fp32 master weights)
    activation: float = 2  # bytes of one saved activation value (Korthikanti counts 2)
    fsdp_fp32: bool = False  # a zero plan with dp > 1 holds fp32 weight and grad shards (FSDP2)


MIXED_PRECISION = TrainPrecision()


def runtime_precision(dtype_bytes: int) -> TrainPrecision:
    """The PyTorch runtime's layout (earl.runtime.optim): the model and its gradients in the
    model's dtype, fp32 AdamW moments, and fp32 master weights when the model is not fp32; under
    FSDP2 (zero, dp > 1) fp32 weight and gradient shards, the shards being the masters."""
    states = 2 if dtype_bytes == FP32_BYTES else 3
    return TrainPrecision(weights=dtype_bytes, grads=dtype_bytes, optimizer=FP32_BYTES * states,
                          activation=dtype_bytes, fsdp_fp32=True)


def korthikanti_activation_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool,
                                 recompute: str) -> float:
    """Activation bytes of one transformer layer (Korthikanti et al. 2022, Table 2)."""
    sbh = s * b * h
    score = 5 * a * s / (h * t)
    if recompute == "full":
        return sbh * 2
    if recompute == "selective":
        return sbh * (34 / t if sp else 10 + 24 / t)
    if recompute == "none":
        return sbh * ((34 / t if sp else 10 + 24 / t) + score)
    raise ValueError(f"recompute {recompute!r}; valid: none, selective, full")


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes per GPU by component, and the capacity they must fit in."""

    weights: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    kv_cache: float = 0.0
    logits: float = 0.0
    reserve: float = 0.0  # fragmentation / workspace / runtime context
    capacity: float = 0.0  # device memory

    COMPONENTS = ("weights", "grads", "optimizer", "activations", "kv_cache", "logits", "reserve")

    @property
    def total(self) -> float:
        return sum(getattr(self, c) for c in self.COMPONENTS)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def headroom_frac(self) -> float:
        return 1.0 - self.total / self.capacity if self.capacity else 0.0

    @property
    def overflow_component(self) -> str:
        """The largest component (the one to blame) when the plan does not fit; '' if it fits."""
        if self.fits:
            return ""
        return max(self.COMPONENTS[:-1], key=lambda c: getattr(self, c))

    def to_dict(self) -> dict:
        d = {c: getattr(self, c) for c in asdict(self)}
        d["total"] = self.total
        return d


def params_per_gpu(model: ModelSpec, plan: ParallelPlan) -> float:
    """Parameters held by the most loaded GPU: its pipeline stage's layers (plus the vocab-
    parallel embedding / LM head, which live on the first and last stage) split tp ways."""
    layers = -(-model.num_layers // plan.pp)
    return (layers * model.params_per_layer + model.params_embedding) / plan.tp


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU stores: kv/tp, but at least one (heads are replicated when tp > kv)."""
    return max(1, -(-model.num_kv_heads // tp))


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, pp: int = 1) -> float:
    layers = -(-model.num_layers // pp)
    return 2 * layers * kv_heads_per_gpu(model, tp) * model.head_dim * model.dtype_bytes


def reserve_bytes(capacity: float, reserve_frac: float, reserve_fixed: float) -> float:
    return capacity * reserve_frac + reserve_fixed


def activation_bytes_per_token(model: ModelSpec, plan: ParallelPlan, context: int, *,
                               flash_attention: bool = True, value_bytes: float = 2) -> float:
    """Saved activations of one token of a `context`-token micro-batch, all layers, in bytes
    (Korthikanti's per-layer figure for 2-byte values, scaled to `value_bytes`)."""
    s = -(-context // plan.cp)
    mode = "selective" if (flash_attention and plan.recompute == "none") else plan.recompute
    per_layer = korthikanti_activation_bytes(s, 1, model.hidden_size, model.num_heads, plan.tp, plan.tp > 1, mode)
    return per_layer * model.num_layers / s * value_bytes / 2


def train_memory(model: ModelSpec, plan: ParallelPlan, context: int, capacity: float,
                 reserve: float, flash_attention: bool = True, *, precision: TrainPrecision = MIXED_PRECISION,
                 resident_bytes: float = 0.0) -> MemoryBreakdown:
    """Per-GPU memory of a training step with 1F1B pipelining (the first stage keeps pp
    micro-batches in flight, i.e. all layers' worth of activations), under `precision`;
    `resident_bytes`: other weight copies held meanwhile (counted with the weights)."""
    p = params_per_gpu(model, plan)
    shard = plan.dp * plan.cp if plan.sharded_optimizer else 1  # cp ranks hold the same weights
    s = -(-context // plan.cp)
    act = plan.micro_batch * s * activation_bytes_per_token(model, plan, context, flash_attention=flash_attention,
                                                            value_bytes=precision.activation)
    # logits and their gradient, fp32, vocab-parallel, one micro-batch at a time
    logits = 2 * plan.micro_batch * s * model.vocab_size / plan.tp * LOGIT_BYTES
    weights, grads, opt = p * precision.weights, p * precision.grads / shard, p * precision.optimizer / shard
    if precision.fsdp_fp32 and plan.sharded_optimizer and plan.dp > 1:  # the fp32 shards are the masters
        weights, grads, opt = p * FP32_BYTES / shard, p * FP32_BYTES / shard, p * 2 * FP32_BYTES / shard
    return MemoryBreakdown(weights=weights + resident_bytes, grads=grads, optimizer=opt, activations=act,
                           logits=logits, reserve=reserve, capacity=capacity)


def forward_memory(model: ModelSpec, plan: ParallelPlan, context: int, capacity: float,
                   reserve: float) -> MemoryBreakdown:
    """Forward-only log-prob pass: weights, a couple of layers' transient activations, logits."""
    p = params_per_gpu(model, plan)
    s = -(-context // plan.cp)
    tokens = plan.micro_batch * s
    act = 4 * tokens * (model.hidden_size + model.ffn_hidden / plan.tp) * model.dtype_bytes
    logits = tokens * model.vocab_size / plan.tp * LOGIT_BYTES
    return MemoryBreakdown(weights=p * WEIGHT_BYTES, activations=act, logits=logits,
                           reserve=reserve, capacity=capacity)


def inference_memory(model: ModelSpec, plan: ParallelPlan, num_seqs: int, context: int,
                     capacity: float, reserve: float) -> MemoryBreakdown:
    """A rollout replica holding `num_seqs` sequences of `context` tokens of KV per GPU."""
    p = params_per_gpu(model, plan)
    kv = num_seqs * context * kv_bytes_per_token_per_gpu(model, plan.tp, plan.pp)
    act = 4 * num_seqs * (model.hidden_size + model.ffn_hidden / plan.tp) * model.dtype_bytes
    logits = num_seqs * model.vocab_size / plan.tp * LOGIT_BYTES
    return MemoryBreakdown(weights=p * WEIGHT_BYTES, kv_cache=kv, activations=act, logits=logits,
                           reserve=reserve, capacity=capacity)
