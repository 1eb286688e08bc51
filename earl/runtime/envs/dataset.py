"""Prompt datasets scored by the user's reward function (`--env jsonl:PATH --reward FILE.py:FUNC`).

Each row of a JSONL file (or a Parquet file, read with pandas) is one sample: `prompt` (text)
or `messages` (a chat list), plus any fields the reward function wants. An episode is one
sample, single-turn or multi-turn with `env.tools`, scored by

    def FUNC(sample: dict, messages: list[dict]) -> float

in a helper process (earl.runtime.sandbox) bounded by `env.reward_timeout_s`; a call that fails
gives reward 0 and outcome `reward_error`, and a step whose `reward_error_rate` reaches
`env.max_reward_error_rate` stops the run. The rules in full: docs/runtime.md, "Design notes".

    earl run --env jsonl:prompts.jsonl --reward reward.py:score --steps 2
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

from earl.runtime.envs.base import StepResult
from earl.runtime.envs.tools import parse_tool_calls, run_tool_calls, tool_registry
from earl.runtime.sandbox import UserCodeError, call_user, load_file_function

DATASET_SUFFIXES = (".jsonl", ".parquet")


def _check_row(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if isinstance(row.get("prompt"), str):
        return row
    msgs = row.get("messages")
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                               and isinstance(m.get("content"), str) for m in msgs):
        return row
    raise ValueError(f"{where}: a row needs 'prompt' (text) or 'messages' (a list of "
                     f"{{\"role\", \"content\"}}); its keys: {', '.join(map(str, row)) or 'none'}")


@functools.lru_cache(maxsize=8)
def _load_rows(path: str, _mtime_ns: int) -> tuple[dict, ...]:
    p = Path(path)
    if p.suffix == ".parquet":
        try:
            import pandas as pd
            frame = pd.read_parquet(p)
        except ImportError as e:
            raise ValueError(f"reading {p} needs pandas with a Parquet engine (pip install pandas pyarrow): "
                             f"{e}") from None
        rows = []
        for k, rec in enumerate(frame.to_dict(orient="records")):
            if hasattr(rec.get("messages"), "tolist"):
                rec["messages"] = [dict(m) for m in rec["messages"].tolist()]  # arrow lists -> python
            rows.append(_check_row(rec, f"{p} row {k + 1}"))
    else:
        rows = []
        with p.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
                rows.append(_check_row(row, f"{p}:{n}"))
    if not rows:
        raise ValueError(f"{p} holds no rows")
    return tuple(rows)


def load_dataset(path: str | Path) -> tuple[dict, ...]:
    """The rows of a JSONL or Parquet prompt file (read once per process while unchanged)."""
    p = Path(path)
    if p.suffix not in DATASET_SUFFIXES:
        raise ValueError(f"prompt dataset {str(p)!r}: expected a {' or '.join(DATASET_SUFFIXES)} file")
    if not p.is_file():
        raise ValueError(f"prompt dataset {str(p)!r} not found")
    return _load_rows(str(p.resolve()), p.stat().st_mtime_ns)


def load_reward(ref: str) -> tuple[str, str, str]:
    """`FILE.py:FUNC` -> its sandbox target ("file", PATH, FUNC), after importing it here once
    (a one-line error for a missing file or function)."""
    file, sep, func = ref.rpartition(":")
    if not sep or not file or not func:
        raise ValueError(f"reward {ref!r}: expected FILE.py:FUNC (e.g. reward.py:score)")
    p = Path(file)
    if not p.is_file():
        raise ValueError(f"reward file {file!r} not found")
    try:
        load_file_function(p, func)
    except ValueError as e:
        raise ValueError(f"reward {e}") from None
    return ("file", str(p.resolve()), func)


class PromptDataset:
    """One sample per episode, picked by the episode's seed; scored by the reward function."""

    max_new_tokens = 64
    stop: tuple[str, ...] = ()  # the tokenizer's end of turn (EOS) ends a reply

    def __init__(self, path: str, *, reward: str = "", tools: tuple[str, ...] = (), max_turns: int = 4,
                 tool_timeout_s: float = 1.0, reward_timeout_s: float = 5.0):
        if not reward:
            raise ValueError(f"env jsonl:{path} needs a reward function: --reward FILE.py:FUNC "
                             "(or env.reward in the config)")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.rows = load_dataset(path)
        self.reward = reward
        self.score = load_reward(reward)
        self.reward_timeout_s = reward_timeout_s
        self.registry = tool_registry(tools)
        self.tool_schemas = [t.schema() for t in self.registry.values()]
        self.max_turns = max_turns if self.registry else 1
        self.tool_timeout_s = tool_timeout_s
        self.sample: dict = {}
        self.context: list[dict] = []
        self.messages: list[dict] = []
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.sample = self.rows[seed % len(self.rows)]
        msgs = self.sample.get("messages")
        if isinstance(msgs, list):
            self.context, prompt = [dict(m) for m in msgs[:-1]], msgs[-1]["content"]
        else:
            sys_msg = self.sample.get("system")
            self.context = [{"role": "system", "content": sys_msg}] if isinstance(sys_msg, str) else []
            prompt = self.sample["prompt"]
        self.messages = [*self.context, {"role": "user", "content": prompt}]
        self.turn = 0
        return prompt

    def step(self, action: str) -> StepResult:
        self.turn += 1
        calls = parse_tool_calls(action) if self.registry else []
        reply = {"role": "assistant", "content": action}
        if calls:
            reply["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
        self.messages.append(reply)
        if calls and self.turn < self.max_turns:
            t0 = time.perf_counter()
            results = run_tool_calls(calls, self.registry, self.tool_timeout_s)
            for r in results:
                self.messages.append({"role": "tool", "content": r})
            return StepResult(observation="\n".join(results), reward=0.0, done=False, role="tool",
                              invalid=any(r.startswith("error:") for r in results),  # counted in the metrics
                              info={"tool_s": time.perf_counter() - t0})
        return self._scored("truncated" if calls else "")

    def _scored(self, outcome: str) -> StepResult:
        try:
            value = call_user(self.score, (self.sample, [dict(m) for m in self.messages]),
                              timeout_s=self.reward_timeout_s)
            try:
                reward = float(value)
            except (TypeError, ValueError):
                raise UserCodeError(f"returned {value!r}, not a number") from None
            if not math.isfinite(reward):
                raise UserCodeError(f"returned {value!r}")
        except UserCodeError as e:  # the user's function failing gives reward 0 (step.py may stop the run)
            why = str(e).splitlines()[0][:200] if str(e) else "failed"
            LAST_REWARD_ERROR[self.reward] = why  # earl.runtime.step reports it once the step's rate is known
            return StepResult(observation="", reward=0.0, done=True, outcome="reward_error",
                              info={"reward_error": why})
        return StepResult(observation="", reward=reward, done=True,
                          outcome=outcome or ("correct" if reward > 0 else "wrong"))


LAST_REWARD_ERROR: dict[str, str] = {}  # reward FILE:FUNC -> its last failure on this process
