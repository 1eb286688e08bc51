"""The static PyTorch engine (`engine="pytorch-static"`): episodes sharing one padded, growing
HF `DynamicCache`, kept across turns, turn-synchronous.

The first built-in engine, kept as the baseline `benchmarks/bench_engine.py` measures the
continuous-batching engine (`earl.runtime.engine.pytorch`) against, and as the fallback for HF
architectures that engine does not drive (it runs any causal LM through its own forward).

Each `generate` call is one turn: it prefills only the tokens that are new since the episode's
last turn (the last sampled token plus the new observation), then decodes every requested
episode together until each hits a stop string, EOS or `max_new_tokens`. Rows of different
lengths share one cache: padding slots are masked out and positions are tracked per row, so
every episode sees exactly its own tokens. With `reuse_kv=False` each turn re-prefills the whole
context instead (the baseline `benchmarks/bench_engine.py` compares against).

    python benchmarks/bench_engine.py
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

from earl.runtime.engine.base import (
    EngineStats,
    Generation,
    SamplingParams,
    copy_weights,
    finish_reason,
    sample_tokens,
)
from earl.runtime.hf_model import cache_kwarg
from earl.runtime.tokenizer import Tokenizer


def new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


class StaticEpisodeBatch:
    """Episodes sharing one batched KV cache (see the module docstring)."""

    def __init__(self, engine: StaticTorchEngine, n: int, seeds: Sequence[int] | None = None):
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
                                      torch.tensor([len(self.history[r]) for r in rows]),
                                      vocab_size=eng.tokenizer.vocab_size)
            toks_l, lps_l = toks.tolist(), lps.tolist()
            still = []
            for j, i in enumerate(active):
                r, g = self.rows[i], out[self.rows[i]]
                g.token_ids.append(toks_l[j])
                g.logprobs.append(lps_l[j])
                self.history[r].append(toks_l[j])
                finish = finish_reason(eng.tokenizer, g, params)
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


class StaticTorchEngine:
    """The static PyTorch backend. It runs the module it is given (on one process, the very
    module the trainer updates, so weight sync is free)."""

    @classmethod
    def build(cls, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool, **_ignored) -> StaticTorchEngine:
        """`make_engine`'s constructor: the options this backend takes."""
        return cls(model, tokenizer, reuse_kv=reuse_kv)

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.reuse_kv = reuse_kv
        self.cache_kw = cache_kwarg(model)
        self.stats = EngineStats()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def open(self, n: int, seeds: Sequence[int] | None = None) -> StaticEpisodeBatch:
        return StaticEpisodeBatch(self, n, seeds)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights(self.model, named_tensors)
