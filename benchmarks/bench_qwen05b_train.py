"""A Qwen2.5-0.5B-shaped model (random weights) under `earl run` on CPU: peak memory per rank and
seconds per step, one process and two, before and after the FSDP2 / bf16-master / chunked
log-prob work, same configuration, side by side.

The model folder is built once by earl.calibrate.host.random_checkpoint (bf16 safetensors,
the built-in character tokenizer). "before" is an older revision exported with `git archive`
into a temporary folder (default 9b11102, the runtime before this work), "after" this tree.
Every run gets the same explicit settings (so the size-dependent defaults of the new tree do
not differ between them): bf16, lr 1e-6, 2 groups x 2 episodes, 8 new tokens per turn, a
512-token micro-batch budget, 2 steps; two processes train on tp1-dp2-zero (after: FSDP2).
Figures are the second step's (the first warms up); peak memory is the runtime's own
`peak_mem_bytes` (max over ranks of the peak RSS). A run that fails is reported with its error.

    OMP_NUM_THREADS=1 python benchmarks/bench_qwen05b_train.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ["model.dtype=bf16", "trainer.lr=1e-6", "groups=2", "group_size=2", "sampling.max_new_tokens=8",
        "trainer.token_budget=512", "plots=false", "checkpoint_every=0", "env.name=tic-tac-toe"]


def export(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def run(tree: Path, model: Path, out: Path, nproc: int, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "earl.cli", "run", "--model", str(model), "--out", str(out), "--steps",
            str(steps), "--nproc", str(nproc), "--quiet"]
    if nproc > 1:
        args += ["--train-plan", f"tp1-dp{nproc}-zero"]
    for s in SETS:
        args += ["--set", s]
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=str(tree), timeout=1800)
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    if r.returncode or len(rows) < steps:
        lines = [x for x in r.stderr.splitlines() if x.strip() and "Warning" not in x and "warn" not in x]
        why = next((x for x in lines if "Error" in x or "error" in x), lines[-1] if lines else "?")
        return {"error": f"exit {r.returncode}: {why.strip()[:160]}", "rows": rows}
    last = rows[-1]
    return {"step_s": last["step_s"], "peak": last["peak_mem_bytes"], "loss": last["loss"], "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="9b11102", help="git revision before the change")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--model-dir", default=None, help="where to keep the random model (default: a temp folder)")
    a = ap.parse_args()
    from earl.calibrate.host import random_checkpoint

    with tempfile.TemporaryDirectory(prefix="earl-bench-05b-") as tmp:
        model = random_checkpoint("qwen2.5-0.5b", Path(a.model_dir or Path(tmp) / "qwen05b"), "bf16")
        trees = {"before": export(a.old, Path(tmp) / "old"), "after": ROOT}
        print(f"Qwen2.5-0.5B-shaped, random weights, CPU; settings: {' '.join(SETS)}; {a.steps} steps, "
              f"figures of the last step")
        for nproc in a.nproc:
            got = {}
            for name, tree in trees.items():
                got[name] = run(tree, model, Path(tmp) / f"{name}-{nproc}", nproc, a.steps)
                g = got[name]
                text = g["error"] if "error" in g else \
                    f"{g['step_s']:7.1f} s/step  peak {g['peak'] / 2**30:6.2f} GiB  loss {g['loss']:+.5f}"
                print(f"  {nproc} process{'es' if nproc > 1 else '  '}  {name:6s}  {text}", flush=True)
            b, f = got["before"], got["after"]
            if "error" not in b and "error" not in f:
                print(f"  {nproc} process{'es' if nproc > 1 else '  '}  after/before: time "
                      f"{f['step_s'] / b['step_s']:.2f}x, peak memory {f['peak'] / b['peak']:.2f}x")


if __name__ == "__main__":
    main()
