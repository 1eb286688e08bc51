"""Experience stage after a real rollout of a small vs a cache-exceeding model, and after a flush.
python coldreal.py [rounds]"""
import dataclasses, statistics, sys, tempfile, time
from pathlib import Path
import torch
from earl.calibrate.host import random_checkpoint
from earl.calibrate.hostcost import flush_caches, COLD_FLUSH_BYTES
from earl.policies import make_dispatcher
from earl.policies.types import Sample
from earl.runtime.dist import process_group
from earl.runtime.run_config import EnvConfig, ModelConfig, PolicyConfig, RunConfig, TrainerConfig
from earl.runtime.step import SampleMeta, StepContext, play, prepare_experience, train
from earl.runtime.worker import ONE, Worker
from earl.specs import StagePlan

def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    models = sys.argv[2].split(",") if len(sys.argv) > 2 else ["tiny", "qwen2-27m"]
    torch.set_num_threads(1)
    with process_group(), tempfile.TemporaryDirectory() as tmp:
        workers = {}
        for m in models:
            path = m if m == "tiny" else str(random_checkpoint(m, Path(tmp) / m, "fp32"))
            cfg = RunConfig(model=ModelConfig(path=path, dtype="fp32", device="cpu"),
                            trainer=TrainerConfig(lr=1e-6), env=EnvConfig(name="calculator"),
                            policy=PolicyConfig(dispatcher="layout-aware"), groups=2, group_size=4, steps=2, seed=0)
            workers[m] = Worker(cfg, StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
        ctx = StepContext(selector=None, dispatcher=make_dispatcher("layout-aware"))
        flush = torch.zeros(COLD_FLUSH_BYTES // 4)
        res = {}
        for r in range(rounds + 1):
            for m, w in workers.items():
                for variant in ("after-rollout", "after-flush"):
                    trajs, _ = play(w, r + 1)
                    samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs]
                    meta = {t.episode_id: SampleMeta.of(t) for t in trajs}
                    if variant == "after-flush":
                        flush_caches(flush)
                    t0 = time.perf_counter()
                    store, layout, _ = prepare_experience(w, ctx, r + 1, trajs, samples, meta)
                    dt = time.perf_counter() - t0
                    train(w, ctx, r + 1, store, layout, samples, meta)
                    w.spans = []
                    if r:
                        res.setdefault((m, variant), []).append(dt)
        for k, v in res.items():
            print(f"{k[0]:12s} {k[1]:14s} median {statistics.median(v)*1e3:6.2f} ms  min {min(v)*1e3:6.2f}  n={len(v)}")

if __name__ == "__main__":
    main()
