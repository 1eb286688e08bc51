"""Any two-player, turn-based OpenSpiel game as an environment (`--env openspiel:GAME`).

The model plays one seat against a scripted opponent (uniformly random, or OpenSpiel's MCTS
bot). Each observation is the game's own observation string for the agent, followed by the
legal moves as action ids; the reply's first line is a move: an action id ("4") or the game's
action string ("x(1,1)"). Illegal or unparseable replies are handled as in the built-in games
(`BoardGameEnv`): end the episode with `invalid_reward`, or retry with a share of it.

    connect_four player 0
    .......  (6 rows)
    legal: 0 1 2 3 4 5 6
    -> agent answers "3"

    earl run --env openspiel:connect_four --steps 2
    python -c "from earl.runtime.envs import make_env; print(make_env('openspiel:tic_tac_toe').reset(0))"
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import random
import sys

from earl.runtime.envs.base import BoardGameEnv, StepResult

OPPONENTS = ("random", "mcts")
MCTS_SIMULATIONS = 64  # MCTS bot playouts per move (OpenSpiel's default evaluator: random rollouts)


def _pyspiel():
    try:
        import pyspiel
    except ImportError:
        raise ValueError("openspiel environments need the open_spiel package: pip install open_spiel") from None
    return pyspiel


@functools.lru_cache(maxsize=32)
def load_game(name: str):
    """The OpenSpiel game `name` (parameters allowed: "connect_four(rows=5)"); a two-player,
    sequential game, else a one-line ValueError (unknown names list the close ones)."""
    pyspiel = _pyspiel()
    base = name.split("(", 1)[0]
    known = pyspiel.registered_names()
    if base not in known:
        close = difflib.get_close_matches(base, known, n=5, cutoff=0.5)
        hint = f"close: {', '.join(close)}" if close else "none close"
        raise ValueError(f"unknown OpenSpiel game {base!r} ({hint}); list them with "
                         "python -c \"import pyspiel; print(pyspiel.registered_names())\"")
    check_game_parameters(name, base, pyspiel)
    try:
        with _quiet_stderr():  # OpenSpiel prints its exception's text on stderr as well
            game = pyspiel.load_game(name)
    except pyspiel.SpielError as e:
        raise ValueError(f"OpenSpiel game {name!r}: {str(e).splitlines()[0]}") from None
    gt = game.get_type()
    if game.num_players() != 2 or gt.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ValueError(f"OpenSpiel game {name!r} has {game.num_players()} players and {gt.dynamics.name} "
                         "moves; earl plays two-player turn-based games")
    return game


def _split_top(text: str) -> list[str]:
    """'a=1,b=g(x=1,y=2)' -> ['a=1', 'b=g(x=1,y=2)'] (commas inside parentheses kept)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur] if cur or parts else []


def check_game_parameters(name: str, base: str, pyspiel) -> None:
    """GAME(k=v, ...) against the game's own parameter specification: the syntax, each name
    (the valid ones listed) and each value's type; a one-line ValueError otherwise."""
    if name == base:
        return
    rest = name[len(base):]
    if not (rest.startswith("(") and rest.endswith(")")) or rest.count("(") != rest.count(")"):
        raise ValueError(f"OpenSpiel game {name!r}: expected GAME(name=value,...), e.g. connect_four(rows=5)")
    spec = next(g.parameter_specification for g in pyspiel.registered_games() if g.short_name == base)
    valid = ", ".join(sorted(spec)) or "none"
    for item in _split_top(rest[1:-1]):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not key:
            raise ValueError(f"OpenSpiel game {name!r}: parameter {item.strip()!r} is not name=value; "
                             f"{base} takes: {valid}")
        if key not in spec:
            raise ValueError(f"OpenSpiel game {name!r}: {base} takes no parameter {key!r}; valid: {valid}")
        default = spec[key]
        if isinstance(default, bool):
            ok = value in ("true", "false")
        elif isinstance(default, int):
            ok = value.lstrip("-").isdigit()
        elif isinstance(default, float):
            try:
                float(value)
                ok = True
            except ValueError:
                ok = False
        else:
            ok = True
        if not ok:
            kind = {bool: "true or false", int: "an integer", float: "a number"}[type(default)]
            raise ValueError(f"OpenSpiel game {name!r}: {key}={value!r} must be {kind} "
                             f"(the default is {str(default).lower() if isinstance(default, bool) else default})")


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for the duration (C++ code writing there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class OpenSpielEnv(BoardGameEnv):
    """The agent against a scripted opponent in an OpenSpiel game. Rewards: the game's return
    for the agent at the end (win 1, loss -1, draw 0 in zero-sum games), plus
    `valid_move_reward` per legal move; chance nodes are sampled from the game's own odds.
    Invalid moves as in `BoardGameEnv` (its constructor checks the options)."""

    opponents = OPPONENTS

    def __init__(self, game: str, **options):
        if options.get("invalid_action") == "substitute":
            raise ValueError("invalid_action 'substitute' is not offered by openspiel games; valid: end, retry")
        super().__init__(**options)
        self.game_name = game
        self.game = load_game(game)
        self.max_new_tokens = len(str(self.game.num_distinct_actions() - 1))
        self.state = None
        self.agent = 0
        self._bot = None

    # ---- the protocol ----------------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self.rng = random.Random(seed)
        self.state = self.game.new_initial_state()
        self.retries = 0
        starts = {"always": True, "never": False, "alternate": seed % 2 == 0}[self.agent_starts]
        self.agent = 0 if starts else 1
        self._bot = self._make_bot(seed) if self.opponent == "mcts" else None
        self._advance()
        return f"{self.game_name} player {self.agent}\n{self.render()}\n"

    def step(self, action: str) -> StepResult:
        move = self.parse_move(action)
        if move is None or move not in self.state.legal_actions():
            return self._invalid()
        self.retries = 0
        self.state.apply_action(move)
        self._advance()
        if self.state.is_terminal():
            return self._end()
        return StepResult(observation=f"{self.render()}\n", reward=self.valid_move_reward, done=False)

    # ---- rules -----------------------------------------------------------------------------
    def parse_move(self, text: str) -> int | None:
        s = text.split("\n", 1)[0].strip().lower()
        if not s:
            return None
        if s.isdigit():
            return int(s)
        for a in self.state.legal_actions():
            if self.state.action_to_string(self.agent, a).lower() == s:
                return a
        return None

    def _advance(self) -> None:
        """Play chance outcomes and opponent moves until the agent moves or the game ends."""
        st = self.state
        while not st.is_terminal() and (st.is_chance_node() or st.current_player() != self.agent):
            if st.is_chance_node():
                outcomes, probs = zip(*st.chance_outcomes(), strict=True)
                st.apply_action(self.rng.choices(outcomes, weights=probs)[0])
            elif self._bot is not None:
                st.apply_action(self._bot.step(st))
            else:
                st.apply_action(self.rng.choice(st.legal_actions()))

    def render(self) -> str:
        gt = self.game.get_type()
        obs = self.state.observation_string(self.agent) if gt.provides_observation_string else str(self.state)
        return f"{obs.rstrip()}\nlegal: {' '.join(map(str, self.state.legal_actions()))}"

    def _make_bot(self, seed: int):
        import numpy as np
        from open_spiel.python.algorithms import mcts

        rs = np.random.RandomState(seed)
        return mcts.MCTSBot(self.game, uct_c=2.0, max_simulations=MCTS_SIMULATIONS,
                            evaluator=mcts.RandomRolloutEvaluator(1, rs), random_state=rs)

    def _end(self, w: str = "") -> StepResult:
        ret = float(self.state.returns()[self.agent])
        outcome = "win" if ret > 0 else "loss" if ret < 0 else "draw"
        return StepResult(observation=f"{outcome}\n", reward=ret + self.valid_move_reward, done=True,
                          outcome=outcome)
