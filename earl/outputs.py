"""Output paths, checked before any work starts: a mistake in `--out` costs nothing, and no
command deletes, truncates or overwrites what it did not write in this run.

- `check_out_dir`: a folder that is new or empty (or holds only the files named as this run's
  own), inside a writable folder; a file in its place, an unwritable parent (`/proc/...`, a
  read-only folder) or a non-empty folder is a one-line ValueError.
- `check_out_file`: a file that does not exist yet (or `force`), in a writable folder.

Writability is probed by creating and removing a temporary file in the nearest existing folder;
nothing else is created. Pure Python.

    python -c "from earl.outputs import check_out_dir; print(check_out_dir('runs/new'))"
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def probe_writable(path: str | Path, *, flag: str = "--out") -> None:
    """ValueError unless files can be created at `path` (a folder, existing or to be made)."""
    p = Path(path)
    base = _nearest_existing(p)
    if not base.is_dir():
        raise ValueError(f"{flag} {p}: {base} is a file where a folder is expected; choose another path")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".earl-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"{flag} {p} cannot be written ({base}: {e.strerror or e}); choose a writable "
                         "folder") from None


def check_out_dir(path: str | Path, *, flag: str = "--out", may_hold: tuple[str, ...] = (),
                  hint: str = "") -> Path:
    """`path` as a Path when it is a new or empty folder (entries in `may_hold` allowed) that can
    be written; else a ValueError naming it, what it holds and `hint` (e.g. "pass --resume")."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {p} is a file, not a folder; choose a new or empty folder")
    if p.is_dir():
        try:
            held = sorted(x.name for x in p.iterdir() if x.name not in may_hold)
        except OSError as e:
            raise ValueError(f"{flag} {p} cannot be read ({e.strerror or e})") from None
        if held:
            raise ValueError(f"{flag} {p} is not empty ({len(held)} entries, e.g. {held[0]!r}); nothing is "
                             f"overwritten: {hint or 'choose a new or empty folder'}")
    probe_writable(p, flag=flag)
    return p


def check_out_file(path: str | Path, *, flag: str = "--out", force: bool = False) -> Path:
    """`path` as a Path when no file is there (or `force`) and its folder can be written."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p} is a folder; name a file")
    if p.exists() and not force:
        raise ValueError(f"{flag} {p} already exists; pass --force to replace it, or choose another file")
    probe_writable(p.parent, flag=flag)
    return p


__all__ = ["check_out_dir", "check_out_file", "probe_writable"]
