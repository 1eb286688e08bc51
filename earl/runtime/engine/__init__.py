"""Generation engines behind one interface (earl.runtime.engine.base): the built-in PyTorch
backend (earl.runtime.engine.pytorch) and vLLM (earl.runtime.engine.vllm, optional)."""

from earl.runtime.engine.base import (
    ENGINES,
    Engine,
    EngineStats,
    EpisodeBatch,
    Generation,
    SamplingParams,
    counter_uniform,
    make_engine,
    sample_tokens,
)
from earl.runtime.engine.pytorch import TorchEngine, TorchEpisodeBatch

__all__ = ["ENGINES", "Engine", "EngineStats", "EpisodeBatch", "Generation", "SamplingParams", "TorchEngine",
           "TorchEpisodeBatch", "counter_uniform", "make_engine", "sample_tokens"]
