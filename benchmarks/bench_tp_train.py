"""Training step at tp2 on gloo: DTensor TP (earl.runtime.parallelize.apply_dtensor_tp, what
training runs on) versus the hand-written TP layers (earl.runtime.tp.apply_tp, what the rollout
and log-prob copies run on), both under `ReplicatedAdamW`, side by side in the same two
processes, alternating rounds: median seconds per training step and the ratio.

Two models: the built-in `tiny` (0.1M parameters, where per-op overhead is the whole step) and
the Qwen2-shaped 8-layer, 512-wide model of bench_train_fsdp.py (29M parameters, fp32).

    OMP_NUM_THREADS=1 python benchmarks/bench_tp_train.py --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.bench_train_fsdp import CFG as WIDE_CFG
from benchmarks.bench_train_fsdp import _batch as wide_batch
from benchmarks.bench_train_fsdp import _model as wide_model
from earl.parallel import build_plan_groups
from earl.runtime.dist import run_local
from earl.runtime.hf_model import build_builtin
from earl.runtime.optim import ReplicatedAdamW
from earl.runtime.parallelize import parallelize
from earl.runtime.tp import apply_tp, param_shapes
from earl.runtime.trainer import Trainer, train_step
from earl.specs import ParallelPlan

PLAN = ParallelPlan(tp=2)


def _setup(name: str):
    if name == "tiny":
        from tests.runtime.test_dist_train import CFG, make_batch

        return (lambda: build_builtin("tiny", seed=0).model), make_batch(), CFG
    return wide_model, wide_batch(), WIDE_CFG


def _worker(name: str, rounds: int, steps: int) -> dict:
    torch.set_num_threads(1)
    g = build_plan_groups(PLAN)
    make, batch, cfg = _setup(name)
    times: dict[str, list[float]] = {"hand-written": [], "dtensor": []}
    losses = {}
    for rnd in range(rounds):
        for kind in (list(times) if rnd % 2 == 0 else list(reversed(times))):
            model = make()
            shapes = param_shapes(model)
            model = (apply_tp(model, PLAN.tp, g.tp_rank, g.tp_group) if kind == "hand-written"
                     else parallelize(model, PLAN, shapes))
            optim, trainer = ReplicatedAdamW(model, shapes, g, cfg), Trainer(model, cfg, temperature=1.0)
            train_step(trainer, optim, batch)  # warm-up
            for _ in range(steps):
                torch.distributed.barrier()
                t0 = time.perf_counter()
                losses[kind] = train_step(trainer, optim, batch)["loss"]
                times[kind].append(time.perf_counter() - t0)
    return {"times": times, "losses": losses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "wide"], choices=["tiny", "wide"])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round and side")
    a = ap.parse_args()
    for name in a.models:
        res = run_local(_worker, 2, name, a.rounds, a.steps, timeout_s=1800)[0]
        med = {k: statistics.median(v) for k, v in res["times"].items()}
        loss = res["losses"]
        print(f"{name:5s} tp2 train step: hand-written {med['hand-written'] * 1e3:8.1f} ms, DTensor "
              f"{med['dtensor'] * 1e3:8.1f} ms, DTensor / hand-written {med['dtensor'] / med['hand-written']:.2f}x "
              f"({len(res['times']['dtensor'])} steps each; last losses {loss['hand-written']:.6f} vs "
              f"{loss['dtensor']:.6f})", flush=True)


if __name__ == "__main__":
    main()
