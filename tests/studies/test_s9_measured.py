"""Study s9's measured rows: benchmarks/bench_async.py's output lines parsed into the table the
study writes next to its simulated variants (s9_async_measured.csv).

    OMP_NUM_THREADS=1 python -m pytest -q tests/studies/test_s9_measured.py
"""

from __future__ import annotations

import sys
from pathlib import Path

STUDIES = Path(__file__).resolve().parents[2] / "studies"

LINES = """bench_async: calculator, 8 groups x 1, steps 2-6 scored; simulated with cpu-measured
--nproc 2 sync                        403.3                         (simulated 2674.6 tok/s, host stretch x1)
--nproc 2 async K=1                   605.1   1.50   1.41     0.94        1.00  1.00    1   1  rollout 1 / train 1
    rollout pool: rollout s/step             measured   0.8874  simulated   0.1445
--nproc 4 async K=2 partial           727.6   1.80   1.41     0.78        0.83  1.00    1   2  rollout 3 / train 1
bench_async: calculator, 16 groups x 1, steps 2-8 scored; --both sampling.max_new_tokens=4; x
--nproc 2 async K=2                   863.6   1.90   1.47     0.78        1.86  1.00    2   1  rollout 1 / train 1
"""


def test_measured_rows_parse_the_bench_output(tmp_path):
    sys.path.insert(0, str(STUDIES))
    try:
        from s9_async import BENCH_TXT, measured_rows
    finally:
        sys.path.remove(str(STUDIES))
    (tmp_path / "bench.txt").write_text(LINES)
    df = measured_rows(tmp_path / "bench.txt")
    assert len(df) == 3
    first, second = df.iloc[0], df.iloc[1]
    assert list(df["workload"]) == ["calculator, 8 groups x 1, steps 2-6 scored; simulated with cpu-measured"] * 2 + [
        "calculator, 16 groups x 1, steps 2-8 scored; --both sampling.max_new_tokens=4"]  # each row's call
    assert (first["nproc"], first["max staleness"], bool(first["partial rollout"])) == (2, 1, False)
    assert (first["measured vs sync"], first["simulated vs sync"], first["simulated / measured"]) == (1.5, 1.41, 0.94)
    assert (second["nproc"], second["max staleness"], bool(second["partial rollout"])) == (4, 2, True)
    assert (second["staleness mean"], second["simulated staleness max"], second["rollout pool"]) == (0.83, 2, 3)
    assert measured_rows(tmp_path / "absent.txt").empty
    assert BENCH_TXT.parts[-3:] == ("docs", "cpu", "bench_async.txt")
