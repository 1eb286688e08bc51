"""The resource check before the first step (earl.runtime.resources): one rollout step's KV cache
and trajectories on top of the model: refused when even each episode's first cache slot cannot
fit, a one-line warning when episodes at sampling.max_context could not.

    PYTHONPATH=$PWD python -m pytest -q tests/runtime/test_resources.py
"""

import dataclasses

import pytest

from earl.runtime.resources import GIB, check_resources, estimate_bytes, kv_bytes_per_token
from earl.runtime.run_config import RunConfig
from earl.specs import MODEL_CATALOG

SPEC = MODEL_CATALOG["tiny"]


def test_kv_cache_is_episodes_times_tokens_times_kv_bytes():
    cfg = RunConfig(groups=8, group_size=2)
    est = estimate_bytes(cfg, SPEC, 1)
    assert est["kv_cache"] == 16 * 256 * kv_bytes_per_token(cfg, SPEC)
    batched = estimate_bytes(dataclasses.replace(cfg, engine_batch=4), SPEC, 2)
    assert batched["kv_cache"] == 8 * 256 * kv_bytes_per_token(cfg, SPEC)  # 4 episodes at once on each rank
    assert "kv_cache" not in estimate_bytes(dataclasses.replace(cfg, engine="vllm"), SPEC, 1)


def test_a_rollout_that_cannot_fit_is_refused_with_the_numbers():
    cfg = RunConfig(groups=4096)
    model = estimate_bytes(cfg, SPEC, 1)
    room = model["total"] - model["kv_cache"] / 2
    with pytest.raises(ValueError, match=r"one rollout step needs at least .* 4096 episodes in flight x a first "
                                         r"cache slot of 256 tokens .* lower sampling.max_context"):
        check_resources(cfg, SPEC, 1, available=room)


def test_episodes_that_may_grow_past_memory_warn_once(capsys):
    cfg = RunConfig(groups=64, sampling=dataclasses.replace(RunConfig().sampling, max_context=1 << 20))
    check_resources(cfg, SPEC, 1, available=2 * GIB)
    check_resources(cfg, SPEC, 1, available=2 * GIB)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning: one rollout step needs up to" in err[0] and "max_context 1048576" in err[0]
