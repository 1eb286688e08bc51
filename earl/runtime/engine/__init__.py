"""Generation engines behind one interface (earl.runtime.engine.base): the built-in PyTorch
backend (earl.runtime.engine.pytorch: slot KV cache, continuous batching), the static one it
replaced (earl.runtime.engine.static) and vLLM (earl.runtime.engine.vllm, optional)."""

from earl.runtime.engine.base import (
    ENGINES,
    Engine,
    EngineStats,
    EpisodeBatch,
    Generation,
    SamplingParams,
    SteppedBatch,
    TurnSync,
    as_stepper,
    counter_uniform,
    make_engine,
    sample_tokens,
)
from earl.runtime.engine.pytorch import TorchEngine, TorchEpisodeBatch
from earl.runtime.engine.static import StaticEpisodeBatch, StaticTorchEngine

__all__ = ["ENGINES", "Engine", "EngineStats", "EpisodeBatch", "Generation", "SamplingParams", "StaticEpisodeBatch",
           "StaticTorchEngine", "SteppedBatch", "TorchEngine", "TorchEpisodeBatch", "TurnSync", "as_stepper",
           "counter_uniform", "make_engine", "sample_tokens"]
