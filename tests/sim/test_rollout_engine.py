"""Exact event logs of the rollout engine on tiny scenarios, checked against the cost model's
hooks by hand (each expected time is written out from `mixed_step_time_s` and
`decode_step_time_s`), in both the fast (closed-form) and fine (per-iteration) modes.

    python -m pytest tests/sim/test_rollout_engine.py -q
"""

from __future__ import annotations

import pytest
import simpy

from earl.cost_model import CostModel
from earl.sim.rollout_engine import AffineCache, DecodeClock, Replica
from earl.sim.workload import Episode
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec


def one_gpu(model: str) -> CostModel:
    hw = HardwareSpec.from_name("h100-sxm-80gb")
    return CostModel(ModelSpec.from_name(model), ClusterSpec(hardware=hw, nodes=1, gpus_per_node=1))


def run_replica(cm, episodes, fine=False, max_num_seqs=256):
    env = simpy.Environment()
    log: list = []
    r = Replica(env, cost_model=cm, tp=1, episodes=episodes, fine=fine, log=log,
                max_num_seqs=max_num_seqs)
    env.run()
    return r, log


def batch_events(log):
    """The batch-change events (everything but the decode segments, whose count is mode-dependent)."""
    return [(t, kind, ep, kw) for t, _, kind, ep, kw in log if kind != "decode"]


def decode_sum(cm, n: int, context: int, steps: int) -> float:
    """Seconds of `steps` decode iterations of `n` sequences from total context `context`."""
    return sum(cm.decode_step_time_s(1, n, context + j * n) for j in range(steps))


def mixed_extra(cm, turns: list[tuple[int, int]], running: int, context: int) -> float:
    """Seconds admitting `turns` ((new tokens, cached prefix) each) adds to the next iteration
    of `running` sequences at total context `context`: the mixed forward less a plain decode step
    of everyone."""
    new = sum(n for n, _ in turns)
    kv = sum(n + p for n, p in turns)
    mixed = cm.mixed_step_time_s(1, new, len(turns), sum(n * (n + p) for n, p in turns), kv, running, context)
    return mixed - cm.decode_step_time_s(1, running + len(turns), context + kv)


@pytest.mark.parametrize("fine", [False, True])
def test_two_episodes_one_replica_by_hand(fine):
    cm = one_gpu("qwen2.5-7b")
    a = Episode(id=0, turns=((100, 10, 0.0),))  # prompt 100, generate 10, done
    b = Episode(id=1, turns=((50, 5, 0.5), (20, 3, 0.0)))  # 2 turns, 0.5 s tool call between
    r, log = run_replica(cm, [a, b], fine=fine)

    # t=0: both prompts prefill in one mixed forward that samples each one's first token: the
    # first of 5 iterations with both running (contexts 100+50 = 150, +2 per iteration), priced
    # as the mixed step; then B's turn ends
    p0 = mixed_extra(cm, [(100, 0), (50, 0)], 0, 0)
    t1 = p0 + decode_sum(cm, 2, 150, 5)
    # A alone: context 105, 5 more tokens; B is back at t1 + 0.5, long after (ms per token)
    t2 = t1 + decode_sum(cm, 1, 105, 5)
    # B returns, prefills its 20 observation tokens on top of its 55 cached ones, decodes 3
    t3 = t1 + 0.5
    p3 = mixed_extra(cm, [(20, 55)], 0, 0)
    t4 = t3 + p3 + decode_sum(cm, 1, 75, 3)
    expected = [
        (0.0, "prefill", None, {"seqs": [0, 1], "tokens": 150, "time_s": p0}),
        (t1, "turn_end", 1, {"context": 55, "back_at": t1 + 0.5}),
        (t2, "done", 0, {"context": 110, "finish": t2}),
        (t3, "arrive", 1, {"tokens": 20}),
        (t3, "prefill", None, {"seqs": [1], "tokens": 20, "time_s": p3}),
        (t4, "done", 1, {"context": 78, "finish": t4}),
    ]
    got = batch_events(log)
    assert [(k, e) for _, k, e, _ in got] == [(k, e) for _, k, e, _ in expected]
    for (tg, _, _, kg), (te, _, _, ke) in zip(got, expected, strict=True):
        assert tg == pytest.approx(te, rel=1e-9, abs=1e-12)
        assert kg.keys() == ke.keys()
        for key in ke:
            assert kg[key] == pytest.approx(ke[key], rel=1e-9)
    st = r.stats
    assert st.generated_tokens == 10 + 5 + 3
    assert st.prefill_tokens == 100 + 50 + 20
    assert st.finished == {0: pytest.approx(t2, rel=1e-9), 1: pytest.approx(t4, rel=1e-9)}
    assert (st.preemptions, st.evictions, st.oom_episodes) == (0, 0, [])
    # fast mode: 3 decode segments (5 + 5 + 3 iterations); fine mode: one per iteration
    decodes = [kw["iterations"] for _, _, kind, _, kw in log if kind == "decode"]
    assert decodes == ([1] * 13 if fine else [5, 5, 3])


def test_arrival_interrupts_decoding_at_the_next_iteration():
    """A sequence coming back from its tool call joins at the first iteration boundary after it."""
    cm = one_gpu("qwen2.5-7b")
    f = cm.decode_step_time_s(1, 1, 100)  # about one iteration
    a = Episode(id=0, turns=((100, 50, 0.0),))
    b = Episode(id=1, turns=((10, 1, 2.5 * f), (10, 1, 0.0)))
    _, log = run_replica(cm, [a, b])
    ev = batch_events(log)
    t_turn = next(t for t, k, e, _ in ev if k == "turn_end" and e == 1)
    t_arrive = next(t for t, k, e, _ in ev if k == "arrive")
    # B's tool answer lands mid-iteration; A's iterations after B left: contexts 101, 102, ...
    steps, t = 0, t_turn
    while t < t_turn + 2.5 * f:
        t += cm.decode_step_time_s(1, 1, 101 + steps)
        steps += 1
    assert t_arrive == pytest.approx(t, rel=1e-9)
    assert steps == 3


def test_kv_full_preempts_the_newest_and_recomputes_it():
    cm = one_gpu("qwen2.5-32b")
    cap = cm.kv_capacity_tokens(1)
    gen = int(0.6 * cap)
    a = Episode(id=0, turns=((100, gen, 0.0),))
    b = Episode(id=1, turns=((100, gen, 0.0),))
    r, log = run_replica(cm, [a, b])
    ev = batch_events(log)
    # both decode until the cache is full: k iterations of 2 sequences from 200 tokens
    k = (cap - 200) // 2
    p0 = mixed_extra(cm, [(100, 0), (100, 0)], 0, 0)
    t_pre = p0 + decode_sum(cm, 2, 200, k)
    kinds = [(kind, e) for _, kind, e, _ in ev]
    assert kinds == [("prefill", None), ("preempt", 1), ("done", 0), ("prefill", None), ("done", 1)]
    assert ev[1][0] == pytest.approx(t_pre, rel=1e-9)
    assert ev[1][3]["context"] == 100 + k
    # A finishes alone; B then recomputes its whole context (100 + k) and finishes its turn
    t_a = t_pre + decode_sum(cm, 1, 100 + k, gen - k)
    assert ev[2][0] == pytest.approx(t_a, rel=1e-9)
    t_b = t_a + mixed_extra(cm, [(100 + k, 0)], 0, 0) + decode_sum(cm, 1, 100 + k, gen - k)
    assert ev[4][0] == pytest.approx(t_b, rel=1e-9)
    assert r.stats.preemptions == 1
    assert r.stats.recompute_tokens == 100 + k
    assert r.stats.generated_tokens == 2 * gen


def test_sequence_that_can_never_fit_is_an_oom_event():
    cm = one_gpu("qwen2.5-32b")
    cap = cm.kv_capacity_tokens(1)
    small = Episode(id=0, turns=((100, 20, 0.0),))
    huge = Episode(id=1, turns=((100, 50, 0.0), (200, cap, 0.0)))  # second turn overflows
    r, log = run_replica(cm, [small, huge])
    assert r.stats.oom_episodes == [1]
    oom = [kw for _, _, kind, e, kw in log if kind == "oom"]
    assert oom == [{"needs": 100 + 50 + 200 + cap, "capacity": cap}]
    assert set(r.stats.finished) == {0}
    assert r.used == 0  # every KV token given back


def test_environment_wait_keeps_cache_until_space_is_needed():
    """A cached (not running) sequence is evicted before a running one is preempted."""
    cm = one_gpu("qwen2.5-32b")
    cap = cm.kv_capacity_tokens(1)
    big = int(0.5 * cap)
    a = Episode(id=0, turns=((big, 10, 1e4), (10, 5, 0.0)))  # long prompt, then a slow tool
    b = Episode(id=1, turns=((100, 10, 0.0), (10, int(0.6 * cap), 0.0)))  # grows meanwhile
    r, log = run_replica(cm, [a, b])
    kinds = [(kind, e) for _, _, kind, e, _ in log if kind in ("evict", "preempt", "done")]
    assert kinds == [("evict", 0), ("done", 1), ("done", 0)]
    evict = next(kw for _, _, kind, _, kw in log if kind == "evict")
    assert evict == {"tokens": big + 10}
    # A comes back to an empty cache: it recomputes its whole context
    assert r.stats.recompute_tokens == big + 10
    assert (r.stats.evictions, r.stats.preemptions) == (1, 0)


def test_max_num_seqs_limits_the_batch():
    cm = one_gpu("qwen2.5-7b")
    eps = [Episode(id=i, turns=((10, 4, 0.0),)) for i in range(3)]
    r, log = run_replica(cm, eps, max_num_seqs=2)
    prefills = [kw["seqs"] for _, _, kind, _, kw in log if kind == "prefill"]
    assert prefills == [[0, 1], [2]]
    assert r.stats.peak_running == 2


def test_affine_cache_matches_the_hook_everywhere():
    cm = one_gpu("qwen2.5-7b")
    clock = DecodeClock(cm, 1)
    for n in (1, 3, 17, 64):
        for c in (n, 1_000, 37_777, 250_000, 999_000):
            assert clock.step(n, c) == pytest.approx(cm.decode_step_time_s(1, n, c), rel=1e-9)


def test_affine_cache_splits_a_kinked_function():
    calls = []

    def g(key, x):
        calls.append(x)
        return max(1.0 + 0.001 * x, 0.5 + 0.002 * x)  # kink at x = 500

    cache = AffineCache(g, wide_hi=10_000)
    assert cache.line(0, 10, 400) is not None
    assert cache.line(0, 10, 900) is None  # spans the kink
    for x in (3, 250, 499, 501, 800, 9_000):
        assert cache(0, x) == pytest.approx(g(0, x))


def test_decode_clock_sum_and_limit_agree_with_a_loop():
    cm = one_gpu("qwen2.5-7b")
    clock = DecodeClock(cm, 1)
    k, t = clock.run(8, 4_000, 300, None)
    assert k == 300 and t == pytest.approx(decode_sum(cm, 8, 4_000, 300), rel=1e-9)
    limit = 0.37 * t
    k, t = clock.run(8, 4_000, 300, limit)
    assert decode_sum(cm, 8, 4_000, k) >= limit > decode_sum(cm, 8, 4_000, k - 1)
    assert t == pytest.approx(decode_sum(cm, 8, 4_000, k), rel=1e-9)


@pytest.mark.parametrize("n, prompt, response", [(128, 8192, 1024), (256, 4096, 4096), (96, 8192, 8192)])
def test_cost_model_decode_preemption_agrees_with_the_engine(n, prompt, response):
    """The same KV-limited batch through the simulator's engine (recompute preemption) and the
    cost model's estimate (prefill + decode estimates, which charge the recompute): within 25%."""
    from earl.specs import ParallelPlan

    cm = one_gpu("qwen2.5-7b")
    r, _ = run_replica(cm, [Episode(id=i, turns=((prompt, response, 0.0),)) for i in range(n)], max_num_seqs=1024)
    assert r.stats.preemptions > 0 and r.stats.recompute_tokens > 0
    plan = ParallelPlan(tp=1)
    step = response // 64
    ests = [cm.decode(plan, n, prompt + j) for j in range(0, response, step)]
    assert "preempting" in {e.extras["status"] for e in ests}
    model = cm.prefill(plan, n, prompt).time_s + step * sum(e.time_s for e in ests)
    assert model == pytest.approx(r.stats.t_end, rel=0.25)
    assert all((e.breakdown["recompute"] > 0) == (e.extras["status"] == "preempting") for e in ests)


def test_decode_status_fits_preempting_cannot_run():
    from earl.specs import ParallelPlan

    cm = one_gpu("qwen2.5-7b")
    cap = cm.kv_capacity_tokens(1)
    fits = cm.decode(ParallelPlan(tp=1), 8, 4096)
    assert fits.extras["status"] == "fits" and fits.breakdown["recompute"] == 0
    assert fits.extras["engine_reserve_bytes"] == cm.reserve > 0
    pre = cm.decode(ParallelPlan(tp=1), 2 * (cap // 4096), 4096)
    assert pre.extras["status"] == "preempting" and pre.feasible
    # holding half the batch costs more than its two waves alone: the recompute is charged
    assert pre.time_s > 1.05 * pre.extras["waves"] * pre.extras["step_time_s"]
    none = cm.decode(ParallelPlan(tp=1), 1, cap + 1)
    assert not none.feasible and none.extras["status"] == "cannot run"


def test_group_members_admitted_together_prefill_their_prompt_once():
    """`prompt_group`: of a group's members admitted in one batch the first prefills the prompt,
    the others copy its KV (the runtime engine's `_forward_mixed`): fewer prefill tokens, the
    same KV held and the same tokens generated; later turns are each episode's own."""
    cm = one_gpu("qwen2.5-7b")
    eps = [Episode(id=i, turns=((200, 20, 0.0), (30, 10, 0.0))) for i in range(8)]
    env = simpy.Environment()
    whole = Replica(env, cost_model=cm, tp=1, episodes=eps)
    env.run()
    env = simpy.Environment()
    shared = Replica(env, cost_model=cm, tp=1, episodes=eps, prompt_group=4)
    env.run()
    assert whole.stats.prefill_tokens - shared.stats.prefill_tokens == 6 * 200  # 3 copies in each of 2 groups
    assert shared.stats.generated_tokens == whole.stats.generated_tokens
    assert shared.stats.peak_kv_tokens == whole.stats.peak_kv_tokens
    assert shared.stats.t_end < whole.stats.t_end


@pytest.mark.parametrize("fine", [False, True])
def test_kv_round_prices_every_row_at_the_longest_rounded_up(fine):
    """`kv_round` (the runtime engine's slot cache): a decode step of n rows attends n x the
    longest row's length rounded up, taken at the rounding's mean: 2 rows of 150 and 40 tokens
    decode as 2 x (151 + 31.5) positions per step, not 190; the mixed step that admits them is
    priced at the running rows' width the same way (none running here: unchanged)."""
    cm = one_gpu("qwen2.5-7b")
    eps = [Episode(id=0, turns=((150, 4, 0.0),)), Episode(id=1, turns=((40, 4, 0.0),))]
    env = simpy.Environment()
    log: list = []
    r = Replica(env, cost_model=cm, tp=1, episodes=eps, fine=fine, log=log, kv_round=64)
    env.run()
    p0 = mixed_extra(cm, [(150, 0), (40, 0)], 0, 0)
    # what admitting them adds to the first iteration, then 4 iterations at the padded width
    width = 2 * (150 + 1 + 63 / 2)
    assert r.stats.t_end == pytest.approx(p0 + decode_sum(cm, 2, width, 4), rel=1e-9)
    plain, _ = run_replica(cm, eps, fine=fine)
    assert plain.stats.t_end == pytest.approx(p0 + decode_sum(cm, 2, 190, 4), rel=1e-9)
    assert r.stats.t_end > plain.stats.t_end
    with pytest.raises(ValueError, match="kv_round"):
        from earl.sim.scenario import load_scenario
        from earl.sim.simulation import Simulation
        Simulation(load_scenario(None, {"scenario.steps": "1"}), "static", "centralized", kv_round=-1)
