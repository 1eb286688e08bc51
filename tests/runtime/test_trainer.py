"""Trainer: advantages (earl.runtime.advantages against the reference formulas), token-budget
micro-batching equivalence, and the update itself (the loss + the one-process optimizer)."""

import copy
import dataclasses

import pytest
import torch

from earl.parallel import build_plan_groups
from earl.policies.types import Layout, Sample
from earl.runtime.advantages import AdvantageSpec, distributed_advantages
from earl.runtime.optim import ReplicatedAdamW
from earl.runtime.rollout import Trajectory, Turn
from earl.runtime.run_config import TrainerConfig
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import (
    ExperienceBatch,
    Trainer,
    batch_logprobs,
    collate,
    micro_batches,
    train_step,
    turn_fields,
)
from earl.specs import ParallelPlan

ONE = ParallelPlan()  # tp1-dp1: one process, no process group


def advantages(batch: ExperienceBatch, spec: AdvantageSpec, token_rewards: torch.Tensor | None = None,
               turn_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[N, T] advantages of a batch computed by earl.runtime.advantages on one process."""
    tok_r = batch.token_rewards if token_rewards is None else token_rewards
    turns = batch.turn_ids if turn_ids is None else turn_ids
    samples, store = [], {}
    for r in range(batch.size):
        k = int(batch.attention_mask[r].sum())
        i = int(batch.sample_ids[r])
        samples.append(Sample(id=i, tokens=k, group=int(batch.group_ids[r])))
        store[i] = {"input_ids": batch.input_ids[r, :k], "loss_mask": batch.loss_mask[r, :k],
                    "rewards": batch.rewards[r].reshape(1), "token_rewards": tok_r[r, :k], "turn_ids": turns[r, :k]}
    distributed_advantages(store, samples, Layout(ONE, (tuple(s.id for s in samples),)), spec)
    out = torch.zeros(batch.input_ids.shape)
    for r, s in enumerate(samples):
        out[r, :s.tokens] = store[s.id]["advantages"]
    return out


def toy_batch(rewards, groups, loss_mask, token_rewards=None, turn_ids=None) -> ExperienceBatch:
    """A batch holding only what advantages read (ids are arbitrary, every position is real)."""
    n, t = loss_mask.shape
    return ExperienceBatch(
        sample_ids=torch.arange(n), group_ids=torch.as_tensor(groups), input_ids=torch.zeros(n, t, dtype=torch.long),
        attention_mask=torch.ones(n, t, dtype=torch.bool), loss_mask=loss_mask, engine_logprobs=torch.zeros(n, t),
        rewards=torch.as_tensor(rewards, dtype=torch.float32),
        token_rewards=torch.zeros(n, t) if token_rewards is None else token_rewards,
        turn_ids=torch.full((n, t), -1) if turn_ids is None else turn_ids)


def prepare(model, batch: ExperienceBatch, cfg: TrainerConfig, ref_model=None, temperature=1.0) -> ExperienceBatch:
    """The experience stage on one process (as earl.runtime.step runs it): old and reference
    log-probs, REINFORCE++'s KL penalty folded into the token rewards, then advantages."""
    old = batch_logprobs(model, batch, temperature, cfg.token_budget)
    ref = batch_logprobs(ref_model, batch, temperature, cfg.token_budget) if ref_model is not None else old
    tok_r = batch.token_rewards
    if ref_model is not None and cfg.kl_coef and cfg.algo == "reinforce++":
        tok_r = tok_r - cfg.kl_coef * (old - ref) * batch.loss_mask
    spec = AdvantageSpec(estimator=cfg.algo, per_turn=cfg.baseline == "per-turn")
    adv = advantages(batch, spec, token_rewards=tok_r)
    return dataclasses.replace(batch, old_logprobs=old, ref_logprobs=ref, advantages=adv)


def one_process_optim(model, cfg: TrainerConfig) -> ReplicatedAdamW:
    return ReplicatedAdamW(model, param_shapes(model), build_plan_groups(ONE), cfg)


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


def _turn_fields_by_turn(trajs):
    """The per-turn loop `turn_fields` replaces: the reference it must equal."""
    rows_r, rows_t = [], []
    for t in trajs:
        r, turn = torch.zeros(len(t.token_ids)), torch.full((len(t.token_ids),), -1, dtype=torch.long)
        start = 0
        for k, (pos, x) in enumerate(t.step_rewards):
            r[pos] += x
            turn[start:pos + 1] = k
            start = pos + 1
        turn[~torch.tensor(t.loss_mask, dtype=torch.bool)] = -1
        rows_r.append(r)
        rows_t.append(turn)
    return torch.cat(rows_r), torch.cat(rows_t)


@pytest.mark.parametrize("seed", range(4))
def test_turn_fields_equal_the_per_turn_loop(seed):
    g = torch.Generator().manual_seed(seed)
    trajs = fake_trajs(7, seed)
    # shapes the fixed fixture lacks: no turns at all, a turn with two rewards on one token,
    # a turn that ends on the last token, tokens after the last turn
    trajs[0].step_rewards = []
    trajs[1].step_rewards.insert(1, (trajs[1].step_rewards[0][0], 0.5))
    trajs[2].step_rewards[-1] = (len(trajs[2].token_ids) - 1, 2.0)
    trajs[3]._append(torch.randint(3, 64, (4,), generator=g).tolist(), False)
    mask = torch.tensor([x for t in trajs for x in t.loss_mask], dtype=torch.bool)
    got, want = turn_fields(trajs, mask), _turn_fields_by_turn(trajs)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0])
    # every generated token of an episode with turns has one
    assert int((got[1] >= 0).sum()) == int(mask.sum()) - sum(trajs[0].loss_mask)
    batch = collate(trajs, 0)
    assert torch.equal(batch.turn_ids[3, :len(trajs[3].token_ids)], want[1].split([len(t.token_ids) for t in trajs])[3])


def test_turn_fields_refuse_positions_that_go_back():
    t = fake_trajs(2)
    t[1].step_rewards.reverse()
    with pytest.raises(ValueError, match="episode 1: step_rewards positions must not decrease"):
        turn_fields(t, torch.ones(sum(len(x.token_ids) for x in t), dtype=torch.bool))


def test_grpo_advantages_are_group_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0, 0.5, -1.5])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 1, 1]] * 2 + [[0, 1, 1, 1], [0, 0, 0, 1]],
                        dtype=torch.bool)
    adv = advantages(toy_batch(r, groups, mask), AdvantageSpec(estimator="grpo"))
    # reference: (r - group mean) / (group std + eps), population std, on every generated token
    want = torch.zeros(8)
    for g in groups.unique():
        sel = groups == g
        want[sel] = (r[sel] - r[sel].mean()) / (r[sel].std(unbiased=False) + 1e-6)
    assert torch.allclose(adv, want[:, None] * mask, atol=1e-5)
    per_sample = adv.sum(1) / mask.sum(1)
    assert per_sample[:3].mean().abs() < 1e-6 and per_sample[0] > 0 > per_sample[1]
    assert torch.all(adv[3:6] == 0)  # identical rewards: no signal
    assert torch.all(adv[~mask] == 0)


def _return_to_go_reference(tok_r, mask, turn_ids=None, eps=1e-6):
    """REINFORCE++ reference: undiscounted return-to-go on generated tokens, minus the batch
    mean (or the mean of the same turn index), divided by the std of the centred returns over
    all generated tokens of the batch."""
    returns = tok_r.flip(1).cumsum(1).flip(1)
    centred = torch.zeros_like(returns)
    if turn_ids is None:
        centred[mask] = returns[mask] - returns[mask].mean()
    else:
        for k in turn_ids[mask].unique():
            sel = (turn_ids == k) & mask
            centred[sel] = returns[sel] - returns[sel].mean()
    std = centred[mask].pow(2).mean().sqrt()
    return centred / (std + eps) * mask


def test_reinforce_pp_return_to_go_and_whitening():
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]], dtype=torch.bool)
    tok_r = torch.zeros(2, 5)
    tok_r[0, 2], tok_r[0, 4], tok_r[1, 1] = 0.5, 1.0, -1.0
    adv = advantages(toy_batch([1.5, -1.0], [0, 1], mask, tok_r), AdvantageSpec(estimator="reinforce++"))
    # returns-to-go: row 0: 1.5, 1.5, 1.0 on its generated tokens; row 1: -1
    ret = torch.tensor([1.5, 1.5, 1.0, -1.0])
    expect = (ret - ret.mean()) / ret.std(unbiased=False)
    assert torch.allclose(adv[mask], expect, atol=1e-5)
    assert torch.all(adv[~mask] == 0)
    assert torch.allclose(adv, _return_to_go_reference(tok_r, mask), atol=1e-5)


def test_reinforce_pp_matches_the_reference_on_random_batches():
    gen = torch.Generator().manual_seed(3)
    n, t = 7, 20
    mask = torch.rand(n, t, generator=gen) > 0.4
    mask[:, 0] = False  # position 0 is a prompt token
    turns = torch.where(mask, torch.randint(0, 3, (n, t), generator=gen).sort(1).values, -1)
    tok_r = torch.randn(n, t, generator=gen) * (torch.rand(n, t, generator=gen) > 0.6)
    batch = toy_batch(tok_r.sum(1), torch.arange(n) // 2, mask, tok_r, turns)
    for per_turn in (False, True):
        adv = advantages(batch, AdvantageSpec(estimator="reinforce++", per_turn=per_turn))
        want = _return_to_go_reference(tok_r, mask, turns if per_turn else None)
        assert torch.allclose(adv, want, atol=1e-5), per_turn
    assert advantages(batch, AdvantageSpec(estimator="reinforce++")).abs().sum() > 0


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
        tr = Trainer(model, cfg, temperature=1.0)
        batch = prepare(model, collate(trajs, 0), cfg, ref_model=ref)
        stats = train_step(tr, one_process_optim(model, cfg), batch)
        # compare gradients: Adam's first step (g / |g|) magnifies float noise in near-zero grads
        results.append((stats, [p.grad.clone() for p in model.parameters()]))
    (s1, p1), (s2, p2) = results
    assert s1["train_tokens"] == s2["train_tokens"] == sum(t.generated_tokens for t in trajs)
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-4)
    for a, b in zip(p1, p2, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_update_raises_logprob_of_rewarded_tokens(tiny):
    model = copy.deepcopy(tiny.model)
    trajs = fake_trajs()
    cfg = TrainerConfig(algo="grpo", lr=1e-2)
    tr, optim = Trainer(model, cfg, temperature=1.0), one_process_optim(model, cfg)
    batch = prepare(model, collate(trajs, 0), cfg)
    before = batch.old_logprobs.clone()
    for _ in range(3):
        train_step(tr, optim, batch)
    after = prepare(model, collate(trajs, 0), cfg).old_logprobs
    pos = (batch.advantages > 0) & batch.loss_mask
    neg = (batch.advantages < 0) & batch.loss_mask
    assert (after - before)[pos].mean() > 0 > (after - before)[neg].mean()
    # the experience stage's log-probs equal the engine's convention (column 0 unused)
    assert torch.all(batch.old_logprobs[:, 0] == 0)


def test_grpo_kl_term_pulls_towards_the_reference(tiny):
    """GRPO's k3 KL term: zero against an identical reference, positive against another one,
    and part of the loss with weight kl_coef."""
    trajs = fake_trajs()
    cfg = TrainerConfig(algo="grpo", lr=1e-3, kl_coef=0.5, entropy_coef=0.01)
    model = copy.deepcopy(tiny.model)
    tr = Trainer(model, cfg, temperature=1.0)
    same = prepare(model, collate(trajs, 0), cfg, ref_model=copy.deepcopy(tiny.model))
    n = float(same.loss_mask.sum())
    sums = tr.backward(same, n)
    assert sums["kl"] == pytest.approx(0.0, abs=1e-4 * n)
    other_ref = copy.deepcopy(tiny.model)
    with torch.no_grad():
        for p in other_ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    model.zero_grad()
    far = prepare(model, collate(trajs, 0), cfg, ref_model=other_ref)
    sums = tr.backward(far, n)
    assert sums["kl"] > 1e-3 * n
    want = sums["pg_loss"] - cfg.entropy_coef * sums["entropy"] + cfg.kl_coef * sums["kl"]
    assert sums["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_reinforce_pp_per_turn_baseline_has_no_position_bias():
    # identical episodes, a penalty every turn: nothing to learn, so no advantage anywhere
    mask = torch.tensor([[0, 1, 0, 1, 0, 1]] * 4, dtype=torch.bool)
    turns = torch.tensor([[-1, 0, -1, 1, -1, 2]] * 4)
    tok_r = torch.zeros(4, 6)
    tok_r[:, 1], tok_r[:, 3], tok_r[:, 5] = -0.3, -0.3, -1.0
    batch = toy_batch([-1.6] * 4, [0, 0, 1, 1], mask, tok_r, turns)
    adv = advantages(batch, AdvantageSpec(estimator="reinforce++", per_turn=True))
    assert torch.all(adv == 0)
    biased = advantages(batch, AdvantageSpec(estimator="reinforce++"))
    assert biased[0, 5] > 0 > biased[0, 1]  # the single batch mean favours the last turn


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_logprobs_equal_full_vocabulary_logits(tiny, chunk):
    """Log-probs and entropy from hidden states + lm_head on the selected positions, a chunk at a
    time, equal the full-logits reference at those positions (values and gradients); others are 0."""
    from earl.runtime.trainer import full_token_logprobs, token_logprobs

    batch = collate(fake_trajs(), 0)
    ids, attn, need = batch.input_ids, batch.attention_mask, batch.loss_mask
    m1, m2 = copy.deepcopy(tiny.model), copy.deepcopy(tiny.model)
    lp, ent = token_logprobs(m1, ids, attn, 0.7, with_entropy=True, need=need, chunk_tokens=chunk)
    ref_lp, ref_ent = full_token_logprobs(m2, ids, attn, 0.7, with_entropy=True)
    keep = need.clone()
    keep[:, 0] = False
    assert torch.allclose(lp[keep], ref_lp[keep], atol=1e-5)
    assert torch.allclose(ent[keep], ref_ent[keep], atol=1e-5)
    assert torch.all(lp[~keep] == 0) and torch.all(ent[~keep] == 0)
    w = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    ((lp - 0.1 * ent) * w * keep).sum().backward()
    ((ref_lp - 0.1 * ref_ent) * w * keep).sum().backward()
    for (n, a), b in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), n
    with torch.no_grad():  # forward-only: every real token by default
        lp_all, _ = token_logprobs(m1, ids, attn, 1.0, chunk_tokens=chunk)
        ref_all, _ = full_token_logprobs(m1, ids, attn, 1.0)
    real = attn.clone()
    real[:, 0] = False
    assert torch.allclose(lp_all[real], ref_all[real], atol=1e-5)


def test_bf16_model_keeps_fp32_master_weights_an_update_at_lr_1e_6_does_not_round_away(tiny):
    """A bf16 model trains through fp32 master weights and fp32 AdamW state: at lr 1e-6 the
    fraction of (master) weights an optimizer step changes matches fp32's, norms included, and
    the moments and masters are exported as fp32 "<param>/<state>" tensors."""
    from earl.runtime.optim import MASTER

    trajs = fake_trajs()
    cfg = TrainerConfig(algo="grpo", lr=1e-6)
    changed = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = copy.deepcopy(tiny.model).to(dtype)
        tr, optim = Trainer(model, cfg, temperature=1.0), one_process_optim(model, cfg)
        batch = prepare(model, collate(trajs, 0), cfg)
        before = {n: t.clone() for n, t in optim.state_tensors().items() if n.endswith(MASTER)} \
            if dtype != torch.float32 else {f"{n}/{MASTER}": p.detach().clone() for n, p in model.named_parameters()}
        train_step(tr, optim, batch)
        after = {n: t for n, t in optim.state_tensors().items() if n.endswith(MASTER)} \
            if dtype != torch.float32 else {f"{n}/{MASTER}": p.detach() for n, p in model.named_parameters()}
        moved = sum(int((after[k] != before[k]).sum()) for k in before)
        changed[dtype] = moved / sum(t.numel() for t in before.values())
        norms = [k for k in before if "norm" in k]
        assert all(bool((after[k] != before[k]).any()) for k in norms), dtype
        assert all(t.dtype == torch.float32 for t in optim.state_tensors().values())
    assert changed[torch.float32] > 0.9
    assert changed[torch.bfloat16] > 0.95 * changed[torch.float32], changed


def grouped_trajs(groups=3, size=4, seed=0):
    """GRPO groups: each group's members open on one prompt (of its own length), then two
    turns of their own (completion, observation, completion) of unequal lengths."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        prompt = torch.randint(3, 64, (6 + 3 * k,), generator=g).tolist()
        for j in range(size):
            gen1 = torch.randint(3, 64, (2 + j,), generator=g).tolist()
            obs = torch.randint(3, 64, (3,), generator=g).tolist()
            gen2 = torch.randint(3, 64, (1 + (j + k) % 3,), generator=g).tolist()
            t = Trajectory(episode_id=k * size + j, group_id=k)
            t._append(prompt, False)
            t._append(gen1, True, [-1.0] * len(gen1))
            t._append(obs, False)
            t._append(gen2, True, [-1.0] * len(gen2))
            t.step_rewards.append((len(t.token_ids) - 1, float(j % 2)))
            t.reward = float(j % 2)
            out.append(t)
    return out


def test_shared_prompt_prefix_equals_the_unshared_forward(tiny, monkeypatch):
    """Group members' common prompt runs once (its KV gathered for each member): log-probs and
    gradients equal the plain forward of every row; a batch of distinct prompts runs plain."""
    import earl.runtime.trainer as trainer_mod

    batch = collate(grouped_trajs(), 0)
    ids, attn, need = batch.input_ids, batch.attention_mask, batch.loss_mask
    sel = need[:, 1:] & attn[:, 1:]
    first, leaders, of_row = trainer_mod._shared_prefixes(ids, attn, sel)
    assert leaders == [0, 4, 8] and of_row == [0] * 4 + [1] * 4 + [2] * 4
    assert first.tolist() == [5] * 4 + [8] * 4 + [11] * 4  # the prompt but its last token
    distinct = collate(fake_trajs(), 0)
    assert trainer_mod._shared_prefixes(distinct.input_ids, distinct.attention_mask,
                                        distinct.loss_mask[:, 1:] & distinct.attention_mask[:, 1:]) is None
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    got = {}
    for share in (True, False):
        monkeypatch.setattr(trainer_mod, "SHARE_MIN_FRAC", 0.1 if share else 2.0)
        m = copy.deepcopy(tiny.model)
        lp, _ = trainer_mod.token_logprobs(m, ids, attn, 0.8, need=need)
        (lp * w).sum().backward()
        with torch.no_grad():
            lp_ng, _ = trainer_mod.token_logprobs(m, ids, attn, 0.8, need=need)
        got[share] = (lp.detach(), lp_ng, {n: p.grad for n, p in m.named_parameters()})
    (a, a_ng, ga), (b, b_ng, gb) = got[True], got[False]
    assert bool((a[need] != 0).all()) and torch.all(a[~need] == 0)
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(a_ng, b_ng, atol=1e-5)
    for n in ga:
        assert torch.allclose(ga[n], gb[n], atol=1e-5, rtol=1e-4), n


def test_fp32_optimizer_steps_the_model_itself_as_torch_adamw(tiny):
    """An fp32 model of plain tensors is its own optimizer state's parameters (no weight or
    gradient copies) and one step equals torch's AdamW after global-norm clipping."""
    cfg = TrainerConfig(algo="grpo", lr=1e-3, grad_clip=0.1, weight_decay=0.01)
    model, ref = copy.deepcopy(tiny.model), copy.deepcopy(tiny.model)
    optim = one_process_optim(model, cfg)
    assert all(optim.owned[n] is p for n, p in model.named_parameters())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
            (m(input_ids=ids).logits.float() ** 2).mean().backward()
        want = float(torch.nn.utils.clip_grad_norm_(list(ref.parameters()), cfg.grad_clip))
        assert want > cfg.grad_clip  # the clip is exercised
        assert optim.step() == pytest.approx(want, rel=1e-5)
        ref_opt.step()
    for (n, a), b in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), n


@pytest.mark.parametrize("algo,baseline,gamma,kl", [("reinforce++", "per-turn", 1.0, 0.0),
                                                    ("reinforce++", "batch", 1.0, 0.0),
                                                    ("reinforce++", "per-turn", 0.9, 0.0),
                                                    ("reinforce++", "per-turn", 1.0, 0.1),
                                                    ("grpo", "per-turn", 1.0, 0.0)])
def test_rollout_key_sums_are_the_statistics_the_experience_store_gives(algo, baseline, gamma, kl):
    """The key sums each rollout rank puts in the metadata (`rollout_key_sums`, from its
    trajectories) add up to the statistics the dispatch would reduce from the experience store
    (`local_stats` of `rollout_store`), and give the same advantages, also for an episode with no
    rewarded turn, two rewards on one token and generated tokens after its last reward. None
    where the KL penalty is not yet in the rewards, nor for a group estimator."""
    from types import SimpleNamespace

    from earl.runtime.advantages import local_stats, summed_stats
    from earl.runtime.step import rollout_key_sums, rollout_store

    trajs = fake_trajs(7, 3)
    trajs[0].step_rewards = []
    trajs[1].step_rewards.insert(1, (trajs[1].step_rewards[0][0], 0.5))
    trajs[3]._append([5, 6, 7], True, [-1.0] * 3)
    cfg = SimpleNamespace(trainer=SimpleNamespace(algo=algo, baseline=baseline, gamma=gamma, kl_coef=kl))
    spec = AdvantageSpec.of(cfg.trainer)
    sums = rollout_key_sums(cfg, trajs)
    if kl or spec.grouped:
        assert sums == {}
        return
    samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs]
    want = {k: v for k, v in local_stats(rollout_store(trajs), samples, spec).items() if k >= 0 or not spec.per_turn}
    got = summed_stats(sums, samples)
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-12, atol=1e-12)
    src = Layout(ONE, (tuple(s.id for s in samples),))
    reduced, known = rollout_store(trajs), rollout_store(trajs)
    assert distributed_advantages(reduced, samples, src, spec) == 0  # one process: nothing between ranks
    assert distributed_advantages(known, samples, src, spec, stats=got) == 0
    for i in reduced:
        torch.testing.assert_close(known[i]["advantages"], reduced[i]["advantages"], rtol=1e-6, atol=1e-7)
    assert any(bool(known[i]["advantages"].abs().sum()) for i in known)
