"""Advantages: the one implementation, computed where the experience lives, reducing only
scalar statistics (one process is the trivial world of size 1).

Each estimator is split into a local part and a tiny reduction so that no rank needs the whole
batch:
- GRPO: per prompt group, (reward - group mean) / (group std + eps), on every generated token.
- RLOO: per prompt group, reward minus the mean of the group's other rewards,
  G / (G - 1) * (reward - group mean) (Ahmadian et al. 2024), on every generated token.
- REINFORCE++: per generated token, the undiscounted return-to-go of the per-step rewards
  (with a KL penalty, the experience stage has already subtracted kl_coef * (old - ref) from
  each generated token's reward), minus a baseline (the batch mean, or the mean of the same
  turn index with `per_turn`), divided by the std of the centred returns over all generated
  tokens of the batch. With `gamma` < 1 each later turn's rewards count gamma^(turns later):
  a move is credited mostly with what it caused itself (an invalid move's own penalty), less
  with what the rest of the game brought.
Each rank sums, per key (group or turn), [sum, sum of squares, count] of the values it holds;
one reduction of those scalars (`reduce_small`) gives every rank the batch statistics. Where the
values are final when an episode ends (no KL penalty folded into REINFORCE++'s rewards), each
episode's own sums travel in the runtime's metadata all-gather instead (`episode_key_sums`,
`summed_stats`) and no rank reduces anything; the group estimators need only the rewards there.

    OMP_NUM_THREADS=1 python -m pytest -q tests/runtime/test_dist_dispatch.py
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from earl.cost_model.profile import SUMMED
from earl.policies.types import Layout, Sample
from earl.runtime.dist import comm_device

ESTIMATORS = ("grpo", "reinforce++", "rloo")
GROUP_ESTIMATORS = ("grpo", "rloo")  # statistics per prompt group

# sample id -> tensor name -> tensor (per-token tensors are 1-D of the sample's length)
Store = dict[int, dict[str, torch.Tensor]]


@dataclass(frozen=True, kw_only=True)
class AdvantageSpec:
    """Which estimator, and what the producers must hold for it."""

    estimator: str = "grpo"  # grpo | reinforce++ | rloo
    per_turn: bool = False  # reinforce++: baseline per turn index instead of one batch mean
    gamma: float = 1.0  # reinforce++: discount per turn of the return-to-go (1: undiscounted)
    eps: float = 1e-6  # added to the std

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"advantage estimator {self.estimator!r} unknown; valid: {', '.join(ESTIMATORS)}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"advantage gamma must be in [0, 1] (1: undiscounted), got {self.gamma}")

    @classmethod
    def of(cls, trainer) -> AdvantageSpec:
        """The estimator a run's trainer config (earl.runtime.run_config.TrainerConfig) asks for."""
        return cls(estimator=trainer.algo, per_turn=trainer.baseline == "per-turn", gamma=trainer.gamma)

    @staticmethod
    def summed_at_rollout(trainer) -> bool:
        """Whether each episode's contribution to the statistics is known when it ends (its
        `episode_key_sums` can ride the runtime's metadata all-gather): not where REINFORCE++
        folds the KL penalty, which needs the experience stage's log-probs, into its rewards."""
        return not (trainer.kl_coef and trainer.algo == "reinforce++")

    @property
    def key(self) -> str:
        """The estimator as the cost model prices it (HardwareProfile.estimator_s): "grpo", "rloo",
        "reinforce++", "reinforce++/per-turn", or either of the last two with "/discounted"
        (gamma < 1: the return-to-go is discounted turn by turn)."""
        if self.grouped:
            return self.estimator
        return self.estimator + ("/per-turn" if self.per_turn else "") + ("/discounted" if self.gamma < 1 else "")

    def priced_key(self, summed: bool = False) -> str:
        """The key the cost model prices the executor's advantage work under: `key`, and for
        REINFORCE++ whose batch statistics came summed (`summed_stats`) "<key>/summed": the
        executor only fills the advantages in, the per-sample sums were made at the rollout."""
        return self.key + (SUMMED if summed and not self.grouped else "")

    @property
    def grouped(self) -> bool:
        """A group estimator: its statistics are the episode rewards of each prompt group."""
        return self.estimator in GROUP_ESTIMATORS

    @property
    def inputs(self) -> tuple[str, ...]:
        """Per-token tensors beyond the dispatched ones that computing advantages reads."""
        if self.grouped:
            return ()
        return ("token_rewards", "turn_ids") if self.per_turn or self.gamma < 1 else ("token_rewards",)

    def stats_from(self, rewards: dict[int, float] | None) -> bool:
        """Whether every rank can compute the statistics alone from `rewards` (each sample's
        episode reward, which the runtime's metadata all-gather gives every rank): true for the
        group estimators, whose statistics are those rewards per group; then no round between
        ranks computes them (`distributed_advantages`, `execute_dispatch`)."""
        return rewards is not None and self.grouped

    def reductions(self, rewards: dict[int, float] | None = None, turns: int | None = None,
                   summed: bool = False) -> int:
        """The statistics reductions between ranks `distributed_advantages` issues (each a
        `reduce_small`): none where the ranks hold the rewards (`stats_from`) or the batch
        statistics (`summed`: every episode's key sums, `summed_stats`), one of the per-key
        sums, and before it one of the turn count where a per-turn baseline keys them by turn and
        the ranks do not know it (`turns` None)."""
        if summed or self.stats_from(rewards):
            return 0
        return 2 if self.per_turn and not self.grouped and turns is None else 1


def returns_to_go(item: dict[str, torch.Tensor], gamma: float = 1.0) -> torch.Tensor:
    """Per token (float64): the sum of the rewards from this token on, each later turn's
    discounted by gamma per turn (`turn_ids`; rewards sit on generated tokens)."""
    r = item["token_rewards"].double()
    plain = r.flip(0).cumsum(0).flip(0)
    if gamma == 1:
        return plain
    tid = item["turn_ids"].long()
    turn = tid >= 0
    n = int(tid.max()) + 1 if turn.any() else 0
    if n == 0:
        return plain
    per_turn = torch.zeros(n, dtype=torch.float64).index_add_(0, tid[turn], r[turn])
    later = torch.cat([per_turn.flip(0).cumsum(0).flip(0)[1:], per_turn.new_zeros(1)])  # undiscounted, turns > k
    disc = per_turn.new_zeros(n + 1)
    for k in range(n - 1, -1, -1):
        disc[k] = per_turn[k] + gamma * disc[k + 1]
    k = tid.clamp(min=0)
    return torch.where(turn, plain - later[k] + gamma * disc[k + 1], plain)


def _entries(item: dict[str, torch.Tensor], s: Sample, spec: AdvantageSpec):
    """(keys [n] long, values [n] float64) this sample contributes to the statistics."""
    if spec.estimator in GROUP_ESTIMATORS:
        return torch.tensor([s.group]), item["rewards"].double().reshape(1)
    mask = item["loss_mask"].bool()
    returns = returns_to_go(item, spec.gamma)
    keys = item["turn_ids"][mask].long() if spec.per_turn else torch.zeros(int(mask.sum()), dtype=torch.long)
    return keys, returns[mask]


def local_stats(store: Store, samples: list[Sample], spec: AdvantageSpec,
                counted: set[int] | None = None) -> dict[int, torch.Tensor]:
    """key -> float64 [sum, sum of squares, count] over the samples this rank holds (only those
    in `counted`, when given: tp peers hold copies and must count each sample once). All the
    samples' entries are concatenated and summed per key at once (bincount)."""
    keys, values = [], []
    for s in samples:
        if (counted is not None and s.id not in counted) or s.id not in store:
            continue
        k, v = _entries(store[s.id], s, spec)
        keys.append(k)
        values.append(v)
    if not keys:
        return {}
    return _key_sums(torch.cat(keys).long(), torch.cat(values))


def episode_key_sums(items: Store, spec: AdvantageSpec) -> dict[int, tuple[tuple[int, float, float, float], ...]]:
    """Per sample id of `items` (each with token_rewards, turn_ids and loss_mask), the
    (key, sum, sum of squares, count) its own tokens add to REINFORCE++'s batch statistics: what
    `local_stats` of that sample alone holds, as plain numbers for the control plane; with a
    per-turn baseline only its turns' keys (>= 0), as `distributed_advantages` reduces them. All
    samples' entries are summed at once under a key per (sample, key)."""
    if spec.grouped:
        raise ValueError(f"episode key sums are REINFORCE++'s; {spec.estimator} needs only the rewards")
    ids, keys, values = list(items), [], []
    for i in ids:
        k, v = _entries(items[i], None, spec)
        keys.append(k)
        values.append(v)
    if not ids or not sum(len(k) for k in keys):
        return {i: () for i in ids}
    width = max(int(k.max()) for k in keys if len(k)) + 2  # keys run from -1 (tokens after the last turn)
    owner = torch.repeat_interleave(torch.arange(len(ids)), torch.tensor([len(k) for k in keys]))
    sums = _key_sums(owner * width + torch.cat(keys).long() + 1, torch.cat(values))
    out: dict[int, list] = {i: [] for i in ids}
    for c, tot in sums.items():
        j, k = divmod(c, width)
        if k >= 1 or not spec.per_turn:
            out[ids[j]].append((k - 1, *tot.tolist()))
    return {i: tuple(v) for i, v in out.items()}


def summed_stats(per_sample: dict[int, tuple[tuple[int, float, float, float], ...]],
                 samples: list[Sample]) -> dict[int, torch.Tensor]:
    """The batch statistics (key -> float64 [sum, sum of squares, count]) from every sample's
    `episode_key_sums`, added in the order of `samples`: every rank that holds the same sums gets
    the same statistics, bit for bit, with no round between ranks."""
    acc: dict[int, list[float]] = {}
    for s in samples:
        for k, total, sq, n in per_sample[s.id]:
            a = acc.setdefault(k, [0.0, 0.0, 0.0])
            a[0] += total
            a[1] += sq
            a[2] += n
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in sorted(acc.items())}


def _key_sums(k: torch.Tensor, v: torch.Tensor) -> dict[int, torch.Tensor]:
    """key -> float64 [sum, sum of squares, count] of the values `v` under keys `k`."""
    uniq, idx = torch.unique(k, return_inverse=True)
    n = len(uniq)
    sums = torch.stack([torch.bincount(idx, weights=v, minlength=n), torch.bincount(idx, weights=v * v, minlength=n),
                        torch.bincount(idx, minlength=n).double()], dim=1)
    return {int(key): sums[i] for i, key in enumerate(uniq.tolist())}


def fill_advantages(store: Store, samples: list[Sample], stats: dict[int, torch.Tensor],
                    spec: AdvantageSpec) -> None:
    """Write store[id]["advantages"] (per token, fp32) from the batch statistics."""
    if spec.estimator == "reinforce++":
        n = sum(float(v[2]) for v in stats.values())
        centred_sq = sum(float(v[1]) - float(v[0]) ** 2 / float(v[2]) for v in stats.values() if v[2] > 0)
        std = (max(centred_sq, 0.0) / max(n, 1.0)) ** 0.5
        width = max(stats, default=-1) + 1  # keys are turn indices (or 0): a lookup table of means
        mean_of = torch.zeros(max(width, 1), dtype=torch.float64)
        for k, tot in stats.items():
            if k >= 0 and tot[2] > 0:
                mean_of[k] = float(tot[0]) / float(tot[2])
    else:
        group_adv = {}
        for k, tot in stats.items():
            total, sq, cnt = tot.tolist()
            mean = total / cnt
            group_adv[k] = (mean, max(sq / cnt - mean * mean, 0.0) ** 0.5, cnt)
    for s in samples:
        item = store.get(s.id)
        if item is None:
            continue
        if spec.estimator in GROUP_ESTIMATORS:
            mean, g_std, cnt = group_adv[s.group]
            centred = float(item["rewards"].double().item()) - mean
            if spec.estimator == "grpo":
                adv = centred / (g_std + spec.eps)
            else:  # the mean of the other cnt - 1 rewards is mean - centred / (cnt - 1)
                adv = centred * cnt / (cnt - 1) if cnt > 1 else 0.0
            item["advantages"] = torch.full((item["input_ids"].numel(),), adv, dtype=torch.float32) \
                * item["loss_mask"]
            continue
        mask = item["loss_mask"].bool()
        returns = returns_to_go(item, spec.gamma)
        keys = item["turn_ids"].long() if spec.per_turn else torch.zeros_like(item["input_ids"])
        means = mean_of[keys.clamp(0, len(mean_of) - 1)]
        item["advantages"] = ((returns - means) / (std + spec.eps) * mask).float()


def producer_samples(src: Layout, rank: int) -> set[int]:
    """Sample ids this rank counts: the first rank of each src dp group."""
    p = src.plan
    return {i for g, ids in enumerate(src.assignment) for i in ids
            if src.base_rank + g * p.pp * p.cp * p.tp == rank}


def reduce_small(flat: torch.Tensor, root: int = 0, op: str = "sum", group=None) -> None:
    """Sum (or max) a few scalars over all ranks, in place. On gloo a two-hop star through
    `root` (one message in, one out per rank): a ring all_reduce needs 2(p-1) sequential hops,
    each a scheduler wake-up on an oversubscribed CPU host. NCCL: all_reduce."""
    if dist.get_backend(group) != "gloo":
        dist.all_reduce(flat, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=group)
        return
    rank, world = dist.get_rank(), dist.get_world_size(group)
    if rank != root:
        dist.send(flat, dst=root, group=group)
        dist.recv(flat, src=root, group=group)
        return
    bufs = [torch.empty_like(flat) for _ in range(world)]
    for w in [dist.irecv(bufs[r], src=r, group=group) for r in range(world) if r != root]:
        w.wait()
    total = flat.clone()
    for r in range(world):
        if r != root:
            total = total + bufs[r] if op == "sum" else torch.maximum(total, bufs[r])
    flat.copy_(total)
    for w in [dist.isend(flat, dst=r, group=group) for r in range(world) if r != root]:
        w.wait()


def distributed_advantages(store: Store, samples: list[Sample], src: Layout, spec: AdvantageSpec,
                           rank: int = 0, group=None, rewards: dict[int, float] | None = None,
                           turns: int | None = None, stats: dict[int, torch.Tensor] | None = None) -> int:
    """Advantages at the producers: only per-key scalars cross the network (plus, for a
    per-turn baseline whose turn count `turns` the ranks do not know, one max of it first);
    nothing at all where every rank holds every sample's reward (`rewards`,
    `AdvantageSpec.stats_from`): the group statistics are then computed from them on each rank,
    the same on all (float32 rewards, as the store holds them). `turns`: the most rewarded
    turns of any sample (the runtime's metadata all-gather gives it every rank), an upper bound
    on the per-turn keys (a key at or above it raises). `stats`: the batch statistics, known to
    every rank (`summed_stats`): nothing is reduced. Returns the reductions it issued (0 without
    a process group)."""
    if stats is not None:
        fill_advantages(store, samples, stats, spec)
        return 0
    if spec.stats_from(rewards):
        r = torch.tensor([rewards[s.id] for s in samples], dtype=torch.float32).double()
        stats = _key_sums(torch.tensor([s.group for s in samples], dtype=torch.long), r) if samples else {}
        fill_advantages(store, samples, stats, spec)
        return 0
    issued = 0
    local = local_stats(store, samples, spec, producer_samples(src, rank))
    if spec.estimator in GROUP_ESTIMATORS:
        keys = sorted({s.group for s in samples})
    elif not spec.per_turn:
        keys = [0]
    elif turns is not None:  # every rank knows the turn count: the same keys on all, no round
        if max(local, default=-1) >= turns:
            raise ValueError(f"rank {rank}: a sample has a turn index {max(local)} at or above the known turn count "
                             f"{turns} (every turn index must be below it)")
        keys = list(range(turns))
    else:  # every rank must stack the same keys: agree on the number of turns first
        width = torch.tensor([max(local, default=-1) + 1], dtype=torch.float64, device=comm_device())
        if dist.is_initialized():
            reduce_small(width, op="max", group=group)
            issued += 1
        keys = list(range(int(width.item())))
    flat = torch.stack([local.get(k, torch.zeros(3, dtype=torch.float64)) for k in keys]) if keys \
        else torch.zeros(0, 3, dtype=torch.float64)
    if dist.is_initialized():
        flat = flat.to(comm_device())
        reduce_small(flat, group=group)
        flat = flat.cpu()
        issued += 1
    fill_advantages(store, samples, {k: flat[i] for i, k in enumerate(keys) if flat[i][2] > 0}, spec)
    return issued
