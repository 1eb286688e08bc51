"""The rollout engine of one replica: continuous batching of multi-turn episodes.

One `Replica` per data-parallel group of the rollout plan (tp GPUs each) runs as a SimPy
process: sequences are admitted while KV-cache tokens allow, prefilled inside the next
iteration's forward (a mixed step, `DecodeClock.admission_s`), decoded together, leave
for their environment at a turn boundary and come back; a full cache evicts idle caches, then
preempts (vLLM's recompute preemption); a turn that cannot fit alone is an OOM event. Events
happen only when the batch changes; between them `DecodeClock` sums the decode iterations in
closed form (`fine=True`: one event per iteration). Scheduling and time in detail:
docs/simulator.md, "Design notes".

    python -m pytest tests/sim/test_rollout_engine.py -q
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import simpy

from .workload import Episode

_REL_TOL = 1e-9  # affine check of the decode step time


class AffineCache:
    """Exact affine pieces of a cost-model hook in one variable: for each key, g(key, x) ==
    a + b * x on a checked interval [lo, hi] (checked at both ends and the midpoint; the
    hooks are maxima of affine rooflines for x >= 1, i.e. convex, so a midpoint on the chord
    proves the piece). Probes a
    wide interval first, so a whole rollout usually costs three hook calls per key."""

    def __init__(self, fn, wide_hi: float):
        self._fn = fn
        self._wide_hi = max(float(wide_hi), 1.0)
        self._lines: dict = {}  # key -> [(lo, hi, a, b), ...] checked affine pieces
        self.calls = 0  # hook evaluations (for the benchmark)

    def __call__(self, key, x: float) -> float:
        line = self.line(key, x, x)
        if line is None:
            self.calls += 1
            return self._fn(key, x)
        return line[0] + line[1] * x

    def _fit(self, key, lo: float, hi: float) -> tuple[float, float] | None:
        f_lo, f_hi = self._fn(key, lo), self._fn(key, hi)
        mid = (lo + hi) / 2
        f_mid = self._fn(key, mid)
        self.calls += 3
        b = (f_hi - f_lo) / (hi - lo)
        a = f_lo - b * lo
        if abs(f_mid - (a + b * mid)) > _REL_TOL * max(abs(f_lo), abs(f_hi)):
            return None
        return a, b

    def line(self, key, lo: float, hi: float) -> tuple[float, float] | None:
        """(a, b) with g(key, x) == a + b * x on [lo, hi], or None when it is not affine there."""
        pieces = self._lines.setdefault(key, [])
        for p_lo, p_hi, a, b in pieces:
            if p_lo <= lo and hi <= p_hi:
                return a, b
        if lo < 1.0:  # at x == 0 a roofline term can vanish (no attention FLOPs): a jump
            return None
        wide = max(hi, self._wide_hi)
        fit = self._fit(key, lo, wide) if wide > lo else None
        if fit is not None:
            pieces.append((lo, wide, *fit))
            return fit
        if hi <= lo:
            return None
        fit = self._fit(key, lo, hi)
        if fit is None:
            return None
        top = hi  # grow the piece while it stays affine, so later queries hit it
        while top < wide:
            nxt = min(lo + 4 * (top - lo), wide)
            wider = self._fit(key, lo, nxt)
            if wider is None:
                break
            top, fit = nxt, wider
        pieces.append((lo, top, *fit))
        return fit


class DecodeClock:
    """Sums of decode iteration times of one replica size: k iterations of n sequences from
    total context C take sum_j decode_step_time_s(tp, n, C + j*n)."""

    def __init__(self, cost_model, tp: int, exact: bool = False):
        self.tp = tp
        self.exact = exact  # call the hooks directly every time (fine mode)
        self.cm = cost_model
        self.step = AffineCache(lambda n, c: cost_model.decode_step_time_s(tp, n, c),
                                wide_hi=2 * cost_model.kv_capacity_tokens(tp))

    @property
    def calls(self) -> int:
        return self.step.calls

    def step_time_s(self, n: int, context: float) -> float:
        """One decode iteration of `n` sequences at total context `context`."""
        return self.cm.decode_step_time_s(self.tp, n, context) if self.exact else self.step(n, context)

    def admission_s(self, batch: list[tuple[Seq, int, int]], running: int, context: float) -> float:
        """What admitting `batch` ((seq, new tokens, cached prefix)) adds to the next iteration:
        one mixed forward prefills the admitted turns and samples a token of every row, the
        `running` sequences (total context `context`) included (CostModel.mixed_step_time_s),
        less that iteration's price as a plain decode step of all of them."""
        batch = [b for b in batch if b[1] > 0]  # a shared prompt's copies: no rows of the forward
        new = sum(n for _, n, _ in batch)
        if new <= 0:
            return 0.0
        # a padding-masked segment attends its whole new x (prefix + new) rectangle (the runtime
        # engine's per-segment attention, as the engine calibration's turns price it)
        pairs = sum(n * (p + n) for _, n, p in batch)
        kv = sum(n + p for _, n, p in batch)
        mixed = self.cm.mixed_step_time_s(self.tp, new, len(batch), pairs, kv, running, context)
        return max(0.0, mixed - self.step_time_s(running + len(batch), context + kv))

    def run(self, n: int, context: float, kmax: int, limit_s: float | None) -> tuple[int, float]:
        """Run up to `kmax` iterations of `n` sequences starting at total context `context`
        (it grows by n per iteration), stopping after the first iteration that ends at or after
        `limit_s` (None: no limit). Returns (iterations, seconds)."""
        if kmax == 1:
            return 1, (self.cm.decode_step_time_s(self.tp, n, context) if self.exact else
                       self.step(n, context))
        line = self.step.line(n, context, context + (kmax - 1) * n)
        if line is None:  # not affine over the whole range: split it
            h = kmax // 2
            k1, t1 = self.run(n, context, h, limit_s)
            if k1 < h or (limit_s is not None and t1 >= limit_s):
                return k1, t1
            k2, t2 = self.run(n, context + h * n, kmax - h, None if limit_s is None else limit_s - t1)
            return k1 + k2, t1 + t2
        a, b = line
        f0, d = a + b * context, b * n

        def total(k: int) -> float:
            return k * f0 + d * k * (k - 1) / 2

        if limit_s is None or total(kmax) < limit_s:
            return kmax, total(kmax)
        # smallest k >= 1 with total(k) >= limit_s: root of d/2 k^2 + (f0 - d/2) k - limit = 0
        if d > 0:
            bq = f0 - d / 2
            k = math.ceil((-bq + math.sqrt(bq * bq + 2 * d * limit_s)) / d)
        else:
            k = math.ceil(limit_s / f0)
        k = min(max(k, 1), kmax)
        while k > 1 and total(k - 1) >= limit_s:
            k -= 1
        while k < kmax and total(k) < limit_s:
            k += 1
        return k, total(k)


WAITING, RUNNING, ENV, DONE, OOM = range(5)


class Seq:
    """An episode inside the engine."""

    __slots__ = ("ep", "turn", "ctx", "pending", "rem", "resident", "state", "order", "start",
                 "end", "ctx0")

    def __init__(self, ep: Episode):
        self.ep = ep
        self.turn = 0
        self.ctx = 0  # tokens in context, not counting `pending`
        self.pending = ep.turns[0][0]  # observation (prompt) tokens still to prefill
        self.rem = ep.turns[0][1]  # tokens still to generate in this turn
        self.resident = False  # its KV cache (ctx tokens) is held in this replica
        self.state = WAITING
        self.order = -1  # admission counter while running
        self.start = self.end = self.ctx0 = 0  # decode iteration counters while running


@dataclass
class ReplicaStats:
    """What one replica did during one rollout."""

    generated_tokens: int = 0  # decoded tokens
    prefill_tokens: int = 0  # tokens prefilled (prompts, observations, recomputation)
    recompute_tokens: int = 0  # of which recomputed after eviction / preemption
    decode_iterations: int = 0
    events: int = 0  # SimPy timeouts this replica yielded
    preemptions: int = 0
    evictions: int = 0
    oom_episodes: list = field(default_factory=list)  # episode ids dropped: cannot fit
    finished: dict = field(default_factory=dict)  # episode id -> finish time (s)
    peak_kv_tokens: int = 0
    peak_running: int = 0
    busy_s: float = 0.0  # seconds spent prefilling or decoding
    t_start: float = 0.0
    t_end: float = 0.0  # last episode's finish (including its final environment latency)


class Replica:
    """A rollout engine on `tp` GPUs serving `episodes`; a SimPy process from construction."""

    def __init__(self, env: simpy.Environment, *, cost_model, tp: int, episodes: list[Episode],
                 clock: DecodeClock | None = None, max_num_seqs: int = 256, fine: bool = False,
                 log: list | None = None, name: str = "replica0", prompt_group: int = 0, kv_round: int = 0):
        # `prompt_group` > 1: episodes id // prompt_group open on one prompt (a GRPO group), and
        # members admitted together prefill it once, the others copying its KV (the runtime
        # engine's `_forward_mixed`; vLLM's prefix cache does the same); 0: each prefills its own.
        # `kv_round` > 0: every decode row attends the longest running row's length rounded up to
        # this many positions (the runtime engine's slot cache, earl.runtime.engine.pytorch.
        # KV_ROUND); 0: each its own context (a paged cache: vLLM)
        self.kv_round = kv_round
        self.env = env
        self.prompt_group = prompt_group
        self.cm = cost_model
        self.tp = tp
        self.cap = cost_model.kv_capacity_tokens(tp)
        self.clock = clock or DecodeClock(cost_model, tp, exact=fine)
        self.max_num_seqs = max_num_seqs
        self.fine = fine
        self.log = log
        self.name = name
        self.stats = ReplicaStats(t_start=env.now, t_end=env.now)
        self.waiting: deque[Seq] = deque(Seq(e) for e in episodes if e.turns)
        self.running: dict[int, Seq] = {}  # admission order -> seq (insertion ordered)
        self.ends: list[tuple[int, int, Seq]] = []  # heap of (end iteration, order, seq)
        self.arrivals: list[tuple[float, int, Seq]] = []  # heap of (time, tiebreak, seq)
        self.cached: OrderedDict[int, Seq] = OrderedDict()  # resident, not running: LRU first
        self.used = 0  # KV tokens held
        self.context = 0  # total context of the running sequences
        self.iters = 0  # decode iterations so far
        self._order = 0
        self._tie = 0
        self.wake: simpy.Event | None = None  # a streaming engine's doorbell (earl/sim/async_rl.py)
        self.process = env.process(self._run())

    # ---- bookkeeping ----------------------------------------------------------------------------
    def _note(self, kind: str, seq: Seq | None = None, at: float | None = None, **kw) -> None:
        if self.log is not None:
            t = self.env.now if at is None else at
            self.log.append((t, self.name, kind, None if seq is None else seq.ep.id, kw))

    def _release(self, s: Seq) -> None:
        if s.resident:
            self.used -= s.ctx
            s.resident = False
        self.cached.pop(id(s), None)

    def _evict(self, tokens: int) -> None:
        """Free at least `tokens` KV tokens from caches of sequences that are not running."""
        freed = 0
        while freed < tokens and self.cached:
            _, s = self.cached.popitem(last=False)
            self.used -= s.ctx
            freed += s.ctx
            s.resident = False
            self.stats.evictions += 1
            self._note("evict", s, tokens=s.ctx)

    def _oom(self, s: Seq) -> None:
        self._release(s)
        s.state = OOM
        self.stats.oom_episodes.append(s.ep.id)
        self._note("oom", s, needs=s.ctx + s.pending + s.rem, capacity=self.cap)

    # ---- scheduling -----------------------------------------------------------------------------
    def _admit(self) -> list[tuple[Seq, int, int]]:
        """FCFS admission while KV allows: (seq, new tokens to prefill, cached prefix tokens);
        a group member opening on a prompt another member of the batch prefills gets (seq, 0, 0)
        (`prompt_group`): its KV is a copy, held but not computed."""
        batch: list[tuple[Seq, int, int]] = []
        opening: set[int] = set()  # groups whose prompt a member of this batch prefills
        while self.waiting and len(self.running) + len(batch) < self.max_num_seqs:
            s = self.waiting[0]
            if s.ctx + s.pending + s.rem > self.cap:  # this turn can never fit in this replica
                self.waiting.popleft()
                self._oom(s)
                continue
            new = s.pending + (0 if s.resident else s.ctx)
            room = new + len(self.running) + len(batch) + 1  # and one decode step for everyone
            if self.cap - self.used < room:
                was_cached = self.cached.pop(id(s), None) is not None
                self._evict(room - (self.cap - self.used))
                if was_cached:
                    self.cached[id(s)] = s
                    self.cached.move_to_end(id(s), last=False)
                if self.cap - self.used < room:
                    break
            self.waiting.popleft()
            self.cached.pop(id(s), None)
            if not s.resident:
                self.stats.recompute_tokens += s.ctx
            self.used += new
            fresh = self.prompt_group > 1 and s.turn == 0 and s.ctx == 0
            if fresh and s.ep.id // self.prompt_group in opening:
                batch.append((s, 0, 0))
            else:
                if fresh:
                    opening.add(s.ep.id // self.prompt_group)
                batch.append((s, new, s.ctx if s.resident else 0))
            s.resident = True
        return batch

    def _attended(self) -> float:
        """Positions the running rows' next decode step attends in all: their total context, or
        with `kv_round` every row the longest one's length rounded up, the rounding taken at its
        mean (a decode segment grows it one position per step)."""
        if not self.kv_round or not self.running:
            return self.context
        longest = max(s.ctx0 + self.iters - s.start for s in self.running.values())
        return len(self.running) * (longest + 1 + (self.kv_round - 1) / 2)

    def _start_decoding(self, s: Seq) -> None:
        s.ctx += s.pending
        s.pending = 0
        s.state = RUNNING
        s.order = self._order
        self._order += 1
        s.start, s.ctx0, s.end = self.iters, s.ctx, self.iters + s.rem
        self.running[s.order] = s
        heapq.heappush(self.ends, (s.end, s.order, s))
        self.context += s.ctx

    def _stop_decoding(self, s: Seq) -> None:
        del self.running[s.order]
        s.ctx = s.ctx0 + (self.iters - s.start)
        s.rem = s.end - self.iters
        self.context -= s.ctx

    def _preempt_last(self) -> None:
        _, s = self.running.popitem()
        self.running[s.order] = s  # _stop_decoding removes it
        self._stop_decoding(s)
        self._release(s)
        s.state = WAITING
        self.waiting.appendleft(s)
        self.stats.preemptions += 1
        self._note("preempt", s, context=s.ctx)

    def _finish_turns(self) -> None:
        now = self.env.now
        while self.ends and self.ends[0][0] == self.iters:
            _, order, s = heapq.heappop(self.ends)
            if self.running.get(order) is not s:
                continue  # stale entry of a preempted sequence
            self._stop_decoding(s)
            turns = s.ep.turns
            latency = turns[s.turn][2]
            s.turn += 1
            if s.turn < len(turns):
                s.pending, s.rem = turns[s.turn][0], turns[s.turn][1]
                s.state = ENV
                self.cached[id(s)] = s
                heapq.heappush(self.arrivals, (now + latency, self._tie, s))
                self._tie += 1
                if self.log is not None:
                    self._note("turn_end", s, context=s.ctx, back_at=now + latency)
            else:
                self._release(s)
                s.state = DONE
                self.stats.finished[s.ep.id] = now + latency
                self.stats.t_end = max(self.stats.t_end, now + latency)
                self._note("done", s, context=s.ctx, finish=now + latency)
                self._done(s, now + latency)

    def _collect_arrivals(self) -> None:
        now = self.env.now
        while self.arrivals and self.arrivals[0][0] <= now:
            _, _, s = heapq.heappop(self.arrivals)
            s.state = WAITING
            self.waiting.append(s)
            if self.log is not None:
                self._note("arrive", s, tokens=s.pending)

    # ---- hooks of a streaming engine (earl/sim/async_rl.py); no-ops here ---------------------
    def _done(self, s: Seq, t_finish: float) -> None:
        """Episode `s` ends at `t_finish` (after its last environment latency)."""

    def _on_loop(self) -> None:
        """Start of each scheduling round: take in new episodes and weight updates."""

    def _idle(self):
        """SimPy process step when nothing is left to do: True to go on, False to stop."""
        return False
        yield  # a generator

    def _wait(self, delay: float):
        """A timeout that the doorbell (if any) cuts short."""
        timeout = self.env.timeout(delay)
        return timeout if self.wake is None else self.env.any_of([timeout, self.wake])

    # ---- the process ----------------------------------------------------------------------------
    def _run(self):
        env, st, clock = self.env, self.stats, self.clock
        # host work of a rollout around the engine (calibrated, 0 on datasheets; TurnSyncReplica's too)
        setup = self.cm.profile.rollout_fixed_s + self.cm.profile.rollout_episode_s * len(self.waiting)
        if self.waiting and setup > 0:
            yield env.timeout(setup)
        while True:
            self._on_loop()
            self._collect_arrivals()
            batch = self._admit()
            pre = 0.0  # prefill seconds to run before the next decode segment
            if batch:
                # the admitted turns prefill inside the next iteration's forward (a mixed step)
                pre = clock.admission_s(batch, len(self.running), self._attended())
                tokens = sum(n for _, n, _ in batch)
                if self.log is not None:
                    self._note("prefill", None, seqs=[s.ep.id for s, _, _ in batch], tokens=tokens,
                               time_s=pre)
                st.prefill_tokens += tokens
                st.busy_s += pre
                st.peak_kv_tokens = max(st.peak_kv_tokens, self.used)
                for s, _, _ in batch:
                    self._start_decoding(s)
                st.peak_running = max(st.peak_running, len(self.running))
            if self.running:
                n = len(self.running)
                if self.cap - self.used < n:  # no room for the next token of everyone
                    if pre:
                        yield env.timeout(pre)
                        st.events += 1
                    self._evict(n - (self.cap - self.used))
                    if self.cap - self.used < n:
                        self._preempt_last()
                    continue
                kmax = 1 if self.fine else min(self.ends[0][0] - self.iters,
                                               (self.cap - self.used) // n)
                # one arriving during the mixed step joins after it (the segment's first iteration)
                limit = max(0.0, self.arrivals[0][0] - env.now - pre) if self.arrivals else None
                attended = self._attended()
                k, dt = clock.run(n, attended, kmax, limit)
                if self.log is not None:
                    self._note("decode", None, at=env.now + pre, seqs=n, iterations=k,
                               context=self.context, time_s=dt)
                # one event for the prefill (if any) and the decode segment after it: nothing
                # can change the batch in between, unless a streaming engine's doorbell rings:
                # then the segment stops after the iteration in flight
                t_seg = env.now
                yield self._wait(pre + dt)
                if env.now < t_seg + pre + dt:
                    elapsed = env.now - t_seg - pre
                    k, dt = (0, 0.0) if elapsed <= 0 else clock.run(n, attended, kmax, elapsed)
                    yield env.timeout(t_seg + pre + dt - env.now)
                st.events += 1
                st.busy_s += dt
                self.iters += k
                self.context += n * k
                self.used += n * k
                st.generated_tokens += n * k
                st.decode_iterations += k
                st.peak_kv_tokens = max(st.peak_kv_tokens, self.used)
                self._finish_turns()
            elif self.arrivals:
                yield self._wait(self.arrivals[0][0] - env.now)
                st.events += 1
            else:
                assert not self.waiting, "a waiting sequence fits nowhere but was not dropped"
                if not (yield from self._idle()):
                    break
        st.t_end = max(st.t_end, env.now)


class TurnSyncReplica(Replica):
    """The built-in PyTorch engine of `earl run` (earl.runtime.engine driven by
    earl.runtime.rollout), for `earl validate`: no continuous batching. Episodes are taken
    `max_num_seqs` at a time; each turn of such a batch is one forward over every episode still
    playing, right-padded to the longest new segment (its logits give every episode its first
    token), then decode forwards in lockstep over all rows of the batch until the longest
    generation of the turn ends (rows done early ride along padded; only active rows are
    sampled). The environments then step one after the other and the next turn starts when all
    are back; the next batch opens when every episode of this one has ended. Every row's KV
    cache is as wide as the batch's (padded). A turn that cannot fit the replica's KV capacity
    is an OOM event. Priced with the cost model's hooks directly (a few hundred calls)."""

    def _run(self):
        env, st, cm = self.env, self.stats, self.cm
        seq_s = cm.profile.step_seq_overhead_s
        todo = list(self.waiting)
        self.waiting.clear()
        # host work of the rollout around the engine: set-up per rollout and per episode
        # (environment, tokenising, trajectories); calibrated, 0 on datasheets
        setup = cm.profile.rollout_fixed_s + cm.profile.rollout_episode_s * len(todo)
        if todo and setup > 0:
            yield env.timeout(setup)
        for start in range(0, len(todo), self.max_num_seqs):
            batch = todo[start:start + self.max_num_seqs]
            width = 0  # cache positions every row of the batch holds (padded)
            if cm.profile.rollout_batch_s > 0:  # opening an engine batch (calibrated)
                yield env.timeout(cm.profile.rollout_batch_s)
            while batch:
                for s in [s for s in batch if s.ctx + s.pending + s.rem > self.cap]:
                    self._oom(s)
                batch = [s for s in batch if s.state != OOM]
                if not batch:
                    break
                n = len(batch)
                # after the first turn the last sampled token enters the cache with the observation
                segs = [s.pending + (1 if s.turn else 0) for s in batch]
                seg = max(segs)
                # the engine always passes its padding mask (full attention rectangle), and each
                # turn (generate call) has host work of its own: padded inputs, cache, texts
                pre = cm.prefill_time_s(self.tp, n * seg, n * width, n, masked=True)
                pre += cm.profile.turn_overhead_s + cm.profile.turn_seq_overhead_s * n
                width += seg
                gen = max(max(s.rem for s in batch), 1)
                dec = 0.0
                for j in range(gen - 1):  # decode forward j feeds token j+1 of every active row
                    active = sum(1 for s in batch if s.rem > j + 1)
                    dec += cm.decode_step_time_s(self.tp, n, n * (width + j)) - seq_s * (n - active)
                width += gen - 1
                env_s = sum(s.ep.turns[s.turn][2] for s in batch)
                self._note("prefill", None, seqs=[s.ep.id for s in batch], tokens=sum(segs), time_s=pre)
                self._note("decode", None, at=env.now + pre, seqs=n, iterations=gen - 1, context=n * width,
                           time_s=dec)
                yield env.timeout(pre + dec + env_s)
                st.events += 1
                st.busy_s += pre + dec
                st.prefill_tokens += sum(segs)
                st.generated_tokens += sum(s.rem for s in batch)
                st.decode_iterations += gen - 1
                st.peak_kv_tokens = max(st.peak_kv_tokens, n * width)
                st.peak_running = max(st.peak_running, n)
                playing = []
                for s in batch:
                    s.ctx += s.pending + s.rem
                    s.turn += 1
                    if s.turn < len(s.ep.turns):
                        s.pending, s.rem = s.ep.turns[s.turn][0], s.ep.turns[s.turn][1]
                        playing.append(s)
                    else:
                        s.state = DONE
                        st.finished[s.ep.id] = env.now
                        self._note("done", s, context=s.ctx, finish=env.now)
                batch = playing
        st.t_end = max(st.t_end, env.now)
