"""metrics.csv as the recorder writes it, step by step: the same file a one-shot encoding of
all rows gives, when later rows bring new columns or leave values out, and after a resume."""

from __future__ import annotations

import csv
import io

from earl.runtime.metrics import CsvRows, RunRecorder


def _parse(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_incremental_csv_matches_one_shot():
    rows = [{"step": 1, "reward": 0.5}, {"step": 2, "reward": None}, {"step": 3, "reward": 1.0, "loss": 0.2},
            {"step": 4, "loss": 0.1, "note": "a,b"}]
    inc = CsvRows()
    texts = [inc.text(rows[:i]) for i in range(1, len(rows) + 1)]
    for i, t in enumerate(texts, start=1):
        assert t == CsvRows().text(rows[:i])
    got = _parse(texts[-1])
    assert list(got[0]) == ["step", "reward", "loss", "note"]
    assert [r["reward"] for r in got] == ["0.5", "", "1.0", ""] and got[3]["note"] == "a,b"
    assert inc.text(rows[:2]) == CsvRows().text(rows[:2])  # fewer rows (a resume): encoded afresh


def test_recorder_writes_csv_each_flush_and_on_resume(tmp_path):
    rec = RunRecorder(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        rec.log_step({"step": step, "reward_mean": step / 10, **({"extra": 7} if step == 3 else {})}, [], [])
        rec.flush(with_trace=False)
        got = _parse((tmp_path / "metrics.csv").read_text())
        assert [int(r["step"]) for r in got] == list(range(1, step + 1))
    assert got[0]["extra"] == "" and got[2]["extra"] == "7"
    again = RunRecorder(tmp_path, resume_step=2, tensorboard=False)
    again.log_step({"step": 3, "reward_mean": 0.9}, [], [])
    again.flush(with_trace=False)
    got = _parse((tmp_path / "metrics.csv").read_text())
    assert [(r["step"], r["reward_mean"]) for r in got] == [("1", "0.1"), ("2", "0.2"), ("3", "0.9")]
