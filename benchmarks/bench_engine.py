"""Engine benchmark: multi-turn episodes with the cross-turn KV cache vs. re-prefilling the
whole context every turn, and batched vs. one-episode-at-a-time generation, side by side.

Episodes are synthetic (random observation tokens of a fixed length each turn, a fixed number of
generated tokens per turn, no stop strings) so both modes do exactly the same work apart from
what the cache saves.

    python benchmarks/bench_engine.py [--model tiny-wide] [--episodes 16] [--obs 48] [--gen 8]
"""

from __future__ import annotations

import argparse
import time

import torch

from earl.runtime.engine import SamplingParams, TorchEngine
from earl.runtime.hf_model import load_policy


def run_episodes(engine: TorchEngine, *, episodes: int, turns: int, obs: int, gen: int,
                 batch: int, seed: int = 0) -> tuple[int, float]:
    """(generated tokens, seconds) for `episodes` episodes of `turns` turns, `batch` at a time."""
    params = SamplingParams(temperature=1.0, max_new_tokens=gen, stop_at_eos=False)
    g = torch.Generator().manual_seed(seed)
    vocab = engine.tokenizer.vocab_size
    produced = 0
    t0 = time.perf_counter()
    for start in range(0, episodes, batch):
        n = min(batch, episodes - start)
        b = engine.open(n, seeds=[seed * 1_000_003 + start + r for r in range(n)])
        for _ in range(turns):
            inputs = {r: torch.randint(3, vocab, (obs,), generator=g).tolist() for r in range(n)}
            outs = b.generate(inputs, params)
            produced += sum(len(o.token_ids) for o in outs.values())
        b.close(range(n))
    return produced, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-wide")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--obs", type=int, default=48, help="observation tokens per turn")
    ap.add_argument("--gen", type=int, default=8, help="generated tokens per turn")
    ap.add_argument("--turns", default="2,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="best of N runs per cell (noisy hosts)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pol = load_policy(args.model, seed=0)
    kv = TorchEngine(pol.model, pol.tokenizer, reuse_kv=True)
    re = TorchEngine(pol.model, pol.tokenizer, reuse_kv=False)
    run_episodes(kv, episodes=2, turns=2, obs=8, gen=2, batch=2)  # warm-up
    print(f"model {args.model}, {args.episodes} episodes, {args.obs} obs + {args.gen} generated "
          f"tokens per turn, {args.threads} threads")
    print(f"{'turns':>5} {'context':>7} {'kv-cache tok/s':>15} {'re-prefill tok/s':>17} {'ratio':>6}")
    kw = dict(episodes=args.episodes, obs=args.obs, gen=args.gen, batch=args.episodes)

    def best(engine, **k) -> float:
        """Tokens/s, best of --repeats runs (the two modes alternate, so load hits both)."""
        rates = []
        for _ in range(args.repeats):
            n, s = run_episodes(engine, **k)
            rates.append(n / s)
        return max(rates)

    for turns in [int(t) for t in args.turns.split(",")]:
        r1, r2 = best(kv, turns=turns, **kw), best(re, turns=turns, **kw)
        ctx = turns * (args.obs + args.gen)
        print(f"{turns:5d} {ctx:7d} {r1:15.0f} {r2:17.0f} {r1 / r2:5.2f}x")
    turns = 8
    r1, r2 = best(kv, turns=turns, **kw), best(kv, turns=turns, **dict(kw, batch=1))
    print(f"batched ({args.episodes} episodes together) vs one at a time, {turns} turns, KV cache: "
          f"{r1:.0f} vs {r2:.0f} tok/s = {r1 / r2:.2f}x")


if __name__ == "__main__":
    main()
