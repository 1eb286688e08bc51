"""Experience stage on a case's synthetic trajectories, as the calibration times it: after the tiny
rollout (warm), after the tiny rollout + 64 MiB flush, after a rollout of a cache-exceeding model.
python coldreal2.py rounds n length model[,model]"""
import dataclasses, statistics, sys, tempfile, time
from pathlib import Path
import torch
from earl.calibrate.host import random_checkpoint
from earl.calibrate.hostcost import flush_caches, COLD_FLUSH_BYTES, synthetic_trajectories
from earl.policies import make_dispatcher
from earl.policies.types import Sample
from earl.runtime.dist import process_group
from earl.runtime.run_config import EnvConfig, ModelConfig, PolicyConfig, RunConfig, TrainerConfig
from earl.runtime.step import SampleMeta, StepContext, play, prepare_experience, train
from earl.runtime.worker import ONE, Worker
from earl.specs import MODEL_CATALOG, StagePlan

COLD = dataclasses.replace(MODEL_CATALOG["tiny"], name="cold64", num_layers=4, hidden_size=640, num_heads=10,
                           num_kv_heads=2, head_dim=64, ffn_hidden=1792)

def main():
    rounds, n, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    bigs = sys.argv[4].split(",")
    torch.set_num_threads(1)
    with process_group(), tempfile.TemporaryDirectory() as tmp:
        def mk(m, groups=2):
            spec = COLD if m == "cold64" else m
            path = "tiny" if m == "tiny" else str(random_checkpoint(spec, Path(tmp) / m, "fp32"))
            cfg = RunConfig(model=ModelConfig(path=path, dtype="fp32", device="cpu"),
                            trainer=TrainerConfig(lr=1e-6), env=EnvConfig(name="tic-tac-toe"),
                            policy=PolicyConfig(dispatcher="layout-aware"), groups=groups, group_size=4, steps=2, seed=0)
            return Worker(cfg, StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
        tiny = mk("tiny", n // 4)
        big = {m: mk(m) for m in bigs}
        ctx = StepContext(selector=None, dispatcher=make_dispatcher("layout-aware"))
        flush = torch.zeros(COLD_FLUSH_BYTES // 4)
        gen = torch.Generator().manual_seed(0)
        trajs = synthetic_trajectories(n, length, 64, gen)
        samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs]
        meta = {t.episode_id: SampleMeta.of(t) for t in trajs}
        res, ro = {}, {}
        def exp(r):
            t0 = time.perf_counter()
            store, layout, _ = prepare_experience(tiny, ctx, r + 1, trajs, samples, meta)
            dt = time.perf_counter() - t0
            train(tiny, ctx, r + 1, store, layout, samples, meta)
            tiny.spans = []
            return dt
        for r in range(rounds + 1):
            variants = [("warm", None), ("flush", None)] + [(m, w) for m, w in big.items()]
            for name, w in variants:
                if w is None:
                    play(tiny, r + 1)
                    if name == "flush":
                        flush_caches(flush)
                else:
                    t0 = time.perf_counter(); play(w, r + 1); ro.setdefault(name, []).append(time.perf_counter() - t0)
                    w.spans = []
                dt = exp(r)
                if r:
                    res.setdefault(name, []).append(dt)
        base = statistics.median(res["warm"])
        for k, v in res.items():
            print(f"n={n} len={length} {k:10s} median {statistics.median(v)*1e3:6.2f} ms  x{statistics.median(v)/base:.2f}"
                  + (f"  rollout {statistics.median(ro[k]):.2f} s" if k in ro else ""))

if __name__ == "__main__":
    main()
