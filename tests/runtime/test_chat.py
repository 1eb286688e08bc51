"""Chat-templated HF models: episodes rendered with the tokenizer's chat template, trained on
exactly the ids generated and observed (re-rendering the conversation gives the same ids),
and sampling confined to the tokenizer's vocabulary when the model's is larger."""

import sys
from pathlib import Path

import pytest
import torch

from earl.runtime.engine import SamplingParams, TorchEngine, sample_tokens
from earl.runtime.envs import make_env
from earl.runtime.hf_model import load_policy
from earl.runtime.rollout import rollout
from earl.runtime.tokenizer import Conversation

sys.path.insert(0, str(Path(__file__).parent))
from chat_model import build_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return build_chat_model(tmp_path_factory.mktemp("chat") / "model")


def _render_ids(tok, messages, tools=None, generation_prompt=False):
    text = tok.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                       add_generation_prompt=generation_prompt)
    return tok.encode(text)


def test_episode_ids_equal_the_rerendered_conversation(chat_dir):
    pol = load_policy(str(chat_dir))
    tok = pol.tokenizer
    assert tok.vocab_size == 131 and pol.spec.vocab_size == 192
    eng = TorchEngine(pol.model, tok)
    trajs = rollout(eng, lambda: make_env("tic-tac-toe", invalid_action="retry", max_retries=3),
                    seeds=list(range(6)), group_ids=list(range(6)),
                    params=SamplingParams(max_new_tokens=6, stop=("\n",)), max_context=2048)
    turns = 0
    for t in trajs:
        msgs = t.messages
        assert msgs[0]["role"] == "user" and msgs[0]["content"].startswith("tic-tac-toe x")
        # the ids fed before each reply are the template's rendering of the conversation so far
        for j, m in enumerate(msgs):
            if m["role"] != "assistant":
                want = _render_ids(tok, msgs[:j + 1], generation_prompt=True)
                assert t.token_ids[:len(want)] == want
                turns += 1
        # and the whole episode is a prefix of the full rendering (its end: the template's close)
        full = _render_ids(tok, msgs)
        assert full[:len(t.token_ids)] == t.token_ids or full[:len(t.token_ids) - 1] == t.token_ids[:-1]
        gen = [i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        assert all(i < tok.vocab_size for i in gen)  # never a padded embedding row
    assert turns > len(trajs)  # retries gave multi-turn episodes


def test_conversation_special_tokens_in_a_reply_do_not_drift(chat_dir):
    tok = load_policy(str(chat_dir)).tokenizer
    conv = Conversation(tok)
    ids = conv.observe("move?")
    reply = tok.encode("a<|im_start|>b") + [tok.eos_id]
    conv.reply(reply, "ab")
    ids2 = conv.observe("again", role="tool")
    assert conv.drift == 0
    assert ids + reply + ids2 == _render_ids(tok, conv.messages, generation_prompt=True)


def test_char_tokenizer_keeps_plain_text():
    pol = load_policy("tiny")
    conv = Conversation(pol.tokenizer)
    assert not conv.chat
    assert conv.observe("1x3") == [pol.tokenizer.bos_id] + pol.tokenizer.encode("1x3")
    assert conv.observe("4") == pol.tokenizer.encode("4")


def test_sampling_never_draws_beyond_the_tokenizer():
    logits = torch.zeros(64, 10)
    logits[:, 7:] = 50.0  # the model prefers padded rows
    params = SamplingParams(temperature=1.0)
    toks, lps = sample_tokens(logits, params, torch.arange(64), torch.zeros(64, dtype=torch.long), vocab_size=7)
    assert int(toks.max()) < 7 and torch.allclose(lps, torch.full((64,), -torch.log(torch.tensor(7.0))))
    greedy, _ = sample_tokens(logits, SamplingParams(temperature=0), vocab_size=7)
    assert int(greedy.max()) < 7
    same, _ = sample_tokens(logits[:, :7], params, torch.arange(64), torch.zeros(64, dtype=torch.long))
    assert torch.equal(same, toks)


def test_run_with_a_chat_model(chat_dir, tmp_path):
    from earl.runtime.resolve import resolve_config
    from earl.runtime.run import run_training

    cfg = resolve_config(overrides={"model.path": str(chat_dir), "groups": 2, "group_size": 2, "steps": 1,
                                    "plots": "false", "sampling.max_new_tokens": "4"})
    res = run_training(cfg, tmp_path / "run", progress=False, echo=lambda s: None)
    assert res.metrics[0]["episodes"] == 4
