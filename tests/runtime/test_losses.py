"""The loss variants (earl.runtime.losses) against hand-computed values, RLOO advantages, their
config checks, the trainer composed from them (micro-batch invariance, defaults unchanged, a
batch that is its own old policy), the chunked LM head's hand-written backward against autograd,
and dynamic sampling in a real `earl run` step."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from test_trainer import advantages, fake_trajs, prepare, toy_batch

from earl.runtime.advantages import AdvantageSpec
from earl.runtime.losses import clipped_pg, kl_estimate, loss_denominator, policy_ratio, token_weights, uniform_groups
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training
from earl.runtime.run_config import RunConfig, TrainerConfig
from earl.runtime.trainer import Trainer, collate, full_token_logprobs, token_logprobs


def test_clipped_pg_clip_higher_and_dual_clip_by_hand():
    ratio = torch.tensor([0.5, 1.0, 1.5, 3.0, 0.7])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -2.0])
    pg, clipped = clipped_pg(ratio, adv, 0.2, 0.28)
    # -min(r A, clip(r) A): 0.5 vs 0.8 -> 0.5; 1 -> -1; 1.5 vs 1.28 -> 1.28; -3 vs -1.28 -> -3; -1.4 vs -1.6
    assert pg.tolist() == pytest.approx([-0.5, 1.0, -1.28, 3.0, 1.6])
    assert clipped.tolist() == [True, False, True, True, True]  # 0.7 < 0.8 lies outside too
    pg2, _ = clipped_pg(ratio, adv, 0.2, 0.28, dual_clip=2.0)
    assert pg2.tolist() == pytest.approx([-0.5, 1.0, -1.28, 2.0, 1.6])  # only r=3, A<0 is capped at -2A


def test_symmetric_clip_is_the_old_formula_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    ratio, adv = torch.rand(50, generator=g) * 2, torch.randn(50, generator=g)
    pg, clipped = clipped_pg(ratio, adv, 0.2, 0.2)
    assert torch.equal(pg, -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv))
    assert torch.equal(clipped, (ratio - 1).abs() > 0.2)


def test_sequence_ratio_is_gspo_and_its_gradient_the_mean():
    lp = torch.tensor([[0.1, 0.3, 5.0], [0.2, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    r = policy_ratio(lp, old, mask, "sequence")
    assert r[0].tolist() == pytest.approx([math.exp(0.2)] * 3)
    assert r[1].tolist() == pytest.approx([math.exp(0.2)] * 3)
    r[0, 0].backward()
    assert lp.grad[0].tolist() == pytest.approx([math.exp(0.2) / 2, math.exp(0.2) / 2, 0.0])
    assert torch.equal(policy_ratio(lp, old, mask, "token"), torch.exp(lp - old))
    with pytest.raises(ValueError, match="ratio level 'seq' unknown; valid: token, sequence"):
        policy_ratio(lp, old, mask, "seq")


def test_kl_estimators_by_hand():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])  # d = ref - lp = -0.5, 1.0
    assert kl_estimate(lp, ref, "k1").tolist() == pytest.approx([0.5, -1.0])
    assert kl_estimate(lp, ref, "k2").tolist() == pytest.approx([0.125, 0.5])
    assert kl_estimate(lp, ref, "k3").tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, math.e - 2])


def test_aggregations_by_hand():
    loss = torch.tensor([[1.0, 3.0, 9.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])

    def agg(name, constant=0):
        return float((loss * token_weights(mask, name)).sum() / loss_denominator(name, 3.0, 2.0, constant))
    assert agg("token") == pytest.approx(8 / 3)  # (1 + 3 + 4) / 3 tokens
    assert agg("sequence") == pytest.approx((2 + 4) / 2)  # mean of the sequence means
    assert agg("constant", 4) == pytest.approx(8 / (2 * 4))  # Dr. GRPO: sum / (sequences x 4)
    with pytest.raises(ValueError, match="loss aggregation 'mean' unknown; valid: token, sequence, constant"):
        token_weights(mask, "mean")


def test_uniform_groups():
    assert uniform_groups([0, 0, 1, 1, 2, 2], [1.0, 1.0, 0.0, 1.0, 0.5, 0.5]) == {0, 2}
    assert uniform_groups([], []) == set()


def test_rloo_is_reward_minus_the_mean_of_the_others():
    rewards, groups = [1.0, 0.0, 0.5, 2.0, 3.0, 7.0], [0, 0, 0, 1, 1, 1]
    mask = torch.ones(6, 2, dtype=torch.bool)
    mask[:, 0] = False
    adv = advantages(toy_batch(rewards, groups, mask), AdvantageSpec(estimator="rloo"))
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        others = [x for j, (x, h) in enumerate(zip(rewards, groups, strict=True)) if h == g and j != i]
        assert float(adv[i, 1]) == pytest.approx(r - sum(others) / len(others), rel=1e-6)
        assert float(adv[i, 0]) == 0.0


@pytest.mark.parametrize(("over", "msg"), [
    ({"loss_agg": "mean"}, r"trainer.loss_agg 'mean' unknown; valid: token, sequence, constant"),
    ({"ratio_level": "seq"}, r"trainer.ratio_level 'seq' unknown; valid: token, sequence"),
    ({"kl_estimator": "k4"}, r"trainer.kl_estimator 'k4' unknown; valid: k1, k2, k3"),
    ({"clip_eps_high": -0.1}, r"trainer.clip_eps_high must be a finite number >= 0, got -0.1"),
    ({"clip_eps_low": 1.0}, r"trainer.clip_eps_low must be < 1"),
    ({"dual_clip": 0.5}, r"trainer.dual_clip must be 0 \(off\) or a finite c > 1, got 0.5"),
    ({"loss_agg": "constant"}, r"loss_tokens must be >= 1, got 0"),
])
def test_bad_loss_settings_are_one_line_errors(over, msg):
    with pytest.raises(ValueError, match=msg):
        TrainerConfig(**over)


def test_group_settings_need_groups():
    with pytest.raises(ValueError, match="rloo compares episodes within a group: group_size must be >= 2, got 1"):
        RunConfig(trainer=TrainerConfig(algo="rloo"))
    with pytest.raises(ValueError, match="filter_uniform_groups .* group_size must be >= 2"):
        RunConfig(trainer=TrainerConfig(filter_uniform_groups=True))
    assert TrainerConfig(clip_eps=0.3).clip_low == 0.3 and TrainerConfig(clip_eps_high=0.28).clip_high == 0.28


def _grads(model, cfg, batch, **kw):
    model.zero_grad(set_to_none=True)
    sums = Trainer(model, cfg, temperature=1.0).backward(batch, float(batch.loss_mask.sum()), **kw)
    return sums, [p.grad.clone() for p in model.parameters()]


def _off_policy(model, cfg):
    """A batch whose old log-probs are off the model (ratios around 1 +- 0.4), so clipping acts."""
    batch = prepare(model, collate(fake_trajs(), 0), cfg)
    g = torch.Generator().manual_seed(1)
    return dataclasses.replace(batch, old_logprobs=batch.old_logprobs + 0.4 * torch.randn(batch.old_logprobs.shape,
                                                                                          generator=g))


VARIANTS = [dict(loss_agg="sequence"), dict(loss_agg="constant", loss_tokens=7), dict(ratio_level="sequence"),
            dict(clip_eps_low=0.1, clip_eps_high=0.3, dual_clip=3.0)]


@pytest.mark.parametrize("over", VARIANTS)
def test_variants_do_not_depend_on_the_micro_batch_split(tiny, over):
    cfg = TrainerConfig(algo="grpo", entropy_coef=0.0, **over)
    model = copy.deepcopy(tiny.model)
    batch = _off_policy(model, cfg)
    whole, g1 = _grads(model, cfg, batch)
    split, g2 = _grads(model, dataclasses.replace(cfg, token_budget=16), batch)
    assert split["pg_loss"] == pytest.approx(whole["pg_loss"], rel=1e-5)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_sequence_aggregation_by_hand_on_the_model(tiny):
    """loss = mean over sequences of each one's token mean of -A * ratio (ratio 1: no clipping)."""
    cfg = TrainerConfig(algo="grpo", entropy_coef=0.0, loss_agg="sequence")
    model = copy.deepcopy(tiny.model)
    batch = prepare(model, collate(fake_trajs(), 0), cfg)
    sums, _ = _grads(model, cfg, batch)
    m = batch.loss_mask.float()
    want = float(((-batch.advantages * m).sum(1) / m.sum(1)).mean())
    assert sums["loss"] / float(m.sum()) == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_explicit_defaults_are_bit_identical(tiny):
    """clip_eps_low/high equal to clip_eps, token aggregation and k3 give the same bits as the defaults."""
    cfg = TrainerConfig(algo="grpo", kl_coef=0.1)
    model = copy.deepcopy(tiny.model)
    batch = _off_policy(model, cfg)
    batch = dataclasses.replace(batch, ref_logprobs=batch.old_logprobs - 0.1)
    a, ga = _grads(model, cfg, batch)
    b, gb = _grads(model, dataclasses.replace(cfg, clip_eps_low=0.2, clip_eps_high=0.2, loss_agg="token",
                                              kl_estimator="k3", ratio_level="token"), batch)
    assert a == b
    assert all(torch.equal(x, y) for x, y in zip(ga, gb, strict=True))


def test_without_old_logprobs_the_batch_is_its_own_old_policy(tiny):
    """old_logprobs None: the ratio is exactly 1, the gradient is the one with the experience
    stage's old log-probs, and the gap to the engine is measured from the training forward."""
    cfg = TrainerConfig(algo="grpo", entropy_coef=0.0, tis_cap=2.0)
    model = copy.deepcopy(tiny.model)
    batch = prepare(model, collate(fake_trajs(), 0), cfg)
    batch = dataclasses.replace(batch, engine_logprobs=batch.old_logprobs + 0.3 * batch.loss_mask)
    assert not Trainer(model, cfg, temperature=1.0).needs_old_logprobs
    assert Trainer(model, dataclasses.replace(cfg, minibatches=2), temperature=1.0).needs_old_logprobs
    # REINFORCE++ folds its KL penalty into the rewards from the old log-probs
    assert Trainer(model, TrainerConfig(algo="reinforce++", kl_coef=0.1), temperature=1.0).needs_old_logprobs
    with_old, g1 = _grads(model, cfg, batch)
    model.zero_grad(set_to_none=True)
    trainer = Trainer(model, cfg, temperature=1.0)
    without = trainer.backward(dataclasses.replace(batch, old_logprobs=None), float(batch.loss_mask.sum()))
    g2 = [p.grad.clone() for p in model.parameters()]
    assert without["clip_frac"] == 0
    assert without["pg_loss"] == pytest.approx(with_old["pg_loss"], rel=1e-5, abs=1e-7)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)
    gap, top = trainer.gap
    n = float(batch.loss_mask.sum())
    assert gap["tokens"] == n and top == pytest.approx(0.3, abs=1e-5)
    assert gap["abs_diff"] == pytest.approx(0.3 * n, rel=1e-4)
    assert gap["tis_weight"] == pytest.approx(math.exp(-0.3) * n, rel=1e-4)


def test_entropy_off_the_graph_reports_the_sampled_estimate(tiny):
    """entropy_coef 0: the entropy metric is -log p of the tokens (the Monte-Carlo estimate)."""
    cfg = TrainerConfig(algo="grpo", entropy_coef=0.0)
    model = copy.deepcopy(tiny.model)
    batch = prepare(model, collate(fake_trajs(), 0), cfg)
    sums, _ = _grads(model, cfg, batch)
    assert sums["entropy"] == pytest.approx(float(-(batch.old_logprobs * batch.loss_mask).sum()), rel=1e-5)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_hand_written_head_backward_equals_autograd(tiny, with_entropy):
    """`_HeadLogprobs` (the chunked head's own backward) against checkpointed autograd and the
    full-vocabulary logits: the same log-probs, entropies and gradients, over a vocabulary cut."""
    models = [copy.deepcopy(tiny.model) for _ in range(3)]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (3, 17), generator=g)
    attn = torch.ones_like(ids, dtype=torch.bool)
    attn[1, 12:] = False
    mask = attn.clone()
    mask[:, 0] = False
    w_lp, w_ent = torch.randn(3, 17, generator=g), torch.randn(3, 17, generator=g)

    def objective(lp, ent):
        return (lp * w_lp * mask).sum() + ((ent * w_ent * mask).sum() if with_entropy else 0.0)

    lp_a, ent_a = token_logprobs(models[0], ids, attn, 0.7, with_entropy=with_entropy, chunk_tokens=7, vocab_size=50)
    objective(lp_a, ent_a).backward()
    lp_c, ent_c = full_token_logprobs(models[2], ids, attn, 0.7, with_entropy=with_entropy, vocab_size=50)
    objective(lp_c, ent_c).backward()
    # the checkpointed path, as an FSDP2 / DTensor head takes it
    import earl.runtime.trainer as tr
    orig = tr._plain_head_weight
    tr._plain_head_weight = lambda head: None
    try:
        lp_b, ent_b = token_logprobs(models[1], ids, attn, 0.7, with_entropy=with_entropy, chunk_tokens=7,
                                     vocab_size=50)
        objective(lp_b, ent_b).backward()
    finally:
        tr._plain_head_weight = orig
    assert torch.allclose(lp_a[mask], lp_c[mask], atol=1e-5)
    assert torch.equal(lp_a, lp_b)
    if with_entropy:
        assert torch.allclose(ent_a[mask], ent_c[mask], atol=1e-5)
    for pa, pb, pc in zip(*(m.parameters() for m in models), strict=True):
        scale = float(pc.grad.abs().max()) + 1e-12
        assert float((pa.grad - pb.grad).abs().max()) / scale < 1e-5
        assert float((pa.grad - pc.grad).abs().max()) / scale < 1e-5


def test_dynamic_sampling_drops_uniform_groups_in_a_run(tmp_path):
    """Real `earl run` steps with grpo: the groups whose rewards are all equal are counted and
    not trained on (samples_trained = the other groups' episodes; seed 0 filters 4 of 6 groups at
    step 2), and the engine gap, measured by the training forward, is float noise."""
    over = {"groups": 6, "group_size": 2, "steps": 2, "plots": "false", "threads": 1, "checkpoints": "false",
            "transcript_every": 0, "trainer.algo": "grpo", "trainer.filter_uniform_groups": "true"}
    rows = run_training(resolve_config(overrides=over), tmp_path / "r", progress=False, echo=lambda s: None).metrics
    assert any(r["groups_filtered"] > 0 for r in rows)
    for r in rows:
        assert 0 <= r["groups_filtered"] < 6
        assert r["samples_trained"] == 2 * (6 - r["groups_filtered"])
        assert r["logprob_diff_max"] < 1e-5


def test_rloo_with_the_variants_trains_in_a_run(tmp_path):
    """`earl run` with rloo, sequence aggregation, GSPO's ratio, clip-higher, dual-clip and a k2
    KL term: two steps with a finite, non-zero update."""
    over = {"groups": 3, "group_size": 4, "steps": 2, "plots": "false", "threads": 1, "checkpoints": "false",
            "transcript_every": 0, "trainer.algo": "rloo", "trainer.loss_agg": "sequence",
            "trainer.ratio_level": "sequence", "trainer.clip_eps_high": "0.28", "trainer.dual_clip": "3",
            "trainer.kl_coef": "0.05", "trainer.kl_estimator": "k2", "env.valid_move_reward": "0.3"}
    rows = run_training(resolve_config(overrides=over), tmp_path / "r", progress=False, echo=lambda s: None).metrics
    for r in rows:
        assert math.isfinite(r["loss"]) and r["kl"] >= 0 and r["samples_trained"] == 12
    assert any(r["grad_norm"] > 0 for r in rows)
