"""The engine interface every backend implements, and the sampling they share.

An engine takes token ids in and gives token ids and log-probs out, keeping each episode's KV
cache across turns. Backends: `earl.runtime.engine.pytorch` (built in: slot
KV cache, continuous batching), `earl.runtime.engine.static` (the first built-in engine, turn
synchronous) and `earl.runtime.engine.vllm` (optional: the vllm package is imported only when one is built).
`earl.runtime.engine.make_engine` picks one by name from the `ENGINES` registry.

An episode batch either generates whole turns (`generate`: every requested row's turn, together)
or is driven step by step (`submit` rows, then `step` until they finish, in any order): the
rollout loop uses the second, so an episode whose turn ends steps its environment and rejoins
while others still decode. `as_stepper` gives a turn-synchronous batch that second face.

Sampling (`sample_tokens`) is inverse-CDF with a counter-based uniform (`earl.runtime.seeds`): a
token's noise depends only on its episode's seed and position, so an episode samples the same
tokens alone, in any batch, on one process or many.

    python benchmarks/bench_engine.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from earl.runtime.seeds import counter_uniform
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
    host_syncs: int = 0  # device-to-host reads the engine waited on (each `.tolist()` of sampled tokens)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    extra: dict = field(default_factory=dict)


class EpisodeBatch(Protocol):
    def generate(self, inputs: dict[int, list[int]], params: SamplingParams) -> dict[int, Generation]: ...

    def close(self, rows: Iterable[int]) -> None: ...


class SteppedBatch(Protocol):
    """An episode batch driven step by step: `submit` queues rows' new tokens (each starts a
    turn), `step` runs the engine a little and returns the rows whose turn finished in it."""

    def submit(self, inputs: dict[int, list[int]], params: SamplingParams) -> None: ...

    def step(self) -> dict[int, Generation]: ...

    @property
    def busy(self) -> bool: ...

    def close(self, rows: Iterable[int]) -> None: ...


class TurnSync:
    """A turn-synchronous batch seen as a `SteppedBatch`: one step generates the turn of every
    row submitted since the last step, together (what `generate` does)."""

    def __init__(self, batch: EpisodeBatch):
        self.batch = batch
        self.pending: dict[int, list[int]] = {}
        self.params: SamplingParams | None = None

    def submit(self, inputs: dict[int, list[int]], params: SamplingParams) -> None:
        if self.params is not None and self.pending and params != self.params:
            raise ValueError("a turn-synchronous batch generates one turn with one SamplingParams")
        self.pending.update(inputs)
        self.params = params

    def step(self) -> dict[int, Generation]:
        inputs, self.pending = self.pending, {}
        return self.batch.generate(inputs, self.params) if inputs else {}

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def close(self, rows: Iterable[int]) -> None:
        self.batch.close(rows)


def as_stepper(batch: EpisodeBatch | SteppedBatch) -> SteppedBatch:
    """`batch` itself when it is driven step by step, else a `TurnSync` over it."""
    return batch if hasattr(batch, "submit") else TurnSync(batch)


class Engine(Protocol):
    """A generation backend. `open(n, seeds)` starts n episodes (rows 0..n-1) sharing a batch;
    row i samples from its own random stream `seeds[i]` (default: i)."""

    tokenizer: Tokenizer
    stats: EngineStats

    def open(self, n: int, seeds: Sequence[int] | None = None) -> EpisodeBatch: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...


def set_between_steps(engine: Engine, fn: Callable[[], None] | None) -> None:
    """Have `engine` call `fn` between its decode steps (with episodes in flight; `fn` may copy
    new weights into the module the engine runs: the KV already cached stays). Only engines
    that step their own decode loop in this process can (the `pytorch` engine); ValueError else."""
    if not hasattr(engine, "between_steps"):
        raise ValueError(f"engine {type(engine).__name__} cannot call back between decode steps (a turn-synchronous "
                         "or external engine); use engine 'pytorch'")
    engine.between_steps = fn


def finish_reason(tokenizer: Tokenizer, g: Generation, params: SamplingParams) -> str:
    """Why the turn `g` ends after its last token ("eos" | "stop" | "length"), or "" if it goes on."""
    if params.stop_at_eos and tokenizer.eos_id is not None and g.token_ids[-1] == tokenizer.eos_id:
        return "eos"
    if params.stop and any(s in tokenizer.decode(g.token_ids) for s in params.stop):
        return "stop"
    if len(g.token_ids) >= params.max_new_tokens:
        return "length"
    return ""


@torch.no_grad()
def copy_weights(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """`update_weights` of an engine that runs `model` itself (tensors it already holds are skipped)."""
    params = dict(model.named_parameters())
    for name, t in named_tensors:
        if name not in params:
            raise ValueError(f"update_weights: unknown parameter {name!r}")
        if params[name].data_ptr() != t.data_ptr():
            params[name].copy_(t)


def sample_tokens(logits_AV: torch.Tensor, params: SamplingParams, seeds_A: torch.Tensor | None = None,
                  positions_A: torch.Tensor | None = None,
                  vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token ids, their log-probs).

    Inverse-CDF sampling over the (top-p truncated) distribution with one counter-based
    uniform per row (`counter_uniform`): row i draws from its own stream `seeds_A[i]` at
    `positions_A[i]`. One uniform per row, not one per vocabulary entry (the Gumbel-max form
    this replaced hashed a 64-bit counter for every column: 2 s of a 4.3 s rollout on the
    benchmarks/bench_trl.py job). The CDF is a float64 cumulative sum in vocabulary order, so a
    token of probability p is drawn with probability p up to float64 rounding, and a token of
    probability 0 (masked, or underflowed) never. `vocab_size` (the tokenizer's size) keeps ids
    the tokenizer cannot decode, such as a checkpoint's padded embedding rows, from ever being drawn."""
    logits = logits_AV[..., :vocab_size].float()
    logp_all = torch.log_softmax(logits / params.logprob_temperature, dim=-1)
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        if seeds_A is None or positions_A is None:
            raise ValueError("sampling at temperature > 0 needs a seed and a position per row")
        p = logp_all.double().exp_()  # at temperature > 0 the log-probs' temperature is the sampling one
        if params.top_p < 1:
            sorted_p, order = p.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keep the smallest nucleus
            p = p.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), 0.0)
        cdf = p.cumsum_(-1)
        u = counter_uniform(seeds_A.to(logits.device), positions_A.to(logits.device), 1)
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)


# engine "pytorch": decode steps per host sync by default, by device type. On the CPU a host sync
# costs nothing and the tokens a row samples after its turn ended cost compute: 8 steps per sync
# played mixed multi-turn rollouts at 0.88-0.94x of one (benchmarks/bench_engine.py). On a GPU a
# sync stalls the launch queue and a decode step is memory-bound (extra rows are nearly free):
# 8 is the design choice there, not yet measured (benchmarks/bench_decode_roofline.py compares).
DECODE_STEPS = {"cpu": 1, "cuda": 8}
