"""earl's RL step side by side with TRL's GRPOTrainer on the same CPU job, alternating runs.

The job (issue #25): a Qwen2-shaped ~41M-parameter model with random weights (hidden 512, 8
layers, 8 heads / 2 KV heads, MLP 1536, a 31,942-id byte-level BPE vocabulary, tied embeddings;
written to a temp dir with its tokenizer, whose ids cover every row of the head), 8 prompts x 4 completions x
32 new tokens, fp32, lr 1e-6, no KL, no entropy bonus, one optimizer step per batch, temperature
1, one CPU thread each. Both load the same checkpoint, prompt dataset and reward (distinct characters
of the completion over 32). Each framework runs `--steps` RL steps in its own process; the runs
alternate (earl, TRL, TRL, earl, ...) so a shared machine's load hits both alike. Per step:
seconds, the generation part (earl: the rollout stage, env included; TRL: its `_generate`), the
rest (the training side: log-probs, loss, backward, optimizer), generated tokens/s. The first
step of every run is a warm-up and left out; the figures are medians over the other steps.

    OMP_NUM_THREADS=1 python benchmarks/bench_trl.py [--steps 4] [--runs 2] [--out docs/cpu/bench_trl.txt] \
        [--baseline /path/to/another/earl/checkout]

Needs `trl` (TRL 1.16 was measured; .ci/constraints-trl.txt pins the venv).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAIR_SYMBOLS, HIDDEN, LAYERS, HEADS, KV_HEADS, MLP = 178, 512, 8, 8, 2, 1536  # vocab 256 + 178^2 + 2 = 31,942
PROMPTS, GROUP, NEW_TOKENS, LR = 8, 4, 32, 1e-6

REWARD_PY = '''
def score(sample, messages):
    """earl's reward: distinct characters of the completion, over 32."""
    return len(set(messages[-1]["content"])) / 32.0
'''


def build(directory: Path) -> tuple[Path, Path, Path]:
    """The model + tokenizer folder, the prompt dataset (JSONL) and the reward file. The tokenizer
    is byte-level BPE (as Qwen's; transformers loads a qwen2 folder's tokenizer as Qwen2's class)
    over the 256 byte symbols plus every pair of the first PAIR_SYMBOLS of them, so its ids cover
    the model's whole vocabulary and the softmax runs over all of it in both frameworks."""
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
    from chat_model import _bytes_to_unicode

    symbols = _bytes_to_unicode()
    vocab = {c: i for i, c in enumerate(symbols)}
    pairs = [(a, b) for a in symbols[:PAIR_SYMBOLS] for b in symbols[:PAIR_SYMBOLS]]
    vocab.update({a + b: len(symbols) + i for i, (a, b) in enumerate(pairs)})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    model_dir = directory / "model"
    tok.save_pretrained(str(model_dir))
    cfg = AutoConfig.for_model("qwen2", vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=MLP,
                               num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                               max_position_embeddings=512, tie_word_embeddings=True,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(str(model_dir), safe_serialization=True)
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    data = directory / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "".join(rng.choice(alphabet) for _ in range(32))}) + "\n"
                            for _ in range(64)))
    reward = directory / "reward.py"
    reward.write_text(REWARD_PY)
    return model_dir, data, reward


def run_earl(model_dir: str, data: str, reward: str, steps: int, out: str) -> None:
    import earl.runtime.step as step_mod
    from earl.runtime.resolve import resolve_config
    from earl.runtime.run import run_training

    gen_cpu: list[float] = []
    play = step_mod.play

    def timed_play(*a, **kw):  # the rollout stage's CPU seconds (the row has its wall time)
        c0 = time.process_time()
        res = play(*a, **kw)
        gen_cpu.append(time.process_time() - c0)
        return res
    step_mod.play = timed_play
    over = {"model.path": model_dir, "env.name": f"jsonl:{data}", "env.reward": f"{reward}:score",
            "groups": PROMPTS, "group_size": GROUP, "steps": steps, "trainer.algo": "grpo", "trainer.lr": LR,
            "trainer.entropy_coef": 0, "trainer.kl_coef": 0, "sampling.max_new_tokens": NEW_TOKENS,
            "checkpoints": "false", "plots": "false", "transcript_every": 0, "threads": 1}
    rows = run_training(resolve_config(overrides=over), Path(out).with_suffix(".run"), progress=False,
                 echo=lambda s: None).metrics
    per = [{"step_s": r["step_s"], "gen_s": r["rollout_s"], "tokens": r["gen_tokens_per_s"] * r["rollout_s"],
            "step_cpu_s": r["step_cpu_s"], "gen_cpu_s": c} for r, c in zip(rows, gen_cpu, strict=True)]
    Path(out).write_text(json.dumps(per))


def run_trl(model_dir: str, data: str, steps: int, out: str) -> None:
    import torch
    from datasets import load_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)

    def reward(completions, **kw):
        return [len(set(c)) / 32.0 for c in completions]

    args = GRPOConfig(output_dir=str(Path(out).with_suffix(".run")), per_device_train_batch_size=PROMPTS * GROUP,
                      num_generations=GROUP, max_completion_length=NEW_TOKENS, learning_rate=LR, beta=0.0,
                      temperature=1.0, max_steps=steps, logging_steps=1, save_strategy="no", report_to="none",
                      use_cpu=True, bf16=False, dataloader_num_workers=0, seed=0, loss_type="dapo")
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, processing_class=tok,
                          train_dataset=load_dataset("json", data_files=data, split="train"))
    per, gen = [], {"s": 0.0, "cpu_s": 0.0}
    inner = trainer._generate

    def timed_generate(*a, **kw):
        t0, c0 = time.perf_counter(), time.process_time()
        res = inner(*a, **kw)
        gen["s"] += time.perf_counter() - t0
        gen["cpu_s"] += time.process_time() - c0
        return res
    trainer._generate = timed_generate

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            gen["s"], gen["cpu_s"], self.t0, self.c0 = 0.0, 0.0, time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **kw):
            per.append({"step_s": time.perf_counter() - self.t0, "gen_s": gen["s"],
                        "tokens": PROMPTS * GROUP * NEW_TOKENS, "step_cpu_s": time.process_time() - self.c0,
                        "gen_cpu_s": gen["cpu_s"]})
    trainer.add_callback(Clock())
    trainer.train()
    Path(out).write_text(json.dumps(per))


def summary(runs: list[list[dict]]) -> dict:
    steps = [s for r in runs for s in r[1:]]  # the first step of a run is its warm-up
    med = {k: statistics.median(s[k] for s in steps) for k in ("step_s", "gen_s", "step_cpu_s", "gen_cpu_s")}
    med["train_s"] = statistics.median(s["step_s"] - s["gen_s"] for s in steps)
    med["train_cpu_s"] = statistics.median(s["step_cpu_s"] - s["gen_cpu_s"] for s in steps)
    med["gen_tokens_per_s"] = statistics.median(s["tokens"] / s["gen_s"] for s in steps)
    med["steps"] = len(steps)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run (the first is a warm-up)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each framework, alternating")
    ap.add_argument("--out", default="", help="also write the report here")
    ap.add_argument("--baseline", default="", help="also run earl from this checkout (e.g. before a change), "
                    "alternating with the others")
    ap.add_argument("--worker", choices=("earl", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--paths", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker == "earl":
        return run_earl(*a.paths[:3], a.steps, a.paths[3])
    if a.worker == "trl":
        return run_trl(a.paths[0], a.paths[1], a.steps, a.paths[3])
    import torch
    import transformers
    import trl

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    names = ("earl", "trl", "baseline") if a.baseline else ("earl", "trl")
    results: dict[str, list] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data, reward = build(Path(tmp))
        order = [fw for i in range(a.runs) for fw in (names if i % 2 == 0 else names[::-1])]
        for k, fw in enumerate(order):
            out = Path(tmp) / f"{fw}-{k}.json"
            t0 = time.perf_counter()
            run_env = {**env, "PYTHONPATH": a.baseline} if fw == "baseline" else env
            subprocess.run([sys.executable, __file__, "--worker", "trl" if fw == "trl" else "earl", "--steps",
                            str(a.steps), "--paths", str(model_dir), str(data), str(reward), str(out)], check=True,
                           env=run_env, stdout=subprocess.DEVNULL)
            results[fw].append(json.loads(out.read_text()))
            print(f"run {k + 1}/{len(order)} {fw}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    e, t = summary(results["earl"]), summary(results["trl"])
    lines = [f"bench_trl: {PROMPTS} prompts x {GROUP} completions x {NEW_TOKENS} tokens, Qwen2-shaped "
             f"{HIDDEN}h x {LAYERS}L, vocab {256 + PAIR_SYMBOLS ** 2 + 2} (41M parameters), fp32, lr {LR}, no KL, "
             "1 thread; "
             f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}",
             f"{a.runs} alternating runs of {a.steps} steps each; medians over {e['steps']} (earl) / {t['steps']} "
             "(TRL) steps after each run's warm-up step",
             f"{'':22}{'earl':>10}{'TRL':>10}{'earl/TRL':>10}"]
    for key, name in (("step_s", "s per RL step"), ("gen_s", "  generation s"), ("train_s", "  training side s"),
                      ("gen_tokens_per_s", "generated tokens/s"), ("step_cpu_s", "CPU s per RL step"),
                      ("gen_cpu_s", "  generation CPU s"), ("train_cpu_s", "  training side CPU s")):
        lines.append(f"{name:22}{e[key]:10.2f}{t[key]:10.2f}{e[key] / t[key]:10.2f}")
    if a.baseline:
        b = summary(results["baseline"])
        lines.append(f"earl from {a.baseline} (baseline), the same runs: CPU s per step {b['step_cpu_s']:.2f} "
                     f"({b['step_cpu_s'] / t['step_cpu_s']:.2f}x TRL), training side {b['train_cpu_s']:.2f} CPU s "
                     f"({b['train_cpu_s'] / t['train_cpu_s']:.2f}x TRL); wall {b['step_s']:.2f} s per step, training "
                     f"side {b['train_s']:.2f} s; this tree's training side / the baseline's: "
                     f"{e['train_cpu_s'] / b['train_cpu_s']:.2f} (CPU), {e['train_s'] / b['train_s']:.2f} (wall)")
    lines.append(f"earl's step: {e['gen_s'] / e['step_s']:.0%} generation, {e['train_s'] / e['step_s']:.0%} training "
                 "side (wall); CPU seconds are the robust figure on a shared host (every process runs one thread)")
    lines.insert(0, "$ OMP_NUM_THREADS=1 python benchmarks/bench_trl.py " + " ".join(sys.argv[1:]))
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
