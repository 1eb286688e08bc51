"""Generation engines behind one interface (earl.runtime.engine.base), and their registry:
`ENGINES` names each backend's class, `make_engine` builds one by name. Backends: the built-in
PyTorch engine (earl.runtime.engine.pytorch: slot KV cache, continuous batching), the static one
it replaced (earl.runtime.engine.static) and vLLM (earl.runtime.engine.vllm; the vllm package is
imported only when one is built).

    python -c "from earl.runtime.engine import ENGINES; print(list(ENGINES))"
"""

from __future__ import annotations

import torch

from earl.runtime.engine.base import (
    DECODE_STEPS,
    Engine,
    EngineStats,
    EpisodeBatch,
    Generation,
    SamplingParams,
    SteppedBatch,
    TurnSync,
    as_stepper,
    sample_tokens,
    set_between_steps,
)
from earl.runtime.engine.pytorch import TorchEngine, TorchEpisodeBatch
from earl.runtime.engine.static import StaticEpisodeBatch, StaticTorchEngine
from earl.runtime.engine.vllm import VLLMEngine
from earl.runtime.seeds import counter_uniform
from earl.runtime.tokenizer import Tokenizer
from earl.specs import ParallelPlan

ENGINES: dict[str, type] = {"pytorch": TorchEngine, "pytorch-static": StaticTorchEngine, "vllm": VLLMEngine}
LOCAL_ENGINES = ("pytorch", "pytorch-static")  # run the module they are given (no weight copy)


def engine_plan_error(name: str, rollout: ParallelPlan) -> str:
    """'' if engine `name` can play under the rollout plan, else why not. An external engine
    (vLLM) is one engine per rank with its own parallelism: each rank is a rollout replica."""
    if name not in LOCAL_ENGINES and rollout.tp != 1:
        return f"engine {name!r} runs one engine per rank, so it needs rollout tp 1, not tp {rollout.tp}"
    return ""


def make_engine(name: str, model: torch.nn.Module, tokenizer: Tokenizer, *, reuse_kv: bool = True,
                model_path: str | None = None, decode_steps: int = 0, compile: bool = False,
                dtype: torch.dtype | None = None) -> Engine:
    """The engine `name` of `ENGINES`. `decode_steps`: decode steps the built-in `pytorch` engine
    runs per host sync (0: by device, `DECODE_STEPS`); `compile`: its decode steps through
    torch.compile; `dtype`: the precision an external engine (vLLM) runs, by default `model`'s.
    Each backend's `build` takes the options it uses and ignores the rest."""
    if name not in ENGINES:
        raise ValueError(f"engine {name!r} unknown; valid: {', '.join(ENGINES)}")
    return ENGINES[name].build(model, tokenizer, reuse_kv=reuse_kv, model_path=model_path,
                               decode_steps=decode_steps, compile=compile, dtype=dtype)


__all__ = ["DECODE_STEPS", "ENGINES", "LOCAL_ENGINES", "Engine", "EngineStats", "EpisodeBatch", "Generation",
           "SamplingParams", "StaticEpisodeBatch", "StaticTorchEngine", "SteppedBatch", "TorchEngine",
           "TorchEpisodeBatch", "TurnSync", "VLLMEngine", "as_stepper", "counter_uniform", "engine_plan_error",
           "make_engine", "sample_tokens", "set_between_steps"]
