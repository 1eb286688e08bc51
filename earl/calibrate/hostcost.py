"""Host-side costs of the runtime's own stage code, beyond the model forwards the cost model
prices (calibration phase "runtime").

The single-process runtime spends real time outside the model: collating trajectories into
padded tensors and computing advantages (experience), slicing each micro-batch and taking
log-softmax/gather over the vocabulary (log-prob passes), the loss, its backward and the stats
of each training micro-batch, the optimizer's per-step and per-parameter-tensor work (zero_grad,
gradient clipping, AdamW), and planning plus executing a dispatch. This phase calls those very
functions (`earl.runtime.trainer.collate`, `batch_logprobs`, `Trainer.step`,
`earl.runtime.loop.Policies.dispatch`) on synthetic trajectories of several sizes, subtracts
what the cost model already prices (forwards, optimizer bytes), and fits what remains:

  experience_seq_s, experience_token_s   collate + advantages ~ seqs, tokens (>= 0 least squares)
  logprob_pass_s, logprob_token_s        residual of a log-prob micro-batch ~ 1, padded tokens
  optimizer_step_s, optimizer_tensor_s   clip + AdamW step ~ 1, parameter tensors (3 model depths)
  train_pass_s, train_token_s            residual of a training micro-batch ~ 1, padded tokens
  dispatch_fixed_s, dispatch_seq_s       Policies.dispatch ~ 1, samples
  rollout_fixed_s, rollout_batch_s,      `rollout` (real env, real engine; all episodes in one
  rollout_episode_s                      engine batch or in 4) less the simulator's engine model
                                         of the same episodes ~ 1, engine batches, episodes: env
                                         set-up, tokenising, trajectory bookkeeping, and the
                                         first forward after the other stages (cold caches)

Timing: each part of a replayed step on `earl.calibrate.timing.host_clock` (CPU: the process's
CPU time with one thread; CUDA: synchronised host wall time, since these are host-bound mixes
of Python and kernels), in the runtime's order so caches are as the runtime leaves them.

    python -m earl.calibrate.hostcost       # CPU, tiny models, a few seconds
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from earl.calibrate.timing import host_clock, synchronize
from earl.cost_model.compute import param_tensors
from earl.cost_model.profile import HardwareProfile
from earl.specs import MODEL_CATALOG, ModelSpec

# (seqs, mean length) of the synthetic batches; model for the passes; optimizer depths
CASES = {
    "cpu": {"model": "tiny", "steps": ((2, 24), (16, 48), (16, 160), (48, 64)), "depths": (1, 2, 6)},
    "cuda": {"model": "qwen2.5-0.5b", "steps": ((8, 256), (32, 512), (16, 1024), (64, 256)),
             "depths": (6, 12, 24)},
}
REPS = 6  # timed repetitions of each case (after one warm-up); rollouts alternate engine batching
GROUP = 4  # episodes per synthetic GRPO group
ROLLOUT_ENV = "tic-tac-toe"  # the environment of the replayed rollouts (the runtime's default)
TURNS = 2  # model turns per synthetic episode


@dataclass(frozen=True, kw_only=True)
class HostCostFit:
    """The fitted host costs (see the module docstring) and the points behind them."""

    experience_seq_s: float = 0.0
    experience_token_s: float = 0.0
    logprob_pass_s: float = 0.0
    logprob_token_s: float = 0.0
    optimizer_step_s: float = 0.0
    optimizer_tensor_s: float = 0.0
    train_pass_s: float = 0.0
    train_token_s: float = 0.0
    dispatch_fixed_s: float = 0.0
    dispatch_seq_s: float = 0.0
    rollout_fixed_s: float = 0.0
    rollout_batch_s: float = 0.0
    rollout_episode_s: float = 0.0
    points: dict = field(default_factory=dict)  # part -> [{"label", "measured_s", "explained_s"}]

    def profile_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "points"}

    def quality(self) -> dict:
        return {**self.profile_fields(), "points": self.points}


def synthetic_trajectories(n: int, length: int, vocab: int, gen: torch.Generator):
    """`n` episodes of about `length` tokens (0.75x-1.25x), TURNS model turns each, in groups of
    GROUP, shaped like the runtime's rollouts (prompt, then generated / observation segments)."""
    from earl.runtime.rollout import Trajectory, Turn

    out = []
    lengths = (length * (0.75 + 0.5 * torch.rand(n, generator=gen))).long().clamp(min=4 * TURNS).tolist()
    for i, total in enumerate(lengths):
        t = Trajectory(episode_id=i, group_id=i // GROUP)
        seg = total // (2 * TURNS)
        obs = total - 2 * TURNS * seg + seg  # the prompt takes the rounding
        for _ in range(TURNS):
            ids = torch.randint(3, vocab, (obs + seg,), generator=gen).tolist()
            t._append(ids[:obs], generated=False)
            t._append(ids[obs:], generated=True, logprobs=(-torch.rand(seg, generator=gen)).tolist())
            r = float(torch.rand((), generator=gen))
            t.step_rewards.append((len(t.token_ids) - 1, r))
            t.reward += r
            t.turns.append(Turn(obs, seg, 0.0))
            obs = seg
        out.append(t)
    return out


def _model(spec: ModelSpec, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from earl.runtime.model import hf_config_from_spec

    cfg = hf_config_from_spec(spec, {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype])
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device=device, dtype=dtype)


def _nnls(rows: list[list[float]], y: list[float]) -> list[float]:
    from scipy.optimize import nnls

    x, _ = nnls(np.array(rows, dtype=float), np.array(y, dtype=float))
    return [float(v) for v in x]


def _timed(fn, device: torch.device) -> tuple[object, float]:
    clock = host_clock(device)
    synchronize(device)
    t = clock()
    out = fn()
    synchronize(device)
    return out, clock() - t


def measure_host_costs(*, device: torch.device, dtype: torch.dtype, prof: HardwareProfile,
                       budget_s: float, on_case=None) -> HostCostFit:
    """Time the runtime's stage code on synthetic batches and fit its host costs. Each case
    replays the runtime's step order (a rollout turn, collate, log-probs, advantages,
    dispatch, training step) a few times and keeps each part's median: every part then meets
    the caches the previous stages left, as in `earl run` (timing one function in a tight loop
    finds them warm and reads ~2x low for small host-bound work)."""
    from earl.cost_model import CostModel
    from earl.runtime.config import RunConfig, TrainerConfig
    from earl.runtime.engine import SamplingParams, TorchEngine
    from earl.runtime.envs import ENVS, make_env
    from earl.runtime.loop import Policies
    from earl.runtime.rollout import rollout
    from earl.runtime.tokenizer import CharTokenizer
    from earl.runtime.trainer import Trainer, batch_logprobs, collate, grpo_advantages
    from earl.specs import ClusterSpec, ParallelPlan

    cases = CASES[device.type]
    deadline = time.perf_counter() + budget_s
    spec = dataclasses.replace(MODEL_CATALOG[cases["model"]],
                               dtype={torch.float32: "fp32"}.get(dtype, "bf16"))
    vocab = min(spec.vocab_size, 64)
    gen = torch.Generator().manual_seed(0)
    budget = 1 << 30  # one micro-batch per pass
    points: dict[str, list] = {}

    def note(part: str, label: str, measured: float, explained: float = 0.0) -> None:
        points.setdefault(part, []).append({"label": label, "measured_s": measured, "explained_s": explained})

    # 1. optimizer: clip + AdamW step right after a backward, models of several depths
    rows, ys = [], []
    for depth in cases["depths"]:
        if time.perf_counter() > deadline and len(ys) >= 2:
            continue
        s = dataclasses.replace(spec, num_layers=depth)
        model = _model(s, device, dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.99))
        ids = torch.randint(3, vocab, (4, 32), device=device)
        times = []
        for _ in range(REPS + 1):
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids).logits.float().mean().backward()
            params = [p for p in model.parameters() if p.grad is not None]
            times.append(_timed(lambda p=params, o=opt: (torch.nn.utils.clip_grad_norm_(p, 1.0), o.step()),
                                device)[1])
        t = statistics.median(times[1:])
        bare = dataclasses.replace(prof, optimizer_step_s=0.0, optimizer_tensor_s=0.0, train_pass_s=0.0)
        est = CostModel(s, ClusterSpec.for_gpus(prof.hardware, 1), bare).train(ParallelPlan(), 1, 16)
        n_t = param_tensors(s)
        rows.append([1.0, n_t])
        ys.append(t - est.breakdown["optimizer"])
        note("optimizer", f"layers={depth} tensors={n_t}", t, est.breakdown["optimizer"])
        if on_case:
            on_case(f"optimizer layers={depth}")
        del model, opt
    opt_step_s, opt_tensor_s = _nnls(rows, ys)

    # 2. the stage sequence of one step, on the catalog model
    model = _model(spec, device, dtype)
    host = dataclasses.replace(prof, optimizer_step_s=opt_step_s, optimizer_tensor_s=opt_tensor_s,
                               logprob_pass_s=0.0, logprob_token_s=0.0, train_pass_s=0.0, train_token_s=0.0)
    cm = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), host)
    engine = TorchEngine(model, CharTokenizer())
    env_cls = ENVS[ROLLOUT_ENV]
    play = SamplingParams(temperature=1.0, max_new_tokens=env_cls.max_new_tokens, stop=tuple(env_cls.stop))
    ro_rows, ro_y = [], []
    sampler = torch.Generator(device=device).manual_seed(0)  # the engine samples on the device
    pol = Policies(RunConfig(), spec)
    exp_rows, exp_y, lp_res, tr_res, disp_rows, disp_y, pass_rows = [], [], [], [], [], [], []
    for n, length in cases["steps"]:
        if time.perf_counter() > deadline and len(tr_res) >= 2:
            if on_case:
                on_case(None)
            continue
        trajs = synthetic_trajectories(n, length, vocab, gen)
        trainer = Trainer(model, TrainerConfig(lr=1e-6, token_budget=budget), temperature=1.0)
        parts: dict[str, list[float]] = {}
        for rep in range(REPS + 1):  # the first round warms up
            seeds = list(range(n))
            chunk = n if rep % 2 == 0 else max(1, n // 4)  # all episodes in one engine batch, or in 4
            played, t_ro = _timed(lambda e=engine, sd=seeds, c=chunk: rollout(
                e, lambda: make_env(ROLLOUT_ENV), seeds=sd, group_ids=sd, params=play, generator=sampler,
                max_context=1 << 20, engine_batch=c), device)
            batch, t_collate = _timed(lambda tr=trajs: collate(tr, 0), torch.device("cpu"))
            with torch.no_grad():
                old, t_lp = _timed(lambda b=batch, m=model: batch_logprobs(m, b, 1.0, budget), device)
            adv, t_adv = _timed(lambda b=batch: grpo_advantages(b.rewards, b.group_ids)[:, None] * b.loss_mask,
                                torch.device("cpu"))
            batch = dataclasses.replace(batch, old_logprobs=old, advantages=adv)
            batch, t_disp = _timed(lambda b=batch: pol.dispatch(b)[0], torch.device("cpu"))
            _, t_train = _timed(lambda b=batch, tr=trainer: tr.step(b), device)
            key = "rollout" if chunk == n else "rollout_chunked"
            parts.setdefault(key + "_pred", []).append(_sim_rollout(cm, played, chunk))
            for k, v in ((key, t_ro), ("experience", t_collate + t_adv), ("logprob", t_lp), ("dispatch", t_disp),
                         ("train", t_train)):
                parts.setdefault(k, []).append(v)
        warm = ("rollout_chunked", "rollout_chunked_pred")  # first met after the warm-up round
        med = {k: statistics.median(v if k in warm else v[1:]) for k, v in parts.items()}
        width = batch.input_ids.shape[1]
        for key, batches in (("rollout", 1), ("rollout_chunked", -(-n // max(1, n // 4)))):
            ro_rows.append([1.0, batches, n])
            ro_y.append(med[key] - med[key + "_pred"])
            note("rollout", f"{ROLLOUT_ENV} n={n} engine batches={batches}", med[key], med[key + "_pred"])
        tokens = sum(len(x.token_ids) for x in trajs)
        exp_rows.append([n, tokens])
        exp_y.append(med["experience"])
        note("experience", f"n={n} tokens={tokens}", med["experience"])
        # padded rows: the runtime passes a padding mask, attention runs over the full square
        fwd = cm.logprob(ParallelPlan(micro_batch=n), n, width, masked=True).time_s
        lp_res.append(med["logprob"] - fwd)
        pass_rows.append([1.0, n * width])
        note("logprob", f"{n}x{width}", med["logprob"], fwd)
        explained = cm.train(ParallelPlan(micro_batch=n), n, width, masked=True).time_s
        tr_res.append(med["train"] - explained)
        note("train", f"{n}x{width}", med["train"], explained)
        disp_rows.append([1.0, n])
        disp_y.append(med["dispatch"])
        note("dispatch", f"n={n}", med["dispatch"])
        if on_case:
            on_case(f"step {n}x{width}")
    del model, engine
    seq_s, token_s = _nnls(exp_rows, exp_y)
    ro_fixed, ro_batch, ro_episode = _nnls(ro_rows, ro_y)
    lp_fixed, lp_token = _nnls(pass_rows, lp_res)
    tr_fixed, tr_token = _nnls(pass_rows, tr_res)
    disp_fixed, disp_seq = _nnls(disp_rows, disp_y)
    return HostCostFit(experience_seq_s=seq_s, experience_token_s=token_s,
                       logprob_pass_s=lp_fixed, logprob_token_s=lp_token, train_token_s=tr_token,
                       optimizer_step_s=opt_step_s, optimizer_tensor_s=opt_tensor_s,
                       train_pass_s=tr_fixed,
                       dispatch_fixed_s=disp_fixed, dispatch_seq_s=disp_seq, rollout_fixed_s=ro_fixed,
                       rollout_batch_s=ro_batch, rollout_episode_s=ro_episode, points=points)


def _sim_rollout(cm, trajs, engine_batch: int) -> float:
    """Seconds the simulator's model of the runtime engine (TurnSyncReplica) gives these
    episodes, without the rollout-level terms being fitted."""
    import simpy

    from earl.sim.engine import TurnSyncReplica
    from earl.sim.workload import Episode

    bare = cm.with_profile(dataclasses.replace(cm.profile, rollout_fixed_s=0.0, rollout_batch_s=0.0,
                                               rollout_episode_s=0.0))
    eps = [Episode(id=t.episode_id, turns=tuple((u.obs_tokens, u.gen_tokens, u.env_latency_s) for u in t.turns))
           for t in trajs]
    env = simpy.Environment()
    TurnSyncReplica(env, cost_model=bare, tp=1, episodes=eps, max_num_seqs=engine_batch)
    env.run()
    return env.now


def cases_count(device: torch.device) -> int:
    c = CASES[device.type]
    return len(c["steps"]) + len(c["depths"])


if __name__ == "__main__":
    from earl.cost_model.profile import load_profile

    torch.set_num_threads(1)
    fit = measure_host_costs(device=torch.device("cpu"), dtype=torch.float32,
                             prof=load_profile("cpu-measured"), budget_s=20)
    for part, pts in fit.points.items():
        for p in pts:
            print(f"{part:10s} {p['label']:24s} measured {p['measured_s'] * 1e3:8.3f} ms  "
                  f"cost model {p['explained_s'] * 1e3:8.3f} ms")
    for k, v in fit.profile_fields().items():
        print(f"{k:20s} {v * 1e6:10.2f} us")
