"""The environment protocol, and the shared turn logic of two-player board games.

An environment speaks text: `reset(seed)` returns the first observation (the prompt) and
`step(action_text)` returns the next observation, a reward and whether the episode ended. Model
output is untrusted: environments parse it and turn anything unparseable or illegal into a
penalty, a retry or the end of the episode, never an exception.

    python -c "from earl.runtime.envs import make_env; e = make_env('tic-tac-toe'); print(e.reset(0))"
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Protocol

# "env_error": a user environment class raised, returned a wrong type or hung (earl.runtime.envs.user)
OUTCOMES = ("win", "draw", "loss", "invalid", "correct", "wrong", "truncated", "reward_error", "env_error")
OPPONENTS = ("random", "lookahead")
AGENT_STARTS = ("always", "never", "alternate")
INVALID_MODES = ("end", "retry", "substitute")


@dataclass(frozen=True)
class StepResult:
    observation: str  # text appended to the context before the next turn
    reward: float  # reward of this step (the episode return is the sum)
    done: bool  # the episode is over
    invalid: bool = False  # the action was unparseable or illegal
    outcome: str = ""  # one of OUTCOMES once done
    info: dict = field(default_factory=dict)
    role: str = "user"  # the observation's chat role: "user", or "tool" for tool results


class Env(Protocol):
    """What the rollout needs from an environment. Implement this to plug in your own."""

    max_new_tokens: int  # default generation budget per turn, tokens
    stop: tuple[str, ...]  # default stop strings
    # optional: `tool_schemas` (JSON schemas handed to the chat template) and `context` (messages
    # before the first observation, e.g. a system prompt), read after `reset`; `actions` (every
    # action's text, e.g. the digits of a board game's cells) with `legal_action_bits()` (bit i
    # set when actions[i] is legal now), read before each `step` for `trainer.legal_coef`

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> StepResult: ...


def parse_options(options: tuple[str, ...], where: str) -> dict:
    """`env.options` ("KEY=VALUE" strings, e.g. ("size=4", "word=cat")) as constructor keywords;
    a VALUE that reads as JSON (4, 0.5, true, "x", [1, 2]) is that value, else the text itself."""
    out = {}
    for item in options:
        key, eq, value = str(item).partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(f"{where}: option {item!r} is not KEY=VALUE (e.g. size=4)")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value.strip()
    return out


def check_choice(kind: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(f"{kind} {value!r} unknown; valid: {', '.join(valid)}")
    return value


class BoardGameEnv:
    """A two-player game against a scripted opponent; the agent plays 'x', the opponent 'o'.

    Subclasses define the board: `legal_moves`, `apply`, `winner`, `render`, `parse_move`.
    Rewards: win 1, draw 0, loss -1, plus `valid_move_reward` for each legal move (a dense
    signal that teaches legal play first). An illegal or unparseable move either ends the episode
    with `invalid_reward` ("end") or, in "retry" mode, costs `invalid_reward / (max_retries+1)`
    and shows the board again; more than `max_retries` invalid moves in a row end it; or, in
    "substitute" mode, costs `invalid_reward` and a random legal move is played in its place, so
    the game goes on (every episode reaches the late positions, each invalid move is scored in
    its own position)."""

    max_new_tokens = 1
    stop: tuple[str, ...] = ("\n",)
    title = "game"
    opponents = OPPONENTS  # the scripted opponents this game offers
    actions: tuple[str, ...] = ()  # every move's text, in `legal_action_bits` order (empty: not listed)

    def __init__(self, *, opponent: str = "random", agent_starts: str = "always",
                 invalid_action: str = "end", invalid_reward: float = -1.0, max_retries: int = 2,
                 valid_move_reward: float = 0.0):
        self.opponent = check_choice("opponent", opponent, self.opponents)
        self.agent_starts = check_choice("agent_starts", agent_starts, AGENT_STARTS)
        self.invalid_action = check_choice("invalid_action", invalid_action, INVALID_MODES)
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.invalid_reward = float(invalid_reward)
        self.max_retries = max_retries
        self.valid_move_reward = float(valid_move_reward)
        self.rng = random.Random(0)
        self.board: list[str] = []
        self.retries = 0

    # ---- board rules (subclasses) ----------------------------------------------------------
    def new_board(self) -> list[str]:
        raise NotImplementedError

    def legal_moves(self) -> list[int]:
        raise NotImplementedError

    def apply(self, move: int, player: str) -> None:
        raise NotImplementedError

    def winner(self) -> str | None:
        """'x', 'o', 'draw' or None while the game goes on."""
        raise NotImplementedError

    def render(self) -> str:
        raise NotImplementedError

    def parse_move(self, text: str) -> int | None:
        raise NotImplementedError

    def legal_action_bits(self) -> int:
        """The legal moves now as bits over `actions` (bit i: actions[i] is legal); what the
        trainer's legality term (`trainer.legal_coef`) pushes the move's probability onto."""
        if not self.actions:  # a game that lists no actions (OpenSpiel's): no legality term
            return 0
        index = {a: i for i, a in enumerate(self.actions)}
        return sum(1 << index[str(m)] for m in self.legal_moves() if str(m) in index)

    # ---- the protocol ----------------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self.rng = random.Random(seed)
        self.board = self.new_board()
        self.retries = 0
        starts = {"always": True, "never": False, "alternate": seed % 2 == 0}[self.agent_starts]
        if not starts:
            self.apply(self.opponent_move(), "o")
        return f"{self.title} x\n{self.render()}\n"

    def step(self, action: str) -> StepResult:
        move = self.parse_move(action)
        invalid = move is None or move not in self.legal_moves()
        if invalid and self.invalid_action != "substitute":
            return self._invalid()
        if invalid:  # a random legal move stands in for it; the invalid one is charged
            move = self.rng.choice(self.legal_moves())
        self.retries = 0
        self.apply(move, "x")
        if (w := self.winner()) is None:
            self.apply(self.opponent_move(), "o")
            w = self.winner()
        reward = self.invalid_reward if invalid else self.valid_move_reward
        if w is not None:
            return self._end(w, reward, invalid)
        return StepResult(observation=f"{self.render()}\n", reward=reward, done=False, invalid=invalid)

    def _invalid(self) -> StepResult:
        self.retries += 1
        if self.invalid_action != "retry" or self.retries > self.max_retries:
            return StepResult(observation="invalid\n", reward=self.invalid_reward, done=True,
                              invalid=True, outcome="invalid")
        return StepResult(observation=f"invalid\n{self.render()}\n", invalid=True, done=False,
                          reward=self.invalid_reward / (self.max_retries + 1))

    def _end(self, w: str, move_reward: float | None = None, invalid: bool = False) -> StepResult:
        """The final step; `move_reward` (default `valid_move_reward`) is the last move's own."""
        outcome = {"x": "win", "o": "loss", "draw": "draw"}[w]
        move_reward = self.valid_move_reward if move_reward is None else move_reward
        reward = {"win": 1.0, "loss": -1.0, "draw": 0.0}[outcome] + move_reward
        return StepResult(observation=f"{outcome}\n", reward=reward, done=True, outcome=outcome, invalid=invalid)

    # ---- scripted opponent -----------------------------------------------------------------
    def opponent_move(self) -> int:
        moves = self.legal_moves()
        if self.opponent == "lookahead":
            for player in ("o", "x"):  # win now if possible, else block the agent's win
                for m in moves:
                    if self._wins_after(m, player):
                        return m
        return self.rng.choice(moves)

    def _wins_after(self, move: int, player: str) -> bool:
        saved = list(self.board)
        self.apply(move, player)
        won = self.winner() == player
        self.board = saved
        return won
