"""Environments and their registry.

Built-in games and the calculator need nothing beyond earl; `openspiel:GAME` plays any
two-player OpenSpiel game (pip install open_spiel), `reasoning-gym:TASK` a procedural task of
the reasoning-gym package (pip install 'earl[rgym]') and `jsonl:PATH` trains on a prompt dataset
scored by a reward function (`env.reward = "FILE.py:FUNC"`). A name with a colon is KIND:ARG,
unless it names a user's class, `FILE.py:Class` or `package.module:Class` (earl.runtime.envs.user).

    python -c "from earl.runtime.envs import ENVS; print(sorted(ENVS))"
"""

from __future__ import annotations

import importlib.util

from earl.runtime.envs.base import OUTCOMES, BoardGameEnv, Env, StepResult
from earl.runtime.envs.calculator import Calculator
from earl.runtime.envs.connect_four import ConnectFour
from earl.runtime.envs.dataset import PromptDataset
from earl.runtime.envs.openspiel import OpenSpielEnv
from earl.runtime.envs.rgym import ReasoningGymEnv
from earl.runtime.envs.tictactoe import TicTacToe
from earl.runtime.envs.user import UserEnv, is_user_spec
from earl.specs import unknown_name_error

ENVS = {"tic-tac-toe": TicTacToe, "connect-four": ConnectFour, "calculator": Calculator,
        "openspiel": OpenSpielEnv, "jsonl": PromptDataset, "reasoning-gym": ReasoningGymEnv,
        "user": UserEnv}
ARG_ENVS = ("openspiel", "jsonl", "reasoning-gym")  # kinds named KIND:ARG; ARG is the constructor's first argument
GAME_OPTIONS = ("opponent", "agent_starts", "invalid_action", "invalid_reward", "max_retries",
                "valid_move_reward")
TOOL_OPTIONS = ("max_turns", "tool_timeout_s")
OPTIONS = {"tic-tac-toe": (*GAME_OPTIONS, "show"), "connect-four": GAME_OPTIONS, "openspiel": GAME_OPTIONS,
           "calculator": TOOL_OPTIONS, "jsonl": ("reward", "tools", "reward_timeout_s", *TOOL_OPTIONS),
           "reasoning-gym": ("options",), "user": ("options", "env_timeout_s")}


def split_env_name(name: str) -> tuple[str, str | None]:
    """'openspiel:connect_four' -> ('openspiel', 'connect_four'); 'tic-tac-toe' -> (name, None);
    'game.py:Game' -> ('user', 'game.py:Game'). Unknown kinds, and a missing or unexpected
    argument, are one-line errors."""
    kind, sep, arg = name.partition(":")
    where = name.rpartition(":")[0]  # a user's file (its path may hold a colon) or module
    if kind not in ENVS and is_user_spec(name) and (where.endswith(".py") or
                                                    importlib.util.find_spec(where.split(".")[0])):
        return "user", name
    if kind not in ENVS or kind == "user":
        raise unknown_name_error("env", name, [*(k for k in ENVS if k not in (*ARG_ENVS, "user")),
                                                *(f"{k}:NAME" for k in ARG_ENVS),
                                                "FILE.py:Class", "package.module:Class"])
    if kind in ARG_ENVS and not arg:
        example = {"openspiel": "openspiel:tic_tac_toe", "jsonl": "jsonl:prompts.jsonl",
                   "reasoning-gym": "reasoning-gym:basic_arithmetic"}[kind]
        raise ValueError(f"env {name!r} needs an argument: {kind}:NAME (e.g. {example})")
    if kind not in ARG_ENVS and sep:
        raise ValueError(f"env {kind!r} takes no argument, got {name!r}")
    return kind, (arg if kind in ARG_ENVS else None)


def make_env(name: str, **options) -> Env:
    """A fresh environment; `options` are the constructor keywords (unknown ones are an error)."""
    kind, arg = split_env_name(name)
    return ENVS[kind](arg, **options) if arg is not None else ENVS[kind](**options)


def env_options(name: str, cfg) -> dict:
    """The fields of an EnvConfig that the env `name` takes."""
    kind, _ = split_env_name(name)
    return {k: getattr(cfg, k) for k in OPTIONS[kind]}


__all__ = ["ENVS", "OUTCOMES", "BoardGameEnv", "Env", "StepResult", "UserEnv", "make_env", "env_options",
           "split_env_name"]
