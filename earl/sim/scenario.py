"""Scenario files for `earl simulate`: TOML or YAML, read with safe loaders, plus `--set` overrides.

A scenario names the model, the cluster, the workload, the initial plan per RL stage and the
policies to evaluate. Files are sectioned (`[cluster]`, `[workload]`, ...); every key is also
addressable in dotted form (`--set cluster.nodes=4`, `--set workload.gen_tokens=300`) or, in
`--set`, by a unique leaf name (`--set nodes=4`). Unknown keys are errors naming the closest
valid keys. Files, keys and types are handled by earl.config_machinery. Built-in scenarios live in
`earl/sim/scenarios/*.toml` and load by name (`earl simulate tool-use`).

    python -c "from earl.sim.scenario import load_scenario; print(load_scenario(None, {'scenario.steps': '3'}))"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from earl.config_machinery import flatten, keys_of, read_mapping, replace_keys, resolve_values, to_flat
from earl.cost_model.resolve import resolve_network
from earl.parallel import validate_plan
from earl.specs import (
    ClusterSpec,
    HardwareSpec,
    ModelSpec,
    ParallelPlan,
    StagePlan,
)

from .workload import PRESETS, WorkloadSpec, preset

SCENARIOS_DIR = Path(__file__).parent / "scenarios"
SCHEDULE_MODES = ("sync", "async")
DEFAULT_SCENARIO = "default"


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Everything one simulated study needs. Plans use `ParallelPlan.parse` syntax."""

    name: str = "custom"  # label in outputs
    seed: int = 0  # workload seed (same episodes for every policy)
    steps: int = 20  # RL training steps to simulate
    model: str = "qwen2.5-7b"  # catalog name or path to an HF config.json
    hardware: str = "h100-sxm-80gb"  # hardware catalog name
    nodes: int = 1  # nodes in the cluster
    gpus_per_node: int = 0  # GPUs per node (0: the hardware's own count)
    network: str = "rdma-200g"  # inter-node network: catalog name or tcp-<Gbps>g[x<NICs>] / rdma-...
    profile: str = ""  # hardware profile name or JSON path ("": datasheet defaults)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    rollout_plan: str = "tp1-dp8"  # initial rollout plan
    experience_plan: str = "tp1-dp8"  # initial experience-preparation (log-prob) plan
    train_plan: str = "tp1-dp8"  # initial training plan
    selector: str = "static"  # parallelism selector for single-policy runs
    dispatcher: str = "centralized"  # data dispatcher for single-policy runs
    compare: tuple[str, ...] = ("static/centralized", "earl-table/centralized",
                                "cost-model/centralized", "cost-model/layout-aware")
    max_num_seqs: int = 256  # rollout engine: most sequences decoding at once per replica
    logprob_passes: int = 2  # experience: forward passes (reference + old policy log-probs)
    fine: bool = False  # one event per decode iteration (slow; for checking the fast mode)
    exact: bool = False  # simulate every rollout replica and every transfer (`--exact`)
    exact_up_to: int = 1024  # episodes per step up to which every replica is simulated anyway;
    #                          above it, replica classes (earl/sim/replica_classes.py)
    sample_episodes: int = 65536  # replica classes: log-probs and training of a larger batch are
    #                               priced on an evenly strided sample of about this many samples
    compact_draw_above: int = 65536  # episodes per step above which the workload is drawn compactly
    #                                  (table lookup, drawn turns only, own stream; 0: never)
    oom_restart_s: float = 0.0  # s charged to a step with an OOM event (job restart from checkpoint)
    mode: str = "sync"  # schedule: "sync" (stages in turn on all GPUs) | "async" (rollout pool + training pool)
    max_staleness: int = 1  # async: policy versions a trained sample may lag the trained policy
    partial_rollout: bool = False  # async: a weight update interrupts episodes (resumed on new weights)
    rollout_gpus: int = 0  # async: GPUs of the rollout pool, whole nodes (0: the cost model splits)

    def __post_init__(self):
        for n in ("steps", "nodes", "max_num_seqs", "logprob_passes", "exact_up_to", "sample_episodes"):
            v = getattr(self, n)
            low = 0 if n == "logprob_passes" else 1  # 0: a runtime that skips them (one optimizer step, no KL)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{_KEY_OF[n]} must be an integer >= {low}, got {v!r}")
        if not isinstance(self.oom_restart_s, (int, float)) or self.oom_restart_s < 0:
            raise ValueError(f"failure.oom_restart_s must be >= 0 seconds, got {self.oom_restart_s!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ValueError(f"cluster.gpus_per_node must be >= 1 (0: the hardware's own), got "
                             f"{self.gpus_per_node!r}")
        if self.mode not in SCHEDULE_MODES:
            raise ValueError(f"schedule.mode {self.mode!r}; valid: {', '.join(SCHEDULE_MODES)}")
        for n in ("max_staleness", "rollout_gpus", "compact_draw_above"):
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{_KEY_OF[n]} must be an integer >= 0, got {v!r}")
        for entry in self.compare:
            if entry.count("/") != 1:
                raise ValueError(f"policy.compare entry {entry!r} must be 'selector/dispatcher', "
                                 "e.g. 'cost-model/layout-aware'")

    # ---- derived specs (each call validates against the catalogs) ---------------------------
    def model_spec(self) -> ModelSpec:
        p = Path(self.model)
        if p.suffix == ".json" or p.is_dir():
            return ModelSpec.from_hf_config(p)
        return ModelSpec.from_name(self.model)

    def cluster_spec(self) -> ClusterSpec:
        hw = HardwareSpec.from_name(self.hardware)
        return ClusterSpec(hardware=hw, nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                           network=resolve_network(self.network))  # the names `earl estimate` takes

    def workload_spec(self) -> WorkloadSpec:
        """The workload on this cluster (`workload.episodes_per_gpu` resolved)."""
        return self.workload.for_cluster(self.cluster_spec().num_gpus)

    def open_plans(self) -> StagePlan:
        """The plans as written; a stage without a dp degree has dp = -1 (fills its GPUs)."""
        return StagePlan(rollout=parse_stage_plan(self.rollout_plan),
                         experience=parse_stage_plan(self.experience_plan),
                         train=parse_stage_plan(self.train_plan))

    def pool_gpus(self, rollout_gpus: int | None = None) -> dict[str, int]:
        """GPUs each stage runs on: all of them (sync), or the rollout pool (the first ranks) and
        the training pool (async; `rollout_gpus` overrides schedule.rollout_gpus; 0 there: half,
        for checking)."""
        gpus = self.cluster_spec().num_gpus
        if self.mode == "sync":
            return {"rollout": gpus, "experience": gpus, "train": gpus}
        ro = rollout_gpus or self.rollout_gpus or gpus // 2
        if not 0 < ro < gpus:
            raise ValueError(f"schedule.rollout_gpus = {ro}: the rollout pool must leave GPUs to "
                             f"train (cluster: {gpus} GPUs; 0: the cost model splits)")
        return {"rollout": ro, "experience": gpus - ro, "train": gpus - ro}

    def stage_plan(self, rollout_gpus: int | None = None) -> StagePlan:
        """The initial plans, resolved against their stage's GPUs (`pool_gpus`) and checked on
        the model. A plan without a dp factor (`tp8`, `tp4-pp2`) fills the stage's GPUs with
        data parallelism."""
        model, pools = self.model_spec(), self.pool_gpus(rollout_gpus)
        plans = {}
        for stage, text in (("rollout", self.rollout_plan), ("experience", self.experience_plan),
                            ("train", self.train_plan)):
            gpus = pools[stage]
            try:
                plans[stage] = validate_plan(parse_stage_plan(text), model, world=gpus)
            except ValueError as e:
                where = "the cluster" if self.mode == "sync" else f"its {self.mode} pool"
                raise ValueError(f"plan.{stage} = {text!r} does not match {where} "
                                 f"({gpus} of {self.nodes} x {self.cluster_spec().gpus_per_node} "
                                 f"GPUs, {model.name}): {e}") from None
        per_node = self.cluster_spec().gpus_per_node
        for stage, plan in plans.items():
            if plan.tp > per_node:
                valid = ", ".join(str(t) for t in range(1, per_node + 1) if per_node % t == 0)
                raise ValueError(f"plan.{stage} = {plan.describe()!r}: tp {plan.tp} spans more than a node's "
                                 f"{per_node} GPUs (tensor parallelism runs inside a node); valid tp: {valid}")
        ro = plans["rollout"]
        if ro.pp != 1 or ro.cp != 1:
            raise ValueError(f"plan.rollout = {self.rollout_plan!r}: rollout engines use tp x dp "
                             "only (pp=1, cp=1)")
        return StagePlan(**plans)

    def policies(self, compare: bool) -> list[tuple[str, str]]:
        """(selector, dispatcher) pairs to simulate."""
        pairs = [tuple(e.split("/")) for e in self.compare] if compare else \
            [(self.selector, self.dispatcher)]
        from earl.policies import DISPATCHERS, SELECTORS

        for sel, disp in pairs:
            if sel not in SELECTORS:
                raise ValueError(f"unknown selector {sel!r}; valid: {', '.join(sorted(SELECTORS))}")
            if disp not in DISPATCHERS:
                raise ValueError(f"unknown dispatcher {disp!r}; valid: "
                                 f"{', '.join(sorted(DISPATCHERS))}")
        return pairs

    def check(self) -> Scenario:
        """Resolve every name and plan once so mistakes surface before simulating."""
        self.stage_plan()
        if self.profile:
            from earl.cost_model.profile import load_profile

            load_profile(self.profile)
        return self

    def to_flat(self) -> dict:
        """The scenario as dotted keys (what `--set` accepts), for summary.json."""
        return to_flat(self, KEYS)


def parse_stage_plan(text: str) -> ParallelPlan:
    """`ParallelPlan.parse`, where a plan that names no dp degree takes all the stage's GPUs:
    `tp8` on 16,384 GPUs is tp8-dp2048."""
    plan = ParallelPlan.parse(text)
    if not any(p.startswith("dp") for p in text.lower().split("-")):
        plan = dataclasses.replace(plan, dp=-1)
    return plan


# public dotted key of each Scenario attribute (workload fields keep their own: workload.gen_tokens)
KEY_NAMES = {
    "name": "scenario.name", "seed": "scenario.seed", "steps": "scenario.steps",
    "model": "model.name",
    "hardware": "cluster.hardware", "nodes": "cluster.nodes", "gpus_per_node": "cluster.gpus_per_node",
    "network": "cluster.network", "profile": "cluster.profile",
    "rollout_plan": "plan.rollout", "experience_plan": "plan.experience", "train_plan": "plan.train",
    "selector": "policy.selector", "dispatcher": "policy.dispatcher", "compare": "policy.compare",
    "max_num_seqs": "engine.max_num_seqs", "fine": "engine.fine",
    "logprob_passes": "experience.logprob_passes",
    "exact": "engine.exact", "exact_up_to": "engine.exact_up_to",
    "sample_episodes": "engine.sample_episodes", "compact_draw_above": "engine.compact_draw_above",
    "oom_restart_s": "failure.oom_restart_s",
    "mode": "schedule.mode", "max_staleness": "schedule.max_staleness",
    "partial_rollout": "schedule.partial_rollout", "rollout_gpus": "schedule.rollout_gpus",
    "workload.name": "workload.preset",  # picks the base workload; other workload keys override it
}
KEYS = keys_of(Scenario, rename=KEY_NAMES, what="scenario")
_KEY_OF = {k.path[0]: name for name, k in KEYS.items() if len(k.path) == 1}


def read_scenario_file(path: str | Path) -> dict:
    """A scenario file as dotted keys -> values (TOML via tomllib, YAML via yaml.safe_load)."""
    data = read_mapping(path, "scenario file", f" (built-in scenarios: {', '.join(builtin_scenarios())})")
    return flatten(data, where=str(path))


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.toml"))


def resolve_scenario_path(name_or_path: str | Path | None) -> Path:
    """A built-in scenario name (or None for the default) or a file path."""
    if name_or_path is None:
        return SCENARIOS_DIR / f"{DEFAULT_SCENARIO}.toml"
    p = Path(name_or_path)
    if not p.suffix and (SCENARIOS_DIR / f"{p.name}.toml").is_file() and not p.exists():
        return SCENARIOS_DIR / f"{p.name}.toml"
    return p


def build_scenario(values: dict, where: str = "scenario") -> Scenario:
    """Typed dotted keys -> Scenario (workload.preset picks the base workload, other workload
    keys override it)."""
    values = dict(values)
    if values.get("workload.episodes_per_gpu") and "workload.episodes_per_step" in values:
        raise ValueError(f"workload.episodes_per_step and workload.episodes_per_gpu both set in "
                         f"{where}: give one (episodes_per_gpu scales the batch with the cluster)")
    name = values.pop("workload.preset", None)
    custom = name is None or name == WorkloadSpec().name  # "custom": the defaults (as to_flat writes)
    base = Scenario() if custom else Scenario(workload=preset(name))
    return replace_keys(base, values, KEYS, where=where)


def load_scenario(name_or_path: str | Path | None = None, sets: dict | None = None) -> Scenario:
    """File (or built-in name; None: the default) + `--set` overrides -> a checked Scenario."""
    path = resolve_scenario_path(name_or_path)
    from_file = resolve_values(read_scenario_file(path), KEYS, where=str(path), leaf=False)
    from_sets = resolve_values(sets or {}, KEYS, where="--set")
    # the batch is either per step or per GPU: the one given on the command line wins
    for given, other in (("workload.episodes_per_step", "workload.episodes_per_gpu"),
                         ("workload.episodes_per_gpu", "workload.episodes_per_step")):
        if given in from_sets and other not in from_sets:
            from_file.pop(other, None)
    if "workload.preset" in from_sets:
        # a new preset replaces the file's workload wholesale, keeping only explicit --set keys
        from_file = {k: v for k, v in from_file.items() if not k.startswith("workload.")}
    merged = {**from_file, **from_sets}
    return build_scenario(merged, where=str(path) if not sets else f"{path} / --set").check()


__all__ = ["Scenario", "KEYS", "PRESETS", "load_scenario", "build_scenario", "builtin_scenarios",
           "read_scenario_file", "parse_stage_plan"]
