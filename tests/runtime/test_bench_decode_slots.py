"""benchmarks/bench_decode_slots.py: both cache reads run the real rollout and sample the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/bench_decode_slots.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_the_range_view_and_the_gather_sample_the_same_tokens():
    r = _run("--model", "tiny", "--rounds", "1", "--groups", "2")
    assert r.returncode == 0, r.stderr
    assert "same tokens and log-probs: yes" in r.stdout
    ranged = next(line for line in r.stdout.splitlines() if line.startswith("range as a view")).split()
    gathered = next(line for line in r.stdout.splitlines() if line.startswith("gathered copy")).split()
    assert int(ranged[-2]) > 0 and int(gathered[-2]) == 0  # decode forwards by the range: some, then none


def test_bad_arguments_are_one_line_and_exit_2():
    for args, what in ((("--model", "nope"), "--model nope"), (("--rounds", "0"), "--rounds")):
        r = _run(*args)
        assert r.returncode == 2 and what in r.stderr.splitlines()[-1] and "Traceback" not in r.stderr
