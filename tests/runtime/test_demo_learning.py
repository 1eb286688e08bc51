"""The knobs the default demo's learning rests on (docs/cpu/learning/README.md): the per-turn
discount of REINFORCE++'s return-to-go, checked by hand and through the advantages."""

from __future__ import annotations

import pytest
import torch

from earl.runtime.advantages import AdvantageSpec, fill_advantages, local_stats, returns_to_go
from earl.runtime.resolve import resolve_config


def episode(rewards_by_token: list[float], turns: list[int]) -> dict[str, torch.Tensor]:
    """One sample: token rewards, turn ids (-1: prompt/observation tokens, not generated)."""
    t = torch.tensor(turns)
    return {"token_rewards": torch.tensor(rewards_by_token), "turn_ids": t, "loss_mask": (t >= 0).float(),
            "input_ids": torch.arange(len(turns))}


def test_discounted_return_to_go_by_hand():
    # prompt, turn 0 (two tokens: a 0.2 KL-like reward then the move's 0.1), observation,
    # turn 1 (-1, an invalid move), observation, turn 2 (+1, the win)
    item = episode([0, 0.2, 0.1, 0, -1.0, 0, 1.0], [-1, 0, 0, -1, 1, -1, 2])
    g = 0.5
    got = returns_to_go(item, g).tolist()
    turn2, turn1 = 1.0, -1.0 + g * 1.0
    want = [None, 0.3 + g * turn1, 0.1 + g * turn1, None, turn1, None, turn2]
    for w, x in zip(want, got, strict=True):
        if w is not None:
            assert x == pytest.approx(w)
    assert returns_to_go(item, 1.0).tolist() == pytest.approx([0.3, 0.3, 0.1, 0.0, 0.0, 1.0, 1.0])
    assert returns_to_go(item, 0.0)[4] == pytest.approx(-1.0)  # only the move's own reward


def test_discount_flows_into_the_per_turn_advantages():
    store = {0: episode([0.1, 0, -1.0], [0, -1, 1]), 1: episode([0.1, 0, 0.1], [0, -1, 1])}

    class S:  # the sample fields the estimator reads
        def __init__(self, i):
            self.id, self.group = i, i

    samples = [S(0), S(1)]
    for gamma in (1.0, 0.0):
        spec = AdvantageSpec(estimator="reinforce++", per_turn=True, gamma=gamma)
        assert "turn_ids" in spec.inputs
        fill_advantages(store, samples, local_stats(store, samples, spec), spec)
        first = (store[0]["advantages"][0], store[1]["advantages"][0])
        if gamma == 1:  # turn 0 carries the later -1 vs +0.1: sample 0's first move looks worse
            assert first[0] < 0 < first[1]
        else:  # each first move is credited with its own +0.1 only: the same advantage (0)
            assert first[0] == pytest.approx(0.0, abs=1e-6) and first[1] == pytest.approx(0.0, abs=1e-6)
    assert "turn_ids" not in AdvantageSpec(estimator="reinforce++").inputs
    with pytest.raises(ValueError, match=r"trainer.gamma must be in \[0, 1\] \(1: undiscounted\), got 1.5"):
        resolve_config(overrides={"trainer.gamma": 1.5})


def test_bench_learning_curve_is_ten_step_means(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_learning.py"
    spec = importlib.util.spec_from_file_location("bench_learning", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cols = ["step"] + [k for _, k in bench.CURVE]
    lines = [",".join(cols)] + [",".join([str(s)] + [str(s / 100)] * (len(cols) - 1)) for s in range(1, 13)]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    out = bench.curve(str(tmp_path / "metrics.csv"))
    assert out[0].endswith(": 12 steps") and len(out) == 3
    assert out[1].startswith("  step   10 win 0.055 ") and out[2].startswith("  step   12 win 0.115 ")


def test_tictactoe_lists_its_legal_moves_as_bits():
    from earl.runtime.envs.tictactoe import TicTacToe

    env = TicTacToe()
    env.reset(3)
    assert env.actions == tuple("123456789") and env.legal_action_bits() == 0b111111111
    env.step("5")  # x takes 5, the random opponent one more cell
    free = env.legal_moves()
    assert len(free) == 7 and 5 not in free
    assert env.legal_action_bits() == sum(1 << (m - 1) for m in free)


def test_rollout_records_each_moves_legal_cells(tiny):
    from earl.runtime.engine import SamplingParams, TorchEngine
    from earl.runtime.envs.tictactoe import TicTacToe
    from earl.runtime.rollout import rollout

    eng = TorchEngine(tiny.model, tiny.tokenizer)
    trajs = rollout(eng, lambda: TicTacToe(invalid_action="substitute"), seeds=list(range(8)),
                    group_ids=list(range(8)), params=SamplingParams(max_new_tokens=1), max_context=512)
    for t in trajs:
        assert len(t.legal_bits) == len(t.token_ids)
        gen = [i for i, m in enumerate(t.loss_mask) if m]
        assert [i for i, b in enumerate(t.legal_bits) if b] == gen  # every move, nothing else
        assert t.legal_bits[gen[0]] == 0b111111111  # the first move: an empty board
        # the agent's k-th move (k from 0) sees 2k taken cells (it always starts)
        assert [bin(t.legal_bits[i]).count("1") for i in gen] == [9 - 2 * k for k in range(len(gen))]


def test_legality_loss_by_hand():
    from earl.runtime.trainer import legality_loss

    p = torch.tensor([[[0.5, 0.2, 0.1]]])  # p of actions 0, 1, 2 at one position (0.2 elsewhere)
    bits = torch.tensor([[0b101]])  # actions 0 and 2 legal
    assert float(legality_loss(p.log(), bits)) == pytest.approx(-torch.tensor(0.6).log().item())
    assert float(legality_loss(p.log(), torch.tensor([[0]]))) == 0.0  # no list: no term
    lp = torch.tensor([[[0.5, 0.2, 0.1], [0.3, 0.3, 0.3]]]).log().requires_grad_(True)
    legality_loss(lp, torch.tensor([[0b101, 0]])).sum().backward()  # a position without a list
    assert torch.isfinite(lp.grad).all() and float(lp.grad[0, 1].abs().sum()) == 0.0
    assert lp.grad[0, 0].tolist() == pytest.approx([-0.5 / 0.6, 0.0, -0.1 / 0.6])  # d(-log mass)/d log p


def test_token_logprobs_action_log_probs_equal_the_full_softmax(tiny):
    from earl.runtime.trainer import full_token_logprobs, token_logprobs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tiny.tokenizer.vocab_size, (3, 9), generator=g)
    attn = torch.ones_like(ids, dtype=torch.bool)
    need = torch.zeros_like(attn)
    need[:, 4:] = True
    acts = torch.tensor([tiny.tokenizer.encode(c)[0] for c in "123456789"])
    lp, _, act = token_logprobs(tiny.model, ids, attn, 1.0, need=need, action_ids=acts)
    plain, _ = token_logprobs(tiny.model, ids, attn, 1.0, need=need)
    logits = tiny.model(input_ids=ids, attention_mask=attn.long()).logits[:, :-1].float()
    want = torch.log_softmax(logits, -1)[..., acts]
    # column t: the distribution of token t given < t (the logits at t - 1), where `need` is set
    assert torch.allclose(act[:, 4:], want[:, 3:], atol=1e-5) and float(act[:, :4].detach().abs().max()) == 0
    assert torch.allclose(lp, plain, atol=1e-6)
    full, _ = full_token_logprobs(tiny.model, ids, attn, 1.0)
    assert torch.allclose(lp[:, 5:], full[:, 5:], atol=1e-5)


def test_the_legality_term_moves_mass_onto_the_free_cells(tiny):
    """Only the legality term (zero advantages, no entropy bonus): a few optimizer steps on
    real rollouts raise P(legal move) at those positions; at legal_coef 0 the loss has no term."""
    import copy

    from earl.runtime.engine import SamplingParams, TorchEngine
    from earl.runtime.envs.tictactoe import TicTacToe
    from earl.runtime.rollout import rollout
    from earl.runtime.run_config import TrainerConfig
    from earl.runtime.trainer import Trainer, collate, legality_loss, token_logprobs

    model = copy.deepcopy(tiny.model)
    eng = TorchEngine(model, tiny.tokenizer)
    trajs = rollout(eng, lambda: TicTacToe(invalid_action="substitute"), seeds=list(range(16)),
                    group_ids=list(range(16)), params=SamplingParams(max_new_tokens=1), max_context=512)
    batch = collate(trajs, tiny.tokenizer.pad_id)
    batch.advantages = torch.zeros(batch.input_ids.shape)
    acts = [tiny.tokenizer.encode(c)[0] for c in TicTacToe.actions]

    def legal_loss_now() -> float:
        with torch.no_grad():
            _, _, act = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0, need=batch.loss_mask,
                                       action_ids=torch.tensor(acts))
        return float((legality_loss(act, batch.legal_bits) * batch.loss_mask).sum() / batch.loss_mask.sum())

    off = Trainer(model, TrainerConfig(entropy_coef=0.0, legal_coef=0.0), temperature=1.0, action_ids=acts)
    assert not off.uses_legal_bits
    assert off.backward(batch, float(batch.loss_mask.sum()))["legal_loss"] == 0.0
    on = Trainer(model, TrainerConfig(entropy_coef=0.0, legal_coef=1.0), temperature=1.0, action_ids=acts)
    assert on.uses_legal_bits
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = legal_loss_now()
    for _ in range(10):
        opt.zero_grad()
        sums = on.backward(batch, float(batch.loss_mask.sum()))
        opt.step()
    after = legal_loss_now()
    assert sums["legal_loss"] > 0 and after < 0.5 * before, (before, after)
    with pytest.raises(ValueError, match=r"trainer.legal_coef must be a finite number >= 0 \(0: off\), got -1"):
        resolve_config(overrides={"trainer.legal_coef": -1})


def test_the_default_run_trains_with_the_legality_term(tmp_path):
    from earl.runtime.run import run_training

    cfg = resolve_config(overrides={"steps": 2, "groups": 8, "plots": False, "checkpoints": False})
    assert cfg.trainer.legal_coef == 5.0 and cfg.env.show == "moves"  # the demo's defaults (session 3)
    rows = run_training(cfg, str(tmp_path), progress=False).metrics
    # -log P(legal) of a near-uniform policy over 64 symbols, most moves on a near-empty board
    assert [r["step"] for r in rows] == [1, 2] and all(1.0 < float(r["legal_loss"]) < 3.5 for r in rows)
    off = resolve_config(overrides={"steps": 1, "groups": 8, "plots": False, "checkpoints": False,
                                    "trainer.legal_coef": 0})
    assert float(run_training(off, str(tmp_path / "off"), progress=False).metrics[0]["legal_loss"]) == 0.0
