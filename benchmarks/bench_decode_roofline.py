"""Decode throughput of the built-in engine as a fraction of the memory-bandwidth roofline.

Each decode step must read every weight once and the KV cache of every running sequence, so a
step takes at least (weight bytes + KV bytes) / bandwidth. This plays `--batches` episodes at
once through `TorchEngine` (prompt of `--prompt` tokens, `--new` tokens each, greedy; then a
second turn of `--new` tokens, the one measured), reads the engine's decode time, and prints
achieved tokens/s next to the roofline's, for each setting:
eager or compiled (`--compile off|on|both`; compiled = forward + sampling in one CUDA graph per
width) times decode steps per host sync (`--decode-steps 1,8`). The bandwidth is the measured
device-to-device copy rate of this run (bytes read + written), not a datasheet peak.

    python benchmarks/bench_decode_roofline.py --model qwen2.5-0.5b --device cuda --decode-steps 1,8
    python benchmarks/bench_decode_roofline.py --model qwen2.5-0.5b --device cuda --compile on  # CUDA graphs
    python benchmarks/bench_decode_roofline.py --model tiny --device cpu --new 16 --compile both  # smoke run
"""

from __future__ import annotations

import argparse
import time

import torch


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Bytes read + written per second of a large device copy (best of 5)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() / best


def main() -> None:
    from earl.runtime.engine import EngineStats, SamplingParams, TorchEngine
    from earl.runtime.hf_model import TORCH_DTYPES, build_builtin
    from earl.specs import MODEL_CATALOG

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b", help="catalog name (random weights)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--compile", default="off", choices=("off", "on", "both"),
                    help="compiled decode steps (forward + sampling; CUDA graphs on a GPU)")
    ap.add_argument("--decode-steps", default="1,8", help="decode steps per host sync, one setting each")
    a = ap.parse_args()
    dev = torch.device(a.device)
    spec = MODEL_CATALOG[a.model]
    if a.model.startswith("tiny"):
        pol = build_builtin(a.model, seed=0, dtype=a.dtype)
        model, tok = pol.model, pol.tokenizer
    else:
        from transformers import AutoModelForCausalLM

        from earl.runtime.hf_model import hf_config_from_spec
        from earl.runtime.tokenizer import CharTokenizer

        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(hf_config_from_spec(spec, a.dtype), dtype=TORCH_DTYPES[a.dtype])
        tok = CharTokenizer()
    model = model.to(dev).eval()
    item = torch.empty((), dtype=TORCH_DTYPES[a.dtype]).element_size()
    weight_bytes = sum(p.numel() for p in model.parameters()) * item
    kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * (spec.hidden_size // spec.num_heads) * item
    bw = copy_bandwidth(dev)
    print(f"{a.model} {a.dtype} on {dev}: weights {weight_bytes / 2**30:.2f} GiB, KV {kv_per_token} B/token, "
          f"measured copy bandwidth {bw / 1e12:.2f} TB/s")
    params = SamplingParams(temperature=0, max_new_tokens=a.new, stop_at_eos=False)
    settings = [(c, int(k)) for c in {"off": (False,), "on": (True,), "both": (False, True)}[a.compile]
                for k in a.decode_steps.split(",")]
    print(f"{'batch':>5} {'compile':>7} {'steps/sync':>10} {'tok/s':>10} {'roofline tok/s':>15} {'fraction':>9} "
          f"{'syncs/token':>11}")
    for b in (int(x) for x in a.batches.split(",")):
        prompts = {r: [3 + (r + i) % 50 for i in range(a.prompt)] for r in range(b)}
        ctx_mean = a.prompt + a.new + 1 + a.new / 2  # the measured turn is the second one
        roof_tok_s = b / ((weight_bytes + b * ctx_mean * kv_per_token) / bw)
        engines = {}
        for compile_, k in settings:
            # turn 1 warms up (compiles, records the CUDA graphs); turn 2 of the same episodes
            # reuses their cache (sized for both turns: no new shape, no re-recording) and runs
            # one prefill step (one token per row), then pure decode steps: decode_s times those
            if compile_ not in engines:
                engines[compile_] = TorchEngine(model, tok, max_batch=b, step_tokens=b * a.prompt, compile=compile_,
                                                initial_capacity=2 * (a.prompt + a.new) + 16)
            eng = engines[compile_]
            eng.decode_steps = k
            batch = eng.open(b)
            batch.generate(prompts, params)
            eng.stats = EngineStats()
            batch.generate({r: [5] for r in range(b)}, params)
            tok_s = eng.stats.decode_tokens / eng.stats.decode_s
            print(f"{b:>5} {'on' if compile_ else 'off':>7} {k:>10} {tok_s:>10.1f} {roof_tok_s:>15.1f} "
                  f"{tok_s / roof_tok_s:>9.1%} {eng.stats.host_syncs / eng.stats.generated_tokens:>11.3f}", flush=True)
    if dev.type == "cuda" and a.compile != "off":
        from torch._dynamo.utils import counters  # a compiled graph that could not run as a CUDA graph

        print(f"CUDA graph skips: {counters['inductor']['cudagraph_skips']} (0: every compiled step replayed a graph)")


if __name__ == "__main__":
    main()
