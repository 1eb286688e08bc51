"""The held-out model's forwards against calibrated profiles: time eager prefill and decode
forwards of a catalog model the CPU calibration never runs (default qwen2-27m: 8 layers,
hidden 512, vocab 8192; the calibration's forwards are tiny and tiny-wide, hidden 64 and 128)
and print, per profile, predicted / measured seconds of each forward with the cost model's
components (`earl.cost_model.compute.forward_pass`: GEMMs, elementwise, counted-operator
overhead, LM head, attention) as shares of the measured time. A profile with a GEMM row
penalty (`gemm_rows_half`) is priced a second time without it ("rows 0"), side by side.

This is the forward-level half of `earl validate --model qwen2-27m`: no engine, no runtime
host costs, so a miss here is the compute model's (docs/validate-history.md, thirteenth session).
`--gemm-sequence` also times, at decode batches 1-16, the model's own Linear layers called in
the forward's order on its own weights (each read from memory once a step when the model is
larger than the cache) against each profile's price of those GEMMs, and the whole decode step
(nineteenth session).

    OMP_NUM_THREADS=1 python studies/cpu_heldout_forward.py docs/cpu/epyc-2026-12-04/cf27/profile-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from earl.calibrate.overhead import ForwardPoint, _build, cache_kwarg, measure_forward_points  # noqa: E402
from earl.calibrate.timing import time_calls  # noqa: E402
from earl.cost_model.compute import forward_pass, gemm_time_s  # noqa: E402
from earl.cost_model.profile import load_profile  # noqa: E402
from earl.specs import MODEL_CATALOG  # noqa: E402

# (batch, prompt tokens) of the prefills, (batch, cached prefix) of the decode steps: the
# rollout engine's decode batches and the train / log-prob passes' token counts of a small run
PREFILL = ((1, 16), (4, 64), (16, 64), (16, 128))
DECODE = ((1, 16), (4, 32), (16, 64))
PARTS = ("linear_s", "elementwise_s", "overhead_s", "lm_head_s", "attention_s")


def measure(model_name: str, prefill=PREFILL, decode=DECODE) -> list[ForwardPoint]:
    """Each forward timed as `earl calibrate` times its own (earl.calibrate.overhead), with the
    `forward_pass` arguments that price it."""
    return measure_forward_points(device=torch.device("cpu"), dtype=torch.float32, prof=load_profile("cpu"),
                                  budget_s=math.inf, cases={"models": (model_name,), "prefill": prefill,
                                                            "decode": decode})


SEQUENCE_BATCHES = (1, 2, 4, 8, 16)


def gemm_sequence(model_name: str, profiles: dict, batches=SEQUENCE_BATCHES, prefix: int = 32) -> str:
    """Per decode batch: the step's wall time, its Linear layers alone (in order, on the model's
    weights) and each profile's price of those GEMMs (`gemm_time_s` per layer's own shape)."""
    cpu = torch.device("cpu")
    spec, model = _build(model_name, cpu, torch.float32)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    shapes = [(m.in_features, m.out_features) for m in linears]
    kw = cache_kwarg(model)
    mb = sum(k * n for k, n in shapes) * 4 / 1e6
    lines = [f"{model_name}: {len(linears)} Linear layers, {mb:.1f} MB of fp32 weights, called in the forward's order"]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for b in batches:
            ids = torch.randint(1, 64, (b, prefix), generator=gen)
            cache = model(input_ids=ids, use_cache=True).past_key_values
            step = torch.randint(1, 64, (b, 1), generator=gen)
            fwd = time_calls(lambda s=step, c=cache: model(input_ids=s, use_cache=True, **{kw: c}), [()],
                             device=cpu, max_reps=15).median_s
            xs = {k: torch.randn(b, 1, k, generator=gen) for k, _ in shapes}
            seq = time_calls(lambda x=xs: [m(x[m.in_features]) for m in linears], [()], device=cpu,
                             max_reps=15).median_s
            prices = " ".join(f"{name}: x{sum(gemm_time_s(b, k, n, prof, 4) for k, n in shapes) / seq:.2f}"
                              for name, prof in profiles.items())
            lines.append(f"  decode b={b:<3d} step {fwd * 1e3:7.2f} ms, its GEMMs {seq * 1e3:7.2f} ms "
                         f"({mb / 1e3 / seq:.1f} GB/s); GEMMs priced / measured: {prices}")
    return "\n".join(lines)


def priced(point: ForwardPoint, prof) -> dict:
    """The cost model's forward on `prof`: total and each part, as shares of the measured time
    (decode steps' attention on the profile's decode curve, as the rollout prices it)."""
    c = forward_pass(point.spec, prof, tp=1, layers=point.spec.num_layers, decode=point.decode, **point.price)
    return {"ratio": c.total_s / point.time_s, **{p: getattr(c, p) / point.time_s for p in PARTS}}


def report(points: list[ForwardPoint], profiles: dict[str, object]) -> str:
    lines = []
    for name, prof in profiles.items():
        ratios = []
        lines.append(f"{name}:")
        for pt in points:
            r = priced(pt, prof)
            ratios.append(r["ratio"])
            parts = " ".join(f"{p.split('_')[0][:4]} {r[p]:.2f}" for p in PARTS)
            lines.append(f"  {pt.label:34s} {pt.time_s * 1e3:8.2f} ms  "
                         f"predicted/measured x{r['ratio']:.2f}  ({parts})")
        errs = [abs(x - 1) for x in ratios]
        lines.append(f"  median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}; within 25%: "
                     f"{sum(e <= 0.25 for e in errs)} of {len(errs)}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", help="calibrated profile JSON files (or shipped profile names)")
    ap.add_argument("--model", default="qwen2-27m", choices=sorted(MODEL_CATALOG), metavar="MODEL",
                    help="catalog model to time (default qwen2-27m)")
    ap.add_argument("--gemm-sequence", action="store_true",
                    help="also time the decode step's Linear layers in order against each profile's price")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    profiles = {}
    for p in args.profiles:
        try:
            prof = load_profile(p)
        except ValueError as e:  # a missing or malformed profile: one line, exit 2
            ap.error(str(e).splitlines()[0])
        profiles[p] = prof
        if prof.gemm_rows_half:
            profiles[f"{p} (rows 0)"] = dataclasses.replace(prof, gemm_rows_half=0.0)
    points = measure(args.model)
    print(f"{args.model}: eager forwards on 1 thread, priced by each profile")
    print(report(points, profiles))
    if args.gemm_sequence:
        print(gemm_sequence(args.model, {p: profiles[p] for p in args.profiles}))


if __name__ == "__main__":
    main()
