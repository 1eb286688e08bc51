"""A tool-use task: answer an arithmetic question, optionally calling a calculator tool first.

    q: 37*12+5           (first observation)
    -> "calc(37*12+5)"   tool call; observation "= 449"
    -> "ans 449"         final answer: reward 1 if right, 0 if wrong

Chat models call the registry's calculator tool in the standard format instead (its schema is
handed to the chat template; the result comes back as a `tool` message):

    -> <tool_call>{"name": "calculator", "arguments": {"expression": "37*12+5"}}</tool_call>

Generated text is parsed by a small recursive-descent parser (numbers, + - * /, parentheses);
it is never evaluated as Python. Tool exceptions and timeouts become error observations.

    python -c "from earl.runtime.envs import make_env; e = make_env('calculator'); print(e.reset(3))"
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable

from earl.runtime.envs.base import StepResult
from earl.runtime.envs.tools import TOOLS, ToolError, calculate, parse_tool_calls, run_tool, run_tool_calls

__all__ = ["Calculator", "ToolError", "calculate"]

_CALL = re.compile(r"^\s*([a-z_]+)\((.*)\)\s*$")
_ANSWER = re.compile(r"^\s*ans\s+(-?\d+(?:\.\d+)?)\s*$")


class Calculator:
    """Questions `a op b op c` with small integers; tools: `calc(expr)`; answer: `ans N`."""

    max_new_tokens = 24
    stop = ("\n",)

    def __init__(self, *, max_turns: int = 4, tool_timeout_s: float = 1.0,
                 tools: dict[str, Callable[[str], str]] | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.tool_timeout_s = tool_timeout_s
        self.tools = dict(tools) if tools is not None else {"calc": calculate}
        self.answer = ""
        self.turn = 0
        self.tool_calls = 0
        self.registry = {"calculator": TOOLS["calculator"]}
        self.tool_schemas = [t.schema() for t in self.registry.values()]

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        question = f"{a}{op1}{b}{op2}{c}"
        self.answer = calculate(question)
        self.turn = 0
        self.tool_calls = 0
        return f"q: {question}\n"

    def step(self, action: str) -> StepResult:
        self.turn += 1
        line = action.split("\n", 1)[0].strip().lower()
        last = self.turn >= self.max_turns
        if m := _ANSWER.match(line):
            right = calculate(m.group(1)) == self.answer
            return StepResult(observation="correct\n" if right else "wrong\n", done=True,
                              reward=1.0 if right else 0.0, outcome="correct" if right else "wrong",
                              info={"tool_calls": self.tool_calls})
        if calls := parse_tool_calls(action):
            self.tool_calls += len(calls)
            t0 = time.perf_counter()
            results = run_tool_calls(calls, self.registry, self.tool_timeout_s)
            info = {"tool_calls": self.tool_calls, "tool_s": time.perf_counter() - t0}
            return StepResult(observation="\n".join(results), reward=0.0, done=last, role="tool",
                              invalid=any(r.startswith("error:") for r in results),
                              outcome="truncated" if last else "", info=info)
        if (m := _CALL.match(line)) and m.group(1) in self.tools:
            self.tool_calls += 1
            t0 = time.perf_counter()
            text, ok = run_tool(self.tools[m.group(1)], (m.group(2),), timeout_s=self.tool_timeout_s)
            info = {"tool_calls": self.tool_calls, "tool_s": time.perf_counter() - t0}
            obs = f"= {text}\n" if ok else f"{text}\n"
            if last:
                return StepResult(observation=obs, reward=0.0, done=True, outcome="truncated", info=info)
            return StepResult(observation=obs, reward=0.0, done=False, info=info)
        obs = f"error: expected {' or '.join(f'{t}(...)' for t in self.tools)} or ans <number>\n"
        return StepResult(observation=obs, reward=0.0, done=last, invalid=True,
                          outcome="truncated" if last else "")
