"""The vLLM generation backend behind the same `Engine` interface (optional: `pip install 'earl[vllm]'`).

Why it exists: on a GPU, vLLM's paged KV cache, continuous batching and CUDA graphs decode far
faster than an HF-eager loop, and an RL run spends most of its time decoding. This module is
imported only when `engine = "vllm"` is configured; without the package the run stops with one
line (`ValueError`) naming the extra to install.

It follows vLLM's own RLHF examples (examples/offline_inference/rlhf_colocate.py and
rlhf_utils.py; the same pattern in examples/rl/) and uses only vLLM's public surface:

- **Weights** go trainer -> engine through `LLM.collective_rpc` into `WorkerExtension`, a class
  vLLM mixes into its worker (`worker_extension_cls=`, by qualified name). The trainer packs
  its named tensors into flat byte buckets; a CUDA bucket crosses to vLLM's engine process as a
  CUDA IPC handle (no copy through the host), a CPU bucket as a plain tensor. The worker unpacks
  views and calls the model's own `load_weights` (which maps HF names onto vLLM's fused
  q/k/v and gate/up weights). After the last bucket every vLLM parameter must have been
  written, else the update fails loudly. Nothing reaches into `llm.llm_engine`.
- **Memory**: `LLM(enable_sleep_mode=True)`; `sleep()` (level 2: weights and KV cache freed,
  since the next sync rewrites every weight) runs when the rollout is over, and
  `update_weights` wakes the weights, loads them, then wakes the KV cache.
- **Sampling**: one vLLM seed per request, derived from the episode's sampling stream and its
  position in the episode (`request_seed`), so members of a GRPO group never collapse to the
  same samples and an episode's tokens do not depend on the batch it shares.
- **Log-probs** come from the engine run with `logprobs_mode="processed_logprobs"`: the
  log-softmax of the logits the sampler actually drew from (after temperature), not the raw
  temperature-1 ones. For greedy requests vLLM applies no temperature, matching
  `SamplingParams.logprob_temperature` (1). With `top_p < 1` vLLM's processed log-probs are
  those of the nucleus-renormalised distribution, whereas the built-in engine reports them
  before truncation: the two backends agree only at `top_p = 1`.
- **Vocabulary**: a model's embedding is often padded past its tokenizer (Qwen2.5: 151,936 rows,
  151,665 tokens). The built-in engine samples and normalises over the tokenizer's ids only
  (`sample_tokens(vocab_size=...)`); here the padding ids get a logit bias of -100
  (`vocab_mask_bias`), which vLLM's sampler applies before it draws and before its processed
  log-probs. vLLM clamps a bias to [-100, 100], so this is not -inf: each padding id keeps
  exp(-100 / T) of the mass, under 4e-44 relative at T <= 1 (2e-22 at T = 2), far below a bf16
  or fp32 log-prob's resolution. A bias map of the ~300 padding ids costs vLLM nothing per
  request, where `allowed_token_ids` would be a 151K-entry list validated per request.
- **Finish reasons** (`finish_reason`): vLLM's ("stop" + `stop_reason`) is mapped to earl's
  "stop" (a stop string), "eos" (an end-of-sequence token) and "length" (`max_new_tokens`).
- **Cross-turn reuse**: each turn re-sends the episode's whole token history and vLLM's
  automatic prefix caching reuses the cached blocks; the cache is reset after every weight
  update (cached KV of the previous policy would be stale).

What has run: the pure parts (sampling-parameter building, the vocabulary bias, seed derivation,
finish-reason mapping, bucket packing and the worker-side loading into a real torch module) in
tests/runtime/test_engine_vllm.py on CPU. NOT run: anything that imports vllm (the engine
itself, the worker extension inside vLLM, the CUDA IPC path, sleep/wake): vLLM is not
installable on the development machine and not present on the GPU machine; those tests are
marked `gpu`, need `EARL_VLLM_TEST_MODEL` (a local HF checkpoint directory with a tokenizer), and
skip otherwise. One process only (not under `--nproc`); unquantized models only (no
`process_weights_after_loading` after an update).

    EARL_VLLM_TEST_MODEL=/path/to/Qwen2.5-0.5B-Instruct python -m pytest -m gpu tests/runtime/test_engine_vllm.py
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

from earl.runtime.engine.base import _GOLDEN, _MIX1, EngineStats, Generation, SamplingParams, _mix64
from earl.runtime.tokenizer import Tokenizer

WORKER_EXTENSION = "earl.runtime.engine.vllm.WorkerExtension"  # qualified name vLLM imports
SLEEP_LEVEL = 2  # weights and KV cache freed while training: the next sync rewrites every weight
BUCKET_BYTES = 256 << 20  # bytes per weight bucket sent to vLLM in one collective_rpc call
_ALIGN_BYTES = 256  # each tensor starts on a 256-byte boundary inside its bucket (as vLLM's example)
GPU_MEMORY_UTILIZATION = 0.4  # vLLM's share of the GPU (weights + KV): the trainer shares the device


# ---- pure helpers: plain data in, plain data out (tested without vllm) -------------------------------
def request_seed(episode_seed: int, position: int) -> int:
    """The vLLM seed of one request: a splitmix64 hash of the episode's sampling stream and the
    episode length at which this turn starts (the same row hash `counter_uniform` uses), so two
    episodes or two turns of one episode never share a seed. In [0, 2**63)."""
    s = torch.tensor([int(episode_seed)], dtype=torch.long)
    p = torch.tensor([int(position)], dtype=torch.long)
    return int(_mix64(_mix64(s * _GOLDEN + 1) + p * _MIX1).item()) & ((1 << 63) - 1)


VOCAB_MASK_BIAS = -100.0  # the most negative logit bias vLLM accepts (it clamps to [-100, 100])


def vocab_mask_bias(tokenizer_vocab: int, model_vocab: int) -> dict[int, float]:
    """vLLM `logit_bias` that keeps the sampler off the model's padding ids (those at or past the
    tokenizer's size); empty when the two sizes agree."""
    if tokenizer_vocab > model_vocab:
        raise ValueError(f"the tokenizer has {tokenizer_vocab} tokens but the model's vocabulary only "
                         f"{model_vocab}: they do not belong together")
    return dict.fromkeys(range(tokenizer_vocab, model_vocab), VOCAB_MASK_BIAS)


def vllm_sampling_kwargs(params: SamplingParams, *, seed: int, eos_id: int | None,
                         logit_bias: dict[int, float] | None = None) -> dict:
    """Keyword arguments of `vllm.SamplingParams` for one request of one turn (`logit_bias`: from
    `vocab_mask_bias`, left out when empty)."""
    greedy = params.temperature == 0
    extra = {"logit_bias": logit_bias} if logit_bias else {}
    return {**extra,
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "seed": None if greedy else seed,  # greedy needs no generator (and keeps FlashInfer usable)
        "stop": list(params.stop),
        # earl stops at its tokenizer's EOS; vLLM also stops at the model's generation-config EOS ids
        "stop_token_ids": [eos_id] if params.stop_at_eos and eos_id is not None else [],
        "ignore_eos": not params.stop_at_eos,
        "include_stop_str_in_output": True,  # earl's text is the decode of every generated token
        "logprobs": 0,  # the sampled token's log-prob only (processed: see the module docstring)
    }


def earl_finish(finish_reason: str | None, stop_reason: int | str | None) -> str:
    """vLLM's (finish_reason, stop_reason) -> earl's "stop" | "eos" | "length".

    vLLM reports "stop" for both a stop string (stop_reason: the string) and an end token
    (stop_reason: None for the EOS, else the stop token id); "length" at max_tokens."""
    if finish_reason == "length":
        return "length"
    if finish_reason == "stop":
        return "stop" if isinstance(stop_reason, str) else "eos"
    raise RuntimeError(f"vLLM ended a request with finish_reason={finish_reason!r} "
                       "(expected 'stop' or 'length'): was it aborted?")


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a possibly sharded one (a DTensor is gathered: a collective)."""
    full = getattr(t, "full_tensor", None)  # DTensor only
    return (full() if full is not None else t).detach()


def _padded(nbytes: int) -> int:
    return (nbytes + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES


def bucket_named_tensors(named: Iterable[tuple[str, torch.Tensor]],
                         max_bytes: int = BUCKET_BYTES) -> list[list[tuple[str, torch.Tensor]]]:
    """Group named tensors, in order, into buckets of at most `max_bytes` (a larger tensor gets
    a bucket of its own)."""
    buckets: list[list[tuple[str, torch.Tensor]]] = []
    cur: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = _padded(t.numel() * t.element_size())
        if cur and size + n > max_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        buckets.append(cur)
    return buckets


def pack_bucket(named: Sequence[tuple[str, torch.Tensor]]) -> tuple[list[dict], torch.Tensor]:
    """One flat uint8 buffer (on the tensors' device) and its table of contents: per tensor its
    name, dtype name, shape and byte offset. Plain data, so it crosses any process boundary."""
    if not named:
        raise ValueError("pack_bucket needs at least one tensor")
    device = named[0][1].device
    meta, offset = [], 0
    for name, t in named:
        meta.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                     "offset": offset})
        offset += _padded(t.numel() * t.element_size())
    flat = torch.empty(offset, dtype=torch.uint8, device=device)
    for m, (_, t) in zip(meta, named, strict=True):
        n = t.numel() * t.element_size()
        flat[m["offset"]:m["offset"] + n].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return meta, flat


def unpack_bucket(meta: Sequence[dict], flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views into `flat`, one per entry of `meta` (no copy)."""
    out = []
    for m in meta:
        dtype = getattr(torch, m["dtype"])
        shape = torch.Size(m["shape"])
        n = shape.numel() * torch.empty((), dtype=dtype).element_size()
        out.append((m["name"], flat[m["offset"]:m["offset"] + n].view(dtype).view(shape)))
    return out


def load_named_tensors(model: torch.nn.Module, named: list[tuple[str, torch.Tensor]]) -> set[str] | None:
    """Write `named` into `model`; return the parameter names written (None: not reported).

    A vLLM model has `load_weights` (HF names -> its fused layouts; it returns the names it
    loaded); any other module is written parameter by parameter under the same names."""
    if hasattr(model, "load_weights"):
        loaded = model.load_weights(weights=named)
        return set(loaded) if loaded is not None else None
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in named:
            if name not in params:
                raise ValueError(f"weight {name!r} is not a parameter of the engine's model")
            if params[name].shape != t.shape:
                raise ValueError(f"weight {name!r} has shape {tuple(t.shape)}, the engine's model "
                                 f"{tuple(params[name].shape)}")
            params[name].copy_(t)
    return {n for n, _ in named}


def receive_bucket(model: torch.nn.Module, meta: Sequence[dict], buffer, device: torch.device) -> set[str] | None:
    """The worker's half of one bucket: `buffer` is a uint8 tensor or a CUDA IPC handle
    (`torch.multiprocessing.reductions.reduce_tensor` of one) made by another process."""
    if isinstance(buffer, torch.Tensor):
        flat = buffer.to(device)
    else:  # (rebuild function, args); args[6] is the device index in the sender's numbering
        func, args = buffer
        args = list(args)
        args[6] = device.index
        flat = func(*args)
    return load_named_tensors(model, unpack_bucket(meta, flat))


class WorkerExtension:
    """Mixed by vLLM into its worker class (`worker_extension_cls=WORKER_EXTENSION`); called
    through `LLM.collective_rpc("earl_...")`. `self.model_runner` and `self.device` belong to the
    vLLM worker, as in vLLM's rlhf_utils.WorkerExtension."""

    def earl_load_bucket(self, meta: list[dict], buffer) -> None:
        loaded = receive_bucket(self.model_runner.model, meta, buffer, self.device)
        seen = getattr(self, "_earl_loaded", set())
        self._earl_loaded = None if loaded is None or seen is None else seen | loaded

    def earl_finish_weights(self) -> list[str]:
        """Parameter names of the vLLM model that this update did not write (empty when the
        model's loader does not report names)."""
        loaded, self._earl_loaded = getattr(self, "_earl_loaded", set()), set()
        if loaded is None:
            return []
        return sorted(n for n, _ in self.model_runner.model.named_parameters() if n not in loaded)


# ---- the engine ------------------------------------------------------------------------------------
class VLLMEpisodeBatch:
    def __init__(self, engine: VLLMEngine, n: int, seeds: Sequence[int] | None = None):
        self.engine = engine
        self.seeds = [int(s) for s in seeds] if seeds is not None else list(range(n))
        if len(self.seeds) != n:
            raise ValueError(f"open({n}) got {len(self.seeds)} seeds")
        self.history: dict[int, list[int]] = {r: [] for r in range(n)}
        self.closed: set[int] = set()

    def close(self, rows: Iterable[int]) -> None:
        self.closed.update(rows)

    def generate(self, inputs: dict[int, list[int]], params: SamplingParams) -> dict[int, Generation]:
        from vllm import SamplingParams as VLLMSamplingParams

        eng = self.engine
        eng.ensure_awake()
        bad = sorted(set(inputs) - set(self.history) | (set(inputs) & self.closed))
        if bad:
            raise ValueError(f"rows {bad} are not open in this episode batch")
        rows = sorted(inputs)
        for r in rows:
            self.history[r].extend(inputs[r])
        eos = eng.tokenizer.eos_id
        sps = [VLLMSamplingParams(**vllm_sampling_kwargs(
            params, seed=request_seed(self.seeds[r], len(self.history[r])), eos_id=eos,
            logit_bias=eng.vocab_bias)) for r in rows]
        prompts = [{"prompt_token_ids": list(self.history[r])} for r in rows]
        outs = eng.llm.generate(prompts, sps, use_tqdm=False)
        result = {}
        for r, o in zip(rows, outs, strict=True):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(pos[t].logprob) for pos, t in zip(c.logprobs, ids, strict=True)]
            cached = o.num_cached_tokens or 0
            eng.stats.prefill_tokens += len(self.history[r]) - cached
            eng.stats.extra["prefix_cached_tokens"] = eng.stats.extra.get("prefix_cached_tokens", 0) + cached
            self.history[r].extend(ids)
            result[r] = Generation(ids, lps, eng.tokenizer.decode(ids), earl_finish(c.finish_reason, c.stop_reason))
            eng.stats.generated_tokens += len(ids)
            eng.stats.decode_tokens += max(0, len(ids) - 1)
        return result


class VLLMEngine:
    """A local HF checkpoint directory served by `vllm.LLM` in this process's GPU (prefix
    caching, sleep mode, processed log-probs, earl's worker extension)."""

    model = None  # no in-process torch module: the runtime pushes weights with update_weights

    def __init__(self, *, model_path: str | None, tokenizer: Tokenizer, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError:
            raise ValueError("engine 'vllm' needs the vllm package: pip install 'earl[vllm]'") from None
        if not model_path:
            raise ValueError("engine 'vllm' needs a local HF checkpoint directory as model.path")
        # CUDA IPC handles hold a rebuild function: vLLM pickles them only when allowed
        # (as its rlhf_ipc example does); the variable must be set before the engine starts
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        kwargs = {"enable_prefix_caching": True, "enable_sleep_mode": True,
                  "logprobs_mode": "processed_logprobs", "worker_extension_cls": WORKER_EXTENSION,
                  "gpu_memory_utilization": GPU_MEMORY_UTILIZATION, **llm_kwargs}
        from transformers import AutoConfig

        model_vocab = AutoConfig.from_pretrained(model_path).vocab_size  # a local file: no network
        self.vocab_bias = vocab_mask_bias(tokenizer.vocab_size, model_vocab)  # before vLLM loads
        self.llm = LLM(model=model_path, **kwargs)
        self.tokenizer = tokenizer
        self.stats = EngineStats()
        self.asleep = False

    def open(self, n: int, seeds: Sequence[int] | None = None) -> VLLMEpisodeBatch:
        return VLLMEpisodeBatch(self, n, seeds)

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache) until the next `update_weights`."""
        if not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True

    def ensure_awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the vLLM engine sleeps (its weights were freed): push weights with "
                               "update_weights before generating")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the trainer's weights (HF names) into vLLM, waking it if it sleeps."""
        from torch.multiprocessing.reductions import reduce_tensor

        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        for bucket in bucket_named_tensors((n, _full(t)) for n, t in named_tensors):
            meta, flat = pack_bucket(bucket)
            payload = reduce_tensor(flat) if flat.is_cuda else flat
            self.llm.collective_rpc("earl_load_bucket", args=(meta, payload))
            if flat.is_cuda:
                torch.cuda.synchronize()
            del flat
        missing = sorted({n for names in self.llm.collective_rpc("earl_finish_weights") for n in names})
        if missing:
            raise RuntimeError(f"weight update left {len(missing)} vLLM parameters unwritten, "
                               f"e.g. {missing[:3]}: do the trainer's names match the checkpoint's?")
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached KV was computed by the previous weights
