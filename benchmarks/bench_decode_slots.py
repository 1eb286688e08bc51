"""Decode rows out of slot order: attention over their slots' range as a view of the KV cache vs
over a gathered copy of their slots, side by side in one run.

The built-in engine decodes the rows still generating; after the first turn they are rarely the
consecutive slots 0..n-1 in order (rows wait on their environment, rejoin in another order). The
engine then either gathers those rows' cache into a [rows, kv_len] copy per layer and step, or
(`earl.runtime.engine.pytorch.COVER_ROWS`) reads the whole range of their slots as a view, each
row's query at its slot. This runs the real rollout loop on the calculator environment with
both settings alternating (the same episodes, seeds and sampled tokens: the forward's outputs
are bit-identical, checked here) and prints rollout seconds, the decode steps that took each
path, and the ratio.

    python benchmarks/bench_decode_slots.py [--model qwen2-27m] [--groups 4] [--group-size 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
import time
from pathlib import Path

import torch

import earl.runtime.engine.pytorch as engine_mod
from earl.calibrate.host import random_checkpoint
from earl.runtime.engine import make_engine
from earl.runtime.envs import make_env
from earl.runtime.hf_model import load_policy
from earl.runtime.resolve import resolve_config
from earl.runtime.rollout import rollout
from earl.runtime.worker import sampling_params
from earl.specs import MODEL_CATALOG


def play(engine, cfg, episodes: int, group: int) -> tuple[float, list]:
    seeds = [1000 + i // group for i in range(episodes)]  # a group's members share their env seed
    t0 = time.perf_counter()
    trajs = rollout(engine, lambda: make_env("calculator"), seeds=seeds,
                    group_ids=[i // group for i in range(episodes)], params=sampling_params(cfg),
                    max_context=cfg.sampling.max_context)
    return time.perf_counter() - t0, trajs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2-27m", help="a catalog model (random weights) or a checkpoint dir")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if min(args.groups, args.group_size, args.rounds) < 1:
        ap.error(f"--groups, --group-size and --rounds must be >= 1, got {args.groups}, {args.group_size}, "
                 f"{args.rounds}")
    if not Path(args.model).is_dir() and args.model not in MODEL_CATALOG:
        ap.error(f"--model {args.model}: not a checkpoint folder nor a catalog model; valid names: "
                 f"{', '.join(sorted(MODEL_CATALOG))}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model if Path(args.model).is_dir() else str(random_checkpoint(args.model, Path(tmp) / "m", "fp32"))
        cfg = resolve_config(None, overrides={"model.path": path, "env.name": "calculator"})
        pol = load_policy(path)
        engine = make_engine("pytorch", pol.model, pol.tokenizer, reuse_kv=True, decode_steps=0)
        counts = {"view": 0, "range": 0, "gather": 0}
        cover_rows = engine_mod.COVER_ROWS
        forward = engine_mod.TorchEngine.forward
        signature = inspect.signature(forward)

        def counted(*a, **kw):  # which path each decode forward takes
            arg = signature.bind(*a, **kw).arguments
            if arg["n_dec"]:
                way = "view" if arg.get("dec_slots") is not None else "range" if arg.get("dec_cover") is not None \
                    else "gather"
                counts[way] += 1
            return forward(*a, **kw)

        engine_mod.TorchEngine.forward = counted
        episodes = args.groups * args.group_size
        play(engine, cfg, 4, 4)  # warm-up
        secs: dict[str, list[float]] = {"range": [], "gather": []}
        paths: dict[str, dict] = {}
        trajs: dict[str, list] = {}
        for _ in range(args.rounds):  # alternate, so load on the host hits both
            for key, cover in (("range", cover_rows), ("gather", 0.0)):
                engine_mod.COVER_ROWS = cover
                before = dict(counts)
                s, trajs[key] = play(engine, cfg, episodes, args.group_size)
                secs[key].append(s)
                paths[key] = {k: counts[k] - before[k] for k in counts}
        engine_mod.COVER_ROWS = cover_rows
        engine_mod.TorchEngine.forward = forward
    same = all(a.token_ids == b.token_ids and a.logprobs == b.logprobs
               for a, b in zip(trajs["range"], trajs["gather"], strict=True))
    gen = sum(t.generated_tokens for t in trajs["range"])
    print(f"model {args.model}, calculator, {episodes} episodes ({gen} generated tokens), {args.rounds} rounds "
          f"alternating, OMP threads 1; decode forwards per rollout by path (view: rows already consecutive)")
    print(f"{'setting':<28} {'median s':>9} {'min s':>7} {'view':>5} {'range':>6} {'gather':>7}")
    for key, what in (("range", f"range as a view (x{cover_rows:g})"), ("gather", "gathered copy")):
        p = paths[key]
        print(f"{what:<28} {statistics.median(secs[key]):9.2f} {min(secs[key]):7.2f} {p['view']:5d} {p['range']:6d} "
              f"{p['gather']:7d}")
    print(f"gathered / range: x{statistics.median(secs['gather']) / statistics.median(secs['range']):.2f} (medians); "
          f"same tokens and log-probs: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
