"""`earl run --nproc N`: start N local processes under torchrun, each running
`earl.runtime.run.worker_main` on the configuration the CLI resolved (written as JSON into the
run folder, so no command-line option is parsed twice).

    python -c "from earl.runtime.launch import launch; from earl.runtime.config import RunConfig; \
launch(RunConfig(nproc=2, steps=2), 'runs/d')"

Multi-node: write the resolved config once (`earl run --nproc N` leaves it in the run folder as
launch-config.json) and run torchrun yourself on every node:
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint HOST:PORT -m earl.runtime.run \
        --config DIR/launch-config.json --out DIR
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from earl.runtime.config import RunConfig, to_dict
from earl.runtime.run import LAUNCH_CONFIG, check_config
from earl.trace import atomic_write_text


def torchrun_command(nproc: int, config_file: Path, out: Path, resume: Path | None = None,
                     progress: bool = False) -> list[str]:
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"--nproc must be an integer >= 2 for a multi-process run, got {nproc!r} "
                         "(leave it out for one process)")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--max-restarts=0", "-m", "earl.runtime.run", "--config", str(config_file), "--out", str(out),
            *(["--resume", str(resume)] if resume is not None else []), *(["--progress"] if progress else [])]


def launch(cfg: RunConfig, out: str | Path, *, resume: str | Path | None = None, progress: bool = False,
           env: dict | None = None) -> int:
    """Check `cfg` here (ValueError: a one-line user error, nothing started), write it into the
    run folder, run torchrun locally and wait; returns its exit code (0 ok, 2 bad input, 3 a
    lost peer, 4 over the memory budget). When a rank dies, torchrun stops the others; the
    survivors print which peer was lost and where the last complete checkpoint is."""
    check_config(cfg, cfg.nproc)
    out = Path(out)
    if resume is None and (out / "checkpoints").is_dir():
        raise ValueError(f"{out} already holds a run; pass --resume {out} or another --out")
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / LAUNCH_CONFIG
    atomic_write_text(config_file, json.dumps(to_dict(dataclasses.replace(cfg)), indent=2))
    cmd = torchrun_command(cfg.nproc, config_file, out, Path(resume) if resume is not None else None, progress)
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, env=run_env, check=False)
    if proc.returncode not in (0, 2):
        print(f"earl run: the {cfg.nproc}-process run failed (torchrun exit code {proc.returncode}); "
              f"see the messages above. Continue from the last complete checkpoint with --resume {out}.",
              file=sys.stderr, flush=True)
    return proc.returncode
