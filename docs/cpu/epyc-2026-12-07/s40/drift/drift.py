# Which probe follows the host's speed for the runtime's rollout on this VM? One process, every
# ~1.5 s: a tiny-model rollout (the runtime's `play`, tic-tac-toe, 16 episodes, the calculator
# run's size), the shipped host probe (earl.runtime.hostprobe: L2-resident eager GEMMs, thread CPU),
# an L3-sized sweep (sum over 24 MiB, wall), a pure-Python loop (wall), the probe's wall time.
import sys, time, json, statistics, contextlib
import torch
torch.set_num_threads(1)
from earl.runtime.run_config import RunConfig, ModelConfig, TrainerConfig, EnvConfig, PolicyConfig
from earl.runtime.worker import Worker
from earl.runtime.step import play
from earl.specs import StagePlan
from earl.runtime.worker import ONE
from earl.runtime.hostprobe import HostProbe
from earl.runtime.dist import process_group

mins = float(sys.argv[1]); out = open(sys.argv[2], "w")
with process_group():
    cfg = RunConfig(model=ModelConfig(path="tiny", dtype="fp32", device="cpu"), trainer=TrainerConfig(lr=1e-6),
                    env=EnvConfig(name="calculator"), policy=PolicyConfig(dispatcher="layout-aware"), steps=2, seed=0,
                    groups=4, group_size=4)
    w = Worker(cfg, StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
    probe = HostProbe()
    big = torch.ones(6 << 20)  # 24 MiB
    def l3():
        t = time.perf_counter()
        for _ in range(4):
            big.sum()
        return (time.perf_counter() - t) / 4
    def py():
        t = time.perf_counter(); s = 0
        for i in range(200000):
            s += i * i
        return time.perf_counter() - t
    def probe_wall():
        t = time.perf_counter(); c = probe.time(); return c, time.perf_counter() - t
    play(w, 1)
    end = time.time() + mins * 60; i = 0
    while time.time() < end:
        i += 1
        t = time.perf_counter(); tr, _ = play(w, 1); ro = time.perf_counter() - t; ntok = sum(len(x.token_ids) for x in tr)
        c, pw = probe_wall()
        rec = {"t": time.time(), "rollout": ro, "tokens": ntok, "probe_cpu": c, "probe_wall": pw, "l3": l3(), "py": py()}
        out.write(json.dumps(rec) + "\n"); out.flush()
        time.sleep(1.0)
