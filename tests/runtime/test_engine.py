"""Engine: log-probs equal a plain forward pass; cross-turn KV cache equals re-prefill."""

import pytest
import torch

from earl.runtime.engine import SamplingParams, TorchEngine, sample_tokens


def plain_logprobs(model, ids, temperature=1.0):
    with torch.no_grad():
        x = torch.tensor(ids)[None]
        logits = model(input_ids=x).logits[0, :-1].float() / temperature
        return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0]


def play(engine, tok, params, seed=0, turns=3):
    """Three episodes of different lengths, one closing early; returns tokens + logprobs."""
    batch = engine.open(3)
    gen = torch.Generator().manual_seed(seed)
    seqs = {r: [] for r in range(3)}
    lps = {r: [] for r in range(3)}
    inputs = {0: tok.encode("hello"), 1: tok.encode("a longer prompt here"), 2: tok.encode("x")}
    for turn in range(turns):
        outs = batch.generate(inputs, params, gen)
        for r, o in outs.items():
            seqs[r] += inputs[r]
            lps[r] += [None] * len(inputs[r])
            seqs[r] += o.token_ids
            lps[r] += o.logprobs
        if turn == 0:
            batch.close([1])
        inputs = {r: tok.encode(f"obs {turn} " * (r + 1)) for r in outs if r != 1}
    return seqs, lps


@pytest.mark.parametrize("reuse_kv", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_forward(tiny, reuse_kv, temperature):
    eng = TorchEngine(tiny.model, tiny.tokenizer, reuse_kv=reuse_kv)
    params = SamplingParams(temperature=temperature, max_new_tokens=6, stop=("\n",))
    seqs, lps = play(eng, tiny.tokenizer, params)
    for r in range(3):
        ref = plain_logprobs(tiny.model, seqs[r], temperature)
        got = [(t, lp) for t, lp in enumerate(lps[r]) if lp is not None]
        assert len(got) >= 1
        for t, lp in got:
            assert abs(ref[t - 1].item() - lp) < 1e-4, (r, t)


def test_kv_reuse_equals_reprefill_greedy(tiny):
    params = SamplingParams(temperature=0, max_new_tokens=5)
    a = play(TorchEngine(tiny.model, tiny.tokenizer, reuse_kv=True), tiny.tokenizer, params)
    b_eng = TorchEngine(tiny.model, tiny.tokenizer, reuse_kv=False)
    b = play(b_eng, tiny.tokenizer, params)
    assert a[0] == b[0]
    # re-prefilling runs strictly more prompt tokens through the model
    c_eng = TorchEngine(tiny.model, tiny.tokenizer, reuse_kv=True)
    play(c_eng, tiny.tokenizer, params)
    assert b_eng.stats.prefill_tokens > c_eng.stats.prefill_tokens


def test_batched_equals_one_at_a_time_greedy(tiny):
    tok = tiny.tokenizer
    params = SamplingParams(temperature=0, max_new_tokens=4)
    prompts = [tok.encode("tic"), tok.encode("a much longer prompt"), tok.encode("12+3=")]
    eng = TorchEngine(tiny.model, tok)
    together = eng.open(3).generate(dict(enumerate(prompts)), params)
    for i, p in enumerate(prompts):
        alone = eng.open(1).generate({0: p}, params)[0]
        assert alone.token_ids == together[i].token_ids
        assert alone.logprobs == pytest.approx(together[i].logprobs, abs=1e-5)


def test_stop_strings_and_length(tiny):
    tok = tiny.tokenizer
    eng = TorchEngine(tiny.model, tok)
    out = eng.open(1).generate({0: tok.encode("go")}, SamplingParams(temperature=0, max_new_tokens=7))[0]
    assert out.finish in ("length", "eos") and len(out.token_ids) <= 7
    # stop on the character greedy decoding produces first: generation ends right there
    first = tok.decode(out.token_ids[:1])
    if first:
        stopped = eng.open(1).generate({0: tok.encode("go")},
                                       SamplingParams(temperature=0, max_new_tokens=7, stop=(first,)))[0]
        assert stopped.finish == "stop" and stopped.token_ids == out.token_ids[:1]


def test_top_p_samples_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]).repeat(2000, 1))
    gen = torch.Generator().manual_seed(0)
    toks, lps = sample_tokens(logits, SamplingParams(top_p=0.7), gen)
    assert set(toks.tolist()) == {0, 1}
    assert torch.allclose(lps[toks == 0], torch.log(torch.tensor(0.5)))


def test_bad_requests(tiny):
    eng = TorchEngine(tiny.model, tiny.tokenizer)
    b = eng.open(2)
    with pytest.raises(ValueError, match="first turn"):
        b.generate({0: [5]}, SamplingParams())
    with pytest.raises(ValueError, match="not open"):
        b.generate({7: [5]}, SamplingParams())
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)


def test_update_weights_pushes_trainer_weights(tiny):
    import copy

    trained = copy.deepcopy(tiny.model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    eng = TorchEngine(copy.deepcopy(tiny.model), tiny.tokenizer)
    eng.update_weights(trained.named_parameters())
    ids = torch.tensor([tiny.tokenizer.encode("123|456|789\n")])
    with torch.no_grad():
        assert torch.equal(eng.model(input_ids=ids).logits, trained(input_ids=ids).logits)
    with pytest.raises(ValueError, match="unknown parameter"):
        eng.update_weights([("nope", torch.zeros(1))])
