"""`earl run --nproc N`: start N local processes under torchrun, each running `worker_main`
(one rank: earl.runtime.run.run_training) on the configuration the CLI resolved (written as JSON into the
run folder, so no command-line option is parsed twice).

    python -c "from earl.runtime.launch import launch; from earl.runtime.run_config import RunConfig; \
launch(RunConfig(nproc=2, steps=2), 'runs/d')"

Multi-node: write the resolved config once (`earl run --nproc N` leaves it in the run folder as
launch-config.json) and run torchrun yourself on every node:
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint HOST:PORT -m earl.runtime.launch \
        --config DIR/launch-config.json --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import torch.distributed as dist

from earl.runtime.checkpoint import find_checkpoint
from earl.runtime.console import preempted_message, summarize
from earl.runtime.dist import shutdown
from earl.runtime.resolve import LAUNCH_CONFIG, LAUNCH_LOG, check_config, check_out
from earl.runtime.run import PREEMPTED_EXIT, run_training
from earl.runtime.run_config import RunConfig, from_dict, to_dict
from earl.runtime.worker import MemoryBudgetExceeded
from earl.trace import atomic_write_text


def torchrun_command(nproc: int, config_file: Path, out: Path, resume: Path | None = None,
                     progress: bool = False) -> list[str]:
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"--nproc must be an integer >= 2 for a multi-process run, got {nproc!r} "
                         "(leave it out for one process)")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--max-restarts=0", "-m", "earl.runtime.launch", "--config", str(config_file), "--out", str(out),
            *(["--resume", str(resume)] if resume is not None else []), *(["--progress"] if progress else [])]


RANK_MESSAGE = re.compile(r"^(error: |earl run: |rank \d+: )")  # the ranks' one-line messages


def launch(cfg: RunConfig, out: str | Path, *, resume: str | Path | None = None, progress: bool = False,
           env: dict | None = None, stdout=None) -> int:
    """Check `cfg` and `out` here (ValueError: a one-line user error, nothing started), write the
    config into the run folder, run torchrun locally and wait; returns its exit code (0 ok, 2 bad
    input, 3 a lost peer, 4 over the memory budget, 130 interrupted, 143 stopped by SIGTERM after a
    checkpointed step). torchrun's and the ranks'
    stderr (tracebacks, warnings) go to <out>/launch.log; the terminal gets the ranks' one-line
    messages once each, then the last complete checkpoint and a resume command when one exists.
    `stdout`: where the ranks' standard output goes (None: this process's; `earl validate`
    passes subprocess.DEVNULL)."""
    check_config(cfg, cfg.nproc)
    out = check_out(out, resume)
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / LAUNCH_CONFIG
    atomic_write_text(config_file, json.dumps(to_dict(dataclasses.replace(cfg)), indent=2))
    cmd = torchrun_command(cfg.nproc, config_file, out, Path(resume) if resume is not None else None, progress)
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env["EARL_LAUNCHER"] = "1"  # the ranks leave the resume hint to this process
    log_path = out / LAUNCH_LOG
    terminated = []

    def forward(signum, frame):  # a scheduler's SIGTERM to this process reaches torchrun, which passes it on
        terminated.append(signum)
        proc.send_signal(signal.SIGTERM)

    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, env=run_env, stdout=stdout, stderr=log)
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, forward) if main_thread else None
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the terminal sent SIGINT to torchrun and the ranks as well
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _report(out, [], f"interrupted; the ranks' output is in {log_path}")
            return 130
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
    text = log_path.read_text(errors="replace")
    messages = list(dict.fromkeys(line.rstrip() for line in text.splitlines() if RANK_MESSAGE.match(line)))
    if code == 0:
        return 0
    stopped = [m for m in messages if "stopped by SIGTERM" in m]
    if stopped:  # every rank finished the step and rank 0 wrote its checkpoint
        print(stopped[0], file=sys.stderr, flush=True)
        return PREEMPTED_EXIT
    if terminated:
        _report(out, [], f"stopped by SIGTERM before a step finished; the ranks' output is in {log_path}")
        return PREEMPTED_EXIT
    if re.search(r"SignalException: Process \d+ got signal: (2|15)\b", text):  # Ctrl-C reached torchrun only
        _report(out, [], f"interrupted; the ranks' output is in {log_path}")
        return 130
    if any(m.startswith("error: ") for m in messages):
        code = 2
    elif any("lost contact" in m or " failed during " in m for m in messages):
        code = 3
    elif any("memory budget" in m for m in messages):
        code = 4
    _report(out, messages, f"the {cfg.nproc}-process run failed (exit code {code}; details in {log_path})")
    return code


def _report(out: Path, messages: list[str], what: str) -> None:
    """The ranks' messages, then one line with what happened and how to continue."""
    for m in messages:
        print(m, file=sys.stderr, flush=True)
    try:
        last = find_checkpoint(out)
        hint = f"last complete checkpoint: {last}; continue with earl run --resume {out}"
    except ValueError:
        hint = "no checkpoint was written; start again with another --out"
    print(f"earl run: {what}; {hint}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Under torchrun
# --------------------------------------------------------------------------------------------
def worker_main(argv: list[str] | None = None) -> None:
    """One rank of a multi-process run: `python -m earl.runtime.launch --config FILE --out DIR
    [--resume DIR]`, where FILE is the configuration the CLI resolved."""
    ap = argparse.ArgumentParser(prog="earl.runtime.launch")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args(argv)
    code, stage = 0, "setup"
    try:
        cfg = from_dict(json.loads(Path(a.config).read_text()))
        stage = "the run"
        result = run_training(cfg, a.out, resume=a.resume, progress=a.progress, echo=lambda m: print(m, flush=True))
        if result.preempted:
            code = PREEMPTED_EXIT
            if result.metrics:  # rank 0 says it; the launcher relays the line
                print(preempted_message(result), file=sys.stderr, flush=True)
        elif result.metrics:  # rank 0
            print(summarize(result), flush=True)
    except ValueError as e:  # every rank says it (one may fail alone); the launcher shows each text once
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        code = 2
    except (RuntimeError, ConnectionError) as e:
        if isinstance(e, MemoryBudgetExceeded):
            print(f"earl run: {e}", file=sys.stderr, flush=True)
            code = 4
        else:
            last = _last_checkpoint(Path(a.out))
            hint = "" if os.environ.get("EARL_LAUNCHER") else (  # `earl run --nproc` reports it once
                f" Last complete checkpoint: {last or 'none'}" + (f"; continue with --resume {a.out}" if last else ""))
            # a peer's death reaches the others as a connection or backend error; anything else
            # failed on this rank itself (e.g. an unsupported layout), and is named as such
            peer = isinstance(e, (ConnectionError, getattr(dist, "DistError", ConnectionError))) or \
                any(w in str(e).lower() for w in ("connection", "peer", "timed out", "timeout"))
            what = "lost contact with a peer" if peer else "failed"
            print(f"earl run: rank {os.environ.get('RANK', '?')} {what} during {stage} "
                  f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); stopping.{hint}",
                  file=sys.stderr, flush=True)
            code = 3
    shutdown(code)


def _last_checkpoint(out: Path) -> str:
    try:
        return str(find_checkpoint(out))
    except ValueError:
        return ""


if __name__ == "__main__":
    worker_main()
