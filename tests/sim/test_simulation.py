"""The simulated RL iteration: fine vs fast agreement, OOM under a static plan vs the
cost-model selector, dispatch on the link model, re-shard charging, link contention.

    python -m pytest tests/sim/test_simulation.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from earl.cost_model import CostModel
from earl.sim.cluster import Cluster
from earl.sim.scenario import load_scenario
from earl.sim.simulation import Simulation
from earl.specs import NETWORK_CATALOG, ClusterSpec, HardwareSpec, ModelSpec

SMALL = {"workload.episodes_per_step": "24", "scenario.steps": "3"}


def small(**extra) -> dict:
    return {**SMALL, **{k.replace("__", "."): str(v) for k, v in extra.items()}}


def test_fine_mode_agrees_with_fast_mode():
    sc = load_scenario("connect-four-small", small(workload__growth_steps=2, scenario__steps=2,
                                                   workload__episodes_per_step=16))
    fast = Simulation(sc, "static", "centralized", fine=False).run()
    fine = Simulation(sc, "static", "centralized", fine=True).run()
    for a, b in zip(fast.rows, fine.rows, strict=True):
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=0.05)
        assert a["rollout_s"] == pytest.approx(b["rollout_s"], rel=1e-6)  # in fact exact
        assert a["generated_tokens"] == b["generated_tokens"]
    assert fine.events > 5 * fast.events


def test_static_plan_hits_oom_as_context_grows_and_cost_model_does_not():
    sets = small(scenario__steps=14, workload__episodes_per_step=48, workload__growth_steps=12)
    sc = load_scenario("connect-four-small", sets)
    static = Simulation(sc, "static", "layout-aware").run()
    smart = Simulation(sc, "cost-model", "layout-aware").run()
    s_oom = [r["oom_events"] for r in static.rows]
    assert s_oom[0] == 0 and sum(s_oom) > 10  # fine at first, OOM once context has grown
    assert all(r["plan_train"] == "tp1-dp8-mb1-zero" for r in static.rows)
    assert sum(r["oom_events"] for r in smart.rows) == 0
    assert len({r["plan_train"] for r in smart.rows}) > 1  # it moved before running out
    # both saw the same episodes; the cost-model run trained all of them
    assert [r["context_max"] for r in static.rows] == [r["context_max"] for r in smart.rows]
    assert sum(r["trained_episodes"] for r in smart.rows) == 14 * 48
    tput = [sum(r["trained_tokens"] for r in s.rows) / s.env.now for s in (static, smart)]
    assert tput[1] > tput[0]


def test_oom_restart_is_charged_once_per_failing_step():
    sets = small(scenario__steps=14, workload__episodes_per_step=48, workload__growth_steps=12)
    base = Simulation(load_scenario("connect-four-small", sets), "static", "layout-aware").run()
    sets["failure.oom_restart_s"] = "300"
    charged = Simulation(load_scenario("connect-four-small", sets), "static", "layout-aware").run()
    failing = [r["oom_events"] > 0 for r in base.rows]
    assert any(failing) and not all(failing)
    assert [r["restart_s"] for r in charged.rows] == [300.0 if f else 0.0 for f in failing]
    for a, b, f in zip(base.rows, charged.rows, failing, strict=True):
        assert b["step_time_s"] == pytest.approx(a["step_time_s"] + (300.0 if f else 0.0))
    assert any(s.name == "restart after OOM" for s in charged.spans)


def test_reshard_is_charged_exactly_when_the_plan_changes():
    sc = load_scenario("connect-four-small", small(plan__train="tp2-dp4-mb1-rc-full-zero"))
    sim = Simulation(sc, "static", "centralized").run()
    cm = sim.cm
    plans = sc.stage_plan()
    expect = cm.reshard(plans.train, plans.experience).time_s
    assert expect > 0
    # weights live in the training layout: every step re-shards them for experience preparation
    # and syncs them to the rollout layout (step 0 starts from the initial rollout weights)
    for r in sim.rows:
        assert r["reshard_s"] == pytest.approx(expect, rel=1e-12)
        assert r["sync_s"] == pytest.approx(cm.reshard(plans.train, plans.rollout).time_s, rel=1e-12)
    same = Simulation(load_scenario("connect-four-small", small()), "static", "centralized").run()
    assert all(r["reshard_s"] == 0.0 and r["sync_s"] == 0.0 for r in same.rows)


def test_layout_aware_dispatch_beats_centralized_on_the_links():
    sets = small(cluster__nodes=2, plan__rollout="tp1-dp16", plan__experience="tp1-dp16",
                 plan__train="tp2-dp8-mb1-rc-full-zero", cluster__network="tcp-200g")
    sc = load_scenario("connect-four-small", sets)
    cen = Simulation(sc, "static", "centralized").run()
    lay = Simulation(sc, "static", "layout-aware").run()
    for a, b in zip(cen.rows, lay.rows, strict=True):
        assert a["dispatch_s"] > b["dispatch_s"] > 0
        assert a["rollout_s"] == pytest.approx(b["rollout_s"], rel=1e-9)  # same workload
    span = next(s for s in cen.spans if s.stage == "dispatch")
    assert span.bytes > 0 and span.args["phases"] == 2


def test_dispatch_is_the_cost_models_price_of_the_dispatchers_plan(monkeypatch):
    """One dispatch model: the simulator holds each step for exactly what
    earl.cost_model.dispatch.price_transfer_plan charges for the plan the dispatcher made."""
    import earl.sim.simulation as it

    priced = []
    real = it.price_transfer_plan

    def spy(cm, tplan, **kw):
        est = real(cm, tplan, **kw)
        priced.append((tplan.kind, est.time_s))
        return est

    monkeypatch.setattr(it, "price_transfer_plan", spy)
    sets = small(cluster__nodes=2, plan__rollout="tp1-dp16", plan__experience="tp1-dp16",
                 plan__train="tp2-dp8-mb1-rc-full-zero", cluster__network="tcp-200g")
    res = Simulation(load_scenario("connect-four-small", sets), "static", "layout-aware").run()
    assert [t for _, t in priced] == pytest.approx([r["dispatch_s"] for r in res.rows], rel=1e-9)
    assert {k for k, _ in priced} == {"layout-aware"}


def test_concurrent_transfers_contend_for_a_nic():
    hw = HardwareSpec.from_name("h100-sxm-80gb")
    spec = ClusterSpec(hardware=hw, nodes=2, network=NETWORK_CATALOG["tcp-200g"])
    cm = CostModel(ModelSpec.from_name("qwen2.5-7b"), spec)
    one = cm.transfer_time_s(1e9, 0, 8)

    def run(pairs):
        env = simpy.Environment()
        cl = Cluster(env, spec, cm)
        env.process(cl.run_phases([[(s, d, int(1e9)) for s, d in pairs]]))
        env.run()
        return env.now, cl

    t, _ = run([(0, 8)])
    assert t == pytest.approx(one)
    t, cl = run([(0, 8), (1, 9)])  # both leave node 0 through its one NIC
    assert t == pytest.approx(2 * one)
    assert cl.link_utilisation(t)["nic"] == pytest.approx(1.0)
    t, _ = run([(0, 1), (2, 3)])  # NVLink ports are per GPU: no contention
    assert t == pytest.approx(cm.transfer_time_s(1e9, 0, 1))
    with pytest.raises(ValueError, match="no GPUs|outside"):
        run([(0, 99)])


def test_spans_and_rows_cover_every_stage():
    sim = Simulation(load_scenario("connect-four-small", small()), "cost-model", "layout-aware").run()
    stages = {s.stage for s in sim.spans}
    assert {"select", "rollout", "experience", "dispatch", "train"} <= stages
    assert sum(1 for s in sim.spans if s.stage == "rollout" and s.step == 0) == 8  # 8 replicas
    for r in sim.rows:
        parts = r["rollout_s"] + r["experience_s"] + r["dispatch_s"] + r["train_s"] + \
            r["reshard_s"] + r["sync_s"]
        assert r["step_time_s"] == pytest.approx(parts, rel=1e-9)
        assert 0 < r["headroom_min"] < 1
    assert len(sim.decisions) == 3 * 3  # three stages per step


def test_head_on_generated_prices_less_experience_and_training():
    """`head_on="generated"` (earl validate's model of the runtime, whose LM head runs on the
    generated positions only) lowers the experience and train stages, nothing else."""
    sc = load_scenario("connect-four-small", small(scenario__steps=2))
    full = Simulation(sc, "static", "layout-aware").run()
    gen = Simulation(sc, "static", "layout-aware", head_on="generated").run()
    for a, b in zip(full.rows, gen.rows, strict=True):
        assert b["experience_s"] < a["experience_s"] and b["train_s"] < a["train_s"]
        assert b["rollout_s"] == pytest.approx(a["rollout_s"])
    with pytest.raises(ValueError, match="head_on"):
        Simulation(sc, "static", "layout-aware", head_on="some")


def test_train_placement_balanced_dispatches_like_the_runtime():
    """`train_placement="balanced"` with `handoff` (earl validate's model of the runtime,
    earl.runtime.step.train): the dispatch starts from the hand-off's experience layout and
    places the training samples with balance_samples; the default keeps experience groups
    together (balance_aligned). Only the dispatch changes."""
    from earl.policies.balance import balance_samples

    sc = load_scenario("connect-four-small", small(scenario__steps=2))
    calls = []

    def recording(sim):
        plan = sim.dispatcher.plan

        def wrapped(src, dst, samples):
            calls.append((src, dst, samples))
            return plan(src, dst, samples)

        sim.dispatcher.plan = wrapped
        return sim.run()

    aligned = Simulation(sc, "static", "layout-aware", handoff=True).run()
    bal = recording(Simulation(sc, "static", "layout-aware", handoff=True, train_placement="balanced"))
    assert len(calls) == 2 * len(bal.rows)  # per step: the hand-off, then the dispatch
    for (_, handoff_dst, _), (src, dst, samples) in zip(calls[::2], calls[1::2], strict=True):
        assert src.assignment == handoff_dst.assignment
        assert dst.assignment == balance_samples(samples, dst.plan.dp)[0]
    for a, b in zip(aligned.rows, bal.rows, strict=True):
        assert b["rollout_s"] == pytest.approx(a["rollout_s"]) and b["train_s"] == pytest.approx(a["train_s"])
    with pytest.raises(ValueError, match="train_placement"):
        Simulation(sc, "static", "layout-aware", train_placement="random")


def test_no_statistics_reductions_prices_dispatch_without_the_statistics_reduce():
    """`stat_reductions=0` (earl validate's model of the runtime with a group estimator, whose
    statistics come from the rewards every rank holds): each dispatch is priced on its plan less
    the statistics all-reduce, so it has no `advantage_stats` term and is cheaper; nothing else
    changes."""
    sc = load_scenario("connect-four-small", small(scenario__steps=2))
    base = Simulation(sc, "static", "layout-aware").run()
    meta = Simulation(sc, "static", "layout-aware", stat_reductions=0).run()

    def dispatches(sim):
        return [s for s in sim.spans if s.stage == "dispatch"]

    assert dispatches(base) and len(dispatches(base)) == len(dispatches(meta))
    for a, b in zip(dispatches(base), dispatches(meta), strict=True):
        assert a.args["reduce_bytes"] > 0 and "advantage_stats" in a.args["breakdown_s"]
        assert b.args["reduce_bytes"] == 0 and "advantage_stats" not in b.args["breakdown_s"]
        assert b.duration_s < a.duration_s
    with pytest.raises(ValueError, match="stat_reductions must be an int >= 0.*got -1"):
        Simulation(sc, "static", "layout-aware", stat_reductions=-1)
    for a, b in zip(base.rows, meta.rows, strict=True):
        assert b["rollout_s"] == pytest.approx(a["rollout_s"]) and b["train_s"] == pytest.approx(a["train_s"])


def _one_process_sim(tmp_path, prompt: int, prompt_group: int, gpus: int = 1) -> Simulation:
    """earl validate's model of a one-process runtime step on a recorded trace: 16 episodes in
    groups of 4, each opening on `prompt` tokens then 8 generated, 8 observed, 8 generated."""
    import json

    from earl.sim.scenario import Scenario
    from earl.sim.workload import WorkloadSpec

    trace = tmp_path / f"w{prompt}.jsonl"
    trace.write_text("".join(json.dumps({"step": s, "episodes": [
        {"id": i, "turns": [[prompt, 8, 0.0], [8, 8 + i % 4, 0.0]]} for i in range(16)]}) + "\n" for s in (1, 2)))
    sc = Scenario(name="validate", steps=2, model="tiny", hardware="cpu", nodes=1, gpus_per_node=gpus,
                  workload=WorkloadSpec(episodes_per_step=16, trace=str(trace), max_context=4096),
                  rollout_plan=f"dp{gpus}", experience_plan=f"dp{gpus}", train_plan=f"dp{gpus}")
    return Simulation(sc, "static", "layout-aware", padded=True, token_budget=16384, head_on="generated",
                      prompt_group=prompt_group)


def test_shared_prompts_price_the_groups_prompt_once(tmp_path):
    """`prompt_group` (earl validate): a group's prompt is prefilled once by the rollout engine
    and runs once in the log-prob and training forwards, as the runtime's engine and trainer run
    it (earl.runtime.engine.pytorch, earl.runtime.trainer._shared_prefixes): those three stages
    cheaper, nothing else; the trainer's not where sharing saves under SHARE_MIN_FRAC of the
    tokens, nor on a plan of more than one device (FSDP2 / DTensor parameters do not share)."""
    whole = _one_process_sim(tmp_path, 48, 0).run()
    shared = _one_process_sim(tmp_path, 48, 4).run()
    for a, b in zip(whole.rows, shared.rows, strict=True):
        # 16 rows of 72-75 tokens -> 4 prefix rows of 47 + 16 suffix rows of 25-28: about half the tokens
        assert 0.3 * a["train_s"] < b["train_s"] < 0.8 * a["train_s"]
        assert 0.3 * a["experience_s"] < b["experience_s"] < 0.8 * a["experience_s"]
        # the engine prefills a group's 47-token prompt once (the runtime engine's `_forward_mixed`)
        assert b["rollout_s"] < a["rollout_s"] and b["dispatch_s"] == pytest.approx(a["dispatch_s"])
    # a 2-token prompt: 3 x 1 token of 16 x ~27 saved, under 10%: the rows run whole
    short = [_one_process_sim(tmp_path, 2, g).run().rows for g in (0, 4)]
    assert [r["train_s"] for r in short[0]] == [r["train_s"] for r in short[1]]
    two = [_one_process_sim(tmp_path, 48, g, gpus=2).run().rows for g in (0, 4)]
    assert [r["train_s"] for r in two[0]] == [r["train_s"] for r in two[1]]
    with pytest.raises(ValueError, match="prompt_group"):
        _one_process_sim(tmp_path, 48, -1)


@pytest.mark.parametrize("passes", [0, 1, 2])
@pytest.mark.parametrize("experience_plan", ["tp1-dp8", "tp2-dp4"])
def test_the_training_dispatch_starts_warm_only_right_after_a_hand_off_that_ran_its_rounds(passes, experience_plan):
    """The dispatch's cold start (`cold_round_s` per round) is left out only where the hand-off
    just ran the executor's rounds (onto tp2-dp4 it sends between ranks and waits for them) and
    no log-prob pass ran since; a hand-off of local copies (onto the aligned tp1-dp8) runs no
    round, and the rollout before it left them cold."""
    sc = load_scenario("connect-four-small", small(scenario__steps=2, experience__logprob_passes=str(passes),
                                                   plan__experience=experience_plan))
    sim = Simulation(sc, "static", "layout-aware", handoff=True, train_placement="balanced")
    prof = sim.cm.profile
    sim.cm = sim.cm.with_profile(dataclasses.replace(
        prof, dispatch_path=dataclasses.replace(prof.dispatch_path, cold_round_s=5e-4)))
    sim.run()
    handoffs = {s.step: s.args["waits"] for s in sim.spans if s.name.startswith("hand-off")}
    moves = [s for s in sim.spans if s.stage == "dispatch"]
    assert moves and set(handoffs.values()) == {experience_plan == "tp2-dp4"}
    for s in moves:
        cold = passes > 0 or not handoffs[s.step]
        assert ("cold_start" in s.args["breakdown_s"]) == cold
        if cold:
            assert s.args["breakdown_s"]["cold_start"] > 0


def test_the_ranks_leaving_the_training_dispatch_first_collate_their_batch_on_the_last_ones_cores():
    """The training dispatch's `leavers`: each rank that leaves it collates its share into its
    padded batch before its training step (`CostModel.dispatch_lead_s`); where the node's ranks
    outnumber its cores the last one loses that x (ranks / cores - 1). A fixed collation cost F
    on 8 ranks of 2 cores: 3 F; a per-sequence one adds to it; none where every rank has a core."""
    sc = load_scenario("connect-four-small", small(scenario__steps=2))

    def leavers(host_parallel: int, **collate) -> list[float]:
        sim = Simulation(sc, "static", "layout-aware", handoff=True, train_placement="balanced")
        prof = sim.cm.profile
        sim.cm = sim.cm.with_profile(dataclasses.replace(
            prof, dispatch_path=dataclasses.replace(prof.dispatch_path, host_parallel=host_parallel),
            **{"experience_fixed_s": 0.0, "experience_seq_s": 0.0, "experience_token_s": 0.0, **collate}))
        sim.run()
        return [s.args["breakdown_s"].get("leavers", 0.0) for s in sim.spans if s.stage == "dispatch"]

    fixed = leavers(2, experience_fixed_s=4e-4)
    assert fixed and all(x == pytest.approx(3 * 4e-4) for x in fixed)
    assert all(a > b for a, b in zip(leavers(2, experience_fixed_s=4e-4, experience_seq_s=1e-5), fixed, strict=True))
    assert set(leavers(8, experience_fixed_s=4e-4)) == {0.0} and set(leavers(2)) == {0.0}
