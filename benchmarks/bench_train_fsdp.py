"""Training step on gloo: FSDP2 (earl.runtime.parallelize + FSDPAdamW) versus the hand-written
ZeRO-1 (`ShardedAdamW` on a `zero` plan), side by side at world 2 and 4: bytes each rank sends
per training step and peak memory per rank.

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
import resource

import torch

from earl.parallel import build_plan_groups
from earl.policies.balance import balance_samples
from earl.policies.types import Sample
from earl.runtime.config import TrainerConfig
from earl.runtime.dist import run_local
from earl.runtime.optim import FSDPAdamW, ShardedAdamW, train_step
from earl.runtime.parallelize import parallelize
from earl.runtime.rollout import Trajectory
from earl.runtime.tp import param_shapes
from earl.runtime.trainer import Trainer, collate
from earl.specs import ParallelPlan

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
    else:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    print(f"model: qwen2-shaped {SHAPE}, fp32, batch 16 x 64 tokens, plan tp1-dpN-zero, {a.steps} steps; "
          "figures per rank (max over ranks)")
    print(f"{'world':>5} {'strategy':>8} {'sent MiB/step':>14} {'peak MiB':>9} {'loss':>10}")
    for world in a.worlds:
        got = {}
        for strategy in ("zero1", "fsdp2"):
            res = run_local(_worker, world, strategy, world, a.steps, timeout_s=900)
            got[strategy] = {"sent": max(r["sent"] for r in res), "peak": max(r["peak"] for r in res),
                             "loss": res[0]["loss"], "params": res[0]["params"]}
            g = got[strategy]
            print(f"{world:>5} {strategy:>8} {g['sent'] / 2**20:>14.1f} {g['peak'] / 2**20:>9.0f} {g['loss']:>10.5f}",
                  flush=True)
        z, f = got["zero1"], got["fsdp2"]
        print(f"{world:>5} fsdp2/zero1: bytes sent {f['sent'] / z['sent']:.2f}x, peak memory "
              f"{f['peak'] / z['peak']:.2f}x ({z['params'] / 1e6:.1f}M params, fp32 weights "
              f"{z['params'] * 4 / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
