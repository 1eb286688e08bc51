"""EARL: efficient agentic reinforcement learning for LLMs.

One set of policy objects (parallelism selector, data dispatcher) evaluated by a calibrated
cost model and a SimPy cluster simulator, and obeyed by a real PyTorch runtime. See README.md.
"""

__version__ = "0.1.0"
