"""One rank's state in the multi-process runtime: the policy's copies under each stage's plan
(train + ZeRO-1 optimizer, rollout engine, optional experience copy), in-flight plan switches
(weights, and for training the optimizer state, re-sharded without a restart), and the per-rank
memory accounting the CPU budget is enforced from.

    OMP_NUM_THREADS=1 python -m pytest -q -m slow tests/runtime/test_dist_loop.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from earl.parallel import build_plan_groups
from earl.policies.reshard import plan_reshard
from earl.runtime.config import RunConfig
from earl.runtime.dist import comm_device, print0
from earl.runtime.dist_advantages import AdvantageSpec
from earl.runtime.dist_train import STATES, make_dist_trainer
from earl.runtime.engine import TorchEngine
from earl.runtime.loop import sampling_params
from earl.runtime.model import load_policy
from earl.runtime.reshard import allocate_local, execute_reshard
from earl.runtime.tp import apply_tp, check_tp, param_shapes
from earl.specs import ParallelPlan, Stage, StagePlan
from earl.trace import Span

ONE = ParallelPlan()


@dataclass(frozen=True, kw_only=True)
class DistOptions:
    """What the multi-process runtime adds to a RunConfig."""

    rollout_plan: ParallelPlan  # tp x dp of the rollout engines (world = tp * dp)
    train_plan: ParallelPlan  # tp x dp of training (sharded_optimizer: ZeRO-1)
    experience_plan: ParallelPlan | None = None  # tp x dp of the log-prob pass; None: the train plan's
    memory_budget_bytes: float = 0.0  # per-rank budget from the runtime's accounting; 0 = none
    schedule: tuple[tuple[int, str, str], ...] = ()  # scripted decisions (step, stage, plan)


class MemoryBudgetExceeded(RuntimeError):
    pass


def check_supported(cfg: RunConfig) -> None:
    """What the multi-process runtime does not run yet, as one-line errors."""
    t = cfg.trainer
    if t.kl_coef:
        raise ValueError(f"the multi-process runtime has no reference model yet: trainer.kl_coef must be 0, "
                         f"got {t.kl_coef}")
    if t.minibatches != 1:
        raise ValueError(f"the multi-process runtime takes one optimizer step per training step "
                         f"(trainer.minibatches=1), got {t.minibatches}")
    if cfg.engine != "pytorch":
        raise ValueError(f"the multi-process runtime runs the pytorch engine, got engine={cfg.engine}")


def runnable(plan: ParallelPlan, world: int, config) -> str:
    """'' if the runtime can run `plan`, else why not."""
    if plan.pp != 1 or plan.cp != 1:
        return "pp/cp > 1 not supported by the CPU runtime"
    if plan.world_size != world:
        return f"needs {plan.world_size} ranks, the job has {world}"
    try:
        check_tp(config, plan.tp)
    except ValueError as e:
        return str(e)
    return ""


class DistRun:
    """State of one rank: models, optimizer, plans, recorder (rank 0)."""

    def __init__(self, cfg: RunConfig, opts: DistOptions, out: Path, rank: int, world: int):
        check_supported(cfg)
        self.cfg, self.opts, self.out, self.rank, self.world = cfg, opts, out, rank, world
        self.policy = load_policy(cfg.model.path, seed=cfg.seed, dtype=cfg.model.dtype)
        self.shapes = param_shapes(self.policy.model)
        self.params = sampling_params(cfg)
        self.advantages = AdvantageSpec(estimator=cfg.trainer.algo, per_turn=cfg.trainer.baseline == "per-turn")
        exp_plan = opts.experience_plan or opts.train_plan
        for plan in (opts.rollout_plan, exp_plan, opts.train_plan):
            why = runnable(plan, world, self.policy.model.config)
            if why:
                raise ValueError(f"plan {plan.describe()}: {why}")
        self.plans = StagePlan(rollout=opts.rollout_plan, experience=exp_plan, train=opts.train_plan)
        self.train_groups = self.roll_groups = self.exp_groups = None
        self.exp_model = None  # None: the log-prob pass runs on the train model (same tp x dp)
        self.exp_follows_train = opts.experience_plan is None  # until the experience plan is switched
        self.events: list[dict] = []  # plan switches / re-plans of the current step
        self.spans: list[Span] = []
        self.origin = time.perf_counter()
        self._build_train(opts.train_plan, init_full=self.policy.model)
        self._build_rollout(opts.rollout_plan)
        self._build_experience(exp_plan)

    # ---- models under plans --------------------------------------------------------------
    def _fresh(self) -> torch.nn.Module:
        return load_policy(self.cfg.model.path, seed=self.cfg.seed, dtype=self.cfg.model.dtype).model

    def _build_train(self, plan: ParallelPlan, init_full=None, state=None) -> None:
        """(Re)build the train model + optimizer under `plan`; weights and optimizer state come
        from `init_full` (a full model on every rank) or `state` (tensors re-sharded to plan)."""
        g = build_plan_groups(plan)
        model = init_full if init_full is not None else self._fresh()
        apply_tp(model, plan.tp, g.tp_rank, g.tp_group).to(comm_device())
        self.trainer, self.optim = make_dist_trainer(model, self.shapes, g, self.cfg.trainer,
                                                     temperature=self.params.logprob_temperature)
        if state is not None:
            tensors, step_count = state
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(tensors[n])
            self.optim.load_state_tensors(tensors, step_count)
        self.train_model, self.train_groups = model, g
        self.plans = self.plans.with_stage(Stage.TRAIN, plan)

    def _build_experience(self, plan: ParallelPlan) -> None:
        """The log-prob model: the train model itself when the layouts agree, else its own copy
        (weights re-sharded from training every step)."""
        g = build_plan_groups(plan)
        same = (plan.tp, plan.dp) == (self.plans.train.tp, self.plans.train.dp)
        self.exp_model = None if same else apply_tp(self._fresh(), plan.tp, g.tp_rank, g.tp_group).to(
            comm_device()).eval()
        self.exp_groups = self.train_groups if same else g
        self.plans = self.plans.with_stage(Stage.EXPERIENCE, plan)

    def _build_rollout(self, plan: ParallelPlan) -> None:
        g = build_plan_groups(plan)
        model = apply_tp(self._fresh(), plan.tp, g.tp_rank, g.tp_group).to(comm_device()).eval()
        self.roll_model, self.roll_groups = model, g
        self.engine = TorchEngine(model, self.policy.tokenizer, reuse_kv=self.cfg.reuse_kv)
        self.plans = self.plans.with_stage(Stage.ROLLOUT, plan)

    def _train_tensors(self) -> dict[str, torch.Tensor]:
        return {**{n: p.detach() for n, p in self.train_model.named_parameters()},
                **self.optim.state_tensors()}

    def switch_train(self, plan: ParallelPlan, why: str, step: int) -> None:
        """Move weights + optimizer state to `plan` in flight."""
        t0 = time.perf_counter()
        old = self.plans.train
        rplan = plan_reshard(self.shapes, old, plan, self.world, optimizer_states=STATES)
        src = self._train_tensors()
        step_count = self.optim.step_count
        dst = allocate_local(self.shapes, plan, self.rank, list(src), device=comm_device())
        stats = execute_reshard(rplan, self.shapes, src, dst)
        self._build_train(plan, state=(dst, step_count))
        # the experience copy is re-derived: it may now coincide with (or differ from) training
        self._build_experience(plan if self.exp_follows_train else self.plans.experience)
        self._event(step, "train", old, plan, why, t0, stats.bytes_sent)

    def switch_rollout(self, plan: ParallelPlan, why: str, step: int) -> None:
        t0 = time.perf_counter()
        old = self.plans.rollout
        self._build_rollout(plan)  # weights arrive with this step's train -> rollout re-shard
        self._event(step, "rollout", old, plan, why, t0, 0)

    def switch_experience(self, plan: ParallelPlan, why: str, step: int) -> None:
        t0 = time.perf_counter()
        old = self.plans.experience
        self.exp_follows_train = False
        self._build_experience(plan)  # weights arrive with this step's train -> experience re-shard
        self._event(step, "experience", old, plan, why, t0, 0)

    def _event(self, step, stage, old, new, why, t0, nbytes) -> None:
        self.events.append({"step": step, "stage": stage, "from": old.describe(), "to": new.describe(),
                            "reason": why})
        self.span(f"switch_{stage}", "reshard", t0, step, bytes=nbytes,
                  args={"from": old.describe(), "to": new.describe(), "reason": why})
        print0(f"step {step}: {stage} plan {old.describe()} -> {new.describe()} ({why})")

    def sync_weights(self, stage: Stage, step: int) -> int:
        """Train weights -> the rollout (or a separate experience) model's layout, every step."""
        model = self.roll_model if stage is Stage.ROLLOUT else self.exp_model
        if model is None:
            return 0
        t0 = time.perf_counter()
        rplan = plan_reshard(self.shapes, self.plans.train, self.plans.for_stage(stage), self.world)
        src = {n: p.detach() for n, p in self.train_model.named_parameters()}
        dst = {n: p.data for n, p in model.named_parameters()}
        stats = execute_reshard(rplan, self.shapes, src, dst)
        self.span(f"train_to_{stage.value}", "reshard", t0, step, bytes=stats.bytes_sent)
        return rplan.total_bytes

    def span(self, name, stage, t0, step, **kw) -> None:
        self.spans.append(Span(name=name, stage=stage, rank=self.rank, t_start=t0 - self.origin,
                               t_end=time.perf_counter() - self.origin, step=step, **kw))

    # ---- memory accounting -----------------------------------------------------------------
    def memory_bytes(self, plan: ParallelPlan, local_tokens: int, longest: int) -> float:
        """This rank's bytes under train `plan`: both model copies, grads, AdamW slices, and the
        activations of the largest micro-batch (hidden states per layer + fp32 logits)."""
        spec = self.policy.spec
        item = next(iter(self.shapes.values())).itemsize  # parameter dtype bytes

        def shard_bytes(tp: int) -> float:
            return sum(_numel(s.shape) // (tp if s.tp_dim is not None else 1) * s.itemsize
                       for s in self.shapes.values())

        weights = shard_bytes(plan.tp)  # and as many for the gradients
        opt = weights * 2 / (plan.dp if plan.sharded_optimizer else 1)  # AdamW: exp_avg, exp_avg_sq
        copies = [self.plans.rollout] + ([self.plans.experience] if self.exp_model is not None else [])
        others = sum(shard_bytes(c.tp) for c in copies)
        mb_tokens = min(max(local_tokens, longest), max(self.cfg.trainer.token_budget, longest))
        # saved activations ~16 hidden-sized tensors per layer and token (tp-sharded), fp32 logits x3
        act = mb_tokens * (spec.num_layers * 16 * spec.hidden_size / plan.tp * item + 3 * spec.vocab_size * 4)
        return weights * 2 + opt + others + act

    def check_budget(self, local_tokens: int, longest: int, step: int) -> None:
        budget = self.opts.memory_budget_bytes
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
        budget = self.opts.memory_budget_bytes or float("inf")
        fits, least = None, None
        for tp in range(1, self.world + 1):
            if self.world % tp:
                continue
            for zero in (False, True):
                p = ParallelPlan(tp=tp, dp=self.world // tp, sharded_optimizer=zero)
                if runnable(p, self.world, self.policy.model.config):
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


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


