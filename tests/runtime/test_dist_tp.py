"""Tensor parallelism parity: a tp=2 rollout (2 gloo ranks) generates the same greedy tokens and
log-probs (tolerance) as tp=1, across two turns with the KV cache kept between them.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_tp.py
"""

from __future__ import annotations

import pytest
import torch

from earl.parallel import build_plan_groups
from earl.runtime.dist import run_local
from earl.runtime.engine import SamplingParams, TorchEngine
from earl.runtime.hf_model import build_builtin
from earl.runtime.tp import apply_tp, check_tp
from earl.specs import ParallelPlan

PROMPTS = {0: "play x at 4", 1: "board: ...|.o.|..x"}
OBSERVATION = " opponent: 7 "


def _rollout(model, tokenizer):
    engine = TorchEngine(model, tokenizer)
    batch = engine.open(len(PROMPTS))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop_at_eos=False)
    first = batch.generate({r: tokenizer.encode(p) for r, p in PROMPTS.items()}, greedy)
    second = batch.generate({r: tokenizer.encode(OBSERVATION) for r in PROMPTS}, greedy)
    return [(g.token_ids, g.logprobs) for turn in (first, second) for _, g in sorted(turn.items())]


def _tp_worker(model_name: str, tp: int):
    import torch.distributed as dist

    groups = build_plan_groups(ParallelPlan(tp=tp, dp=dist.get_world_size() // tp))
    policy = build_builtin(model_name, seed=0)
    apply_tp(policy.model, tp, groups.tp_rank, groups.tp_group)
    local_q = policy.model.model.layers[0].self_attn.q_proj.weight.shape[0]
    with torch.no_grad():
        return _rollout(policy.model, policy.tokenizer), local_q


@pytest.mark.dist
@pytest.mark.parametrize("model_name", ["tiny", "tiny-llama"])  # Qwen2 (q/k/v bias) and Llama
def test_tp2_rollout_matches_tp1_greedy_tokens_and_logprobs(model_name):
    policy = build_builtin(model_name, seed=0)
    with torch.no_grad():
        ref = _rollout(policy.model, policy.tokenizer)
    results = run_local(_tp_worker, 2, model_name, 2, timeout_s=120)
    full_q = policy.model.model.layers[0].self_attn.q_proj.weight.shape[0]
    for rank, (got, local_q) in enumerate(results):
        assert local_q * 2 == full_q, "the q projection is not sharded"
        for (ref_ids, ref_lp), (ids, lp) in zip(ref, got, strict=True):
            assert ids == ref_ids, f"rank {rank}: greedy tokens differ"
            assert len(ids) > 1
            torch.testing.assert_close(torch.tensor(lp), torch.tensor(ref_lp), atol=1e-4, rtol=1e-4)


def test_tp_must_divide_heads():
    policy = build_builtin("tiny", seed=0)
    with pytest.raises(ValueError, match="tp=4 does not divide"):
        check_tp(policy.model.config, 4)
