# The weight sync reached as the runtime reaches it: rank r arrives LEAD x r after rank 0 (a busy
# loop, or a train step then a busy loop); the window from the last arrival to the first end,
# all repeats' median and the faster half's (as the calibration's wake points read it).
import os, sys, time, statistics as st
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch, torch.distributed as dist, dataclasses
from earl.calibrate import fsdpfit as F
from earl.runtime.move_weights import execute_reshard
from earl.policies.reshard import plan_reshard
from earl.runtime.gc_steps import StepGC
from earl.runtime.trainer import Trainer, train_step
from earl.parallel import build_plan_groups
from earl.runtime.run_config import TrainerConfig
from earl.specs import ParallelPlan
from syncexp import setup  # run from this folder

def work(layers, wide, reps, lead):
    rplan, shapes, optim, dst, trainer, local = setup(layers, wide)
    world, rank = dist.get_world_size(), dist.get_rank()
    out = {"b2b": [], "stag": [], "step_stag": []}
    with StepGC(every=1) as gc:
        for rnd in range(3):
            for mode in out:
                for i in range(reps + 1):
                    gc.step_done(i)
                    dist.barrier()
                    if mode == "step_stag":
                        train_step(trainer, optim, local)
                    if mode != "b2b":
                        arrive = time.perf_counter() + (rank if mode == "stag" else (world - 1 - rank)) * lead
                        while time.perf_counter() < arrive:
                            pass
                    t0 = time.perf_counter(); execute_reshard(rplan, shapes, optim.weights(), dst); t1 = time.perf_counter()
                    if i:
                        out[mode].append((t0, t1))
    return out

if __name__ == "__main__":
    from earl.runtime.dist import run_local
    # the first run: (2, False), (4, False); the second, a minute later: (2, True), (2, False), (4, True)
    cases = [(int(n), w == "wide") for n, w in (a.split(":") for a in sys.argv[1:])] or [(2, False), (4, False)]
    for nproc, wide in cases:
        res = run_local(work, nproc, 2, wide, 8, 0.006, start_method="spawn", timeout_s=600)
        line = []
        for k in res[0]:
            n = len(res[0][k])
            if k == "b2b":
                w = [min(r[k][i][1] - r[k][i][0] for r in res) for i in range(n)]
            else:
                w = [min(r[k][i][1] for r in res) - max(r[k][i][0] for r in res) for i in range(n)]
            ws = sorted(w)
            line.append(f"{k} median {st.median(w)*1e3:.2f} fast-half {st.median(ws[:n//2])*1e3:.2f} q75 {ws[3*n//4]*1e3:.2f}")
        print(f"nproc {nproc} wide {wide}: " + " | ".join(line), flush=True)
