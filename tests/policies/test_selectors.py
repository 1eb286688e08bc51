"""Selector tests: static, earl-table and cost-model on Qwen2.5-72B over 16 x 8 H100.

    pytest tests/policies/test_selectors.py
"""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from earl.cost_model import CostModel, rank_plans
from earl.policies import (
    DISPATCHERS,
    SELECTORS,
    explain_selection,
    format_decision,
    make_dispatcher,
    make_selector,
)
from earl.specs import ClusterSpec, HardwareSpec, ModelSpec, ParallelPlan, Stage, StagePlan, WorkloadStats

GPUS = 128


@pytest.fixture(scope="module")
def cm():
    return CostModel(ModelSpec.from_name("qwen2.5-72b"),
                     ClusterSpec(hardware=HardwareSpec.from_name("h100-sxm-80gb"), nodes=16))


def same(plan: ParallelPlan) -> StagePlan:
    return StagePlan(rollout=plan, experience=plan, train=plan)


def stats(step, mean, p95=None, mx=None, n=512, **kw) -> WorkloadStats:
    return WorkloadStats(step=step, num_responses=n, context_mean=mean, context_p95=p95 or mean,
                         context_max=mx or p95 or mean, **kw)


def test_registry_and_unknown_names(cm):
    assert set(SELECTORS) == {"static", "earl-table", "cost-model"}
    assert set(DISPATCHERS) == {"centralized", "layout-aware"}
    with pytest.raises(ValueError, match="valid: static, earl-table, cost-model"):
        make_selector("greedy", cost_model=cm, initial=same(ParallelPlan(tp=8, dp=-1)), stage_gpus=GPUS)
    with pytest.raises(ValueError, match="valid: centralized, layout-aware"):
        make_dispatcher("p2p")
    with pytest.raises(ValueError, match="cost-model"):
        make_selector("cost-model", cost_model=cm, initial=same(ParallelPlan(tp=8, dp=-1)),
                      stage_gpus=GPUS, hysterisis=0.2)
    with pytest.raises(ValueError, match="stage has 128 GPUs"):
        make_selector("static", cost_model=cm, initial=same(ParallelPlan(tp=8, dp=4)), stage_gpus=GPUS)


@pytest.mark.parametrize("name", ["static", "earl-table", "cost-model"])
def test_every_decision_has_reason_and_numbers(cm, name):
    plan = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True)
    sel = make_selector(name, cost_model=cm, initial=same(plan), stage_gpus=GPUS)
    for stage in Stage:
        d = sel.select(stage, stats(0, 6000, 9000, 12000, response_tokens_mean=3000), plan)
        assert d.stage is stage and d.reason
        assert d.plan.world_size == GPUS
        p = d.predicted
        assert p["selector"] == name
        assert p["tokens_per_gpu_s"] > 0 and 0 < p["memory_frac"] < 1 and p["stage_time_s"] > 0
        assert "reshard_s" in p
        text = format_decision(d)
        assert d.plan.describe() in text and "reason:" in text


def test_static_never_moves(cm):
    plan = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True)
    sel = make_selector("static", cost_model=cm, initial=same(plan), stage_gpus=GPUS)
    for k, ctx in enumerate([2000, 20000, 60000]):
        d = sel.select(Stage.TRAIN, stats(k, ctx), plan)
        assert d.plan == plan and not d.switched
    assert not d.predicted["feasible"]  # 60k tokens does not fit: static reports it, stays


def test_earl_table_switches_on_range_change_rollout_only(cm):
    start = ParallelPlan(tp=8, dp=16)
    # 64 responses per GPU: enough that tp4's extra replicas win at short context
    sel = make_selector("earl-table", cost_model=cm, initial=same(start), stage_gpus=GPUS,
                        profile_batch=8192)
    # every range's plan is the profiled best at its probe context
    for plan, tput, probe in sel.table:
        best = rank_plans(cm, "decode", GPUS, 8192, probe, top=1)[0]
        assert plan == best[0] and tput == pytest.approx(best[1].tokens_per_gpu_s)
    seen, cur = [], start
    for k, ctx in enumerate([1500, 1600, 3000, 40000, 60000, 100000, 1700]):
        d = sel.select(Stage.ROLLOUT, stats(k, ctx), cur)
        want = sel.table[sel.range_of(ctx)][0]
        assert d.plan == want and d.switched == (want != cur)
        seen.append(d.plan)
        cur = d.plan
    assert len(set(seen)) >= 2  # the table holds different plans for short and long contexts
    d = sel.select(Stage.TRAIN, stats(9, 100000), start)
    assert d.plan == start and not d.switched and "rollout" in d.reason
    with pytest.raises(ValueError, match="increasing"):
        make_selector("earl-table", cost_model=cm, initial=same(start), stage_gpus=GPUS, ranges=(4096, 1024))


def growing(k: int) -> WorkloadStats:
    mx = 8192 + 3000 * k
    return stats(k, mx / 2, 0.9 * mx, mx)


def run_growth(cm, steps=12, **options):
    """Step k's plan is chosen from step k-1's statistics; returns (plan, actual max) per step."""
    start = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True)
    sel = make_selector("cost-model", cost_model=cm, initial=same(start), stage_gpus=GPUS, **options)
    cur, out = start, []
    for k in range(1, steps):
        d = sel.select(Stage.TRAIN, growing(k - 1), cur)
        out.append((d, growing(k).context_max))
        cur = d.plan
    return start, out


def fits(cm, plan, ctx) -> bool:
    return cm.memory("train", plan, 512, int(ctx)).fits


def test_cost_model_switches_before_growth_makes_the_plan_infeasible(cm):
    start, run = run_growth(cm)
    # the starting plan stops fitting somewhere in the run (so the test means something) ...
    assert fits(cm, start, growing(0).context_max) and not fits(cm, start, growing(11).context_max)
    # ... the selector left it while it still fitted the observed and the coming contexts ...
    first = next(i for i, (d, _) in enumerate(run) if d.switched)
    observed = growing(first).context_max
    assert fits(cm, start, observed) and fits(cm, start, run[first][1])
    assert "would not fit ahead" in run[first][0].reason
    assert run[first][0].predicted["growth_max_per_step"] == pytest.approx(3000)
    # ... and no step ever ran a plan that does not fit that step's real longest sequence
    assert all(fits(cm, d.plan, actual) for d, actual in run)
    # the chosen training plans trade recompute / cp for memory together with tp and pp
    assert any(d.plan.recompute != "none" or d.plan.cp > 1 for d, _ in run)


def test_without_tail_trend_and_margin_it_would_oom(cm):
    """The same selector looking only at the observed max with no margin walks into an OOM:
    what the projection above prevents."""
    _, run = run_growth(cm, margin=0.0, lookahead_steps=0.0)
    assert not all(fits(cm, d.plan, actual) for d, actual in run)


def test_cost_model_train_choice_is_the_best_that_fits(cm):
    """Fresh stats on the scoring grid, switch and sync cost off: the pick must match the
    best throughput among rank_plans' feasible plans that leave the 10% margin free."""
    ctx = 16384
    start = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True, recompute="full")
    sel = make_selector("cost-model", cost_model=cm, initial=same(start), stage_gpus=GPUS,
                        patience=1, amortize_steps=1e12, charge_sync=False)
    d = sel.select(Stage.TRAIN, stats(0, ctx), start)
    ok = [(p, e) for p, e in rank_plans(cm, "train", GPUS, 512, ctx)
          if e.feasible and e.memory.total <= 0.9 * e.memory.capacity]
    best = max(e.tokens_per_gpu_s for _, e in ok)
    assert d.predicted["tokens_per_gpu_s"] == pytest.approx(best, rel=1e-9)
    assert d.plan in [p for p, e in ok if e.tokens_per_gpu_s == pytest.approx(best, rel=1e-9)]


def test_hysteresis_prevents_flapping_on_noisy_stats(cm):
    """Rollout contexts fluctuating +-8% around the range where tp4 and tp8 replicas trade
    places: a greedy argmax flips plans many times, the cost-model selector at most once."""
    start = ParallelPlan(tp=8, dp=16)

    def switches(seed, c0, **options):
        sel = make_selector("cost-model", cost_model=cm, initial=same(start), stage_gpus=GPUS, **options)
        rng, cur, n = random.Random(seed), start, 0
        for k in range(30):
            m = c0 * rng.lognormvariate(0, 0.08)
            d = sel.select(Stage.ROLLOUT, stats(k, m, 1.3 * m, 1.5 * m, n=8192, response_tokens_mean=m / 2), cur)
            n += d.switched
            cur = d.plan
        return n

    # with 8,192 responses on 128 GPUs, tp4 and tp8 trade places near 1,600 tokens
    cases = [(seed, c0) for seed in range(2) for c0 in (1450, 1600, 1750)]
    greedy = [switches(s, c, history=1, hysteresis=0.0, patience=1, amortize_steps=1e12) for s, c in cases]
    ours = [switches(s, c) for s, c in cases]
    assert sum(greedy) >= 20  # the noise really crosses the plans' crossover
    assert max(ours) <= 1


def test_measured_headroom_scales_memory_predictions(cm):
    plan = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True)
    sel = make_selector("cost-model", cost_model=cm, initial=same(plan), stage_gpus=GPUS)
    calm = sel.select(Stage.TRAIN, stats(0, 8000), plan)
    assert calm.predicted["memory_scale"] == 1.0
    frac = calm.predicted["current"]["memory_frac"]
    tight = sel.select(Stage.TRAIN, stats(1, 8000, memory_headroom_frac=1 - 1.5 * frac), plan)
    assert tight.predicted["memory_scale"] == pytest.approx(1.5, rel=1e-6)
    assert tight.predicted["current"]["memory_frac"] == pytest.approx(1.5 * frac, rel=1e-6)


def test_explain_selection(cm):
    plan = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True)
    history = [growing(k) for k in range(3)]
    d = explain_selection("cost-model", cm, "train", growing(3), plan, history=history)
    assert d.switched and d.predicted["growth_max_per_step"] == pytest.approx(3000)
    text = format_decision(d)
    assert "candidate" in text and d.plan.describe() in text
    assert math.isfinite(d.predicted["stage_time_s"])
    with pytest.raises(ValueError, match="valid"):
        explain_selection("nope", cm, "train", growing(3), plan)


def test_policies_import_without_torch_or_simpy():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['simpy'] = None\n"
        "import earl.policies as P\n"
        "from earl.policies.types import Layout, Sample\n"
        "from earl.specs import ParallelPlan\n"
        "s = [P.Sample(i, 10 + i) for i in range(4)]\n"
        "a, _ = P.balance_samples(s, 2)\n"
        "L = Layout(ParallelPlan(dp=2), a)\n"
        "for n in P.DISPATCHERS: P.make_dispatcher(n).plan(L, L, s)\n"
        "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_context_grid_rounds_up_idempotently():
    from earl.policies.selectors import quantize_context
    rng = random.Random(0)
    for x in [1, 16, 17, 1000, 1024, 16384, 16385, 131072] + [rng.uniform(1, 3e5) for _ in range(2000)]:
        q = quantize_context(x)
        assert x <= q <= max(16, 1.1 * x) + 16 and q % 16 == 0
        assert quantize_context(q) == q


def test_weight_sync_is_charged_every_step(cm):
    """A rollout plan unlike the training layout pays the train -> rollout sync every step."""
    train = ParallelPlan(tp=8, pp=4, dp=4, sharded_optimizer=True, recompute="full")
    init = StagePlan(rollout=ParallelPlan(tp=8, dp=16), experience=train, train=train)
    sel = make_selector("cost-model", cost_model=cm, initial=init, stage_gpus=GPUS)
    d = sel.select(Stage.ROLLOUT, stats(0, 4000, response_tokens_mean=2000), init.rollout)
    rows = {c["plan"]: c for c in d.predicted["candidates"]}
    for plan_text, row in rows.items():
        plan = ParallelPlan.parse(plan_text)
        want = cm.reshard(train, plan).time_s
        assert row["sync_s"] == pytest.approx(want)
        assert row["effective_time_s"] >= row["stage_time_s"] + want - 1e-9
    assert d.predicted["current"]["sync_s"] == pytest.approx(cm.reshard(train, init.rollout).time_s)
    assert sel.in_use[Stage.ROLLOUT] == d.plan
