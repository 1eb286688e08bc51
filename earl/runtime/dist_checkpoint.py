"""Checkpoints of a multi-process run: the full weights and optimizer state are gathered on
rank 0 by a re-shard to a one-rank plan and written in runtime-1's format (earl.runtime.checkpoint);
loading reads them on rank 0 and re-shards to the current plans, so a run resumes on the same or
another tp x dp plan (or process count).

    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_dist_loop.py -k resume
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from earl.policies.reshard import plan_reshard
from earl.runtime.checkpoint import load_checkpoint, read_state, save_checkpoint
from earl.runtime.config import to_dict
from earl.runtime.dist import comm_device
from earl.runtime.dist_state import ONE, DistRun
from earl.runtime.dist_train import STATES
from earl.runtime.reshard import allocate_local, execute_reshard
from earl.specs import Stage


class _FullOptimizer:
    """Duck-types the optimizer runtime-1's checkpoint functions save / load."""

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None, step_count: int = 0):
        self.tensors, self.step_count = tensors or {}, step_count

    def state_dict(self) -> dict:
        return {"tensors": self.tensors, "step": self.step_count}

    def load_state_dict(self, d: dict) -> None:
        self.tensors, self.step_count = dict(d["tensors"]), int(d["step"])


def save_dist_checkpoint(run: DistRun, step: int) -> Path | None:
    rplan = plan_reshard(run.shapes, run.plans.train, ONE, run.world, optimizer_states=STATES)
    src = run._train_tensors()
    dst = allocate_local(run.shapes, ONE, run.rank, list(src), device=comm_device()) if run.rank == 0 else {}
    execute_reshard(rplan, run.shapes, src, dst)
    path = None
    if run.rank == 0:
        full = run._fresh()
        with torch.no_grad():
            for n, p in full.named_parameters():
                p.copy_(dst[n].cpu())
        opt = _FullOptimizer({k: v.cpu() for k, v in dst.items() if "/" in k}, run.optim.step_count)
        extra = {"plans": {s.value: run.plans.for_stage(s).describe() for s in Stage}, "world": run.world}
        path = save_checkpoint(run.out, step=step, model=full, optimizer=opt, config=to_dict(run.cfg),
                               extra=extra, keep=run.cfg.keep_checkpoints)
    dist.barrier()
    return path


def load_dist_checkpoint(run: DistRun, ckpt: Path) -> int:
    """Restore onto the current plans (any tp x dp): rank 0 reads, a re-shard spreads."""
    src, step_count = {}, 0
    if run.rank == 0:
        full, opt = run._fresh(), _FullOptimizer()
        load_checkpoint(ckpt, full, opt)
        src = {k: v.to(comm_device()) for k, v in
               {**{n: p.detach() for n, p in full.named_parameters()}, **opt.tensors}.items()}
        step_count = opt.step_count
    box = [step_count]
    dist.broadcast_object_list(box, src=0)
    names = list(run._train_tensors())
    plan = run.plans.train
    dst = allocate_local(run.shapes, plan, run.rank, names, device=comm_device())
    execute_reshard(plan_reshard(run.shapes, ONE, plan, run.world, optimizer_states=STATES), run.shapes, src, dst)
    run._build_train(plan, state=(dst, box[0]))
    return int(read_state(ckpt)["step"])


