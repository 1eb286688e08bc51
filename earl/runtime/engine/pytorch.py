"""The built-in PyTorch engine: a preallocated slot KV cache, continuous batching, sampling on
the device, and an optional compiled decode step.

Each episode owns one slot of a preallocated cache, so its KV stays put across turns and a turn
prefills only its new tokens. Episodes are driven step by step (`submit`, `step`); an episode
whose turn ends leaves the decode batch at once and a waiting one joins the next step, so the
batch never idles on the longest turn. `generate` (one whole turn) is `submit` + `step` until
done. It runs the HF model's own modules with our attention over the slots (Qwen2 / Llama);
other models run on `engine="pytorch-static"`. Why our own attention, decode blocks
(`decode_steps`), the compiled step and what was measured: docs/engines.md, "Design notes".

    python benchmarks/bench_engine.py
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from earl.runtime.engine.base import (
    DECODE_STEPS,
    EngineStats,
    Generation,
    SamplingParams,
    copy_weights,
    finish_reason,
    sample_tokens,
)
from earl.runtime.tokenizer import Tokenizer

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
# distinct shapes the compiled decode step may be specialised to: decode widths (powers of two up
# to max_batch) x slot-cache capacities (doubling) x sampling-group layouts. Dynamo's default
# recompile limit (8 per function) would silently run every shape past the 8th eager.
COMPILED_SHAPES = 64


def check_supported(model: torch.nn.Module) -> None:
    """ValueError unless `model` is a decoder this engine's forward reproduces exactly."""
    cfg = model.config
    kind = getattr(cfg, "model_type", type(model).__name__)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"engine 'pytorch' runs model types {', '.join(SUPPORTED_MODEL_TYPES)}, not {kind!r}; "
                         "use engine='pytorch-static' for other HF causal LMs")
    if getattr(cfg, "use_sliding_window", False):
        raise ValueError("engine 'pytorch' has no sliding-window attention; use engine='pytorch-static'")


def sample_groups(logits_BV: torch.Tensor, groups: tuple, seed_B: torch.Tensor, pos_B: torch.Tensor,
                  vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_tokens` for rows grouped by their sampling settings: `groups` is ((params, mask_B or
    None for all rows), ...). Pure tensor code, so it runs inside the compiled decode step. With
    several groups every group samples every row and a mask picks (rows gathered by index into
    a compiled region crashed Inductor's CPU kernels in torch 2.13; one group is the usual case)."""
    if len(groups) == 1:
        return sample_tokens(logits_BV, groups[0][0], seed_B, pos_B, vocab_size=vocab_size)
    tok_B = lp_B = None
    for params, mask_B in groups:
        t, lp = sample_tokens(logits_BV, params, seed_B, pos_B, vocab_size=vocab_size)
        tok_B = t if tok_B is None else torch.where(mask_B, t, tok_B)
        lp_B = lp if lp_B is None else torch.where(mask_B, lp, lp_B)
    return tok_B, lp_B


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


INITIAL_CAPACITY = 256  # tokens of KV cache each episode's slot starts with (it doubles as needed)
KV_ROUND = 64  # an eager decode step attends to its rows' longest length rounded up to this


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _as_slice(slots: list[int]) -> slice | None:
    """slice(a, a + n) when `slots` are the consecutive a, a+1, ..., else None."""
    if slots and slots[-1] - slots[0] == len(slots) - 1 and slots == list(range(slots[0], slots[-1] + 1)):
        return slice(slots[0], slots[-1] + 1)
    return None


# decode rows whose slots are not a consecutive run in order attend over the slots' whole range
# (a view of the cache; the slots in it that are not decoding attend one position, their outputs
# dropped) while it holds at most this many times as many slots as rows, else over a gathered
# copy of their slots. On qwen2-27m's cache (2 KV heads x 64, fp32; 2-vCPU Xeon, 2026-12-06) the
# copy doubled a layer's attention (16 rows x 192 positions: 0.66 ms gathered, 0.33 ms as a
# view), and most decode steps of a calculator rollout had rows out of order or a few waiting on
# their environment (benchmarks/bench_decode_slots.py)
COVER_ROWS = 2.0


def _slot_views(slots: list[int]) -> tuple[slice | None, slice | None]:
    """How decode rows at cache `slots` read the cache (`forward`'s `dec_slots`, `dec_cover`):
    (their run, None) when they are a consecutive run in order (`_as_slice`); else (None, the
    range holding them all) while that range holds at most COVER_ROWS x len(slots) slots; else
    (None, None): a gathered copy."""
    run = _as_slice(slots)
    if run is not None or not slots:
        return run, None
    lo, hi = min(slots), max(slots) + 1
    return None, (slice(lo, hi) if hi - lo <= COVER_ROWS * len(slots) else None)


class _Row:
    """One episode's host-side state."""

    __slots__ = ("history", "unfed", "length", "gen", "params", "pending")

    def __init__(self):
        self.history: list[int] = []  # every token of the episode
        self.unfed: list[int] = []  # in history, not yet in the cache
        self.length = 0  # tokens in the cache (slot positions 0..length-1)
        self.gen: Generation | None = None  # the turn in progress
        self.params: SamplingParams | None = None
        self.pending = -1  # running: the last sampled token, fed by the next step


@dataclass
class _CachePool:
    """The engine's newest slot cache and the batch using it."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    owner: TorchEpisodeBatch | None


class TorchEpisodeBatch:
    """Episodes with one cache slot each (see the module docstring). Slot `n` is scratch: padded
    rows of a compiled decode step write there."""

    def __init__(self, engine: TorchEngine, n: int, seeds: Sequence[int] | None = None):
        if n < 1:
            raise ValueError(f"an episode batch needs at least one episode, got {n}")
        if seeds is not None and len(seeds) != n:
            raise ValueError(f"{n} episodes need {n} seeds, got {len(seeds)}")
        self.engine = engine
        self.device = dev = engine.device  # fixed for the batch's life (its cache lives there)
        seeds = [int(s) for s in (seeds if seeds is not None else range(n))]
        self.seeds_t = torch.tensor(seeds + [0], dtype=torch.long, device=dev)  # + the scratch slot's
        self.rows = [_Row() for _ in range(n)]
        self.closed: set[int] = set()
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._grow(engine.initial_capacity)

    # -- cache ---------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Every episode closed: the batch's cache may serve the next batch."""
        return len(self.closed) == len(self.rows)

    def _grow(self, need: int) -> None:
        """Make every slot hold at least `need` positions (doubling; existing KV copied). A new
        batch adopts the engine's cache (`TorchEngine._pool`) when the batch that used it has
        closed every episode and it has enough slots and positions: the same tensors, at the
        same addresses and shapes, serve step after step (no allocation, and a compiled decode
        step, or its CUDA graph, is not rebuilt for a new cache). Stale KV in it is never read:
        attention masks every position at or past a row's own length."""
        if need <= self.capacity:
            return
        eng = self.engine
        cap = max(need, 2 * self.capacity, 16)
        cap = -(-cap // 16) * 16
        rows = max(len(self.rows) + 1, self.k[0].shape[0] if self.k else 0)
        pool = eng._pool
        if (not self.capacity and pool is not None and (pool.owner is None or pool.owner.done)
                and pool.k[0].shape[0] >= rows and pool.k[0].shape[1] >= cap and pool.k[0].device == self.device
                and pool.k[0].dtype == eng.dtype):
            pool.owner = self
            self.k, self.v, self.capacity = pool.k, pool.v, pool.k[0].shape[1]
            eng.stats.extra["kv_cache_reused"] = eng.stats.extra.get("kv_cache_reused", 0) + 1
            return
        shape = (rows, cap, eng.kv_heads, eng.head_dim)
        ks, vs = [], []
        for li in range(eng.num_layers):
            k = torch.zeros(shape, dtype=eng.dtype, device=self.device)
            v = torch.zeros(shape, dtype=eng.dtype, device=self.device)
            if self.capacity:
                k[:, :self.capacity] = self.k[li]
                v[:, :self.capacity] = self.v[li]
            if eng.compile and self.device.type == "cuda":
                torch._dynamo.mark_static_address(k)
                torch._dynamo.mark_static_address(v)
            ks.append(k)
            vs.append(v)
        self.k, self.v, self.capacity = ks, vs, cap
        eng._pool = _CachePool(k=ks, v=vs, owner=self)
        eng.stats.extra["kv_cache_bytes"] = 2 * sum(t.numel() * t.element_size() for t in ks)

    # -- the stepped interface -----------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def close(self, rows: Iterable[int]) -> None:
        rows = set(rows)
        self.closed.update(rows)
        self.waiting = deque(r for r in self.waiting if r not in rows)
        self.running = [r for r in self.running if r not in rows]

    def submit(self, inputs: dict[int, list[int]], params: SamplingParams) -> None:
        """Queue a turn for each row of `inputs` (its new tokens: the observation)."""
        n = len(self.rows)
        bad = sorted(r for r in inputs if not 0 <= r < n or r in self.closed)
        if bad:
            raise ValueError(f"rows {bad} are not open in this episode batch")
        busy = sorted(r for r in inputs if self.rows[r].gen is not None)
        if busy:
            raise ValueError(f"rows {busy} are still generating their turn")
        empty = sorted(r for r, toks in inputs.items() if not self.rows[r].history and not toks)
        if empty:
            raise ValueError(f"an episode's first turn needs at least one prompt token (rows {empty})")
        for r, toks in inputs.items():
            row = self.rows[r]
            row.history.extend(toks)
            row.unfed.extend(toks)
            if not self.engine.reuse_kv:  # re-prefill the whole context (the baseline mode)
                row.length, row.unfed = 0, list(row.history)
            row.gen, row.params = Generation([], [], "", "length"), params
            self.waiting.append(r)

    @torch.no_grad()
    def generate(self, inputs: dict[int, list[int]], params: SamplingParams) -> dict[int, Generation]:
        """One turn for every row of `inputs`, returned when all are done."""
        if self.busy:
            raise ValueError("generate() while submitted turns are still running; drive them with step()")
        self.submit(inputs, params)
        out: dict[int, Generation] = {}
        while self.busy:
            out.update(self.step())
        return out

    @torch.no_grad()
    def step(self) -> dict[int, Generation]:
        """One forward over the running rows and the newly admitted ones, or, when no waiting row
        joins, a block of up to `decode_steps` decode steps; returns the rows whose turn finished."""
        eng = self.engine
        if eng.between_steps is not None:  # between any two forwards: e.g. an async replica's weight swap
            eng.between_steps()
        t0 = time.perf_counter()
        # admit waiting rows (first come, first served) under the decode width and token budget
        budget = eng.step_tokens - len(self.running)
        admitted: list[int] = []
        while self.waiting and len(self.running) + len(admitted) < eng.max_batch:
            need = len(self.rows[self.waiting[0]].unfed)
            if need > budget and (self.running or admitted):
                break
            budget -= need
            admitted.append(self.waiting.popleft())
        if not self.running and not admitted:
            return {}
        decode = list(self.running)
        if not admitted:
            finished = self._decode_block(decode)
            eng.stats.decode_s += time.perf_counter() - t0
            return finished
        rows = decode + admitted
        self._grow(max(self.rows[r].length + (1 if r in decode else len(self.rows[r].unfed)) for r in rows))
        logits = self._forward_mixed(decode, admitted)
        pos = [len(self.rows[r].history) for r in rows]
        tok_R, lp_R = sample_groups(logits, self._groups(rows, len(rows)), self.seeds_t[self._upload(rows)],
                                    self._upload(pos), eng.tokenizer.vocab_size)
        toks, lps = self._read(tok_R, lp_R)
        for r in decode:
            self.rows[r].length += 1
        for r in admitted:
            row = self.rows[r]
            row.length += len(row.unfed)
            row.unfed = []
        eng.stats.forwards += 1
        eng.stats.decode_tokens += len(decode)
        finished, _ = self._accept(rows, [[t] for t in toks], [[lp] for lp in lps])
        eng.stats.prefill_s += time.perf_counter() - t0
        return finished

    def _decode_block(self, decode: list[int]) -> dict[int, Generation]:
        """Up to `decode_steps` decode steps of the rows `decode` on the device, then one host
        sync: each step's sampled tokens feed the next step there, and the host applies the finish
        reasons in order afterwards. Tokens a row sampled after its turn ended are dropped; the KV
        they wrote past the row's `length` is never attended and is overwritten by its next turn."""
        eng = self.engine
        steps = min(eng.decode_steps, max(self.rows[r].params.max_new_tokens - len(self.rows[r].gen.token_ids)
                                          for r in decode))
        self._grow(max(self.rows[r].length for r in decode) + steps)
        width = 1 << (len(decode) - 1).bit_length() if eng.compile else len(decode)
        pad = width - len(decode)  # compiled: padded rows decode in the scratch slot
        slots = decode + [len(self.rows)] * pad
        ids_pos = self._upload([[self.rows[r].pending for r in decode] + [0] * pad,
                                [self.rows[r].length for r in decode] + [0] * pad])
        slot_B = self._upload(slots)
        kv_len = min(self.capacity, _round_up(max(self.rows[r].length for r in decode) + steps, KV_ROUND))
        tok_KB, lp_KB = eng.decode_block(self.k, self.v, ids_pos[0], slot_B, ids_pos[1], self.seeds_t[slot_B],
                                         self._groups(decode, width), steps, kv_len, *_slot_views(slots))
        toks, lps = self._read(tok_KB[:, :len(decode)].T, lp_KB[:, :len(decode)].T)
        finished, used = self._accept(decode, toks, lps)
        for r, n in zip(decode, used, strict=True):
            self.rows[r].length += n
        eng.stats.forwards += steps
        eng.stats.decode_tokens += sum(used)
        discarded = steps * len(decode) - sum(used)  # sampled after their row's turn ended
        eng.stats.extra["discarded_tokens"] = eng.stats.extra.get("discarded_tokens", 0) + discarded
        return finished

    # -- host <-> device -----------------------------------------------------------------------
    def _upload(self, x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=self.device)

    def _read(self, tok: torch.Tensor, lp: torch.Tensor) -> tuple[list, list]:
        """Sampled tokens and log-probs as Python lists: the one host sync of a step or block
        (token ids ride as float64, exact below 2**53)."""
        self.engine.stats.host_syncs += 1
        toks, lps = torch.stack((tok.double(), lp.double())).tolist()
        ints = [[int(t) for t in row] for row in toks] if tok.dim() == 2 else [int(t) for t in toks]
        return ints, lps

    def _groups(self, rows: list[int], width: int) -> tuple:
        """`sample_groups`' groups for `rows` (padded to `width`: the padding takes the first group)."""
        keys: dict[tuple[float, float], list[int]] = {}
        for j, r in enumerate(rows):
            p = self.rows[r].params
            keys.setdefault((p.temperature, p.top_p), []).append(j)
        if len(keys) == 1:
            return ((self.engine.sampler(*next(iter(keys))), None),)
        group_of = [0] * width
        for g, idx in enumerate(keys.values()):
            for j in idx:
                group_of[j] = g
        group_B = self._upload(group_of)
        return tuple((self.engine.sampler(*k), group_B == g) for g, k in enumerate(keys))

    def _accept(self, rows: list[int], toks_RK: list[list[int]],
                lps_RK: list[list[float]]) -> tuple[dict[int, Generation], list[int]]:
        """Append each row's sampled tokens in order until its turn ends; rows whose turn ends
        leave the decode batch. Returns the finished rows and the tokens each row kept."""
        eng = self.engine
        finished: dict[int, Generation] = {}
        running, used = [], []
        for r, toks, lps in zip(rows, toks_RK, lps_RK, strict=True):
            row = self.rows[r]
            g = row.gen
            n = 0
            for t, lp in zip(toks, lps, strict=True):
                n += 1
                g.token_ids.append(t)
                g.logprobs.append(lp)
                row.history.append(t)
                finish = finish_reason(eng.tokenizer, g, row.params)
                if finish:
                    g.finish = finish
                    g.text = eng.tokenizer.decode(g.token_ids)
                    row.unfed = [t]  # enters the cache with the next turn
                    row.gen = None
                    finished[r] = g
                    break
            else:
                row.pending = toks[-1]
                running.append(r)
            used.append(n)
        eng.stats.generated_tokens += sum(used)
        self.running = running
        return finished, used

    # -- forwards ------------------------------------------------------------------------------
    def _forward_mixed(self, decode: list[int], admitted: list[int]) -> torch.Tensor:
        """Logits [len(decode) + len(admitted), V]: the next token of each decode row and of the
        last new token of each admitted row. All new tokens go through the linear layers packed
        as one sequence; attention runs batched for decode rows and per admitted segment.
        Admitted rows starting an episode on the same prompt (a GRPO group's members) share one
        prefill: the first runs it, the others get a copy of its KV and its logits (they sample
        apart by their seeds)."""
        eng, dev = self.engine, self.device
        ids, slots, pos, segs, last = [], [], [], [], []
        first_of: dict[tuple[int, ...], int] = {}  # a fresh prompt -> the admitted row that prefills it
        copies: list[tuple[int, int, int]] = []  # (from slot, to slot, positions)
        for r in decode:
            row = self.rows[r]
            ids.append(row.pending)
            slots.append(r)
            pos.append(row.length)
            last.append(len(last))
        for r in admitted:
            row = self.rows[r]
            if row.length == 0:
                key = tuple(row.unfed)
                if key in first_of:
                    lead = first_of[key]
                    copies.append((lead, r, len(row.unfed)))
                    last.append(last[len(decode) + admitted.index(lead)])
                    continue
                first_of[key] = r
            start = len(ids)
            ids += row.unfed
            slots += [r] * len(row.unfed)
            pos += range(row.length, row.length + len(row.unfed))
            segs.append((start, len(ids), r, row.length + len(row.unfed)))
            last.append(len(ids) - 1)
            eng.stats.prefill_tokens += len(row.unfed)
        n_dec = len(decode)
        kv_len = min(self.capacity, _round_up(max(pos[:n_dec], default=0) + 1, KV_ROUND))
        t = lambda x: torch.tensor(x, dtype=torch.long, device=dev)  # noqa: E731
        logits = eng.forward(self.k, self.v, t(ids), t(slots), t(pos), n_dec, kv_len, segs, t(last),
                             *_slot_views(decode))
        if copies:
            src = t([[a, p] for a, _, n in copies for p in range(n)]).T
            dst = t([[b, p] for _, b, n in copies for p in range(n)]).T
            for cache in (*self.k, *self.v):
                cache.index_put_((dst[0], dst[1]), cache[src[0], src[1]])
            eng.stats.extra["shared_prefill_tokens"] = (eng.stats.extra.get("shared_prefill_tokens", 0)
                                                        + sum(n for *_, n in copies))
        return logits


class TorchEngine:
    """The built-in PyTorch backend. It runs the module it is given (on one process, the very
    module the trainer updates, so weight sync is free).

    `max_batch`: rows decoded together at most; `step_tokens`: tokens one forward takes at most
    (a waiting row's whole new segment joins only if it fits, unless nothing else runs);
    `decode_steps`: decode steps run on the device per host sync when no waiting row joins (0: by
    the model's device, `DECODE_STEPS`);
    `compile`: pure decode steps (forward + sampling) through `torch.compile` (CUDA graphs on a GPU).
    `between_steps` (set with earl.runtime.engine.base.set_between_steps): called before every
    `step` of a batch, so between any two of its forwards (decode blocks when decode_steps > 1)."""

    between_steps: Callable[[], None] | None = None

    @classmethod
    def build(cls, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool, decode_steps: int,
              compile: bool, **_ignored) -> TorchEngine:
        """`make_engine`'s constructor: the options this backend takes."""
        return cls(model, tokenizer, reuse_kv=reuse_kv, decode_steps=decode_steps, compile=compile)

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool = True,
                 max_batch: int = 64, step_tokens: int = 2048, compile: bool = False,
                 decode_steps: int = 0, initial_capacity: int = INITIAL_CAPACITY):
        check_supported(model)
        if max_batch < 1 or step_tokens < 1 or decode_steps < 0:
            raise ValueError(f"max_batch and step_tokens must be >= 1 and decode_steps >= 0 (0: by device), got "
                             f"{max_batch}, {step_tokens} and {decode_steps}")
        self.model = model
        self.decode_steps = decode_steps or DECODE_STEPS.get(self.device.type, DECODE_STEPS["cuda"])
        self._samplers: dict[tuple[float, float], SamplingParams] = {}
        self.tokenizer = tokenizer
        self.reuse_kv = reuse_kv
        self.max_batch, self.step_tokens, self.compile = max_batch, step_tokens, compile
        self.initial_capacity = initial_capacity
        self.stats = EngineStats()
        cfg = model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.layers = list(model.model.layers)
        self.num_layers = len(self.layers)
        # local heads: under tensor parallelism the projections hold this rank's heads only
        self.kv_heads = self.layers[0].self_attn.k_proj.weight.shape[0] // self.head_dim
        self._compiled = None
        self._shapes: set[tuple] = set()  # (width, capacity, sampling groups) the compiled step has run
        self._pool: _CachePool | None = None  # the cache a finished batch hands to the next one

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.embed_tokens.weight.dtype

    def open(self, n: int, seeds: Sequence[int] | None = None) -> TorchEpisodeBatch:
        return TorchEpisodeBatch(self, n, seeds)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights(self.model, named_tensors)

    # -- the model forward over the slot cache ---------------------------------------------------
    def forward(self, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], ids_N: torch.Tensor,
                slot_N: torch.Tensor, pos_N: torch.Tensor, n_dec: int, kv_len: int,
                segs: list[tuple[int, int, int, int]], out_N: torch.Tensor,
                dec_slots: slice | None = None, dec_cover: slice | None = None) -> torch.Tensor:
        """Run the packed tokens `ids_N` (token i of slot `slot_N[i]` at position `pos_N[i]`),
        writing their KV into the slots; return logits [len(out_N), V] at the positions `out_N`.
        Tokens 0..n_dec-1 are one per decode row (attention over `kv_len` positions of their
        slot); `segs` are (start, end, slot, length after) prefill segments. `dec_slots`: the
        decode rows' slots when they are consecutive (the usual case), read as a view of the
        cache instead of gathered (a [rows, kv_len] copy per layer and step); else `dec_cover`:
        a range of slots holding theirs (`_slot_views`), read as a view with each row's query at its
        slot and only the decode rows' outputs kept; neither: gathered."""
        m = self.model.model
        D = self.head_dim
        h = m.embed_tokens(ids_N)[None]  # [1, N, hidden]
        cos, sin = m.rotary_emb(h, pos_N[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [N, 1, D]
        covered = None  # with `dec_cover`: each decode row's place in the range
        if n_dec:
            ar = torch.arange(kv_len, device=ids_N.device)
            slot_dec, pos_dec = slot_N[:n_dec], pos_N[:n_dec]
            if dec_slots is None and dec_cover is not None:
                # the range's slots that are not decoding attend position 0 only (no empty row)
                covered = slot_dec - dec_cover.start
                pos_dec = torch.zeros(dec_cover.stop - dec_cover.start, dtype=pos_N.dtype,
                                      device=ids_N.device).index_put_((covered,), pos_dec)
                dec_slots = dec_cover
            mask_dec = (ar[None, :] <= pos_dec[:, None])[:, None, None, :]  # [B, 1, 1, kv]
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x)[0].view(len(ids_N), -1, D)
            k = attn.k_proj(x)[0].view(len(ids_N), -1, D)
            v = attn.v_proj(x)[0].view(len(ids_N), -1, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = k_cache[li], v_cache[li]
            kc.index_put_((slot_N, pos_N), k)
            vc.index_put_((slot_N, pos_N), v)
            outs = []
            if n_dec:
                sd = slot_dec if dec_slots is None else dec_slots
                kd = kc[sd, :kv_len].transpose(1, 2)  # [B, Hkv, kv, D]
                vd = vc[sd, :kv_len].transpose(1, 2)
                qd = q[:n_dec, :, None, :]
                if covered is not None:
                    qd = qd.new_zeros((len(pos_dec), *qd.shape[1:])).index_put_((covered,), qd)
                o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask_dec, scale=attn.scaling,
                                                   enable_gqa=True)
                outs.append(o[:, :, 0, :] if covered is None else o[covered, :, 0, :])
            for start, end, slot, length in segs:
                ks = kc[slot, :length].transpose(0, 1)[None]  # [1, Hkv, L, D]
                vs = vc[slot, :length].transpose(0, 1)[None]
                ar = torch.arange(length, device=ids_N.device)
                mask = (ar[None, :] <= pos_N[start:end, None])[None, None]  # [1, 1, S, L]
                o = F.scaled_dot_product_attention(q[start:end].transpose(0, 1)[None], ks, vs, attn_mask=mask,
                                                   scale=attn.scaling, enable_gqa=True)
                outs.append(o[0].transpose(0, 1))
            a = torch.cat(outs) if len(outs) > 1 else outs[0]
            h = h + attn.o_proj(a.reshape(1, len(ids_N), -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(m.norm(h[0, out_N]))

    def sampler(self, temperature: float, top_p: float) -> SamplingParams:
        """One SamplingParams object per (temperature, top_p): the compiled step guards on it."""
        key = (temperature, top_p)
        if key not in self._samplers:
            self._samplers[key] = SamplingParams(temperature=temperature, top_p=top_p)
        return self._samplers[key]

    def decode_step(self, k_cache, v_cache, ids_B, slot_B, pos_B, seed_B, groups, kv_len: int = 0,
                    dec_slots: slice | None = None, dec_cover: slice | None = None):
        """One decode step on the device: forward, sampling at each row's next position, and the
        sampled token as the next step's input. Returns (next ids, next positions, tokens, log-probs).
        Attention reads `kv_len` positions of each slot (0: the whole cache, the compiled step's
        static shape; eager steps pass the rows' longest length rounded up)."""
        B = ids_B.shape[0]
        logits = self.forward(k_cache, v_cache, ids_B, slot_B, pos_B, B, kv_len or k_cache[0].shape[1], [],
                              torch.arange(B, device=ids_B.device), dec_slots, dec_cover)
        nxt = pos_B + 1
        tok_B, lp_B = sample_groups(logits, groups, seed_B, nxt, self.tokenizer.vocab_size)
        return tok_B, nxt, tok_B, lp_B

    def decode_block(self, k_cache, v_cache, ids_B, slot_B, pos_B, seed_B, groups,
                     steps: int, kv_len: int = 0, dec_slots: slice | None = None,
                     dec_cover: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`steps` decode steps back to back with no host sync; ([steps, B] tokens, [steps, B] log-probs).
        `kv_len` (positions attended, enough for the block's last step), `dec_slots` and
        `dec_cover` (see `forward`) apply to eager steps; a compiled step runs at the cache's
        static shape."""
        step = self.decode_step
        extra = () if self.compile else (kv_len, dec_slots, dec_cover)
        if self.compile:
            if self._compiled is None:
                self._compiled = _compile(self.decode_step, self.device)
            step = self._compiled
            self._shapes.add((ids_B.shape[0], k_cache[0].shape[1], tuple(id(g[0]) for g in groups)))
            self.stats.extra["compiled_shapes"] = len(self._shapes)
            if len(self._shapes) == COMPILED_SHAPES + 1:
                warnings.warn(f"the compiled decode step has met {len(self._shapes)} shapes (widths x cache "
                              f"capacities x sampling settings), past its limit of {COMPILED_SHAPES}: new ones "
                              "run eager; fewer sampling settings or a larger initial_capacity avoid it",
                              stacklevel=2)
        cuda_graphs = self.compile and self.device.type == "cuda"
        toks, lps = [], []
        for _ in range(steps):
            if cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            ids_B, pos_B, tok_B, lp_B = step(k_cache, v_cache, ids_B, slot_B, pos_B, seed_B, groups, *extra)
            if cuda_graphs:  # the graph's outputs are overwritten by its next replay
                ids_B, pos_B, tok_B, lp_B = ids_B.clone(), pos_B.clone(), tok_B.clone(), lp_B.clone()
            toks.append(tok_B)
            lps.append(lp_B)
        return torch.stack(toks), torch.stack(lps)


def _compile(fn, device: torch.device):
    """`torch.compile` of the decode step at static shapes: CUDA graphs on a GPU; on the CPU
    without SIMD in Inductor's C++ kernels, whose vectorised int64 -> float64 conversion feeding
    a reduction (the Gumbel noise before the argmax) corrupts the heap in torch 2.13 (segfault or
    `malloc(): unaligned tcache chunk`; repro: `torch.compile(lambda s, p: counter_uniform(s, p,
    64).argmax(-1))(torch.arange(4), torch.arange(4))`; with `cpp.simdlen=1` it equals eager)."""
    limits = torch._dynamo.config
    limits.recompile_limit = max(limits.recompile_limit, COMPILED_SHAPES)  # see COMPILED_SHAPES
    if device.type == "cuda":
        return torch.compile(fn, dynamic=False, mode="reduce-overhead")
    return torch.compile(fn, dynamic=False, options={"cpp.simdlen": 1})
