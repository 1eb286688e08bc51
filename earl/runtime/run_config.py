"""The configuration of `earl run`: one frozen dataclass per component plus the run itself.

Sources, later ones winning: the built-in default (tiny model, Tic-Tac-Toe vs a random
opponent), a TOML/YAML file (sections [model], [env], [sampling], [trainer], top-level run keys),
CLI flags, then `--set key=value` (dotted `trainer.lr=3e-4`, or a leaf name that is unique).
A typo is an error naming the close matches. The machinery (files, keys, types) is earl.config_machinery.

    earl run --set trainer.lr=3e-3 --set steps=50
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from earl import config_machinery as config
from earl.policies.registry import DISPATCHERS, SELECTORS

ALGOS = ("grpo", "reinforce++", "rloo")
GROUP_ALGOS = ("grpo", "rloo")  # advantages relative to the other episodes of a prompt group
# the loss variants' names (the math: earl.runtime.losses).
# token: every generated token of the (global) batch weighs the same (DAPO; TRL "dapo"/"bnpo");
# sequence: mean over each sequence's tokens, then over sequences (GRPO's paper; TRL "grpo");
# constant: token sum over (sequences x a fixed token count) (Dr. GRPO; TRL "dr_grpo")
AGGREGATIONS = ("token", "sequence", "constant")
RATIO_LEVELS = ("token", "sequence")  # sequence: GSPO's length-normalised sequence ratio
KL_ESTIMATORS = ("k1", "k2", "k3")  # Schulman's estimators of KL(pi || ref) from samples of pi
LR_DECAYS = ("none", "linear", "cosine")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    path: str = "tiny"  # a built-in name (tiny, tiny-wide, tiny-llama) or a local HF checkpoint dir
    dtype: str = "fp32"  # fp32 | bf16 | fp16
    device: str = "cpu"  # torch device for the single-process runtime (cpu, cuda, cuda:1)


@dataclass(frozen=True, kw_only=True)
class HardwareConfig:
    # The profile the selector's cost model prices plans with: "auto" (a calibrated profile
    # shipped for the running device, else its datasheet profile), a profile name, or a JSON path.
    profile: str = "auto"


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """Initial plans per RL stage (`ParallelPlan.parse` syntax); empty = the default for the
    world size N: rollout tp1-dpN, training tp1-dpN (`zero`, on FSDP2, when N > 1 and FSDP2 can
    shard the model N ways), experience = training."""

    rollout: str = ""
    experience: str = ""
    train: str = ""
    memory_budget_mb: float = 0.0  # per-rank budget from the runtime's memory account, MiB; 0 = none
    schedule: tuple[str, ...] = ()  # scripted switches "STEP:rollout|experience|train:PLAN"

    def __post_init__(self):
        if not self.memory_budget_mb >= 0:
            raise ValueError(f"plan.memory_budget_mb must be >= 0, got {self.memory_budget_mb}")


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    selector: str = "static"  # static | earl-table | cost-model
    dispatcher: str = "layout-aware"  # centralized | layout-aware


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    # tic-tac-toe | connect-four | calculator | openspiel:GAME | jsonl:PATH | reasoning-gym:TASK |
    # a user's class FILE.py:Class or package.module:Class (docs/environments.md)
    name: str = "tic-tac-toe"
    opponent: str = "random"  # games: random | lookahead (built-in) | mcts (openspiel)
    agent_starts: str = "always"  # games: always | never | alternate
    invalid_action: str = "end"  # games: end the episode, "retry", or "substitute" (charged; a random legal move)
    invalid_reward: float = -1.0  # games: reward of an invalid move (per-try share in retry mode)
    max_retries: int = 2  # games: consecutive invalid tries allowed in retry mode
    valid_move_reward: float = 0.1  # games: reward of each legal move (dense shaping)
    # tic-tac-toe: "board" (the whole board each turn, free cells as digits) | "moves" (the
    # moves so far, so the digits in the context are exactly the taken cells)
    show: str = "moves"
    max_turns: int = 4  # calculator, jsonl with tools: model turns per episode
    tool_timeout_s: float = 1.0  # calculator, jsonl: seconds before a tool call becomes an error
    reward: str = ""  # jsonl: the reward function, FILE.py:FUNC (FUNC(sample, messages) -> float)
    tools: tuple[str, ...] = ()  # jsonl: registered tools the model may call (calculator)
    reward_timeout_s: float = 5.0  # jsonl: seconds per reward-function call before it is stopped (reward 0)
    # jsonl: a step whose reward_error_rate reaches this fraction stops the run (1 = only when
    # every episode's reward call failed)
    max_reward_error_rate: float = 1.0
    options: tuple[str, ...] = ()  # user classes, reasoning-gym: constructor keywords "KEY=VALUE" (JSON values)
    env_timeout_s: float = 10.0  # user classes: seconds per reset/step call before the episode is an env_error

    def __post_init__(self):
        for key in ("tool_timeout_s", "reward_timeout_s", "env_timeout_s"):
            value = getattr(self, key)
            if not 0 < value < float("inf"):
                raise ValueError(f"env.{key} must be a finite number of seconds > 0, got {value}")
        if not 0 < self.max_reward_error_rate <= 1:
            raise ValueError(f"env.max_reward_error_rate must be in (0, 1] (1: stop only when every reward "
                             f"call of a step failed), got {self.max_reward_error_rate}")


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass
    max_new_tokens: int | None = None  # tokens per turn, >= 1; None = the environment's default
    stop: tuple[str, ...] = ()  # stop strings; empty = the environment's default
    max_context: int = 4096  # tokens per episode; longer episodes are cut (outcome "truncated")

    def __post_init__(self):
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"sampling.temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1 (or none: the environment's default), "
                             f"got {self.max_new_tokens}")
        if self.max_context < 2:
            raise ValueError(f"sampling.max_context must be >= 2 tokens, got {self.max_context}")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    algo: str = "reinforce++"  # reinforce++ | grpo | rloo (leave-one-out group baseline; the grpo loss)
    lr: float = 2e-3  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    clip_eps: float = 0.2  # PPO ratio clip
    clip_eps_low: float | None = None  # ratio floor 1 - clip_eps_low; None = clip_eps
    clip_eps_high: float | None = None  # ratio ceiling 1 + clip_eps_high (DAPO's clip-higher: 0.28); None = clip_eps
    dual_clip: float = 0.0  # dual-clip c > 1: a negative-advantage token's loss is capped at -c * adv; 0 = off
    ratio_level: str = "token"  # token | sequence (GSPO: one length-normalised ratio per sequence)
    # how token losses add up: token (mean over the batch's tokens, DAPO) | sequence (mean per
    # sequence, then over sequences, GRPO's paper) | constant (sum over sequences x loss_tokens, Dr. GRPO)
    loss_agg: str = "token"
    loss_tokens: int = 0  # loss_agg constant: the fixed tokens per sequence the sum is divided by (>= 1)
    kl_coef: float = 0.0  # KL to the frozen initial model; 0 = no reference model
    kl_estimator: str = "k3"  # grpo/rloo's KL term per token: k1 | k2 | k3 (earl.runtime.losses.kl_estimate)
    # grpo/rloo: the KL term times the policy ratio (with its gradient): the unbiased reverse-KL
    # gradient off-policy (DeepSeek-V3.2; TRL's use_bias_correction_kl default); false = the plain term
    kl_ratio_weighted: bool = False
    # dynamic sampling (DAPO): drop the groups whose rewards are all equal before the experience
    # stage (their group-relative advantages are 0); the count is the metric groups_filtered
    filter_uniform_groups: bool = False
    # games: weight of the legality term, -log P(a legal move) at each move from the env's legal
    # moves (Env.actions / legal_action_bits; a dense per-move signal); 0 = off
    legal_coef: float = 5.0
    entropy_coef: float = 0.01  # entropy bonus on generated tokens (keeps the policy from saturating); 0: not computed
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    token_budget: int = 16384  # padded tokens per micro-batch (forward+backward at once)
    minibatches: int = 1  # optimizer steps per training step (the batch is split)
    baseline: str = "per-turn"  # reinforce++: per-turn (mean return-to-go per turn index) | batch
    gamma: float = 1.0  # reinforce++: discount per turn of the return-to-go, in [0, 1] (1: undiscounted)
    lr_decay: str = "none"  # none | linear (to lr_min_frac * lr at the last step) | cosine
    lr_min_frac: float = 0.1  # final lr as a fraction of lr when decaying
    # truncated importance sampling: each token's policy-gradient loss times the detached
    # min(pi_trainer_old / pi_engine, tis_cap), correcting for the rollout engine's log-prob
    # mismatch (earl.runtime.mismatch); 0 = off, else the cap C (a ratio, >= 1; verl uses 2)
    tis_cap: float = 0.0

    @property
    def clip_low(self) -> float:
        return self.clip_eps if self.clip_eps_low is None else self.clip_eps_low

    @property
    def clip_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def __post_init__(self):
        for key, valid in (("loss_agg", AGGREGATIONS), ("ratio_level", RATIO_LEVELS), ("kl_estimator", KL_ESTIMATORS)):
            if getattr(self, key) not in valid:
                raise ValueError(f"trainer.{key} {getattr(self, key)!r} unknown; valid: {', '.join(valid)}")
        for key in ("clip_eps", "clip_eps_low", "clip_eps_high"):
            value = getattr(self, key)
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"trainer.{key} must be a finite number >= 0, got {value}")
        if self.clip_low >= 1:
            raise ValueError(f"trainer.clip_eps_low must be < 1 (the ratio floor 1 - eps stays > 0), "
                             f"got {self.clip_low}")
        if not (self.dual_clip == 0 or 1 < self.dual_clip < float("inf")):
            raise ValueError(f"trainer.dual_clip must be 0 (off) or a finite c > 1, got {self.dual_clip}")
        if self.loss_agg == "constant" and self.loss_tokens < 1:
            raise ValueError(f"trainer.loss_agg constant divides by sequences x trainer.loss_tokens: loss_tokens "
                             f"must be >= 1, got {self.loss_tokens}")
        if not 0 <= self.legal_coef < float("inf"):
            raise ValueError(f"trainer.legal_coef must be a finite number >= 0 (0: off), got {self.legal_coef}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"trainer.gamma must be in [0, 1] (1: undiscounted), got {self.gamma}")
        if not (self.tis_cap == 0 or 1 <= self.tis_cap < float("inf")):
            raise ValueError(f"trainer.tis_cap must be 0 (off) or a finite cap >= 1, got {self.tis_cap}")


SCHEDULE_MODES = ("sync", "async")  # the simulator's schedule.mode values (earl.sim.scenario)


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """How the stages share the processes; the simulator's `schedule` keys, same names and meanings."""

    mode: str = "sync"  # sync (stages in turn on every process) | async (a rollout pool + a training pool)
    max_staleness: int = 1  # async: policy versions a trained sample may lag the policy it trains (>= 1)
    partial_rollout: bool = False  # async: a weight update reaches episodes in flight (between decode steps)
    rollout_gpus: int = 0  # async: processes of the rollout pool; 0 = the cost model splits (choose_pool_split)

    def __post_init__(self):
        if self.mode not in SCHEDULE_MODES:
            raise ValueError(f"schedule.mode {self.mode!r} unknown; valid: {', '.join(SCHEDULE_MODES)}")
        if isinstance(self.max_staleness, bool) or self.max_staleness < 1:
            raise ValueError(f"schedule.max_staleness must be an integer >= 1 (policy versions), "
                             f"got {self.max_staleness!r}")
        if isinstance(self.rollout_gpus, bool) or self.rollout_gpus < 0:
            raise ValueError(f"schedule.rollout_gpus must be an integer >= 0 (0: the cost model splits), "
                             f"got {self.rollout_gpus!r}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    steps: int = 600  # training steps
    groups: int = 128  # prompt groups per step (distinct env seeds)
    group_size: int = 1  # episodes per group sharing a seed (GRPO's G; grpo needs >= 2)
    seed: int = 0  # seeds the model init, sampling and the environments
    engine: str = "pytorch"  # pytorch | pytorch-static | vllm
    reuse_kv: bool = True  # keep each episode's KV cache across turns
    decode_steps: int = 0  # engine "pytorch": decode steps on the device per host sync; 0 = by device (1 CPU, 8 GPU)
    engine_batch: int = 0  # episodes per engine batch; 0 = all of the step's episodes at once
    # engine "pytorch": pure decode steps through torch.compile (CUDA graphs on a GPU); one graph
    # per decode width and cache size, each compiled on first use (seconds on the tiny model)
    compile_decode: bool = False
    nproc: int = 1  # processes of a local run (`earl run --nproc N` starts them under torchrun)
    checkpoints: bool = True  # write checkpoints and the final HF export; false for throwaway runs (validate)
    checkpoint_every: int = 50  # steps between checkpoints; 0 = only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept
    threads: int = 1  # torch CPU threads (the tiny model is overhead-bound; 1 avoids oversubscription)
    plots: bool = True  # PNG plots at the end
    transcript_every: int = 10  # steps between episode transcripts (episodes.jsonl; and the last step); 0 = never
    transcript_episodes: int = 4  # episodes per transcript write (rank 0's own episodes)
    wandb: bool = False  # also log metrics to Weights & Biases (needs wandb; WANDB_MODE defaults to offline)
    # seconds a rank waits in a collective or a send/receive for the other ranks before the run
    # fails with the launcher's line and resume hint (a hung rank, a lost node); torch.distributed's timeout
    collective_timeout_s: float = 300.0
    # steps between garbage collections run by hand on every rank at the step's end, the
    # automatic collector off meanwhile (earl/runtime/gc_steps.py: its pauses at different
    # moments on different ranks stall lockstep stages); 0 = Python's automatic collector
    gc_every: int = 1
    # iterations of the host probe each rank times at each step's start (earl/runtime/hostprobe.py:
    # span "host_probe", ~0.1 ms each on a CPU core); `earl validate` sets it on CPU runs to read
    # the host's speed during the run. 0 = off
    host_probe: int = 0

    def __post_init__(self):
        for name in ("steps", "groups", "group_size", "threads", "nproc"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.transcript_every < 0 or self.transcript_episodes < 0:
            raise ValueError(f"transcript_every and transcript_episodes must be >= 0, got "
                             f"{self.transcript_every} and {self.transcript_episodes}")
        if self.host_probe < 0:
            raise ValueError(f"host_probe must be >= 0 (0: off), got {self.host_probe}")
        if self.gc_every < 0:
            raise ValueError(f"gc_every must be >= 0 (0: Python's automatic collector), got {self.gc_every}")
        if not self.collective_timeout_s > 0:
            raise ValueError(f"collective_timeout_s must be > 0 seconds, got {self.collective_timeout_s}")
        if self.decode_steps < 0:
            raise ValueError(f"decode_steps must be >= 0 (0: by device), got {self.decode_steps}")
        if self.compile_decode and self.engine != "pytorch":
            raise ValueError(f"compile_decode applies to engine 'pytorch' only, not {self.engine!r}")
        if self.checkpoint_every < 0 or self.engine_batch < 0 or self.keep_checkpoints < 1:
            raise ValueError("checkpoint_every and engine_batch must be >= 0, keep_checkpoints >= 1")
        if self.policy.selector not in SELECTORS:
            raise ValueError(f"policy.selector {self.policy.selector!r} unknown; valid: {', '.join(SELECTORS)}")
        if self.policy.dispatcher not in DISPATCHERS:
            raise ValueError(f"policy.dispatcher {self.policy.dispatcher!r} unknown; valid: "
                             f"{', '.join(DISPATCHERS)}")
        if self.trainer.lr_decay not in LR_DECAYS:
            raise ValueError(f"trainer.lr_decay {self.trainer.lr_decay!r} unknown; valid: "
                             f"{', '.join(LR_DECAYS)}")
        if self.trainer.baseline not in ("per-turn", "batch"):
            raise ValueError(f"trainer.baseline {self.trainer.baseline!r} unknown; valid: per-turn, batch")
        if self.trainer.algo not in ALGOS:
            raise ValueError(f"trainer.algo {self.trainer.algo!r} unknown; valid: {', '.join(ALGOS)}")
        if self.trainer.algo in GROUP_ALGOS and self.group_size < 2:
            raise ValueError(f"{self.trainer.algo} compares episodes within a group: group_size must be >= 2, "
                             f"got {self.group_size}")
        if self.trainer.filter_uniform_groups and self.group_size < 2:
            raise ValueError(f"trainer.filter_uniform_groups drops groups whose rewards are all equal: group_size "
                             f"must be >= 2 (a group of 1 is always uniform), got {self.group_size}")

    @property
    def episodes_per_step(self) -> int:
        return self.groups * self.group_size


def to_dict(cfg: RunConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def apply_overrides(cfg: RunConfig, overrides: dict, where: str = "--set") -> RunConfig:
    """Return `cfg` with `{key: value}` applied (dotted or unique-leaf keys)."""
    return config.apply_overrides(cfg, overrides, where=where)


def from_dict(data: dict, base: RunConfig | None = None, where: str = "the saved config") -> RunConfig:
    """Nested dict (as in a TOML/YAML file or a checkpoint) -> RunConfig; typos are errors."""
    return config.from_mapping(RunConfig, data, where=where, base=base)


def load_config_file(path: str | Path) -> RunConfig:
    return config.load(RunConfig, path)
