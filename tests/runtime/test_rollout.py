"""Rollouts are token-in token-out: the loss mask covers exactly the generated tokens; an
episode plays the same whatever engine batch it shares."""

import pytest

from earl.runtime.engine import SamplingParams, TorchEngine
from earl.runtime.envs.base import StepResult
from earl.runtime.rollout import rollout
from earl.runtime.trainer import collate


class EchoEnv:
    """Records every action and observation; ends after a seed-dependent number of turns."""

    max_new_tokens = 4
    stop = ("\n",)

    def __init__(self, log):
        self.log = log

    def reset(self, seed):
        self.turns, self.seed = 0, seed
        self.log[seed] = {"obs": [f"start {seed}\n"], "actions": []}
        return self.log[seed]["obs"][0]

    def step(self, action):
        self.turns += 1
        self.log[self.seed]["actions"].append(action)
        done = self.turns >= 1 + self.seed % 3
        obs = f"seen {len(action)} chars\n"
        if not done:
            self.log[self.seed]["obs"].append(obs)
        return StepResult(observation=obs, reward=float(self.turns), done=done, outcome="win" if done else "")


def test_mask_covers_exactly_generated_tokens(tiny):
    tok = tiny.tokenizer
    log = {}
    eng = TorchEngine(tiny.model, tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\n",))
    trajs = rollout(eng, lambda: EchoEnv(log), seeds=list(range(6)), group_ids=[0, 0, 1, 1, 2, 2],
                    params=params, sample_seeds=[10 + i for i in range(6)], max_context=512)
    for tr in trajs:
        rec = log[tr.episode_id]
        assert len(tr.turns) == 1 + tr.episode_id % 3 == len(rec["actions"])
        # rebuild the sequence from the env's point of view: obs, action, obs, action, ...
        expect_ids, expect_mask, gen_spans = [tok.bos_id], [0], []
        for i in range(len(rec["actions"])):
            obs_ids = tok.encode(rec["obs"][i])
            expect_ids += obs_ids
            expect_mask += [0] * len(obs_ids)
            n_gen = tr.turns[i].gen_tokens
            gen_spans.append(len(expect_ids))
            expect_ids += tr.token_ids[len(expect_ids):len(expect_ids) + n_gen]
            expect_mask += [1] * n_gen
        assert tr.token_ids == expect_ids
        assert tr.loss_mask == expect_mask
        # the generated tokens decode to exactly the actions the env received
        for start, turn, action in zip(gen_spans, tr.turns, rec["actions"], strict=True):
            assert tok.decode(tr.token_ids[start:start + turn.gen_tokens]) == action
        assert all(lp == 0.0 for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if not m)
        assert all(lp < 0.0 for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if m)
        assert tr.reward == sum(range(1, len(tr.turns) + 1))
        assert tr.turns[0].obs_tokens == len(tok.encode(rec["obs"][0])) + 1  # prompt incl. bos
    batch = collate(trajs, tok.pad_id)
    for i, tr in enumerate(trajs):
        assert batch.loss_mask[i].sum() == sum(tr.loss_mask) == tr.generated_tokens
        assert batch.token_rewards[i].sum() == tr.reward
        assert not batch.loss_mask[i, len(tr.token_ids):].any()


def test_max_context_truncates(tiny):
    log = {}
    eng = TorchEngine(tiny.model, tiny.tokenizer)
    params = SamplingParams(max_new_tokens=4, stop=("\n",))
    trajs = rollout(eng, lambda: EchoEnv(log), seeds=[2], group_ids=[0], params=params, max_context=16)
    assert trajs[0].outcome == "truncated" and len(trajs[0].token_ids) <= 16


def test_episodes_do_not_depend_on_the_engine_batch(tiny):
    """An episode's trajectory is the same whether all episodes share one engine batch or each
    plays alone; episode ids (not positions in the list) name the episodes, and group members,
    which share their environment seed, sample from different streams by default."""
    tok = tiny.tokenizer
    params = SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\n",))
    seeds, groups, ids = [5, 5, 7, 7, 9], [0, 0, 1, 1, 2], [40, 41, 42, 43, 44]

    def play(engine_batch):
        log = {}
        return rollout(TorchEngine(tiny.model, tok), lambda: EchoEnv(log), seeds=seeds, group_ids=groups,
                       params=params, max_context=512, engine_batch=engine_batch, episode_ids=ids)

    together, alone, pairs = play(0), play(1), play(2)
    assert [t.episode_id for t in together] == ids
    for a, b, c in zip(together, alone, pairs, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.loss_mask == b.loss_mask and a.reward == b.reward and a.group_id == b.group_id
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    # members of a group see the same environment but sample their own tokens
    gen = [[t for t, m in zip(tr.token_ids, tr.loss_mask, strict=True) if m] for tr in together]
    assert gen[0] != gen[1] and gen[2] != gen[3]


def test_legal_bits_recorded_only_when_asked(tiny):
    """An env that lists its legal actions has them recorded on each move's first generated
    token (the legality term's input); with `legal_bits=False` (trainer.legal_coef = 0) the env is
    not asked and every token carries 0, the same tokens played."""

    class LegalEcho(EchoEnv):
        actions = ("a", "b")
        asked = 0

        def legal_action_bits(self):
            LegalEcho.asked += 1
            return 0b10

    params = SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\n",))

    def play(legal_bits):
        log = {}
        return rollout(TorchEngine(tiny.model, tiny.tokenizer), lambda: LegalEcho(log), seeds=[1, 2], group_ids=[0, 1],
                       params=params, max_context=512, legal_bits=legal_bits)

    on = play(True)
    asked, LegalEcho.asked = LegalEcho.asked, 0
    off = play(False)
    assert asked == sum(t.actions for t in on) > 0 and LegalEcho.asked == 0
    for a, b in zip(on, off, strict=True):
        assert a.token_ids == b.token_ids and len(a.legal_per_token) == len(a.token_ids)
        assert a.legal_per_token.count(0b10) == a.actions and set(b.legal_per_token) == {0}
