"""Parity with TRL's GRPOTrainer: on one fixed batch (the same model weights, tokens, advantages,
old and reference log-probs), earl's loss (earl.runtime.trainer.Trainer.backward) and its
gradients equal those of TRL's own `GRPOTrainer._compute_loss` for each matching setting
(docs/losses.md maps them). Runs when `trl` is installed (CI: its own venv, .ci/constraints-trl.txt):

    OMP_NUM_THREADS=1 python -m pytest -m trl tests/runtime/test_trl_parity.py
"""

from __future__ import annotations

import copy

import pytest
import torch

from earl.runtime.hf_model import build_builtin
from earl.runtime.run_config import TrainerConfig
from earl.runtime.trainer import ExperienceBatch, Trainer, token_logprobs

pytestmark = pytest.mark.trl
trl = pytest.importorskip("trl")

PROMPT, COMPLETION, N, G = 6, 8, 8, 4  # prompt tokens, completion tokens (at most), sequences, group size
TEMPERATURE = 0.7
LENGTHS = [8, 5, 3, 8, 1, 6, 7, 2]  # each completion's real tokens


def _tokenizer(vocab_size: int):
    """An in-memory word-level HF tokenizer of the tiny model's ids (TRL's trainer wants one)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(WordLevel(vocab, unk_token="t1"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t2", unk_token="t1")


def _trl_trainer(model, tmp_path, **args):
    """TRL's trainer over a checkpoint of `model` in a temp dir (it loads the policy, and with a
    KL term the reference, from there)."""
    from datasets import Dataset

    path = tmp_path / "model"
    model.save_pretrained(str(path), safe_serialization=True)

    config = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=N, num_generations=G,
                            max_completion_length=COMPLETION, temperature=TEMPERATURE, report_to="none",
                            use_cpu=True, bf16=False, logging_steps=1, save_strategy="no", **args)
    trainer = trl.GRPOTrainer(model=str(path), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=config, train_dataset=Dataset.from_dict({"prompt": ["t3 t4"] * N}),
                              processing_class=_tokenizer(model.config.vocab_size))
    trainer.current_gradient_accumulation_steps = 1  # what its training loop sets; one window here
    trainer.model.train()
    return trainer


def _fixed_batch(model):
    """Tokens, advantages, and old / reference log-probs off the model's by noise of 0.3 nats
    (ratios around 1 +- 0.3: every clip branch is taken)."""
    g = torch.Generator().manual_seed(0)
    vocab_size = model.config.vocab_size
    prompt = torch.randint(3, vocab_size, (N, PROMPT), generator=g)
    completion = torch.randint(3, vocab_size, (N, COMPLETION), generator=g)
    cmask = torch.arange(COMPLETION)[None, :] < torch.tensor(LENGTHS)[:, None]
    adv = torch.randn(N, generator=g)
    zeros = torch.zeros(N, COMPLETION)
    lp = token_logprobs(model, *_earl_rows(prompt, completion, cmask)[:2], TEMPERATURE)[0][:, PROMPT:].detach()
    old = (lp + 0.3 * torch.randn(N, COMPLETION, generator=g)) * cmask + zeros
    ref = (lp + 0.3 * torch.randn(N, COMPLETION, generator=g)) * cmask + zeros
    return prompt, completion, cmask, adv, old, ref


def _earl_rows(prompt, completion, cmask):
    ids = torch.cat([prompt, completion * cmask], 1)
    attn = torch.cat([torch.ones(N, PROMPT, dtype=torch.bool), cmask], 1)
    loss_mask = torch.cat([torch.zeros(N, PROMPT, dtype=torch.bool), cmask], 1)
    return ids, attn, loss_mask


def _earl_batch(fixed) -> ExperienceBatch:
    """The same sequences right-padded as earl holds them: prompt then completion per row."""
    prompt, completion, cmask, adv, old, ref = fixed
    t = PROMPT + COMPLETION
    ids, attn, loss_mask = _earl_rows(prompt, completion, cmask)

    def place(x):
        return torch.cat([torch.zeros(N, PROMPT), x], 1) * loss_mask

    return ExperienceBatch(sample_ids=torch.arange(N), group_ids=torch.arange(N) // G, input_ids=ids,
                           attention_mask=attn, loss_mask=loss_mask, engine_logprobs=place(old),
                           rewards=torch.zeros(N), token_rewards=torch.zeros(N, t),
                           turn_ids=torch.full((N, t), -1), old_logprobs=place(old), ref_logprobs=place(ref),
                           advantages=adv[:, None] * loss_mask)


def _trl_loss(model, tmp_path, fixed, args):
    prompt, completion, cmask, adv, old, ref = fixed
    trainer = _trl_trainer(model, tmp_path, **args)
    inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion * cmask,
              "completion_mask": cmask.long(), "advantages": adv, "old_per_token_logps": old,
              "ref_per_token_logps": ref, "num_items_in_batch": cmask.sum()}
    model = trainer.model
    assert next(model.parameters()).dtype == torch.float32
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}


def _earl_loss(model, fixed, cfg):
    batch = _earl_batch(fixed)
    model.zero_grad(set_to_none=True)
    n = float(batch.loss_mask.sum())
    sums = Trainer(model, cfg, temperature=TEMPERATURE).backward(batch, n, float(N))
    return sums["loss"] / n, {name: p.grad.clone() for name, p in model.named_parameters()}


# (TRL GRPOConfig settings, the matching earl TrainerConfig settings)
CASES = {
    "bnpo": ({"loss_type": "bnpo"}, {"loss_agg": "token"}),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"loss_agg": "token", "clip_eps_high": 0.28}),
    "grpo": ({"loss_type": "grpo"}, {"loss_agg": "sequence"}),
    "dr_grpo": ({"loss_type": "dr_grpo"}, {"loss_agg": "constant", "loss_tokens": COMPLETION}),
    "grpo-kl": ({"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
                {"loss_agg": "sequence", "kl_coef": 0.04}),
    "grpo-kl-ratio": ({"loss_type": "grpo", "beta": 0.04}, {"loss_agg": "sequence", "kl_coef": 0.04,
                                                             "kl_ratio_weighted": True}),
    "gspo": ({"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
             {"loss_agg": "sequence", "ratio_level": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}),
    # TRL's delta caps the unclipped ratio at delta: for a negative advantage that is dual-clip c = delta
    "two-sided": ({"loss_type": "bnpo", "delta": 1.5}, {"loss_agg": "token", "dual_clip": 1.5}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_equal_trl(tmp_path, case):
    trl_args, earl_args = CASES[case]
    base = build_builtin("tiny", seed=0).model
    fixed = _fixed_batch(base)
    cfg = TrainerConfig(algo="grpo", entropy_coef=0.0, token_budget=10_000, **earl_args)
    want, want_g = _trl_loss(copy.deepcopy(base), tmp_path, fixed, trl_args)
    got, got_g = _earl_loss(copy.deepcopy(base), fixed, cfg)
    assert abs(want) > 1e-3  # a real loss, not a vanishing one
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    scale = max(float(g.abs().max()) for g in want_g.values())
    assert scale > 0
    for name, g in want_g.items():
        assert float((got_g[name] - g).abs().max()) <= 1e-5 * scale, name


def test_the_sampled_clip_range_acts_in_the_fixed_batch():
    """The fixed batch's ratios straddle the clip range, so the clipped branches are compared too."""
    base = build_builtin("tiny", seed=0).model
    batch = _earl_batch(_fixed_batch(base))
    cfg = TrainerConfig(algo="grpo", entropy_coef=0.0)
    sums = Trainer(copy.deepcopy(base), cfg, temperature=TEMPERATURE).backward(batch, float(batch.loss_mask.sum()))
    assert 0 < sums["clip_frac"] < float(batch.loss_mask.sum())
