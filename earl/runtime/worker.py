"""One rank's state in the runtime, for any world size (one process is a world of size 1).

A `Worker` holds the policy under each RL stage's plan: the training copy (built by
earl.runtime.parallelize: DTensor TP when tp > 1, activation checkpointing, and for a `zero`
plan with dp > 1 FSDP2 with fp32 masters and `FSDPAdamW`; otherwise replicated over dp with
`ReplicatedAdamW`), the rollout engine's copy, an optional experience (log-prob) copy and an
optional frozen reference for the KL term (on the experience plan); those three use the
hand-written TP of earl.runtime.tp. A stage whose plan has the training plan's tp runs on the
training module itself when that holds plain tensors (tp1 without FSDP2: on one process
nothing is copied and weight sync is free); with DTensor training, log-probs run on the
rollout's copy when the tps agree. Copies are refreshed from training every step through the
pure re-shard planner (earl.policies.reshard) and its executor (earl.runtime.move_weights).

Plan switches happen in flight: training moves weights and optimizer state to the new plan, no
restart. The per-rank memory budget is checked against the cost model's training account
(earl.cost_model.memory.train_memory in the runtime's precision), the selector's own figure.
The source weights are read once per rank; other copies are built empty and filled by re-shards.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_step.py
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import threading
import time

try:
    import resource
except ImportError:  # not on Windows: `kernel_usage` reads zeros
    resource = None

import torch
import torch.distributed as dist

from earl.cost_model.memory import MemoryBreakdown, params_per_gpu, runtime_precision, train_memory
from earl.parallel import ParamShape, build_plan_groups
from earl.policies.reshard import ReshardPlan, plan_reshard
from earl.runtime.dist import comm_device, print0
from earl.runtime.engine import LOCAL_ENGINES, SamplingParams, engine_plan_error, make_engine
from earl.runtime.envs import env_options, make_env
from earl.runtime.gloo_loops import loop_threads
from earl.runtime.hf_model import empty_like_policy, load_policy
from earl.runtime.hostprobe import HostProbe
from earl.runtime.move_weights import allocate_local, execute_reshard
from earl.runtime.optim import FSDPAdamW, ReplicatedAdamW, local_tensor
from earl.runtime.parallelize import fsdp_shard_error, parallelize, uses_dtensor, uses_fsdp
from earl.runtime.run_config import RunConfig
from earl.runtime.tp import apply_tp, check_tp, param_shapes
from earl.runtime.trainer import Trainer
from earl.specs import ParallelPlan, Stage, StagePlan
from earl.trace import Span

ONE = ParallelPlan()


_SCHED = threading.local()  # per thread: an open /proc/thread-self/schedstat (False where absent), its pid


def _schedstat_wait(fd: int) -> float:
    """The run-queue wait, s, in an open schedstat file (its second field, ns)."""
    return int(os.pread(fd, 96, 0).split()[1]) * 1e-9


def thread_wait_s() -> float:
    """Seconds this thread has spent runnable but not running (waiting for a core), from the
    kernel's per-thread schedstat (its second field); 0.0 where the kernel does not keep it. A
    span's share of this over its wall time is the preemption a peer rank, another tenant or
    the hypervisor imposed on it, which its CPU seconds alone do not tell from a blocking wait."""
    fd = getattr(_SCHED, "fd", None)
    if fd is None or _SCHED.pid != os.getpid():  # first call on this thread, or a forked child's
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = False
        _SCHED.fd, _SCHED.pid = fd, os.getpid()
    if fd is False:
        return 0.0
    try:
        return _schedstat_wait(fd)
    except (OSError, IndexError, ValueError):
        return 0.0


_LOOPS: dict[int, tuple[int, float] | None] = {}  # gloo loop thread id -> (its open schedstat, wait when first seen)
_LOOP_SCAN = [-math.inf, os.getpid()]  # when this process's threads were last listed, and by which process


def loops_wait_s() -> float:
    """Seconds this process's gloo event-loop threads (earl.runtime.gloo_loops) have waited for
    a core since this function first saw them, summed; 0.0 without them or without schedstat. A
    message is delivered only when its receiver's loop thread runs: on a host whose ranks
    outnumber the cores, a dispatch's last rounds wait so behind the peers that left it first for
    their next stage's work."""
    now = time.monotonic()
    if _LOOP_SCAN[1] != os.getpid():  # a forked child: its parent's loops are not its own
        _LOOPS.clear()
        _LOOP_SCAN[:] = [-math.inf, os.getpid()]
    if now - _LOOP_SCAN[0] > 10.0:  # new groups bring new loops; a scan costs ~20 us
        _LOOP_SCAN[0] = now
        for tid in loop_threads():
            if tid not in _LOOPS:
                try:
                    fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                    _LOOPS[tid] = (fd, _schedstat_wait(fd))
                except (OSError, IndexError, ValueError):
                    _LOOPS[tid] = None
    total = 0.0
    for tid, seen in _LOOPS.items():
        if seen is not None:
            try:
                total += _schedstat_wait(seen[0]) - seen[1]
            except (OSError, IndexError, ValueError):  # the thread ended: its waits leave the sum
                _LOOPS[tid] = None
    return total


def kernel_usage() -> tuple[float, int]:
    """(system CPU seconds, minor page faults) of this process so far, every thread's
    (`getrusage(RUSAGE_SELF)`); (0.0, 0) where the platform has no `resource` module. A span's
    share of system time is kernel work on its behalf: gloo's socket copies, page faults on
    freshly mapped memory. The held-out model's 4-rank training step spent 0.28-0.30 s of it a
    rank in the runtime against 0.16 run alone (docs/validate-history.md, thirty-sixth session); a later
    pair under `perf` read 0.215 against 0.173 s, page faults ~1.2% of the step (thirty-seventh)."""
    if resource is None:
        return 0.0, 0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_stime, ru.ru_minflt


def span_start() -> tuple[float, float, float, float, float, tuple[float, int]]:
    """A span's start for `Worker.span`: (wall clock, this process's CPU seconds, this thread's,
    this thread's run-queue wait, its gloo loop threads', the process's kernel usage)."""
    return (time.perf_counter(), time.process_time(), time.thread_time(), thread_wait_s(), loops_wait_s(),
            kernel_usage())


class MemoryBudgetExceeded(RuntimeError):
    pass


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """The run's sampling settings; empty fields take the environment's defaults."""
    env_cls = make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env))  # its defaults
    s = cfg.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p,
                          max_new_tokens=s.max_new_tokens if s.max_new_tokens is not None else env_cls.max_new_tokens,
                          stop=tuple(s.stop) or tuple(env_cls.stop))


def action_token_ids(cfg: RunConfig, tokenizer) -> list[int] | None:
    """Token ids of the env's actions (`Env.actions`) for the legality term (`trainer.legal_coef`);
    None when the term is off, the env lists no actions, or one is not a single token."""
    if not cfg.trainer.legal_coef:
        return None
    actions = getattr(make_env(cfg.env.name, **env_options(cfg.env.name, cfg.env)), "actions", ())
    ids = [tokenizer.encode(a) for a in actions]
    return [i[0] for i in ids] if ids and all(len(i) == 1 for i in ids) else None


def runnable(plan: ParallelPlan, world: int, config, shapes: dict[str, ParamShape], stage: Stage = Stage.TRAIN,
             engine: str = "pytorch") -> str:
    """'' if the runtime can run `plan` for `stage` on `world` processes, else why not (a
    training plan on FSDP2 also needs dp to divide the tensors FSDP2 cuts off dim 0; a rollout
    plan, the engine's own limits)."""
    why = engine_plan_error(engine, plan) if stage is Stage.ROLLOUT else ""
    if why:
        return why
    if plan.pp != 1 or plan.cp != 1:
        return "pp/cp > 1 are not supported by the runtime yet"
    if plan.world_size != world:
        return f"needs {plan.world_size} processes, the job has {world}"
    try:
        check_tp(config, plan.tp)
    except ValueError as e:
        return str(e)
    return fsdp_shard_error(plan, shapes) if stage is Stage.TRAIN else ""


class Worker:
    """State of one rank: models under plans, optimizer, spans of the current step."""

    def __init__(self, cfg: RunConfig, plans: StagePlan, *, rank: int, world: int,
                 memory_budget_bytes: float = 0.0):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.memory_budget_bytes = memory_budget_bytes
        policy = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype)  # read once
        self.policy = policy
        self.model_dtype = next(policy.model.parameters()).dtype  # FSDP2 makes training's masters fp32
        if self.model_dtype == torch.float16:
            print0("earl run: fp16 trains without loss scaling (fp32 masters and moments, but small "
                   "gradients underflow in fp16); bf16 has fp32's range")
        self.shapes = param_shapes(policy.model)
        self.params = sampling_params(cfg)
        for stage in Stage:
            why = runnable(plans.for_stage(stage), world, policy.model.config, self.shapes, stage, cfg.engine)
            if why:
                raise ValueError(f"{stage.value} plan {plans.for_stage(stage).describe()}: {why}")
        self.plans = plans
        self.events: list[dict] = []  # plan switches / re-plans of the current step
        self._synced: tuple = (None, -1)  # (copy, optimizer steps) of the last weight sync
        self._reshard_plans: dict[tuple[ParallelPlan, ParallelPlan], ReshardPlan] = {}  # `reshard_plan`'s
        self.spans: list[Span] = []
        self.played: list = []  # the trajectories this rank played in the last rollout
        self.origin = time.perf_counter()
        self.host_probe = HostProbe() if cfg.host_probe else None  # the host's speed, per step
        self.engine = None  # built with the rollout model; an external engine (vLLM) only once
        full = policy.model
        ref_full = copy.deepcopy(full) if cfg.trainer.kl_coef else None
        self.device = torch.device(cfg.model.device) if world == 1 else comm_device()
        self._build_train(plans.train, model=full)
        self.ref_model = None
        if ref_full is not None:
            g = build_plan_groups(plans.experience)
            self.ref_model = self._frozen(apply_tp(ref_full, plans.experience.tp, g.tp_rank, g.tp_group))
        self.ref_plan = plans.experience
        self._build_rollout(plans.rollout)
        self._build_experience(plans.experience)

    # ---- models under plans --------------------------------------------------------------
    def _frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def _sharded_copy(self, plan: ParallelPlan) -> torch.nn.Module:
        """An empty (uninitialised) copy of the policy, tp-sharded for `plan`; a re-shard from
        training fills it before first use."""
        g = build_plan_groups(plan)
        return self._frozen(apply_tp(empty_like_policy(self.policy, self.model_dtype), plan.tp, g.tp_rank,
                                     g.tp_group))

    def _build_train(self, plan: ParallelPlan, model: torch.nn.Module | None = None,
                     state: tuple[dict, int] | None = None) -> None:
        """(Re)build the training model and optimizer under `plan`; the weights come from
        `model` (the full policy) or `state` (tensors already re-sharded to `plan`)."""
        g = build_plan_groups(plan)
        if model is None:
            model = empty_like_policy(self.policy, self.model_dtype)
        for p in model.parameters():
            p.requires_grad_(True)
        # DTensor TP (tp > 1) + activation checkpointing (+ FSDP2 over dp for a `zero` plan)
        model = parallelize(model.to(self.device), plan, self.shapes, device_type=self.device.type)
        if uses_fsdp(plan):
            self.optim = FSDPAdamW(model, self.shapes, g, self.cfg.trainer, self.model_dtype)
        else:  # replicated over dp: ReplicatedAdamW (plain AdamW at world 1)
            if state is not None:
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        local_tensor(p).copy_(state[0][n])
            self.optim = ReplicatedAdamW(model, self.shapes, g, self.cfg.trainer)
        if state is not None:
            self.optim.load_state_tensors(state[0], state[1])
        self.trainer = Trainer(model, self.cfg.trainer, temperature=self.params.logprob_temperature,
                               lockstep=g.dp_group if uses_fsdp(plan) else None,
                               vocab_size=self.policy.tokenizer.vocab_size,
                               action_ids=action_token_ids(self.cfg, self.policy.tokenizer))
        self.train_model, self.train_groups = model, g
        self.plans = self.plans.with_stage(Stage.TRAIN, plan)

    def _shares_train(self, plan: ParallelPlan) -> bool:
        """A stage runs on the training module itself when its tp matches, unless training holds
        DTensors: under FSDP2 its forward gathers weights collectively (rollout and log-prob
        passes, which differ per rank, would have to run in lockstep), and under DTensor TP the
        engine's many small decode passes would pay DTensor's per-op dispatch (earl.runtime.tp)."""
        return plan.tp == self.plans.train.tp and not uses_dtensor(self.plans.train)

    def _build_experience(self, plan: ParallelPlan) -> None:
        self.plans = self.plans.with_stage(Stage.EXPERIENCE, plan)
        same = self._shares_train(plan)
        if same:
            self.exp_model = None
        elif uses_dtensor(self.plans.train) and self.roll_model is not None and plan.tp == self.plans.rollout.tp:
            self.exp_model = self.roll_model  # DTensor training: log-probs on the rollout's copy
        else:
            self.exp_model = self._sharded_copy(plan)
        self.exp_groups = self.train_groups if same else build_plan_groups(plan)

    def _build_rollout(self, plan: ParallelPlan) -> None:
        self.plans = self.plans.with_stage(Stage.ROLLOUT, plan)
        self.roll_groups = build_plan_groups(plan)
        if self.cfg.engine not in LOCAL_ENGINES:  # an external engine keeps its own weights: built once
            self.roll_model = None
            if getattr(self, "engine", None) is None:
                self.engine = make_engine(self.cfg.engine, self.train_model, self.policy.tokenizer,
                                          reuse_kv=self.cfg.reuse_kv, model_path=self.cfg.model.path,
                                          dtype=self.model_dtype)  # not FSDP2's fp32 masters
            return
        self.roll_model = None if self._shares_train(plan) else self._sharded_copy(plan)
        self.engine = make_engine(self.cfg.engine, self.roll_model or self.train_model, self.policy.tokenizer,
                                  reuse_kv=self.cfg.reuse_kv, decode_steps=self.cfg.decode_steps,
                                  compile=self.cfg.compile_decode)

    def close_engine(self) -> None:
        """Stop an external engine's processes (vLLM's engine core): a worker under --nproc ends
        with `os._exit`, which skips their shutdown and would leave them running."""
        stop = getattr(getattr(self, "engine", None), "shutdown", None)
        if stop is not None:
            stop()

    def logprob_model(self) -> torch.nn.Module:
        return self.exp_model or self.train_model

    def train_weights(self) -> dict[str, torch.Tensor]:
        """This rank's training weights in the model dtype under the train plan's weight layout
        (its tp shard; gathered over dp under FSDP2). Collective."""
        return self.optim.weights()

    def train_tensors(self) -> dict[str, torch.Tensor]:
        """This rank's training weights and optimizer slices ("<param>/<state>")."""
        return {**self.train_weights(), **self.optim.state_tensors()}

    def restore(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """Load weights + optimizer slices already laid out for the current train plan."""
        self._build_train(self.plans.train, state=(tensors, step_count))
        self._build_rollout(self.plans.rollout)
        self._build_experience(self.plans.experience)

    def switch_train(self, plan: ParallelPlan, why: str, step: int) -> None:
        """Move weights + optimizer state to `plan` in flight."""
        t0 = span_start()
        old = self.plans.train
        rplan = plan_reshard(self.shapes, old, plan, self.world, optimizer_states=self.optim.state_names,
                             optimizer_itemsize=4)  # the optimizer's state is fp32
        src = self.train_tensors()
        step_count = self.optim.step_count
        dst = allocate_local(self.shapes, plan, self.rank, list(src), device=comm_device(),
                             dtype={n: t.dtype for n, t in src.items()})
        stats = execute_reshard(rplan, self.shapes, src, dst)
        self._build_train(plan, state=(dst, step_count))
        # copies are re-derived: a stage may now share the training module, or stop sharing it
        self._build_rollout(self.plans.rollout)
        self._build_experience(self.plans.experience)
        self._event(step, "train", old, plan, why, t0, stats.bytes_sent)

    def switch_rollout(self, plan: ParallelPlan, why: str, step: int) -> None:
        t0 = span_start()
        old = self.plans.rollout
        self._build_rollout(plan)  # weights arrive with this step's train -> rollout re-shard
        self._event(step, "rollout", old, plan, why, t0, 0)

    def switch_experience(self, plan: ParallelPlan, why: str, step: int) -> None:
        t0 = span_start()
        old = self.plans.experience
        self._build_experience(plan)  # weights arrive with this step's train -> experience re-shard
        nbytes = 0
        if self.ref_model is not None and plan.tp != self.ref_plan.tp:  # the reference follows
            ref = self._sharded_copy(plan)
            stats = execute_reshard(self.reshard_plan(self.ref_plan, plan), self.shapes,
                                    {n: p.detach() for n, p in self.ref_model.named_parameters()},
                                    {n: p.data for n, p in ref.named_parameters()})
            self.ref_model, nbytes = ref, stats.bytes_sent
        self.ref_plan = plan
        self._event(step, "experience", old, plan, why, t0, nbytes)

    def switch(self, stage: Stage, plan: ParallelPlan, why: str, step: int) -> None:
        {Stage.TRAIN: self.switch_train, Stage.ROLLOUT: self.switch_rollout,
         Stage.EXPERIENCE: self.switch_experience}[stage](plan, why, step)

    def _event(self, step, stage, old, new, why, t0, nbytes) -> None:
        self.events.append({"step": step, "stage": stage, "from": old.describe(), "to": new.describe(),
                            "reason": why})
        self.span(f"switch_{stage}", "reshard", t0, step, bytes=nbytes,
                  args={"from": old.describe(), "to": new.describe(), "reason": why})
        print0(f"step {step}: {stage} plan {old.describe()} -> {new.describe()} ({why})")

    def reshard_plan(self, src: ParallelPlan, dst: ParallelPlan) -> ReshardPlan:
        """The weights' re-shard plan from `src`'s layout to `dst`'s, made once per pair: it
        depends on nothing else (the parameter shapes and world are fixed), and planning costs
        ~30 us a tensor in Python, 0.8 ms of a 2-layer model's 2.7 ms sync at 2 ranks every
        step (docs/validate-history.md, twentieth session); `earl calibrate` times the sync without it."""
        key = (src, dst)
        if key not in self._reshard_plans:
            self._reshard_plans[key] = plan_reshard(self.shapes, src, dst, self.world)
        return self._reshard_plans[key]

    def sync_weights(self, stage: Stage, step: int) -> int:
        """Training weights -> the rollout engine (or a separate experience copy), every step.
        Returns the bytes this rank sent."""
        t0 = span_start()
        if stage is not Stage.ROLLOUT and hasattr(self.engine, "sleep"):
            self.engine.sleep()  # rollout is over: an engine with its own GPU memory frees it until the next sync
        if stage is Stage.ROLLOUT and self.roll_model is None and self.engine.model is not self.train_model:
            self.engine.update_weights((n, p.detach()) for n, p in self.train_model.named_parameters())
            self.span("weight_sync", "reshard", t0, step)
            return 0
        model = self.roll_model if stage is Stage.ROLLOUT else self.exp_model
        if model is None or self._synced == (model, self.optim.step_count):
            return 0  # already holds these weights (log-probs on the rollout's copy under FSDP2)
        rplan = self.reshard_plan(self.plans.train, self.plans.for_stage(stage))
        src = self.train_weights()
        dst = {n: p.data for n, p in model.named_parameters()}
        stats = execute_reshard(rplan, self.shapes, src, dst)
        self._synced = (model, self.optim.step_count)
        self.span(f"train_to_{stage.value}", "reshard", t0, step, bytes=stats.bytes_sent)
        return stats.bytes_sent

    def span(self, name, stage, t0: tuple, step, **kw) -> None:
        """Record a span that began at `t0` (`span_start()`, on this thread) and ends now, with
        the CPU seconds this process used meanwhile (`args["cpu_s"]`) and those of the thread
        that ran it (`args["thread_cpu_s"]`). Over the span's wall time, `cpu_s` is the share of
        a core the process got (earl.calibrate.validate reads it); the thread's leaves out gloo's
        own threads, whose event loop can spin for milliseconds while a message waits
        (studies/cpu_gloo_loop.py reads both; docs/validate-history.md, seventeenth session). `wait_s`:
        the seconds the thread waited for a core meanwhile (`thread_wait_s`; 0 off Linux);
        `loop_wait_s`: those its process's gloo loop threads waited (`loops_wait_s`); `sys_s`
        and `minflt`: the process's system CPU seconds (part of `cpu_s`) and minor page faults
        meanwhile (`kernel_usage`)."""
        wall0, cpu0, thread0, wait0, loops0, (sys0, flt0) = t0
        sys1, flt1 = kernel_usage()
        kw["args"] = {**kw.get("args", {}), "cpu_s": time.process_time() - cpu0,
                      "thread_cpu_s": time.thread_time() - thread0, "wait_s": thread_wait_s() - wait0,
                      "loop_wait_s": max(0.0, loops_wait_s() - loops0), "sys_s": sys1 - sys0,
                      "minflt": flt1 - flt0}
        self.spans.append(Span(name=name, stage=stage, rank=self.rank, t_start=wall0 - self.origin,
                               t_end=time.perf_counter() - self.origin, step=step, **kw))

    # ---- memory accounting -----------------------------------------------------------------
    def memory(self, plan: ParallelPlan, local_tokens: int, longest: int) -> MemoryBreakdown:
        """This rank's training memory under train `plan`, by the cost model's account
        (earl.cost_model.memory.train_memory) in the runtime's precision: the training copy, its
        gradients and AdamW state, the activations and logits of the largest micro-batch, and,
        with the weights, the other stages' copies the plan keeps resident."""
        copies = [p for p in (self.plans.rollout, self.plans.experience) if p.tp != plan.tp]
        if uses_dtensor(plan):  # stages run on copies
            copies = [self.plans.rollout] + ([self.plans.experience]
                                             if self.plans.experience.tp != self.plans.rollout.tp else [])
        if self.ref_model is not None:
            copies.append(self.ref_plan)
        spec, dtype_bytes = self.policy.spec, self.model_dtype.itemsize
        resident = sum(params_per_gpu(spec, c) * dtype_bytes for c in copies)
        mb_tokens = min(max(local_tokens, longest), max(self.cfg.trainer.token_budget, longest))
        return train_memory(spec, dataclasses.replace(plan, micro_batch=1), max(mb_tokens, 1), 0.0, 0.0,
                            precision=runtime_precision(dtype_bytes), resident_bytes=resident)

    def memory_bytes(self, plan: ParallelPlan, local_tokens: int, longest: int) -> float:
        """The total of `memory`: what the budget check compares with plan.memory_budget_mb."""
        return self.memory(plan, local_tokens, longest).total

    def check_budget(self, local_tokens: int, longest: int) -> None:
        budget = self.memory_budget_bytes
        if not budget:
            return
        need = torch.tensor([self.memory_bytes(self.plans.train, local_tokens, longest)], dtype=torch.float64,
                            device=comm_device())
        dist.all_reduce(need, op=dist.ReduceOp.MAX)
        if need.item() > budget:
            raise MemoryBudgetExceeded(f"train plan {self.plans.train.describe()} needs "
                                       f"{need.item() / 2**20:.1f} MiB on the busiest rank, budget "
                                       f"{budget / 2**20:.1f} MiB")

    def sparing_plan(self, tokens: int, longest: int) -> ParallelPlan | None:
        """A runnable train plan needing less accounted memory than the current one: the one
        closest to the budget from below (the least disruptive that fits), else the one needing
        the least (the step's check then tells whether that is enough)."""
        cur = self.memory_bytes(self.plans.train, tokens, longest)
        budget = self.memory_budget_bytes or float("inf")
        fits, least = None, None
        for tp in range(1, self.world + 1):
            if self.world % tp:
                continue
            for zero in (False, True):
                p = ParallelPlan(tp=tp, dp=self.world // tp, sharded_optimizer=zero)
                if runnable(p, self.world, self.policy.model.config, self.shapes):
                    continue
                m = self.memory_bytes(p, tokens * self.plans.train.dp // p.dp, longest)
                if m >= cur:
                    continue
                if m <= budget and (fits is None or m > fits[0]):
                    fits = (m, p)
                if least is None or m < least[0]:
                    least = (m, p)
        pick = fits or least
        return pick[1] if pick else None
