"""A user's environment class (`--env FILE.py:Class` or `--env package.module:Class`), run in
a helper process with every call bounded.

The class implements the built-ins' `Env` protocol (earl.runtime.envs.base) and is built with
the keywords of `env.options`. `UserEnv` is that protocol on the trainer's side: each instance
holds one instance of the class in this rank's env helper (earl.runtime.sandbox) and each
`reset` / `step` is one call there, bounded by `env.env_timeout_s`. A call that raises, returns
the wrong type or hangs ends that episode as `env_error` (reward 0, counted); after a timeout the
helper restarts and the other episodes are replayed from their seed and actions. A bad spec is a
ValueError at startup. The rules in full: docs/environments.md.

    earl run --env examples/guess_number.py:GuessNumber --steps 20
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
import os
import re
import sys
import weakref
from collections import deque
from pathlib import Path

from earl.runtime.envs.base import OUTCOMES, StepResult, parse_options
from earl.runtime.sandbox import STARTUP_TIMEOUT_S, Sandbox, UserCodeError, apply_held, hold, load_file_module

_MODULE_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_SANDBOX = Sandbox()  # this rank's env helper (a hang here never touches the reward helper)
_KEYS = itertools.count()
_DROPS: deque[str] = deque()  # keys of collected UserEnvs, released with the next call
_REPORTED: set[str] = set()
ENV_ERRORS: dict[str, int] = {}  # spec -> episodes ended by env_error on this process


def is_user_spec(name: str) -> bool:
    """FILE.py:Class or package.module:Class."""
    file, sep, cls = name.rpartition(":")
    return bool(sep and cls.isidentifier() and (file.endswith(".py") or _MODULE_SPEC.match(name)))


def user_target(spec: str) -> tuple[str, str, str]:
    """The sandbox target of a spec: ("file", ABS_PATH, Class) or ("module", MODULE, Class)."""
    where, _, cls = spec.rpartition(":")
    if where.endswith(".py"):
        p = Path(where)
        if not p.is_file():
            raise ValueError(f"env {spec!r}: file {where!r} not found")
        return ("file", str(p.resolve()), cls)
    return ("module", where, cls)


def _describe(target: tuple[str, str, str], options: dict) -> tuple[int, tuple[str, ...]]:
    """(runs in the helper) Load the class, check it is an Env, build one with `options`."""
    kind, where, name = target
    if kind == "file":
        module = load_file_module(where)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise ValueError(f"module {where!r} not found ({e})") from None
    cls = getattr(module, name, None)
    if cls is None:
        names = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_"))
        raise ValueError(f"class {name!r} not found in {where}; classes there: {', '.join(names) or 'none'}")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        why = "not a class" if not isinstance(cls, type) else "no " + ", ".join(missing)
        raise ValueError(f"{name!r} in {where} is not an Env (a class with reset(seed) -> str and "
                         f"step(action) -> StepResult): {why}")
    cls(**options)  # the constructor's own checks of the options
    max_new = getattr(cls, "max_new_tokens", 64)
    stop = getattr(cls, "stop", ())
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ValueError(f"{name}.max_new_tokens must be an int >= 1, got {max_new!r}")
    if isinstance(stop, str) or not all(isinstance(s, str) for s in stop):
        raise ValueError(f"{name}.stop must be a tuple of strings, got {stop!r}")
    return max_new, tuple(stop)


@functools.lru_cache(maxsize=32)
def _described(target: tuple, options: tuple, _mtime_ns: int, spec: str) -> tuple[int, tuple[str, ...]]:
    try:
        return _SANDBOX.call(_describe, (target, parse_options(options, f"env {spec!r}")),
                             timeout_s=STARTUP_TIMEOUT_S)
    except UserCodeError as e:
        msg = str(e).removeprefix("ValueError: ")
        raise ValueError(f"env {spec!r}: {msg}") from None


def _reset(env, seed: int):
    """(runs in the helper) reset, plus the optional attributes read after it."""
    return env.reset(seed), getattr(env, "context", None), getattr(env, "tool_schemas", None)


def _step(env, action: str):
    return env.step(action)


def _check_step(value) -> StepResult:
    if not isinstance(value, StepResult):
        raise UserCodeError(f"step returned {type(value).__name__}, not a StepResult")
    if not isinstance(value.observation, str):
        raise UserCodeError(f"step's observation is a {type(value.observation).__name__}, not a str")
    if isinstance(value.reward, bool) or not isinstance(value.reward, (int, float)) or not math.isfinite(value.reward):
        raise UserCodeError(f"step's reward is {value.reward!r}, not a finite number")
    if not isinstance(value.done, bool):
        raise UserCodeError(f"step's done is {value.done!r}, not a bool")
    if value.outcome not in ("", *OUTCOMES):
        raise UserCodeError(f"step's outcome {value.outcome!r} unknown; valid: '', {', '.join(OUTCOMES)}")
    if value.role not in ("user", "tool"):
        raise UserCodeError(f"step's role {value.role!r} unknown; valid: user, tool")
    return value


class UserEnv:
    """One episode of a user's environment class, held in this rank's env helper process."""

    def __init__(self, spec: str, *, options: tuple[str, ...] = (), env_timeout_s: float = 10.0):
        self.spec = spec
        self.target = user_target(spec)
        mtime = Path(self.target[1]).stat().st_mtime_ns if self.target[0] == "file" else 0
        self.kwargs = parse_options(tuple(options), f"env {spec!r}")
        self.max_new_tokens, self.stop = _described(self.target, tuple(options), mtime, spec)
        self.timeout_s = env_timeout_s
        self.key = f"{os.getpid()}-{next(_KEYS)}"
        self.generation = -1  # the helper generation holding our instance; -1: none yet
        self.seed: int | None = None
        self.actions: list[str] = []
        self.last_observation = ""
        self.error = ""  # set once a call failed: the episode is over
        self.context = None
        self.tool_schemas = None
        weakref.finalize(self, _DROPS.append, self.key)

    # ---- the protocol ----------------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self.seed, self.actions, self.error = seed, [], ""
        try:
            self._build()
            obs, self.context, self.tool_schemas = self._call(_reset, seed)
            if not isinstance(obs, str):
                raise UserCodeError(f"reset returned {type(obs).__name__}, not a str")
        except UserCodeError as e:
            self._fail(f"reset: {e}")
            return "error\n"  # the first step ends the episode as env_error
        self.last_observation = obs
        return obs

    def step(self, action: str) -> StepResult:
        if self.error:
            return self._error_result()
        try:
            if self.generation != _SANDBOX.ensure_started():
                self._replay()
            res = _check_step(self._call(_step, action))
        except UserCodeError as e:
            self._fail(f"step: {e}")
            return self._error_result()
        self.actions.append(action)
        self.last_observation = res.observation
        return res

    # ---- the helper side -------------------------------------------------------------------
    def _drops(self) -> tuple[str, ...]:
        out = []
        while _DROPS:
            out.append(_DROPS.popleft())
        return tuple(out)

    def _build(self) -> None:
        gen = _SANDBOX.ensure_started()
        _SANDBOX.call(hold, (self.key, self.target, (), self.kwargs, self._drops()), timeout_s=self.timeout_s)
        self.generation = gen

    def _call(self, fn, *args):
        return _SANDBOX.call(apply_held, (self.key, fn, args, self._drops()), timeout_s=self.timeout_s)

    def _replay(self) -> None:
        """Rebuild this episode in a new helper: the same seed and actions."""
        self._build()
        obs, _, _ = self._call(_reset, self.seed)
        for a in self.actions:
            obs = _check_step(self._call(_step, a)).observation
        if obs != self.last_observation:
            raise UserCodeError("replayed after a helper restart, its observation differed (the class is "
                                "not deterministic given its seed)")

    def _fail(self, why: str) -> None:
        self.error = why.splitlines()[0][:200] if why else "failed"
        ENV_ERRORS[self.spec] = ENV_ERRORS.get(self.spec, 0) + 1
        if self.error not in _REPORTED and len(_REPORTED) < 8:  # each distinct failure once per process
            _REPORTED.add(self.error)
            print(f"earl run: env {self.spec} failed in an episode (seed {self.seed}): {self.error}; "
                  "it ends with reward 0, counted in env_error_rate", file=sys.stderr, flush=True)

    def _error_result(self) -> StepResult:
        return StepResult(observation="", reward=0.0, done=True, outcome="env_error",
                          info={"env_error": self.error})
