"""After each model's real rollout (one process, the runtime's own episodes): prepare_experience's
wall time (as the calibration reads its cold run) and its two spans (as validate reads the stage)."""
import statistics, sys, tempfile, time
from pathlib import Path
import torch
from earl.calibrate.host import random_checkpoint
from earl.policies import make_dispatcher
from earl.policies.types import Sample
from earl.runtime.dist import process_group
from earl.runtime.run_config import EnvConfig, ModelConfig, PolicyConfig, RunConfig, TrainerConfig
from earl.runtime.step import SampleMeta, StepContext, play, prepare_experience, train
from earl.runtime.worker import ONE, Worker
from earl.specs import StagePlan

def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    env = sys.argv[2] if len(sys.argv) > 2 else "calculator"
    torch.set_num_threads(1)
    with process_group(), tempfile.TemporaryDirectory() as tmp:
        workers = {}
        for m in ("tiny", "qwen2-27m"):
            path = m if m == "tiny" else str(random_checkpoint(m, Path(tmp) / m, "fp32"))
            cfg = RunConfig(model=ModelConfig(path=path, dtype="fp32", device="cpu"),
                            trainer=TrainerConfig(lr=1e-6), env=EnvConfig(name=env),
                            policy=PolicyConfig(dispatcher="layout-aware"), groups=4, group_size=4, steps=2, seed=0)
            workers[m] = Worker(cfg, StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
        ctx = StepContext(selector=None, dispatcher=make_dispatcher("layout-aware"))
        res = {}
        for r in range(rounds + 1):
            for m, w in workers.items():
                trajs, _ = play(w, r + 1)
                w.spans = []
                samples = [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs]
                meta = {t.episode_id: SampleMeta.of(t) for t in trajs}
                t0 = time.perf_counter()
                store, layout, _ = prepare_experience(w, ctx, r + 1, trajs, samples, meta)
                dt = time.perf_counter() - t0
                sp = {s.name: s.duration_s for s in w.spans}
                train(w, ctx, r + 1, store, layout, samples, meta)
                w.spans = []
                if r:
                    for k, v in (("wall", dt), ("handoff", sp["handoff"]), ("logprob", sp["logprob"]),
                                 ("outside", dt - sp["handoff"] - sp["logprob"]),
                                 ("tokens", sum(s.tokens for s in samples))):
                        res.setdefault((m, k), []).append(v)
        for k, v in res.items():
            f = 1 if k[1] == "tokens" else 1e3
            print(f"{k[0]:10s} {k[1]:8s} median {statistics.median(v)*f:8.3f}  min {min(v)*f:8.3f}  n={len(v)}")

if __name__ == "__main__":
    main()
