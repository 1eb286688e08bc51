"""User environment classes (`--env FILE.py:Class`, `--env package.module:Class`): the worked
example, bad specs as one-line errors, a class that raises, returns the wrong type or hangs
(episode ends as env_error, counted; the run goes on; other episodes replayed after a restart),
and `earl run` end to end on one process and on two (slow).

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_user_envs.py
    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_user_envs.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.envs import env_options, make_env, split_env_name, user
from earl.runtime.resolve import resolve_config
from tests.runtime.env_runs import assert_one_and_two_processes_agree, rows_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT / 'examples' / 'guess_number.py'}:GuessNumber"
RUN = ["--quiet", "--set", "plots=false", "--set", "checkpoints=false", "--set", "group_size=2"]

FLAKY = '''
import os, random, time
from earl.runtime.envs import StepResult

class Flaky:
    """Count to the seed's target; misbehaves on purpose depending on `mode` and the seed."""
    max_new_tokens = 2
    stop = ("\\n",)

    def __init__(self, mode="ok", bad_seed=-1):
        self.mode, self.bad_seed, self.seed, self.turn = mode, bad_seed, 0, 0

    def reset(self, seed):
        self.seed, self.turn = seed, 0
        if self.mode == "reset-raises" and seed == self.bad_seed:
            raise RuntimeError("no board today")
        if self.mode == "reset-type":
            return 42
        return f"count {seed % 3 + 1}\\n"

    def step(self, action):
        self.turn += 1
        bad = self.seed == self.bad_seed or self.bad_seed == -2
        if bad and self.mode == "raises":
            raise KeyError("boom")
        if bad and self.mode == "type":
            return {"observation": "x"}
        if bad and self.mode == "nan":
            return StepResult(observation="x", reward=float("nan"), done=True)
        if bad and self.mode == "hangs":
            time.sleep(3600)
        if bad and self.mode == "exits":
            os._exit(3)
        if self.mode == "random-obs":
            return StepResult(observation=f"{random.random()}\\n", reward=0.0, done=False)
        done = self.turn >= self.seed % 3 + 1
        return StepResult(observation=f"turn {self.turn}\\n", reward=float(done), done=done,
                          outcome="win" if done else "")

class NotAnEnv:
    def reset(self, seed):
        return ""
'''


@pytest.fixture(autouse=True)
def fresh_reports():
    user._REPORTED.clear()  # each distinct failure is printed once per process, 8 at most


@pytest.fixture
def flaky(tmp_path):
    p = tmp_path / "flaky.py"
    p.write_text(FLAKY)
    return f"{p}:Flaky"


def play(env, seed: int, actions=("1", "2", "3")):
    obs, results = env.reset(seed), []
    for a in actions:
        results.append(env.step(a))
        if results[-1].done:
            break
    return obs, results


def test_the_example_is_an_env_with_its_options():
    env = make_env(EXAMPLE, options=("high=4", "max_guesses=2"))
    assert split_env_name(EXAMPLE) == ("user", EXAMPLE)
    assert (env.max_new_tokens, env.stop) == (1, ("\n",))
    assert env.reset(3) == "guess 1-4\n"
    secret = random.Random(3).randint(1, 4)
    wrong = 1 if secret > 1 else 2
    first = env.step(str(wrong))
    assert (first.observation, first.done) == ("higher\n" if wrong < secret else "lower\n", False)
    last = env.step(str(wrong))
    assert (last.outcome, last.reward, last.done) == ("loss", 0.0, True)  # max_guesses=2
    env.reset(3)
    assert (env.step(str(secret)).outcome, env.step.__name__) == ("win", "step")
    bad = make_env(EXAMPLE)
    bad.reset(0)
    res = bad.step("x")
    assert (res.done, res.invalid, res.outcome, res.reward) == (True, True, "invalid", -0.5)


def test_the_example_plays_like_the_class_itself():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from guess_number import GuessNumber
    finally:
        sys.path.remove(str(ROOT / "examples"))
    for seed in range(6):
        local, remote = GuessNumber(high=5), make_env(EXAMPLE, options=("high=5",))
        assert play(local, seed, "123") == play(remote, seed, "123")


def test_bad_specs_are_one_line_errors(tmp_path, flaky):
    cases = {
        "missing.py:Game": "file 'missing.py' not found",
        f"{ROOT / 'examples' / 'guess_number.py'}:Nope": "class 'Nope' not found in .*classes there: GuessNumber",
        f"{flaky.rpartition(':')[0]}:NotAnEnv": "is not an Env .*no step",
        "no_such_pkg_xyz.mod:Game": r"unknown env 'no_such_pkg_xyz.mod:Game'; known: FILE.py:Class",
        "json:JSONDecoder": "'JSONDecoder' in json is not an Env",
        "json.decoder:Nope": "class 'Nope' not found in json.decoder",
    }
    for spec, match in cases.items():
        with pytest.raises(ValueError, match=match):
            make_env(spec)
    with pytest.raises(ValueError, match="high must be in 2..9"):
        make_env(EXAMPLE, options=("high=40",))
    with pytest.raises(ValueError, match="unexpected keyword argument 'colour'"):
        make_env(EXAMPLE, options=("colour=4",))
    with pytest.raises(ValueError, match="option 'high' is not KEY=VALUE"):
        make_env(EXAMPLE, options=("high",))
    broken = tmp_path / "broken.py"
    broken.write_text("import nothing_here_xyz\n")
    with pytest.raises(ValueError, match="failed to import: ModuleNotFoundError"):
        make_env(f"{broken}:Game")
    for spec in ("missing.py:Game", f"{broken}:Game"):
        r = CliRunner().invoke(app, ["run", "--env", spec, "--steps", "1"])
        assert r.exit_code == 2 and spec.split("/")[-1] in r.output and "Traceback" not in r.output, r.output


def test_a_file_whose_path_holds_a_colon(tmp_path):
    d = tmp_path / "a:b"
    d.mkdir()
    (d / "game.py").write_text((ROOT / "examples" / "guess_number.py").read_text())
    assert make_env(f"{d / 'game.py'}:GuessNumber").reset(1) == "guess 1-8\n"


def test_a_package_module_class(tmp_path, monkeypatch):
    pkg = tmp_path / "mygames_xyz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "guess.py").write_text((ROOT / "examples" / "guess_number.py").read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    user._SANDBOX.close()  # a helper started before the path changed would not see the package
    env = make_env("mygames_xyz.guess:GuessNumber", options=("high=3",))
    assert env.reset(1) == "guess 1-3\n"
    assert env.step("9").outcome == "invalid"


@pytest.mark.parametrize("mode, why", [("raises", "step: KeyError: 'boom'"),
                                       ("type", "step returned dict, not a StepResult"),
                                       ("nan", "step's reward is nan"),
                                       ("exits", "step: its process died (exit code 3)"),
                                       ("reset-raises", "reset: RuntimeError: no board today")])
def test_a_failing_class_ends_the_episode_as_env_error(flaky, mode, why, capsys):
    bad, good = make_env(flaky, options=(f"mode={json.dumps(mode)}", "bad_seed=4")), make_env(flaky)
    before = user.ENV_ERRORS.get(flaky, 0)
    _, results = play(bad, 4)
    assert [(r.done, r.outcome, r.reward) for r in results] == [(True, "env_error", 0.0)]
    assert why in results[0].info["env_error"]
    assert user.ENV_ERRORS[flaky] == before + 1
    assert why in capsys.readouterr().err
    assert play(good, 4)[1][-1].outcome == "win"  # the next episode is unaffected
    assert play(bad, 5)[1][-1].outcome == "win"
    obs, results = play(make_env(flaky, options=('mode="reset-type"',)), 1)
    assert results[0].outcome == "env_error"
    assert results[0].info["env_error"] == "reset: reset returned int, not a str"


def test_a_hanging_class_is_stopped_and_the_other_episodes_replayed(flaky):
    opts = dict(options=('mode="hangs"', "bad_seed=7"), env_timeout_s=0.5)
    others = [make_env(flaky, **opts) for _ in range(3)]
    seen = [(o.reset(s), o.step("1")) for s, o in zip((2, 5, 8), others, strict=True)]  # 3-turn episodes
    hung = make_env(flaky, **opts)
    restarts = user._SANDBOX.restarts
    _, results = play(hung, 7)
    assert results[0].outcome == "env_error" and "timed out after 0.5s" in results[0].info["env_error"]
    assert user._SANDBOX.restarts == restarts + 1
    for (_, first), o in zip(seen, others, strict=True):  # rebuilt in the new helper, then go on
        assert first.observation == "turn 1\n"
        second = o.step("2")
        assert (second.observation, second.outcome) == ("turn 2\n", "")
        assert o.step("3").outcome == "win"


def test_a_class_that_differs_on_replay_is_an_env_error(flaky):
    env = make_env(flaky, options=('mode="random-obs"',))
    env.reset(1)
    env.step("1")
    user._SANDBOX.close()  # as after a timeout elsewhere
    res = env.step("2")
    assert res.outcome == "env_error" and "observation differed" in res.info["env_error"]


def test_env_options_come_from_the_config_file(tmp_path, flaky):
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text(f'[env]\nname = "{EXAMPLE}"\noptions = ["high=3", "max_guesses=1"]\nenv_timeout_s = 2.5\n')
    cfg = resolve_config(str(cfg_file), resume=None, overrides={})
    opts = env_options(cfg.env.name, cfg.env)
    assert opts == {"options": ("high=3", "max_guesses=1"), "env_timeout_s": 2.5}
    env = make_env(cfg.env.name, **opts)
    assert env.reset(0) == "guess 1-3\n" and env.timeout_s == 2.5
    cfg = resolve_config(None, resume=None, overrides={"env.name": flaky, "env.options": "mode=raises,bad_seed=3"})
    assert cfg.env.options == ("mode=raises", "bad_seed=3")


def test_earl_run_trains_on_a_user_class_that_sometimes_fails(tmp_path, flaky):
    """Some episodes raise, one group hangs: counted in env_error_rate, the run completes."""
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--env", flaky, "--steps", "2", "--out", str(out), *RUN,
                                 "--set", "groups=3", "--set", "env.options=mode=hangs,bad_seed=-2",
                                 "--set", "env.env_timeout_s=0.3"])
    assert r.exit_code == 0, r.output
    rows = rows_of(out)
    assert [x["step"] for x in rows] == [1, 2]
    assert all(x["env_error_rate"] == 1.0 for x in rows)  # every episode's step hangs, the run goes on
    assert "timed out after 0.3s" in r.stderr
    out2 = tmp_path / "run2"
    r = CliRunner().invoke(app, ["run", "--env", EXAMPLE, "--steps", "2", "--out", str(out2), *RUN,
                                 "--set", "groups=4"])
    assert r.exit_code == 0, r.output
    rows = rows_of(out2)
    assert len(rows) == 2 and all(x["env_error_rate"] == 0 for x in rows)
    assert all(x["win_rate"] + x["loss_rate"] + x["invalid_rate"] == pytest.approx(1) for x in rows)


@pytest.mark.slow
@pytest.mark.dist
def test_earl_run_on_two_processes_plays_the_same_episodes(tmp_path):
    assert_one_and_two_processes_agree(tmp_path, ["--env", EXAMPLE, *RUN, "--set", "groups=4"],
                                       ("reward_mean", "tokens", "win_rate", "invalid_rate", "env_error_rate"))


def test_episodes_a_broken_env_ended_are_not_trained_on(tmp_path, flaky):
    """env_error episodes (reward 0 from a crash, not from the policy) leave the batch and their
    groups' baselines; the others train; the metric env_errors_dropped counts them."""
    from earl.runtime.seeds import mix_seed

    seed = 0  # the run's seed (--set seed=0): group 0 of step 1 plays environment seed `bad`
    bad = mix_seed(seed, 1, 0) % (2**31)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--env", flaky, "--steps", "1", "--out", str(out), *RUN,
                                 "--set", "groups=3", "--set", f"seed={seed}",
                                 "--set", f"env.options=mode=raises,bad_seed={bad}"])
    assert r.exit_code == 0, r.output
    (row,) = rows_of(out)
    assert row["env_error_rate"] == pytest.approx(2 / 6)  # group 0's two episodes raised
    assert row["env_errors_dropped"] == 2
    assert row["samples_trained"] == 4
