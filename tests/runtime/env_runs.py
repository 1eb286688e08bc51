"""Helpers for tests that run `earl run` on an environment and read its metrics rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def rows_of(out: Path) -> list[dict]:
    """The metrics rows a run wrote to `out/metrics.jsonl`."""
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def assert_one_and_two_processes_agree(tmp_path: Path, args: list[str], keys: tuple[str, ...]) -> None:
    """`earl run ARGS --steps 2` on 1 and on 2 processes: the same episodes (equal `keys` per step)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = []
    for n in (1, 2):
        out = tmp_path / f"n{n}"
        r = subprocess.run([sys.executable, "-m", "earl.cli", "run", *args, "--steps", "2", "--nproc", str(n),
                            "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(rows_of(out))
    one, two = outs
    assert [x["world"] for x in two] == [2, 2]
    for a, b in zip(one, two, strict=True):
        for k in keys:
            assert a[k] == b[k], (k, a[k], b[k])
