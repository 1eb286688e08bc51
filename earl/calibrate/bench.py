"""Micro-benchmarks on the local device: GEMMs, attention (prefill and decode), memory copies
and the fixed cost of one operator.

The cases come from the model catalog: the q/k/v, o, MLP and LM-head projections of several
models at several token counts and tensor-parallel degrees (the shapes the cost model prices),
and their attention calls through `torch.nn.functional.scaled_dot_product_attention`. Cases
are ordered coarse-to-fine over log size, so a budget cut at any point still spans the range.

    python -m earl.calibrate.bench          # a few seconds of each benchmark on the CPU
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from earl.calibrate.timing import nonzero_tensor, rotation_count, synchronize, time_calls
from earl.specs import MODEL_CATALOG, ModelSpec

KINDS = ("matmul", "attention", "attention_decode", "memory")
# input sets a CPU GEMM case rotates through, at most: enough that a small GEMM's weights are
# out of the last-level cache when timed (rotation_count's 128 MB), as every GEMM of a model
# larger than the cache finds them. With 8 sets the small shapes (under 4 MB) ran warm, 1.8-2.1x
# faster than cold at 1-16 rows (medians; 2-vCPU EPYC, 32 MiB L3, 2026-12-04), and the fit
# priced qwen2-27m's decode GEMMs (108 MB of weights, each read from memory once a step)
# x0.49-0.75 at 1-16 sequences; a fit on cold points x0.61-0.89 (docs/validate-history.md, nineteenth
# session; studies/cpu_heldout_forward.py --gemm-sequence)
CPU_MATMUL_MAX_SETS = 4096


@dataclass(frozen=True, kw_only=True)
class Case:
    """One benchmark point to run."""

    kind: str  # one of KINDS
    label: str  # human-readable, e.g. "qwen2.5-1.5b tp2 mlp_up T=128"
    flops: float  # FLOPs of one call (0 for copies)
    bytes: float  # bytes read + written by one call (operands, KV cache, copy)
    dims: tuple[int, ...]  # kind-specific shape (see `_build`)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """A timed case."""

    kind: str
    label: str
    flops: float  # FLOPs of one call
    bytes: float  # bytes moved by one call
    time_s: float  # median seconds of one call
    reps: int  # timed calls
    iqr_frac: float  # interquartile range / median
    backend: str = ""  # attention: the SDPA backend that ran
    rows: int = 0  # matmul: the GEMM's m (tokens; the fit's row penalty, gemm_rows_half)

    @property
    def size(self) -> float:
        """The x of this kind's fit: FLOPs for compute, bytes for copies and decode attention."""
        return self.bytes if self.kind in ("memory", "attention_decode") else self.flops

    def to_dict(self) -> dict:
        return {"kind": self.kind, "label": self.label, "flops": self.flops, "bytes": self.bytes,
                "time_s": self.time_s, "reps": self.reps, "iqr_frac": round(self.iqr_frac, 4),
                "backend": self.backend, "rows": self.rows}


@dataclass(frozen=True, kw_only=True)
class BenchPlan:
    """Which cases to generate on a device (CPU sizes are scaled down to fit its budget)."""

    models: tuple[str, ...]  # catalog names whose shapes are benchmarked
    tokens: tuple[int, ...]  # GEMM rows (tokens in one forward)
    tps: tuple[int, ...]  # tensor-parallel degrees (shard the GEMM / head dimension)
    max_gemm_flops: float  # skip GEMMs larger than this (FLOPs)
    prefill: tuple[tuple[int, int], ...]  # (batch, sequence length)
    decode: tuple[tuple[int, int], ...]  # (batch, context length)
    max_attention_bytes: float  # skip attention calls whose K/V exceed this (bytes)
    max_attention_flops: float  # skip attention calls larger than this (FLOPs)
    copy_bytes: tuple[int, ...]  # sizes of the copied buffer (bytes)


CPU_PLAN = BenchPlan(
    models=("tiny", "tiny-wide", "qwen2.5-0.5b", "qwen2.5-1.5b"),
    tokens=(1, 2, 3, 4, 16, 64, 256),  # 1-3: fitted apart (earl.calibrate.fit.ROW_FACTOR_ROWS)
    tps=(1, 2),
    max_gemm_flops=1.5e9,
    prefill=((1, 16), (1, 64), (1, 256), (2, 512), (1, 1024)),
    decode=((1, 64), (4, 256), (8, 1024), (16, 2048), (4, 4096)),
    max_attention_bytes=256e6,
    max_attention_flops=2e9,
    copy_bytes=tuple(int(2 ** (e / 2)) for e in range(40, 57)),  # 1 MiB .. 256 MiB (past L2)
)

CUDA_PLAN = BenchPlan(
    models=("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b", "qwen2.5-32b",
            "qwen2.5-72b"),
    tokens=(1, 16, 128, 512, 2048, 8192),
    tps=(1, 2, 4, 8),
    max_gemm_flops=4e12,
    prefill=((1, 512), (1, 2048), (4, 2048), (1, 8192), (2, 16384), (1, 32768)),
    decode=((1, 1024), (16, 2048), (64, 4096), (128, 8192), (32, 32768), (256, 4096)),
    max_attention_bytes=6e9,
    max_attention_flops=2e13,
    copy_bytes=tuple(int(2 ** (e / 2)) for e in range(40, 64)),  # 1 MiB .. 2.8 GiB
)


def gemm_shapes(m: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one layer (plus the LM head) at tensor
    parallel degree `tp` (column-parallel outputs / row-parallel inputs split by tp)."""
    h = m.hidden_size
    mlp_out = (2 if m.gated_mlp else 1) * m.ffn_hidden
    return {
        "qkv": (h, max(1, (m.q_dim + 2 * m.kv_dim) // tp)),
        "o": (max(1, m.q_dim // tp), h),
        "mlp_up": (h, max(1, mlp_out // tp)),
        "mlp_down": (max(1, m.ffn_hidden // tp), h),
        "lm_head": (h, max(1, m.vocab_size // tp)),
    }


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                    causal: bool) -> float:
    """QK^T and PV: 2 * 2 * b * H * q * kv * d, halved (exactly: kv(kv+1)/2 pairs) when the
    query block attends causally to itself."""
    pairs = q_len * (q_len + 1) / 2 if causal and q_len == kv_len else q_len * kv_len
    return 4.0 * batch * heads * pairs * head_dim


def matmul_cases(plan: BenchPlan, dtype_bytes: int) -> list[Case]:
    seen: dict[tuple[int, int, int], Case] = {}
    for name in plan.models:
        m = MODEL_CATALOG[name]
        for tp in plan.tps:
            if m.num_heads % tp:
                continue
            for proj, (k, n) in gemm_shapes(m, tp).items():
                for t in plan.tokens:
                    flops = 2.0 * t * k * n
                    if flops > plan.max_gemm_flops or (t, k, n) in seen:
                        continue
                    seen[(t, k, n)] = Case(kind="matmul", label=f"{name} tp{tp} {proj} T={t}",
                                           flops=flops, bytes=float((t * k + k * n + t * n) * dtype_bytes),
                                           dims=(t, k, n))
    return list(seen.values())


def attention_cases(plan: BenchPlan, dtype_bytes: int) -> list[Case]:
    seen: dict[tuple, Case] = {}
    for name in plan.models:
        m = MODEL_CATALOG[name]
        for tp in plan.tps:
            if m.num_heads % tp or m.num_kv_heads % tp:
                continue
            hq, hkv, d = m.num_heads // tp, m.num_kv_heads // tp, m.head_dim
            for kind, shapes in (("attention", plan.prefill), ("attention_decode", plan.decode)):
                for b, s in shapes:
                    q_len = s if kind == "attention" else 1
                    flops = attention_flops(b, hq, q_len, s, d, causal=kind == "attention")
                    kv_bytes = 2.0 * b * hkv * s * d * dtype_bytes
                    nbytes = kv_bytes + 2.0 * b * hq * q_len * d * dtype_bytes
                    key = (kind, b, hq, hkv, s, d)
                    if kv_bytes > plan.max_attention_bytes or flops > plan.max_attention_flops \
                            or key in seen:
                        continue
                    seen[key] = Case(kind=kind, label=f"{name} tp{tp} b={b} {'s' if q_len > 1 else 'ctx'}={s}",
                                     flops=flops, bytes=nbytes, dims=(b, hq, hkv, q_len, s, d))
    return list(seen.values())


def memory_cases(plan: BenchPlan) -> list[Case]:
    return [Case(kind="memory", label=f"copy {n / 2**20:.2f} MiB", flops=0.0, bytes=2.0 * n,
                 dims=(n,)) for n in plan.copy_bytes]


def coarse_to_fine(cases: list[Case], key: Callable[[Case], float]) -> list[Case]:
    """Order cases so every prefix spans the size range: smallest, largest, then the
    midpoints of ever finer bisections (in log-size order)."""
    srt = sorted(cases, key=key)
    n = len(srt)
    if n <= 2:
        return srt
    order, seen = [0, n - 1], {0, n - 1}
    step = n - 1
    while len(order) < n and step > 0:
        pos = step / 2
        while pos < n - 1:
            i = int(round(pos))
            if i not in seen:
                seen.add(i)
                order.append(i)
            pos += step
        step = step / 2 if step > 1 else 0
    order += [i for i in range(n) if i not in seen]
    return [srt[i] for i in order]


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> str:
    """The SDPA backend PyTorch's dispatcher picks for these inputs (flash, efficient, cudnn,
    math), or 'unknown' when this torch cannot say."""
    try:
        from torch.nn.attention import SDPBackend

        choice = torch._fused_sdp_choice(q, k, v, is_causal=causal, enable_gqa=True)
        names = {int(v): n.lower() for n, v in SDPBackend.__members__.items()}
        return names.get(int(choice), f"backend-{int(choice)}")
    except (ImportError, AttributeError, RuntimeError, TypeError):
        return "unknown"


def _build(case: Case, *, device: torch.device, dtype: torch.dtype,
           gen: torch.Generator) -> tuple[Callable[..., object], list[tuple], str]:
    """The callable and rotating inputs of one case, and the attention backend if any."""
    esize = torch.empty((), dtype=dtype).element_size()
    if case.kind == "matmul":
        t, k, n = case.dims
        # every timed call on weights out of the cache, as a model larger than the cache runs
        # them (on CPU: enough copies that those timed first are evicted by the rest)
        cap = {"max_sets": CPU_MATMUL_MAX_SETS} if device.type == "cpu" else {}
        sets = rotation_count((t * k + k * n) * esize, device, **cap)
        x = nonzero_tensor((t, k), dtype=dtype, device=device, generator=gen)
        w = nonzero_tensor((n, k), dtype=dtype, device=device, generator=gen, scale=1.0 / math.sqrt(k))
        inputs = [(x.clone(), w.clone()) for _ in range(sets)]
        return F.linear, inputs, ""
    if case.kind in ("attention", "attention_decode"):
        b, hq, hkv, q_len, s, d = case.dims
        causal = case.kind == "attention"
        sets = rotation_count(case.bytes, device)
        scale = 1.0 / math.sqrt(math.sqrt(d))
        inputs = [(nonzero_tensor((b, hq, q_len, d), dtype=dtype, device=device, generator=gen, scale=scale),
                   nonzero_tensor((b, hkv, s, d), dtype=dtype, device=device, generator=gen, scale=scale),
                   nonzero_tensor((b, hkv, s, d), dtype=dtype, device=device, generator=gen))
                  for _ in range(sets)]
        backend = sdpa_backend(*inputs[0], causal=causal)

        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

        return attend, inputs, backend
    if case.kind == "memory":
        (n,) = case.dims
        sets = rotation_count(2 * n, device)
        inputs = [(torch.empty(n // esize, dtype=dtype, device=device),
                   nonzero_tensor((n // esize,), dtype=dtype, device=device, generator=gen))
                  for _ in range(sets)]
        return torch.Tensor.copy_, inputs, ""
    raise ValueError(f"unknown benchmark kind {case.kind!r}; valid: {', '.join(KINDS)}")


def run_case(case: Case, *, device: torch.device, dtype: torch.dtype, gen: torch.Generator,
             max_s: float) -> Measurement:
    fn, inputs, backend = _build(case, device=device, dtype=dtype, gen=gen)
    with torch.inference_mode():
        timing = time_calls(fn, inputs, device=device, max_s=max_s)
    del inputs
    return Measurement(kind=case.kind, label=case.label, flops=case.flops, bytes=case.bytes,
                       time_s=timing.median_s, reps=timing.reps, iqr_frac=timing.iqr_frac,
                       backend=backend, rows=case.dims[0] if case.kind == "matmul" else 0)


def run_cases(cases: list[Case], *, device: torch.device, dtype: torch.dtype, budget_s: float,
              seed: int = 0, min_cases: int = 6,
              on_case: Callable[[Measurement | None], None] | None = None) -> list[Measurement]:
    """Run cases in order until `budget_s` is spent, but at least `min_cases` of them (enough
    to fit and hold out). The deadline is checked between cases: each plan caps one call at
    tens of milliseconds, so the overrun is a few calls at most."""
    gen = torch.Generator().manual_seed(seed)
    deadline = time.perf_counter() + budget_s
    out: list[Measurement] = []
    for i, case in enumerate(cases):
        left = deadline - time.perf_counter()
        if left <= 0 and len(out) >= min_cases:
            if on_case:
                on_case(None)
            continue
        per_case = min(0.5, max(0.02, left / (len(cases) - i) * 0.6))
        meas = run_case(case, device=device, dtype=dtype, gen=gen, max_s=per_case)
        out.append(meas)
        if on_case:
            on_case(meas)
    return out


def measure_op_overhead(device: torch.device, *, calls: int = 2000) -> float:
    """Host seconds per eager operator: back-to-back tiny adds, wall time / count (median of
    five rounds). This is the launch cost every kernel pays on top of its work."""
    a = torch.ones(8, device=device)
    b = torch.ones(8, device=device)
    rounds = []
    for _ in range(6):
        synchronize(device)
        t = time.perf_counter()
        for _ in range(calls):
            torch.add(a, b)
        synchronize(device)
        rounds.append((time.perf_counter() - t) / calls)
    return sorted(rounds[1:])[2]


if __name__ == "__main__":
    dev = torch.device("cpu")
    print(f"op overhead: {measure_op_overhead(dev) * 1e6:.2f} us")
    for make in (lambda: matmul_cases(CPU_PLAN, 4), lambda: attention_cases(CPU_PLAN, 4),
                 lambda: memory_cases(CPU_PLAN)):
        cs = make()
        cs = coarse_to_fine(cs, key=lambda c: c.flops or c.bytes)
        for ms in run_cases(cs[:6], device=dev, dtype=torch.float32, budget_s=3.0):
            print(f"{ms.kind:17s} {ms.label:36s} {ms.time_s * 1e3:9.3f} ms  "
                  f"{ms.flops / ms.time_s / 1e9:8.1f} GFLOP/s  {ms.bytes / ms.time_s / 1e9:7.2f} GB/s "
                  f"{ms.backend}")
