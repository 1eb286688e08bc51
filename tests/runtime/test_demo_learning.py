"""The knobs the default demo's learning rests on (docs/cpu/learning/README.md): the per-turn
discount of REINFORCE++'s return-to-go, checked by hand and through the advantages."""

from __future__ import annotations

import pytest
import torch

from earl.runtime.advantages import AdvantageSpec, fill_advantages, local_stats, returns_to_go
from earl.runtime.resolve import resolve_config


def episode(rewards_by_token: list[float], turns: list[int]) -> dict[str, torch.Tensor]:
    """One sample: token rewards, turn ids (-1: prompt/observation tokens, not generated)."""
    t = torch.tensor(turns)
    return {"token_rewards": torch.tensor(rewards_by_token), "turn_ids": t, "loss_mask": (t >= 0).float(),
            "input_ids": torch.arange(len(turns))}


def test_discounted_return_to_go_by_hand():
    # prompt, turn 0 (two tokens: a 0.2 KL-like reward then the move's 0.1), observation,
    # turn 1 (-1, an invalid move), observation, turn 2 (+1, the win)
    item = episode([0, 0.2, 0.1, 0, -1.0, 0, 1.0], [-1, 0, 0, -1, 1, -1, 2])
    g = 0.5
    got = returns_to_go(item, g).tolist()
    turn2, turn1 = 1.0, -1.0 + g * 1.0
    want = [None, 0.3 + g * turn1, 0.1 + g * turn1, None, turn1, None, turn2]
    for w, x in zip(want, got, strict=True):
        if w is not None:
            assert x == pytest.approx(w)
    assert returns_to_go(item, 1.0).tolist() == pytest.approx([0.3, 0.3, 0.1, 0.0, 0.0, 1.0, 1.0])
    assert returns_to_go(item, 0.0)[4] == pytest.approx(-1.0)  # only the move's own reward


def test_discount_flows_into_the_per_turn_advantages():
    store = {0: episode([0.1, 0, -1.0], [0, -1, 1]), 1: episode([0.1, 0, 0.1], [0, -1, 1])}

    class S:  # the sample fields the estimator reads
        def __init__(self, i):
            self.id, self.group = i, i

    samples = [S(0), S(1)]
    for gamma in (1.0, 0.0):
        spec = AdvantageSpec(estimator="reinforce++", per_turn=True, gamma=gamma)
        assert "turn_ids" in spec.inputs
        fill_advantages(store, samples, local_stats(store, samples, spec), spec)
        first = (store[0]["advantages"][0], store[1]["advantages"][0])
        if gamma == 1:  # turn 0 carries the later -1 vs +0.1: sample 0's first move looks worse
            assert first[0] < 0 < first[1]
        else:  # each first move is credited with its own +0.1 only: the same advantage (0)
            assert first[0] == pytest.approx(0.0, abs=1e-6) and first[1] == pytest.approx(0.0, abs=1e-6)
    assert "turn_ids" not in AdvantageSpec(estimator="reinforce++").inputs
    with pytest.raises(ValueError, match=r"trainer.gamma must be in \[0, 1\] \(1: undiscounted\), got 1.5"):
        resolve_config(overrides={"trainer.gamma": 1.5})


def test_bench_learning_curve_is_ten_step_means(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_learning.py"
    spec = importlib.util.spec_from_file_location("bench_learning", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cols = ["step"] + [k for _, k in bench.CURVE]
    lines = [",".join(cols)] + [",".join([str(s)] + [str(s / 100)] * (len(cols) - 1)) for s in range(1, 13)]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    out = bench.curve(str(tmp_path / "metrics.csv"))
    assert out[0].endswith(": 12 steps") and len(out) == 3
    assert out[1].startswith("  step   10 win 0.055 ") and out[2].startswith("  step   12 win 0.115 ")
