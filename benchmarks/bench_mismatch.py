"""The rollout/trainer log-prob mismatch per engine and dtype, side by side in one run.

On the same prompts, each engine (built-in `pytorch` eager and compiled, `pytorch-static`, and
`vllm` when importable) generates one turn per prompt; the trainer then recomputes the log-probs
of exactly those tokens (earl.runtime.trainer.batch_logprobs, the experience stage's pass) and
earl.runtime.mismatch reports, per generated token with delta = trainer - engine, the mean and max
|delta| (nats) and the k3 estimate of KL(engine || trainer). The trainer runs in the model's dtype
(what `earl run` does: the experience stage uses the model as held) and in fp32 on the same
weights upcast (what is left is the engine's and the trainer's arithmetic, not the weights').

The model is a local HF checkpoint: `--model PATH`, or by default a tiny random Qwen2-style one
built in a temp dir (tests/runtime/chat_model.py: byte-level tokenizer, a padded vocabulary as in
real Qwen checkpoints, head dim 32 so vLLM can load it).

    OMP_NUM_THREADS=1 python benchmarks/bench_mismatch.py [--model PATH] [--prompts 8] [--tokens 24]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from earl.runtime.engine import SamplingParams, make_engine
from earl.runtime.hf_model import load_policy
from earl.runtime.mismatch import mismatch_metrics, mismatch_sums
from earl.runtime.rollout import Trajectory
from earl.runtime.trainer import batch_logprobs, collate

ENGINES = (("pytorch", False), ("pytorch", True), ("pytorch-static", False), ("vllm", False))
TOKEN_BUDGET = 16384


def prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
    return [tokenizer.encode("".join(rng.choice(alphabet) for _ in range(rng.randint(8, 40)))) for _ in range(n)]


def generate(name: str, compile_decode: bool, policy, model_path: str, ids: list[list[int]],
             params: SamplingParams) -> list[Trajectory]:
    """One turn per prompt (row i samples from stream i), as trajectories."""
    engine = make_engine(name, policy.model, policy.tokenizer, compile=compile_decode, model_path=model_path)
    batch = engine.open(len(ids), seeds=list(range(len(ids))))
    gens = batch.generate(dict(enumerate(ids)), params)
    trajs = []
    for i, prompt in enumerate(ids):
        t = Trajectory(episode_id=i, group_id=0)
        t._append(prompt, False)
        t._append(gens[i].token_ids, True, gens[i].logprobs)
        trajs.append(t)
    return trajs


def gap(model, trajs: list[Trajectory], policy, temperature: float) -> dict[str, float]:
    batch = collate(trajs, policy.tokenizer.pad_id)
    old = batch_logprobs(model, batch, temperature, TOKEN_BUDGET, policy.tokenizer.vocab_size)
    return mismatch_metrics(*mismatch_sums(old, batch.engine_logprobs, batch.loss_mask))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="local HF checkpoint dir (default: a tiny random one)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per prompt")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtypes", default="fp32,bf16")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = None
    path = args.model
    if not path:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
        from chat_model import build_chat_model

        tmp = tempfile.TemporaryDirectory()
        path = str(build_chat_model(Path(tmp.name) / "model", hidden_size=128))
    # fixed-length turns (no EOS, no stop string): every engine decodes the same widths
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.tokens, stop_at_eos=False)
    temp = params.logprob_temperature
    print(f"model {args.model or 'tiny random Qwen2 (hidden 128, vocab 192 > tokenizer)'}, {args.prompts} prompts x "
          f"{args.tokens} tokens, temperature {args.temperature}; delta = trainer - engine log-prob (nats), "
          "KL = k3 estimate of KL(engine || trainer)")
    head = (f"{'engine':<18} {'dtype':<5} | {'trainer same dtype: mean|d|':>27} {'max|d|':>9} {'KL':>9} | "
            f"{'trainer fp32: mean|d|':>21} {'max|d|':>9} {'KL':>9} | {'s':>5}")
    print(head)
    print("-" * len(head))
    for dtype in args.dtypes.split(","):
        policy = load_policy(path, dtype=dtype)
        policy.model.eval()
        fp32 = copy.deepcopy(policy.model).float()
        ids = prompts(policy.tokenizer, args.prompts)
        for name, compiled in ENGINES:
            label = name + (" compile" if compiled else "")
            if name == "vllm" and importlib.util.find_spec("vllm") is None:
                print(f"{label:<18} {dtype:<5} | skipped: vllm is not importable")
                continue
            t0 = time.perf_counter()
            try:
                trajs = generate(name, compiled, policy, path, ids, params)
            except Exception as e:  # noqa: BLE001 - a backend that cannot run here is a row, not a crash
                print(f"{label:<18} {dtype:<5} | failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:80]}")
                continue
            same, full = gap(policy.model, trajs, policy, temp), gap(fp32, trajs, policy, temp)
            print(f"{label:<18} {dtype:<5} | {same['logprob_diff_mean']:>27.2e} {same['logprob_diff_max']:>9.2e} "
                  f"{same['rollout_kl']:>9.2e} | {full['logprob_diff_mean']:>21.2e} {full['logprob_diff_max']:>9.2e} "
                  f"{full['rollout_kl']:>9.2e} | {time.perf_counter() - t0:>5.1f}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
