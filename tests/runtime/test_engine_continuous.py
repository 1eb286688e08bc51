"""The continuous-batching engine (earl.runtime.engine.pytorch): greedy tokens and log-probs equal
a plain HF forward of the final token ids; driven step by step across turns of unequal lengths
with early closes, under a narrow decode width and token budget, it samples the very tokens the
static engine samples (temperature 0 and 1); rollouts equal the static engine's; blocks of
decode steps per host sync change no token; the compiled decode step (forward + sampling, one
graph) equals the eager one."""

import pytest
import torch

from earl.runtime.engine import SamplingParams, StaticTorchEngine, TorchEngine, make_engine
from earl.runtime.envs.base import StepResult
from earl.runtime.rollout import rollout

PROMPTS = ["hi", "a much longer prompt, this one is", "12+3=", "x", "tic tac toe", "7 8 9"]


def obs_for(r: int, turn: int) -> str:
    return f"obs {turn}|" * (1 + (r * 7 + turn) % 4)


def drive(batch, tok, params, turns_of):
    """Episodes r = 0..len(PROMPTS)-1 driven step by step: a finished turn submits the next
    observation at once (re-joining while others decode); episode r lasts `turns_of(r)` turns,
    its turn t samples with `params(r, t)`. Returns {r: [(ids, logprobs) per turn]}
    and the full token sequence per episode."""
    out = {r: [] for r in range(len(PROMPTS))}
    seqs = {r: tok.encode(p) for r, p in enumerate(PROMPTS)}
    for r in range(len(PROMPTS)):
        batch.submit({r: list(seqs[r])}, params(r, 0))
    while batch.busy:
        for r, g in batch.step().items():
            out[r].append((g.token_ids, g.logprobs))
            seqs[r] += g.token_ids
            t = len(out[r])
            if t >= turns_of(r):
                batch.close([r])
                continue
            obs = tok.encode(obs_for(r, t))
            seqs[r] += obs
            batch.submit({r: obs}, params(r, t))
    return out, seqs


def turn_sync(batch, tok, params, turns_of):
    """The same episodes through whole-turn generate() calls (the static engine's way)."""
    out = {r: [] for r in range(len(PROMPTS))}
    inputs = {r: tok.encode(p) for r, p in enumerate(PROMPTS)}
    for t in range(max(turns_of(r) for r in range(len(PROMPTS)))):
        gens = batch.generate(inputs, params(0, t))
        for r, g in gens.items():
            out[r].append((g.token_ids, g.logprobs))
        done = [r for r in gens if len(out[r]) >= turns_of(r)]
        batch.close(done)
        inputs = {r: tok.encode(obs_for(r, t + 1)) for r in gens if r not in done}
    return out


def turns_of(r):
    return 1 + r % 3


@pytest.mark.parametrize("reuse_kv", [True, False])
def test_greedy_tokens_and_logprobs_equal_hf_forward(tiny, reuse_kv):
    tok = tiny.tokenizer
    eng = TorchEngine(tiny.model, tok, reuse_kv=reuse_kv, max_batch=3, step_tokens=24)
    params = SamplingParams(temperature=0, max_new_tokens=5, stop_at_eos=False)
    out, seqs = drive(eng.open(len(PROMPTS)), tok, lambda r, t: params, turns_of)
    for r, seq in seqs.items():
        with torch.no_grad():
            logits = tiny.model(input_ids=torch.tensor([seq])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        gen_at = []  # positions of generated tokens in seq
        pos = len(tok.encode(PROMPTS[r]))
        for t, (ids, _) in enumerate(out[r]):
            gen_at += range(pos, pos + len(ids))
            pos += len(ids) + (len(tok.encode(obs_for(r, t + 1))) if t + 1 < len(out[r]) else 0)
        lps = [lp for _, lp_list in out[r] for lp in lp_list]
        assert len(gen_at) == len(lps) == 5 * turns_of(r)
        for p, lp in zip(gen_at, lps, strict=True):
            assert seq[p] == int(logp[p - 1].argmax()), (r, p)  # greedy: the forward's argmax
            assert abs(logp[p - 1, seq[p]].item() - lp) < 1e-4, (r, p)


def test_group_members_share_one_prefill(tiny):
    """Episodes opening on the same prompt (a GRPO group) prefill it once: the others get a copy
    of its KV. Each member samples what it samples alone (temperature 1, its own seed), with the
    same log-probs, over two turns; only one copy of each prompt's tokens runs through prefill."""
    tok = tiny.tokenizer
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_at_eos=False)
    prompts = [tok.encode(p) for p in ("tic tac", "a longer prompt here")]
    rows = [prompts[i // 4] for i in range(8)]  # 2 groups of 4
    seeds = [11 * i + 3 for i in range(8)]

    def play(eng, idx):
        b = eng.open(len(idx), [seeds[i] for i in idx])
        first = b.generate({j: list(rows[i]) for j, i in enumerate(idx)}, params)
        second = b.generate({j: tok.encode("obs|") for j in range(len(idx))}, params)
        return [(first[j].token_ids, first[j].logprobs, second[j].token_ids, second[j].logprobs)
                for j in range(len(idx))]

    eng = TorchEngine(tiny.model, tok)
    together = play(eng, list(range(8)))
    # turn 2 feeds each row its last sampled token and the observation
    assert eng.stats.prefill_tokens == sum(len(p) for p in prompts) + 8 * (1 + len(tok.encode("obs|")))
    assert eng.stats.extra["shared_prefill_tokens"] == 3 * sum(len(p) for p in prompts)
    for i in range(8):
        alone = play(TorchEngine(tiny.model, tok), [i])[0]
        assert alone[0] == together[i][0] and alone[2] == together[i][2], i
        assert alone[1] == pytest.approx(together[i][1], abs=1e-5)
        assert alone[3] == pytest.approx(together[i][3], abs=1e-5)
    assert len({tuple(t[0] + t[2]) for t in together[:4]}) > 1  # seeds keep group members apart


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_equals_static_token_for_token(tiny, temperature):
    """Unequal turn lengths (per-episode max_new_tokens and a stop string), episodes of 1-3
    turns closing early, a decode width of 2 and a 16-token budget: rows join as others leave,
    yet every episode samples what the static engine samples turn by turn."""
    tok = tiny.tokenizer

    def params(r, t):
        return SamplingParams(temperature=temperature, max_new_tokens=2 + (r + 3 * t) % 6, stop_at_eos=False,
                              stop=("|",))

    seeds = [100 + 7 * r for r in range(len(PROMPTS))]
    cont = TorchEngine(tiny.model, tok, max_batch=2, step_tokens=16)
    got, _ = drive(cont.open(len(PROMPTS), seeds), tok, params, turns_of)
    # the static engine plays each episode alone (its params differ per episode and turn)
    for r in range(len(PROMPTS)):
        static = StaticTorchEngine(tiny.model, tok)
        b = static.open(1, [seeds[r]])
        inputs = tok.encode(PROMPTS[r])
        for t in range(turns_of(r)):
            g = b.generate({0: inputs}, params(r, t))[0]
            ids, lps = got[r][t]
            assert g.token_ids == ids, (r, t)
            assert g.logprobs == pytest.approx(lps, abs=1e-4)
            inputs = tok.encode(obs_for(r, t + 1))
    assert cont.stats.extra["kv_cache_bytes"] > 0


def test_finished_batch_hands_its_cache_to_the_next(tiny):
    """A batch whose episodes all closed hands its slot cache to the next batch (same tensors:
    no allocation, no new shapes for a compiled step); the stale KV in it changes no token, and
    a batch still playing keeps its cache to itself."""
    tok = tiny.tokenizer

    def params(r, t):
        return SamplingParams(temperature=1.0, max_new_tokens=2 + (r + 3 * t) % 6, stop_at_eos=False, stop=("|",))

    seeds = [100 + 7 * r for r in range(len(PROMPTS))]
    eng = TorchEngine(tiny.model, tok, max_batch=3, step_tokens=16)
    first = eng.open(len(PROMPTS), seeds)
    want, _ = drive(first, tok, params, turns_of)
    assert first.done
    again = eng.open(len(PROMPTS), seeds)  # adopts `first`'s cache, full of its KV
    assert again.k[0].data_ptr() == first.k[0].data_ptr() and eng.stats.extra["kv_cache_reused"] == 1
    got, _ = drive(again, tok, params, turns_of)
    for r in range(len(PROMPTS)):
        for (ids, lps), (ids2, lps2) in zip(want[r], got[r], strict=True):
            assert ids == ids2 and lps == pytest.approx(lps2, abs=1e-5)
    busy = eng.open(2, seeds[:2])  # adopts again (fewer rows fit); leaves its episodes open
    busy.generate({0: tok.encode("hi"), 1: tok.encode("x")}, params(0, 0))
    other = eng.open(2, seeds[:2])
    assert other.k[0].data_ptr() != busy.k[0].data_ptr()  # `busy` has not closed its episodes
    bigger = TorchEngine(tiny.model, tok)
    small = bigger.open(1, [1])
    small.close([0])
    assert bigger.open(3, [1, 2, 3]).k[0].shape[0] == 4  # more rows than the pool: a new cache


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_turn_sync_generate_equals_static_engine(tiny, temperature):
    tok = tiny.tokenizer
    params = SamplingParams(temperature=temperature, max_new_tokens=6, stop=("|",), stop_at_eos=False)
    seeds = list(range(40, 40 + len(PROMPTS)))
    a = turn_sync(TorchEngine(tiny.model, tok, max_batch=4, step_tokens=20).open(len(PROMPTS), seeds), tok,
                  lambda r, t: params, turns_of)
    b = turn_sync(StaticTorchEngine(tiny.model, tok).open(len(PROMPTS), seeds), tok, lambda r, t: params, turns_of)
    for r in a:
        assert [ids for ids, _ in a[r]] == [ids for ids, _ in b[r]]
        for (_, la), (_, lb) in zip(a[r], b[r], strict=True):
            assert la == pytest.approx(lb, abs=1e-4)


class CountEnv:
    """Ends after 1 + seed % 4 turns; rewards the number of characters of each action."""

    def reset(self, seed):
        self.seed, self.t = seed, 0
        return f"go {seed}\n"

    def step(self, action):
        self.t += 1
        done = self.t >= 1 + self.seed % 4
        return StepResult(observation=f"t{self.t}:" * (1 + self.seed % 3), reward=float(len(action)), done=done,
                          outcome="win" if done else "")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollout_equals_static_engine(tiny, temperature):
    """play_episodes steps each env as soon as its turn ends (the continuous engine) and gives the
    trajectories the turn-synchronous static engine gives."""
    params = SamplingParams(temperature=temperature, max_new_tokens=6, stop=(":",))
    kw = dict(seeds=list(range(8)), group_ids=[g // 2 for g in range(8)], params=params, max_context=256)
    a = rollout(TorchEngine(tiny.model, tiny.tokenizer, max_batch=3, step_tokens=12), CountEnv, **kw)
    b = rollout(make_engine("pytorch-static", tiny.model, tiny.tokenizer), CountEnv, **kw)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.loss_mask == y.loss_mask
        assert x.reward == y.reward and x.outcome == y.outcome and len(x.turns) == len(y.turns)
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


@pytest.mark.slow
def test_compiled_decode_equals_eager(tiny):
    tok = tiny.tokenizer
    params = SamplingParams(temperature=1.0, max_new_tokens=4, stop_at_eos=False)
    seeds = list(range(len(PROMPTS)))
    eager, _ = drive(TorchEngine(tiny.model, tok, max_batch=4).open(len(PROMPTS), seeds), tok,
                     lambda r, t: params, turns_of)
    comp_eng = TorchEngine(tiny.model, tok, max_batch=4, compile=True)
    comp, _ = drive(comp_eng.open(len(PROMPTS), seeds), tok, lambda r, t: params, turns_of)
    assert comp_eng._compiled is not None
    for r in eager:
        assert [ids for ids, _ in comp[r]] == [ids for ids, _ in eager[r]]
        for (_, la), (_, lb) in zip(comp[r], eager[r], strict=True):
            assert la == pytest.approx(lb, abs=1e-4)


def test_engine_mistakes(tiny):
    eng = TorchEngine(tiny.model, tiny.tokenizer)
    b = eng.open(2)
    b.submit({0: [5]}, SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="still generating"):
        b.submit({0: [6]}, SamplingParams())
    with pytest.raises(ValueError, match="step"):
        b.generate({1: [6]}, SamplingParams())
    with pytest.raises(ValueError, match="max_batch"):
        TorchEngine(tiny.model, tiny.tokenizer, max_batch=0)
    with pytest.raises(ValueError, match="pytorch-static"):
        TorchEngine(_Fake(), tiny.tokenizer)
    with pytest.raises(ValueError, match="pytorch-static"):
        make_engine("nope", tiny.model, tiny.tokenizer)


class _Fake(torch.nn.Module):
    class config:  # noqa: N801 - mimics an HF config attribute
        model_type = "gpt2"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_on_cuda_equals_hf_forward(tiny):
    import copy

    model = copy.deepcopy(tiny.model).cuda()
    tok = tiny.tokenizer
    params = SamplingParams(temperature=0, max_new_tokens=5, stop_at_eos=False)
    for compile_ in (False, True):
        eng = TorchEngine(model, tok, max_batch=4, step_tokens=32, compile=compile_)
        out, seqs = drive(eng.open(len(PROMPTS)), tok, lambda r, t: params, turns_of)
        for r, seq in seqs.items():
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=torch.tensor([seq], device="cuda")).logits[0].float(), -1)
            n_prompt = len(tok.encode(PROMPTS[r]))
            ids, lps = out[r][0]
            for j, (t, lp) in enumerate(zip(ids, lps, strict=True)):
                assert t == int(logp[n_prompt + j - 1].argmax())
                assert abs(logp[n_prompt + j - 1, t].item() - lp) < 1e-3


def drive_finishes(batch, tok, params, turns_of):
    """`drive`, recording (ids, logprobs, finish) per turn."""
    out = {r: [] for r in range(len(PROMPTS))}
    for r in range(len(PROMPTS)):
        batch.submit({r: tok.encode(PROMPTS[r])}, params(r, 0))
    while batch.busy:
        for r, g in batch.step().items():
            out[r].append((g.token_ids, g.logprobs, g.finish))
            if len(out[r]) >= turns_of(r):
                batch.close([r])
            else:
                batch.submit({r: tok.encode(obs_for(r, len(out[r])))}, params(r, len(out[r])))
    return out


def mixed_params(r, t):
    return SamplingParams(temperature=1.0 if (r + t) % 3 else 0.7, top_p=1.0 if r % 2 else 0.9,
                          max_new_tokens=3 + (5 * r + 3 * t) % 11, stop=("q", "z"))


def eos_tokenizer(tok):
    import copy

    tok = copy.copy(tok)
    tok.eos_id = tok.encode("e")[0]  # a frequent token, so turns end on eos too
    return tok


def test_decode_steps_change_no_token():
    """Blocks of 8 decode steps per host sync sample what one step per sync samples, and what the
    static engine samples, token for token: turns end mid-block on eos, a stop string or their
    length, two sampling settings share a block, and rows join as others leave."""
    from earl.runtime.hf_model import load_policy

    pol = load_policy("tiny", seed=0)
    tok, params = eos_tokenizer(pol.tokenizer), mixed_params
    seeds = [11 + 5 * r for r in range(len(PROMPTS))]
    turns = lambda r: 2 + r % 3  # noqa: E731
    runs = {}
    for k in (1, 8):
        eng = TorchEngine(pol.model, tok, max_batch=3, step_tokens=16, decode_steps=k)
        runs[k] = (drive_finishes(eng.open(len(PROMPTS), seeds), tok, params, turns), eng.stats)
    (one, s1), (eight, s8) = runs[1], runs[8]
    finishes = {f for r in eight for _, _, f in eight[r]}
    assert finishes == {"eos", "stop", "length"}
    for r in range(len(PROMPTS)):
        assert [(ids, f) for ids, _, f in eight[r]] == [(ids, f) for ids, _, f in one[r]], r
        for (_, la, _), (_, lb, _) in zip(eight[r], one[r], strict=True):
            assert la == pytest.approx(lb, abs=1e-5)
        b = StaticTorchEngine(pol.model, tok).open(1, [seeds[r]])
        inputs = tok.encode(PROMPTS[r])
        for t in range(turns(r)):
            g = b.generate({0: inputs}, params(r, t))[0]
            assert (g.token_ids, g.finish) == (eight[r][t][0], eight[r][t][2]), (r, t)
            assert g.logprobs == pytest.approx(eight[r][t][1], abs=1e-4)
            inputs = tok.encode(obs_for(r, t + 1))
    assert s1.generated_tokens == s8.generated_tokens == sum(len(ids) for r in one for ids, _, _ in one[r])
    assert s8.host_syncs < s1.host_syncs and s8.extra["discarded_tokens"] > 0


def test_host_syncs_per_block():
    """One row, 17 new tokens: the prefill step's sync, then one per block of decode steps (a
    block never runs past the turn's length limit)."""
    from earl.runtime.hf_model import load_policy

    pol = load_policy("tiny", seed=0)
    params = SamplingParams(temperature=1.0, max_new_tokens=17, stop_at_eos=False)
    for k, syncs in ((1, 17), (4, 5), (8, 3), (32, 2)):
        eng = TorchEngine(pol.model, pol.tokenizer, decode_steps=k)
        g = eng.open(1).generate({0: pol.tokenizer.encode("count me")}, params)[0]
        assert len(g.token_ids) == 17 and eng.stats.host_syncs == syncs, k
        assert eng.stats.forwards == 17 and eng.stats.extra.get("discarded_tokens", 0) == 0, k
    assert TorchEngine(pol.model, pol.tokenizer).decode_steps == 1  # the CPU's default
    with pytest.raises(ValueError, match="decode_steps"):
        TorchEngine(pol.model, pol.tokenizer, decode_steps=-1)


@pytest.mark.parametrize("mixed", [False, True])
def test_decode_step_traces_without_graph_breaks(tiny, mixed):
    """The compiled region (forward + sampling + the token fed back) is one graph: no graph
    break, so no host sync inside a block of decode steps."""
    eng = TorchEngine(tiny.model, tiny.tokenizer)
    b = eng.open(4)
    b._grow(64)
    if mixed:
        odd = torch.tensor([False, True, False, True])
        groups = ((eng.sampler(1.0, 0.9), ~odd), (eng.sampler(0.0, 1.0), odd))
    else:
        groups = ((eng.sampler(0.8, 1.0), None),)
    ids, slot, pos = torch.tensor([5, 6, 7, 8]), torch.arange(4), torch.tensor([3, 9, 0, 20])
    with torch.no_grad():
        ex = torch._dynamo.explain(eng.decode_step)(b.k, b.v, ids, slot, pos, b.seeds_t[slot], groups)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, ex.break_reasons


@pytest.mark.slow
def test_compiled_decode_blocks_equal_eager(tiny):
    """Compiled blocks of 8 decode steps (sampling in the graph, two sampling settings in one
    block, turns ending mid-block) equal eager single steps token for token."""
    tok = eos_tokenizer(tiny.tokenizer)
    seeds = [3 * r + 1 for r in range(len(PROMPTS))]
    out = {}
    for compile_, k in ((False, 1), (True, 8)):
        eng = TorchEngine(tiny.model, tok, max_batch=4, step_tokens=16, decode_steps=k, compile=compile_)
        out[compile_] = drive_finishes(eng.open(len(PROMPTS), seeds), tok, mixed_params, lambda r: 2 + r % 2)
    assert eng._compiled is not None
    for r in out[False]:
        assert [(i, f) for i, _, f in out[True][r]] == [(i, f) for i, _, f in out[False][r]], r
        for (_, la, _), (_, lb, _) in zip(out[True][r], out[False][r], strict=True):
            assert la == pytest.approx(lb, abs=1e-4)


@pytest.mark.slow
def test_compiled_decode_compiles_past_dynamo_default_limit(tiny):
    """More decode shapes (widths x cache capacities) than Dynamo's default recompile limit (8):
    every one still gets its own compiled graph instead of silently running eager, and each
    equals the eager step."""
    from torch._dynamo.utils import counters

    eng = TorchEngine(tiny.model, tiny.tokenizer, max_batch=8, compile=True, initial_capacity=16)
    eager = TorchEngine(tiny.model, tiny.tokenizer, max_batch=8, initial_capacity=16)
    groups = ((eng.sampler(0.0, 1.0), None),)
    graphs0 = counters["stats"]["unique_graphs"]
    shapes = [(w, cap) for cap in (16, 32, 48) for w in (1, 2, 4, 8)]  # 12 shapes
    for w, cap in shapes:
        args = []
        for e in (eng, eager):
            b = e.open(8)
            b._grow(cap)
            assert b.capacity == cap
            slot = torch.arange(w)
            args.append((e, b, slot))
        ids, pos = torch.arange(5, 5 + w), torch.arange(w)
        with torch.no_grad():  # as the engine's step() runs it
            (tc, lc), (te, le) = [e.decode_block(b.k, b.v, ids, slot, pos, b.seeds_t[slot], groups, 2)
                                  for e, b, slot in args]
        assert torch.equal(tc, te) and torch.allclose(lc, le, atol=1e-4)
    assert counters["stats"]["unique_graphs"] - graphs0 == len(shapes)
    assert eng.stats.extra["compiled_shapes"] == len(shapes)


def test_the_engine_registry_is_one_dict_and_base_imports_no_backend(tiny):
    """`ENGINES` (earl.runtime.engine) maps each name to its class; make_engine builds by it with
    the options each backend takes; the interface module never imports its own backends."""
    from earl.runtime.engine import ENGINES, VLLMEngine

    assert ENGINES == {"pytorch": TorchEngine, "pytorch-static": StaticTorchEngine, "vllm": VLLMEngine}
    built = make_engine("pytorch", tiny.model, tiny.tokenizer, reuse_kv=False, decode_steps=3)
    assert type(built) is TorchEngine and built.decode_steps == 3 and not built.reuse_kv
    assert type(make_engine("pytorch-static", tiny.model, tiny.tokenizer)) is StaticTorchEngine
    import ast

    import earl.runtime.engine.base as base

    tree = ast.parse(open(base.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith("earl.runtime.engine.") or m == "vllm"}, imported


@pytest.mark.parametrize("slots", [[3, 0, 2], [1, 0], [4, 2, 5, 3]])
def test_decode_rows_out_of_order_read_their_range_as_the_gather_does(tiny, slots):
    """Decode rows not in consecutive slot order (a gap, or out of order) attend over their
    slots' range as a view of the cache (`_slot_views`): the logits are those of the gathered copy bit
    for bit, in a pure decode forward and next to a prefill segment, and the range is refused
    where it would hold more than COVER_ROWS x the rows."""
    from earl.runtime.engine.pytorch import COVER_ROWS, _slot_views

    eng = TorchEngine(tiny.model, tiny.tokenizer)
    gen = torch.Generator().manual_seed(len(slots))
    shape = (8, 64, eng.kv_heads, eng.head_dim)
    k = [torch.randn(shape, generator=gen) for _ in range(eng.num_layers)]
    v = [torch.randn(shape, generator=gen) for _ in range(eng.num_layers)]
    n = len(slots)
    run, cover = _slot_views(slots)
    assert run is None and cover == slice(min(slots), max(slots) + 1)
    for seg in (0, 5):  # pure decode, then with a 5-token prefill segment of slot 7 after the rows
        ids = torch.randint(3, 60, (n + seg,), generator=gen)
        slot = torch.tensor(slots + [7] * seg)
        pos = torch.tensor([9 + 4 * i for i in range(n)] + list(range(seg)))
        segs = [(n, n + seg, 7, seg)] if seg else []
        out = torch.tensor(list(range(n)) + ([n + seg - 1] if seg else []))
        with torch.no_grad():
            gathered = eng.forward([x.clone() for x in k], [x.clone() for x in v], ids, slot, pos, n, 64, segs, out)
            ranged = eng.forward([x.clone() for x in k], [x.clone() for x in v], ids, slot, pos, n, 64, segs, out,
                                 None, cover)
        assert torch.equal(gathered, ranged)
    assert _slot_views([0, 7]) == (None, None) and COVER_ROWS * 2 < 8  # 8 slots for 2 rows: gathered
    assert _slot_views([0, 1, 2]) == (slice(0, 3), None)  # consecutive in order: the plain view
