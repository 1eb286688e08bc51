"""Scenario files for `earl simulate`: TOML or YAML, read with safe loaders, plus `--set` overrides.

A scenario names the model, the cluster, the workload, the initial plan per RL stage and the
policies to evaluate. Files are sectioned (`[cluster]`, `[workload]`, ...); every key is also
addressable in dotted form (`--set cluster.nodes=4`, `--set workload.gen_tokens=300`) or, in
`--set`, by a unique leaf name (`--set nodes=4`). Unknown keys are errors naming the closest
valid keys. Files, keys and types are handled by earl.config. Built-in scenarios live in
`earl/sim/scenarios/*.toml` and load by name (`earl simulate tool-use`).

    python -c "from earl.sim.scenario import load_scenario; print(load_scenario(None, {'scenario.steps': '3'}))"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from earl.config import flatten, keys_of, read_mapping, replace_keys, resolve_values, to_flat
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
    oom_restart_s: float = 0.0  # s charged to a step with an OOM event (job restart from checkpoint)

    def __post_init__(self):
        for n in ("steps", "nodes", "max_num_seqs", "logprob_passes"):
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{_KEY_OF[n]} must be an integer >= 1, got {v!r}")
        if not isinstance(self.oom_restart_s, (int, float)) or self.oom_restart_s < 0:
            raise ValueError(f"failure.oom_restart_s must be >= 0 seconds, got {self.oom_restart_s!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ValueError(f"cluster.gpus_per_node must be >= 1 (0: the hardware's own), got "
                             f"{self.gpus_per_node!r}")
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

    def stage_plan(self) -> StagePlan:
        """The initial plans, resolved against the cluster's GPU count and checked on the model."""
        model, gpus = self.model_spec(), self.cluster_spec().num_gpus
        plans = {}
        for stage, text in (("rollout", self.rollout_plan), ("experience", self.experience_plan),
                            ("train", self.train_plan)):
            try:
                plans[stage] = validate_plan(ParallelPlan.parse(text), model, world=gpus)
            except ValueError as e:
                raise ValueError(f"plan.{stage} = {text!r} does not match the cluster "
                                 f"({self.nodes} x {self.cluster_spec().gpus_per_node} = {gpus} "
                                 f"GPUs, {model.name}): {e}") from None
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
    "oom_restart_s": "failure.oom_restart_s",
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
    name = values.pop("workload.preset", None)
    custom = name is None or name == WorkloadSpec().name  # "custom": the defaults (as to_flat writes)
    base = Scenario() if custom else Scenario(workload=preset(name))
    return replace_keys(base, values, KEYS, where=where)


def load_scenario(name_or_path: str | Path | None = None, sets: dict | None = None) -> Scenario:
    """File (or built-in name; None: the default) + `--set` overrides -> a checked Scenario."""
    path = resolve_scenario_path(name_or_path)
    from_file = resolve_values(read_scenario_file(path), KEYS, where=str(path), leaf=False)
    from_sets = resolve_values(sets or {}, KEYS, where="--set")
    if "workload.preset" in from_sets:
        # a new preset replaces the file's workload wholesale, keeping only explicit --set keys
        from_file = {k: v for k, v in from_file.items() if not k.startswith("workload.")}
    merged = {**from_file, **from_sets}
    return build_scenario(merged, where=str(path) if not sets else f"{path} / --set").check()


__all__ = ["Scenario", "KEYS", "PRESETS", "load_scenario", "build_scenario", "builtin_scenarios",
           "read_scenario_file"]
