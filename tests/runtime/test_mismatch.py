"""The rollout/trainer log-prob mismatch (earl.runtime.mismatch): the built-in engine's gap is
~0 on a real step, a deliberately off engine's gap is reported exactly, truncated importance
sampling (`trainer.tis_cap`) weighs the loss by min(exp(trainer - engine), C), and the gap is
reduced over ranks.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_mismatch.py
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import math

import pytest
import torch
from test_trainer import fake_trajs, prepare

from earl.runtime.dist import run_local
from earl.runtime.engine import TorchEngine
from earl.runtime.mismatch import mismatch_metrics, mismatch_sums, tis_weights
from earl.runtime.resolve import resolve_config
from earl.runtime.run import run_training
from earl.runtime.run_config import ALGOS, TrainerConfig
from earl.runtime.trainer import Trainer, collate

# 4 groups: the smallest batch of this seed whose first step has a policy gradient (rewards differ)
SMALL = {"groups": 4, "group_size": 4, "plots": "false", "threads": 1, "checkpoints": "false",
         "transcript_every": 0}
GAP = ("logprob_diff_mean", "logprob_diff_max", "rollout_kl")
TIS = ("tis_weight_mean", "tis_clip_frac")


class ShiftedBatch:
    """An episode batch of the built-in engine whose reported log-probs are shifted by
    `shift(seed)` nats for the row sampling from stream `seed` (the tokens are the engine's own)."""

    def __init__(self, inner, seeds, shift):
        self.inner, self.shifts = inner, [shift(s) for s in seeds]

    def submit(self, inputs, params):
        self.inner.submit(inputs, params)

    def step(self):
        return {r: dataclasses.replace(g, logprobs=[x + self.shifts[r] for x in g.logprobs])
                for r, g in self.inner.step().items()}

    @property
    def busy(self):
        return self.inner.busy

    def close(self, rows):
        self.inner.close(rows)


class ShiftedEngine(TorchEngine):
    """The built-in engine, reporting log-probs off by a known amount per episode."""

    def __init__(self, *args, shift, **kw):
        super().__init__(*args, **kw)
        self.shift = shift

    def open(self, n, seeds=None):
        seeds = list(range(n)) if seeds is None else list(seeds)
        return ShiftedBatch(super().open(n, seeds), seeds, self.shift)


def use_shifted_engine(monkeypatch, shift) -> None:
    """Every Worker built from now on (forked ranks too) rolls out with a ShiftedEngine."""
    def make(name, model, tokenizer, *, reuse_kv=True, model_path=None, decode_steps=0, compile=False):
        assert name == "pytorch"
        return ShiftedEngine(model, tokenizer, reuse_kv=reuse_kv, decode_steps=decode_steps, shift=shift)

    monkeypatch.setattr("earl.runtime.worker.make_engine", make)


def run(tmp_path, name: str, **overrides) -> list[dict]:
    res = run_training(resolve_config(overrides={**SMALL, **overrides}), tmp_path / name, progress=False,
                echo=lambda s: None)
    return res.metrics


def test_builtin_engine_gap_is_float_noise_and_csv_has_the_columns(tmp_path):
    """fp32 tiny model, built-in engine: the gap is float noise (measured: mean 6e-8, max 5e-7
    nats) and with TIS on every weight is 1, nothing clipped."""
    rows = run(tmp_path, "a", steps=2, **{"trainer.tis_cap": "2"})
    for r in rows:
        assert r["logprob_diff_mean"] < 1e-6 and r["logprob_diff_max"] < 1e-5 and 0 <= r["rollout_kl"] < 1e-10
        assert r["tis_weight_mean"] == pytest.approx(1, abs=1e-5) and r["tis_clip_frac"] == 0
    header = next(csv.reader((tmp_path / "a" / "metrics.csv").open()))
    assert set(GAP + TIS) <= set(header)
    off = run(tmp_path, "b", steps=1)[0]
    assert set(GAP) <= set(off) and not set(TIS) & set(off)
    # TIS with weights of 1 changes nothing: the engine's log-probs reached the trainer intact
    # (pg_loss is a sum of advantages that cancel to ~1e-8: compared in absolute terms)
    assert off["grad_norm"] > 0
    for k in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert rows[0][k] == pytest.approx(off[k], rel=1e-5, abs=1e-6), k


def test_shifted_engine_gap_is_reported_and_tis_clips_it(tmp_path, monkeypatch):
    """An engine reporting every log-prob log(3) too low: trainer - engine = log 3 on every token,
    so the k3 KL is 3 - 1 - log 3, every TIS weight is the cap 2, and the whole policy gradient
    doubles (entropy bonus and legality term off; the reported grad norm is before clipping)."""
    use_shifted_engine(monkeypatch, lambda seed: -math.log(3))
    # seed 2: a batch whose rewards differ within a group (at seed 0 the tiny random model plays
    # 16 invalid moves, every advantage is 0 and there is no gradient to compare)
    # (and the default's legality term off: TIS weights the policy gradient, not that term)
    off = {"trainer.entropy_coef": "0", "trainer.legal_coef": "0", "seed": "2"}
    plain = run(tmp_path, "plain", steps=1, **off)[0]
    tis = run(tmp_path, "tis", steps=1, **off, **{"trainer.tis_cap": "2"})[0]
    for r in (plain, tis):
        assert r["logprob_diff_mean"] == pytest.approx(math.log(3), abs=1e-5)
        assert r["logprob_diff_max"] == pytest.approx(math.log(3), abs=1e-5)
        assert r["rollout_kl"] == pytest.approx(2 - math.log(3), abs=1e-5)
    assert tis["tis_weight_mean"] == pytest.approx(2) and tis["tis_clip_frac"] == 1
    assert plain["grad_norm"] > 0
    assert tis["grad_norm"] == pytest.approx(2 * plain["grad_norm"], rel=1e-5)
    assert tis["pg_loss"] == pytest.approx(2 * plain["pg_loss"], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("algo", ALGOS)
def test_tis_weights_the_loss_by_the_capped_ratio(tiny, algo):
    """Known trainer/engine ratios r: the weights are min(r, C); the weighted loss is the
    hand-computed one and its gradient is the unweighted loss's with advantages times w."""
    cap = 2.0
    cfg = TrainerConfig(algo=algo, tis_cap=cap, entropy_coef=0.0)
    model = copy.deepcopy(tiny.model)
    batch = prepare(model, collate(fake_trajs(), 0), cfg)
    mask = batch.loss_mask
    r = torch.tensor([0.25, 0.9, 1.0, 1.7, 2.5, 8.0]).repeat(batch.input_ids.numel() // 6 + 1)
    r = r[:batch.input_ids.numel()].view(batch.input_ids.shape)
    batch = dataclasses.replace(batch, engine_logprobs=batch.old_logprobs - r.log())
    w = tis_weights(batch.old_logprobs, batch.engine_logprobs, cap)
    assert torch.allclose(w[mask], r.clamp(max=cap)[mask], rtol=1e-6)
    n = float(mask.sum())
    sums = Trainer(model, cfg, temperature=1.0).backward(batch, n)
    # the model is the old policy: ratio 1, so each token's loss is -w * advantage
    want = -(r.clamp(max=cap) * batch.advantages * mask).sum()
    assert sums["pg_loss"] == pytest.approx(float(want), rel=1e-5, abs=1e-6)
    assert sums["loss"] == pytest.approx(float(want), rel=1e-5, abs=1e-6)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reweighted = dataclasses.replace(batch, advantages=batch.advantages * r.clamp(max=cap))
    Trainer(model, dataclasses.replace(cfg, tis_cap=0.0), temperature=1.0).backward(reweighted, n)
    for g, p in zip(grads, model.parameters(), strict=True):
        assert torch.allclose(g, p.grad, rtol=1e-4, atol=1e-7)
    # the metrics of the same tokens: clipped where r > C (2.5 and 8.0: a third of the pattern)
    got, top = mismatch_sums(batch.old_logprobs, batch.engine_logprobs, mask, cap)
    m = mismatch_metrics(got, top, cap)
    assert m["tis_weight_mean"] == pytest.approx(float(w[mask].mean()), rel=1e-6)
    assert m["tis_clip_frac"] == pytest.approx(float((r[mask] > cap).float().mean()))
    assert m["logprob_diff_max"] == pytest.approx(math.log(8.0), rel=1e-6)
    assert m["rollout_kl"] == pytest.approx(float((r - 1 - r.log())[mask].mean()), rel=1e-5)


def test_bad_tis_cap_is_a_one_line_error():
    for bad in (-1.0, 0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"trainer.tis_cap must be 0 \(off\) or a finite cap >= 1"):
            TrainerConfig(tis_cap=bad)


def _two_rank_run(out: str, overrides: dict) -> list[dict] | None:
    res = run_training(resolve_config(overrides=overrides), out, progress=False, echo=lambda s: None)
    return res.metrics if res is not None and res.metrics else None


@pytest.mark.dist
def test_two_ranks_reduce_the_gap_to_the_one_process_value(tmp_path, monkeypatch):
    """A gap that differs per episode (shift by the episode's sampling stream): on two gloo
    ranks (each rolling out and scoring half the episodes; centralized dispatch) rank 0 reports
    the same mean, max, KL and TIS figures as one process (the tokens are the same)."""
    use_shifted_engine(monkeypatch, lambda seed: -0.25 * (seed % 5))
    over = {**SMALL, "steps": 2, "trainer.tis_cap": "2", "trainer.entropy_coef": "0"}
    one = run(tmp_path, "one", **over)
    two = run_local(_two_rank_run, 2, str(tmp_path / "two"), {**over, "policy.dispatcher": "centralized"},
                    timeout_s=240)[0]
    assert one[0]["tis_clip_frac"] > 0 and one[0]["logprob_diff_max"] > 0.7
    for a, b in zip(one, two, strict=True):
        assert b["world"] == 2
        for k in GAP + TIS + ("grad_norm",):
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k
