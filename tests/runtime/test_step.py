"""One RL step (earl.runtime.step.run_step) on a world of one process: a real one-rank gloo
group, a real HF checkpoint written to a temp folder and loaded back, the real engine, game and
trainer. The step's row, statistics and decisions are checked against what the rank played, and
the training weights against the ones before the step; the budget check's memory figure against
the selector's cost model and the pre-launch resource check.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_step.py
"""

import math
import sys
from pathlib import Path

import pytest
import torch

from earl.cost_model.memory import MemoryBreakdown
from earl.policies.reshard import plan_reshard
from earl.runtime.dist import process_group
from earl.runtime.resolve import initial_plans, resolve_config, resolve_hardware, selector_cost_model
from earl.runtime.resources import estimate_bytes
from earl.runtime.step import first_stats, run_step, step_context
from earl.runtime.worker import Worker
from earl.specs import STEP_PHASES, ParallelPlan, Stage

sys.path.insert(0, str(Path(__file__).parent))
from chat_model import build_chat_model  # noqa: E402

GROUPS, GROUP_SIZE = 2, 2


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    model = build_chat_model(tmp_path_factory.mktemp("step") / "model")
    cfg = resolve_config(overrides={"model.path": str(model), "groups": GROUPS, "group_size": GROUP_SIZE,
                                    "steps": 2, "threads": 1, "sampling.max_new_tokens": "4"})
    with process_group() as (rank, world):
        torch.manual_seed(cfg.seed)
        worker = Worker(cfg, initial_plans(cfg, world), rank=rank, world=world)
        ctx = step_context(worker, resolve_hardware(cfg)[0])
        before = {n: t.clone() for n, t in worker.train_weights().items()}
        prev = first_stats(worker)
        row, stats, decisions, episodes = run_step(worker, ctx, 1, prev)
        after = worker.train_weights()
        yield dict(cfg=cfg, worker=worker, world=world, prev=prev, row=row, stats=stats, decisions=decisions,
                   episodes=episodes, before=before, after=after)


def test_the_step_row_is_what_the_rank_played(one_step):
    row, played, world = one_step["row"], one_step["worker"].played, one_step["world"]
    n = GROUPS * GROUP_SIZE
    assert world == 1 and row["step"] == 1 and row["world"] == 1
    assert sorted(t.episode_id for t in played) == list(range(n))  # one process plays every episode
    assert [t.group_id for t in sorted(played, key=lambda t: t.episode_id)] == [e // GROUP_SIZE for e in range(n)]
    assert row["episodes"] == n and row["samples_trained"] == n
    assert row["reward_mean"] == pytest.approx(sum(t.reward for t in played) / n)
    assert row["tokens"] == sum(len(t.token_ids) for t in played)
    assert row["gen_tokens_mean"] == pytest.approx(sum(t.generated_tokens for t in played) / n)
    # every generated token is trained on once; the engine's and the trainer's log-probs agree
    assert row["train_tokens"] == sum(sum(t.loss_mask) for t in played) > 0
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0
    assert row["logprob_diff_max"] < 1e-3
    assert all(row[f"{p}_s"] >= 0 for p in STEP_PHASES) and row["rollout_s"] > 0 and row["train_s"] > 0
    assert row["step_s"] >= row["rollout_s"] + row["train_s"]
    assert {sp.stage for sp in row["_spans"]} >= {"select", "rollout", "experience", "dispatch", "train"}
    assert {e["id"] for e in one_step["episodes"]} == set(range(n))


def test_the_step_statistics_and_decisions(one_step):
    stats, played, decisions = one_step["stats"], one_step["worker"].played, one_step["decisions"]
    lengths = sorted(len(t.token_ids) for t in played)
    assert stats.step == 1 and stats.num_responses == len(played)
    assert stats.context_mean == pytest.approx(sum(lengths) / len(lengths)) and stats.context_max == lengths[-1]
    assert stats.max_context == one_step["cfg"].sampling.max_context
    assert [d["stage"] for d in decisions if "event" not in d] == [s.value for s in Stage]
    plans = one_step["worker"].plans
    assert all(plans.for_stage(s).describe().startswith("tp1-dp1") for s in Stage)


def test_the_step_trained_the_weights(one_step):
    before, after, worker = one_step["before"], one_step["after"], one_step["worker"]
    assert before.keys() == after.keys()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed and all(torch.isfinite(after[n]).all() for n in after)
    assert worker.optim.step_count == one_step["cfg"].trainer.minibatches
    assert one_step["row"]["lr"] == pytest.approx(one_step["cfg"].trainer.lr)  # progress 0: the initial lr


def test_the_budget_check_and_the_selector_price_one_memory_figure(one_step):
    """One memory account: the runtime's budget check (Worker.memory) is the selector's cost
    model (earl run's, in the runtime's precision) to the byte, on a replicated and an FSDP2
    plan; only the device's reserve (selector) and the resident copies (runtime) are apart."""
    w, cfg, row = one_step["worker"], one_step["cfg"], one_step["row"]
    assert w.ref_model is None  # no KL term: no reference copy
    cm = selector_cost_model(w.policy.spec, resolve_hardware(cfg)[0], 1, cfg.model.dtype)
    tokens = 300
    whole_copy = w.policy.spec.num_params * 4  # fp32: the rollout copy an FSDP2 plan trains beside
    for plan, resident in ((ParallelPlan(), 0.0), (ParallelPlan(dp=2, sharded_optimizer=True), whole_copy)):
        runtime, selector = w.memory(plan, tokens, tokens), cm.memory("train", plan, plan.dp, tokens)
        for c in MemoryBreakdown.COMPONENTS[:-1]:
            want = getattr(selector, c) + (resident if c == "weights" else 0.0)
            assert getattr(runtime, c) == pytest.approx(want, rel=1e-12), (plan.describe(), c)
        assert w.memory_bytes(plan, tokens, tokens) == pytest.approx(selector.total - cm.reserve + resident)
    fsdp = w.memory(ParallelPlan(dp=2, sharded_optimizer=True), tokens, tokens)
    assert fsdp.optimizer == pytest.approx(w.memory(ParallelPlan(), tokens, tokens).optimizer / 2)  # sharded
    # the step's row reports the same account for the batch it trained on
    longest = max(len(t.token_ids) for t in w.played)
    assert row["memory_accounted_bytes"] == w.memory_bytes(w.plans.train, row["tokens"], longest)
    # and the pre-launch resource check holds one rank's whole copy, at its micro-batch, by the same terms
    micro_batch = min(cfg.trainer.token_budget, cfg.sampling.max_context)
    est, one = estimate_bytes(cfg, w.policy.spec, 1), w.memory(ParallelPlan(), micro_batch, 1)
    for c in ("weights", "grads", "optimizer", "activations", "logits"):
        assert est[c] == pytest.approx(getattr(one, c)), c


def test_the_weight_sync_plans_once_per_layout_pair(one_step):
    """Worker.reshard_plan: planned once per (source, destination) layout pair, the plan
    plan_reshard makes; a different pair gets its own."""
    w = one_step["worker"]
    a, b = ParallelPlan(), ParallelPlan(sharded_optimizer=True)
    first = w.reshard_plan(a, b)
    assert w.reshard_plan(a, b) is first
    assert first == plan_reshard(w.shapes, a, b, w.world)
    other = w.reshard_plan(b, a)
    assert other is not first and other == plan_reshard(w.shapes, b, a, w.world)
