"""Engine benchmark, side by side in one run:

1. continuous batching (`engine="pytorch"`) vs the static turn-synchronous engine
   (`engine="pytorch-static"`, the first built-in engine) on a mixed-length multi-turn workload,
   both driven by the real rollout loop (`earl.runtime.rollout.rollout`): episodes of 1-6 turns,
   observations of 8-64 tokens, turns that end on a stop character or at 32 tokens. Both sample
   the very same tokens (counter-based sampling), so tokens/s compare equal work;
2. decode steps of the continuous engine: eager vs compiled (`torch.compile`, sampling inside the
   graph), one vs 8 decode steps per host sync (`decode_steps`), at batch 1 and 16: decode
   tokens/s and host syncs per generated token (`EngineStats.host_syncs`, counted where the
   engine reads sampled tokens back);
3. the cross-turn KV cache vs re-prefilling the whole context every turn.

`--models` takes built-in names and `cpu-wide` (4 layers, hidden 512, random weights), a wider
model where the forward's arithmetic, not Python, dominates.

    python benchmarks/bench_engine.py [--models tiny,tiny-wide,cpu-wide] [--episodes 32]
    python benchmarks/bench_engine.py --models tiny --compile-models tiny,cpu-wide --repeats 5  # decode table
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import torch

from earl.runtime.engine import EngineStats, SamplingParams, TorchEngine, make_engine
from earl.runtime.envs.base import StepResult
from earl.runtime.hf_model import Policy, build_builtin, hf_config_from_spec
from earl.runtime.rollout import rollout
from earl.specs import MODEL_CATALOG

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 "
STOP = ("\n", "!", "?", "#")  # turns end on one of these (about one token in 16) or at max_new_tokens


class MixedEnv:
    """1-6 turns, observations of 8-64 random characters; a pure function of the seed."""

    def reset(self, seed: int) -> str:
        self.rng = random.Random(seed)
        self.turns, self.t = self.rng.randint(1, 6), 0
        return self._obs()

    def _obs(self) -> str:
        return "".join(self.rng.choice(ALPHABET) for _ in range(self.rng.randint(8, 64)))

    def step(self, action: str) -> StepResult:
        self.t += 1
        done = self.t >= self.turns
        return StepResult(observation="" if done else self._obs(), reward=0.0, done=done,
                          outcome="win" if done else "")


def load(name: str) -> Policy:
    if name != "cpu-wide":
        return build_builtin(name, seed=0)
    from transformers import AutoModelForCausalLM

    spec = dataclasses.replace(MODEL_CATALOG["tiny-wide"], name="cpu-wide", num_layers=4, hidden_size=512,
                               num_heads=8, num_kv_heads=2, head_dim=64, ffn_hidden=1408)
    torch.manual_seed(0)
    pol = build_builtin("tiny-wide", seed=0)
    return Policy(model=AutoModelForCausalLM.from_config(hf_config_from_spec(spec, "fp32")).eval(),
                  tokenizer=pol.tokenizer, spec=spec, source="cpu-wide")


def play(engine, episodes: int, seed: int) -> tuple[int, float, list]:
    """(generated tokens, seconds, trajectories) of one rollout of the mixed workload."""
    params = SamplingParams(temperature=1.0, max_new_tokens=32, stop=STOP, stop_at_eos=False)
    seeds = [seed * 1000 + i for i in range(episodes)]
    t0 = time.perf_counter()
    trajs = rollout(engine, MixedEnv, seeds=seeds, group_ids=list(range(episodes)), params=params,
                    max_context=4096)
    return sum(t.generated_tokens for t in trajs), time.perf_counter() - t0, trajs


def continuous_vs_static(pol: Policy, episodes: int, repeats: int, decode_steps: int) -> None:
    cont = make_engine("pytorch", pol.model, pol.tokenizer, decode_steps=decode_steps)
    cont1 = make_engine("pytorch", pol.model, pol.tokenizer, decode_steps=1)
    static = make_engine("pytorch-static", pol.model, pol.tokenizer)
    for eng in (cont, cont1, static):
        play(eng, 4, 99)  # warm-up
    rates = {"cont": [], "cont1": [], "static": []}
    for _ in range(repeats):  # the same workload each time; alternate, so load on the host hits all
        for key, eng in (("cont", cont), ("cont1", cont1), ("static", static)):
            f0 = eng.stats.forwards
            n, s, trajs = play(eng, episodes, 0)
            rates[key].append((n / s, eng.stats.forwards - f0, trajs))
    (rc, fc, tc), (r1, _, t1), (rs, fs, ts) = (max(rates[k], key=lambda x: x[0]) for k in ("cont", "cont1", "static"))
    same = all(a.token_ids == b.token_ids == c.token_ids for a, b, c in zip(tc, t1, ts, strict=True))
    turns = [t.gen_tokens for tr in tc for t in tr.turns]
    print(f"{pol.source:>9} {episodes:8d} {sum(turns) / len(turns):8.1f} {max(turns):5d} {rc:11.0f} {r1:11.0f} "
          f"{rs:10.0f} {rc / rs:6.2f}x {rc / r1:6.2f}x {fs / fc:9.2f}x   {'yes' if same else 'NO'}")


def decode_blocks(pol: Policy, batch: int, new: int, repeats: int) -> None:
    """Decode tokens/s and host syncs per generated token: eager and compiled, 1 and 8 decode
    steps per host sync, measured alternately in one run (one compiled engine serves both K)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=new, stop_at_eos=False)
    prompts = {r: [3 + (r * 5 + i) % 50 for i in range(32)] for r in range(batch)}
    engines = {c: TorchEngine(pol.model, pol.tokenizer, max_batch=batch, compile=c) for c in (False, True)}
    settings = [(c, k) for c in (False, True) for k in (1, 8)]
    warm_s = {}
    for c, k in settings:  # warm-up (compiles)
        engines[c].decode_steps = k
        t0 = time.perf_counter()
        engines[c].open(batch, seeds=range(batch)).generate(prompts, params)
        warm_s[c] = max(warm_s.get(c, 0.0), time.perf_counter() - t0)
    best = {s: (0.0, 0.0) for s in settings}
    for _ in range(repeats):  # alternate, so load on the host hits every setting
        for c, k in settings:
            eng = engines[c]
            eng.decode_steps, eng.stats = k, EngineStats()
            eng.open(batch, seeds=range(batch)).generate(prompts, params)
            rate = eng.stats.decode_tokens / eng.stats.decode_s
            if rate > best[(c, k)][0]:
                best[(c, k)] = (rate, eng.stats.host_syncs / eng.stats.generated_tokens)
    (e1, s_e1), (e8, s_e8), (c1, s_c1), (c8, s_c8) = (best[s] for s in settings)
    print(f"{pol.source:>9} {batch:5d} {e1:9.0f} {e8:9.0f} {c1:9.0f} {c8:9.0f}   {e8 / e1:5.2f}x {c1 / e1:5.2f}x "
          f"{c8 / e1:5.2f}x   {s_e1:.3f} {s_e8:.3f} {s_c1:.3f} {s_c8:.3f}   (compile + first run {warm_s[True]:.0f} s)")


def kv_vs_reprefill(pol: Policy, episodes: int, repeats: int, decode_steps: int) -> None:
    kv = make_engine("pytorch", pol.model, pol.tokenizer, reuse_kv=True, decode_steps=decode_steps)
    re = make_engine("pytorch", pol.model, pol.tokenizer, reuse_kv=False, decode_steps=decode_steps)
    r1 = max(n / s for n, s, _ in (play(kv, episodes, 0) for _ in range(repeats)))
    r2 = max(n / s for n, s, _ in (play(re, episodes, 0) for _ in range(repeats)))
    print(f"{pol.source:>9} {r1:15.0f} {r2:17.0f} {r1 / r2:6.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,tiny-wide,cpu-wide")
    ap.add_argument("--compile-models", default="tiny,cpu-wide", help="models for the decode-steps table")
    ap.add_argument("--decode-batches", default="1,16", help="batch sizes for the decode-steps table")
    ap.add_argument("--decode-steps", type=int, default=8, help="decode steps per host sync of the continuous engine "
                    "in the rollout tables")
    ap.add_argument("--new", type=int, default=64, help="new tokens per row in the decode-steps table")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="best of N runs per cell (noisy hosts)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {m: load(m) for m in dict.fromkeys(args.models.split(",") + args.compile_models.split(",")) if m}
    print(f"{args.threads} threads, best of {args.repeats}, continuous engine at {args.decode_steps} decode steps "
          "per host sync in the rollout tables")
    print("\ncontinuous batching vs static engine, mixed-length multi-turn rollouts (temperature 1)")
    print(f"(cont: {args.decode_steps} decode steps per host sync; cont1: one; ratios: cont / static, cont / cont1, "
          "static forwards / cont forwards)")
    print(f"{'model':>9} {'episodes':>8} {'gen/turn':>8} {'max':>5} {'cont tok/s':>11} {'cont1 tok/s':>11} "
          f"{'static tok/s':>10} {'ratio':>7} {'K/1':>7} {'forwards':>10}   same tokens")
    for m in args.models.split(","):
        continuous_vs_static(models[m], args.episodes, args.repeats, args.decode_steps)
    print(f"\ndecode tokens/s, eager (e) and compiled (c), 1 and 8 decode steps per host sync (continuous engine, "
          f"temperature 1, 32-token prompts, {args.new} new tokens); ratios to e1; host syncs per generated token")
    print(f"{'model':>9} {'batch':>5} {'e1':>9} {'e8':>9} {'c1':>9} {'c8':>9}   {'e8/e1':>6} {'c1/e1':>5} {'c8/e1':>5}"
          f"   syncs/token e1 e8 c1 c8")
    for m in filter(None, args.compile_models.split(",")):
        for b in (int(x) for x in args.decode_batches.split(",")):
            decode_blocks(models[m], b, args.new, args.repeats)
    print("\ncross-turn KV cache vs re-prefilling every turn (continuous engine, mixed workload)")
    print(f"{'model':>9} {'kv-cache tok/s':>15} {'re-prefill tok/s':>17} {'ratio':>7}")
    for m in args.models.split(","):
        kv_vs_reprefill(models[m], args.episodes, args.repeats, args.decode_steps)


if __name__ == "__main__":
    main()
