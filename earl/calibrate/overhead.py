"""Effective per-operator overhead of a real eager transformer forward.

A bare `torch.add` costs about a microsecond on the host, but a Hugging Face decoder layer
issues dozens of small operators (norm pieces, rotary embedding, cache updates, masks) plus
Python between them, while the cost model counts `OPS_PER_LAYER` operators per layer. So this
benchmark times whole forward passes of random-initialised catalog models (prefill without a
cache, decode steps with one) exactly as the runtime runs them, subtracts what the fitted
curves already explain (`earl.cost_model.compute.forward_pass` with zero overhead) except
the elementwise ops, and fits the rest as `ops * op_overhead_s + k * elementwise_s` (relative
least squares, both >= 0): the profile's `op_overhead_s` and its `elementwise` curve (the copy
curve slowed k-fold: norms, rotary and activations of a real forward on CPU run ~4x below a
large copy). Then the runtime's own generation engine is timed the same way: what a decode
iteration costs beyond the model forward (sampling, stop checks, padded masks, cache
bookkeeping) is fitted as `step_overhead_s + batch * step_seq_overhead_s`.

    python -m earl.calibrate.overhead      # CPU, tiny models, a few seconds
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import nnls
from transformers import AutoModelForCausalLM

from earl.calibrate.timing import time_calls, time_host_interleaved
from earl.cost_model import CostModel
from earl.cost_model.compute import OPS_PER_LAYER, causal_pairs, forward_pass
from earl.cost_model.profile import EfficiencyCurve, HardwareProfile, load_profile
from earl.runtime.engine import SamplingParams, TorchEngine
from earl.runtime.engine.pytorch import KV_ROUND, _round_up
from earl.runtime.hf_model import cache_kwarg, hf_config_from_spec
from earl.runtime.tokenizer import CharTokenizer
from earl.specs import MODEL_CATALOG, ClusterSpec, ModelSpec

CPU_CASES = {"models": ("tiny", "tiny-wide"),
             # (batch, tokens); the extremes first: a budget-cut run still fits on a spread of sizes
             "prefill": ((1, 1), (16, 256), (2, 64), (1, 16), (8, 128), (4, 8), (16, 32)),
             "decode": ((1, 16), (4, 32), (16, 64))}  # (batch, cached prefix)
CUDA_CASES = {"models": ("qwen2.5-0.5b", "qwen2.5-1.5b"),
              "prefill": ((1, 1), (1, 128), (4, 512), (1, 2048), (16, 2048)),
              "decode": ((1, 128), (16, 512), (64, 1024))}


@dataclass(frozen=True, kw_only=True)
class ForwardPoint:
    """One timed forward pass and what the cost model explains of it without overhead."""

    label: str  # e.g. "tiny decode b=4 prefix=32"
    time_s: float  # measured median seconds
    explained_s: float  # cost-model time with op_overhead_s = 0
    ops: int  # operators the cost model counts for this pass
    elementwise_s: float = 0.0  # of explained_s: the elementwise ops on the copy curve
    spec: ModelSpec | None = None  # the model timed, and `forward_pass`'s arguments for it
    price: dict = dataclasses.field(default_factory=dict)
    decode: bool = False  # a decode step (explained_s prices its attention on the prefill curve)

    @property
    def per_op_s(self) -> float:
        return max(0.0, self.time_s - self.explained_s) / self.ops

    def predict(self, op_overhead_s: float, elem_factor: float) -> float:
        return self.explained_s + (elem_factor - 1) * self.elementwise_s + op_overhead_s * self.ops


@dataclass(frozen=True, kw_only=True)
class OverheadFit:
    op_overhead_s: float  # fitted seconds per counted operator
    points: tuple[ForwardPoint, ...]
    heldout_median_err: float  # each point predicted by a fit to the others (leave-one-out)
    elem_factor: float = 1.0  # elementwise ops take this many times the copy curve's time
    floor_s: float = 0.0  # the fit's lower bound on op_overhead_s (a bare operator's cost)

    @property
    def at_floor(self) -> bool:
        """The forwards showed no cost per operator beyond the floor: the fit says nothing."""
        return self.op_overhead_s <= self.floor_s * (1 + 1e-9)

    def elementwise_curve(self, memory: EfficiencyCurve) -> EfficiencyCurve | None:
        """The profile's `elementwise` curve: `memory` slowed `elem_factor`-fold (None: same)."""
        if self.elem_factor == 1.0:
            return None
        return EfficiencyCurve(peak_frac=min(1.5, memory.peak_frac / self.elem_factor),
                               half_size=memory.half_size)

    def quality(self) -> dict:
        return {"op_overhead_s": self.op_overhead_s, "elem_factor": self.elem_factor, "n": len(self.points),
                "floor_s": self.floor_s, "at_floor": self.at_floor,
                "heldout_median_err": round(self.heldout_median_err, 4),
                "points": [{"label": p.label, "time_s": p.time_s, "explained_s": p.explained_s}
                           for p in self.points]}


def _build(name: str, device: torch.device, dtype: torch.dtype):


    spec = MODEL_CATALOG[name]
    cfg = hf_config_from_spec(spec, {torch.float32: "fp32", torch.bfloat16: "bf16",
                                     torch.float16: "fp16"}[dtype])
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return spec, model.to(device=device, dtype=dtype).eval()


def measure_forward_points(*, device: torch.device, dtype: torch.dtype, prof: HardwareProfile,
                           budget_s: float, on_case=None, cases: dict | None = None) -> list[ForwardPoint]:
    """Time prefill and decode forwards of the device's models (`cases`: another set of
    models, prefills and decode steps, as CPU_CASES) until `budget_s` is spent."""

    cases = cases or (CPU_CASES if device.type == "cpu" else CUDA_CASES)
    bare = dataclasses.replace(prof, op_overhead_s=0.0, elementwise=None)
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
                        price = dict(tokens=b * n, attn_pairs=b * causal_pairs(n, 0), kv_tokens=b * n,
                                     lm_tokens=b * n)
                    else:
                        cache = model(input_ids=ids, use_cache=True).past_key_values
                        step = torch.randint(1, vocab, (b, 1), generator=gen).to(device)
                        inputs = [(step,)]
                        fn = lambda x, m=model, c=cache, k=kw: m(input_ids=x, use_cache=True, **{k: c})  # noqa: E731
                        price = dict(tokens=b, attn_pairs=b * (n + 1), kv_tokens=b * (n + 1), lm_tokens=b)
                    cost = forward_pass(spec, bare, tp=1, layers=spec.num_layers, **price)
                    t = time_calls(fn, inputs, device=device, max_s=min(0.5, budget_s / 20), max_reps=15)
                label = f"{name} {kind} b={b} {'T' if kind == 'prefill' else 'prefix'}={n}"
                points.append(ForwardPoint(label=label, time_s=t.median_s, explained_s=cost.total_s,
                                           ops=ops, elementwise_s=cost.elementwise_s, spec=spec, price=price,
                                           decode=kind == "decode"))
                if on_case:
                    on_case(points[-1])
        del model
    return points


def fit_overhead(points: list[ForwardPoint], *, floor_s: float = 0.0) -> OverheadFit:
    """Fit `op_overhead_s >= floor_s` (a counted operator of a real forward costs at least a
    bare operator's launch: pass the measured one) and the elementwise factor to `points`.
    On a noisy host, or when the earlier fitted curves over-explain the small forwards, the
    unbounded fit can land on zero; the floor keeps the profile physical and `at_floor` says so."""
    if len(points) < 3:
        raise ValueError(f"op overhead fit: only {len(points)} forward passes timed, need 3 "
                         "(raise --budget-s)")
    errs = []
    for i, p in enumerate(points):  # leave-one-out: predict each point from a fit to the others
        ov, k = _fit_forward(points[:i] + points[i + 1:], floor_s)
        errs.append(abs(p.predict(ov, k) - p.time_s) / p.time_s)
    ov, k = _fit_forward(points, floor_s)
    return OverheadFit(op_overhead_s=ov, elem_factor=k, points=tuple(points), floor_s=floor_s,
                       heldout_median_err=statistics.median(errs))


def _fit_forward(points: list[ForwardPoint], floor_s: float = 0.0) -> tuple[float, float]:
    """(op_overhead_s >= floor_s, elementwise factor >= 0) minimising the relative error; a
    factor of 1 (the copy curve) when the points carry no elementwise time to fit it on."""

    t = np.array([p.time_s for p in points])
    rest = np.array([p.explained_s - p.elementwise_s + floor_s * p.ops for p in points])
    cols = np.array([[p.ops, p.elementwise_s] for p in points], dtype=float)
    if not (cols[:, 1] > 0.02 * t).any():  # elementwise time nowhere visible: keep the copy curve
        x, _ = nnls((cols[:, :1] / t[:, None]), (t - rest - cols[:, 1]) / t)
        return floor_s + float(x[0]), 1.0
    x, _ = nnls(cols / t[:, None], (t - rest) / t)
    return floor_s + float(x[0]), float(x[1]) if x[1] > 0 else 1.0


# model, (batch, prompt tokens) of the timed engine turns
ENGINE_CASES = {"cpu": ("tiny", ((1, 16), (4, 16), (16, 16), (32, 16), (4, 200), (16, 200))),
                "cuda": ("qwen2.5-0.5b", ((1, 128), (16, 128), (64, 128), (128, 128), (16, 2048), (64, 1024)))}
ENGINE_NEW = 24  # tokens generated per timed turn
# checked every token like an environment's stop string, never produced (not in the vocabulary)
ENGINE_STOP = ("\u2603",)


@dataclass(frozen=True, kw_only=True)
class EngineFit:
    """The runtime engine's cost beyond the forwards the cost model prices (>= 0 least squares):
    per decode iteration ~ 1, batch, cached tokens; per turn (generate call) ~ 1, batch."""

    step_overhead_s: float
    points: tuple[tuple[int, float, float], ...]  # (batch, measured s / iteration, predicted s)
    step_seq_overhead_s: float = 0.0
    step_kv_token_s: float = 0.0
    turn_overhead_s: float = 0.0
    turn_seq_overhead_s: float = 0.0
    turns: tuple[tuple[int, float, float], ...] = ()  # (batch, measured s / 1-token turn, predicted)

    def profile_fields(self) -> dict:
        return {k: getattr(self, k) for k in ("step_overhead_s", "step_seq_overhead_s", "step_kv_token_s",
                                              "turn_overhead_s", "turn_seq_overhead_s")}

    def quality(self) -> dict:
        return {**self.profile_fields(),
                "points": [{"batch": b, "measured_s": m, "predicted_s": p} for b, m, p in self.points],
                "turns": [{"batch": b, "measured_s": m, "predicted_s": p} for b, m, p in self.turns]}


def measure_engine(*, device: torch.device, dtype: torch.dtype, prof: HardwareProfile) -> EngineFit:
    """Time turns of the runtime's own generation engine (sampling, stop checks, padded masks
    and all): a turn of ENGINE_NEW tokens less a turn of one gives the decode iterations, the
    turn of one (a prefill and a sample) gives the per-turn cost; each is compared with the
    cost model's forwards at that batch and context."""


    name, cases = ENGINE_CASES[device.type]
    spec, model = _build(name, device, dtype)
    spec = dataclasses.replace(spec, dtype={torch.float32: "fp32"}.get(dtype, "bf16"))
    bare = dataclasses.replace(prof, step_overhead_s=0.0, step_seq_overhead_s=0.0, step_kv_token_s=0.0)
    cm = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), bare)
    tok = CharTokenizer()
    params = SamplingParams(temperature=1.0, max_new_tokens=ENGINE_NEW, stop=ENGINE_STOP, stop_at_eos=False)
    one = dataclasses.replace(params, max_new_tokens=1)
    iters, turns, calls = [], [], []
    for b, prompt in cases:
        engine = TorchEngine(model, tok)
        # rows of unequal length, as rollouts have: the engine pads them and masks the padding
        # (a slower attention path than an all-ones mask); costs are priced at the padded width
        prompts = {r: torch.randint(3, tok.vocab_size, (prompt - (r % 4) * prompt // 8,)).tolist()
                   for r in range(b)}
        calls += [lambda e=engine, p=prompts: e.open(len(p)).generate(p, params),
                  lambda e=engine, p=prompts: e.open(len(p)).generate(p, one)]
    # the fit below splits each case's time into a fixed part and slopes in batch and cache:
    # the cases are timed round-robin so that no case alone meets a slow spell of the host
    # (timed one after another, back-to-back calibrations put step_overhead_s at 0.21-1.21 ms;
    # docs/validate-history.md, fifteenth session)
    timed = time_host_interleaved(calls, device=device, reps=5)
    for k, (b, prompt) in enumerate(cases):
        long, short = timed[2 * k], timed[2 * k + 1]
        # the positions its decode iterations attended, on average: every row the longest one's
        # length rounded up to KV_ROUND (the engine's slot cache; the simulator's `kv_round`)
        ctx = b * statistics.mean(_round_up(prompt + j + 1, KV_ROUND) for j in range(ENGINE_NEW - 1))
        iters.append((b, ctx, max(0.0, long.median_s - short.median_s) / (ENGINE_NEW - 1),
                      cm.decode_step_time_s(1, b, ctx)))
        turns.append((b, prompt, short.median_s))
    del model
    (fixed, per_seq, per_tok), _ = nnls(np.array([[1.0, b, c] for b, c, _, _ in iters]),
                                        np.array([m - p for _, _, m, p in iters]))
    # the one-token turn: the (masked) prefill forward and its iteration costs, then the rest
    fitted = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1),
                       dataclasses.replace(bare, step_overhead_s=float(fixed), step_seq_overhead_s=float(per_seq),
                                           step_kv_token_s=float(per_tok)))
    pred = [fitted.prefill_time_s(1, b * n, 0, b, masked=True) for b, n, _ in turns]
    w = np.array([1.0 / m for _, _, m in turns])  # relative error: small turns weigh as much
    (t_fixed, t_seq), _ = nnls(np.array([[1.0, b] for b, _, _ in turns]) * w[:, None],
                               np.array([m - p for (_, _, m), p in zip(turns, pred, strict=True)]) * w)
    return EngineFit(step_overhead_s=float(fixed), step_seq_overhead_s=float(per_seq), step_kv_token_s=float(per_tok),
                     turn_overhead_s=float(t_fixed), turn_seq_overhead_s=float(t_seq),
                     points=tuple((b, m, p) for b, _, m, p in iters),
                     turns=tuple((b, m, p) for (b, _, m), p in zip(turns, pred, strict=True)))


def cases_count(device: torch.device) -> int:
    cases = CPU_CASES if device.type == "cpu" else CUDA_CASES
    return len(cases["models"]) * (len(cases["prefill"]) + len(cases["decode"]))


if __name__ == "__main__":

    torch.set_num_threads(1)
    pts = measure_forward_points(device=torch.device("cpu"), dtype=torch.float32,
                                 prof=load_profile("cpu-measured"), budget_s=10)
    fit = fit_overhead(pts)
    for p in pts:
        print(f"{p.label:32s} {p.time_s * 1e3:8.3f} ms  explained {p.explained_s * 1e3:8.3f} ms  "
              f"per op {p.per_op_s * 1e6:7.1f} us")
    print(f"op_overhead_s {fit.op_overhead_s * 1e6:.1f} us, elementwise x{fit.elem_factor:.2f} the copy curve, "
          f"leave-one-out error {fit.heldout_median_err:.1%}")
    base = load_profile("cpu-measured")
    prof = dataclasses.replace(base, op_overhead_s=fit.op_overhead_s,
                               elementwise=fit.elementwise_curve(base.memory))
    eng = measure_engine(device=torch.device("cpu"), dtype=torch.float32, prof=prof)
    for b, m, p in eng.points:
        print(f"engine decode iteration b={b:3d}: {m * 1e3:7.3f} ms, cost model {p * 1e3:7.3f} ms")
    for b, m, p in eng.turns:
        print(f"engine one-token turn     b={b:3d}: {m * 1e3:7.3f} ms, cost model {p * 1e3:7.3f} ms")
    print(", ".join(f"{k} {v * 1e6:.3g} us" for k, v in eng.profile_fields().items()))
