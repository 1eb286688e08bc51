"""OpenSpiel games as environments: observation text, move parsing, invalid moves as in the
built-in games, opponents, errors, and `earl run --env openspiel:GAME` end to end."""

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.envs import make_env

pytest.importorskip("pyspiel")  # in the `test` extra; skip only where it cannot be installed


def test_observation_is_the_games_string_with_legal_moves():
    e = make_env("openspiel:tic_tac_toe")
    obs = e.reset(0)
    assert obs.startswith("tic_tac_toe player 0\n...\n...\n...\n")
    assert obs.endswith("legal: 0 1 2 3 4 5 6 7 8\n")
    r = e.step("4")
    assert not r.done and not r.invalid
    assert r.observation.splitlines()[1] == ".x."  # agent's move; the opponent moved too
    assert len(r.observation.split("legal: ")[1].split()) == 7


def test_action_strings_parse_too():
    e = make_env("openspiel:tic_tac_toe")
    e.reset(0)
    assert e.parse_move("x(1,1)\nmore") == 4
    assert e.parse_move("  4 ") == 4
    assert e.parse_move("?") is None


def test_invalid_moves_end_or_retry():
    e = make_env("openspiel:connect_four")
    e.reset(0)
    r = e.step("z")
    assert r.done and r.invalid and r.outcome == "invalid" and r.reward == -1.0
    e = make_env("openspiel:connect_four", invalid_action="retry", max_retries=1)
    e.reset(0)
    r = e.step("9")  # not a legal action id
    assert not r.done and r.invalid and r.reward == pytest.approx(-0.5) and "invalid" in r.observation
    r = e.step("9")
    assert r.done and r.outcome == "invalid"


@pytest.mark.parametrize("opponent", ["random", "mcts"])
def test_games_finish_with_an_outcome(opponent):
    for seed in range(3):
        e = make_env("openspiel:tic_tac_toe", opponent=opponent, agent_starts="alternate")
        obs = e.reset(seed)
        for _ in range(9):
            r = e.step(obs.split("legal: ")[1].split()[0])
            if r.done:
                break
            obs = r.observation
        assert r.done and r.outcome in ("win", "draw", "loss")


def test_mcts_beats_a_first_legal_player():
    losses = 0
    for seed in range(4):
        e = make_env("openspiel:tic_tac_toe", opponent="mcts")
        obs = e.reset(seed)
        while True:
            r = e.step(obs.split("legal: ")[1].split()[0])
            if r.done:
                break
            obs = r.observation
        losses += r.outcome == "loss"
    assert losses >= 3


def test_errors_are_one_line():
    with pytest.raises(ValueError, match=r"close: tic_tac_toe"):
        make_env("openspiel:tic_tac_to")
    with pytest.raises(ValueError, match="needs an argument"):
        make_env("openspiel")
    with pytest.raises(ValueError, match="turn-based"):
        make_env("openspiel:matrix_rps")
    with pytest.raises(ValueError, match="opponent"):
        make_env("openspiel:tic_tac_toe", opponent="lookahead")
    r = CliRunner().invoke(app, ["run", "--env", "openspiel:conect_four", "--steps", "1"])
    assert r.exit_code == 2 and "connect_four" in r.output and "Traceback" not in r.output


def test_earl_run_connect_four(tmp_path):
    r = CliRunner().invoke(app, ["run", "--env", "openspiel:connect_four", "--steps", "2", "--quiet",
                                 "--out", str(tmp_path / "run"), "--set", "groups=4", "--set", "plots=false"])
    assert r.exit_code == 0, r.output
    import json
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2] and rows[0]["episodes"] == 4
