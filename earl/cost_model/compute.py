"""FLOPs, bytes and roofline time of a decoder forward pass, per GPU.

Each operator of a layer (QKV projection, attention core with causal mask, output projection,
MLP, norms/elementwise, and the LM head) costs max(compute, memory) time, with achieved
efficiencies taken from the HardwareProfile's curves (larger problems run closer to peak), plus a
fixed per-operator launch overhead. The caller describes the work in aggregate, so one call is
O(1) whatever the batch:

- `tokens`: new tokens processed by this replica (prefill: prompt tokens; decode: one per seq),
- `attn_pairs`: sum over new tokens of the keys each attends to (causal),
- `kv_tokens`: KV-cache tokens read by the attention kernels,
- `lm_tokens`: tokens that need logits (decode/prefill: one per sequence; log-probs: all).

    python -c "from earl.cost_model.compute import forward_flops_per_token; ..."
"""

from __future__ import annotations

from dataclasses import dataclass

from earl.cost_model.memory import kv_heads_per_gpu
from earl.cost_model.profile import HardwareProfile
from earl.specs import ModelSpec

OPS_PER_LAYER = 8  # launches per layer: norm, qkv, rope, attn, o, norm, gate_up, down


@dataclass(frozen=True)
class PassCost:
    """Per-GPU time (s) of one forward pass, by component, and its FLOPs."""

    linear_s: float
    attention_s: float
    elementwise_s: float
    lm_head_s: float
    overhead_s: float
    flops: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.elementwise_s + self.lm_head_s + self.overhead_s


def _op_time(flops: float, nbytes: float, prof: HardwareProfile, curve, norm: float | None = None) -> float:
    """max(compute, memory) time; with `norm` p, (t_c^p + t_m^p)^(1/p) (the two only partly hide
    each other, as measured GEMMs near the ridge point show)."""
    hw = prof.hardware
    t_c = flops / (hw.peak_flops * curve(flops)) if flops > 0 else 0.0
    t_m = nbytes / (hw.hbm_bw_bytes_s * prof.memory(nbytes)) if nbytes > 0 else 0.0
    big = max(t_c, t_m)
    if norm is None or big <= 0:
        return big
    # scaled by the larger: the same value, and no overflow for absurd (finite) profile inputs
    return big * ((t_c / big) ** norm + (t_m / big) ** norm) ** (1.0 / norm)


def gemm_work(flops: float, rows: float, prof: HardwareProfile) -> float:
    """The FLOPs a GEMM of `rows` rows is priced as on the `matmul` curve: its own, x (1 +
    gemm_rows_half / rows) when the profile has a row penalty (a CPU BLAS's per-call packing),
    x the profile's factor for that row count where it has one (`gemm_row_factors`)."""
    half = prof.gemm_rows_half
    work = flops * (1.0 + half / rows) if half > 0 and rows > 0 else flops
    if prof.gemm_row_factors and rows == int(rows):
        work *= prof.gemm_row_factors.get(str(int(rows)), 1.0)
    return work


def gemm_time_s(m: float, k: float, n: float, prof: HardwareProfile, dtype_bytes: int = 2) -> float:
    """Time of one (m x k) @ (k x n) GEMM: its compute time (priced as `gemm_work` FLOPs) and
    memory time combined by the profile's `gemm_norm` (max when it has none)."""
    flops = 2.0 * m * k * n
    nbytes = (m * k + k * n + m * n) * dtype_bytes
    return _op_time(gemm_work(flops, m, prof), nbytes, prof, prof.matmul, prof.gemm_norm)


def forward_pass(model: ModelSpec, prof: HardwareProfile, *, tp: int, layers: int, tokens: float,
                 attn_pairs: float, kv_tokens: float, lm_tokens: float, decode: bool = False) -> PassCost:
    """Per-GPU cost of pushing `tokens` new tokens through `layers` layers (and the LM head for
    `lm_tokens` of them) with tensor parallelism `tp`. `decode`: one query token per sequence,
    priced on the profile's decode-attention curve when it has one."""
    h, b = model.hidden_size, model.dtype_bytes
    qkv_n = (model.q_dim + 2 * model.kv_dim) / tp
    f = model.ffn_hidden / tp
    linear = (gemm_time_s(tokens, h, qkv_n, prof, b)
              + gemm_time_s(tokens, model.q_dim / tp, h, prof, b)
              + gemm_time_s(tokens, h, (2 if model.gated_mlp else 1) * f, prof, b)
              + gemm_time_s(tokens, f, h, prof, b))
    heads = model.num_heads / tp
    attn_flops = 4.0 * attn_pairs * model.head_dim * heads
    kv_local = kv_heads_per_gpu(model, tp) * model.head_dim
    attn_bytes = kv_tokens * 2 * kv_local * b + 2 * tokens * heads * model.head_dim * b
    attn_curve = prof.attention_decode if decode and prof.attention_decode else prof.attention
    attention = _op_time(attn_flops, attn_bytes, prof, attn_curve)
    # norms, residual adds, rope, activation: ~12 reads/writes of a token's hidden state
    elem_bytes = tokens * (12 * h + 3 * f) * b
    # a calibrated profile fits these small unfused ops on real forwards (on CPU they reach a
    # fraction of a large copy's bandwidth); otherwise the copy curve
    elem_curve = prof.elementwise or prof.memory
    elementwise = elem_bytes / (prof.hardware.hbm_bw_bytes_s * elem_curve(elem_bytes)) if elem_bytes > 0 else 0.0
    per_layer_flops = 2.0 * tokens * (model.params_per_layer / tp) + attn_flops
    lm = 0.0
    lm_flops = 0.0
    if lm_tokens > 0:
        v = model.vocab_size / tp
        lm = gemm_time_s(lm_tokens, h, v, prof, b) + _op_time(0.0, lm_tokens * v * 4 * 2, prof, prof.memory)
        lm_flops = 2.0 * lm_tokens * h * v
    return PassCost(linear_s=layers * linear, attention_s=layers * attention,
                    elementwise_s=layers * elementwise, lm_head_s=lm,
                    overhead_s=(layers * OPS_PER_LAYER + 2) * prof.op_overhead_s,
                    flops=layers * per_layer_flops + lm_flops)


def param_tensors(model: ModelSpec) -> int:
    """Parameter tensors of the model (what an optimizer step iterates over): per layer q, k,
    v, o (+3 biases), the MLP's 2-3 matrices and 2 norms; plus embedding, final norm and an
    untied LM head."""
    per_layer = 4 + (3 if model.qkv_bias else 0) + (3 if model.gated_mlp else 2) + 2
    return model.num_layers * per_layer + 2 + (0 if model.tied_embeddings else 1)


def causal_pairs(new_tokens: float, prefix_tokens: float) -> float:
    """Attention (query, key) pairs when `new_tokens` tokens follow `prefix_tokens` cached ones
    in one sequence, with a causal mask."""
    return new_tokens * prefix_tokens + new_tokens * (new_tokens + 1) / 2


def train_flops_per_token(model: ModelSpec, context: int) -> float:
    """Model FLOPs per trained token: 6N (forward + backward of the weights) plus attention,
    (Kaplan et al. 2020; Narayanan et al. 2021), without recompute."""
    attn = 3 * 4 * model.num_layers * model.q_dim * (context + 1) / 2
    # the input embedding is a lookup, not a matmul; a tied one is still used as the LM head
    lookup = 0 if model.tied_embeddings else model.vocab_size * model.hidden_size
    return 6.0 * (model.num_params - lookup) + attn
