"""Tools the model may call, in the standard Hermes / Qwen format, and the registry of them.

A tool is a Python function plus a JSON schema of its arguments; the schemas are handed to the
chat template (`tools=`), and the model calls a tool by writing

    <tool_call>{"name": "calculator", "arguments": {"expression": "37*12+5"}}</tool_call>

which `parse_tool_calls` reads with `json.loads` (never `eval`: nothing the model writes runs as
code). `run_tool_calls` runs each call in the rank's helper process (earl.runtime.sandbox) under
`env.tool_timeout_s`, killing it when a call overruns; malformed calls, unknown tools, bad
arguments, exceptions, crashes and timeouts all come back as result text for a `tool` message.
The calculator tool is a small recursive-descent parser (numbers, + - * /, parentheses).

    python -c "from earl.runtime.envs.tools import TOOLS; print(TOOLS['calculator'].schema())"
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from earl.runtime.sandbox import UserCodeError, call_user

MAX_EXPR_CHARS = 64
MAX_DEPTH = 16
MAX_ABS = 1e12


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


def run_tool(fn: Callable[..., object], args: tuple = (), kwargs: dict | None = None, *,
             timeout_s: float) -> tuple[str, bool]:
    """Call a tool bounded by `timeout_s` (earl.runtime.sandbox: in the rank's helper process,
    killed when it overruns; a closure on a thread); (result text, ok). Errors, crashes and
    timeouts are results too."""
    try:
        return str(call_user(fn, args, kwargs, timeout_s=timeout_s)), True
    except UserCodeError as e:
        text = str(e)
        if text.startswith("timed out"):
            return f"error: tool timed out after {timeout_s:g}s", False
        return f"error: {text.split(': ', 1)[-1] if ': ' in text else text}"[:80], False


MAX_CALLS_PER_TURN = 4  # tool calls run per reply; more become an error result
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@dataclass(frozen=True, kw_only=True)
class Tool:
    name: str  # what the model writes in "name"
    description: str  # shown to the model in the tools' JSON schema
    parameters: dict  # JSON schema of the "arguments" object
    # called with the arguments as keywords, its str() the result: a callable, or a user file's
    # function ("file", PATH, FUNC) (both run in the sandbox process; closures on a thread)
    fn: Callable[..., object] | tuple[str, str, str]

    def schema(self) -> dict:
        """The OpenAI-style function schema chat templates take."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def calculator_tool(expression) -> str:
    """The registry's calculator (module level, so it can be sent to the sandbox process)."""
    return calculate(str(expression))


TOOLS = {
    "calculator": Tool(name="calculator", description="Evaluate an arithmetic expression: decimal numbers, "
                       "+ - * / and parentheses.",
                       parameters={"type": "object", "properties": {"expression": {"type": "string"}},
                                   "required": ["expression"]},
                       fn=calculator_tool),
}


def tool_registry(names) -> dict[str, Tool]:
    """The registered tools named in `names` (an unknown name is a one-line error)."""
    from earl.specs import unknown_name_error

    for n in names:
        if n not in TOOLS:
            raise unknown_name_error("tool", n, TOOLS)
    return {n: TOOLS[n] for n in names}


@dataclass(frozen=True)
class ToolCall:
    name: str  # "" when the call could not be read
    arguments: dict
    error: str = ""  # why the call is malformed ("" if it is well formed)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>...</tool_call>` block of a reply (an unclosed last one included)."""
    calls = []
    for m in _TOOL_CALL.finditer(text):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", {}, f"error: tool call is not JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall("", {}, 'error: a tool call is {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(obj["name"], {}, "error: arguments must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls


def run_tool_calls(calls: list[ToolCall], tools: dict[str, Tool], timeout_s: float) -> list[str]:
    """One result text per call (at most MAX_CALLS_PER_TURN run); failures are results too."""
    out = []
    for k, c in enumerate(calls):
        if k >= MAX_CALLS_PER_TURN:
            out.append(f"error: at most {MAX_CALLS_PER_TURN} tool calls per turn")
        elif c.error:
            out.append(c.error)
        elif c.name not in tools:
            out.append(f"error: unknown tool {c.name!r}; tools: {', '.join(tools)}")
        else:
            props = tools[c.name].parameters.get("properties", {})
            extra = sorted(set(c.arguments) - set(props))
            missing = sorted(set(tools[c.name].parameters.get("required", ())) - set(c.arguments))
            if extra or missing:
                out.append(f"error: {c.name} takes {', '.join(props) or 'no arguments'}"
                           f"{'; unexpected ' + ', '.join(extra) if extra else ''}"
                           f"{'; missing ' + ', '.join(missing) if missing else ''}")
            else:
                out.append(run_tool(tools[c.name].fn, kwargs=c.arguments, timeout_s=timeout_s)[0])
    return out
