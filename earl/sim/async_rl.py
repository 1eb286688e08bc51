"""Asynchronous RL: a rollout pool streams episodes while a training pool trains.

`schedule.mode = "async"` splits the cluster into a rollout pool running the rollout plan's
engines without pause and a training pool that prepares experience and trains (the
disaggregated design of AReaL, verl's fully-async mode and slime). Rollout runs at most
K = `schedule.max_staleness` policy versions ahead; K = 0 is synchronous training on separate
pools; `schedule.rollout_gpus = 0` lets the cost model choose the split
(earl.policies.pools). The version rules, weight pushes and partial rollouts:
docs/simulator.md, "Design notes".

Two feeds (`Simulation(..., async_feed=...)`): "stream" (the default: batch j is fed to every
engine when version j - K exists, so up to K + 1 batches share an engine and training takes the
oldest finished episodes) and "per-step", the runtime's design (earl.runtime.async_rl, what
`earl validate --schedule async` and benchmarks/bench_async.py hold it to): each tp1 replica plays
its share of batch j alone, starts it on the newest version it holds once that is >= j - K, and
puts the finished share in its send queue (K shares wait there, one more is on its way to
training), so a replica faster than training runs up to K batches ahead of it; training takes
exactly batch j; the push is rank 0's broadcast of the whole policy to the replicas
(`broadcast_push_s`), and a partial rollout's episodes in flight keep their K/V across it (the
stream feed's recompute it).

    earl simulate --set schedule.mode=async --set schedule.max_staleness=2 --steps 20
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque

import numpy as np

from earl.cost_model.memory import WEIGHT_BYTES
from earl.policies.pools import PoolSplit, choose_pool_split
from earl.specs import ParallelPlan, Stage

from .replica_classes import deal
from .rollout_engine import WAITING, DecodeClock, Replica, Seq
from .workload import Workload

ASYNC_REPLICAS = 16  # rollout replicas simulated in async mode; more are replica classes
ID_STRIDE = 1 << 32  # episode ids of batch j: j * ID_STRIDE + id within the batch
ASYNC_FEEDS = ("stream", "per-step")  # see the module docstring


class StreamReplica(Replica):
    """A rollout engine that runs on: episodes are fed while it works, weight updates arrive,
    and each finished (or dropped) episode is reported with the version it started on."""

    def __init__(self, env, *, partial: bool, on_done, keep_kv: bool = False, **kw):
        super().__init__(env, episodes=[], **kw)
        self.partial = partial  # interrupt episodes at a weight update (else drain first)
        # partial: the episodes in flight go on with the K/V the old weights cached (the runtime's
        # replica and PipelineRL), else they are re-admitted and recompute it (AReaL)
        self.keep_kv = keep_kv
        self.on_done = on_done  # on_done(episode id, finish time, start version, dropped)
        self.fresh: deque[Seq] = deque()  # fed, not yet let in (held back while draining)
        self.version = 0  # policy version of the weights loaded
        self.pending: int | None = None  # version waiting to be loaded
        self.draining = False
        self.stopped = False
        self.start_version: dict[int, int] = {}  # episode id -> version its first turn ran on
        self.interruptions = 0  # sequences interrupted by weight updates (partial rollout)
        self.wake = env.event()

    def _ring(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def feed(self, episodes) -> None:
        self.fresh.extend(Seq(e) for e in episodes if e.turns)
        self._ring()

    def update(self, version: int) -> None:
        self.pending = version
        self._ring()

    def stop(self) -> None:
        self.stopped = True
        self._ring()

    def _on_loop(self) -> None:
        if self.wake.triggered:
            self.wake = self.env.event()
        if self.pending is not None:
            if self.partial and self.keep_kv:  # the swap comes between two iterations
                self.interruptions += len(self.running)
                self.version, self.pending = self.pending, None
            elif self.partial:
                for s in reversed(list(self.running.values())):  # resume on the new weights
                    self._stop_decoding(s)
                    self._release(s)
                    s.state = WAITING
                    self.waiting.appendleft(s)
                    self.interruptions += 1
                self._evict(self.used)  # every cached context was computed by the old weights
                self.version, self.pending = self.pending, None
            else:
                if not self.draining:  # episodes not started yet wait for the new weights
                    unstarted = [s for s in self.waiting if s.ep.id not in self.start_version]
                    for s in unstarted:
                        self.waiting.remove(s)
                    self.fresh.extendleft(reversed(unstarted))
                    self.draining = True
                if not (self.running or self.arrivals or self.waiting):
                    self.version, self.pending, self.draining = self.pending, None, False
        if not self.draining and self.fresh:
            self.waiting.extend(self.fresh)
            self.fresh.clear()

    def _idle(self):
        if self.pending is not None or (self.fresh and not self.draining):
            return True
        if self.stopped:
            return False
        yield self.wake
        return True

    def _start_decoding(self, s: Seq) -> None:
        self.start_version.setdefault(s.ep.id, self.version)
        super()._start_decoding(s)

    def _done(self, s: Seq, t_finish: float) -> None:
        self.on_done(s.ep.id, t_finish, self.start_version[s.ep.id], False)

    def _oom(self, s: Seq) -> None:
        super()._oom(s)
        self.on_done(s.ep.id, self.env.now, self.start_version.get(s.ep.id, self.version), True)


def weight_push_s(cm, rollout: ParallelPlan, rollout_gpus: int, train_gpus: int) -> float:
    """Seconds to push new weights from the training pool to the rollout pool: every rollout
    GPU receives its tp shard over its node's NICs, every training node sends its share; the
    busier side of the network sets the time (the cost model's inter-node link)."""
    per_node = cm.cluster.gpus_per_node
    shard = cm.model.num_params * WEIGHT_BYTES / rollout.tp
    into_node = shard * per_node
    out_of_node = shard * rollout_gpus / max(1, train_gpus // per_node)
    return cm.transfer_time_s(max(into_node, out_of_node), rollout_gpus, 0)


def broadcast_push_s(cm, receivers: int) -> float:
    """Seconds for one rank to broadcast the whole policy (in the model's dtype) to `receivers`
    ranks of its node, as the runtime's weight push does: a binomial tree, ceil(log2(receivers
    + 1)) rounds of one point-to-point copy each, over the profile's p2p link."""
    if receivers <= 0:
        return 0.0
    rounds = math.ceil(math.log2(receivers + 1))
    return rounds * cm.transfer_time_s(cm.model.num_params * cm.model.dtype_bytes, 0, 1)


SPLIT_POINTS = 4  # steps of the run (evenly spaced) the cost model prices a pool split on


def choose_split(scenario, cm, workload: Workload) -> PoolSplit:
    """The cost model's rollout / training split, priced on the episodes of `SPLIT_POINTS`
    evenly spaced steps of the run (the split is fixed while the context grows; a real system
    would price a forecast of its workload)."""
    steps = sorted({round(i * (scenario.steps - 1) / max(1, SPLIT_POINTS - 1)) for i in range(SPLIT_POINTS)})
    points = []
    for step in steps:
        d = workload.draw(step)
        d = d.rows(d.turns > 0)
        points.append(d.stats(step=step, max_context=scenario.workload.max_context))
    granularity = cm.cluster.gpus_per_node if cm.cluster.nodes > 1 else 1  # whole nodes where there are several
    return choose_pool_split(cm, scenario.open_plans(), points, cm.cluster.num_gpus,
                             granularity=granularity, logprob_passes=scenario.logprob_passes)


def run_async(sim):
    """SimPy process: the training pool's steps against the streaming rollout pool of `sim`
    (an `earl.sim.simulation.Simulation` in async mode)."""
    env, sc, cm = sim.env, sim.sc, sim.cm
    K = sc.max_staleness
    per_step = sim.async_feed == "per-step"
    ro = sim.plans[Stage.ROLLOUT]
    replicas = ro.dp
    if replicas <= ASYNC_REPLICAS:
        chosen = list(range(replicas))
    else:
        chosen = sorted(set(np.linspace(0, replicas - 1, ASYNC_REPLICAS).round().astype(int).tolist()))
    scale = replicas / len(chosen)
    finished: list[tuple[float, int, int, bool]] = []  # heap: (time, id, start version, dropped)
    bell = [env.event()]
    gate = [env.event()]  # per-step: rung when a version is pushed or a batch is taken

    def ring(ev: list) -> None:
        if not ev[0].triggered:
            ev[0].succeed()

    def on_done(ep_id: int, t: float, version: int, dropped: bool) -> None:
        heapq.heappush(finished, (t, ep_id, version, dropped))
        ring(bell)
        if per_step:
            left[ep_id // ID_STRIDE, owner.pop(ep_id)] -= 1
            ring(gate)

    rcm = sim.rollout_cm  # the rollout pool's prices (its own devices or host share)
    clock = sim.clock(ro.tp) if rcm is cm else DecodeClock(rcm, ro.tp, exact=sim.fine)
    engines = [StreamReplica(env, cost_model=rcm, tp=ro.tp, clock=clock,
                             max_num_seqs=sc.max_num_seqs, fine=sim.fine, log=sim.log,
                             name=f"replica{i}", partial=sc.partial_rollout, on_done=on_done,
                             keep_kv=per_step, kv_round=sim.kv_round)
               for i in chosen]
    info: dict[int, tuple] = {}  # episode id -> (context, turns, generated, truncated)
    fed_at: dict[int, set] = {}  # feed version -> ids fed then, not yet trained on
    batch_size: dict[int, int] = {}  # batch j -> episodes it holds on the simulated replicas
    batch_ids: dict[int, list] = {}  # per-step: batch j -> its ids on the simulated replicas
    owner: dict[int, int] = {}  # per-step: episode id -> index of its engine
    left: dict[tuple[int, int], int] = {}  # per-step: (batch, engine) -> its episodes not finished
    state = {"version": 0, "taken": -1}  # newest version pushed; newest batch training took

    def draw(j: int) -> list:
        d = sim.workload.draw(j)
        d = d.rows(d.turns > 0)
        d = dataclasses.replace(d, ids=d.ids + j * ID_STRIDE)
        parts = [deal(d, replicas, i) for i in chosen]
        batch_size[j] = sum(len(p.ids) for p in parts)
        batch_ids[j] = [i for p in parts for i in p.ids.tolist()]
        for part in parts:
            for i, c, t, g, cut in zip(part.ids.tolist(), part.context.tolist(), part.turns.tolist(),
                                       part.generated.tolist(), part.truncated.tolist(), strict=True):
                info[i] = (c, t, g, cut)
        return parts

    def feed(j: int, version: int) -> None:
        if j >= sc.steps:
            return
        ids = fed_at.setdefault(version, set())
        for eng, part in zip(engines, draw(j), strict=True):
            ids.update(part.ids.tolist())
            eng.feed(part.episodes())

    def wait_for(ok):
        while not ok():
            gate[0] = env.event() if gate[0].triggered else gate[0]
            yield gate[0]

    def replica_loop(e: int, eng: StreamReplica):
        """Per-step: engine e plays its share of each batch in turn (the runtime's replica), with
        the runtime's spans: "hand-off" (its finished share waits for room in the send queue:
        K + 1 shares not yet taken at most, which the staleness gate already implies),
        "wait_weights" (for version >= j - K) and "rollout"."""
        rank = sim.stage_gpus[Stage.TRAIN] + e  # the runtime's rollout ranks follow the training pool's
        for j in range(sc.steps):
            t0 = env.now
            yield from wait_for(lambda j=j: state["taken"] >= j - 2 - K)  # batch j - 1 put in the queue
            t1 = env.now
            yield from wait_for(lambda j=j: state["version"] >= j - K)  # never staler than K
            t2 = env.now
            if j:
                sim.span("hand-off", "dispatch", rank, t0, t1, j - 1)
            if t2 > t1:
                sim.span("wait_weights", "reshard", rank, t1, t2, j)
            part = shares[j][e]
            if not part.turns.size:
                continue
            if state["version"] > eng.version:
                eng.update(state["version"])  # nothing in flight: loaded at once
            for i in part.ids.tolist():
                owner[i] = e
            left[j, e] = len(part.ids)
            fed_at.setdefault(state["version"], set()).update(part.ids.tolist())
            eng.feed(part.episodes())
            yield from wait_for(lambda j=j: left[j, e] <= 0)
            sim.span("rollout", "rollout", rank, t2, env.now, j, tokens=int(part.generated.sum()),
                     args={"version": eng.version})

    if per_step:
        shares = [draw(j) for j in range(sc.steps)]
        for e, eng in enumerate(engines):
            env.process(replica_loop(e, eng))
    else:
        for j in range(K + 1):
            feed(j, 0)
    ready: dict[int, tuple[float, int, bool]] = {}  # finished by now: id -> (time, version, dropped)
    train_gpus = sim.stage_gpus[Stage.TRAIN]
    push_s = broadcast_push_s(cm, ro.dp) if per_step else \
        weight_push_s(cm, ro, sim.stage_gpus[Stage.ROLLOUT], train_gpus)
    before = {"preemptions": 0, "evictions": 0, "recompute_tokens": 0}
    t_prev = env.now
    for step in range(sc.steps):
        sim.begin_step()
        need = batch_size.get(step, 0)
        while True:
            while finished and finished[0][0] <= env.now:
                t, i, v, dropped = heapq.heappop(finished)
                ready[i] = (t, v, dropped)
            if per_step:
                forced = batch_ids[step]
            else:
                forced = [i for v, ids in fed_at.items() if v <= step - K for i in ids]
            if len(ready) >= need and all(i in ready for i in forced):
                break
            bell[0] = env.event()
            waits = [bell[0]] + ([env.timeout(finished[0][0] - env.now)] if finished else [])
            yield env.any_of(waits)
        t_batch = env.now
        if per_step:
            state["taken"] = step
            ring(gate)
        take = list(forced)
        taken = set(take)
        rest = [] if per_step else sorted((i for i in ready if i not in taken), key=lambda i: (ready[i][0], i))
        take += rest[:max(0, need - len(take))]
        for i in take:
            for ids in fed_at.values():
                ids.discard(i)
        kept = [i for i in take if not ready[i][2]]
        stale = np.array([step - ready[i][1] for i in kept], dtype=float)
        arr = np.array([info[i] for i in kept], dtype=np.int64).reshape(-1, 4)
        for i in take:
            del ready[i]
        # replica classes: the simulated replicas' batch, repeated to the whole pool's size
        n_all = round(len(kept) * scale)
        arr = np.resize(arr, (n_all, 4)) if len(arr) else arr
        dropped = len(take) - len(kept)
        row: dict = {"episodes": round(len(take) * scale), "truncated_episodes": int(arr[:, 3].sum()),
                     "rollout_s": t_batch - t_prev, "rollout_oom": round(dropped * scale),
                     "generated_tokens": int(arr[:, 2].sum()), "replicas_simulated": len(engines),
                     "kv_capacity_tokens": engines[0].cap,
                     "peak_kv_tokens": max(e.stats.peak_kv_tokens for e in engines),
                     "staleness_mean": float(stale.mean()) if len(stale) else 0.0,
                     "staleness_max": int(stale.max()) if len(stale) else 0}
        for k in before:
            total = sum(getattr(e.stats, k) for e in engines)
            row[k], before[k] = round((total - before[k]) * scale), total
        ro_mem = cm.memory("decode", ro, ro.dp, max(row["peak_kv_tokens"], 1))
        row["headroom_rollout"] = ro_mem.headroom_frac
        sim.span("batch ready", "rollout", 0, t_prev, t_batch, step,
                  args={"episodes": len(take), "staleness_mean": row["staleness_mean"]})
        yield from sim.learn(np.arange(len(arr)), arr[:, 0], arr[:, 1], arr[:, 2], step, row,
                              aggregated=scale > 1 or sim.aggregated(len(arr)))
        t0 = env.now
        yield env.timeout(push_s)
        sim.events += 1
        sim.span("weight push", "sync", sim.stage_gpus[Stage.ROLLOUT], t0, env.now, step,
                  args={"version": step + 1})
        row["sync_s"] = push_s
        state["version"] = step + 1
        if per_step:
            ring(gate)
        for eng in engines:
            if not per_step or sc.partial_rollout:  # per-step without partial: loaded between batches
                eng.update(step + 1)
        if not per_step:
            feed(step + 1 + K, step + 1)
        ctx = arr[:, 0] if len(arr) else np.zeros(0, np.int64)
        yield from sim.finish_step(row, ro, ctx, t_prev, step)
        t_prev = env.now
        sim.step_done(step)
    sim.events += sum(e.stats.events for e in engines)
    for eng in engines:
        eng.stop()
