"""Defaults that follow the model (earl.runtime.defaults, applied by run.resolve_config): the tiny
models keep the built-in defaults, a 0.5B model gets bf16 / lr 1e-6 / 16 groups / a token
budget sized for it, and an explicit --set always wins."""

import json

import pytest

from earl.runtime.defaults import model_defaults
from earl.runtime.resolve import resolve_config
from earl.runtime.run_config import RunConfig
from earl.specs import MODEL_CATALOG


def test_tiny_models_keep_the_builtin_defaults():
    for name in ("tiny", "tiny-wide", "tiny-llama"):
        assert model_defaults(MODEL_CATALOG[name]) == {}
    assert resolve_config() == RunConfig()


def test_defaults_scale_with_the_model():
    small = model_defaults(MODEL_CATALOG["qwen2.5-0.5b"], "cpu")
    assert small == {"model.dtype": "bf16", "trainer.lr": 1e-6, "groups": 16, "trainer.token_budget": 2048}
    big = model_defaults(MODEL_CATALOG["qwen2.5-7b"], "cpu")
    assert big["trainer.lr"] < small["trainer.lr"] and big["groups"] < small["groups"]
    assert big["trainer.token_budget"] <= small["trainer.token_budget"]
    assert model_defaults(MODEL_CATALOG["qwen2.5-0.5b"], "cuda")["trainer.token_budget"] == 16384


@pytest.fixture
def qwen_dir(tmp_path):
    """A folder that passes the model checks with Qwen2.5-0.5B's config (no weights read)."""
    d = tmp_path / "qwen"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(MODEL_CATALOG["qwen2.5-0.5b"].to_hf_dict()))
    (d / "model.safetensors").write_bytes(b"")
    return d


def test_resolve_config_applies_model_defaults_where_not_set(qwen_dir, tmp_path):
    cfg = resolve_config(overrides={"model.path": str(qwen_dir)})
    assert (cfg.model.dtype, cfg.trainer.lr, cfg.groups, cfg.trainer.token_budget) == ("bf16", 1e-6, 16, 2048)
    cfg = resolve_config(overrides={"model.path": str(qwen_dir), "lr": "3e-4", "model.dtype": "fp32"})
    assert (cfg.model.dtype, cfg.trainer.lr, cfg.groups) == ("fp32", 3e-4, 16)
    f = tmp_path / "run.toml"
    f.write_text(f'groups = 4\n[model]\npath = "{qwen_dir}"\n')
    cfg = resolve_config(f)
    assert (cfg.groups, cfg.model.dtype) == (4, "bf16")
