"""The `earl` command line: simulate | run | calibrate | validate | plan | estimate | study.

    earl --help

Each command is a thin wrapper: it parses options into specs and calls into the package.
User mistakes (ValueError / TypeError / FileNotFoundError raised as ValueError) are printed as
one line and exit with code 2, without a traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="EARL: efficient agentic RL: cost model, policies, simulator, runtime.")
console = Console()
err_console = Console(stderr=True)


class UserError(ValueError):
    """A mistake in the user's input; printed in one line, exit code 2."""


def user_errors(fn):
    """Turn ValueError/TypeError into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            err_console.print(f"[bold red]error:[/] {msg}", markup=True, highlight=False)
            raise typer.Exit(code=2) from None

    return wrapper


def parse_sets(items: Optional[list[str]]) -> dict[str, str]:
    """`--set key=value` pairs into a dict (values stay strings; callers convert)."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# ============================================================================================
# estimate / plan  (earl/cost_model, earl/policies)
# ============================================================================================
# <estimate-plan>
# </estimate-plan>

# ============================================================================================
# simulate / study  (earl/sim, studies/)
# ============================================================================================
# <simulate>
# </simulate>

# ============================================================================================
# run  (earl/runtime)
# ============================================================================================
# <run>
# </run>

# ============================================================================================
# calibrate / validate
# ============================================================================================
# <calibrate>
# </calibrate>


def main() -> None:
    app(prog_name="earl")


if __name__ == "__main__":
    sys.exit(main())
