"""Partial rollout (`schedule.partial_rollout = true`, earl.runtime.async_rl): the engine's
between-steps hook swaps weights with a turn in flight, the KV cache already made by the old
weights is kept, and every token's log-prob is the one of the weights that sampled it; an
`earl run --nproc 2` with partial rollout trains, keeps staleness <= K and records episodes
that span two policy versions.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_async_partial.py
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from earl.runtime.engine import SamplingParams, StaticTorchEngine, TorchEngine, set_between_steps
from earl.runtime.engine.base import copy_weights

SWAP_AT = 4  # the hook's 4th call: before the 4th forward of the turn (3 tokens sampled by the old weights)


def _hf_logprobs(model, ids: list[int], cache=None):
    """Log-probs of each next token of `ids` under HF's own forward (continuing `cache`), and the cache."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids)[None], cache=cache, use_cache=True)
    return torch.log_softmax(out.logits[0].float(), -1), out.past_key_values


def test_swap_between_decode_steps_keeps_the_kv_and_logs_the_new_weights(tiny):
    """Tokens sampled after the swap carry the new weights' log-probs given the kept cache (the
    old weights' K/V of the prefix, then the new weights' from the swap on), checked against HF's
    own cached forward; tokens before it carry the old weights'."""
    old = tiny.model.eval()
    new = copy.deepcopy(old)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.2 * p.abs().mean() * torch.randn(p.shape, generator=g))
    run = copy.deepcopy(old)  # the module the engine runs: it gets new's weights mid-turn
    eng = TorchEngine(run, tiny.tokenizer, decode_steps=1)
    calls = []

    def between_steps():
        calls.append(len(calls))
        if len(calls) == SWAP_AT:
            copy_weights(run, new.named_parameters())

    set_between_steps(eng, between_steps)
    prompt = tiny.tokenizer.encode("a prompt of a few tokens")
    params = SamplingParams(temperature=1.0, max_new_tokens=10, stop_at_eos=False)
    gen = eng.open(1, seeds=[7]).generate({0: prompt}, params)[0]
    assert len(gen.token_ids) == 10 and len(calls) == 10  # one call per forward
    ids = prompt + gen.token_ids
    n_old = SWAP_AT - 1  # tokens sampled before the swap
    # the old weights made the K/V of the prompt and of the first n_old - 1 tokens; the last
    # old-sampled token enters the cache with the first forward after the swap
    cut = len(prompt) + n_old - 1
    lp_old, cache = _hf_logprobs(old, ids[:cut])
    lp_new, _ = _hf_logprobs(new, ids[cut:], cache=cache)
    lp_full_old, _ = _hf_logprobs(old, ids)
    for i, tok in enumerate(gen.token_ids):
        pos = len(prompt) + i  # position of token i; its log-prob comes from the logits at pos - 1
        want = lp_old[pos - 1, tok] if pos - 1 < cut else lp_new[pos - 1 - cut, tok]
        assert abs(gen.logprobs[i] - float(want)) < 1e-4, (i, gen.logprobs[i], float(want))
        if i >= n_old:  # the swap mattered: the old weights would have logged other values
            assert abs(gen.logprobs[i] - float(lp_full_old[pos - 1, tok])) > 1e-3, i
    set_between_steps(eng, None)
    eng.open(1, seeds=[7]).generate({0: prompt}, params)
    assert len(calls) == 10  # detached


def test_engines_without_the_hook_say_so(tiny):
    with pytest.raises(ValueError, match="cannot call back between decode steps.*engine 'pytorch'"):
        set_between_steps(StaticTorchEngine(tiny.model, tiny.tokenizer), lambda: None)


def _rows(out, name):
    return [json.loads(x) for x in (out / name).read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.dist
def test_earl_run_nproc2_partial_rollout(tmp_path):
    """--nproc 2, K=1, partial rollout: trains, staleness (of an episode's oldest token) <= 1, and
    the workload trace shows episodes whose tokens span two versions; push equality still holds."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--quiet", "--nproc", "2", "--steps", "4", "--out",
                        str(out), "--set", "groups=4", "--set", "plots=false", "--set", "checkpoints=false",
                        "--set", "schedule.mode=async", "--set", "schedule.max_staleness=1",
                        "--set", "schedule.partial_rollout=true", "--set", "sampling.max_new_tokens=48"],
                       capture_output=True, text=True, timeout=600,
                       # decode steps of 20 ms (a test hook): episodes outlast a training step, so
                       # pushes land mid-episode whatever the host's load
                       env={**os.environ, "OMP_NUM_THREADS": "1", "EARL_SLOW_DECODE_S": "0.02"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(out, "metrics.jsonl")
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    for x in rows:
        assert 0 <= x["staleness_mean"] <= x["staleness_max"] <= 1
        assert x["train_tokens"] > 0 and math.isfinite(x["loss"])
    spanning = []
    for rec in _rows(out, "workload.jsonl"):
        for e in rec["episodes"]:
            assert rec["step"] - 1 - e["version_first"] <= 1  # the bound, on the oldest token
            assert e["version_first"] <= e["version_last"] <= rec["step"] - 1  # step s trains after it is played
            if e["version_last"] > e["version_first"]:
                spanning.append((rec["step"], e["id"]))
    assert spanning, "no episode spanned a weight swap"
    assert sum(x["episodes_spanning_versions"] for x in rows) == len(spanning)
    info = json.loads((out / "async.json").read_text())
    assert info["weights_equal"]
