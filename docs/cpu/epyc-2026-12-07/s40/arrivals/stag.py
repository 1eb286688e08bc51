# Does arriving apart (as the runtime's ranks reach the training dispatch) stretch the window (last
# rank's start to last rank's end) beyond arriving together? 4 gloo ranks on 2 cores; after the
# dispatch every rank burns L ms then all-reduces 16 bytes (the FSDP2 step's start and dp_sum).
import sys, time, statistics, random
import torch, torch.distributed as dist
from earl.runtime.dist import run_local
from earl.runtime.gc_steps import StepGC
from earl.calibrate.dispatchfit import _store, sample_reward
from earl.policies.balance import balance_samples, round_robin_samples
from earl.policies.dispatch import LayoutAwareDispatcher
from earl.policies.types import Layout, Sample
from earl.specs import ParallelPlan
import dataclasses

from earl.calibrate import dispatchfit
LAYOUT = "runtime"

def layouts(n, per_rank, context):
    # "runtime": the runtime's training dispatch at n ranks, dp n -> dp n (FSDP2), token-balanced;
    # "calib": earl.calibrate.dispatchfit's layouts (dp n -> tp 2 x dp n / 2)
    if LAYOUT == "calib":
        return dispatchfit.layouts(n, per_rank, context)
    samples = [Sample(id=i, tokens=max(1, context - 64 * (i % 4)), group=i // 4) for i in range(n * per_rank)]
    src = Layout(ParallelPlan(dp=n), round_robin_samples(samples, n)[0])
    dst = Layout(ParallelPlan(dp=n), balance_samples(samples, n)[0])
    return samples, src, dst

def runtime_plans(n, per_rank, context):
    samples, src, dst = layouts(n, per_rank, context)
    return {"layout-aware": dataclasses.replace(LayoutAwareDispatcher().plan(src, dst, samples), reduce_bytes=0)}
from earl.runtime.move_samples import execute_dispatch

def burn(s):
    t = time.thread_time() + s
    while time.thread_time() < t:
        pass

def work(per_rank, ctx, gaps_ms, L_ms, reps, kind, layout):
    global LAYOUT
    LAYOUT = layout
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    samples, src, dst = layouts(world, per_rank, ctx)
    store = _store(samples, src, rank)
    tp = runtime_plans(world, per_rank, ctx)[kind]
    rewards = {x.id: sample_reward(x.id) for x in samples}
    evict = torch.empty(16 << 20)
    res = {g: [] for g in gaps_ms}
    small = torch.zeros(2, dtype=torch.float64)
    rng = random.Random(7)
    with StepGC(every=1) as gc:
        for rep in range(reps + 1):
            for g in gaps_ms:
                order = list(range(world)); rng.shuffle(order)
                gc.step_done(rep)
                evict.fill_(rep)
                dist.barrier()
                # the k-th to arrive computes k x g ms first (wall clock, on its thread: burns CPU)
                t_go = time.perf_counter() + order.index(rank) * g / 1e3
                while time.perf_counter() < t_go:
                    pass
                t0 = time.perf_counter()
                execute_dispatch(tp, store, samples, src, dst, check=False, rewards=rewards)
                t1 = time.perf_counter()
                burn(L_ms / 1e3)
                dist.all_reduce(small)
                t = torch.tensor([t0, t1], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if rep:
                    res[g].append(float(t[1] - t[0]))
    return res

if __name__ == "__main__":
    LAYOUT = sys.argv[8] if len(sys.argv) > 8 else "runtime"
    world, per_rank, ctx = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    gaps = [float(x) for x in sys.argv[4].split(",")]
    L = float(sys.argv[5]); reps = int(sys.argv[6]); trials = int(sys.argv[7])
    for trial in range(trials):
        got = run_local(work, world, per_rank, ctx, gaps, L, reps, "layout-aware", LAYOUT, timeout_s=600, start_method="spawn")[0]
        print(f"trial {trial} {LAYOUT} layouts world {world} case {per_rank}x{ctx} L {L:g} ms reps {reps}: " + "; ".join(
            f"gap {g:g} ms: med {statistics.median(v)*1e3:.2f} q25 {statistics.quantiles(v, n=4)[0]*1e3:.2f} q75 {statistics.quantiles(v, n=4)[2]*1e3:.2f}"
            for g, v in got.items()), flush=True)
