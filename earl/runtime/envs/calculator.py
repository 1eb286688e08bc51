"""A tool-use task: answer an arithmetic question, optionally calling a calculator tool first.

    q: 37*12+5           (first observation)
    -> "calc(37*12+5)"   tool call; observation "= 449"
    -> "ans 449"         final answer: reward 1 if right, 0 if wrong

Generated text is parsed by a small recursive-descent parser (numbers, + - * /, parentheses);
it is never evaluated as Python. Tool exceptions and timeouts become error observations.

    python -c "from earl.runtime.envs import make_env; e = make_env('calculator'); print(e.reset(3))"
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from earl.runtime.envs.base import StepResult

MAX_EXPR_CHARS = 64
MAX_DEPTH = 16
MAX_ABS = 1e12
_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="earl-tool")
_CALL = re.compile(r"^\s*([a-z_]+)\((.*)\)\s*$")
_ANSWER = re.compile(r"^\s*ans\s+(-?\d+(?:\.\d+)?)\s*$")


class ToolError(Exception):
    """A tool's own complaint about its input (becomes an error observation)."""


def calculate(expr: str) -> str:
    """Evaluate + - * / and parentheses over decimal numbers; raise ToolError on bad input."""
    if len(expr) > MAX_EXPR_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPR_CHARS} characters")
    tokens = re.findall(r"\d+(?:\.\d+)?|[-+*/()]|\S", expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def expression(depth: int) -> float:
        value = term(depth)
        while peek() in ("+", "-"):
            value = value + term(depth) if take() == "+" else value - term(depth)
        return value

    def term(depth: int) -> float:
        value = factor(depth)
        while peek() in ("*", "/"):
            op, rhs = take(), factor(depth)
            if op == "/" and rhs == 0:
                raise ToolError("division by zero")
            value = value * rhs if op == "*" else value / rhs
            if abs(value) > MAX_ABS:
                raise ToolError("overflow")
        return value

    def factor(depth: int) -> float:
        if depth > MAX_DEPTH:
            raise ToolError("nested too deeply")
        tok = peek()
        if tok is None:
            raise ToolError("unexpected end of expression")
        take()
        if tok == "-":
            return -factor(depth + 1)
        if tok == "(":
            value = expression(depth + 1)
            if peek() != ")":
                raise ToolError("missing ')'")
            take()
            return value
        if re.fullmatch(r"\d+(?:\.\d+)?", tok) and len(tok) <= 12:
            return float(tok)
        raise ToolError(f"unexpected {tok!r}")

    value = expression(0)
    if peek() is not None:
        raise ToolError(f"unexpected {peek()!r}")
    return format_number(value)


def format_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6f}".rstrip("0")


def run_tool(fn: Callable[[str], str], arg: str, timeout_s: float) -> tuple[str, bool]:
    """Call a tool on a worker thread; (result text, ok). Errors and timeouts are results too.
    A timed-out call keeps its worker thread until it returns (threads cannot be killed)."""
    future = _EXECUTOR.submit(fn, arg)
    try:
        return future.result(timeout=timeout_s), True
    except FutureTimeout:
        return f"error: tool timed out after {timeout_s:g}s", False
    except Exception as e:  # noqa: BLE001 - any tool failure becomes an observation
        return f"error: {e}"[:80], False


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
        if (m := _CALL.match(line)) and m.group(1) in self.tools:
            self.tool_calls += 1
            t0 = time.perf_counter()
            text, ok = run_tool(self.tools[m.group(1)], m.group(2), self.tool_timeout_s)
            info = {"tool_calls": self.tool_calls, "tool_s": time.perf_counter() - t0}
            obs = f"= {text}\n" if ok else f"{text}\n"
            if last:
                return StepResult(observation=obs, reward=0.0, done=True, outcome="truncated", info=info)
            return StepResult(observation=obs, reward=0.0, done=False, info=info)
        obs = f"error: expected {' or '.join(f'{t}(...)' for t in self.tools)} or ans <number>\n"
        return StepResult(observation=obs, reward=0.0, done=last, invalid=True,
                          outcome="truncated" if last else "")
