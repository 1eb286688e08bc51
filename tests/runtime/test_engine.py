"""Engine (both built-in backends): log-probs equal a plain forward pass; cross-turn KV cache
equals re-prefill; an episode's sampled tokens depend on its own seed only, never on the batch
it is played in. tests/runtime/test_engine_continuous.py pins continuous batching to the static
engine token for token."""

import pytest
import torch

from earl.runtime.engine import SamplingParams, StaticTorchEngine, TorchEngine, counter_uniform, sample_tokens


@pytest.fixture(params=[TorchEngine, StaticTorchEngine], ids=["pytorch", "pytorch-static"])
def engine_cls(request):
    return request.param


def plain_logprobs(model, ids, temperature=1.0):
    with torch.no_grad():
        x = torch.tensor(ids)[None]
        logits = model(input_ids=x).logits[0, :-1].float() / temperature
        return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0]


def play(engine, tok, params, seed=0, turns=3):
    """Three episodes of different lengths, one closing early; returns tokens + logprobs."""
    batch = engine.open(3, seeds=[seed * 10 + r for r in range(3)])
    seqs = {r: [] for r in range(3)}
    lps = {r: [] for r in range(3)}
    inputs = {0: tok.encode("hello"), 1: tok.encode("a longer prompt here"), 2: tok.encode("x")}
    for turn in range(turns):
        outs = batch.generate(inputs, params)
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
def test_engine_logprobs_match_forward(tiny, reuse_kv, temperature, engine_cls):
    eng = engine_cls(tiny.model, tiny.tokenizer, reuse_kv=reuse_kv)
    params = SamplingParams(temperature=temperature, max_new_tokens=6, stop=("\n",))
    seqs, lps = play(eng, tiny.tokenizer, params)
    for r in range(3):
        ref = plain_logprobs(tiny.model, seqs[r], temperature)
        got = [(t, lp) for t, lp in enumerate(lps[r]) if lp is not None]
        assert len(got) >= 1
        for t, lp in got:
            assert abs(ref[t - 1].item() - lp) < 1e-4, (r, t)


def test_kv_reuse_equals_reprefill_greedy(tiny, engine_cls):
    params = SamplingParams(temperature=0, max_new_tokens=5)
    a = play(engine_cls(tiny.model, tiny.tokenizer, reuse_kv=True), tiny.tokenizer, params)
    b_eng = engine_cls(tiny.model, tiny.tokenizer, reuse_kv=False)
    b = play(b_eng, tiny.tokenizer, params)
    assert a[0] == b[0]
    # re-prefilling runs strictly more prompt tokens through the model
    c_eng = engine_cls(tiny.model, tiny.tokenizer, reuse_kv=True)
    play(c_eng, tiny.tokenizer, params)
    assert b_eng.stats.prefill_tokens > c_eng.stats.prefill_tokens


def test_batched_equals_one_at_a_time_greedy(tiny, engine_cls):
    tok = tiny.tokenizer
    params = SamplingParams(temperature=0, max_new_tokens=4)
    prompts = [tok.encode("tic"), tok.encode("a much longer prompt"), tok.encode("12+3=")]
    eng = engine_cls(tiny.model, tok)
    together = eng.open(3).generate(dict(enumerate(prompts)), params)
    for i, p in enumerate(prompts):
        alone = eng.open(1).generate({0: p}, params)[0]
        assert alone.token_ids == together[i].token_ids
        assert alone.logprobs == pytest.approx(together[i].logprobs, abs=1e-5)


def _episodes(engine, tok, params, episodes, turns):
    """Play `episodes` (name, prompt, seed, turns it lasts) as one episode batch for up to
    `turns` turns; each observation depends on the episode's prompt and the turn only. Returns
    per episode name its generated token ids, per turn."""
    batch = engine.open(len(episodes), seeds=[seed for _, _, seed, _ in episodes])
    out = {name: [] for name, *_ in episodes}
    inputs = {r: tok.encode(prompt) for r, (_, prompt, _, _) in enumerate(episodes)}
    for turn in range(turns):
        gens = batch.generate(inputs, params)
        for r, g in gens.items():
            out[episodes[r][0]].append(g.token_ids)
        done = [r for r in gens if episodes[r][3] <= turn + 1]
        batch.close(done)
        inputs = {r: tok.encode(f"obs {turn} " * (1 + len(episodes[r][1]) % 3)) for r in gens if r not in done}
        if not inputs:
            break
    return out


@pytest.mark.parametrize("reuse_kv", [True, False])
def test_sampled_tokens_do_not_depend_on_the_batch(tiny, reuse_kv, engine_cls):
    """Temperature 1, several turns: an episode samples the very same tokens alone or among
    others (rows of other lengths, a row closing early, another order); group members (same
    prompt and observations) with different seeds sample different tokens, with equal seeds
    the same ones."""
    tok = tiny.tokenizer
    eng = engine_cls(tiny.model, tok, reuse_kv=reuse_kv)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_at_eos=False)
    turns = 4
    episodes = [("g0", "tic tac", 101, turns), ("g1", "tic tac", 202, turns),
                ("long", "a much longer prompt, this one", 303, turns), ("g0-again", "tic tac", 101, turns),
                ("short", "7", 505, 2)]
    together = _episodes(eng, tok, params, episodes, turns)
    assert {k: len(v) for k, v in together.items()} == {"g0": 4, "g1": 4, "long": 4, "g0-again": 4, "short": 2}
    assert all(len(t) == 6 for v in together.values() for t in v)
    for ep in episodes:
        alone = _episodes(eng, tok, params, [ep], turns)
        assert alone[ep[0]] == together[ep[0]], f"episode {ep[0]} sampled differently in a batch"
    # a differently composed batch, in another order, changes nothing either
    other = _episodes(eng, tok, params, [episodes[4], episodes[2], episodes[1]], turns)
    assert all(other[k] == together[k] for k in ("short", "long", "g1"))
    # group members: different seeds differ (on most turns), equal seeds agree
    assert together["g0"] == together["g0-again"]
    assert sum(a != b for a, b in zip(together["g0"], together["g1"], strict=True)) >= 2


def test_stop_strings_and_length(tiny, engine_cls):
    tok = tiny.tokenizer
    eng = engine_cls(tiny.model, tok)
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
    seeds, positions = torch.arange(2000), torch.zeros(2000, dtype=torch.long)
    toks, lps = sample_tokens(logits, SamplingParams(top_p=0.7), seeds, positions)
    assert set(toks.tolist()) == {0, 1}
    assert torch.allclose(lps[toks == 0], torch.log(torch.tensor(0.5)))
    # within the nucleus, the renormalised probabilities: 0.5 / 0.8 for token 0
    assert abs((toks == 0).float().mean().item() - 0.625) < 0.05
    with pytest.raises(ValueError, match="seed and a position"):
        sample_tokens(logits, SamplingParams(temperature=1.0))


def test_sampled_frequencies_follow_the_distribution():
    """Inverse-CDF sampling with one uniform per row: over many streams each token comes up in
    proportion to its probability, a token of probability 0 never; the vocabulary cut applies."""
    probs = torch.tensor([0.4, 0.0, 0.25, 0.2, 0.1, 0.05, 0.0])
    n = 20000
    logits = torch.log(probs).repeat(n, 1)
    logits[:, -1] = 50.0  # past the tokenizer's vocabulary: never drawn
    toks, lps = sample_tokens(logits, SamplingParams(temperature=1.0), torch.arange(n),
                              torch.full((n,), 3, dtype=torch.long), vocab_size=6)
    freq = torch.bincount(toks, minlength=7).double() / n
    assert freq[1] == 0 and freq[6] == 0
    assert torch.allclose(freq[:6], probs[:6].double(), atol=0.012), freq
    assert torch.allclose(lps, torch.log(probs[toks]), atol=1e-6)
    # temperature 2 flattens the distribution: p ~ sqrt(probs), renormalised
    toks2, _ = sample_tokens(torch.log(probs[:6]).repeat(n, 1), SamplingParams(temperature=2.0), torch.arange(n),
                             torch.zeros(n, dtype=torch.long))
    want = probs[:6].double().sqrt() / probs[:6].double().sqrt().sum()
    assert torch.allclose(torch.bincount(toks2, minlength=6).double() / n, want, atol=0.012)


def test_counter_noise_is_a_function_of_seed_and_position_only():
    seeds, pos = torch.tensor([7, 7, 8, 7]), torch.tensor([3, 4, 3, 3])
    u = counter_uniform(seeds, pos, 50)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    assert torch.equal(u[0], u[3])  # same (seed, position): same noise, whatever the row
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(counter_uniform(seeds[2:3], pos[2:3], 50), u[2:3])  # alone == in a batch
    # roughly uniform: mean 1/2, and the 50 columns of a row are not a constant
    big = counter_uniform(torch.arange(400), torch.zeros(400, dtype=torch.long), 50)
    assert abs(big.mean().item() - 0.5) < 0.01 and big[0].std() > 0.1


def test_bad_requests(tiny, engine_cls):
    eng = engine_cls(tiny.model, tiny.tokenizer)
    b = eng.open(2)
    with pytest.raises(ValueError, match="first turn"):
        b.generate({0: [], 1: [5]}, SamplingParams())
    with pytest.raises(ValueError, match="not open"):
        b.generate({7: [5]}, SamplingParams())
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)


def test_update_weights_pushes_trainer_weights(tiny, engine_cls):
    import copy

    trained = copy.deepcopy(tiny.model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    eng = engine_cls(copy.deepcopy(tiny.model), tiny.tokenizer)
    eng.update_weights(trained.named_parameters())
    ids = torch.tensor([tiny.tokenizer.encode("123|456|789\n")])
    with torch.no_grad():
        assert torch.equal(eng.model(input_ids=ids).logits, trained(input_ids=ids).logits)
    with pytest.raises(ValueError, match="unknown parameter"):
        eng.update_weights([("nope", torch.zeros(1))])
