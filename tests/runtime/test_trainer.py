"""Trainer: advantages, token-budget micro-batching equivalence, and the update itself."""

import copy

import pytest
import torch

from earl.runtime.config import TrainerConfig
from earl.runtime.rollout import Trajectory, Turn
from earl.runtime.trainer import Trainer, collate, grpo_advantages, micro_batches, reinforce_pp_advantages


def fake_trajs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, 64, (5 + i,), generator=g).tolist()
        gen1 = torch.randint(3, 64, (2,), generator=g).tolist()
        obs = torch.randint(3, 64, (3,), generator=g).tolist()
        gen2 = torch.randint(3, 64, (1 + i % 3,), generator=g).tolist()
        t = Trajectory(episode_id=i, group_id=i // 3)
        t._append(prompt, False)
        t._append(gen1, True, [-1.0] * 2)
        t.step_rewards.append((len(t.token_ids) - 1, 0.1))
        t._append(obs, False)
        t._append(gen2, True, [-1.0] * len(gen2))
        r = float(i % 2)
        t.step_rewards.append((len(t.token_ids) - 1, r))
        t.reward = 0.1 + r
        t.turns = [Turn(len(prompt), 2, 0.0), Turn(3, len(gen2), 0.0)]
        out.append(t)
    return out


def test_grpo_advantages_are_group_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    adv = grpo_advantages(r, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert adv[:3].mean().abs() < 1e-6 and adv[0] > 0 > adv[1]
    assert torch.all(adv[3:] == 0)  # identical rewards: no signal


def test_reinforce_pp_return_to_go_and_whitening():
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]], dtype=torch.bool)
    tok_r = torch.zeros(2, 5)
    tok_r[0, 2], tok_r[0, 4], tok_r[1, 1] = 0.5, 1.0, -1.0
    adv = reinforce_pp_advantages(tok_r, mask, torch.zeros(2, 5), None, 0.0)
    # returns-to-go: row 0: 1.5, 1.5, 1.0 on its generated tokens; row 1: -1
    ret = torch.tensor([1.5, 1.5, 1.0, -1.0])
    expect = (ret - ret.mean()) / ret.std(unbiased=False)
    assert torch.allclose(adv[mask], expect, atol=1e-5)
    assert torch.all(adv[~mask] == 0)


def test_micro_batches_respect_budget():
    lengths = [10, 3, 7, 10, 2, 9]
    mbs = micro_batches(lengths, 20)
    assert sorted(i for mb in mbs for i in mb) == list(range(6))
    for mb in mbs:
        assert len(mb) * max(lengths[i] for i in mb) <= 20 or len(mb) == 1
    assert micro_batches([50], 10) == [[0]]


@pytest.mark.parametrize("algo", ["grpo", "reinforce++"])
def test_token_budget_does_not_change_the_update(tiny, algo):
    trajs = fake_trajs()
    results = []
    for budget in (10_000, 24):  # one micro-batch vs many
        model = copy.deepcopy(tiny.model)
        cfg = TrainerConfig(algo=algo, lr=1e-3, token_budget=budget, kl_coef=0.1)
        ref = copy.deepcopy(tiny.model)
        tr = Trainer(model, cfg, temperature=1.0, ref_model=ref)
        batch = tr.prepare(collate(trajs, 0))
        stats = tr.step(batch)
        # compare gradients: Adam's first step (g / |g|) magnifies float noise in near-zero grads
        results.append((stats, [p.grad.clone() for p in model.parameters()]))
    (s1, p1), (s2, p2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-4)
    for a, b in zip(p1, p2, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_update_raises_logprob_of_rewarded_tokens(tiny):
    model = copy.deepcopy(tiny.model)
    trajs = fake_trajs()
    tr = Trainer(model, TrainerConfig(algo="grpo", lr=1e-2), temperature=1.0)
    batch = tr.prepare(collate(trajs, 0))
    before = batch.old_logprobs.clone()
    for _ in range(3):
        tr.step(batch)
    after = tr.prepare(collate(trajs, 0)).old_logprobs
    pos = (batch.advantages > 0) & batch.loss_mask
    neg = (batch.advantages < 0) & batch.loss_mask
    assert (after - before)[pos].mean() > 0 > (after - before)[neg].mean()
    # the experience stage's log-probs equal the engine's convention (column 0 unused)
    assert torch.all(batch.old_logprobs[:, 0] == 0)


def test_kl_needs_reference(tiny):
    with pytest.raises(ValueError, match="reference"):
        Trainer(tiny.model, TrainerConfig(kl_coef=0.1), temperature=1.0)


def test_reinforce_pp_per_turn_baseline_has_no_position_bias():
    # identical episodes, a penalty every turn: nothing to learn, so no advantage anywhere
    mask = torch.tensor([[0, 1, 0, 1, 0, 1]] * 4, dtype=torch.bool)
    turns = torch.tensor([[-1, 0, -1, 1, -1, 2]] * 4)
    tok_r = torch.zeros(4, 6)
    tok_r[:, 1], tok_r[:, 3], tok_r[:, 5] = -0.3, -0.3, -1.0
    adv = reinforce_pp_advantages(tok_r, mask, torch.zeros(4, 6), None, 0.0, turn_ids=turns)
    assert torch.all(adv == 0)
    biased = reinforce_pp_advantages(tok_r, mask, torch.zeros(4, 6), None, 0.0)
    assert biased[0, 5] > 0 > biased[0, 1]  # the single batch mean favours the last turn
