"""Environment rules: wins, draws, invalid moves, opponents, tool calls."""

import time

import pytest

from earl.runtime.envs import make_env
from earl.runtime.envs.calculator import Calculator, ToolError, calculate
from earl.runtime.envs.connect_four import ConnectFour
from earl.runtime.envs.tictactoe import TicTacToe


def ttt(board: str) -> TicTacToe:
    """A game with a given board ('x', 'o', '.' per cell, row-major)."""
    e = TicTacToe()
    e.reset(0)
    e.board = ["" if c == "." else c for c in board]
    return e


@pytest.mark.parametrize("board,winner", [
    ("xxx" "oo." "...", "x"), ("o.x" "o.x" "o..", "o"), ("x.o" ".xo" "..x", "x"),
    ("..o" ".o." "o.x", "o"), ("xox" "xoo" "oxx", "draw"), ("x.." "..." "...", None)])
def test_tictactoe_winner(board, winner):
    assert ttt(board).winner() == winner


def test_tictactoe_agent_wins_and_rewards():
    e = ttt("xx." "oo." "...")
    r = e.step("3")
    assert r.done and r.outcome == "win" and r.reward == 1.0 and not r.invalid


def test_tictactoe_loss_and_draw():
    e = ttt("x.." "oo." "x..")
    e.opponent = "lookahead"
    r = e.step("9")  # the agent does not block; the lookahead opponent completes its row
    assert r.done and r.outcome == "loss" and r.reward == -1.0
    e = ttt("xox" "xoo" "ox.")
    r = e.step("9")  # fills the last cell without a line
    assert r.done and r.outcome == "draw" and r.reward == 0.0


@pytest.mark.parametrize("action", ["1", "0", "x", "", "12", "five", "\n5"])
def test_tictactoe_invalid_moves_end_the_episode(action):
    e = ttt("x.." "o.." "...")
    r = e.step(action)
    assert r.done and r.invalid and r.outcome == "invalid" and r.reward == -1.0


def test_tictactoe_retry_mode():
    e = TicTacToe(invalid_action="retry", max_retries=1, invalid_reward=-1.0)
    e.reset(0)
    r = e.step("a")
    assert not r.done and r.invalid and r.reward == pytest.approx(-0.5) and "invalid" in r.observation
    r = e.step("b")
    assert r.done and r.outcome == "invalid"


def test_tictactoe_substitute_mode_charges_the_move_and_plays_on():
    """"substitute": an invalid move costs invalid_reward, a random free cell is played for the
    agent and the opponent replies, so the game goes on; a final substituted move keeps both."""
    e = TicTacToe(invalid_action="substitute", invalid_reward=-1.0, valid_move_reward=0.1, show="moves")
    e.reset(0)
    r = e.step("5")
    assert not r.done and not r.invalid and r.reward == pytest.approx(0.1)
    taken = e.moves[1][1]
    r = e.step(str(taken))  # the opponent's cell
    assert r.invalid and not r.done and r.reward == -1.0 and len(e.moves) == 4
    assert e.moves[2][0] == "x" and e.moves[2][1] != taken and r.observation == " ".join(
        f"{p}{m}" for p, m in e.moves) + "\n"
    e = ttt("xx." "oo." "...")
    e.invalid_action = "substitute"
    e.legal_moves = lambda: [3]  # the substitute can only complete the row
    r = e.step("x")
    assert r.done and r.invalid and r.outcome == "win" and r.reward == 0.0  # +1 win, -1 invalid
    with pytest.raises(ValueError, match="invalid_action 'skip' unknown; valid: end, retry, substitute"):
        TicTacToe(invalid_action="skip")


def test_tictactoe_opponent_starts_and_board_format():
    e = TicTacToe(agent_starts="never")
    obs = e.reset(3)
    board = obs.removeprefix("tic-tac-toe x\n")
    assert board.count("o") == 1 and board.count("|") == 2 and board.endswith("\n")
    e = TicTacToe()
    assert e.reset(0) == "tic-tac-toe x\n123|456|789\n"
    r = e.step("5")
    assert "x" in r.observation.split("|")[1] and r.reward == 0.0


def test_tictactoe_moves_format_shows_exactly_the_taken_cells():
    """`show="moves"` lists the moves so far: the digits of each observation are
    exactly the taken cells, so no earlier observation shows a taken cell as free."""
    e = make_env("tic-tac-toe", show="moves")
    assert e.reset(0) == "tic-tac-toe x\n\n"
    r = e.step("5")
    assert r.observation == f"x5 o{e.moves[1][1]}\n" and r.reward == 0.0
    for _ in range(3):
        if r.done:
            break
        taken = {str(i + 1) for i, c in enumerate(e.board) if c}
        assert {c for c in r.observation if c.isdigit()} == taken and len(taken) == len(e.moves)
        assert r.observation == " ".join(f"{p}{m}" for p, m in e.moves) + "\n"
        r = e.step(str(e.legal_moves()[0]))
    e = TicTacToe(agent_starts="never", show="moves")
    obs = e.reset(3)
    assert obs == f"tic-tac-toe x\no{e.moves[0][1]}\n" and e.moves[0][0] == "o"
    e = TicTacToe(invalid_action="retry", show="moves")
    e.reset(1)
    shown = e.step("5").observation
    assert e.step("5").observation == f"invalid\n{shown}"  # the same moves again, nothing new
    with pytest.raises(ValueError, match="show 'grid' unknown; valid: moves, board"):
        TicTacToe(show="grid")


def test_lookahead_blocks_and_wins():
    e = ttt("xx." "o.." "...")
    e.opponent = "lookahead"
    assert e.opponent_move() == 3  # block the agent's row
    e = ttt("xx." "oo." "x..")
    e.opponent = "lookahead"
    assert e.opponent_move() == 6  # winning beats blocking


def c4(cols: list[int], first: str = "x") -> ConnectFour:
    e = ConnectFour()
    e.reset(0)
    p = first
    for c in cols:
        e.apply(c, p)
        p = "o" if p == "x" else "x"
    return e


def test_connect_four_wins():
    assert c4([1, 2, 1, 2, 1, 2, 1]).winner() == "x"  # vertical
    assert c4([1, 1, 2, 2, 3, 3, 4]).winner() == "x"  # horizontal
    assert c4([1, 2, 2, 3, 4, 3, 3, 4, 4, 7, 4]).winner() == "x"  # diagonal /
    assert c4([7, 6, 6, 5, 4, 5, 5, 4, 4, 1, 4]).winner() == "x"  # diagonal \
    assert c4([1, 2, 3]).winner() is None


def test_connect_four_full_column_is_invalid_and_draw():
    e = c4([3] * 6)
    assert 3 not in e.legal_moves()
    r = e.step("3")
    assert r.done and r.invalid and r.outcome == "invalid"
    e = ConnectFour()
    e.reset(0)
    e.board = list("xxoxxox" "ooxooxo" "xxoxxox" "ooxooxo" "xxoxxox" "ooxooxo")
    assert e.winner() == "draw"
    assert ConnectFour().parse_move("8") is None


def test_connect_four_plays_to_the_end():
    e = make_env("connect-four", opponent="random")
    e.reset(1)
    for _ in range(30):
        move = e.legal_moves()[0]
        r = e.step(str(move))
        if r.done:
            assert r.outcome in ("win", "loss", "draw")
            break
    else:
        pytest.fail("game did not end")


def test_calculator_parser():
    assert calculate("2*(3+4)") == "14"
    assert calculate("7/2") == "3.5"
    assert calculate("-3+5") == "2"
    for bad in ("__import__('os')", "2**3", "1/0", "(1+2", "9" * 13, "1" * 70):
        with pytest.raises(ToolError):
            calculate(bad)


def test_calculator_episode():
    e = Calculator()
    q = e.reset(5)
    expr = q.removeprefix("q: ").strip()
    r = e.step(f"calc({expr})")
    assert not r.done and r.observation.startswith("= ")
    answer = r.observation[2:].strip()
    r = e.step(f"ans {answer}")
    assert r.done and r.outcome == "correct" and r.reward == 1.0
    e.reset(5)
    r = e.step("calc(1/0)")
    assert "error: division by zero" in r.observation and not r.done
    r = e.step("hello")
    assert r.invalid and "expected" in r.observation
    r = e.step("ans 0.123")
    assert r.done and r.outcome == "wrong"


def test_tool_exceptions_and_timeouts_become_observations():
    def slow(_):
        time.sleep(0.5)
        return "late"

    def broken(_):
        raise RuntimeError("boom")

    e = Calculator(tools={"slow": slow, "broken": broken}, tool_timeout_s=0.05, max_turns=3)
    e.reset(0)
    r = e.step("slow(1)")
    assert "timed out" in r.observation and not r.done
    r = e.step("broken(1)")
    assert "boom" in r.observation
    r = e.step("broken(1)")
    assert r.done and r.outcome == "truncated"


def test_unknown_env_and_option():
    with pytest.raises(ValueError, match="unknown env"):
        make_env("chess")
    with pytest.raises(ValueError, match="opponent"):
        make_env("tic-tac-toe", opponent="perfect")


def test_openspiel_games_refuse_substitute_mode():
    pytest.importorskip("pyspiel")
    msg = "invalid_action 'substitute' is not offered by openspiel games; valid: end, retry"
    with pytest.raises(ValueError, match=msg):
        make_env("openspiel:tic_tac_toe", invalid_action="substitute")
