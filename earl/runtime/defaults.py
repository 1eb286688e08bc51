"""Run defaults that follow the model: `earl run --model PATH` trains a 0.5B model with settings
sized for it, not the tiny model's (fp32, lr 2e-3, 128 groups, 16K-token micro-batches).

`model_defaults(spec, device)` is a pure function of the model's size and the device; the run's
config resolution (earl.runtime.resolve.resolve_config) applies it to the keys the user did not set
(an explicit `--set`, flag or config-file value always wins), and `earl run` prints the values in
force at start. The built-in tiny models (and anything under `SMALL_MODEL_PARAMS`) keep today's
defaults, so existing runs and tests are unchanged.

    python -c "from earl.runtime.defaults import *; from earl.specs import ModelSpec; \
print(model_defaults(ModelSpec.from_name('qwen2.5-0.5b'), 'cpu'))"
"""

from __future__ import annotations

from earl.cost_model.memory import activation_bytes_per_token
from earl.specs import ModelSpec, ParallelPlan

SMALL_MODEL_PARAMS = 50e6  # parameters; below this the built-in defaults stand (tiny models)
LARGE_MODEL_PARAMS = 3e9  # parameters; from here the learning rate halves and batches shrink
# bytes of saved activations one micro-batch may hold (the token budget is sized from it): a
# CPU run shares host memory with weights and optimizer, a GPU has HBM to spare
ACTIVATION_BYTES = {"cpu": 2 * 2**30, "cuda": 16 * 2**30}
MIN_TOKEN_BUDGET, MAX_TOKEN_BUDGET = 512, 16384  # padded tokens per micro-batch


def model_defaults(spec: ModelSpec, device: str = "cpu") -> dict[str, object]:
    """{dotted config key: value} sensible for `spec` on `device`; {} for small models (the
    built-in defaults are theirs). bf16 weights (the optimizer keeps fp32 masters and moments),
    the RL fine-tuning learning rate of pretrained LMs (1e-6; 5e-7 from 3B parameters), 16
    prompt groups per step (8 from 3B), and a token budget whose saved activations fit
    `ACTIVATION_BYTES` (a power of two; log-prob logits are chunked, so they do not count)."""
    n = spec.num_params
    if n < SMALL_MODEL_PARAMS:
        return {}
    large = n >= LARGE_MODEL_PARAMS
    per_token = activation_bytes_per_token(spec, ParallelPlan(), MAX_TOKEN_BUDGET)  # bf16, the memory account's
    budget = ACTIVATION_BYTES["cuda" if device.startswith("cuda") else "cpu"] // per_token
    tokens = MIN_TOKEN_BUDGET
    while tokens * 2 <= min(budget, MAX_TOKEN_BUDGET):
        tokens *= 2
    return {"model.dtype": "bf16", "trainer.lr": 5e-7 if large else 1e-6, "groups": 8 if large else 16,
            "trainer.token_budget": tokens}


def describe_defaults(cfg) -> str:
    """The size-dependent settings in force, for the run's start line."""
    return (f"{cfg.model.dtype}, lr {cfg.trainer.lr:g}, {cfg.groups} groups x {cfg.group_size}, "
            f"token budget {cfg.trainer.token_budget}")
