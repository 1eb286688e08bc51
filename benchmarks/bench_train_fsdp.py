"""Training step on gloo: FSDP2 (earl.runtime.parallelize + FSDPAdamW) versus the hand-written
ZeRO-1 it replaced (`ShardedAdamW` on a `zero` plan), side by side at world 2 and 4: bytes each
rank sends per training step and peak memory per rank.

ZeRO-1 is no longer in the tree: its side runs from the last revision that had it (default
1723747), exported with `git archive` into a temporary folder, this same script run as a
subprocess with PYTHONPATH pointing at that tree; the FSDP2 side runs as a subprocess on this
tree. The two alternate (order flipped per world and round), so load changes hit both alike.

Same model (a Qwen2-shaped 8-layer, 512-wide model with random weights, fp32 so that both
strategies hold the same bytes per element), same batch, same plan tp1-dpN-zero. Bytes sent are
the process's socket writes during the step (/proc/self/io `wchar`: gloo's TCP transport writes
with writev; nothing else writes during a step); peak memory is the rise of the process's peak
RSS (ru_maxrss) from just before the model is built, so it counts weights, gradients, optimizer
state and activations, on CPU.

    OMP_NUM_THREADS=1 python benchmarks/bench_train_fsdp.py --worlds 2 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from earl.parallel import build_plan_groups
from earl.policies.balance import balance_samples
from earl.policies.types import Sample
from earl.runtime.dist import run_local
from earl.runtime.optim import FSDPAdamW
from earl.runtime.parallelize import parallelize
from earl.runtime.rollout import Trajectory
from earl.runtime.run_config import TrainerConfig
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import Trainer, collate, train_step
from earl.specs import ParallelPlan

ROOT = Path(__file__).resolve().parents[1]
OLD = "1723747"  # the last revision with ShardedAdamW's ZeRO-1 mode
CFG = TrainerConfig(algo="grpo", lr=1e-5, token_budget=1024)
SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=8192, tie_word_embeddings=True)


def _model():
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **SHAPE))


def _batch(n: int = 16, length: int = 64):
    gen = torch.Generator().manual_seed(0)
    trajs = [Trajectory(episode_id=i, group_id=i // 4, token_ids=torch.randint(3, SHAPE["vocab_size"], (length,),
                                                                                generator=gen).tolist(),
                        loss_mask=[0] * 8 + [1] * (length - 8), logprobs=[0.0] * length, reward=float(i % 3))
             for i in range(n)]
    b = collate(trajs, 0)
    lp = -torch.rand(b.input_ids.shape, generator=gen)
    adv = torch.randn(b.input_ids.shape, generator=gen)
    return dataclasses.replace(b, old_logprobs=lp, ref_logprobs=lp, advantages=adv)


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(x for x in f if x.startswith("wchar:")).split()[1])


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _worker(strategy: str, world: int, steps: int):
    torch.set_num_threads(1)
    plan = ParallelPlan(dp=world, sharded_optimizer=True)
    groups = build_plan_groups(plan)
    batch = _batch()
    base_rss = _peak_rss()
    model = _model()
    shapes = param_shapes(model)
    if strategy == "fsdp2":
        model = parallelize(model, plan, shapes)
        optim = FSDPAdamW(model, shapes, groups, CFG, torch.float32)
        trainer = Trainer(model, CFG, temperature=1.0, lockstep=groups.dp_group)
    else:  # run from the old tree (PYTHONPATH), where ShardedAdamW still had its ZeRO-1 mode
        from earl.runtime.optim import ShardedAdamW

        optim = ShardedAdamW(model, shapes, groups, CFG)
        trainer = Trainer(model, CFG, temperature=1.0)
    samples = [Sample(id=i, tokens=int(n)) for i, n in enumerate(batch.loss_mask.sum(1))]
    local = batch.select(list(balance_samples(samples, world)[0][groups.dp_rank]))
    sent = []
    for _ in range(steps):
        torch.distributed.barrier()
        w0 = _wchar()
        stats = train_step(trainer, optim, local)
        sent.append(_wchar() - w0)
    return {"sent": min(sent), "peak": _peak_rss() - base_rss, "loss": stats["loss"],
            "params": sum(s.shape[0] * (s.shape[1] if len(s.shape) > 1 else 1) for s in shapes.values())}


def export(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def measure(tree: Path, strategy: str, world: int, steps: int) -> dict:
    """One side in a subprocess with `earl` imported from `tree`: per-rank maxima."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, __file__, "--one", strategy, str(world), str(steps)], env=env,
                       capture_output=True, text=True, cwd=str(tree))
    if r.returncode:
        raise SystemExit(f"{strategy} at world {world} from {tree} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def one(strategy: str, world: int, steps: int) -> None:
    """The --one mode: run `strategy` on `world` local ranks, print one JSON line."""
    import earl

    res = run_local(_worker, world, strategy, world, steps, timeout_s=900)
    print(json.dumps({"sent": max(r["sent"] for r in res), "peak": max(r["peak"] for r in res),
                      "loss": res[0]["loss"], "params": res[0]["params"], "earl": earl.__file__}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="alternating runs of each side per world")
    ap.add_argument("--old", default=OLD, help="git revision whose ShardedAdamW had the ZeRO-1 mode")
    ap.add_argument("--one", nargs=3, metavar=("STRATEGY", "WORLD", "STEPS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return one(a.one[0], int(a.one[1]), int(a.one[2]))
    print(f"model: qwen2-shaped {SHAPE}, fp32, batch 16 x 64 tokens, plan tp1-dpN-zero, {a.steps} steps; "
          f"figures per rank (max over ranks); zero1 from revision {a.old}, fsdp2 from this tree")
    print(f"{'world':>5} {'strategy':>8} {'sent MiB/step':>14} {'peak MiB':>9} {'loss':>10}")
    with tempfile.TemporaryDirectory(prefix="earl-bench-fsdp-") as tmp:
        trees = {"zero1": export(a.old, Path(tmp) / "old"), "fsdp2": ROOT}
        for i, world in enumerate(a.worlds):
            got: dict[str, list[dict]] = {k: [] for k in trees}
            for rnd in range(a.rounds):
                order = list(trees) if (i + rnd) % 2 == 0 else list(reversed(trees))
                for strategy in order:
                    g = measure(trees[strategy], strategy, world, a.steps)
                    got[strategy].append(g)
                    print(f"{world:>5} {strategy:>8} {g['sent'] / 2**20:>14.1f} {g['peak'] / 2**20:>9.0f} "
                          f"{g['loss']:>10.5f}", flush=True)
            z = {k: min(r[k] for r in got["zero1"]) for k in ("sent", "peak")}
            f = {k: min(r[k] for r in got["fsdp2"]) for k in ("sent", "peak")}
            params = got["zero1"][0]["params"]
            same = len({r["loss"] for rows in got.values() for r in rows}) == 1
            print(f"{world:>5} fsdp2/zero1: bytes sent {f['sent'] / z['sent']:.2f}x, peak memory "
                  f"{f['peak'] / z['peak']:.2f}x ({params / 1e6:.1f}M params, fp32 weights "
                  f"{params * 4 / 2**20:.0f} MiB); losses {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
