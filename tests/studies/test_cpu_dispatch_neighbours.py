"""studies/cpu_dispatch_neighbours.py runs its three neighbours on real gloo ranks and prints
one row per process count and round, with the executor's price of the same plan; bad arguments
exit 2 with one line.

    OMP_NUM_THREADS=1 python -m pytest -q tests/studies/test_cpu_dispatch_neighbours.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "studies/cpu_dispatch_neighbours.py"


def study(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)


def test_a_round_at_two_ranks_prints_every_neighbour_and_the_price():
    r = study("--procs", "2", "--repeats", "4", "--rounds", "1", "--after-ms", "1", "--skew-ms", "0.5")
    assert r.returncode == 0, r.stderr
    row = re.search(r"^\s+2\s+1 \|(.*)$", r.stdout, re.M)
    assert row, r.stdout
    cells = [float(x) for x in re.findall(r"(\d+\.\d+)", row[1])]
    # three medians with their quartiles, two ratios, the price: all positive
    assert len(cells) == 3 * 3 + 2 + 1 and min(cells) > 0
    assert "16 episodes, 4 calls per neighbour x 1 rounds, 1 ms after, skew up to 0.5 ms" in r.stdout


def test_bad_arguments_exit_2_naming_them():
    r = study("--procs", "1")
    assert r.returncode == 2
    assert "--procs >= 2" in r.stderr and "[1]" in r.stderr
    r = study("--hardware", "no-such-profile")
    assert r.returncode == 2 and "no-such-profile" in r.stderr and "Traceback" not in r.stderr
