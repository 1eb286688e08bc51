"""Effective per-operator overhead of a real eager transformer forward.

A bare `torch.add` costs about a microsecond on the host, but a Hugging Face decoder layer
issues dozens of small operators (norm pieces, rotary embedding, cache updates, masks) plus
Python between them, while the cost model counts `OPS_PER_LAYER` operators per layer. So this
benchmark times whole forward passes of random-initialised catalog models (prefill without a
cache, decode steps with one) exactly as the runtime runs them, subtracts what the fitted
curves already explain (`earl.cost_model.compute.forward_pass` with zero overhead), and
divides the rest by the operators the cost model counts. The median over cases becomes the
profile's `op_overhead_s`. Then the runtime's own generation engine is timed the same way:
what a decode iteration costs beyond the model forward (sampling, stop checks, padded masks,
cache bookkeeping) becomes `step_overhead_s`.

    python -m earl.calibrate.overhead      # CPU, tiny models, a few seconds
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch

from earl.calibrate.timing import time_calls
from earl.cost_model.compute import OPS_PER_LAYER, causal_pairs, forward_pass
from earl.cost_model.profile import HardwareProfile
from earl.specs import MODEL_CATALOG

CPU_CASES = {"models": ("tiny", "tiny-wide"),
             "prefill": ((1, 1), (1, 16), (4, 8), (2, 64)),  # (batch, tokens)
             "decode": ((1, 16), (4, 32), (16, 64))}  # (batch, cached prefix)
CUDA_CASES = {"models": ("qwen2.5-0.5b", "qwen2.5-1.5b"),
              "prefill": ((1, 1), (1, 128), (4, 512), (1, 2048)),
              "decode": ((1, 128), (16, 512), (64, 1024))}


@dataclass(frozen=True, kw_only=True)
class ForwardPoint:
    """One timed forward pass and what the cost model explains of it without overhead."""

    label: str  # e.g. "tiny decode b=4 prefix=32"
    time_s: float  # measured median seconds
    explained_s: float  # cost-model time with op_overhead_s = 0
    ops: int  # operators the cost model counts for this pass

    @property
    def per_op_s(self) -> float:
        return max(0.0, self.time_s - self.explained_s) / self.ops


@dataclass(frozen=True, kw_only=True)
class OverheadFit:
    op_overhead_s: float  # median per-op residual
    points: tuple[ForwardPoint, ...]
    heldout_median_err: float  # with the median taken over the other points (leave-one-out)

    def quality(self) -> dict:
        return {"op_overhead_s": self.op_overhead_s, "n": len(self.points),
                "heldout_median_err": round(self.heldout_median_err, 4),
                "points": [{"label": p.label, "time_s": p.time_s, "explained_s": p.explained_s}
                           for p in self.points]}


def _build(name: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from earl.runtime.model import hf_config_from_spec

    spec = MODEL_CATALOG[name]
    cfg = hf_config_from_spec(spec, {torch.float32: "fp32", torch.bfloat16: "bf16",
                                     torch.float16: "fp16"}[dtype])
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return spec, model.to(device=device, dtype=dtype).eval()


def measure_forward_points(*, device: torch.device, dtype: torch.dtype, prof: HardwareProfile,
                           budget_s: float, on_case=None) -> list[ForwardPoint]:
    """Time prefill and decode forwards of the device's models until `budget_s` is spent."""
    from earl.runtime.model import cache_kwarg

    cases = CPU_CASES if device.type == "cpu" else CUDA_CASES
    bare = dataclasses.replace(prof, op_overhead_s=0.0)
    deadline = time.perf_counter() + budget_s
    gen = torch.Generator().manual_seed(0)
    points: list[ForwardPoint] = []
    for name in cases["models"]:
        spec, model = _build(name, device, dtype)
        spec = dataclasses.replace(spec, dtype={torch.float32: "fp32"}.get(dtype, "bf16"))
        ops = spec.num_layers * OPS_PER_LAYER + 2
        kw = cache_kwarg(model)
        vocab = min(spec.vocab_size, 64)
        for kind in ("prefill", "decode"):
            for b, n in cases[kind]:
                if time.perf_counter() > deadline and len(points) >= 4:
                    if on_case:
                        on_case(None)
                    continue
                ids = torch.randint(1, vocab, (b, n), generator=gen).to(device)
                with torch.inference_mode():
                    if kind == "prefill":
                        inputs = [(ids,)]
                        fn = lambda x, m=model: m(input_ids=x, use_cache=False)  # noqa: E731
                        cost = forward_pass(spec, bare, tp=1, layers=spec.num_layers, tokens=b * n,
                                            attn_pairs=b * causal_pairs(n, 0), kv_tokens=b * n,
                                            lm_tokens=b * n)
                    else:
                        cache = model(input_ids=ids, use_cache=True).past_key_values
                        step = torch.randint(1, vocab, (b, 1), generator=gen).to(device)
                        inputs = [(step,)]
                        fn = lambda x, m=model, c=cache, k=kw: m(input_ids=x, use_cache=True, **{k: c})  # noqa: E731
                        cost = forward_pass(spec, bare, tp=1, layers=spec.num_layers, tokens=b,
                                            attn_pairs=b * (n + 1), kv_tokens=b * (n + 1), lm_tokens=b)
                    t = time_calls(fn, inputs, device=device, max_s=min(0.5, budget_s / 20), max_reps=15)
                label = f"{name} {kind} b={b} {'T' if kind == 'prefill' else 'prefix'}={n}"
                points.append(ForwardPoint(label=label, time_s=t.median_s, explained_s=cost.total_s,
                                           ops=ops))
                if on_case:
                    on_case(points[-1])
        del model
    return points


def fit_overhead(points: list[ForwardPoint]) -> OverheadFit:
    if len(points) < 3:
        raise ValueError(f"op overhead fit: only {len(points)} forward passes timed, need 3 "
                         "(raise --budget-s)")
    per_op = [p.per_op_s for p in points]
    errs = []
    for i, p in enumerate(points):  # leave-one-out: predict each point from the others' median
        ov = statistics.median(per_op[:i] + per_op[i + 1:])
        errs.append(abs(p.explained_s + ov * p.ops - p.time_s) / p.time_s)
    return OverheadFit(op_overhead_s=statistics.median(per_op), points=tuple(points),
                       heldout_median_err=statistics.median(errs))


ENGINE_CASES = {"cpu": ("tiny", (1, 4, 16)), "cuda": ("qwen2.5-0.5b", (1, 16, 64))}  # model, batches
ENGINE_PROMPT, ENGINE_NEW = 16, 24  # prompt tokens, tokens generated per timed turn


@dataclass(frozen=True, kw_only=True)
class EngineFit:
    """Per-iteration engine cost beyond the forward the cost model prices."""

    step_overhead_s: float  # median over batches of (measured - cost model) per decode iteration
    points: tuple[tuple[int, float, float], ...]  # (batch, measured s / iteration, predicted s)

    def quality(self) -> dict:
        return {"step_overhead_s": self.step_overhead_s,
                "points": [{"batch": b, "measured_s": m, "predicted_s": p} for b, m, p in self.points]}


def measure_engine(*, device: torch.device, dtype: torch.dtype, prof: HardwareProfile) -> EngineFit:
    """Time decode iterations of the runtime's own generation engine (sampling, stop checks,
    padded masks and all) and compare each with the cost model's decode step at that batch."""
    from earl.cost_model import CostModel
    from earl.runtime.engine import SamplingParams, TorchEngine
    from earl.runtime.tokenizer import CharTokenizer
    from earl.specs import ClusterSpec

    name, batches = ENGINE_CASES[device.type]
    spec, model = _build(name, device, dtype)
    spec = dataclasses.replace(spec, dtype={torch.float32: "fp32"}.get(dtype, "bf16"))
    cm = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), prof)
    tok = CharTokenizer()
    params = SamplingParams(temperature=1.0, max_new_tokens=ENGINE_NEW, stop=(), stop_at_eos=False)
    gen = torch.Generator(device=device).manual_seed(0)
    points = []
    for b in batches:
        engine = TorchEngine(model, tok)
        prompts = {r: torch.randint(1, tok.vocab_size, (ENGINE_PROMPT,)).tolist() for r in range(b)}
        engine.open(b).generate(prompts, params, gen)  # warm-up
        per_iter = []
        for _ in range(3):
            before = dataclasses.replace(engine.stats)
            engine.open(b).generate(prompts, params, gen)
            iters = ENGINE_NEW - 1  # forwards after the prefill
            per_iter.append((engine.stats.decode_s - before.decode_s) / iters)
        measured = statistics.median(per_iter)
        ctx = b * (ENGINE_PROMPT + ENGINE_NEW / 2)  # mean cached tokens over the turn
        points.append((b, measured, cm.decode_step_time_s(1, b, ctx)))
    del model
    return EngineFit(step_overhead_s=max(0.0, statistics.median(m - p for _, m, p in points)),
                     points=tuple(points))


def cases_count(device: torch.device) -> int:
    cases = CPU_CASES if device.type == "cpu" else CUDA_CASES
    return len(cases["models"]) * (len(cases["prefill"]) + len(cases["decode"]))


if __name__ == "__main__":
    from earl.cost_model.profile import load_profile

    torch.set_num_threads(1)
    pts = measure_forward_points(device=torch.device("cpu"), dtype=torch.float32,
                                 prof=load_profile("cpu-measured"), budget_s=10)
    fit = fit_overhead(pts)
    for p in pts:
        print(f"{p.label:32s} {p.time_s * 1e3:8.3f} ms  explained {p.explained_s * 1e3:8.3f} ms  "
              f"per op {p.per_op_s * 1e6:7.1f} us")
    print(f"op_overhead_s {fit.op_overhead_s * 1e6:.1f} us, leave-one-out error {fit.heldout_median_err:.1%}")
    prof = dataclasses.replace(load_profile("cpu-measured"), op_overhead_s=fit.op_overhead_s)
    eng = measure_engine(device=torch.device("cpu"), dtype=torch.float32, prof=prof)
    for b, m, p in eng.points:
        print(f"engine decode iteration b={b:3d}: {m * 1e3:7.3f} ms, cost model {p * 1e3:7.3f} ms")
    print(f"step_overhead_s {eng.step_overhead_s * 1e3:.3f} ms")
