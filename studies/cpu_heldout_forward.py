"""The held-out model's forwards against calibrated profiles: time eager prefill and decode
forwards of a catalog model the CPU calibration never runs (default qwen2-27m: 8 layers,
hidden 512, vocab 8192; the calibration's forwards are tiny and tiny-wide, hidden 64 and 128)
and print, per profile, predicted / measured seconds of each forward with the cost model's
components (`earl.cost_model.compute.forward_pass`: GEMMs, elementwise, counted-operator
overhead, LM head, attention) as shares of the measured time. A profile with a GEMM row
penalty (`gemm_rows_half`) is priced a second time without it ("rows 0"), side by side.

This is the forward-level half of `earl validate --model qwen2-27m`: no engine, no runtime
host costs, so a miss here is the compute model's (docs/fidelity.md, thirteenth session).

    OMP_NUM_THREADS=1 python studies/cpu_heldout_forward.py docs/cpu/epyc-2026-12-04/cf27/profile-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from earl.calibrate.overhead import _build  # noqa: E402
from earl.calibrate.timing import time_calls  # noqa: E402
from earl.cost_model.compute import causal_pairs, forward_pass  # noqa: E402
from earl.cost_model.profile import load_profile  # noqa: E402
from earl.runtime.hf_model import cache_kwarg  # noqa: E402
from earl.specs import MODEL_CATALOG  # noqa: E402

# (batch, prompt tokens) of the prefills, (batch, cached prefix) of the decode steps: the
# rollout engine's decode batches and the train / log-prob passes' token counts of a small run
PREFILL = ((1, 16), (4, 64), (16, 64), (16, 128))
DECODE = ((1, 16), (4, 32), (16, 64))
PARTS = ("linear_s", "elementwise_s", "overhead_s", "lm_head_s", "attention_s")


def measure(model_name: str, prefill=PREFILL, decode=DECODE, max_s: float = 0.6) -> list[dict]:
    """Each forward's label, measured median seconds and how to price it (forward_pass kwargs)."""
    dev = torch.device("cpu")
    spec, model = _build(model_name, dev, torch.float32)
    spec = dataclasses.replace(spec, dtype="fp32")
    gen = torch.Generator().manual_seed(0)
    kw = cache_kwarg(model)
    vocab = min(spec.vocab_size, 64)
    out = []
    for kind, cases in (("prefill", prefill), ("decode", decode)):
        for b, n in cases:
            ids = torch.randint(1, vocab, (b, n), generator=gen)
            with torch.inference_mode():
                if kind == "prefill":
                    fn, inputs = (lambda x: model(input_ids=x, use_cache=False)), [(ids,)]
                    price = dict(tokens=b * n, attn_pairs=b * causal_pairs(n, 0), kv_tokens=b * n, lm_tokens=b * n)
                else:
                    cache = model(input_ids=ids, use_cache=True).past_key_values
                    inputs = [(torch.randint(1, vocab, (b, 1), generator=gen),)]
                    fn = lambda x, c=cache: model(input_ids=x, use_cache=True, **{kw: c})  # noqa: E731
                    price = dict(tokens=b, attn_pairs=b * (n + 1), kv_tokens=b * (n + 1), lm_tokens=b, decode=True)
                t = time_calls(fn, inputs, device=dev, max_s=max_s, max_reps=15).median_s
            out.append({"label": f"{kind} b={b} {'T' if kind == 'prefill' else 'prefix'}={n}", "time_s": t,
                        "price": price, "spec": spec})
    return out


def priced(point: dict, prof) -> dict:
    """The cost model's forward on `prof`: total and each part, as shares of the measured time."""
    c = forward_pass(point["spec"], prof, tp=1, layers=point["spec"].num_layers, **point["price"])
    t = point["time_s"]
    return {"ratio": c.total_s / t, **{p: getattr(c, p) / t for p in PARTS}}


def report(points: list[dict], profiles: dict[str, object]) -> str:
    lines = []
    for name, prof in profiles.items():
        ratios = []
        lines.append(f"{name}:")
        for pt in points:
            r = priced(pt, prof)
            ratios.append(r["ratio"])
            parts = " ".join(f"{p.split('_')[0][:4]} {r[p]:.2f}" for p in PARTS)
            lines.append(f"  {pt['label']:24s} {pt['time_s'] * 1e3:8.2f} ms  "
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
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    profiles = {}
    for p in args.profiles:
        prof = load_profile(p)
        profiles[p] = prof
        if prof.gemm_rows_half:
            profiles[f"{p} (rows 0)"] = dataclasses.replace(prof, gemm_rows_half=0.0)
    points = measure(args.model)
    print(f"{args.model}: eager forwards on 1 thread, priced by each profile")
    print(report(points, profiles))


if __name__ == "__main__":
    main()
