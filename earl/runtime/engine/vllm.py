"""A vLLM generation backend behind the same `Engine` interface (optional: `pip install earl[vllm]`).

UNTESTED here: this machine has no GPU and vLLM is not installed, so this file is kept thin and
is never imported unless `engine = "vllm"` is configured. Cross-turn reuse comes from vLLM's
automatic prefix caching: each turn re-sends the episode's full token history, and the cached
prefix blocks are reused instead of recomputed. Weights are pushed from the trainer with
`update_weights` (vLLM's in-process `load_weights` on the driver worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from earl.runtime.engine.base import EngineStats, Generation, SamplingParams
from earl.runtime.tokenizer import Tokenizer


class VLLMEpisodeBatch:
    def __init__(self, engine: VLLMEngine, n: int, seeds: Sequence[int] | None = None):
        self.engine = engine
        self.seeds = [int(s) for s in seeds] if seeds is not None else list(range(n))
        self.history: dict[int, list[int]] = {r: [] for r in range(n)}
        self.closed: set[int] = set()

    def close(self, rows: Iterable[int]) -> None:
        self.closed.update(rows)

    def generate(self, inputs: dict[int, list[int]], params: SamplingParams) -> dict[int, Generation]:
        from vllm import SamplingParams as VSP

        bad = sorted(set(inputs) - set(self.history) | (set(inputs) & self.closed))
        if bad:
            raise ValueError(f"rows {bad} are not open in this episode batch")
        rows = sorted(inputs)
        for r in rows:
            self.history[r].extend(inputs[r])
        # one seed per request: the episode's stream at its current length (group members differ)
        sps = [VSP(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                   stop=list(params.stop), logprobs=0, ignore_eos=not params.stop_at_eos,
                   seed=(self.seeds[r] * 1_000_003 + len(self.history[r])) % (2**31 - 1)) for r in rows]
        prompts = [{"prompt_token_ids": list(self.history[r])} for r in rows]
        outs = self.engine.llm.generate(prompts, sps, use_tqdm=False)
        result = {}
        for r, o in zip(rows, outs, strict=True):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids, strict=True)]
            self.history[r].extend(ids)
            finish = {"stop": "stop", "length": "length"}.get(c.finish_reason, "eos")
            result[r] = Generation(ids, lps, c.text, finish)
            self.engine.stats.generated_tokens += len(ids)
        return result


class VLLMEngine:
    """Runs a local checkpoint directory with vLLM (prefix caching on)."""

    def __init__(self, *, model_path: str | None, tokenizer: Tokenizer, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError:
            raise ValueError("engine 'vllm' needs the vllm package: pip install 'earl[vllm]'") from None
        if not model_path:
            raise ValueError("engine 'vllm' needs a local HF checkpoint directory as model.path")
        self.llm = LLM(model=model_path, enable_prefix_caching=True, **llm_kwargs)
        self.tokenizer = tokenizer
        self.stats = EngineStats()

    def open(self, n: int, seeds: Sequence[int] | None = None) -> VLLMEpisodeBatch:
        return VLLMEpisodeBatch(self, n, seeds)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(list(named_tensors))
