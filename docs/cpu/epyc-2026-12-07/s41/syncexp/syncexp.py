# Experiment: the weight sync timed back to back (as `earl calibrate` times it) vs right after a
# training step (as the runtime reaches it), vs after a step and a barrier, on 2 gloo ranks.
import os, sys, time, statistics as st, json
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch, torch.distributed as dist
from earl.calibrate import fsdpfit as F
from earl.runtime.move_weights import execute_reshard
from earl.policies.reshard import plan_reshard
from earl.runtime.gc_steps import StepGC
from earl.runtime.trainer import Trainer, train_step
from earl.parallel import build_plan_groups
from earl.runtime.run_config import TrainerConfig
from earl.specs import ParallelPlan
import dataclasses

def setup(layers, wide):
    """On this rank: the FSDP2 model's sync plan, shapes, optimizer, the rollout copy's tensors,
    a trainer and this rank's share of a 16 x 96 batch, as the fsdp phase builds them."""
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    plan, roll_plan = ParallelPlan(dp=world, sharded_optimizer=True), ParallelPlan(dp=world)
    groups = build_plan_groups(plan)
    base = TrainerConfig(algo="grpo", lr=1e-5)
    spec = F.spec_of(layers, wide)
    model, shapes, roll, optim = F._fsdp_model(spec, plan, groups, base)
    rplan = plan_reshard(shapes, plan, roll_plan, world)
    dst = {n: p.data for n, p in roll.named_parameters()}
    trainer = Trainer(model, dataclasses.replace(base, token_budget=16384), temperature=1.0, lockstep=groups.dp_group)
    local = F._batch(16, 96, spec.vocab_size).select(F.rank_share(16, world, rank))
    return rplan, shapes, optim, dst, trainer, local


def work(layers, wide, reps):
    rplan, shapes, optim, dst, trainer, local = setup(layers, wide)
    out = {"b2b": [], "after_step": [], "after_step_barrier": []}
    def sync():
        t0 = time.perf_counter(); execute_reshard(rplan, shapes, optim.weights(), dst); return time.perf_counter() - t0
    with StepGC(every=1) as gc:
        for rnd in range(3):  # interleave the three modes
            for i in range(reps + 1):
                gc.step_done(i); dist.barrier(); t = sync()
                if i: out["b2b"].append(t)
            for i in range(reps + 1):
                gc.step_done(i); dist.barrier(); train_step(trainer, optim, local); t = sync()
                if i: out["after_step"].append(t)
            for i in range(reps + 1):
                gc.step_done(i); dist.barrier(); train_step(trainer, optim, local); dist.barrier(); t = sync()
                if i: out["after_step_barrier"].append(t)
    return out

if __name__ == "__main__":
    from earl.runtime.dist import run_local
    for nproc in (2, 4):
        for layers, wide in ((2, False), (2, True)):
            res = run_local(work, nproc, layers, wide, 8, start_method="spawn", timeout_s=600)
            # the fastest rank's time per repeat, as the calibration reads a sync point
            row = {}
            for k in res[0]:
                fastest = [min(r[k][i] for r in res) for i in range(len(res[0][k]))]
                row[k] = st.median(fastest) * 1e3
            print(f"nproc {nproc} layers {layers} wide {wide}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row.items())
                  + f"  after_step/b2b x{row['after_step']/row['b2b']:.2f}, +barrier x{row['after_step_barrier']/row['b2b']:.2f}", flush=True)
