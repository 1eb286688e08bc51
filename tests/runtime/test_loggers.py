"""TensorBoard and Weights & Biases for real: `earl run --nproc 2 --set wandb=true` writes one
TensorBoard event file and one offline wandb run (rank 0 only), and both hold the metrics.jsonl /
metrics.csv values per step; on --resume TensorBoard drops the steps after the checkpoint, as the
CSV does, and a run that stopped on an exception is a crashed wandb run. Skipped only where
tensorboard or wandb is not installed; wandb never leaves the machine (offline is the default the
recorder sets; the tests point wandb's server at a closed port).

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_loggers.py -q
"""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from earl.runtime.metrics import read_metrics  # noqa: E402

SMALL = ["--set", "groups=2", "--set", "group_size=4", "--set", "plots=false", "--quiet"]


def scalars(tb_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every TensorBoard event file in `tb_dir`."""
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert len({e.step for e in events}) == len(events), f"{tag}: a step logged twice"
        out[tag] = {e.step: e.value for e in events}
    return out


def wandb_records(path: Path):
    """The protobuf records of a wandb transaction log (run-<id>.wandb): LevelDB's log format,
    32 KiB blocks of checksummed chunks, after a 7-byte `:W&B` header (wandb-core writes it; the
    Python reader wandb once shipped is gone)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), "not a wandb transaction log"
    pos, record = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # the zero padding that ends a block
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad checksum at byte {pos}"
        pos += 7 + length
        record = chunk if kind in (1, 2) else record + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(record)
            yield rec


def wandb_history(path: Path) -> dict[int, dict]:
    """{step: {key: value}} of the metrics a run logged (wandb's own `_step`, `_runtime`... left out)."""
    out = {}
    for rec in wandb_records(path):
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            out[rec.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


def logged(row: dict) -> dict:
    """The values of a metrics row the recorder sends to TensorBoard and wandb."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


def wandb_env(tmp_path: Path) -> dict:
    """wandb offline, quiet, its folders in `tmp_path`, its server a closed port."""
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_BASE_URL": "http://127.0.0.1:9",
            **{f"WANDB_{d}_DIR": str(tmp_path / f"wandb-{d.lower()}") for d in ("CONFIG", "CACHE", "DATA")}}


def exit_code(log: Path) -> int:
    return next(rec.exit.exit_code for rec in wandb_records(log) if rec.WhichOneof("record_type") == "exit")


@pytest.mark.dist
def test_nproc2_rank0_logs_tensorboard_and_wandb_offline(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update({**wandb_env(tmp_path), "OMP_NUM_THREADS": "1"})
    del env["WANDB_MODE"]  # offline is the recorder's default
    r = subprocess.run([sys.executable, "-m", "earl.cli", "run", "--nproc", "2", "--steps", "2", *SMALL,
                        "--set", "wandb=true", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(out)
    assert [row["step"] for row in rows] == [1, 2] and rows[0]["world"] == 2
    csv_rows = list(csv.DictReader((out / "metrics.csv").open()))

    # TensorBoard: one event file (rank 0's), every numeric metric at every step
    assert len(list(out.rglob("events.out.tfevents.*"))) == 1
    tb = scalars(out / "tensorboard")
    assert set(tb) == {k for row in rows for k in logged(row)}
    for row, line in zip(rows, csv_rows, strict=True):
        for k, v in logged(row).items():
            assert tb[k][row["step"]] == pytest.approx(v, rel=1e-6, abs=1e-30), k  # float32
        for k in ("reward_mean", "loss", "tokens", "context_mean"):
            assert tb[k][row["step"]] == pytest.approx(float(line[k]), rel=1e-6), k

    # wandb: one offline run (rank 0's) in <out>/wandb, the same values at the same steps
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and not list((out / "wandb").glob("run-*")), "a run that went online"
    logs = list(runs[0].glob("run-*.wandb"))
    assert len(logs) == 1 and len(list(out.rglob("*.wandb"))) == 1
    history = wandb_history(logs[0])
    assert sorted(history) == [1, 2]
    for row, line in zip(rows, csv_rows, strict=True):
        assert history[row["step"]] == logged(row)
        assert history[row["step"]]["reward_mean"] == float(line["reward_mean"])
    config = next(rec.run.config for rec in wandb_records(logs[0]) if rec.WhichOneof("record_type") == "run")
    assert json.loads({u.key: u.value_json for u in config.update}["steps"]) == 2


def test_crash_and_resume_tensorboard_and_wandb(tmp_path, monkeypatch):
    """A run that dies at step 4 after logging step 3 (checkpoint at 2) resumes at 3: TensorBoard,
    like metrics.csv, then holds each step once, with the resumed run's values; wandb marks the
    first run crashed (exit code 1) and the resumed one, a second offline run, finished."""
    import earl.runtime.run as run_mod
    from earl.runtime.resolve import resolve_config
    from earl.runtime.run import run_training

    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(k)
    for k, v in wandb_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    cfg = resolve_config(overrides={"groups": 2, "group_size": 4, "checkpoint_every": 2, "plots": "false",
                                    "threads": 1, "steps": 4, "wandb": "true"})
    out = tmp_path / "run"
    real_step = run_mod.run_step

    def dies_at_4(worker, ctx, step, prev):
        if step == 4:
            raise RuntimeError("killed at step 4")
        return real_step(worker, ctx, step, prev)

    monkeypatch.setattr(run_mod, "run_step", dies_at_4)
    with pytest.raises(RuntimeError, match="killed at step 4"):
        run_training(cfg, out, progress=False, echo=lambda s: None)
    assert sorted(scalars(out / "tensorboard")["reward_mean"]) == [1, 2, 3]
    (crashed,) = out.glob("wandb/offline-run-*/run-*.wandb")
    assert sorted(wandb_history(crashed)) == [1, 2, 3] and exit_code(crashed) == 1

    monkeypatch.setattr(run_mod, "run_step", real_step)
    res = run_training(resolve_config(resume=out), out, resume=out, progress=False, echo=lambda s: None)
    assert res.first_step == 3
    rows = read_metrics(out)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    tb = scalars(out / "tensorboard")
    for row in rows:
        for k, v in logged(row).items():
            assert tb[k][row["step"]] == pytest.approx(v, rel=1e-6, abs=1e-30), (k, row["step"])
    (resumed,) = set(out.glob("wandb/offline-run-*/run-*.wandb")) - {crashed}
    history = wandb_history(resumed)
    assert sorted(history) == [3, 4] and exit_code(resumed) == 0
    assert [history[row["step"]] for row in rows[2:]] == [logged(row) for row in rows[2:]]
