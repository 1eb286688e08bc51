"""The generation engine: batched sampling with a per-episode KV cache kept across turns.

An `EpisodeBatch` holds the episodes opened together. Each `generate` call is one turn: it
prefills only the tokens that are new since the episode's last turn (the last sampled token plus
the new observation), then decodes every requested episode together until each hits a stop
string, EOS or `max_new_tokens`. Rows of different lengths share one cache: padding slots are
masked out and positions are tracked per row, so every episode sees exactly its own tokens.
With `reuse_kv=False` each turn re-prefills the whole context instead (the baseline that
`benchmarks/bench_engine.py` compares against).

    python benchmarks/bench_engine.py
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from earl.runtime.model import cache_kwarg
from earl.runtime.tokenizer import Tokenizer


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]
    max_new_tokens: int = 16  # tokens generated per turn, at most
    stop: tuple[str, ...] = ()  # stop strings (checked on the decoded text of this turn)
    stop_at_eos: bool = True  # stop when the tokenizer's EOS id is sampled

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def logprob_temperature(self) -> float:
        """The temperature the reported log-probs use (1 for greedy)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Generation:
    """One turn of one episode. `logprobs[i]` is log p(token_ids[i]) under the model's softmax
    at `SamplingParams.logprob_temperature` (before top-p truncation)."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish: str  # "stop" | "eos" | "length"


@dataclass
class EngineStats:
    prefill_tokens: int = 0  # real tokens run through prefill
    decode_tokens: int = 0  # real tokens run through decode steps
    generated_tokens: int = 0  # tokens sampled
    forwards: int = 0  # model calls
    prefill_s: float = 0.0
    decode_s: float = 0.0
    extra: dict = field(default_factory=dict)


class EpisodeBatch(Protocol):
    def generate(self, inputs: dict[int, list[int]], params: SamplingParams) -> dict[int, Generation]: ...

    def close(self, rows: Iterable[int]) -> None: ...


class Engine(Protocol):
    """A generation backend. `open(n, seeds)` starts n episodes (rows 0..n-1) sharing a batch;
    row i samples from its own random stream `seeds[i]` (default: i)."""

    tokenizer: Tokenizer
    stats: EngineStats

    def open(self, n: int, seeds: Sequence[int] | None = None) -> EpisodeBatch: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...


_MASK64 = (1 << 64) - 1


def _as_i64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores (same bits)."""
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _as_i64(0x9E3779B97F4A7C15)
_MIX1 = _as_i64(0xBF58476D1CE4E5B9)
_MIX2 = _as_i64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic)."""
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def counter_uniform(seeds_A: torch.Tensor, positions_A: torch.Tensor, width: int) -> torch.Tensor:
    """[A, width] float64 uniforms in (0, 1), a pure function of (row seed, position, column).

    Counter-based randomness: a token's noise depends only on its episode's seed and where it
    sits in the episode, never on which other episodes share the batch, which process plays the
    episode, or how many tokens were drawn before. So a run samples the same tokens on one
    process or many, with any engine batch size."""
    dev = seeds_A.device
    row = _mix64(_mix64(seeds_A.long() * _GOLDEN + 1) + positions_A.long() * _MIX1)
    cols = torch.arange(width, device=dev, dtype=torch.long) * _GOLDEN
    bits = _shr(_mix64(row[:, None] + cols[None, :]), 11)  # 53 random bits
    return (bits.double() + 0.5) / float(1 << 53)


def sample_tokens(logits_AV: torch.Tensor, params: SamplingParams, seeds_A: torch.Tensor | None = None,
                  positions_A: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token ids, their log-probs).

    Gumbel-max over the (top-p truncated) distribution with counter-based noise
    (`counter_uniform`): row i draws from its own stream `seeds_A[i]` at `positions_A[i]`."""
    logits = logits_AV.float()
    logp_all = torch.log_softmax(logits / params.logprob_temperature, dim=-1)
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        if seeds_A is None or positions_A is None:
            raise ValueError("sampling at temperature > 0 needs a seed and a position per row")
        scores = logp_all.double()
        if params.top_p < 1:
            sorted_p, order = logp_all.exp().sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keep the smallest nucleus
            scores = scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        u = counter_uniform(seeds_A.to(logits.device), positions_A.to(logits.device), logits.shape[-1])
        tokens = (scores - torch.log(-torch.log(u))).argmax(dim=-1)
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)


def new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


class TorchEpisodeBatch:
    """Episodes sharing one batched KV cache (see the module docstring)."""

    def __init__(self, engine: TorchEngine, n: int, seeds: Sequence[int] | None = None):
        if n < 1:
            raise ValueError(f"an episode batch needs at least one episode, got {n}")
        if seeds is not None and len(seeds) != n:
            raise ValueError(f"{n} episodes need {n} seeds, got {len(seeds)}")
        self.engine = engine
        self.seeds = [int(s) for s in seeds] if seeds is not None else list(range(n))
        self.rows = list(range(n))  # open rows in cache order
        self.history: dict[int, list[int]] = {r: [] for r in self.rows}
        self.unfed: dict[int, list[int]] = {r: [] for r in self.rows}  # in history, not in cache
        self.closed: set[int] = set()
        self._reset_cache()

    def _reset_cache(self) -> None:
        dev = self.engine.device
        self.cache = new_cache(self.engine.model)
        self.mask = torch.zeros(len(self.rows), 0, dtype=torch.bool, device=dev)
        self.next_pos = torch.zeros(len(self.rows), dtype=torch.long, device=dev)
        for r in self.rows:
            self.unfed[r] = list(self.history[r])

    def close(self, rows: Iterable[int]) -> None:
        self.closed.update(rows)

    def _compact(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if r not in self.closed]
        if len(keep) == len(self.rows):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.engine.device)
        if self.mask.shape[1]:
            self.cache.batch_select_indices(idx)
        self.mask, self.next_pos = self.mask[idx], self.next_pos[idx]
        self.rows = [self.rows[i] for i in keep]

    def _forward(self, ids_BS: torch.Tensor, new_mask_BS: torch.Tensor) -> torch.Tensor:
        eng = self.engine
        pos = self.next_pos[:, None] + (new_mask_BS.long().cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask_BS], dim=1)
        out = eng.model(input_ids=ids_BS, attention_mask=self.mask.long(), position_ids=pos,
                        use_cache=True, **{eng.cache_kw: self.cache})
        self.next_pos += new_mask_BS.sum(1)
        eng.stats.forwards += 1
        return out.logits

    @torch.no_grad()
    def generate(self, inputs: dict[int, list[int]], params: SamplingParams) -> dict[int, Generation]:
        eng, dev = self.engine, self.engine.device
        bad = sorted(set(inputs) - set(self.rows) | (set(inputs) & self.closed))
        if bad:
            raise ValueError(f"rows {bad} are not open in this episode batch")
        self._compact()
        for r, toks in inputs.items():
            self.history[r].extend(toks)
            self.unfed[r].extend(toks)
        if not eng.reuse_kv:
            self._reset_cache()
        fresh = self.mask.shape[1] == 0
        if fresh and any(r not in inputs for r in self.rows):
            raise ValueError("every open row must take part in an episode batch's first turn "
                             "(and in every turn when reuse_kv=False)")
        req = [i for i, r in enumerate(self.rows) if r in inputs]
        segs = [self.unfed[r] if r in inputs else [] for r in self.rows]
        if any(not segs[i] for i in req):
            raise ValueError("an episode's first turn needs at least one prompt token")

        # prefill: only the tokens not yet in the cache, right-padded within this segment
        t0 = time.perf_counter()
        width = max(len(s) for s in segs)
        ids = torch.full((len(self.rows), width), eng.tokenizer.pad_id, dtype=torch.long)
        new_mask = torch.zeros(len(self.rows), width, dtype=torch.bool)
        for i, s in enumerate(segs):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            new_mask[i, :len(s)] = True
        logits = self._forward(ids.to(dev), new_mask.to(dev))
        last = torch.tensor([len(segs[i]) - 1 for i in req], device=dev)
        req_t = torch.tensor(req, device=dev)
        next_logits = logits[req_t, last]
        for i in req:
            self.unfed[self.rows[i]] = []
        eng.stats.prefill_tokens += sum(len(s) for s in segs)
        eng.stats.prefill_s += time.perf_counter() - t0

        # decode all requested rows together
        t0 = time.perf_counter()
        out = {self.rows[i]: Generation([], [], "", "length") for i in req}
        active = list(req)
        while True:
            rows = [self.rows[i] for i in active]
            toks, lps = sample_tokens(next_logits, params, torch.tensor([self.seeds[r] for r in rows]),
                                      torch.tensor([len(self.history[r]) for r in rows]))
            toks_l, lps_l = toks.tolist(), lps.tolist()
            still = []
            for j, i in enumerate(active):
                r, g = self.rows[i], out[self.rows[i]]
                g.token_ids.append(toks_l[j])
                g.logprobs.append(lps_l[j])
                self.history[r].append(toks_l[j])
                finish = self._finish(g, params)
                if finish:
                    g.finish = finish
                    self.unfed[r] = [toks_l[j]]  # enters the cache with the next turn
                else:
                    still.append((i, toks_l[j]))
            eng.stats.generated_tokens += len(active)
            if not still:
                break
            ids = torch.full((len(self.rows), 1), eng.tokenizer.pad_id, dtype=torch.long)
            new_mask = torch.zeros(len(self.rows), 1, dtype=torch.bool)
            for i, t in still:
                ids[i, 0] = t
                new_mask[i, 0] = True
            logits = self._forward(ids.to(dev), new_mask.to(dev))
            active = [i for i, _ in still]
            next_logits = logits[torch.tensor(active, device=dev), -1]
            eng.stats.decode_tokens += len(active)
        for g in out.values():
            g.text = eng.tokenizer.decode(g.token_ids)
        eng.stats.decode_s += time.perf_counter() - t0
        return out

    def _finish(self, g: Generation, params: SamplingParams) -> str:
        tok = self.engine.tokenizer
        if params.stop_at_eos and tok.eos_id is not None and g.token_ids[-1] == tok.eos_id:
            return "eos"
        if params.stop and any(s in tok.decode(g.token_ids) for s in params.stop):
            return "stop"
        if len(g.token_ids) >= params.max_new_tokens:
            return "length"
        return ""


class TorchEngine:
    """The built-in PyTorch backend. It runs the module it is given (on one process, the very
    module the trainer updates, so weight sync is free)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.reuse_kv = reuse_kv
        self.cache_kw = cache_kwarg(model)
        self.stats = EngineStats()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def open(self, n: int, seeds: Sequence[int] | None = None) -> TorchEpisodeBatch:
        return TorchEpisodeBatch(self, n, seeds)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, t in named_tensors:
            if name not in params:
                raise ValueError(f"update_weights: unknown parameter {name!r}")
            if params[name].data_ptr() != t.data_ptr():
                params[name].copy_(t)


ENGINES = ("pytorch", "vllm")


def make_engine(name: str, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool = True,
                model_path: str | None = None) -> Engine:
    if name == "pytorch":
        return TorchEngine(model, tokenizer, reuse_kv=reuse_kv)
    if name == "vllm":
        from earl.runtime.engine_vllm import VLLMEngine

        return VLLMEngine(model_path=model_path, tokenizer=tokenizer)
    raise ValueError(f"engine {name!r} unknown; valid: {', '.join(ENGINES)}")
