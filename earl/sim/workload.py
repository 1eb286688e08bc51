"""Agentic workloads for the simulator: multi-turn episodes drawn from seeded distributions.

An episode is a list of turns `(obs_tokens, gen_tokens, env_latency_s)`: the environment (or
the prompt, for the first turn) hands the model `obs_tokens`, the model generates `gen_tokens`,
then the environment / tool takes `env_latency_s` to answer. The context grows by both. Across
training steps the generated tokens per turn grow along a curve (agents learn to reason
longer), or a workload trace recorded by `earl run` is replayed. A `max_context` cap truncates
episodes the way the runtime does.

Draws depend only on (seed, step), so every policy compared in one study sees the same episodes.

    python -c "from earl.sim.workload import *; w = Workload(preset('connect-four')); print(w.stats(w.episodes(0)))"
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from earl.specs import WorkloadStats, unknown_name_error

GROWTH_CURVES = ("none", "linear", "logistic")


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """Distributions of one agentic task. Token counts are lognormal with the given mean and
    coefficient of variation (cv = 0: constant); turns are uniform in [turns_min, turns_max]."""

    name: str = "custom"  # preset this spec started from
    episodes_per_step: int = 64  # episodes (responses) rolled out per training step
    episodes_per_gpu: float = 0.0  # > 0: episodes per step = this x the cluster's GPUs (replaces
    #                                episodes_per_step, so the batch grows with the cluster)
    prompt_tokens: float = 256  # first observation (the prompt), tokens, mean
    prompt_tokens_cv: float = 0.1  # its coefficient of variation
    turns_min: int = 1  # fewest model turns per episode
    turns_max: int = 1  # most model turns per episode
    gen_tokens: float = 128  # tokens the model generates per turn at step 0, mean
    gen_tokens_cv: float = 0.5  # their coefficient of variation
    obs_tokens: float = 32  # observation tokens the environment returns per turn, mean
    obs_tokens_cv: float = 0.2  # their coefficient of variation
    env_latency_s: float = 0.0  # environment / tool answer latency per turn, seconds, mean
    env_latency_cv: float = 0.0  # its coefficient of variation
    growth: str = "none"  # curve of generated tokens over steps: none | linear | logistic
    growth_factor: float = 1.0  # multiplier on gen_tokens reached at growth_steps
    growth_steps: int = 100  # steps over which the growth curve rises
    max_context: int = 0  # tokens; an episode reaching it is truncated (0: no cap)
    trace: str = ""  # path of a workload trace JSONL (`earl run`) to replay instead of drawing

    def __post_init__(self):
        for n in ("episodes_per_step", "turns_min", "turns_max", "growth_steps"):
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"workload.{n} must be an integer >= 1, got {v!r}")
        if not isinstance(self.episodes_per_gpu, (int, float)) or self.episodes_per_gpu < 0:
            raise ValueError(f"workload.episodes_per_gpu must be >= 0 (0: use episodes_per_step), "
                             f"got {self.episodes_per_gpu!r}")
        if self.turns_max < self.turns_min:
            raise ValueError(f"workload.turns_max={self.turns_max} is below "
                             f"workload.turns_min={self.turns_min}")
        for n in ("prompt_tokens", "gen_tokens", "obs_tokens"):
            if getattr(self, n) < 1:
                raise ValueError(f"workload.{n} must be >= 1 token, got {getattr(self, n)!r}")
        for n in ("prompt_tokens_cv", "gen_tokens_cv", "obs_tokens_cv", "env_latency_cv"):
            if getattr(self, n) < 0:
                raise ValueError(f"workload.{n} must be >= 0, got {getattr(self, n)!r}")
        if self.env_latency_s < 0:
            raise ValueError(f"workload.env_latency_s must be >= 0 seconds, got {self.env_latency_s!r}")
        if self.growth not in GROWTH_CURVES:
            raise ValueError(f"workload.growth {self.growth!r}; valid: {', '.join(GROWTH_CURVES)}")
        if self.growth_factor <= 0:
            raise ValueError(f"workload.growth_factor must be > 0, got {self.growth_factor!r}")
        if self.max_context < 0:
            raise ValueError(f"workload.max_context must be >= 0 tokens (0: no cap), got "
                             f"{self.max_context!r}")

    def for_cluster(self, gpus: int) -> WorkloadSpec:
        """This workload on `gpus` GPUs: `episodes_per_gpu` (when set) turned into episodes per step."""
        if not self.episodes_per_gpu:
            return self
        return dataclasses.replace(self, episodes_per_step=max(1, round(self.episodes_per_gpu * gpus)),
                                   episodes_per_gpu=0.0)

    def growth_multiplier(self, step: int) -> float:
        """Factor on the per-turn generated tokens at training step `step`."""
        x = min(max(step / self.growth_steps, 0.0), 1.0)
        if self.growth == "none":
            return 1.0
        if self.growth == "logistic":  # S-curve through (0, 0) and (1, 1)
            lo, hi = 1 / (1 + math.exp(5.0)), 1 / (1 + math.exp(-5.0))
            x = (1 / (1 + math.exp(-10.0 * (x - 0.5))) - lo) / (hi - lo)
        return 1.0 + (self.growth_factor - 1.0) * x


# Named tasks. Numbers are typical of the task, not measured: Connect Four (7x6 board, the
# agent makes 4-21 moves against an engine that answers in milliseconds, reasoning grows with
# training; EARL paper's motivating workload), Tic-Tac-Toe (3-5 moves, short boards), and a
# tool-use agent (long-tailed tool outputs and second-scale tool latency).
PRESETS: dict[str, WorkloadSpec] = {w.name: w for w in [
    WorkloadSpec(name="connect-four", episodes_per_step=512, prompt_tokens=350,
                 prompt_tokens_cv=0.05, turns_min=4, turns_max=18, gen_tokens=150,
                 gen_tokens_cv=0.6, obs_tokens=90, obs_tokens_cv=0.1, env_latency_s=0.01,
                 env_latency_cv=0.3, growth="logistic", growth_factor=8.0, growth_steps=100,
                 max_context=32768),
    WorkloadSpec(name="tic-tac-toe", episodes_per_step=512, prompt_tokens=220,
                 prompt_tokens_cv=0.05, turns_min=3, turns_max=5, gen_tokens=100,
                 gen_tokens_cv=0.5, obs_tokens=40, obs_tokens_cv=0.1, env_latency_s=0.005,
                 env_latency_cv=0.3, growth="logistic", growth_factor=4.0, growth_steps=100,
                 max_context=16384),
    WorkloadSpec(name="tool-use", episodes_per_step=256, prompt_tokens=600,
                 prompt_tokens_cv=0.3, turns_min=2, turns_max=8, gen_tokens=120,
                 gen_tokens_cv=0.7, obs_tokens=400, obs_tokens_cv=1.0, env_latency_s=1.0,
                 env_latency_cv=1.0, growth="linear", growth_factor=2.0, growth_steps=100,
                 max_context=32768),
]}


def preset(name: str) -> WorkloadSpec:
    """A built-in workload by name."""
    if name not in PRESETS:
        raise unknown_name_error("workload preset", name, PRESETS)
    return PRESETS[name]


@dataclass(frozen=True)
class Episode:
    """One drawn episode: `turns[i] = (obs_tokens, gen_tokens, env_latency_s)`."""

    id: int
    turns: tuple[tuple[int, int, float], ...]
    truncated: bool = False  # hit max_context

    @functools.cached_property
    def context_tokens(self) -> int:
        return sum(o + g for o, g, _ in self.turns)

    @functools.cached_property
    def generated_tokens(self) -> int:
        return sum(g for _, g, _ in self.turns)


def truncate_turns(turns, max_context: int) -> tuple[tuple, bool]:
    """Cut turns so the context never exceeds `max_context` (0: no cap); True when cut."""
    if max_context <= 0:
        return tuple(turns), False
    out, ctx = [], 0
    for obs, gen, lat in turns:
        if ctx + obs >= max_context:  # not even one generated token fits: the episode ends here
            return tuple(out), True
        if ctx + obs + gen > max_context:
            out.append((obs, max_context - ctx - obs, lat))
            return tuple(out), True
        out.append((obs, gen, lat))
        ctx += obs + gen
    return tuple(out), False


def truncate_arrays(obs: np.ndarray, gen: np.ndarray, turns: np.ndarray, max_context: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`truncate_turns` on a batch: obs / gen (episodes x turns, ints >= 1), turns per episode
    -> (obs, gen, kept turns, truncated), columns past an episode's kept turns zeroed."""
    n, width = obs.shape
    col = np.arange(width)
    live = col[None, :] < turns[:, None]
    obs, gen = obs * live, gen * live
    if max_context <= 0 or n == 0 or width == 0:
        return obs, gen, turns.copy(), np.zeros(n, bool)
    # an episode is cut exactly when its whole context passes the cap: only those rows are walked
    cut = (obs.sum(axis=1) + gen.sum(axis=1)) > max_context
    rows = np.nonzero(cut)[0]
    through = np.cumsum(obs[rows] + gen[rows], axis=1)  # context after each turn (non-decreasing)
    c = (through <= max_context).sum(axis=1)  # the first turn that passes the cap
    room = max_context - (through[np.arange(len(rows)), c] - gen[rows, c])  # generated tokens that still fit
    keeps = room > 0
    kept = turns.copy()
    kept[rows] = c + keeps
    gen[rows[keeps], c[keeps]] = room[keeps]
    alive = col[None, :] < kept[rows][:, None]
    obs[rows] *= alive
    gen[rows] *= alive
    return obs, gen, kept, cut


@dataclass(frozen=True, eq=False)
class Draw:
    """One step's episodes as arrays: turn j of episode i at [i, j] (zeros past its kept
    turns). `episodes()` makes `Episode` objects of some rows; the simulator's aggregated mode
    materialises only the replicas it simulates."""

    ids: np.ndarray  # (n,) episode ids
    obs: np.ndarray  # (n, turns) observation tokens per turn (the prompt first)
    gen: np.ndarray  # (n, turns) generated tokens per turn
    lat: np.ndarray  # (n, turns) environment latency per turn, seconds
    turns: np.ndarray  # (n,) turns kept after truncation
    truncated: np.ndarray  # (n,) bool: hit max_context

    @functools.cached_property
    def context(self) -> np.ndarray:
        return (self.obs + self.gen).sum(axis=1)

    @functools.cached_property
    def generated(self) -> np.ndarray:
        return self.gen.sum(axis=1)

    @functools.cached_property
    def lat_total(self) -> np.ndarray:
        return self.lat.sum(axis=1)

    @property
    def prompts(self) -> np.ndarray:
        return self.obs[:, 0]

    def rows(self, which) -> Draw:
        """The episodes at row indices (or a boolean mask) `which`."""
        if isinstance(which, np.ndarray) and which.dtype == bool and which.all():
            return self
        return Draw(ids=self.ids[which], obs=self.obs[which], gen=self.gen[which],
                    lat=self.lat[which], turns=self.turns[which], truncated=self.truncated[which])

    def episodes(self) -> list[Episode]:
        obs, gen, lat = self.obs.tolist(), self.gen.tolist(), self.lat.tolist()
        out = []
        for r, (i, k, cut) in enumerate(zip(self.ids.tolist(), self.turns.tolist(),
                                            self.truncated.tolist(), strict=True)):
            o, g, la = obs[r], gen[r], lat[r]
            out.append(Episode(id=i, turns=tuple((o[t], g[t], la[t]) for t in range(k)),
                               truncated=cut))
        return out

    def stats(self, *, step: int = 0, max_context: int = 0) -> WorkloadStats:
        return stats_of(self.context, self.turns, self.generated, step=step, max_context=max_context)

    @staticmethod
    def of_turns(raw: list, max_context: int, ids=None) -> Draw:
        """Arrays of per-episode turn lists [(obs, gen, latency_s), ...] (a replayed trace)."""
        n, width = len(raw), max((len(t) for t in raw), default=0)
        obs, gen = np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
        lat = np.zeros((n, width))
        for i, turns in enumerate(raw):
            for j, (o, g, la) in enumerate(turns):
                obs[i, j], gen[i, j], lat[i, j] = o, g, la
        k = np.array([len(t) for t in raw], np.int64)
        obs, gen, kept, cut = truncate_arrays(obs, gen, k, max_context)
        return Draw(ids=np.arange(n) if ids is None else np.asarray(ids), obs=obs, gen=gen,
                    lat=np.where(np.arange(width)[None, :] < kept[:, None], lat, 0.0), turns=kept,
                    truncated=cut)


@dataclass(frozen=True, eq=False)
class FlatDraw:
    """A compact draw (`Workload.compact`): the same per-episode view as `Draw` (ids, turns,
    truncated, context, generated, prompts, lat_total), with the turns of every episode laid end
    to end in flat arrays (episode i's turn j at first[i] + j; zeros past its kept turns).
    `rows()` gives a `Draw` of some episodes (a replica's), so the per-turn detail is built only
    for the episodes that are simulated."""

    ids: np.ndarray  # (n,) episode ids
    first: np.ndarray  # (n,) flat index of each episode's first turn
    obs: np.ndarray  # (m,) observation tokens per drawn turn (int64; the prompt first)
    gen: np.ndarray  # (m,) generated tokens per drawn turn (int64)
    lat: np.ndarray  # (m,) environment latency per drawn turn, seconds (float32)
    turns: np.ndarray  # (n,) turns kept after truncation
    truncated: np.ndarray  # (n,) bool: hit max_context

    def _per_episode(self, flat: np.ndarray, dtype) -> np.ndarray:
        return np.add.reduceat(flat, self.first).astype(dtype) if len(self.ids) else np.zeros(0, dtype)

    @functools.cached_property
    def context(self) -> np.ndarray:
        return self._per_episode(self.obs, np.int64) + self.generated

    @functools.cached_property
    def generated(self) -> np.ndarray:
        return self._per_episode(self.gen, np.int64)

    @functools.cached_property
    def lat_total(self) -> np.ndarray:
        return self._per_episode(self.lat.astype(np.float64), np.float64)

    @property
    def prompts(self) -> np.ndarray:
        return self.obs[self.first].astype(np.int64)

    def rows(self, which) -> Draw | FlatDraw:
        """The episodes at row indices (or a boolean mask) `which`, as a `Draw` (every one: itself)."""
        if isinstance(which, np.ndarray) and which.dtype == bool and which.all():
            return self
        idx = np.arange(len(self.ids))[which]
        width = int(self.turns[idx].max()) if len(idx) else 0
        col = np.arange(width)
        live = col[None, :] < self.turns[idx][:, None]
        at = np.where(live, self.first[idx][:, None] + col[None, :], 0)
        return Draw(ids=self.ids[idx], obs=(self.obs[at] * live).astype(np.int64),
                    gen=(self.gen[at] * live).astype(np.int64), lat=(self.lat[at] * live).astype(np.float64),
                    turns=self.turns[idx], truncated=self.truncated[idx])

    def episodes(self) -> list[Episode]:
        return self.rows(slice(None)).episodes()

    def stats(self, *, step: int = 0, max_context: int = 0) -> WorkloadStats:
        return stats_of(self.context, self.turns, self.generated, step=step, max_context=max_context)


def stats_of(context, turns, generated, *, step: int = 0, max_context: int = 0,
             memory_headroom_frac: float | None = None) -> WorkloadStats:
    """The observed workload a selector sees, from per-episode context tokens, turns and
    generated tokens."""
    if len(context) == 0:
        raise ValueError("no episodes to summarise (every episode was dropped)")
    ctx = np.asarray(context, dtype=float)
    return WorkloadStats(
        step=step, num_responses=len(ctx), context_mean=float(ctx.mean()),
        context_p95=float(max(np.percentile(ctx, 95), ctx.mean())),
        context_max=float(ctx.max()), turns_mean=float(np.mean(turns)),
        response_tokens_mean=float(np.mean(generated)), max_context=max_context,
        memory_headroom_frac=memory_headroom_frac)


def _lognormal(rng: np.random.Generator, mean: float, cv: float, size) -> np.ndarray:
    if cv == 0:
        return np.full(size, float(mean))
    s2 = math.log1p(cv * cv)
    return rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), size)


# The compact draw's inverse-CDF table: the standard normal's probability outside its TAIL_PROB
# tails on each side is cut into 2**TABLE_BITS equal bins, and a 16-bit uniform picks one: the
# value is the bin's middle quantile. A value falls in a tail with probability 2 * TAIL_PROB;
# there a fresh uniform within the tail goes through the inverse CDF (exact).
TABLE_BITS = 16
TAIL_PROB = 1 / 256  # per side (0.39%), drawn exactly
# Acklam's rational approximation of the normal quantile in its lower tail (p < 0.02425;
# relative error under 1.2e-9; coefficients as published by P. J. Acklam, 2003)
_ACKLAM_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_ACKLAM_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
             3.754408661907416e+00)


def normal_quantile_tail(q: np.ndarray) -> np.ndarray:
    """The standard normal's quantile at lower-tail probabilities 0 < q < 0.02425 (vectorised)."""
    r = np.sqrt(-2.0 * np.log(q))
    c, d = _ACKLAM_C, _ACKLAM_D
    num = ((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]
    return num / ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1.0)


_STD_NORMAL = statistics.NormalDist()


def _bin_edge(k: float) -> float:
    """The standard normal quantile at the table's bin position k (0 .. 2**TABLE_BITS)."""
    return _STD_NORMAL.inv_cdf(TAIL_PROB + k * (1 - 2 * TAIL_PROB) / (1 << TABLE_BITS))


@functools.cache
def _normal_bins() -> np.ndarray:
    """The middle quantile of each bin of the table."""
    return np.array([_bin_edge(k + 0.5) for k in range(1 << TABLE_BITS)])


def table_error_bound(cv: float) -> float:
    """Largest relative difference, before rounding, between a tabled lognormal draw (outside
    the exact tails) and the exact inverse-CDF draw of the same uniform: exp(sigma * dz) - 1,
    dz the widest half-bin in z (6.7e-4: the outermost bins, next to the tails)."""
    dz = max(_bin_edge(0.5) - _bin_edge(0), _bin_edge(1) - _bin_edge(0.5))
    return math.expm1(math.sqrt(math.log1p(cv * cv)) * dz)


def _lognormal_table(rng: np.random.Generator, mean: float, cv: float, size: int, *,
                     tokens: bool) -> np.ndarray:
    """`size` lognormal draws by table lookup (the compact draw): about 2x cheaper than float32
    normals and exp, rounding included. `tokens`: rounded to int64 counts >= 1 (int64: numpy
    sums them per episode twice as fast as int32), else float32. The tails (TAIL_PROB per side)
    are exact inverse-CDF draws; every other value is its bin's middle quantile, within
    `table_error_bound(cv)` (3.7e-4 at cv 0.6, 5.5e-4 at cv 1) of the exact draw of the same
    uniform before rounding."""
    dtype = np.int64 if tokens else np.float32
    if cv == 0:
        return np.full(size, max(round(mean), 1) if tokens else mean, dtype)
    s2 = math.log1p(cv * cv)
    mu, sigma = math.log(mean) - s2 / 2, math.sqrt(s2)

    def value(z):
        x = np.exp(mu + sigma * z)
        return np.maximum(np.rint(x), 1).astype(dtype) if tokens else x.astype(dtype)

    # which values fall in a tail: as many as a binomial count, at uniformly chosen positions
    # (the same law as testing each value's uniform), each a uniform probability within its tail
    tail = rng.choice(size, size=rng.binomial(size, 2 * TAIL_PROB), replace=False)
    out = value(_normal_bins())[rng.integers(0, 1 << TABLE_BITS, size=size, dtype=np.uint16)]
    if len(tail):
        z = normal_quantile_tail(np.maximum(rng.random(len(tail)) * TAIL_PROB, 1e-300))
        out[tail] = value(np.where(rng.random(len(tail)) < 0.5, -z, z))
    return out


COMPACT_SEED = 0x5CA1E  # the compact draw's stream: (seed, step, COMPACT_SEED)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS (a process-wide
    allocator setting): a compact step allocates and frees ~0.1 GB of arrays, and returning them
    cost a quarter of the CPU time at 131,072 GPUs in page faults (28 of 108 s system time). False
    where the C library has no mallopt (not glibc)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


class Workload:
    """Episodes per training step, drawn (seeded by (seed, step)) or replayed from a trace.

    A step of more than `compact_above` episodes (0: never) is drawn compactly: the same
    distributions, by inverse-CDF table lookup (`_lognormal_table`: exact tails, every other value
    within 0.06% of the exact draw before rounding at cv <= 1) and for the turns an episode has
    only (the per-episode draw fills every one of `turns_max` columns), from a stream of its own.
    It is about 10x cheaper, so 131,072 GPUs (524,288 episodes per step) draw in about 0.15 s; it
    is a different sample from the same distributions, not the same episodes (docs/simulator.md,
    "At frontier scale")."""

    def __init__(self, spec: WorkloadSpec, seed: int = 0, compact_above: int = 0):
        self.spec = spec
        self.seed = seed
        self.compact_above = compact_above
        self._trace = load_trace(spec.trace) if spec.trace else None

    def compact(self) -> bool:
        """Whether a step is drawn compactly (see the class docstring)."""
        return self._trace is None and 0 < self.compact_above < self.spec.episodes_per_step

    def episodes(self, step: int) -> list[Episode]:
        return self.draw(step).episodes()

    def draw(self, step: int) -> Draw | FlatDraw:
        """This step's episodes as arrays (episodes with no turn left after truncation kept)."""
        if self._trace is not None:
            raw = self._trace[step % len(self._trace)]  # a short trace repeats from its start
            d = Draw.of_turns(raw, self.spec.max_context)
            return d.rows(d.turns > 0)
        if self.compact():
            keep_freed_memory()
            return self._draw_compact(step)
        s = self.spec
        rng = np.random.default_rng([self.seed, step])
        n, tmax = s.episodes_per_step, s.turns_max
        turns = rng.integers(s.turns_min, s.turns_max + 1, size=n)
        prompt = _lognormal(rng, s.prompt_tokens, s.prompt_tokens_cv, n)
        obs = _lognormal(rng, s.obs_tokens, s.obs_tokens_cv, (n, tmax))
        gen = _lognormal(rng, s.gen_tokens * s.growth_multiplier(step), s.gen_tokens_cv, (n, tmax))
        lat = _lognormal(rng, s.env_latency_s, s.env_latency_cv, (n, tmax)) if s.env_latency_s else \
            np.zeros((n, tmax))
        obs[:, 0] = prompt
        for a in (obs, gen):  # in place: at 131,072 GPUs each is 524K x 18
            np.maximum(np.rint(a, out=a), 1, out=a)
        obs_i, gen_i = obs.astype(np.int64), gen.astype(np.int64)
        obs_i, gen_i, kept, cut = truncate_arrays(obs_i, gen_i, turns.astype(np.int64), s.max_context)
        lat *= np.arange(tmax)[None, :] < kept[:, None]
        return Draw(ids=np.arange(n), obs=obs_i, gen=gen_i, lat=lat, turns=kept, truncated=cut)

    def _draw_compact(self, step: int) -> FlatDraw:
        """This step's episodes drawn over their own turns only, by table lookup (`compact`)."""
        s = self.spec
        rng = np.random.default_rng([self.seed, step, COMPACT_SEED])
        n = s.episodes_per_step
        turns = rng.integers(s.turns_min, s.turns_max + 1, size=n)
        first = np.cumsum(turns) - turns  # flat index of each episode's first turn
        m = int(turns.sum())
        obs_i = _lognormal_table(rng, s.obs_tokens, s.obs_tokens_cv, m, tokens=True)
        obs_i[first] = _lognormal_table(rng, s.prompt_tokens, s.prompt_tokens_cv, n, tokens=True)
        gen_i = _lognormal_table(rng, s.gen_tokens * s.growth_multiplier(step), s.gen_tokens_cv, m, tokens=True)
        lat = _lognormal_table(rng, s.env_latency_s, s.env_latency_cv, m, tokens=False) if s.env_latency_s else \
            np.zeros(m, np.float32)
        kept, cut = turns.astype(np.int64), np.zeros(n, bool)
        obs_sum, gen_sum = (np.add.reduceat(a, first) for a in (obs_i, gen_i))  # per episode
        if s.max_context > 0:  # only the episodes whose whole context passes the cap are walked
            rows = np.nonzero(obs_sum + gen_sum > s.max_context)[0]
            if len(rows):
                col = np.arange(s.turns_max)
                live = col[None, :] < kept[rows][:, None]
                at = np.where(live, first[rows][:, None] + col[None, :], 0)
                o, g, k, c = truncate_arrays(obs_i[at] * live, gen_i[at] * live, kept[rows], s.max_context)
                obs_i[at[live]], gen_i[at[live]] = o[live], g[live]
                lat[at[live]] *= (col[None, :] < k[:, None])[live]
                kept[rows], cut[rows] = k, c
                obs_sum[rows], gen_sum[rows] = o.sum(axis=1), g.sum(axis=1)
        d = FlatDraw(ids=np.arange(n), first=first, obs=obs_i, gen=gen_i, lat=lat, turns=kept, truncated=cut)
        # the cached properties, known (latency summed in float32: at most turns_max terms)
        d.__dict__.update(context=obs_sum + gen_sum, generated=gen_sum,
                          lat_total=np.add.reduceat(lat, first).astype(np.float64))
        return d

    @staticmethod
    def stats(episodes: list[Episode], *, step: int = 0, max_context: int = 0,
              memory_headroom_frac: float | None = None) -> WorkloadStats:
        """The observed workload a selector sees."""
        return stats_of([e.context_tokens for e in episodes], [len(e.turns) for e in episodes],
                        [e.generated_tokens for e in episodes], step=step, max_context=max_context,
                        memory_headroom_frac=memory_headroom_frac)


def load_trace(path: str | Path) -> list[list[list[tuple[int, int, float]]]]:
    """Read a workload trace JSONL: one line per step,
    `{"step": int, "episodes": [{"id": int, "turns": [[obs, gen, env_latency_s], ...]}]}`."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"workload trace {p} does not exist")
    steps = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            rec = json.loads(line)
            eps = rec["episodes"]
            step = [[(int(o), int(g), float(lat)) for o, g, lat in ep["turns"]] for ep in eps]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"{where}: not a workload trace line ({type(e).__name__}: {e}); "
                             'expected {"step": 0, "episodes": [{"id": 0, "turns": '
                             "[[obs, gen, latency_s], ...]}]}") from None
        for ep in step:
            for o, g, lat in ep:
                if o < 0 or g < 0 or not (0 <= lat < math.inf):
                    raise ValueError(f"{where}: turn {[o, g, lat]}: token counts must be >= 0 (not negative) and the "
                                     "latency a finite number of seconds >= 0")
        steps.append(step)
    if not steps:
        raise ValueError(f"workload trace {p} holds no steps")
    return steps


def with_overrides(spec: WorkloadSpec, **kw) -> WorkloadSpec:
    """`spec` with some fields replaced (validated again)."""
    return dataclasses.replace(spec, **kw)
