"""CostModel: prices every stage of an agentic RL iteration in time and memory.

One object per (model, cluster, profile). Stage estimates return an `Estimate` (time, memory,
feasibility, per-component breakdown); the O(1) hooks (`prefill_time_s`, `decode_step_time_s`,
`kv_capacity_tokens`, `transfer_time_s`) are what the simulator calls on its hot path.

    earl estimate decode --model qwen2.5-7b --hardware h100-sxm-80gb --gpus 8 --tp 2 --batch 256 --context 4096
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

from earl.cost_model import comm, memory
from earl.cost_model.compute import PassCost, causal_pairs, forward_pass, param_tensors, train_flops_per_token
from earl.cost_model.memory import MemoryBreakdown
from earl.cost_model.profile import HardwareProfile, LinkParams, datasheet_profile
from earl.parallel import model_slice, validate_plan
from earl.specs import PRICED_STAGES, ClusterSpec, ModelSpec, ParallelPlan

FSDP_SHARD_BYTES = 4  # bytes per parameter of the fp32 shards FSDP2 keeps (and gathers)
# a rank's fp32 shard bytes gathered by one all-gather of the weight sync (earl.runtime.optim.
# sync_buckets: consecutive tensors, a larger one alone). One gather per tensor made the sync
# latency-bound; on gloo (benchmarks/bench_weight_sync.py, 2-core host, 2026-12-02) 4 MiB
# buckets were 9-11x faster than per tensor on the tiny model (one bucket) and 1.5-2.6x on
# qwen2-27m at 2-4 ranks, where 32-128 MiB buckets gained less (0.9-2.0x)
SYNC_BUCKET_BYTES = 4 * 2**20
# small all-reduces over dp per optimizer step of the runtime's FSDP2 training step
# (earl.runtime.trainer.train_step, Trainer.backward, FSDPAdamW.grad_norm): the loss-token count,
# the lockstep micro-batch count, the gradient norm and the loss statistics (+1 over tp for the
# gradient norm when tp > 1)
FSDP_STEP_ALLREDUCES = 4
SCALAR_BYTES = 16  # bytes of one of those all-reduces (a few fp64 scalars)
# decode stretches per cohort of equal sequences in `CostModel.rollout` (each priced at its
# mid-stretch KV; 64 keeps the integral within ~0.1% of a per-token sum on the s3 grid)
ROLLOUT_SEGMENTS = 64

STAGES = PRICED_STAGES  # re-exported as earl.cost_model.STAGES


@dataclass
class Estimate:
    """The cost of one stage on the whole cluster slice it runs on."""

    stage: str
    time_s: float  # wall time of the stage
    feasible: bool
    reason: str = ""  # why infeasible (or a note, e.g. reduced decode concurrency)
    tokens: float = 0.0  # tokens processed (0 where tokens make no sense)
    gpus: int = 1  # GPUs the stage occupies
    flops: float = 0.0  # model FLOPs per GPU
    peak_flops: float = 0.0  # datasheet peak per GPU (for MFU)
    memory: MemoryBreakdown | None = None
    breakdown: dict = field(default_factory=dict)  # component -> seconds
    extras: dict = field(default_factory=dict)
    plan: ParallelPlan | None = None

    @property
    def tokens_per_gpu_s(self) -> float:
        return self.tokens / self.time_s / self.gpus if self.time_s > 0 and self.feasible else 0.0

    @property
    def tflops_per_gpu(self) -> float:
        return self.flops / self.time_s / 1e12 if self.time_s > 0 else 0.0

    @property
    def mfu(self) -> float:
        return self.flops / self.time_s / self.peak_flops if self.time_s > 0 and self.peak_flops else 0.0

    def to_dict(self) -> dict:
        return {
            "stage": self.stage, "plan": self.plan.describe() if self.plan else None,
            "time_s": self.time_s, "feasible": self.feasible, "reason": self.reason,
            "tokens": self.tokens, "gpus": self.gpus, "tokens_per_gpu_s": self.tokens_per_gpu_s,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
            "memory_per_gpu_bytes": self.memory.total if self.memory else 0.0,
            "memory": self.memory.to_dict() if self.memory else None,
            "breakdown": dict(self.breakdown), "extras": dict(self.extras),
        }


def runs_fsdp2(plan: ParallelPlan, fsdp: bool) -> bool:
    """Whether a training plan is priced as the PyTorch runtime's FSDP2 path: asked for (`fsdp`)
    and a `zero` plan with dp > 1, as earl.runtime.parallelize.uses_fsdp decides (the cost
    model stays free of torch)."""
    return fsdp and plan.sharded_optimizer and plan.dp > 1


def _infeasible(stage: str, plan: ParallelPlan, mem: MemoryBreakdown, gpus: int, what: str) -> Estimate:
    gib = 2**30
    reason = (f"{what}: needs {mem.total / gib:.1f} GiB per GPU > {mem.capacity / gib:.1f} GiB "
              f"(largest: {mem.overflow_component} {getattr(mem, mem.overflow_component) / gib:.1f} GiB)")
    return Estimate(stage=stage, time_s=math.inf, feasible=False, reason=reason, gpus=gpus,
                    memory=mem, plan=plan)


class CostModel:
    """Analytical time / memory model of one model on one cluster."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, profile: HardwareProfile | None = None,
                 *, flash_attention: bool = True, precision: memory.TrainPrecision = memory.MIXED_PRECISION):
        self.model = model
        self.precision = precision  # the training memory layout priced (earl.cost_model.memory)
        self.cluster = cluster
        self.profile = profile or datasheet_profile(cluster.hardware)
        self.flash_attention = flash_attention
        hw = self.profile.hardware
        self.capacity = hw.hbm_bytes
        self.reserve = memory.reserve_bytes(hw.hbm_bytes, self.profile.mem_reserve_frac,
                                            self.profile.mem_reserve_bytes)
        # hot-path caches (the simulator calls these per event)
        self.prefill_time_s = lru_cache(maxsize=65536)(self._prefill_time_s)
        self.mixed_step_time_s = lru_cache(maxsize=65536)(self._mixed_step_time_s)
        self.kv_capacity_tokens = lru_cache(maxsize=256)(self._kv_capacity_tokens)

    def with_profile(self, profile: HardwareProfile) -> CostModel:
        return CostModel(self.model, self.cluster, profile, flash_attention=self.flash_attention,
                         precision=self.precision)

    def host_cold_factor(self, plan: ParallelPlan) -> float:
        """The multiplier on host work that follows a rollout under `plan` (the hand-off, the
        experience batch): the profile's `host_cold_factor` where a rank's share of the weights,
        streamed by every decode step, exceeds its `host_cache_bytes`, else 1."""
        prof = self.profile
        if prof.host_cold_factor == 1.0 or prof.host_cache_bytes <= 0:
            return 1.0
        weights = self.model.num_params * self.model.dtype_bytes / max(1, plan.tp * plan.pp)
        return prof.host_cold_factor if weights > prof.host_cache_bytes else 1.0

    def slowest_of(self, ranks: int) -> float:
        """The multiplier on host work each of `ranks` ranks does for itself where the stage
        ends with the slowest (the hand-off, the experience batch): 1 + the profile's
        `host_spread` x the expected largest of `ranks` standard normal draws (0 at one rank)."""
        spread = self.profile.host_spread
        return 1.0 + spread * expected_max_normal(ranks) if spread and ranks > 1 else 1.0

    def collate_s(self, seqs: float, tokens: float) -> float:
        """Host seconds one rank spends collating `seqs` sequences of `tokens` tokens in all into
        its padded batch (earl.runtime.step.padded_batch): the profile's `experience_*` terms,
        which `earl calibrate` fits on the experience stage's batch building (0 on datasheets)."""
        prof = self.profile
        return prof.experience_fixed_s + prof.experience_seq_s * seqs + prof.experience_token_s * tokens

    def dispatch_lead_s(self, plan: ParallelPlan, seqs: int, tokens: float, fsdp: bool = False) -> float:
        """Host seconds each rank does after it leaves the training dispatch of `seqs` sequences
        (`tokens` in all) to `plan`, before its training step's first collective: it collates its
        share into its padded batch (`collate_s`; earl.runtime.step.train, outside every stage's
        span) and starts the step (`train_lead_s`). The `lead_s` of the dispatch's price: where
        ranks outnumber cores, the ranks that leave first spend it on the cores the last one
        still needs (earl.cost_model.dispatch, `leavers`)."""
        return self.collate_s(math.ceil(seqs / plan.dp), tokens / plan.dp) + self.train_lead_s(plan, fsdp)

    def train_lead_s(self, plan: ParallelPlan, fsdp: bool = False) -> float:
        """Host seconds a rank spends in an FSDP2 training step under `plan` before the step's
        first collective (earl.runtime.trainer.train_step: the learning rate, the mini-batch
        order, `zero_grad` over the rank's parameter tensors, then the dp all-reduce of the
        token counts): the profile's `train_lead_s` + `train_lead_tensor_s` per tensor. 0 where
        the plan does not run as FSDP2 (`fsdp` and a `zero` plan with dp > 1, as `train`
        prices it) or the profile never measured it. What the ranks that leave a runtime
        dispatch first do on the cores the last one still needs (earl.cost_model.dispatch)."""
        prof = self.profile
        if not runs_fsdp2(plan, fsdp):
            return 0.0
        return prof.train_lead_s + prof.train_lead_tensor_s * math.ceil(param_tensors(self.model) / plan.pp)

    # ---- links ------------------------------------------------------------------------------
    def link_of(self, src: int, dst: int) -> str:
        if src == dst:
            return "local"
        g = self.cluster.gpus_per_node
        return "intra" if src // g == dst // g else "inter"

    def link_params(self, kind: str, sharing: int = 1) -> LinkParams:
        if kind == "intra":
            return self.profile.intra
        return comm.inter_node_link(self.cluster, sharing)

    def transfer_time_s(self, nbytes: float, src_rank: int, dst_rank: int) -> float:
        kind = self.link_of(src_rank, dst_rank)
        return 0.0 if kind == "local" else comm.p2p_s(nbytes, self.link_params(kind))

    def _tp_link(self, tp: int) -> LinkParams:
        return comm.group_link(self.cluster, self.profile, tp, 1, collective="allreduce")

    # ---- O(1) hooks for the simulator ---------------------------------------------------
    def _prefill_pass(self, tp: int, new_tokens: float, prefix_tokens: float, num_seqs: float,
                      masked: bool = False) -> tuple[PassCost, float, float]:
        """(forward cost, TP communication s, engine host s) of one replica's prefill."""
        n, pre = new_tokens / num_seqs, prefix_tokens / num_seqs
        pairs = n * (pre + n) if masked else causal_pairs(n, pre)
        cost = forward_pass(self.model, self.profile, tp=tp, layers=self.model.num_layers,
                            tokens=new_tokens, attn_pairs=num_seqs * pairs,
                            kv_tokens=prefix_tokens + new_tokens, lm_tokens=num_seqs)
        return cost, self._tp_comm_s(tp, new_tokens, passes=1), self._engine_host_s(num_seqs, prefix_tokens
                                                                                       + new_tokens)

    def _decode_pass(self, tp: int, num_seqs: float, total_context_tokens: float) -> tuple[PassCost, float, float]:
        """(forward cost, TP communication s, engine host s) of one replica's decode iteration."""
        cost = forward_pass(self.model, self.profile, tp=tp, layers=self.model.num_layers,
                            tokens=num_seqs, attn_pairs=total_context_tokens,
                            kv_tokens=total_context_tokens, lm_tokens=num_seqs, decode=True)
        return cost, self._tp_comm_s(tp, num_seqs, passes=1), self._engine_host_s(num_seqs, total_context_tokens)

    def _prefill_time_s(self, tp: int, new_tokens: int, prefix_tokens: int = 0, num_seqs: int = 1,
                        masked: bool = False) -> float:
        """One replica prefilling `new_tokens` (total over `num_seqs` equal sequences) on top of
        `prefix_tokens` already cached (total over the same sequences). `masked`: the engine
        passes an explicit (padding) mask, so attention covers the full new x (prefix + new)
        rectangle instead of skipping the causal upper triangle."""
        if new_tokens <= 0:
            return 0.0
        cost, tp_s, host_s = self._prefill_pass(tp, new_tokens, prefix_tokens, num_seqs, masked)
        return cost.total_s + tp_s + host_s

    def _mixed_step_time_s(self, tp: int, new_tokens: int, new_seqs: int, new_pairs: float, new_kv_tokens: int,
                           dec_seqs: int, dec_context: float) -> float:
        """One engine forward that prefills `new_tokens` (over `new_seqs` admitted turns, with
        `new_pairs` attention pairs and `new_kv_tokens` cached positions after it) and decodes one
        token of each of `dec_seqs` running sequences (total context `dec_context`), every row
        sampling a token: a continuous-batching engine's mixed step (vLLM's chunked-prefill batches
        (Agrawal et al., Sarathi-Serve, OSDI 2024); the runtime engine's `_forward_mixed`). The
        weights are read once for all rows, and the engine's host work is one step's plus, per
        admitted turn, `turn_seq_overhead_s` (its own attention segment, masks, inputs) and
        `turn_overhead_s` once (both fitted on the runtime engine's turns; 0 on datasheets)."""
        tokens = new_tokens + dec_seqs
        if tokens <= 0:
            return 0.0
        prof = self.profile
        cost = forward_pass(self.model, prof, tp=tp, layers=self.model.num_layers, tokens=tokens,
                            attn_pairs=new_pairs + dec_context, kv_tokens=new_kv_tokens + dec_context,
                            lm_tokens=new_seqs + dec_seqs)
        host = self._engine_host_s(new_seqs + dec_seqs, new_kv_tokens + dec_context)
        if new_seqs:
            host += prof.turn_overhead_s + prof.turn_seq_overhead_s * new_seqs
        return cost.total_s + self._tp_comm_s(tp, tokens, passes=1) + host

    def _engine_host_s(self, num_seqs: float, cached_tokens: float) -> float:
        """Seconds of one engine iteration (a prefill or a decode forward, each followed by
        sampling) beyond the forward: fixed, per sequence, and per cached token (an engine
        that grows its KV cache by concatenation copies it every step); calibrated on the
        runtime's own engine, 0 on datasheets."""
        prof = self.profile
        return prof.step_overhead_s + prof.step_seq_overhead_s * num_seqs + prof.step_kv_token_s * cached_tokens

    def decode_step_time_s(self, tp: int, num_seqs: int, total_context_tokens: float) -> float:
        """One decode iteration of one replica: every running sequence gains one token."""
        if num_seqs <= 0:
            return 0.0
        cost, tp_s, host_s = self._decode_pass(tp, num_seqs, total_context_tokens)
        return cost.total_s + tp_s + host_s

    def _kv_capacity_tokens(self, tp: int, pp: int = 1) -> int:
        """KV-cache tokens one replica (tp x pp GPUs) can hold after weights and reserve."""
        plan = ParallelPlan(tp=tp, pp=pp)
        weights = memory.params_per_gpu(self.model, plan) * memory.WEIGHT_BYTES
        free = self.capacity - self.reserve - weights
        return max(0, int(free // memory.kv_bytes_per_token_per_gpu(self.model, tp, pp)))

    def _tp_comm_s(self, tp: int, tokens: float, passes: int) -> float:
        """Two all-reduces of the hidden state per layer per pass (Megatron TP)."""
        if tp <= 1:
            return 0.0
        nbytes = tokens * self.model.hidden_size * self.model.dtype_bytes
        # a tensor-parallel group inside one GPU node shares its NVSwitch (not so on a CPU host)
        switched = tp <= self.cluster.gpus_per_node and self.profile.hardware.name != "cpu"
        return 2 * passes * self.model.num_layers * comm.allreduce_s(nbytes, tp, self._tp_link(tp), switched)

    # ---- stage estimates --------------------------------------------------------------------
    def estimate(self, stage: str, plan: ParallelPlan, batch: int, context: int, **kw) -> Estimate:
        if stage not in STAGES[:4]:
            raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(STAGES[:4])}")
        return getattr(self, stage)(plan, batch, context, **kw)

    def _check(self, plan: ParallelPlan, batch: int, context: int) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1 sequence, got {batch}")
        if context < 1:
            raise ValueError(f"context must be >= 1 token, got {context}")
        validate_plan(plan, self.model)

    def memory(self, stage: str, plan: ParallelPlan, batch: int, context: int) -> MemoryBreakdown:
        cap, res = self.capacity, self.reserve
        if stage == "train":
            return memory.train_memory(self.model, plan, context, cap, res, self.flash_attention,
                                       precision=self.precision)
        if stage == "logprob":
            return memory.forward_memory(self.model, plan, context, cap, res)
        if stage in ("prefill", "decode"):
            per_replica = -(-batch // plan.dp)
            return memory.inference_memory(self.model, plan, per_replica, context, cap, res)
        raise ValueError(f"no memory model for stage {stage!r}; valid: prefill, decode, logprob, train")

    def prefill(self, plan: ParallelPlan, batch: int, context: int) -> Estimate:
        """`batch` sequences of `context` prompt tokens, spread over plan.dp replicas."""
        self._check(plan, batch, context)
        gpus = plan.world_size
        per = -(-batch // plan.dp)
        fit = min(per, self.kv_capacity_tokens(plan.tp, plan.pp) // context)
        mem = self.memory("prefill", plan, max(fit, 1) * plan.dp, context)
        if fit < 1:
            return _infeasible("prefill", plan, mem, gpus, f"one sequence of {context} tokens")
        waves = -(-per // fit)
        cost, tp_s, host_s = self._prefill_pass(plan.tp, fit * context, 0, fit)
        t = waves * (cost.total_s + tp_s + host_s)
        return Estimate(stage="prefill", time_s=t, feasible=True, tokens=batch * context, gpus=gpus,
                        flops=waves * cost.flops * plan.dp * plan.tp / gpus,
                        peak_flops=self.profile.hardware.peak_flops, memory=mem, plan=plan,
                        breakdown=self._breakdown(cost, waves, tp_s, host_s),
                        extras={"concurrency": fit, "waves": waves})

    def decode(self, plan: ParallelPlan, batch: int, context: int) -> Estimate:
        """One decode iteration for `batch` sequences of `context` tokens each, over plan.dp
        replicas: `time_s` covers all of them advancing one token.

        Status (extras["status"]): "fits" when every sequence's KV fits; "preempting" when only
        `fit` of a replica's `per` sequences fit: the engine runs `fit` at a time (continuous
        batching, per/fit iterations) and, like vLLM's recompute preemption (the simulator's
        engine, earl.sim.rollout_engine), the KV its running sequences add each iteration (`fit`
        tokens) must be freed by preempting a sequence whose `context` tokens are prefilled
        again when it returns: (fit / context) recomputed sequences per iteration (an upper
        bound: a sequence finishing frees room without a preemption); "cannot run" (infeasible)
        when not one sequence fits. The KV room is what the engine's explicit reserve leaves
        (extras["engine_reserve_bytes"]: the profile's mem_reserve_frac and mem_reserve_bytes)."""
        self._check(plan, batch, context)
        gpus = plan.world_size
        per = -(-batch // plan.dp)
        cap = self.kv_capacity_tokens(plan.tp, plan.pp)
        fit = min(per, cap // context)
        if fit < 1:
            mem = self.memory("decode", plan, plan.dp, context)
            est = _infeasible("decode", plan, mem, gpus, f"cannot run: one sequence of {context} tokens of KV")
            est.extras.update({"status": "cannot run", "kv_capacity_tokens": cap,
                               "engine_reserve_bytes": self.reserve})
            return est
        mem = self.memory("decode", plan, fit * plan.dp, context)
        # continuous batching keeps `fit` sequences running: all `per` advance one token in
        # per/fit iterations on average (no whole-wave rounding)
        waves = per / fit
        cost, tp_s, host_s = self._decode_pass(plan.tp, fit, fit * context)
        t_step = cost.total_s + tp_s + host_s
        preempting = fit < per
        recompute_s = (fit / context) * self.prefill_time_s(plan.tp, context, 0, 1) if preempting else 0.0
        t = waves * (t_step + recompute_s)
        note = "" if not preempting else (f"preempting: only {fit} of {per} sequences per replica fit in KV "
                                          f"memory; {fit / context:.3g} sequences recomputed per iteration")
        br = self._breakdown(cost, waves, tp_s, host_s)
        br["recompute"] = waves * recompute_s
        return Estimate(stage="decode", time_s=t, feasible=True, reason=note, tokens=batch, gpus=gpus,
                        flops=waves * cost.flops / plan.pp, peak_flops=self.profile.hardware.peak_flops,
                        memory=mem, plan=plan, breakdown=br,
                        extras={"status": "preempting" if preempting else "fits", "concurrency": fit,
                                "waves": waves, "step_time_s": t_step, "recompute_per_step_s": recompute_s,
                                "kv_capacity_tokens": cap, "engine_reserve_bytes": self.reserve})

    def rollout(self, plan: ParallelPlan, batch: int, context: int, prompt: int = 0,
                segments: int = ROLLOUT_SEGMENTS) -> Estimate:
        """`batch` responses generated together, each from `prompt` tokens until it holds
        `context`, over plan.dp replicas: the rollout's whole wall time (prefill of the prompts,
        decode as the sequences grow, recompute of preempted ones).

        Unlike `decode` (every sequence holding `context` for ever), the KV the batch needs
        grows from batch x prompt to batch x context, so an engine preempts only once it is full
        and only as many sequences as it must. The engine follows vLLM's scheduler (FCFS,
        recompute preemption): waiting sequences are admitted while their KV fits; when the
        running ones' growth would overflow the cache, the last admitted are preempted (their KV
        freed) and queued first; a preempted sequence is prefilled again, once, when it is
        re-admitted (extras["recomputed_tokens"]: the counted tokens). Decode is priced in up to
        `segments` stretches per cohort of equal sequences, each at its running count and its
        mid-stretch KV (`decode_step_time_s`). Status: "fits" (no preemption), "preempting",
        or "cannot run" when one sequence of `context` tokens does not fit."""
        self._check(plan, batch, context)
        if not 0 <= prompt < context:
            raise ValueError(f"prompt must be in [0, context={context}) tokens, got {prompt}")
        gpus = plan.world_size
        per = -(-batch // plan.dp)
        cap = self.kv_capacity_tokens(plan.tp, plan.pp)
        if cap < context:
            mem = self.memory("decode", plan, plan.dp, context)
            est = _infeasible("decode", plan, mem, gpus, f"cannot run: one sequence of {context} tokens of KV")
            est.extras.update({"status": "cannot run", "kv_capacity_tokens": cap})
            return est
        tp, stretch = plan.tp, max(1, -(-(context - prompt) // segments))
        running: list[list[int]] = []  # cohorts [count, tokens held], in admission order
        waiting: list[list[int]] = [[per, prompt, 0]]  # [count, tokens, preempted?] queue, front first
        decode_s = prefill_s = 0.0
        recomputed = preemptions = peak = 0
        while running or waiting:
            free = cap - sum(n * t for n, t in running)
            # admit from the front while a sequence's KV and its growth over one stretch fit
            # beside the running ones' growth (else it would be preempted at once)
            room = free - sum(n * min(stretch, context - t) for n, t in running)
            while waiting:
                n, t, was_preempted = waiting[0]
                k = min(n, max(0, room) // (t + min(stretch, context - t)))
                if k < 1:
                    break
                if t > 0:
                    prefill_s += self.prefill_time_s(tp, k * t, 0, k)
                    recomputed += k * t if was_preempted else 0
                running.append([k, t])
                free -= k * t
                room -= k * (t + min(stretch, context - t))
                waiting[0][0] -= k
                if waiting[0][0] == 0:
                    waiting.pop(0)
            k_run = sum(n for n, _ in running)
            peak = max(peak, k_run)
            # the stretch: to the next finish, at most `stretch` tokens; if the running
            # sequences' growth over it overflows the cache, the last admitted are preempted
            dt = min(stretch, min(context - t for _, t in running))
            excess = k_run * dt - free
            while excess > 0 and k_run > 1:
                n, t = running[-1]
                drop = min(n, -(-excess // (t + dt)), k_run - 1)
                running[-1][0] -= drop
                if running[-1][0] == 0:
                    running.pop()
                if waiting and waiting[0][1] == t and waiting[0][2]:
                    waiting[0][0] += drop
                else:
                    waiting.insert(0, [drop, t, 1])
                preemptions += drop
                k_run -= drop
                excess -= drop * (t + dt)
            held = sum(n * t for n, t in running)
            decode_s += dt * self.decode_step_time_s(tp, k_run, held + k_run * dt / 2)
            for c in running:
                c[1] += dt
            running = [c for c in running if c[1] < context]
        t = prefill_s + decode_s
        generated = batch * (context - prompt)
        status = "preempting" if preemptions else "fits"
        mem = self.memory("decode", plan, min(per, cap // context) * plan.dp, context)
        note = "" if not preemptions else (f"preempting: {preemptions} preemptions per replica, {recomputed} "
                                           f"tokens recomputed")
        return Estimate(stage="decode", time_s=t, feasible=True, reason=note, tokens=generated, gpus=gpus,
                        peak_flops=self.profile.hardware.peak_flops, memory=mem, plan=plan,
                        breakdown={"decode": decode_s, "prefill": prefill_s},
                        extras={"status": status, "concurrency": peak, "preemptions": preemptions,
                                "recomputed_tokens": recomputed, "kv_capacity_tokens": cap,
                                "engine_reserve_bytes": self.reserve})

    @staticmethod
    def _breakdown(cost: PassCost, repeats: float, comm_s: float, host_s: float) -> dict:
        """Seconds by component of `repeats` passes, each `cost` plus `comm_s` of TP/CP
        communication and `host_s` of calibrated host work."""
        return {"linear": cost.linear_s * repeats, "attention": cost.attention_s * repeats,
                "elementwise": cost.elementwise_s * repeats, "lm_head": cost.lm_head_s * repeats,
                "overhead": cost.overhead_s * repeats, "tp_comm": comm_s * repeats, "host": host_s * repeats}

    def _micro_batches(self, plan: ParallelPlan, batch: int) -> tuple[int, int]:
        per_replica = -(-batch // plan.dp)
        return per_replica, -(-per_replica // plan.micro_batch)

    def logprob(self, plan: ParallelPlan, batch: int, context: int, passes: int = 1,
                masked: bool = False, head_frac: float | None = None) -> Estimate:
        """Forward-only log-probs of `batch` sequences (`passes` models: e.g. 2 = ref + old).
        `head_frac`: the share of positions that get logits (see `head_tokens`)."""
        self._check(plan, batch, context)
        gpus = plan.world_size
        mem = self.memory("logprob", plan, batch, context)
        if not mem.fits:
            return _infeasible("logprob", plan, mem, gpus, f"micro-batch of {plan.micro_batch}x{context}")
        _, m = self._micro_batches(plan, batch)
        s = context / plan.cp
        tokens = plan.micro_batch * s
        cost = forward_pass(self.model, self.profile, tp=plan.tp, layers=-(-self.model.num_layers // plan.pp),
                            tokens=tokens, attn_pairs=plan.micro_batch * _pairs(context, masked) / plan.cp,
                            kv_tokens=plan.micro_batch * context, lm_tokens=head_tokens(tokens, head_frac))
        comm_s = self._tp_comm_s(plan.tp, tokens, 1) / plan.pp + self._cp_comm_s(plan, context, 1)
        # work around each micro-batch's forward, fixed and per padded token (calibrated)
        host_s = self.profile.logprob_pass_s + self.profile.logprob_token_s * tokens
        t_mb = cost.total_s + comm_s + host_s
        t = passes * (m + plan.pp - 1) * t_mb
        return Estimate(stage="logprob", time_s=t, feasible=True, tokens=passes * batch * context, gpus=gpus,
                        flops=passes * m * cost.flops, peak_flops=self.profile.hardware.peak_flops,
                        memory=mem, plan=plan,
                        breakdown=self._breakdown(cost, passes * (m + plan.pp - 1), comm_s, host_s),
                        extras={"micro_batches": m, "micro_batch_s": t_mb,
                                "bubble_frac": (plan.pp - 1) / (m + plan.pp - 1)})

    def _cp_comm_s(self, plan: ParallelPlan, context: int, passes: int) -> float:
        """Context parallelism: each layer all-gathers K/V across the cp group (forward) and
        reduce-scatters their gradients (backward)."""
        if plan.cp <= 1:
            return 0.0
        kv = plan.micro_batch * context * 2 * memory.kv_heads_per_gpu(self.model, plan.tp) * \
            self.model.head_dim * self.model.dtype_bytes
        link = comm.group_link(self.cluster, self.profile, plan.cp, plan.tp, collective="allgather")
        layers = -(-self.model.num_layers // plan.pp)
        return passes * layers * comm.allgather_s(kv, plan.cp, link)

    def train(self, plan: ParallelPlan, batch: int, context: int, masked: bool = False,
              fsdp: bool = False, head_frac: float | None = None) -> Estimate:
        """One optimizer step over a global batch of `batch` sequences of `context` tokens.
        `fsdp`: a `zero` plan with dp > 1 runs FSDP2 (the PyTorch runtime's): every micro-batch
        gathers each layer's weights over dp in its forward and again in its backward (the root
        unit once) and reduce-scatters their gradients, in place of one gradient all-reduce; each
        unit also costs the profile's `fsdp_unit_s` of host work per micro-batch, each optimizer
        step `fsdp_tensor_s` per parameter tensor (DTensor host work) and FSDP_STEP_ALLREDUCES
        small all-reduces (counted; priced on the link).
        `head_frac`: the share of positions that get logits (see `head_tokens`); the head of
        those is then recomputed in the backward pass, as the runtime's chunked head is."""
        self._check(plan, batch, context)
        validate_plan(plan, self.model, seq_len=context if plan.cp > 1 else None)
        gpus = plan.world_size
        mem = self.memory("train", plan, batch, context)
        if not mem.fits:
            return _infeasible("train", plan, mem, gpus, f"micro-batch {plan.micro_batch}x{context}")
        per_replica, m = self._micro_batches(plan, batch)
        s = context / plan.cp
        tokens = plan.micro_batch * s
        layers = -(-self.model.num_layers // plan.pp)
        fwd = forward_pass(self.model, self.profile, tp=plan.tp, layers=layers, tokens=tokens,
                           attn_pairs=plan.micro_batch * _pairs(context, masked) / plan.cp,
                           kv_tokens=plan.micro_batch * context, lm_tokens=head_tokens(tokens, head_frac))
        recompute = {"none": 0.0, "selective": fwd.attention_s, "full": fwd.total_s - fwd.lm_head_s}[plan.recompute]
        if head_frac is not None:  # the chunked head is checkpointed: one more head forward
            recompute += fwd.lm_head_s
        tp_passes = 4 + (2 if plan.recompute == "full" else 0)
        # the profile's assumed share of TP communication hidden under the GEMMs
        tp_c = self._tp_comm_s(plan.tp, tokens, tp_passes) / plan.pp * (1 - self.profile.tp_comm_overlap)
        cp_c = self._cp_comm_s(plan, context, 2)
        # + work of each micro-batch beyond 3 forwards: loss, its backward, stats, fixed and per
        # padded token (calibrated)
        t_mb = (3 * fwd.total_s + recompute + tp_c + cp_c + self.profile.train_pass_s
                + self.profile.train_token_s * tokens)
        p_local = memory.params_per_gpu(self.model, plan)
        fsdp_c = fsdp_host = step_coll = 0.0
        sharded_weights = runs_fsdp2(plan, fsdp)
        if sharded_weights:  # one FSDP unit per layer + the root (embeddings, final norm, head)
            units = layers + 1
            unit_bytes = p_local / units * self.model.dtype_bytes
            stride = plan.tp * plan.cp * plan.pp
            ag = comm.group_link(self.cluster, self.profile, plan.dp, stride, collective="allgather")
            rs = comm.group_link(self.cluster, self.profile, plan.dp, stride, collective="reducescatter")
            ag_share = comm.bytes_group(self.cluster, self.profile, plan.dp, stride)
            rs_share = comm.bytes_group(self.cluster, self.profile, plan.dp, stride, "reducescatter")
            fsdp_c = (2 * units - 1) * comm.allgather_s(unit_bytes, plan.dp, ag, ag_share) + \
                units * comm.reducescatter_s(p_local / units * 4, plan.dp, rs, rs_share)  # fp32 gradients
            fsdp_host = units * self.profile.fsdp_unit_s  # hooks, DTensor work, lockstep (calibrated)
            t_mb += fsdp_c + fsdp_host
        # 1F1B: (pp - 1) micro-batch slots of fill and drain; interleaved over v model chunks per
        # rank, each slot is 1/v as long (Narayanan et al. 2021, sec. 2.2.2)
        v = plan.virtual_stages
        bubble = (plan.pp - 1) * t_mb / v
        pipeline = m * t_mb + bubble
        pp_p2p = 0.0
        if plan.pp > 1:
            act = tokens * self.model.hidden_size * self.model.dtype_bytes / plan.tp
            link = comm.group_link(self.cluster, self.profile, plan.pp, plan.tp * plan.cp)
            pp_p2p = 2 * (v * m + plan.pp - 1) * comm.p2p_s(act, link)  # v chunks: v x the sends
        # gradients are reduced over every rank holding the same weights: the dp x cp group
        grad_group = plan.dp * plan.cp
        span = (plan.cp - 1) * plan.tp + (plan.dp - 1) * plan.tp * plan.cp * plan.pp
        dp_link = (self.profile.link_for("allreduce") if span < self.cluster.gpus_per_node
                   else comm.inter_node_link(self.cluster, self.cluster.gpus_per_node))
        grad_bytes = p_local * memory.GRAD_BYTES
        dp_sync_total = 0.0 if sharded_weights else comm.allreduce_s(grad_bytes, grad_group, dp_link)
        dp_sync = dp_sync_total
        if self.profile.dp_grad_overlap and dp_sync_total > 0:
            # buckets are reduced as the last micro-batch's backward produces them (Megatron's
            # overlap_grad_reduce, FSDP): hidden up to that backward, except the last bucket
            window = 2 * fwd.total_s + recompute
            last = dp_sync_total * min(1.0, self.profile.grad_bucket_bytes / grad_bytes)
            dp_sync = max(dp_sync_total - window, last)
        shard = grad_group if plan.sharded_optimizer else 1
        opt_bytes = p_local / shard * (memory.GRAD_BYTES + 2 * memory.OPTIMIZER_BYTES + memory.WEIGHT_BYTES)
        optimizer = opt_bytes / (self.profile.hardware.hbm_bw_bytes_s * self.profile.memory(opt_bytes))
        # per-step and per-parameter-tensor host costs of zero_grad, clipping and the optimizer
        # (calibrated; a pp stage holds its share of the tensors, tp shards keep their count)
        tensors = math.ceil(param_tensors(self.model) / plan.pp)
        optimizer += self.profile.optimizer_step_s + self.profile.optimizer_tensor_s * tensors
        if sharded_weights:
            ar = comm.group_link(self.cluster, self.profile, plan.dp, stride, collective="allreduce")
            step_coll = FSDP_STEP_ALLREDUCES * comm.allreduce_s(SCALAR_BYTES, plan.dp, ar)
            # the optimizer's per-tensor work on DTensors (calibrated)
            optimizer += self.profile.fsdp_tensor_s * tensors
            if plan.tp > 1:
                step_coll += comm.allreduce_s(SCALAR_BYTES, plan.tp, self._tp_link(plan.tp))
        t = pipeline + pp_p2p + dp_sync + optimizer + step_coll
        trained = per_replica * plan.dp * context
        model_flops = train_flops_per_token(self.model, context) * trained / gpus
        return Estimate(
            stage="train", time_s=t, feasible=True, tokens=trained, gpus=gpus, flops=model_flops,
            peak_flops=self.profile.hardware.peak_flops, memory=mem, plan=plan,
            breakdown={"forward": m * fwd.total_s, "backward": m * 2 * fwd.total_s,
                       "recompute": m * recompute, "tp_comm": m * tp_c, "cp_comm": m * cp_c,
                       "pipeline_bubble": bubble, "pp_p2p": pp_p2p, "fsdp_comm": m * fsdp_c,
                       "fsdp_host": m * fsdp_host, "step_collectives": step_coll,
                       "dp_grad_sync": dp_sync, "optimizer": optimizer},
            extras={"micro_batches": m, "micro_batch_s": t_mb, "pp_p2p_per_mb_s": pp_p2p / (m + plan.pp - 1),
                    "bubble_frac": bubble / pipeline, "dp_grad_sync_unhidden_s": dp_sync_total,
                    "tp_comm_overlap": self.profile.tp_comm_overlap, "virtual_stages": v})

    def mixed_batch(self, stage: str, plan: ParallelPlan, lengths, *, buckets: int = 8, passes: int = 1,
                    imbalance: float = 1.0, padded: bool = False, token_budget: int = 0,
                    groups: list | None = None, fsdp: bool = False,
                    head_frac: float | None = None) -> Estimate:
        """Price `logprob` or `train` over sequences of different lengths, as one stage.

        Lengths are sorted into up to `buckets` equal-count buckets, each priced at its mean
        length (rounded up to a multiple of cp); micro-batches of all buckets stream through
        one pipeline, so its fill/drain is paid once, as are the dp gradient sync and the
        optimizer step. `imbalance` (max/mean tokens over dp groups) stretches the streaming
        part: the slowest group sets the pace. `padded`: micro-batches are right-padded to their
        longest sequence (the PyTorch runtime's), so a bucket is priced at its longest length.
        `token_budget` > 0: micro-batches are packed like the PyTorch runtime's (longest first,
        rows x longest row <= token_budget; see `pack_micro_batches`) instead of equal buckets,
        each data-parallel group packing its own share: `groups` (the lengths each of the plan's dp
        groups holds; needed when dp > 1) and the slowest group's micro-batches set the pace.
        `fsdp`: training runs `zero` plans as FSDP2 (see `train`).
        Log-probs also pay the experience stage's host work once (collating, advantages).
        `head_frac`: the share of positions that get logits (see `head_tokens`)."""
        if stage not in ("logprob", "train"):
            raise ValueError(f"mixed_batch prices logprob or train, not {stage!r}")
        ctx = sorted(lengths.astype("int64").tolist() if hasattr(lengths, "astype") else (int(c) for c in lengths))
        if not ctx:
            raise ValueError("mixed_batch needs at least one sequence length")
        # a bucket smaller than one micro-batch per dp group would add micro-batches (and their
        # fixed per-kernel costs) that a real packed batch does not have
        n_buckets = max(1, min(buckets, len(ctx) // max(1, plan.dp * plan.micro_batch)))
        size = -(-len(ctx) // n_buckets)
        # whole micro-batches per bucket: a bucket of 4 sequences at micro-batch 3 would price 2
        # micro-batches where a packed batch fills 3-row micro-batches across bucket edges
        unit = plan.dp * plan.micro_batch
        size = -(-size // unit) * unit
        fill = 0.0
        last = None
        per_group = [[(ctx[i:i + size], plan) for i in range(0, len(ctx), size)]]
        if token_budget:  # one chunk per packed micro-batch of each dp group, at its own row count
            shares = [ctx] if groups is None and plan.dp == 1 else groups
            if shares is None or len(shares) != plan.dp:
                raise ValueError(f"token-budget packing needs the lengths held by each of the plan's {plan.dp} "
                                 f"data-parallel groups, got {'none' if shares is None else len(shares)}")
            per_group = [[(g, dataclasses.replace(plan, micro_batch=len(g)))
                          for g in pack_micro_batches(share, token_budget)] for share in shares if len(share)]
            imbalance = 1.0  # each group's own packing: the slowest one is priced directly
        stream = p2p = 0.0
        for chunks in per_group:
            g_stream = g_p2p = 0.0
            for chunk, p in chunks:
                c = chunk[-1] if padded else -(-sum(chunk) // len(chunk))
                c = -(-c // plan.cp) * plan.cp
                rows = len(chunk) * (plan.dp if token_budget else 1)  # token budget: one micro-batch per group
                est = (self.logprob(p, rows, c, masked=padded, head_frac=head_frac) if stage == "logprob"
                       else self.train(p, rows, c, masked=padded, fsdp=fsdp, head_frac=head_frac))
                if not est.feasible:
                    return est
                m, t_mb = est.extras["micro_batches"], est.extras["micro_batch_s"]
                g_stream += m * t_mb
                fill = max(fill, (plan.pp - 1) * t_mb / plan.virtual_stages)
                g_p2p += est.extras.get("pp_p2p_per_mb_s", 0.0) * m
                last = est
            stream, p2p = max(stream, g_stream), max(p2p, g_p2p)
        once = 0.0
        if stage == "train":
            once = last.breakdown["dp_grad_sync"] + last.breakdown["optimizer"] + last.breakdown["step_collectives"]
        else:  # each dp group collates its share of the sequences (calibrated; 0 on datasheets)
            once = self.collate_s(-(-len(ctx) // plan.dp), sum(ctx) / plan.dp * imbalance) \
                * self.host_cold_factor(plan) * self.slowest_of(plan.world_size)
        t = passes * (stream * imbalance + fill + p2p) + once
        mem = self.memory(stage, plan, len(ctx), ctx[-1])
        return Estimate(stage=stage, time_s=t, feasible=mem.fits, reason="" if mem.fits else "longest sequence",
                        tokens=passes * sum(ctx) if stage == "logprob" else sum(ctx), gpus=plan.world_size,
                        peak_flops=self.profile.hardware.peak_flops, memory=mem, plan=plan,
                        breakdown={"stream": passes * stream * imbalance, "pipeline_fill": passes * fill,
                                   "pp_p2p": passes * p2p,
                                   ("grad_sync_optimizer" if stage == "train" else "host"): once},
                        extras={"buckets": n_buckets, "imbalance": imbalance})

    # ---- data movement ------------------------------------------------------------------------
    def reshard(self, src: ParallelPlan, dst: ParallelPlan, include_optimizer: bool = False,
                fsdp: bool = False, asleep: bool = False) -> Estimate:
        """Move weights (and optionally fp32 master + Adam states) from `src`'s layout to `dst`'s
        on the same GPUs. Each rank keeps the overlap of its old and new slice; the slowest rank
        receiving the rest sets the time. `fsdp`: a `zero` plan with dp > 1 shards its weights
        over dp too (FSDP2, as the PyTorch runtime trains it; the cost model's own `zero` keeps
        them whole), so weights leaving it are gathered first. `asleep`: the ranks come to it
        from other work, not from a common start (a runtime step's sync; `sync_wake_s`)."""
        world = src.world_size
        if dst.world_size != world:
            raise ValueError(f"reshard needs equal GPU counts, got {src.short()} ({world}) and "
                             f"{dst.short()} ({dst.world_size})")
        params = self.model.num_params
        worst = 0.0
        # Only tp, pp (and, for ZeRO-sharded optimizer states, the dp x cp index) change what a
        # rank holds; without sharding ranks repeat with period tp*pp*cp.
        zero = include_optimizer and (src.sharded_optimizer or dst.sharded_optimizer)
        span = world if zero else min(world, dst.model_parallel * src.model_parallel)
        # a rank's slice: a layer range times a range of each layer's parameters (earl.parallel)
        layers, width = self.model.num_layers, self.model.params_per_layer
        per_unit = params / (layers * width)  # the model's parameters per (layer, element) unit
        for r in range(span):
            need = model_slice(dst, r, num_layers=layers, width=width)
            have = model_slice(src, r, num_layers=layers, width=width)
            moved = (_units(need) - _overlap_units(need, have)) * per_unit * self.model.dtype_bytes
            if include_optimizer:
                need_o = model_slice(dst, r, num_layers=layers, width=width, optimizer=True)
                have_o = model_slice(src, r, num_layers=layers, width=width, optimizer=True)
                moved += (_units(need_o) - _overlap_units(need_o, have_o)) * per_unit * memory.OPTIMIZER_BYTES
            worst = max(worst, moved)
        group = max(src.model_parallel, dst.model_parallel)
        link = comm.group_link(self.cluster, self.profile, group, 1)
        t = comm.p2p_s(worst, link) if worst > 0 else 0.0
        # FSDP2 weights leaving the training layout: all-gathers over dp of the fp32 shards, one
        # per bucket of consecutive tensors (earl.runtime.optim.FSDPAdamW.weights, sync_buckets)
        gather = host = 0.0
        if runs_fsdp2(src, fsdp) and not include_optimizer:
            tensors, whole, own = fsdp_sync_counts(self.model, src.tp, src.pp, src.dp)
            # buckets by bytes: a tensor larger than a bucket, gathered alone, counts as its bytes' worth
            buckets = min(tensors, max(1, math.ceil(whole / src.dp / SYNC_BUCKET_BYTES)))
            dp_link = comm.group_link(self.cluster, self.profile, src.dp, src.model_parallel, collective="allgather")
            # each gather is a synchronising round of the dp group: on a host that measured one
            # (earl.calibrate.dispatchfit.round_seconds) it stands for the link's latency terms, as
            # in the dispatch's price (earl.cost_model.dispatch.price_transfer_plan)
            ppn = min(src.dp * src.model_parallel, self.cluster.gpus_per_node)
            rnd = self.profile.dispatch_path.round_cost_s(ppn)
            if rnd > 0:
                dp_link = dataclasses.replace(dp_link, alpha_s=0.0)
            share = comm.bytes_group(self.cluster, self.profile, src.dp, src.model_parallel)
            gather = buckets * (comm.allgather_s(whole / buckets, src.dp, dp_link, share) + rnd)
            # + once per sync, per tensor gathered, per byte of it and per byte of the rank's own
            # shard: packing the shard, slicing each tensor out of its bucket, the concatenation,
            # the cast and the copy into the destination (calibrated on the weight sync itself:
            # earl.calibrate.fsdpfit)
            host = (self.profile.reshard_fixed_s + tensors * self.profile.reshard_tensor_s
                    + whole * self.profile.reshard_byte_s + own * self.profile.reshard_shard_byte_s)
        wake = self.sync_wake_s(src) if asleep and gather else 0.0
        moved = worst * world
        return Estimate(stage="reshard", time_s=t + gather + host + wake, feasible=True, gpus=world, plan=dst,
                        breakdown={"transfer": t, "dp_gather": gather, "host": host, "wake": wake},
                        extras={"bytes_per_gpu": worst, "bytes_total": moved, "link_bw_bytes_s": link.bw_bytes_s})

    def sync_wake_s(self, src: ParallelPlan) -> float:
        """What an FSDP2 weight sync out of `src` adds when its ranks come to it from other work:
        `HardwareProfile.reshard_wake_s` once (its first all-gather round, whose early ranks
        sleep until the last one sends) where the node's ranks outnumber its host_parallel
        cores, else 0. A wait, not a rank's own work: `earl validate` leaves it unstretched."""
        ppn = min(src.world_size, self.cluster.gpus_per_node)
        return self.profile.reshard_wake_s if ppn > self.profile.dispatch_path.host_parallel else 0.0


def fsdp_sync_counts(model: ModelSpec, tp: int = 1, pp: int = 1, dp: int = 1) -> tuple[int, float, float]:
    """An FSDP2 weight sync's counted quantities on one rank: the parameter tensors it gathers,
    the bytes of its tp x pp shard, gathered whole (fp32), and those of its own dp shard of it,
    as `CostModel.reshard` prices them and `earl.calibrate.fsdpfit` fits their constants."""
    whole = model.num_params / (tp * pp) * FSDP_SHARD_BYTES
    return math.ceil(param_tensors(model) / pp), whole, whole / dp


# the runtime's trainer runs a shared prompt prefix once when that saves at least this fraction
# of a micro-batch's tokens (earl.runtime.trainer._shared_prefixes; the simulator prices it so:
# earl.sim.simulation.Simulation._shared_cost)
SHARE_MIN_FRAC = 0.1


def micro_batches(lengths, token_budget: int) -> list[list[int]]:
    """The one micro-batch packing rule (the PyTorch runtime's trainer packs by it, the cost
    model prices it): row indices grouped so that rows x longest row <= token_budget (a longer
    row goes alone). Rows are taken longest first (ties by index), which keeps padding low."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[cur[0]] > token_budget:  # cur[0] is its longest row
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def pack_micro_batches(lengths, token_budget: int) -> list[list[int]]:
    """The lengths of each of `micro_batches`' groups, each sorted ascending."""
    lengths = list(lengths)
    return [sorted(lengths[i] for i in g) for g in micro_batches(lengths, token_budget)]


def head_tokens(tokens: float, head_frac: float | None) -> float:
    """Positions of `tokens` that get LM-head logits. None: all of them (a framework that runs
    the HF forward whole); a fraction: only the trained (generated) positions, as earl's runtime
    computes them (earl.runtime.trainer.token_logprobs)."""
    if head_frac is None:
        return tokens
    if not 0.0 <= head_frac <= 1.0:
        raise ValueError(f"head_frac must be in [0, 1], got {head_frac}")
    return tokens * head_frac


def _pairs(context: int, masked: bool) -> float:
    """Attention pairs of one sequence: causal, or the full square when the batch carries an
    explicit padding mask (the kernel then cannot skip the masked-out upper triangle)."""
    return float(context) * context if masked else causal_pairs(context, 0)


def _units(box) -> int:
    """(layer, element) units in a slice."""
    return (box[0][1] - box[0][0]) * (box[1][1] - box[1][0])


def _overlap_units(a, b) -> int:
    """(layer, element) units that slices `a` and `b` share."""
    def one(x, y):
        return max(0, min(x[1], y[1]) - max(x[0], y[0]))
    return one(a[0], b[0]) * one(a[1], b[1])


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of `n` independent standard normal draws] (0 for n <= 1; 0.5642 at 2, 1.0294 at 4,
    1.4236 at 8): the integral of x n phi(x) Phi(x)^(n-1) by the midpoint rule over [-8, 8]."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 4000, -8.0, 8.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        x = lo + (i + 0.5) * h
        total += x * math.exp(-0.5 * x * x) * (0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))) ** (n - 1)
    return n * total * h / math.sqrt(2.0 * math.pi)
