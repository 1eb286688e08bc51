"""Atomic checkpoints: model (safetensors), optimizer and RNG states (torch.save, read back with
`weights_only=True`), step and config (JSON).

A checkpoint is written into a temporary folder next to its final place and renamed into place
only when complete, then `checkpoints/latest` is updated (also atomically). A crash or Ctrl-C at
any moment leaves the previous complete checkpoint untouched.

    earl run --resume runs/<name>        # continue from runs/<name>/checkpoints/latest
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

from earl.trace import atomic_write_text

CKPT_DIR = "checkpoints"
LATEST = "latest"
FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")


def _fsync_dir_files(d: Path) -> None:
    for f in d.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def save_checkpoint(run_dir: Path, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, config: dict, extra: dict,
                    keep: int = 2) -> Path:
    """Write checkpoints/step_<step>/ atomically; keep the newest `keep` checkpoints."""
    from safetensors.torch import save_model

    root = run_dir / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp-step_{step:07d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        state = {"step": step, "config": config, "python_random": _py_state(), **extra}
        (tmp / "state.json").write_text(json.dumps(state, default=str))
        _fsync_dir_files(tmp)
        if final.exists():  # rewriting the same step (after a resume): swap atomically
            old = root / f".old-step_{step:07d}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, final.name + "\n")
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _py_state() -> list:
    v, internal, gauss = random.getstate()
    return [v, list(internal), gauss]


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, given it or a run folder (its checkpoints/latest)."""
    p = Path(path)
    if (p / "state.json").is_file():
        return p
    root = p / CKPT_DIR
    if not root.is_dir():
        raise ValueError(f"--resume {str(path)!r}: no checkpoint there (expected a run folder with "
                         f"{CKPT_DIR}/ or a checkpoint folder with state.json)")
    latest = root / LATEST
    name = latest.read_text().strip() if latest.is_file() else ""
    if not name or not (root / name).is_dir():
        found = sorted(root.glob("step_*"))
        if not found:
            raise ValueError(f"--resume {str(path)!r}: {root} holds no complete checkpoint")
        name = found[-1].name
    return root / name


def read_state(ckpt: Path) -> dict:
    try:
        state = json.loads((ckpt / "state.json").read_text())
        int(state["step"])
        dict(state["config"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {ckpt} is corrupted: state.json unreadable ({e})") from None
    return state


def load_checkpoint(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Restore model, optimizer and RNG states in place; return the state dict (step, ...)."""
    from safetensors.torch import load_model

    state = read_state(ckpt)
    missing = [f for f in FILES if not (ckpt / f).is_file()]
    if missing:
        raise ValueError(f"checkpoint {ckpt} is incomplete: missing {', '.join(missing)}")
    try:
        load_model(model, str(ckpt / "model.safetensors"), strict=True)
        if optimizer is not None:
            optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
        rng = torch.load(ckpt / "rng.pt", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to parse the files means corruption
        raise ValueError(f"checkpoint {ckpt} is corrupted: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    v, internal, gauss = state["python_random"]
    random.setstate((v, tuple(internal), gauss))
    return state
