"""Specs: catalog parameter counts, plan validation, config loading."""

import json

import pytest

from earl.parallel import validate_plan
from earl.specs import MODEL_CATALOG, ModelSpec, ParallelPlan, StagePlan, WorkloadStats

# Published sizes: Qwen2.5 model cards ("Number of Parameters"), Llama 3.1 model card.
PUBLISHED = {
    "qwen2.5-0.5b": 0.49e9, "qwen2.5-1.5b": 1.54e9, "qwen2.5-3b": 3.09e9, "qwen2.5-7b": 7.61e9,
    "qwen2.5-14b": 14.7e9, "qwen2.5-32b": 32.5e9, "qwen2.5-72b": 72.7e9,
    "llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_param_counts_match_published(name):
    assert MODEL_CATALOG[name].num_params == pytest.approx(PUBLISHED[name], rel=0.01)


def test_qwen7b_within_one_percent():
    assert ModelSpec.from_name("qwen2.5-7b").num_params == pytest.approx(7.62e9, rel=0.01)


def test_kv_bytes_per_token_llama8b():
    assert ModelSpec.from_name("llama-3.1-8b").kv_bytes_per_token == 131072


def test_from_hf_config_roundtrip(tmp_path):
    spec = MODEL_CATALOG["qwen2.5-1.5b"]
    (tmp_path / "config.json").write_text(json.dumps(spec.to_hf_dict()))
    loaded = ModelSpec.from_hf_config(tmp_path, name=spec.name)
    assert loaded == spec


def test_from_hf_config_missing_key_names_file_and_key(tmp_path):
    cfg = MODEL_CATALOG["tiny"].to_hf_dict()
    del cfg["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: missing key 'intermediate_size'"):
        ModelSpec.from_hf_config(tmp_path)


def test_unknown_model_lists_known_names():
    with pytest.raises(ValueError, match="known: .*qwen2.5-7b"):
        ModelSpec.from_name("gpt-5")


def test_plan_infers_minus_one_and_checks_product():
    assert ParallelPlan(tp=4, dp=-1).resolve(32).dp == 8
    with pytest.raises(ValueError, match=r"tp\*pp\*dp\*cp = 2\*1\*2\*1 = 4, but the stage has 8"):
        ParallelPlan(tp=2, dp=2).resolve(8)
    with pytest.raises(ValueError, match="at most one degree"):
        ParallelPlan(tp=-1, dp=-1)


def test_plan_validates_against_model():
    m = MODEL_CATALOG["qwen2.5-7b"]  # 28 heads
    with pytest.raises(ValueError, match="tp=8 does not divide qwen2.5-7b's 28 attention heads"):
        validate_plan(ParallelPlan(tp=8), m)
    with pytest.raises(ValueError, match="cp=4 does not divide the sequence length 4098"):
        validate_plan(ParallelPlan(cp=4), m, seq_len=4098)
    with pytest.raises(ValueError, match="recompute 'some'"):
        ParallelPlan(recompute="some")


def test_plan_parse_roundtrip():
    p = ParallelPlan(tp=2, pp=2, cp=2, dp=4, micro_batch=2, recompute="full", sharded_optimizer=True)
    assert ParallelPlan.parse(p.describe()) == p
    with pytest.raises(ValueError, match="cannot parse plan"):
        ParallelPlan.parse("tp2-xx3")


def test_stage_plan_and_stats():
    p = ParallelPlan(tp=2, dp=2)
    sp = StagePlan(rollout=p, experience=p, train=p).with_stage("train", ParallelPlan(dp=4))
    assert sp.for_stage("train").dp == 4 and sp.rollout.tp == 2
    with pytest.raises(ValueError, match="context_mean <= context_p95"):
        WorkloadStats(num_responses=4, context_mean=100, context_p95=50, context_max=200)
