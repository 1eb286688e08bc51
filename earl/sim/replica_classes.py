"""Replica classes: simulate a few rollout replicas for all of them, at cluster scale.

Rollout replicas of one plan are identical engines, and episodes are dealt to them round-robin
from one i.i.d. draw, so their work is identically distributed. A step's rollout lasts as long
as its slowest replica, so the aggregated mode runs the exact engine
(`earl.sim.rollout_engine.Replica`) on

- the stragglers' tail: the replicas holding the longest critical paths (an episode's
  generated tokens at the replica's opening decode speed plus its environment latencies),
  and the most loaded replicas (generated tokens in total), and
- a few representatives evenly spaced over all replicas,

and takes the rollout's end from the slowest one simulated. Everything that follows from the
episodes alone is exact on every replica from the arrays: which episodes cannot fit a replica's
KV cache (an OOM drop), the tokens generated before it. Counters that depend on scheduling
(preemptions, evictions, recomputed tokens) are the representatives' mean times the replica
count. Past `engine.sample_episodes` samples (65,536), log-probs and training are priced on an
evenly strided sample of about that many, scaled to the batch's token total (the draw, the
stragglers and every count stay whole: `Simulation.priced_sample`). `earl simulate --exact`
simulates every replica instead; the two agree within 2% on step time and throughput at 1,024
and 4,096 GPUs, sampled pricing included, with the per-episode draw and with the compact one that
131,072 GPUs take (`engine.compact_draw_above`, earl/sim/workload.py; tests/sim/test_scale.py).

    python -m pytest tests/sim/test_scale.py -q
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from earl.parallel import deal as parallel_deal

from .workload import Draw, FlatDraw

STRAGGLERS = 3  # replicas with the longest critical paths, simulated exactly
LOADED = 1  # most loaded replica (generated tokens), simulated exactly
REPRESENTATIVES = 2  # evenly spaced replicas: the sample the scheduling counters scale from


@dataclass(frozen=True, kw_only=True)
class ReplicaChoice:
    """Which replicas of a rollout to simulate."""

    simulated: tuple[int, ...]  # replica indices, ascending
    representatives: tuple[int, ...]  # the evenly spaced ones among them
    replicas: int  # all replicas of the rollout plan

    @property
    def all(self) -> bool:
        return len(self.simulated) == self.replicas


@functools.lru_cache(maxsize=8)
def _dealt(n_items: int, replicas: int) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(b, dtype=np.int64) for b in parallel_deal(n_items, replicas))


def deal(drawn: Draw | FlatDraw, replicas: int, index: int) -> Draw:
    """The episodes replica `index` of `replicas` serves: the round-robin dealing of
    `earl.parallel.deal` over the step's draw."""
    return drawn.rows(_dealt(len(drawn.ids), replicas)[index])


def choose_replicas(drawn: Draw | FlatDraw, replicas: int, seconds_per_token: float) -> ReplicaChoice:
    """The stragglers' tail and the representatives (every replica when they are all of them).
    `seconds_per_token`: one decode iteration at the replica's opening batch, to weigh an
    episode's generated tokens against its environment latency."""
    every = tuple(range(replicas))
    if replicas <= STRAGGLERS + LOADED + REPRESENTATIVES:
        return ReplicaChoice(simulated=every, representatives=every, replicas=replicas)
    owner = np.arange(len(drawn.ids)) % replicas
    critical = drawn.generated * seconds_per_token + drawn.lat_total
    longest = np.full(replicas, -1.0)
    np.maximum.at(longest, owner, critical)
    load = np.bincount(owner, weights=drawn.generated, minlength=replicas)
    tail = set(np.argsort(-longest, kind="stable")[:STRAGGLERS].tolist())
    tail |= set(np.argsort(-load, kind="stable")[:LOADED].tolist())
    reps = tuple(sorted(set(np.linspace(0, replicas - 1, REPRESENTATIVES).round().astype(int).tolist())))
    return ReplicaChoice(simulated=tuple(sorted(tail | set(reps))), representatives=reps,
                         replicas=replicas)


def kv_drops(drawn: Draw | FlatDraw, capacity_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """What every engine decides from the episode alone: (dropped, generated tokens). A turn
    whose context with it exceeds the replica's KV capacity can never be admitted, so the
    episode is dropped there (an OOM event) after generating its earlier turns."""
    if len(drawn.ids) == 0 or drawn.context.max() <= capacity_tokens:
        return np.zeros(len(drawn.ids), bool), drawn.generated
    if isinstance(drawn, FlatDraw):
        drawn = drawn.rows(np.arange(len(drawn.ids)))  # the per-turn detail, here only
    through = np.cumsum(drawn.obs + drawn.gen, axis=1)  # context after each turn
    live = np.arange(drawn.obs.shape[1])[None, :] < drawn.turns[:, None]
    fits = np.cumprod(~(live & (through > capacity_tokens)), axis=1).astype(bool)
    dropped = ~fits[:, -1] if fits.shape[1] else np.zeros(len(drawn.ids), bool)
    return dropped, (drawn.gen * fits).sum(axis=1)


def scaled(total_over_representatives: float, choice: ReplicaChoice) -> int:
    """A scheduling counter summed over the representatives, scaled to every replica."""
    if choice.all:
        return int(total_over_representatives)
    return int(round(total_over_representatives * choice.replicas / len(choice.representatives)))
