"""Sharded, layout-independent checkpoints on torch.distributed.checkpoint (DCP), and the HF
export of the policy.

Every rank saves its own weight and optimizer shards as DTensors with the placements
earl.parallel derives, so a checkpoint loads into any world size and plan (1 process into 2,
tp2 into tp1, dp2-zero into dp1 and back). A save is atomic (a temp folder renamed into place,
then `latest` rewritten); an interrupted save leaves the previous checkpoint untouched. The
on-disk layout and the clean-up rules: docs/runtime.md, "Design notes".

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_checkpoint.py
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import json
import os
import random
import re
import resource
import shutil
import sys
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from earl.parallel import ParamShape, build_mesh, check_tp_dp, local_bounds, local_shape, placements
from earl.policies.reshard import param_of
from earl.runtime.dist import comm_device
from earl.runtime.run_config import to_dict
from earl.specs import ParallelPlan, Stage, WorkloadStats
from earl.trace import atomic_write_text

FORMAT_VERSION = 1
CKPT_DIR = "checkpoints"
LATEST = "latest"
META = "meta.json"
STEP_RE = re.compile(r"^step-(\d{6,})$")
RESERVED = ("format_version", "step", "optimizer_step", "layout")


@dataclass
class LoadedCheckpoint:
    """This rank's tensors under the plan it loaded into."""

    params: dict[str, torch.Tensor]  # param name -> local shard
    optimizer: dict[str, torch.Tensor]  # "<param>/<state>" -> local slice ({} if none was saved)
    optimizer_step: int  # optimizer steps taken (0: no optimizer state)
    meta: dict  # meta.json: step, config, plans, stats, rng, ... and the layout it was saved under


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast(obj):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextmanager
def _ctrl_c_after():
    """Hold a Ctrl-C until the block ends, then raise it (a second one raises at once). A
    KeyboardInterrupt raised inside DCP's writes lands in torch.save's C++ write callback; the
    file then closes under the archive writer and the process aborts (SIGABRT, "write to closed
    file", torch 2.13 CPU, 2026-12-04) instead of stopping with the last checkpoint and exit
    code 130. Only in the main thread, over Python's own SIGINT handler."""
    import signal
    import threading

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    held: list[int] = []

    def hold(signum, frame):
        if held:
            raise KeyboardInterrupt
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


@contextmanager
def _single_process_ok():
    """DCP warns when it runs without a process group; for world 1 that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _dcp_state(params: dict, optimizer: dict, shapes: dict[str, ParamShape], plan: ParallelPlan,
               rank: int) -> dict:
    """DCP's state dict: local tensors, as DTensors on the plan's mesh under a process group,
    as they are (full tensors) without one. Checks each local shape against the plan."""
    out = {}
    for prefix, tensors, opt in (("params", params, False), ("optimizer", optimizer, True)):
        for key in sorted(tensors):
            t = tensors[key]
            name = param_of(key)[0] if opt else key
            if name not in shapes:
                raise ValueError(f"tensor {key!r} has no entry in `shapes`")
            p = shapes[name]
            want = local_shape(p, plan, rank, optimizer=opt)
            if tuple(t.shape) != want:
                raise ValueError(f"{key}: local shape {tuple(t.shape)} on rank {rank}, but plan "
                                 f"{plan.describe()} gives it {want}")
            if dist.is_initialized():
                from torch.distributed.tensor import DTensor

                dims, pl = placements(p, plan, optimizer=opt)
                mesh = build_mesh(plan, device_type=t.device.type, dims=dims)
                t = DTensor.from_local(t.contiguous(), mesh, pl, run_check=False, shape=torch.Size(p.shape),
                                       stride=torch.empty(p.shape, device="meta").stride())
            out[f"{prefix}/{key}"] = t
    return out


def _check_plan(plan: ParallelPlan, world: int) -> None:
    check_tp_dp(plan, world)
    if plan.world_size != world:
        raise ValueError(f"plan {plan.describe()} has {plan.world_size} ranks; a checkpoint is saved and "
                         f"loaded by all {world} ranks of the job")


# --------------------------------------------------------------------------------------------
# Save
# --------------------------------------------------------------------------------------------
def save_checkpoint(out_dir: str | Path, step: int, *, params: dict[str, torch.Tensor],
                    optimizer: dict[str, torch.Tensor], optimizer_step: int, shapes: dict[str, ParamShape],
                    plan: ParallelPlan, meta: dict, keep: int = 2) -> Path:
    """Write `out_dir/checkpoints/step-NNNNNN` atomically and point `latest` at it; keep the
    newest `keep`. Collective: every rank calls it with its own local shards (`params`: name ->
    this rank's tp shard; `optimizer`: "<param>/<state>" -> its optimizer slice under `plan`).
    `meta` (JSON-able: config, plans, stats, rng, model source, ...) is written by rank 0."""
    rank, world = _rank_world()
    _check_plan(plan, world)
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    clash = [k for k in RESERVED if k in meta]
    if clash:
        raise ValueError(f"meta keys {clash} are reserved for the checkpoint's own fields")
    root = Path(out_dir) / CKPT_DIR
    name = f"step-{step:06d}"
    tmp = None
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    tmp = Path(_broadcast(str(tmp)))
    failed = ""
    try:
        with _ctrl_c_after():
            state = _dcp_state(params, optimizer, shapes, plan, rank)
            with _single_process_ok():
                dcp.save(state, checkpoint_id=tmp)
            if rank == 0:
                layout = {"plan": plan.describe(), "world": world,
                          "tensors": {n: {"shape": list(shapes[n].shape), "tp_dim": shapes[n].tp_dim,
                                          "dtype": _dtype_name(params[n])} for n in sorted(params)},
                          "optimizer": {k: _dtype_name(v) for k, v in sorted(optimizer.items())}}
                doc = {"format_version": FORMAT_VERSION, "step": int(step), "optimizer_step": int(optimizer_step),
                       "layout": layout, **meta}
                with open(tmp / META, "w") as f:
                    f.write(json.dumps(doc, default=str))
                    f.flush()
                    os.fsync(f.fileno())
                _publish(tmp, root / name)
                atomic_write_text(root / LATEST, name + "\n")
                _clean_up(root, keep)
    except BaseException as e:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, KeyboardInterrupt) or "KeyboardInterrupt" in repr(e):
            # Ctrl-C inside DCP arrives wrapped in its CheckpointException: stop as Ctrl-C (the
            # previous checkpoint and `latest` are untouched), not as a failed save
            raise KeyboardInterrupt from None
        need = sum(t.numel() * t.element_size() for t in (*params.values(), *optimizer.values()))
        full = _no_room(e, root, need)
        if not dist.is_initialized() and full is None:
            raise
        failed = f"{NO_ROOM}{full}" if full is not None else f"{type(e).__name__}: {e}"
    failed = _all_failures(failed)
    if NO_ROOM in failed:
        try:
            prev = f"the previous checkpoint {find_checkpoint(out_dir)} is intact; free space and continue with " \
                   f"earl run --resume {out_dir}"
        except ValueError:
            prev = "no earlier checkpoint exists; free space and start again"
        why = failed.split(NO_ROOM, 1)[1].split(";")[0]
        raise CheckpointSaveError(f"checkpoint at step {step} not written: no room on the disk ({why}); the partial "
                                  f"one was removed and {prev}")
    if failed:
        raise RuntimeError(f"checkpoint at step {step} failed: {failed}")
    return root / name


NO_ROOM = "no room: "
_NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class CheckpointSaveError(ValueError):
    """A save that could not be written for lack of room (the CLI's one line, exit code 2)."""


def _no_room(e: BaseException, folder: Path, need_bytes: int) -> str | None:
    """Why the save ran out of room (a full disk, a quota, a file-size limit), else None: the
    OS's words when `e` (or what DCP wrapped in it) carries the errno, or, for torch.save's zip
    writer, which reports a short write without it, what the disk and `ulimit -f` allow."""
    seen, texts = [e], []
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict):
        seen += [w[0] if isinstance(w, tuple) else w for w in failures.values()]  # (exception, traceback)
    while seen:
        x = seen.pop()
        texts.append(str(x) if not isinstance(x, CheckpointException) else "")
        if isinstance(x, OSError) and x.errno in _NO_ROOM_ERRNOS:
            return os.strerror(x.errno)
        seen += [n for n in (x.__cause__, x.__context__) if isinstance(n, BaseException)]
    if not any(w in t for t in texts for w in ("unexpected pos", "No space left", "File too large")):
        return None
    free = shutil.disk_usage(folder).free if folder.exists() else 0
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if free < need_bytes:
        return f"{free / 2**20:.1f} MiB free on {folder}, the checkpoint needs about {need_bytes / 2**20:.1f} MiB"
    if limit != resource.RLIM_INFINITY and limit < need_bytes:
        return (f"File too large: the file-size limit (ulimit -f) is {limit / 2**20:.2f} MiB, the checkpoint "
                f"needs about {need_bytes / 2**20:.1f} MiB")
    return "a short write: the disk is probably full"


def _all_failures(mine: str) -> str:
    """Every rank learns whether any rank failed (so none waits forever or goes on alone)."""
    if not dist.is_initialized():
        return mine
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return "; ".join(f"rank {r}: {m}" for r, m in enumerate(out) if m)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the complete folder into place (swapping out an earlier save of the same step)."""
    if final.exists():
        old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _ours(d: Path) -> int | None:
    """The step of a checkpoint folder this module wrote, else None."""
    m = STEP_RE.match(d.name)
    if not m or not d.is_dir():
        return None
    try:
        doc = json.loads((d / META).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return int(m.group(1)) if isinstance(doc, dict) and "format_version" in doc else None


def _clean_up(root: Path, keep: int) -> None:
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else ""
    found = sorted((s, d) for d in root.iterdir() if (s := _ours(d)) is not None)
    for _, d in found[:-keep]:
        if d.name != latest:
            shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Find, inspect, load
# --------------------------------------------------------------------------------------------
def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, given it or a run folder (its checkpoints/latest, else the highest
    step there). No process group needed."""
    p = Path(path)
    if (p / META).is_file():
        return p
    if (p / "state.json").is_file():
        raise ValueError(f"checkpoint {p} is in the old single-file format (state.json); this earl "
                         "reads sharded checkpoints (meta.json + DCP files) only")
    root = p / CKPT_DIR
    if not root.is_dir():
        raise ValueError(f"--resume {str(path)!r}: no checkpoint there (expected a run folder with "
                         f"{CKPT_DIR}/ or a checkpoint folder with {META})")
    latest = root / LATEST
    name = latest.read_text(errors="replace").strip() if latest.is_file() else ""
    if name and (root / name / META).is_file():
        return root / name
    found = sorted((s, d) for d in root.iterdir() if (s := _ours(d)) is not None)
    if not found:
        raise ValueError(f"--resume {str(path)!r}: {root} holds no complete checkpoint")
    if latest.exists() and (root, name) not in _WARNED:  # a missing `latest` (an old run) is no news
        _WARNED.add((root, name))
        print(f"earl run: warning: {latest} names {name[:40]!r}, which is not a complete checkpoint; using "
              f"the newest complete one, {found[-1][1]}", file=sys.stderr, flush=True)
    return found[-1][1]


_WARNED: set = set()


def intact_before(ckpt: Path) -> Path | None:
    """The newest checkpoint of the same run older than `ckpt` whose meta.json reads, else None."""
    step = _ours(ckpt)
    older = sorted((s, d) for d in ckpt.parent.iterdir()
                   if (s := _ours(d)) is not None and (step is None or s < step) and d != ckpt)
    return older[-1][1] if older else None


def read_meta(path: str | Path) -> dict:
    """meta.json of a checkpoint (or of a run folder's latest one)."""
    ckpt = find_checkpoint(path)
    try:
        doc = json.loads((ckpt / META).read_text())
        int(doc["step"])
        int(doc["format_version"])
        dict(doc["layout"]["tensors"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"checkpoint {ckpt} is corrupted: {META} unreadable ({e})") from None
    if doc["format_version"] > FORMAT_VERSION:
        raise ValueError(f"checkpoint {ckpt} has format {doc['format_version']}; this earl reads up to "
                         f"{FORMAT_VERSION}")
    return doc


def check_compatible(meta: dict, shapes: dict[str, ParamShape], where: str = "checkpoint") -> None:
    """ValueError naming the first difference when a checkpoint holds another model."""
    saved = meta["layout"]["tensors"]
    missing, extra = sorted(set(shapes) - set(saved)), sorted(set(saved) - set(shapes))
    if missing or extra:
        raise ValueError(f"{where} is from an incompatible model: "
                         + (f"it lacks {missing[:3]}" if missing else f"it has extra tensors {extra[:3]}")
                         + f" ({len(saved)} tensors there, {len(shapes)} here)")
    for n, p in sorted(shapes.items()):
        if tuple(saved[n]["shape"]) != tuple(p.shape):
            raise ValueError(f"{where} is from an incompatible model: {n} has shape "
                             f"{tuple(saved[n]['shape'])} there, {tuple(p.shape)} here")


def load_checkpoint(path: str | Path, *, shapes: dict[str, ParamShape], plan: ParallelPlan,
                    rank: int | None = None, world: int | None = None, device: str | torch.device = "cpu",
                    with_optimizer: bool = True) -> LoadedCheckpoint:
    """This rank's local tensors under `plan` (any tp x dp plan of the current world, whatever
    the plan and world the checkpoint was saved under). Collective under a process group."""
    ckpt = find_checkpoint(path)
    meta = read_meta(ckpt)
    r0, w0 = _rank_world()
    rank = r0 if rank is None else rank
    world = w0 if world is None else world
    if (rank, world) != (r0, w0):
        raise ValueError(f"load_checkpoint: rank/world {rank}/{world} differ from the process group's {r0}/{w0}")
    _check_plan(plan, world)
    check_compatible(meta, shapes, f"checkpoint {ckpt}")
    layout = meta["layout"]
    dtypes = {n: getattr(torch, d["dtype"]) for n, d in layout["tensors"].items()}
    opt_keys = sorted(layout["optimizer"]) if with_optimizer else []
    params = {n: torch.empty(local_shape(shapes[n], plan, rank, optimizer=False), dtype=dtypes[n], device=device)
              for n in sorted(shapes)}
    optimizer = {k: torch.empty(local_shape(shapes[param_of(k)[0]], plan, rank, optimizer=True),
                                dtype=getattr(torch, layout["optimizer"][k]), device=device) for k in opt_keys}
    state = _dcp_state(params, optimizer, shapes, plan, rank)
    try:
        with _single_process_ok():
            dcp.load(state, checkpoint_id=ckpt)
    except (CheckpointException, Exception) as e:  # noqa: BLE001 - DCP wraps any read or parse failure
        failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: the wrapped error}
        inner = next(iter(failures.values()))[0] if isinstance(failures, dict) and failures else e
        first = (str(inner).strip().splitlines() or [""])[0][:120]
        prev = intact_before(ckpt)
        hint = (f"the newest intact one before it is {prev}: continue from it with earl run --resume {prev}"
                if prev is not None else "no earlier checkpoint of this run is left; start again with another --out")
        raise ValueError(f"checkpoint {ckpt} is corrupted ({type(inner).__name__}: {first}); {hint}") from None
    local = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}
    return LoadedCheckpoint(params={n: local[f"params/{n}"] for n in params},
                            optimizer={k: local[f"optimizer/{k}"] for k in optimizer},
                            optimizer_step=int(meta["optimizer_step"]) if with_optimizer else 0, meta=meta)


# --------------------------------------------------------------------------------------------
# RNG state for the checkpoint meta
# --------------------------------------------------------------------------------------------
def rng_state() -> dict:
    """This process's RNG states, JSON-able (torch CPU, CUDA when present, Python's random)."""
    enc = lambda t: base64.b64encode(t.numpy().tobytes()).decode()
    v, internal, gauss = random.getstate()
    out = {"torch": enc(torch.get_rng_state()), "python": [v, list(internal), gauss]}
    if torch.cuda.is_available():
        out["cuda"] = [enc(s) for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(state: dict) -> None:
    dec = lambda s: torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
    torch.set_rng_state(dec(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([dec(s) for s in state["cuda"]])
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))


# --------------------------------------------------------------------------------------------
# Full weights and the HF export
# --------------------------------------------------------------------------------------------
def gather_full_params(params: dict[str, torch.Tensor], shapes: dict[str, ParamShape], plan: ParallelPlan,
                       dst: int = 0) -> dict[str, torch.Tensor] | None:
    """Full tensors on rank `dst` (None elsewhere): the tp shards of replica 0 are sent to it
    point to point. Collective under a process group."""
    rank, world = _rank_world()
    _check_plan(plan, world)
    if world == 1:
        return {n: t.detach() for n, t in params.items()}
    holders = list(range(plan.tp))  # replica 0 holds every tp shard
    full: dict[str, torch.Tensor] = {}
    works = []
    for n in sorted(params):
        p, t = shapes[n], params[n].detach()
        if rank == dst:
            out = torch.empty(p.shape, dtype=t.dtype, device=t.device)
            for src in holders if p.tp_dim is not None else [dst]:
                lo, hi = local_bounds(p, plan, src, optimizer=False)
                view = out.narrow(p.shard_dim, lo, hi - lo)
                if src == rank:
                    view.copy_(t)
                elif hi > lo:
                    buf = torch.empty(view.shape, dtype=t.dtype, device=t.device)
                    works.append((dist.irecv(buf, src=src), view, buf))
            full[n] = out
        elif rank in holders and p.tp_dim is not None and t.numel():
            works.append((dist.isend(t.contiguous(), dst=dst), None, None))
    for w, view, buf in works:
        w.wait()
        if view is not None:
            view.copy_(buf)
    return full if rank == dst else None


def export_hf(folder: str | Path, full_state_dict: dict[str, torch.Tensor], model_config, tokenizer,
              dtype: str | torch.dtype | None = None) -> Path:
    """An HF folder `AutoModelForCausalLM.from_pretrained` loads: config.json, model.safetensors
    in `dtype` (default: the tensors' own dtype; bf16 stays bf16) and the tokenizer (an HF
    tokenizer's files, or the built-in character tokenizer's earl_tokenizer.json)."""
    from safetensors.torch import save_file

    from earl.runtime.hf_model import TORCH_DTYPES
    from earl.runtime.tokenizer import CharTokenizer, HFTokenizer

    if isinstance(dtype, str):
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {dtype!r} unknown; valid: {', '.join(TORCH_DTYPES)}")
        dtype = TORCH_DTYPES[dtype]
    dtype = dtype or next(iter(full_state_dict.values())).dtype
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    seen: set = set()
    tensors = {}
    for k, v in full_state_dict.items():
        v = v.detach().to("cpu", dtype).contiguous()
        if v.data_ptr() in seen:  # safetensors refuses shared storage (e.g. tied embeddings)
            v = v.clone()
        seen.add(v.data_ptr())
        tensors[k] = v
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
    cfg["dtype" if "dtype" in cfg else "torch_dtype"] = str(dtype).removeprefix("torch.")
    atomic_write_text(d / "config.json", json.dumps(cfg, indent=2, default=str))
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.tok.save_pretrained(str(d))
    elif isinstance(tokenizer, CharTokenizer):
        tokenizer.save(d)
    elif tokenizer is not None:
        raise TypeError(f"export_hf: unknown tokenizer type {type(tokenizer).__name__}")
    return d


# --------------------------------------------------------------------------------------------
# earl run's checkpoints: a worker's training state and the run's metadata
# --------------------------------------------------------------------------------------------
def save_run(w, out: Path, step: int, stats: WorkloadStats) -> Path:
    """`earl run`'s checkpoint of worker `w` (earl.runtime.worker.Worker) after `step`: every
    rank writes its training shards (weights and optimizer slices) with DCP; the
    checkpoint loads into any world size and plan (earl.runtime.checkpoint)."""
    meta = {"config": to_dict(w.cfg), "plans": {s.value: w.plans.for_stage(s).describe() for s in Stage},
            "world": w.world, "model_source": w.policy.source, "stats": dataclasses.asdict(stats),
            "rng": rng_state()}
    dev = comm_device()  # tensors where the process group's backend takes them (gloo: the CPU)
    return save_checkpoint(out, step, params={n: t.to(dev) for n, t in w.train_weights().items()},
                           optimizer={k: v.to(dev) for k, v in w.optim.state_tensors().items()},
                           optimizer_step=w.optim.step_count, shapes=w.shapes,
                           plan=w.plans.train, meta=meta, keep=w.cfg.keep_checkpoints)


def load_run(w, ckpt: Path) -> tuple[int, WorkloadStats]:
    """Each rank reads its shards under the current training plan, whatever it was saved on."""
    got = load_checkpoint(ckpt, shapes=w.shapes, plan=w.plans.train, rank=w.rank, world=w.world,
                          device=comm_device())
    w.restore({**got.params, **got.optimizer}, got.optimizer_step)
    if got.meta.get("rng") and got.meta.get("world") == w.world:
        restore_rng(got.meta["rng"])
    return int(got.meta["step"]), WorkloadStats(**got.meta["stats"])


def export_policy(w, folder: Path) -> Path | None:
    """The policy as an HF folder (config.json, safetensors in the model's dtype, tokenizer) on
    rank 0, written next to its final place and renamed in. Collective."""
    full = gather_full_params({n: t.to(comm_device()) for n, t in w.train_weights().items()},
                              w.shapes, w.plans.train)
    if full is None:
        return None
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    export_hf(tmp, full, w.policy.model.config, w.policy.tokenizer)
    if folder.exists():
        old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, folder)
    return folder
