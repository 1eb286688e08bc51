"""A training step of a plan without a sharded optimizer, tp2 (2 gloo ranks) and tp2 x dp2 (4),
on DTensor TP with `ReplicatedAdamW` (the way earl.runtime.worker trains them), gives the same
loss, grad norm and updated weights as one process running the loss and plain AdamW
(torch.optim.AdamW with global-norm clipping, written out here) on the whole batch; so does
`train_step` on one process (plan tp1-dp1, no process group). Plans with `zero`: test_fsdp.py.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_train.py
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from earl.parallel import build_plan_groups, holdings
from earl.policies.balance import balance_samples
from earl.policies.types import Layout, Sample
from earl.runtime.advantages import AdvantageSpec, distributed_advantages
from earl.runtime.dist import run_local
from earl.runtime.hf_model import build_builtin
from earl.runtime.optim import ReplicatedAdamW
from earl.runtime.parallelize import parallelize
from earl.runtime.rollout import Trajectory
from earl.runtime.run_config import TrainerConfig
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import ExperienceBatch, Trainer, batch_logprobs, collate, train_step
from earl.specs import ParallelPlan

CFG = TrainerConfig(algo="grpo", lr=1e-2, grad_clip=0.5, token_budget=64, entropy_coef=0.01, lr_decay="none")
STEPS = 2


def make_batch(n: int = 8, seed: int = 0) -> ExperienceBatch:
    """A prepared batch: old log-probs of the initial model, GRPO advantages (one process)."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        length = int(torch.randint(8, 24, (1,), generator=gen))
        ids = torch.randint(3, 64, (length,), generator=gen).tolist()
        mask = [0] * 4 + (torch.rand(length - 4, generator=gen) > 0.3).int().tolist()
        trajs.append(Trajectory(episode_id=i, group_id=i // 4, token_ids=ids, loss_mask=mask,
                                logprobs=[0.0] * length, reward=float(torch.rand(1, generator=gen))))
    batch = collate(trajs, pad_id=0)
    old = batch_logprobs(build_builtin("tiny", seed=0).model, batch, 1.0, CFG.token_budget)
    samples = [Sample(id=i, tokens=len(t.token_ids), group=t.group_id) for i, t in enumerate(trajs)]
    store = {i: {"input_ids": batch.input_ids[i, :s.tokens], "loss_mask": batch.loss_mask[i, :s.tokens],
                 "rewards": batch.rewards[i].reshape(1)} for i, s in enumerate(samples)}
    distributed_advantages(store, samples, Layout(ParallelPlan(), (tuple(range(n)),)),
                           AdvantageSpec(estimator="grpo"))
    adv = torch.zeros(batch.input_ids.shape)
    for i, s in enumerate(samples):
        adv[i, :s.tokens] = store[i]["advantages"]
    return dataclasses.replace(batch, old_logprobs=old, ref_logprobs=old, advantages=adv)


def reference_step(trainer: Trainer, opt: torch.optim.Optimizer, batch: ExperienceBatch) -> dict:
    """One optimizer step on the whole batch, the plain way: token-mean loss, global-norm clip,
    torch's AdamW."""
    opt.zero_grad(set_to_none=True)
    n = float(batch.loss_mask.sum())
    sums = trainer.backward(batch, n)
    params = [p for p in trainer.model.parameters() if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, CFG.grad_clip))
    opt.step()
    return {"loss": sums["loss"] / n, "grad_norm": norm, "train_tokens": n}


# A gradient entry below this (the median |g| of the tiny model's matrices is ~7e-4) is rounding
# noise-sized: AdamW divides it by sqrt(v) ~ |g| and turns a 1e-12 difference in summation order
# into a difference of up to one lr-sized step. Which of those entries differ, and by how much,
# depends on the BLAS kernels the CPU picks (seen: 0.80% of lr on one machine, 1.12% on another,
# with the same torch and transformers 5.19 and 5.24 alike); entries above it agree to < 0.1% of lr.
SIGNAL_GRAD = 1e-5


def reference_run(batch: ExperienceBatch):
    """The one-process reference: per-step stats, the updated weights, and which weight entries
    had a signal-sized first gradient (|g| >= SIGNAL_GRAD; see `check_weights`)."""
    model = build_builtin("tiny", seed=0).model
    trainer = Trainer(model, CFG, temperature=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, betas=CFG.betas, weight_decay=CFG.weight_decay)
    stats, signal = [], {}
    for step in range(STEPS):
        stats.append(reference_step(trainer, opt, batch))
        if step == 0:
            signal = {n: p.grad.abs() >= SIGNAL_GRAD for n, p in model.named_parameters() if p.grad is not None}
    return stats, {n: p.detach() for n, p in model.named_parameters()}, signal


def _train_worker(batch, plan: ParallelPlan):
    groups = build_plan_groups(plan)
    model = build_builtin("tiny", seed=0).model
    shapes = param_shapes(model)
    model = parallelize(model, plan, shapes)
    trainer = Trainer(model, CFG, temperature=1.0)
    optim = ReplicatedAdamW(model, shapes, groups, CFG)
    samples = [Sample(id=i, tokens=int(n)) for i, n in enumerate(batch.loss_mask.sum(1))]
    assignment, _ = balance_samples(samples, plan.dp)
    local = batch.select(list(assignment[groups.dp_rank]))
    stats = [train_step(trainer, optim, local) for _ in range(STEPS)]
    return stats, {n: t.clone() for n, t in optim.weights().items()}


def check_weights(weights: dict, want: dict, init: dict, label: str, mean_tol: float, signal: dict) -> float:
    """Updated weights against the reference's (same slices); returns how far the reference
    moved from `init`. `signal[name]`: the entries whose first gradient is signal-sized."""
    moved = 0.0
    for name, w in weights.items():
        if name.endswith("k_proj.bias"):
            # q.(k + b) shifts every score of a query equally: softmax ignores it, the true
            # gradient is 0 and AdamW turns rounding noise (~1e-10) into tiny, differing steps
            assert float((w - want[name]).abs().max()) < 0.05 * CFG.lr * STEPS, f"{label} {name}"
            continue
        diff = (w - want[name]).abs()
        # where the gradient is signal, 1% of one lr-sized step (measured: under 0.1%); where it
        # is rounding noise (SIGNAL_GRAD), AdamW's own bound: at most ~lr per entry and step
        assert float(diff[signal[name]].max()) < 0.01 * CFG.lr, f"{label} {name}: {float(diff[signal[name]].max())}"
        assert float(diff.max()) < 2 * CFG.lr * STEPS, f"{label} {name}: {float(diff.max())}"
        assert float(diff.mean()) < mean_tol, f"{label} {name}: mean {float(diff.mean())}"
        moved = max(moved, float((want[name] - init[name]).abs().max()))
    return moved


def test_one_process_train_step_is_plain_adamw():
    """One process (tp1-dp1, no process group): ReplicatedAdamW + train_step is plain AdamW. Not
    bit-exact: the strategy takes the clipping norm in float64, torch in float32."""
    batch = make_batch()
    ref_stats, ref_w, signal = reference_run(batch)
    stats, weights = _train_worker(batch, ParallelPlan())
    for got, want in zip(stats, ref_stats, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-7)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6)
        assert got["train_tokens"] == want["train_tokens"]
    init_w = {n: p.detach() for n, p in build_builtin("tiny", seed=0).model.named_parameters()}
    assert check_weights(weights, ref_w, init_w, "one process", mean_tol=1e-7, signal=signal) > 1e-3, "no update"
    assert ref_stats[0]["grad_norm"] > CFG.grad_clip  # the clip was exercised


@pytest.mark.dist
@pytest.mark.parametrize("plan", [ParallelPlan(tp=2), ParallelPlan(tp=2, dp=2)], ids=["tp2", "tp2-dp2"])
def test_dtensor_tp_step_matches_single_process(plan):
    batch = make_batch()
    ref_stats, ref_w, signal = reference_run(batch)
    init_w = {n: p.detach() for n, p in build_builtin("tiny", seed=0).model.named_parameters()}
    results = run_local(_train_worker, plan.world_size, batch, plan, timeout_s=120)
    check_ranks(results, plan, ref_stats, ref_w, init_w, signal)
    assert ref_stats[0]["grad_norm"] > CFG.grad_clip  # the global clip was exercised


def check_ranks(results: list, plan: ParallelPlan, ref_stats: list, ref_w: dict, init_w: dict, signal: dict) -> None:
    """Every rank's (stats, weights) against the one-process reference: the same losses, norms
    and tokens, and its shard of the reference's updated weights."""
    shapes = param_shapes(build_builtin("tiny", seed=0).model)
    for rank, (stats, weights, *_) in enumerate(results):
        for got, want in zip(stats, ref_stats, strict=True):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
            assert got["train_tokens"] == want["train_tokens"]
        mine = {}
        for name, full in (("want", ref_w), ("init", init_w), ("signal", signal)):
            mine[name] = {}
            for n, t in full.items():
                lo, hi = holdings(shapes[n], plan, optimizer=False)[rank]
                mine[name][n] = t.narrow(shapes[n].shard_dim, lo, hi - lo)
        moved = check_weights(weights, mine["want"], mine["init"], f"rank {rank}", mean_tol=1e-5, signal=mine["signal"])
        assert moved > 1e-3, "the step did not change the weights"
