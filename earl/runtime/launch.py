"""`earl run --nproc N`: start N local processes under torchrun running earl.runtime.dist_loop.

    python -c "from earl.runtime.launch import launch; launch(2, ['--out', 'runs/d', '--set', 'steps=2'])"

Multi-node: run torchrun yourself on every node with the same arguments:
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint HOST:PORT -m earl.runtime.dist_loop --out DIR
"""

from __future__ import annotations

import os
import subprocess
import sys


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"--nproc must be an integer >= 2 for a multi-process run, got {nproc!r} "
                         "(leave it out for one process)")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--max-restarts=0", "-m", "earl.runtime.dist_loop", *argv]


def launch(nproc: int, argv: list[str], *, env: dict | None = None) -> int:
    """Check the arguments here (ValueError: a one-line user error, nothing started), then run
    torchrun locally and wait; returns its exit code (0 ok, 2 bad input, else a failure).

    `argv` are `earl run`'s arguments without --nproc: [CONFIG] --env --model --steps --out
    --resume --set, plus --rollout-plan --train-plan --experience-plan --memory-budget-mb
    --schedule. When a rank dies, torchrun stops the others; the survivors print which peer was
    lost and where the last complete checkpoint is, and this prints a one-line summary."""
    from earl.runtime.dist_loop import check_launch

    cmd = torchrun_command(nproc, check_launch(nproc, list(argv)))
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, env=run_env, check=False)
    if proc.returncode not in (0, 2):
        print(f"earl run: the {nproc}-process run failed (torchrun exit code {proc.returncode}); "
              "see the messages above. Continue from the last complete checkpoint with --resume OUT.",
              file=sys.stderr, flush=True)
    return proc.returncode
