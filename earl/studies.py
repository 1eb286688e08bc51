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


def _run_study(job: tuple) -> tuple[int, str]:
    """Run one study script: (exit code, its output when `capture`, else "")."""
    cmd, capture = job
    if not capture:
        return subprocess.run(cmd, check=False).returncode, ""
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def run_studies(name: str, *, out: str | None = None, quick: bool = False, jobs: str | None = None,
                echo: Callable[[str], None] = print) -> list[str]:
    """Run the study (or `all`), each in its own process; the stems of those that failed.
    Without `out` a study writes to runs/study-<time>: the committed figures change only when
    `--out docs/figures` asks for them, and never with `--quick`. `jobs` (N, "ray", default the
    core count): several studies run side by side, each serially; one study runs its own
    variants in parallel."""
    from earl.outputs import probe_writable
    from earl.sim.sweep import parse_jobs, require_ray, run_jobs

    n_jobs = parse_jobs(jobs)
    if n_jobs == "ray":
        require_ray()
    paths = resolve_study(name, study_scripts())
    figures = (paths[0].parent.parent / "docs" / "figures").resolve()
    if out is None:
        out = str(Path("runs") / time.strftime("study-%Y%m%d-%H%M%S"))
    elif quick and Path(out).resolve() == figures:
        raise ValueError(f"--quick writes reduced figures and never replaces the full ones in {out}; "
                         "choose another --out")
    probe_writable(out)
    # absolute: a Ray task runs in its worker's folder (where the Ray instance started), not here
    out = str(Path(out).resolve())
    inner = n_jobs if len(paths) == 1 else 1
    cmds = [[sys.executable, str(path), "--out", out] + (["--quick"] if quick else []) + ["--jobs", str(inner)]
            for path in paths]
    failed: list[str] = []
    if n_jobs == 1 or len(paths) == 1:
        for path, cmd in zip(paths, cmds, strict=True):
            echo(f"$ {' '.join(cmd)}")
            if _run_study((cmd, False))[0] != 0:
                failed.append(path.stem)
        return failed

    def done(i: int, result: tuple) -> None:
        echo(f"$ {' '.join(cmds[i])}")
        sys.stdout.write(result[1])
        sys.stdout.flush()
        if result[0] != 0:
            failed.append(paths[i].stem)

    run_jobs(_run_study, [(cmd, True) for cmd in cmds], n_jobs, done=done)
    return failed
