"""benchmarks/bench_learning.py on question-answer tasks: which rates it reports per env kind, the
guessing baseline (the commonest answer of the run's questions, scored by the env), and the
summary table (games keep their target line; tasks get the baseline instead)."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from earl.config_machinery import parse_sets
from earl.runtime.envs.tools import calculate
from earl.runtime.resolve import resolve_config
from earl.runtime.seeds import mix_seed


def load_bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_learning.py"
    spec = importlib.util.spec_from_file_location("bench_learning", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_games_report_win_rates_and_tasks_report_reward_and_correct():
    bench = load_bench()
    for game in ("tic-tac-toe", "connect-four", "openspiel:tic_tac_toe"):
        assert bench.is_game(game) and bench.rates_for(game) == bench.RATES
    for task in ("calculator", "reasoning-gym:chain_sum", "jsonl:prompts.jsonl"):
        assert not bench.is_game(task)
        rates = bench.rates_for(task)
        assert rates[:2] == ("reward_mean", "correct_rate") and "win_rate" not in rates


def test_calculator_guessing_baseline_counts_the_runs_own_questions():
    bench = load_bench()
    cfg = resolve_config(overrides={"env.name": "calculator", "groups": 5, "seed": 3})
    got = bench.guess_baseline(cfg, steps=8)
    # the same questions, read from the observation text and solved apart from the env
    from earl.runtime.envs import make_env

    env = make_env("calculator")
    answers = [calculate(env.reset(mix_seed(3, step, g) % 2**31).removeprefix("q: ").strip())
               for step in range(1, 9) for g in range(5)]
    common, count = Counter(answers).most_common(1)[0]
    assert got["n"] == 40 and Counter(answers)[got["answer"]] == count
    assert got["correct_rate"] == pytest.approx(count / 40) and got["reward_mean"] == pytest.approx(count / 40)
    assert got["best_reward_mean"] == pytest.approx(count / 40)  # no partial credit: the commonest is best
    assert bench.guess_baseline(resolve_config(overrides={}), steps=3) is None  # a game: no answers


def test_report_tasks_get_the_baseline_and_games_keep_their_target():
    bench = load_bench()
    zero = dict.fromkeys(bench.RATES, 0.0)
    task = {"seed": 1, "steps": 20, "wall_s": 30.0, "cpu_s": 29.0, "game": False, "line": "tiny on calculator",
            "first": zero, "last": {**zero, "correct_rate": 0.25, "reward_mean": 0.5},
            "guess": {"answer": "7", "n": 320, "correct_rate": 0.07, "reward_mean": 0.07, "best_reward": "17",
                      "best_reward_mean": 0.09}}
    out = bench.report([task], 1, 31.0, "/runs")
    assert "target" not in out[1] and "win" not in out[1] and out[1].split()[6:8] == ["reward_mean", "correct"]
    assert "0.000->0.500  0.000->0.250" in out[2]
    assert out[3] == "correct_rate over the last 10 steps, mean of 1 seeds: 0.250"
    assert out[4].startswith("seed 1 guessing baseline: always answering '7' (the commonest answer of the "
                             "run's 320 questions): correct_rate 0.070")
    assert out[4].endswith("the most rewarded constant answer '17': reward_mean 0.090")
    game = {**task, "game": True, "guess": None, "last": {**zero, "win_rate": 0.9, "invalid_move_rate": 0.01}}
    out = bench.report([game], 1, 31.0, "/runs")
    assert out[1].endswith("  target") and out[2].endswith("  met")
    assert out[3].startswith("target (last 10 steps: win >= 0.85")
    assert out[3].endswith("met in 1 of 1 seeds (first 10 -> last 10 steps above)")


def test_summary_reads_a_run_folder(tmp_path):
    import json

    from earl.runtime.run_config import to_dict

    bench = load_bench()
    cfg = resolve_config(overrides={"env.name": "calculator", "groups": 2, "seed": 4})
    (tmp_path / "config.json").write_text(json.dumps(to_dict(cfg)))
    cols = ["step", *bench.RATES, "step_s", "step_cpu_s"]
    rows = [[str(s), *(["0"] * len(bench.RATES)), "1.5", "1.0"] for s in range(1, 13)]
    rows[-1][cols.index("correct_rate")] = "0.5"  # step 12: in the last 10, not the first 10
    (tmp_path / "metrics.csv").write_text("\n".join(",".join(r) for r in [cols, *rows]) + "\n")
    got = bench.summarize_dir(str(tmp_path))
    assert (got["seed"], got["steps"], got["game"], got["wall_s"], got["cpu_s"]) == (4, 12, False, 18.0, 12.0)
    assert got["first"]["correct_rate"] == 0.0 and got["last"]["correct_rate"] == pytest.approx(0.05)
    assert got["guess"] == bench.guess_baseline(cfg, 12) and got["guess"]["n"] == 24
    out = bench.report([got], 0, 18.0, str(tmp_path))
    assert "from their run folders" in out[0] and "0.000->0.050" in out[2]


@pytest.mark.rgym
def test_reasoning_gym_guessing_baseline_is_the_commonest_answers_share():
    rg = pytest.importorskip("reasoning_gym")
    bench = load_bench()
    cfg = resolve_config(overrides={"env.name": "reasoning-gym:chain_sum", "groups": 16,
                                    **parse_sets(["env.options=max_terms=2,max_digits=1"])})
    got = bench.guess_baseline(cfg, steps=10)
    ds = rg.create_dataset("chain_sum", seed=0, size=2**31 - 1, max_terms=2, max_digits=1)
    answers = [ds[mix_seed(cfg.seed, step, g) % 2**31]["answer"] for step in range(1, 11) for g in range(16)]
    count = Counter(answers).most_common(1)[0][1]
    assert got["n"] == 160 and Counter(answers)[got["answer"]] == count
    assert got["correct_rate"] == pytest.approx(count / 160)
    # partial credit: a constant reply that is not the commonest answer can earn more reward
    assert got["best_reward_mean"] >= got["reward_mean"] > 0
    env = bench.make_env(cfg.env.name, **bench.env_options(cfg.env.name, cfg.env))
    seeds = [mix_seed(cfg.seed, step, g) % 2**31 for step in range(1, 11) for g in range(16)]
    by_hand = 0.0
    for seed in seeds:
        env.reset(seed)
        by_hand += env.step(got["best_reward"]).reward
    assert got["best_reward_mean"] == pytest.approx(by_hand / 160)
