"""`earl study`: find and run the evaluation scripts of a repository checkout (studies/s<N>_*.py).

earl never imports the scripts: each runs in its own Python process, as a person would run it.

    earl study --list
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def studies_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "studies"


def study_scripts() -> dict[str, Path]:
    """{stem: path} of every study script (studies/s<N>_<name>.py), in study order."""
    folder = studies_dir()
    if not folder.is_dir():
        raise ValueError(f"no studies folder at {folder}: `earl study` runs the scripts of a repository checkout")
    scripts = sorted(folder.glob("s[0-9]*_*.py"), key=lambda p: int(p.stem[1:].split("_")[0]))
    return {p.stem: p for p in scripts}


def resolve_study(name: str, scripts: dict) -> list[Path]:
    """`s2`, `2`, `data_volume`, `s2_data_volume` or `all` -> the scripts to run."""
    key = name.lower().replace("-", "_")
    if key == "all":
        return list(scripts.values())
    for stem, path in scripts.items():
        num, _, rest = stem.partition("_")
        if key in (stem, num, num[1:], rest):
            return [path]
    raise ValueError(f"unknown study {name!r}; valid: {', '.join(scripts)} (or s<N>, <N>, all)")


def study_summaries(width: int = 100) -> list[tuple[str, str]]:
    """(stem, first paragraph of its docstring, cut at `width`) per study."""
    out = []
    for stem, path in study_scripts().items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = " ".join(doc.split("\n\n")[0].split())
        out.append((stem, summary[:width] + ("..." if len(summary) > width else "")))
    return out


def run_studies(name: str, *, out: str | None = None, quick: bool = False,
                echo: Callable[[str], None] = print) -> list[str]:
    """Run the study (or `all`), each in its own process; the stems of those that failed."""
    scripts = resolve_study(name, study_scripts())
    figures = (scripts[0].parent.parent / "docs" / "figures").resolve()
    if out is None:  # the committed figures change only when asked for by name
        out = str(Path("runs") / time.strftime("study-%Y%m%d-%H%M%S"))
    elif quick and Path(out).resolve() == figures:
        raise ValueError(f"--quick writes reduced figures and never replaces the full ones in {out}; "
                         "choose another --out")
    from earl.outputs import probe_writable

    probe_writable(out)
    failed = []
    for path in scripts:
        cmd = [sys.executable, str(path)] + (["--out", out] if out else []) + (["--quick"] if quick else [])
        echo(f"$ {' '.join(cmd)}")
        if subprocess.run(cmd, check=False).returncode != 0:
            failed.append(path.stem)
    return failed
