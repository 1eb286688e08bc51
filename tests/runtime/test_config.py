"""Run configuration: sources, overrides, typos."""

import pytest

from earl.runtime.run_config import RunConfig, TrainerConfig, apply_overrides, from_dict, load_config_file
from earl.runtime.trainer import Trainer


def test_overrides_dotted_and_leaf():
    cfg = apply_overrides(RunConfig(), {"trainer.lr": "3e-3", "group_size": "4", "stop": '["\\n", "x"]',
                                        "reuse_kv": "false", "betas": "0.9,0.95"})
    assert cfg.trainer.lr == 3e-3 and cfg.group_size == 4 and cfg.sampling.stop == ("\n", "x")
    assert cfg.reuse_kv is False and cfg.trainer.betas == (0.9, 0.95)


@pytest.mark.parametrize("over,match", [
    ({"trainer.lrr": "1"}, "did you mean"), ({"steps": "1.5"}, "expected int"), ({"steps": "0"}, ">= 1"),
    ({"selector": "best"}, "valid: static"), ({"trainer.algo": "ppo"}, "valid: grpo"),
    ({"plots": "maybe"}, "expected bool"), ({"trainer.algo": "grpo", "group_size": "1"}, "group_size"),
    ({"collective_timeout_s": "0"}, "collective_timeout_s must be > 0")])
def test_bad_overrides(over, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(RunConfig(), over)


def test_files(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text('steps = 7\n[env]\nname = "connect-four"\nopponent = "lookahead"\n[trainer]\nlr = 0.01\n')
    cfg = load_config_file(p)
    assert cfg.steps == 7 and cfg.env.name == "connect-four" and cfg.trainer.lr == 0.01
    y = tmp_path / "run.yaml"
    y.write_text("trainer:\n  algo: reinforce++\n")
    assert load_config_file(y).trainer.algo == "reinforce++"
    with pytest.raises(ValueError, match="unknown config key 'lr'"):
        from_dict({"lr": 0.1})  # a file names its sections
    (tmp_path / "bad.toml").write_text("steps = \n")
    with pytest.raises(ValueError, match="invalid TOML"):
        load_config_file(tmp_path / "bad.toml")


def test_lr_decay(tiny):
    tr = Trainer(tiny.model, TrainerConfig(lr=1.0, lr_decay="cosine", lr_min_frac=0.1), temperature=1.0)
    assert tr.lr_at(0) == pytest.approx(1.0) and tr.lr_at(1) == pytest.approx(0.1)
    assert tr.lr_at(0.5) == pytest.approx(0.55)
