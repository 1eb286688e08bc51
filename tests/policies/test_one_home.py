"""Names and rules that live in one module each: optimizer-slice naming (earl.policies.reshard),
dispatcher names (earl.policies.registry), micro-batch packing (earl.cost_model.model).

    OMP_NUM_THREADS=1 python -m pytest -q tests/policies/test_one_home.py
"""

from __future__ import annotations

import earl.cost_model as cost_model
from earl.cost_model.model import micro_batches, pack_micro_batches
from earl.policies.registry import DISPATCHERS
from earl.policies.reshard import OPT_SEP, opt_name, param_of


def test_optimizer_slice_names_round_trip():
    assert opt_name("model.norm.weight", "exp_avg") == f"model.norm.weight{OPT_SEP}exp_avg"
    assert param_of(opt_name("w", "exp_avg_sq")) == ("w", True)
    assert param_of("model.layers.0.mlp.up_proj.weight") == ("model.layers.0.mlp.up_proj.weight", False)


def test_checkpoint_and_weight_moves_use_the_policy_naming():
    import earl.runtime.checkpoint as ckpt
    import earl.runtime.move_weights as mw

    assert ckpt.param_of is param_of and mw.param_of is param_of
    assert not hasattr(ckpt, "OPT_SEP") and not hasattr(mw, "_param_of")


def test_dispatcher_names_have_one_registry():
    assert set(DISPATCHERS) == {"centralized", "layout-aware"}
    assert not hasattr(cost_model, "DISPATCHERS")


def test_trainer_packs_by_the_cost_models_rule():
    from earl.runtime import trainer

    assert trainer.micro_batches is micro_batches
    lengths = [5, 9, 9, 2, 7, 1]
    assert micro_batches(lengths, 20) == [[1, 2], [4, 0], [3, 5]]
    assert pack_micro_batches(lengths, 20) == [[9, 9], [5, 7], [1, 2]]
    assert micro_batches([50], 10) == [[0]]
