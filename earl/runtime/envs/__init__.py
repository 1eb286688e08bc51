"""Built-in environments and their registry.

    python -c "from earl.runtime.envs import ENVS; print(sorted(ENVS))"
"""

from __future__ import annotations

from earl.runtime.envs.base import OUTCOMES, BoardGameEnv, Env, StepResult
from earl.runtime.envs.calculator import Calculator
from earl.runtime.envs.connect_four import ConnectFour
from earl.runtime.envs.tictactoe import TicTacToe
from earl.specs import unknown_name_error

ENVS = {"tic-tac-toe": TicTacToe, "connect-four": ConnectFour, "calculator": Calculator}
GAME_OPTIONS = ("opponent", "agent_starts", "invalid_action", "invalid_reward", "max_retries",
                "valid_move_reward")
TOOL_OPTIONS = ("max_turns", "tool_timeout_s")


def make_env(name: str, **options) -> Env:
    """A fresh environment; `options` are the constructor keywords (unknown ones are an error)."""
    if name not in ENVS:
        raise unknown_name_error("env", name, ENVS)
    return ENVS[name](**options)


def env_options(name: str, cfg) -> dict:
    """The fields of an EnvConfig that the env `name` takes."""
    if name not in ENVS:
        raise unknown_name_error("env", name, ENVS)
    keys = TOOL_OPTIONS if name == "calculator" else GAME_OPTIONS
    return {k: getattr(cfg, k) for k in keys}


__all__ = ["ENVS", "OUTCOMES", "BoardGameEnv", "Env", "StepResult", "make_env", "env_options"]
