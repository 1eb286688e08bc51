"""Host-side costs of the runtime's own stage code, beyond the model forwards the cost model
prices (calibration phase "runtime").

The runtime spends real time outside the model (hand-off and batch building, log-softmax over
the vocabulary, the loss and its stats, the optimizer's per-tensor work, dispatch, rollout
bookkeeping). This phase calls the runtime's own stage functions on a one-process `Worker` with
synthetic trajectories of several sizes, subtracts what the cost model already prices, and fits
what remains into the profile's `experience_*`, `logprob_*`, `optimizer_*`, `train_*`,
`dispatch_*` and `rollout_*` terms. Which term is fitted on what, and how it is timed:
docs/calibration.md, "Design notes".

    python -m earl.calibrate.hostcost       # CPU, tiny models, a few seconds
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy
import torch
from scipy.optimize import nnls
from transformers import AutoModelForCausalLM

from earl.calibrate.host import random_checkpoint, sim_engine, sim_kv_round
from earl.calibrate.timing import host_clock, synchronize
from earl.cost_model import CostModel
from earl.cost_model.compute import param_tensors
from earl.cost_model.profile import HardwareProfile, load_profile
from earl.policies import make_dispatcher
from earl.policies.types import Sample
from earl.runtime.dist import process_group
from earl.runtime.hf_model import hf_config_from_spec
from earl.runtime.move_samples import HANDOFF_TENSORS
from earl.runtime.rollout import Trajectory, Turn
from earl.runtime.run_config import EnvConfig, ModelConfig, PolicyConfig, RunConfig, TrainerConfig
from earl.runtime.step import SampleMeta, StepContext, hand_off, play, prepare_experience, train
from earl.runtime.worker import ONE, Worker
from earl.sim.rollout_engine import Replica, TurnSyncReplica
from earl.sim.workload import Episode
from earl.specs import MODEL_CATALOG, ClusterSpec, ModelSpec, ParallelPlan, StagePlan

# (seqs, mean length, ranks) of the synthetic batches; model for the passes; optimizer depths.
# `ranks` > 1: the seqs are rank 0's share of a step of seqs x ranks episodes, and the hand-off is
# timed as that rank runs it (`hand_off` planning and checking the whole step, copying its own):
# the last two CPU cases are a rank's share of a 16-episode step on 4 and 2 ranks (long episodes),
# the per-rank sizes of the multi-process runtime, which the fit interpolated to before (its
# hand-off price at 8 episodes moved 1.3-2.0 ms over four fits back to back, 1.4-1.7 with them;
# until the thirty-second session they were timed as whole one-process steps, and the 4-rank
# runtime's hand-off ran x1.2-1.3 its price)
CASES = {
    "cpu": {"model": "tiny", "steps": ((2, 24, 1), (16, 48, 1), (16, 160, 1), (48, 64, 1), (4, 200, 4), (8, 200, 2)),
            "depths": (1, 2, 6)},
    "cuda": {"model": "qwen2.5-0.5b", "steps": ((8, 256, 1), (32, 512, 1), (16, 1024, 1), (64, 256, 1)),
             "depths": (6, 12, 24)},
}
# the model whose rollout precedes the experience stage's cold run (CPU): the calibration model's
# family widened to 17.7M parameters, 68 MiB of fp32 weights, more than a core's L2 and a VM's
# share of the last-level cache, so every decode step streams them through the caches as a larger
# model's rollout does in `earl run`. A real rollout, not a synthetic flush: streaming 64 MiB
# through a tensor priced the stage after it x1.17-1.46 on a 2-vCPU AMD EPYC VM, where after this
# rollout, as after qwen2-27m's, it ran x1.07-1.12 (docs/validate-history.md, thirty-ninth session; why
# is not measured: a decode step touches the engine's and the episodes' host state between its
# weight reads, a flush touches none of it); on the Xeon VM of sessions 29-37 the flush's x1.35
# matched the held-out runtime's
COLD_MODEL = dataclasses.replace(MODEL_CATALOG["tiny"], name="tiny-cold", num_layers=4, hidden_size=640,
                                 num_heads=10, num_kv_heads=2, head_dim=64, ffn_hidden=1792)
REPS = 6  # timed repetitions of each case (after one warm-up); rollouts alternate engine batching
GROUP = 4  # episodes per synthetic GRPO group
ROLLOUT_ENV = "tic-tac-toe"  # the environment of the replayed rollouts (the runtime's default)
TURNS = 2  # model turns per synthetic episode


@dataclass(frozen=True, kw_only=True)
class HostCostFit:
    """The fitted host costs (see the module docstring) and the points behind them."""

    experience_fixed_s: float = 0.0
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
    handoff_fixed_s: float = 0.0
    handoff_seq_s: float = 0.0
    handoff_token_s: float = 0.0
    handoff_sample_s: float = 0.0
    rollout_fixed_s: float = 0.0
    rollout_batch_s: float = 0.0
    rollout_episode_s: float = 0.0
    host_cold_factor: float = 1.0  # the experience stage after COLD_MODEL's rollout over its time after the rollout
    host_cache_bytes: float = 0.0  # the per-core (L2) cache the OS reports, 0: unknown
    host_spread: float = 0.0  # the hand-off and batch's robust spread over repetitions (`spread`)
    points: dict = field(default_factory=dict)  # part -> [{"label", "measured_s", "explained_s"}]

    def profile_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "points"}

    def quality(self) -> dict:
        return {**self.profile_fields(), "points": self.points}


def core_cache_bytes() -> int:
    """The per-core (L2) cache in bytes as the OS reports it; 0 where it does not."""
    try:
        n = os.sysconf("SC_LEVEL2_CACHE_SIZE")
        if n > 0:
            return int(n)
    except (ValueError, OSError, AttributeError):
        pass
    try:  # Linux without the glibc name: sysfs, e.g. "4096K"
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
        return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
    except (OSError, ValueError):
        return 0


def spread(times: list[float]) -> float:
    """A robust coefficient of variation of `times`: 1.4826 x their median absolute deviation
    over their median (a normal sample's standard deviation over its mean); 0 for fewer than 3."""
    if len(times) < 3:
        return 0.0
    m = statistics.median(times)
    return 1.4826 * statistics.median(abs(t - m) for t in times) / m if m > 0 else 0.0


def synthetic_trajectories(n: int, length: int, vocab: int, gen: torch.Generator):
    """`n` episodes of about `length` tokens (0.75x-1.25x), TURNS model turns each, in groups of
    GROUP, shaped like the runtime's rollouts (prompt, then generated / observation segments)."""

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


    cfg = hf_config_from_spec(spec, {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype])
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device=device, dtype=dtype)


def _nnls(rows: list[list[float]], y: list[float]) -> list[float]:

    x, _ = nnls(np.array(rows, dtype=float), np.array(y, dtype=float))
    return [float(v) for v in x]


def _timed(fn, device: torch.device) -> tuple[object, float]:
    clock = host_clock(device)
    synchronize(device)
    t = clock()
    out = fn()
    synchronize(device)
    return out, clock() - t


def span_s(sp, device: torch.device) -> float:
    """A runtime span's seconds on `host_clock`'s terms: its process's CPU seconds (`cpu_s`)
    where that clock is the process's CPU time (a one-thread CPU process: a dedicated core's
    time, whatever other tenants take), else its wall time."""
    return float(sp.args["cpu_s"]) if host_clock(device) is time.process_time else sp.duration_s


def experience_parts(spans, device: torch.device) -> tuple[float, float]:
    """(the hand-off's seconds, the log-prob span's) of one process's `prepare_experience`, read
    from its spans as `earl validate` reads the experience stage (validate.measured_stages: the
    stage's spans summed; `span_s`); its work outside them is in no stage's window, so in no price."""
    got = {sp.name: span_s(sp, device) for sp in spans if sp.stage == "experience"}
    return got["handoff"], got["logprob"]


def measure_host_costs(*, device: torch.device, dtype: torch.dtype, prof: HardwareProfile,
                       budget_s: float, on_case=None) -> HostCostFit:
    """Time the runtime's stage code on synthetic batches and fit its host costs. Each case
    replays the runtime's step order (a rollout turn, collate, log-probs, advantages,
    dispatch, training step) a few times and keeps each part's median: every part then meets
    the caches the previous stages left, as in `earl run` (timing one function in a tight loop
    finds them warm and reads ~2x low for small host-bound work)."""

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

    # 2. the runtime's own stage functions (earl.runtime.step) on a one-process worker


    with contextlib.ExitStack() as stack:  # the one-rank process group and the temp folder end here
        stack.enter_context(process_group())
        dtype_name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="earl-hostcost-"))
        path = cases["model"]
        if path not in ("tiny",):

            path = str(random_checkpoint(cases["model"], Path(tmp) / "model", dtype_name, device.type))
        run_cfg = RunConfig(model=ModelConfig(path=path, dtype=dtype_name, device=device.type),
                            trainer=TrainerConfig(lr=1e-6, token_budget=budget), env=EnvConfig(name=ROLLOUT_ENV),
                            policy=PolicyConfig(dispatcher="layout-aware"), steps=2, seed=0)
        worker = Worker(run_cfg, StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
        ctx = StepContext(selector=None, dispatcher=make_dispatcher("layout-aware"))
        host = dataclasses.replace(prof, optimizer_step_s=opt_step_s, optimizer_tensor_s=opt_tensor_s,
                                   logprob_pass_s=0.0, logprob_token_s=0.0, train_pass_s=0.0, train_token_s=0.0)
        cm = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), host)
        ro_rows, ro_y = [], []
        exp_rows, exp_y, lp_res, tr_res, disp_rows, disp_y, pass_rows = [], [], [], [], [], [], []
        hand_rows, hand_y = [], []
        lp_rows: list[list[float]] = []
        skip_old = not worker.trainer.needs_old_logprobs
        legal = ("legal_bits",) if worker.trainer.uses_legal_bits else ()  # as prepare_experience sends
        # every case's inputs first, then rounds that run each case once, the order rotated by
        # one per round (the first round warms up): each case's median then comes from the same
        # stretch of the host's time, not from a spell of its own (earl.calibrate.timing.
        # time_host_interleaved; the fits below split the cases' times into fixed parts and slopes)
        cold = None  # the cold run's rollout: COLD_MODEL's (CPU only: a GPU's decode steps stream
        if device.type == "cpu":  # its weights through the GPU's caches, not the host's)
            cold_path = random_checkpoint(COLD_MODEL, Path(tmp) / "cold", dtype_name, device.type)
            cold = Worker(dataclasses.replace(run_cfg, model=dataclasses.replace(run_cfg.model, path=str(cold_path)),
                                              groups=2, group_size=GROUP),
                          StagePlan(rollout=ONE, experience=ONE, train=ONE), rank=0, world=1)
        cold_ratios, spreads = [], []
        todo = []
        for n, length, ranks in cases["steps"]:
            trajs = synthetic_trajectories(n, length, vocab, gen)
            case = {"n": n, "trajs": trajs, "meta": {t.episode_id: SampleMeta.of(t) for t in trajs},
                    "samples": [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in trajs],
                    "width": max(len(t.token_ids) for t in trajs), "parts": {}, "ranks": ranks}
            if ranks > 1:  # rank 0's share of a step of n x ranks episodes: its episodes, every rank's samples
                step = synthetic_trajectories(n * ranks, length, vocab, gen)
                plan = ParallelPlan(dp=ranks)
                case["share"] = ([t for t in step if t.episode_id % ranks == 0],
                                 [Sample(id=t.episode_id, tokens=len(t.token_ids), group=t.group_id) for t in step],
                                 plan)
            todo.append(case)
        shares = any(c["ranks"] > 1 for c in todo)

        def one_round(wk: Worker, c: dict, rep: int) -> None:
            n, trajs, samples, meta, parts = c["n"], c["trajs"], c["samples"], c["meta"], c["parts"]
            chunk = n if rep % 2 == 0 else max(1, n // 4)  # all episodes in one engine batch, or in 4
            wk.cfg = dataclasses.replace(run_cfg, groups=n, group_size=1, engine_batch=chunk)
            (played, _), t_ro = _timed(lambda w=wk, r=rep: play(w, r + 1), device)
            t_share = None
            if "share" in c:  # right after the rollout, as rank 0 of the step runs it
                mine, every, plan = c["share"]
                _, t_share = _timed(lambda m=mine, e=every, p=plan: hand_off(
                    ctx.dispatcher, m, e, p, p, len(e), tensors=HANDOFF_TENSORS + legal, rank=0), device)
            # the stage = its two spans, as `earl validate` reads it (not prepare_experience's
            # wall: its work outside them, the weight sync's check and the mismatch's inputs,
            # ~0.15 ms of ~2.5 a step on one process, 2026-12-08, is in no stage's window). The
            # hand-off on one process waits for no one: the `handoff_*` terms (the price of any
            # hand-off that copies locally only: earl.cost_model.dispatch); with one optimizer
            # step the runtime runs no log-prob forward (its training forward stands for the old
            # policy's) and the log-prob span is batch building, the `experience_*` terms; else
            # its host work beyond the priced forward is the `logprob_*` terms'
            (store, layout, _), _ = _timed(lambda w=wk, tr=trajs, sa=samples, me=meta: prepare_experience(
                w, ctx, 1, tr, sa, me), device)
            t_hand, t_span = experience_parts(wk.spans, device)
            t_exp = t_hand + t_span
            parts.setdefault("handoff", []).append(t_hand if t_share is None else t_share)
            t_batch, t_lp = (t_span, 0.0) if skip_old else (0.0, t_span)
            # the dispatch and the training step likewise, each its own span (the batch collated
            # between them is in neither stage's window: CostModel.collate_s prices it apart)
            _timed(lambda w=wk, st=store, lay=layout, sa=samples, me=meta: train(w, ctx, 1, st, lay, sa, me), device)
            spans = {sp.name: span_s(sp, device) for sp in wk.spans}
            t_disp, t_train = spans["layout-aware"], spans["train_step"]
            wk.spans = []
            # the experience stage once more, right after a rollout of COLD_MODEL: what it costs
            # after the rollout of a model larger than the caches (host_cold_factor)
            if cold is not None:
                _, t_cold_ro = _timed(lambda r=rep: play(cold, r + 1), device)
                cold.spans = []
                parts.setdefault("rollout_cold", []).append(t_cold_ro)
                (store, layout, _), _ = _timed(lambda w=wk, tr=trajs, sa=samples, me=meta: prepare_experience(
                    w, ctx, 1, tr, sa, me), device)
                t_cold = sum(experience_parts(wk.spans, device))
                train(wk, ctx, 1, store, layout, samples, meta)  # untimed: the next rollout meets what a step leaves
                wk.spans = []
                parts.setdefault("experience_warm", []).append(t_exp)
                parts.setdefault("experience_cold", []).append(t_cold)
            key = "rollout" if chunk == n else "rollout_chunked"
            parts.setdefault(key + "_pred", []).append(_sim_rollout(cm, played, chunk, run_cfg.engine))
            for k, v in ((key, t_ro), ("experience", t_batch), ("logprob", t_lp),
                         ("dispatch", t_disp), ("train", t_train)):
                parts.setdefault(k, []).append(v)

        for rep in range(REPS + 1):  # past the deadline, stop after the warm-up and two timed rounds
            if rep >= 3 and time.perf_counter() > deadline:
                break
            for j in range(len(todo)):
                one_round(worker, todo[(rep + j) % len(todo)], rep)
        for c in todo:
            n, trajs, width, parts = c["n"], c["trajs"], c["width"], c["parts"]
            warm = ("rollout_chunked", "rollout_chunked_pred")  # first met after the warm-up round
            med = {k: statistics.median(v if k in warm else v[1:]) for k, v in parts.items()}
            # the experience stage's host work (the hand-off, the batch) rep by rep: its spread
            spreads.append(spread([a + b for a, b in zip(parts["handoff"][1:], parts["experience"][1:], strict=True)]))
            for key, batches in (("rollout", 1), ("rollout_chunked", -(-n // max(1, n // 4)))):
                # engine batches are opened only by the lockstep engine's model (rollout_batch_s)
                ro_rows.append([1.0, batches if sim_engine(run_cfg.engine) == "turn-sync" else 0.0, n])
                ro_y.append(med[key] - med[key + "_pred"])
                note("rollout", f"{ROLLOUT_ENV} n={n} engine batches={batches}", med[key], med[key + "_pred"])
            tokens = sum(len(x.token_ids) for x in trajs)
            own = c["share"][0] if "share" in c else trajs
            own_tokens = sum(len(x.token_ids) for x in own)
            # the step's episodes are a term of their own only where some case is a rank's share
            # (else they are the rank's episodes, and the split between the two is arbitrary)
            hand_rows.append([1.0, len(own), own_tokens] + ([len(own) * c["ranks"]] if shares else []))
            hand_y.append(med["handoff"])
            note("handoff", f"n={len(own)} tokens={own_tokens}" + (f" of {len(own) * c['ranks']}" if c["ranks"] > 1
                                                                     else ""), med["handoff"])
            # recorded as measured (cold) and explained (warm): their ratio is the point
            if "experience_cold" in med:
                note("experience_cold", f"n={n} tokens={tokens}", med["experience_cold"], med["experience_warm"])
                cold_ratios.append(med["experience_cold"] / max(med["experience_warm"], 1e-12))
                note("rollout_cold", f"{COLD_MODEL.name} {COLD_MODEL.num_params * spec.dtype_bytes / 2**20:.0f} MiB "
                     f"n={cold.cfg.episodes_per_step}", med["rollout_cold"])
            exp_rows.append([1.0, n, tokens])  # batch building has a fixed part: 0.4 ms at n=2 here
            exp_y.append(med["experience"])
            note("experience", f"n={n} tokens={tokens}", med["experience"])
            # padded rows: the runtime passes a padding mask, attention runs over the full square
            # the runtime's LM head runs on the generated positions only
            frac = sum(sum(x.loss_mask) for x in trajs) / max(1, tokens)
            fwd = cm.logprob(ParallelPlan(micro_batch=n), n, width, masked=True, head_frac=frac).time_s
            if skip_old:  # recorded, not fitted: its span's time is in the experience point
                note("logprob", f"{n}x{width} no forward (one optimizer step)", med["logprob"])
            else:
                lp_res.append(med["logprob"] - fwd)
                lp_rows.append([1.0, n * width])
                note("logprob", f"{n}x{width}", med["logprob"], fwd)
            pass_rows.append([1.0, n * width])
            explained = cm.train(ParallelPlan(micro_batch=n), n, width, masked=True, head_frac=frac).time_s
            tr_res.append(med["train"] - explained)
            note("train", f"{n}x{width}", med["train"], explained)
            disp_rows.append([1.0, n])
            disp_y.append(med["dispatch"])
            note("dispatch", f"n={n}", med["dispatch"])
            if on_case:
                on_case(f"step {n}x{width}")
        del worker
    exp_fixed, seq_s, token_s = _nnls(exp_rows, exp_y)
    ro_fixed, ro_batch, ro_episode = _nnls(ro_rows, ro_y)
    # no log-prob forward ran (see skip_old): the profile's terms stay
    lp_fixed, lp_token = _nnls(lp_rows, lp_res) if lp_rows else (prof.logprob_pass_s, prof.logprob_token_s)
    tr_fixed, tr_token = _nnls(pass_rows, tr_res)
    disp_fixed, disp_seq = _nnls(disp_rows, disp_y)
    hand_fixed, hand_seq, hand_token, hand_sample = (_nnls(hand_rows, hand_y) + [0.0])[:4]
    return HostCostFit(experience_fixed_s=exp_fixed, experience_seq_s=seq_s, experience_token_s=token_s,
                       logprob_pass_s=lp_fixed, logprob_token_s=lp_token, train_token_s=tr_token,
                       optimizer_step_s=opt_step_s, optimizer_tensor_s=opt_tensor_s,
                       train_pass_s=tr_fixed,
                       dispatch_fixed_s=disp_fixed, dispatch_seq_s=disp_seq, handoff_fixed_s=hand_fixed,
                       handoff_seq_s=hand_seq, handoff_token_s=hand_token, handoff_sample_s=hand_sample,
                       rollout_fixed_s=ro_fixed,
                       rollout_batch_s=ro_batch, rollout_episode_s=ro_episode,
                       host_cold_factor=round(max(0.5, statistics.median(cold_ratios)), 4) if cold_ratios else 1.0,
                       host_cache_bytes=float(core_cache_bytes()) if cold_ratios else 0.0,
                       host_spread=round(min(0.5, statistics.median(spreads)), 4) if spreads else 0.0, points=points)


def _sim_rollout(cm, trajs, engine_batch: int, engine: str = "pytorch") -> float:
    """Seconds the simulator's model of runtime engine `engine` (earl.calibrate.host.sim_engine:
    Replica for continuous batching, TurnSyncReplica for the lockstep one) gives these episodes,
    without the rollout-level terms being fitted."""


    bare = cm.with_profile(dataclasses.replace(cm.profile, rollout_fixed_s=0.0, rollout_batch_s=0.0,
                                               rollout_episode_s=0.0))
    eps = [Episode(id=t.episode_id, turns=tuple((u.obs_tokens, u.gen_tokens, u.env_latency_s) for u in t.turns))
           for t in trajs]
    env = simpy.Environment()
    model = TurnSyncReplica if sim_engine(engine) == "turn-sync" else Replica
    rep = model(env, cost_model=bare, tp=1, episodes=eps, max_num_seqs=engine_batch, kv_round=sim_kv_round(engine))
    env.run()
    return max(env.now, rep.stats.t_end)


def cases_count(device: torch.device) -> int:
    c = CASES[device.type]
    return len(c["steps"]) + len(c["depths"])


if __name__ == "__main__":

    torch.set_num_threads(1)
    fit = measure_host_costs(device=torch.device("cpu"), dtype=torch.float32,
                             prof=load_profile("cpu-measured"), budget_s=20)
    for part, pts in fit.points.items():
        for p in pts:
            print(f"{part:10s} {p['label']:24s} measured {p['measured_s'] * 1e3:8.3f} ms  "
                  f"cost model {p['explained_s'] * 1e3:8.3f} ms")
    for k, v in fit.profile_fields().items():
        print(f"{k:20s} " + {"host_cold_factor": f"x{v:.3f}", "host_cache_bytes": f"{v / 2**20:.1f} MiB",
                             "host_spread": f"{v:.3f}"}.get(
            k, f"{v * 1e6:10.2f} us"))
