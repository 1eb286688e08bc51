"""Asynchronous RL in the runtime (earl.runtime.async_rl, `schedule.mode = "async"`): the
schedule keys and their errors, the pool split from the policy object, the importance
correction against the behaviour log-probs, the staleness gate on real gloo processes, and an
`earl run --nproc 2` that trains with staleness <= K and ends with rollout weights equal to
training's, bit for bit.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_async.py
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from test_trainer import fake_trajs

from earl.parallel import build_plan_groups
from earl.policies.pools import choose_pool_split
from earl.runtime.async_rl import (
    ASYNC_JSON,
    Learner,
    Pools,
    Replica,
    experience,
    split_pools,
)
from earl.runtime.dist import run_local
from earl.runtime.resolve import check_config, model_spec, selector_cost_model
from earl.runtime.run_config import RunConfig, ScheduleConfig, apply_overrides
from earl.runtime.trainer import Trainer, batch_logprobs
from earl.runtime.weight_push import WeightPush, WeightReceiver, weights_digest
from earl.specs import ParallelPlan, StagePlan, WorkloadStats
from earl.trace import read_chrome_trace

SMALL = {"groups": 2, "group_size": 2, "plots": False, "checkpoints": False, "transcript_every": 0}


def test_schedule_keys_and_errors():
    assert RunConfig().schedule == ScheduleConfig(mode="sync", max_staleness=1, partial_rollout=False, rollout_gpus=0)
    cfg = apply_overrides(RunConfig(), {"schedule.mode": "async", "max_staleness": 2, "rollout_gpus": 1})
    assert (cfg.schedule.mode, cfg.schedule.max_staleness, cfg.schedule.rollout_gpus) == ("async", 2, 1)
    for bad, words in (({"schedule.mode": "pipelined"}, "sync, async"), ({"max_staleness": 0}, ">= 1"),
                       ({"rollout_gpus": -1}, ">= 0")):
        with pytest.raises(ValueError, match=words):
            apply_overrides(RunConfig(), bad)
    a = apply_overrides(RunConfig(), {"schedule.mode": "async"})
    with pytest.raises(ValueError, match="--nproc >= 2"):
        check_config(a, 1)
    with pytest.raises(ValueError, match="must leave processes to train"):
        check_config(dataclasses.replace(a, schedule=ScheduleConfig(mode="async", rollout_gpus=2)), 2)
    with pytest.raises(ValueError, match="partial_rollout.*engine 'pytorch-static'"):
        check_config(dataclasses.replace(a, engine="pytorch-static",
                                         schedule=ScheduleConfig(mode="async", partial_rollout=True)), 2)
    check_config(dataclasses.replace(a, schedule=ScheduleConfig(mode="async", partial_rollout=True)), 2)
    check_config(a, 2)


def test_cli_async_on_one_process_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--out", str(tmp_path / "x"), "--quiet",
                        "--set", "schedule.mode=async"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "--nproc >= 2" in lines[0], r.stdout + r.stderr


def test_pool_split_is_the_policy_objects():
    """rollout_gpus = 0: choose_pool_split on the run's profile decides (the simulator's call)."""
    cfg = RunConfig()
    spec = model_spec(cfg.model.path)
    stats = WorkloadStats(step=0, num_responses=128, context_mean=60, context_p95=60, context_max=60,
                          max_context=4096)
    for world in (2, 4):
        pools = split_pools(cfg, world, "cpu-measured", spec, stats)
        open_dp = ParallelPlan(dp=-1)
        want = choose_pool_split(selector_cost_model(spec, "cpu-measured", world),
                                 StagePlan(rollout=open_dp, experience=open_dp, train=open_dp), stats, world,
                                 granularity=1)
        assert len(pools.rollout_ranks) == want.rollout_gpus and "choose_pool_split" in pools.how
        assert pools.train_ranks == tuple(range(world - want.rollout_gpus))  # rank 0 trains (and writes)
    given = split_pools(apply_overrides(cfg, {"rollout_gpus": 3}), 4, "cpu-measured", spec, stats)
    assert (given.train_ranks, given.rollout_ranks) == ((0,), (1, 2, 3))


@pytest.mark.parametrize("algo", ["reinforce++", "grpo", "rloo"])
def test_importance_correction(algo):
    """Behaviour log-probs equal to the current policy's: the loss and gradients are the
    on-policy ones; behaviour 4x less likely on every token: the weight is the cap, 2x the
    policy gradient."""
    cfg = apply_overrides(RunConfig(), {"trainer.algo": algo, "group_size": 3, "trainer.entropy_coef": 0.0})
    lr = Learner(cfg, build_plan_groups(ParallelPlan()))
    assert lr.trainer.cfg.tis_cap == 2.0  # the async default cap (trainer.tis_cap 0)
    trajs = fake_trajs(6)
    batch, _ = experience(lr, trajs, [t.episode_id for t in trajs])
    vocab = lr.tokenizer.vocab_size
    current = batch_logprobs(lr.model, batch, lr.params.logprob_temperature, 4096, vocab)
    on_policy = Trainer(lr.model, dataclasses.replace(lr.trainer.cfg, tis_cap=0.0),
                        temperature=lr.params.logprob_temperature, vocab_size=vocab)

    def loss_and_grads(trainer, behaviour):
        lr.model.zero_grad(set_to_none=True)
        sums = trainer.backward(dataclasses.replace(batch, engine_logprobs=behaviour), float(batch.loss_mask.sum()))
        return sums, [p.grad.clone() for p in lr.model.parameters() if p.grad is not None]

    want, want_g = loss_and_grads(on_policy, current)
    got, got_g = loss_and_grads(lr.trainer, current)
    assert got["pg_loss"] == pytest.approx(want["pg_loss"], rel=1e-5, abs=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in want_g)
    for a, b in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    stale, stale_g = loss_and_grads(lr.trainer, current - math.log(4.0))
    assert stale["pg_loss"] == pytest.approx(2.0 * want["pg_loss"], rel=1e-5, abs=1e-6)
    for a, b in zip(stale_g, want_g, strict=True):
        torch.testing.assert_close(a, 2.0 * b, rtol=1e-5, atol=1e-7)


def _gate(k: int, delays: list[float]):
    """Rank 0 pushes versions 1..len(delays), each after its delay; rank 1's replica plays
    steps 1..len(delays)+1 (tiny: one episode), recording the version it held at each."""
    cfg = apply_overrides(RunConfig(), {**SMALL, "groups": 1, "group_size": 1, "max_staleness": k})
    group = dist.new_group([0, 1])
    pools = Pools(train_ranks=(0,), rollout_ranks=(1,), how="test")
    steps = len(delays) + 1
    if dist.get_rank() == 0:
        lr = Learner(cfg, build_plan_groups(ParallelPlan()))
        push = WeightPush(lr.model, pools, group)
        for step, d in enumerate(delays, start=1):
            time.sleep(d)
            with torch.no_grad():
                for p in lr.model.parameters():
                    p.add_(float(step))  # a distinct version each push
            push.send(lr.model, version=step)
        push.end()
        return weights_digest(lr.model)
    rep = Replica(cfg, version=0)
    recv = WeightReceiver(WeightPush(rep.model, pools, group))
    recv.start()
    held = []
    for step in range(1, steps + 1):
        rep.take_newest(recv, at_least=step - 1 - k)
        held.append(rep.version)
        rep.play(step, [0])
    rep.take_newest(recv, at_least=len(delays))
    recv.join()
    return held, weights_digest(rep.model)


@pytest.mark.dist
@pytest.mark.parametrize("k", [1, 2])
def test_staleness_gate_and_push_equality(k):
    """A slow trainer (0.5 s per version) and a fast replica: the replica waits rather than play
    a step more than K versions behind, so step s is played with version >= s-1-K; after the
    last push its weights equal the trainer's bitwise."""
    digest0, (held, digest1) = run_local(_gate, 2, k, [0.5, 0.5, 0.5], timeout_s=120)
    assert len(held) == 4
    for step, v in enumerate(held, start=1):
        assert 0 <= step - 1 - v <= k, (step, v, held)
    assert held[-1] >= 3 - k  # it did wait for the pushes
    assert digest0 == digest1


@pytest.mark.slow
@pytest.mark.dist
def test_earl_run_nproc2_async(tmp_path):
    """The issue's command trains, every sample within K=1 versions, pools in the metrics, both
    pools' spans in the trace, and the rollout weights equal training's after the last push."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--nproc", "2", "--steps", "3", "--out", str(out),
                        "--set", "groups=4", "--set", "plots=false", "--set", "schedule.mode=async",
                        "--set", "schedule.max_staleness=1", "--quiet"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "choose_pool_split" in r.stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [x["step"] for x in rows] == [1, 2, 3]
    for x in rows:
        assert 0 <= x["staleness_mean"] <= x["staleness_max"] <= 1
        assert (x["rollout_pool"], x["train_pool"], x["schedule"]) == (1, 1, "async")
        assert x["train_tokens"] > 0 and math.isfinite(x["loss"])
        assert x["legal_loss"] > 0  # the default's legality term (trainer.legal_coef) trains here too
    info = json.loads((out / ASYNC_JSON).read_text())
    assert info["weights_equal"] and info["rollout_digests"] == [info["train_digest"]]
    spans = read_chrome_trace(out / "trace.json")
    assert {s.rank for s in spans if s.name == "rollout"} == {1}
    assert {s.rank for s in spans if s.name == "train_step"} == {0}


def _earl_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "earl.cli", "run", "--quiet", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
@pytest.mark.dist
def test_resume_across_modes(tmp_path):
    """sync (1 process, 2 steps) -> async (--nproc 2, steps 3-4) -> sync (steps 5): each resumes
    the previous one's checkpoint; the async one starts from the sync weights (its first push
    carries them on) and ends with a checkpoint a sync run loads."""
    out = tmp_path / "run"
    small = ["--set", "groups=2", "--set", "group_size=2", "--set", "plots=false", "--set", "transcript_every=0"]
    r = _earl_run("--steps", "2", "--out", str(out), *small)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _earl_run("--resume", str(out), "--steps", "4", "--nproc", "2", "--set", "schedule.mode=async")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "steps 3-4 from" in r.stdout
    assert (out / "checkpoints" / "step-000004").is_dir()
    r = _earl_run("--resume", str(out), "--steps", "5", "--nproc", "1", "--set", "schedule.mode=sync")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5]
    assert [x.get("schedule", "sync") for x in rows] == ["sync", "sync", "async", "async", "sync"]
    assert all(math.isfinite(x["loss"]) for x in rows)


@pytest.mark.slow
@pytest.mark.dist
def test_earl_run_nproc4_two_pools_of_two(tmp_path):
    """schedule.rollout_gpus 2 of 4: two replicas, training dp2; both replicas end on training's weights."""
    out = tmp_path / "run"
    r = _earl_run("--nproc", "4", "--steps", "3", "--out", str(out), "--set", "groups=4", "--set", "plots=false",
                  "--set", "schedule.mode=async", "--set", "schedule.rollout_gpus=2")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [(x["rollout_pool"], x["train_pool"], x["plan_train"]) for x in rows] == [(2, 2, "tp1-dp2")] * 3
    assert all(x["staleness_max"] <= 1 and x["samples_trained"] == 4 for x in rows)
    info = json.loads((out / ASYNC_JSON).read_text())
    assert info["rollout_ranks"] == [2, 3] and info["rollout_digests"] == [info["train_digest"]] * 2


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("k", [1, 2])
def test_replica_runs_up_to_k_steps_ahead(tmp_path, k):
    """A trainer slower than the rollout (EARL_SLOW_TRAIN_S, a test hook): the replica plays
    ahead until the gate holds it, so step s's samples are min(s-1, K) versions old at most,
    the oldest reaching K (K = 2 buys a second step of overlap) and never exceeding it; the
    steps it played past the end are drained, not trained."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--nproc", "2", "--steps", "4", "--out", str(out),
                        "--set", "groups=2", "--set", "group_size=2", "--set", "plots=false",
                        "--set", "transcript_every=0", "--set", "schedule.mode=async",
                        "--set", f"schedule.max_staleness={k}", "--quiet"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "EARL_SLOW_TRAIN_S": "4"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    worst = [x["staleness_max"] for x in rows]
    assert all(0 <= w <= min(s - 1, k) for s, w in zip(range(1, 5), worst, strict=True)), worst
    assert max(worst) == k, worst
    info = json.loads((out / ASYNC_JSON).read_text())
    assert info["weights_equal"] and info["steps_drained"] == 0  # --steps stops the replica too


def test_env_errors_and_uniform_groups_leave_the_async_batch():
    """The sync loop's rule (earl.runtime.step.trainable_samples) in the async one: an env_error
    episode leaves the batch and its group's baseline; with filter_uniform_groups a group whose
    remaining rewards are equal leaves too; the rest train with the advantages they would have
    alone."""
    from earl.runtime.async_rl import step_samples

    cfg = apply_overrides(RunConfig(), {"trainer.algo": "grpo", "group_size": 3})
    trajs = fake_trajs(6)  # groups 0 (ids 0-2, rewards .1 1.1 .1) and 1 (ids 3-5: 1.1 .1 1.1)
    trajs[1].outcome = "env_error"
    lr = Learner(cfg, build_plan_groups(ParallelPlan()))
    samples, share, filtered, broken = step_samples(lr, trajs)
    assert ([x.id for x in samples], share, filtered, broken) == ([0, 2, 3, 4, 5], [0, 2, 3, 4, 5], set(), 1)
    batch, _ = experience(lr, trajs, share, samples)
    alone, _ = experience(lr, [t for t in trajs if t.episode_id != 1], share)
    assert batch.sample_ids.tolist() == share
    torch.testing.assert_close(batch.advantages, alone.advantages)
    assert float(batch.advantages[:2].abs().sum()) == 0.0  # group 0 left with two equal rewards
    lr = Learner(apply_overrides(cfg, {"trainer.filter_uniform_groups": True}), build_plan_groups(ParallelPlan()))
    samples, share, filtered, broken = step_samples(lr, trajs)
    assert ([x.id for x in samples], share, filtered, broken) == ([3, 4, 5], [3, 4, 5], {0}, 1)


@pytest.mark.parametrize("algo", ["reinforce++", "grpo"])
def test_kl_reference_is_the_initial_model(algo):
    """trainer.kl_coef > 0: the training pool keeps a frozen copy of the initial policy; its
    log-probs reach the batch, REINFORCE++'s rewards carry -kl_coef (log pi_old - log pi_ref)
    per generated token, and grpo's loss has a KL term once the policy has moved."""
    cfg = apply_overrides(RunConfig(), {"trainer.algo": algo, "group_size": 3, "trainer.kl_coef": 0.5})
    lr = Learner(cfg, build_plan_groups(ParallelPlan()))
    initial = {n: p.detach().clone() for n, p in lr.model.named_parameters()}
    with torch.no_grad():
        for p in lr.model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the policy has moved since the start
    trajs = fake_trajs(6)
    ids = [t.episode_id for t in trajs]
    batch, _ = experience(lr, trajs, ids)
    assert weights_digest(lr.ref_model) == weights_digest(initial)
    temp, vocab = lr.params.logprob_temperature, lr.tokenizer.vocab_size
    ref = batch_logprobs(lr.ref_model, batch, temp, 4096, vocab)
    torch.testing.assert_close(batch.ref_logprobs, ref)
    if algo == "reinforce++":
        old = batch_logprobs(lr.model, batch, temp, 4096, vocab)
        torch.testing.assert_close(batch.old_logprobs, old)
        no_kl = Learner(apply_overrides(cfg, {"trainer.kl_coef": 0.0}), build_plan_groups(ParallelPlan()))
        plain, _ = experience(no_kl, trajs, ids)
        mask = batch.loss_mask.float()
        torch.testing.assert_close(batch.token_rewards, plain.token_rewards - 0.5 * (old - ref) * mask)
        assert float(((old - ref) * mask).abs().sum()) > 0
    else:
        assert batch.old_logprobs is None  # one optimizer step: the training forward is the old policy
        sums = lr.trainer.backward(batch, float(batch.loss_mask.sum()))
        assert sums["kl"] > 0


BROKEN_ENV = '''
from earl.runtime.envs import StepResult

class SometimesBroken:
    """One turn: reward 1 for an action starting with a digit; raises on seed `bad`."""
    max_new_tokens = 2
    stop = ("\\n",)

    def __init__(self, bad=-1):
        self.bad, self.seed = int(bad), 0

    def reset(self, seed):
        self.seed = seed
        return "say a digit\\n"

    def step(self, action):
        if self.seed == self.bad:
            raise ValueError("the board fell over")
        good = action[:1].isdigit()
        return StepResult(observation="", reward=float(good), done=True, outcome="win" if good else "loss")
'''


@pytest.mark.slow
@pytest.mark.dist
def test_earl_run_async_drops_env_errors_and_trains_with_kl_and_filtering(tmp_path):
    """`earl run --nproc 2` async with a user env that raises for group 0 of step 1, a KL term
    and filter_uniform_groups (both refused before): the broken episodes are counted and not
    trained, groups are filtered as in sync, the KL to the initial model is measured once the
    policy has moved, and the trace is written."""
    from earl.runtime.seeds import mix_seed

    env = tmp_path / "broken.py"
    env.write_text(BROKEN_ENV)
    bad = mix_seed(0, 1, 0) % (2**31)  # seed 0's step 1, group 0
    out = tmp_path / "run"
    r = _earl_run("--nproc", "2", "--steps", "3", "--out", str(out), "--env", f"{env}:SometimesBroken",
                  "--set", "seed=0", "--set", f"env.options=bad={bad}", "--set", "groups=4", "--set", "group_size=2",
                  "--set", "plots=false", "--set", "transcript_every=0", "--set", "schedule.mode=async",
                  "--set", "trainer.kl_coef=0.1", "--set", "trainer.algo=grpo",
                  "--set", "trainer.filter_uniform_groups=true")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [x["env_errors_dropped"] for x in rows] == [2, 0, 0]
    for x in rows:
        left = 4 - (x["env_errors_dropped"] // 2)  # groups with an episode left
        assert x["samples_trained"] == 2 * (left - x["groups_filtered"])
        assert math.isfinite(x["loss"])
    assert rows[-1]["kl"] != 0.0  # the policy moved away from the frozen initial one
    assert {s.rank for s in read_chrome_trace(out / "trace.json") if s.name == "rollout"} == {1}
