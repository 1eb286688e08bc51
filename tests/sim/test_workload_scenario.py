"""Workload draws, growth, truncation, trace replay; scenario files, --set and bad input.

    python -m pytest tests/sim/test_workload_scenario.py -q
"""

from __future__ import annotations

import json

import pytest

from earl.sim.scenario import KEYS, builtin_scenarios, load_scenario
from earl.sim.workload import PRESETS, Workload, WorkloadSpec, preset, truncate_turns


def test_draws_depend_only_on_seed_and_step():
    w1, w2 = Workload(preset("connect-four"), seed=3), Workload(preset("connect-four"), seed=3)
    assert w1.episodes(7) == w2.episodes(7)
    assert w1.episodes(7) != Workload(preset("connect-four"), seed=4).episodes(7)
    assert w1.episodes(7) != w1.episodes(8)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_multi_turn_and_grow(name):
    spec = preset(name)
    w = Workload(spec)
    early, late = w.episodes(0), w.episodes(spec.growth_steps)
    assert len(early) == spec.episodes_per_step
    assert max(len(e.turns) for e in early) > 1
    assert Workload.stats(late).response_tokens_mean > 1.5 * Workload.stats(early).response_tokens_mean
    assert all(e.context_tokens <= spec.max_context for e in late)


def test_growth_curves():
    lin = WorkloadSpec(growth="linear", growth_factor=3.0, growth_steps=10)
    assert [lin.growth_multiplier(s) for s in (0, 5, 10, 20)] == [1.0, 2.0, 3.0, 3.0]
    log = WorkloadSpec(growth="logistic", growth_factor=3.0, growth_steps=10)
    vals = [log.growth_multiplier(s) for s in range(11)]
    assert vals[0] == pytest.approx(1.0) and vals[-1] == pytest.approx(3.0)
    assert all(b > a for a, b in zip(vals, vals[1:], strict=False))


def test_truncation_cuts_at_the_cap():
    turns = [(100, 50, 0.1), (30, 80, 0.2), (30, 80, 0.3)]
    assert truncate_turns(turns, 0) == (tuple(turns), False)
    assert truncate_turns(turns, 200) == (((100, 50, 0.1), (30, 20, 0.2)), True)
    assert truncate_turns(turns, 180) == (((100, 50, 0.1),), True)  # 150 + 30 obs leaves no room
    assert truncate_turns(turns, 370) == (tuple(turns), False)


def test_trace_replay(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = [{"step": 0, "episodes": [{"id": 0, "turns": [[120, 30, 0.5], [10, 40, 0.0]]}]},
             {"step": 1, "episodes": [{"id": 0, "turns": [[120, 300, 0.0]]},
                                      {"id": 1, "turns": [[100, 5, 0.0]]}]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    w = Workload(WorkloadSpec(trace=str(path), max_context=400))
    e0 = w.episodes(0)
    assert [e.turns for e in e0] == [((120, 30, 0.5), (10, 40, 0.0))]
    e1 = w.episodes(1)
    assert e1[0].turns == ((120, 280, 0.0),) and e1[0].truncated
    assert w.episodes(2) == e0  # a short trace repeats


def test_bad_trace_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"step": 0, "episodes": []}\n{"step": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        Workload(WorkloadSpec(trace=str(path)))
    path.write_text('{"step": 0, "episodes": [{"id": 0, "turns": [[1, 2, -1.0]]}]}\n')
    with pytest.raises(ValueError, match="negative"):
        Workload(WorkloadSpec(trace=str(path)))


def test_default_and_builtin_scenarios_load():
    assert {"default", "tool-use", "tic-tac-toe", "connect-four-small"} <= set(builtin_scenarios())
    sc = load_scenario(None)
    assert (sc.model, sc.nodes, sc.cluster_spec().num_gpus, sc.network) == \
        ("qwen2.5-72b", 16, 128, "tcp-200g")
    assert sc.workload.name == "connect-four" and sc.workload.max_context == 32768
    assert sc.workload.growth_factor > 1
    for name in builtin_scenarios():
        load_scenario(name)


def test_set_overrides_are_typed():
    sc = load_scenario(None, {"cluster.nodes": "2", "workload.gen_tokens": "300",
                              "engine.fine": "true", "policy.compare": "static/centralized,cost-model/layout-aware",
                              "plan.rollout": "tp8-dp2", "plan.experience": "tp8-dp2",
                              "plan.train": "tp8-dp2-mb1-rc-full-zero"})
    assert sc.nodes == 2 and sc.workload.gen_tokens == 300.0 and sc.fine is True
    assert sc.compare == ("static/centralized", "cost-model/layout-aware")
    assert sc.workload.name == "connect-four"  # the file's preset, with one field overridden


def test_yaml_scenario(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("model: {name: qwen2.5-7b}\ncluster: {nodes: 1}\nworkload: {preset: tool-use}\n")
    sc = load_scenario(p)
    assert sc.model == "qwen2.5-7b" and sc.workload.name == "tool-use"


def test_yaml_is_parsed_safely(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ValueError, match="invalid YAML"):
        load_scenario(p)


@pytest.mark.parametrize("sets, match", [
    ({"cluster.node": "2"}, r"unknown scenario key 'cluster.node'.*cluster.nodes"),
    ({"workload.gen_token": "5"}, r"did you mean workload.gen_tokens"),
    ({"cluster.nodes": "0"}, r"cluster.nodes must be an integer >= 1, got 0"),
    ({"workload.env_latency_s": "-1"}, r"env_latency_s must be >= 0 seconds"),
    ({"plan.train": "tp8-dp4"}, r"plan.train = 'tp8-dp4' does not match the cluster"),
    ({"plan.rollout": "tp3-dp1"}, r"plan.rollout"),
    ({"cluster.nodes": "two"}, r"expected int"),
    ({"model.name": "qwen9"}, r"unknown model 'qwen9'"),
    ({"cluster.network": "tcp-100"}, r"unknown network"),
    ({"workload.preset": "chess"}, r"unknown workload preset 'chess'"),
])
def test_bad_input_is_one_clear_line(sets, match):
    with pytest.raises(ValueError, match=match) as e:
        load_scenario(None, sets)
    assert "\n" not in str(e.value)


def test_unknown_key_in_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("[cluster]\nnodez = 2\n")
    with pytest.raises(ValueError, match=r"cluster.nodez.*did you mean cluster.nodes"):
        load_scenario(p)


def test_every_key_round_trips_through_to_flat():
    flat = load_scenario(None).to_flat()
    assert set(flat) == set(KEYS)
