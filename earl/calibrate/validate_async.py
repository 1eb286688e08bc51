"""`earl validate --schedule async`: the runtime's asynchronous schedule (earl.runtime.async_rl)
next to its synchronous one on the same config and `--nproc N`, each measured and simulated
with the calibrated profile: generated tokens/s of each and their ratio, staleness mean / max,
and the async run's per-pool stage times (rollout pool: rollout, waits for weights and for the
hand-off; training pool: waits for samples, training, the weight push).

The simulated sync run is `earl validate`'s own replay (earl.calibrate.validate._simulate); the
simulated async run is the simulator's async scheduler with the runtime's "per-step" feed
(earl/sim/async_rl.py) on the async run's recorded workload, its pools split as the runtime
split them. On a CPU host whose `host_parallel` cores the N processes share, the sync run's
predicted times are stretched by N / host_parallel, as `earl validate` does; the async run's
pools are not always busy together (a training pool waiting for samples leaves the cores to the
rollout pool), so each pool's times are stretched inside the simulation by what it shares with
the other pool's busy fraction, found by iterating the simulation to a fixed point
(`pool_stretch`).

    earl validate --schedule async --nproc 2 --steps 5 --set env.name=calculator --out /tmp/va
    OMP_NUM_THREADS=1 python -m pytest -q tests/calibrate/test_validate_async.py
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from earl.calibrate.host import local_cluster, sim_engine, sim_kv_round
from earl.calibrate.validate import (
    DTYPE_NAMES,
    _run_runtime,
    _simulate,
    advantage_spec,
    device_of,
    host_stretch,
    logprob_passes,
    rollout_on_host,
)
from earl.cost_model import CostModel
from earl.cost_model.profile import HardwareProfile, load_profile, slowed
from earl.outputs import check_out_dir
from earl.runtime.metrics import read_metrics
from earl.runtime.run_config import apply_overrides
from earl.sim.scenario import Scenario
from earl.sim.simulation import Simulation
from earl.sim.workload import WorkloadSpec, load_trace
from earl.specs import MODEL_CATALOG, ModelSpec
from earl.trace import Span, atomic_write_text, read_chrome_trace

ASYNC_NPROCS = (2, 4)  # an async run needs a rollout and a training pool; the profile is fitted at 2 and 4
SCHEDULES = ("sync", "async")  # `earl validate --schedule`
# per-pool stage times compared, per scored step: (row name, runtime span or metrics column, pool)
POOL_STAGES = (("rollout", "rollout", "rollout pool"), ("wait for weights", "wait_weights", "rollout pool"),
               ("hand-off wait", "hand-off", "rollout pool"), ("wait for samples", "wait_samples_s", "training pool"),
               ("train", "train_s", "training pool"), ("weight push", "weight_push_s", "training pool"))


@dataclass(frozen=True, kw_only=True)
class AsyncValidation:
    """Measured vs simulated figures of one async run next to one sync run."""

    nproc: int
    profile: str
    max_staleness: int
    pools: dict  # rollout / train: processes
    scored_steps: int
    host_stretch: float  # the sync run's predicted times are the simulator's x this (N processes on the host's cores)
    pool_stretch: tuple = (1.0, 1.0)  # the async run's (rollout, training) pools' stretch (`pool_stretch`)
    rows: list[dict] = field(default_factory=list)  # {"what", "measured", "simulated"}: see report_rows
    run_dirs: dict = field(default_factory=dict)  # sync / async -> the run's folder


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"--schedule {schedule!r} unknown; valid: {', '.join(SCHEDULES)}")
    return schedule


def check_async_nproc(nproc) -> int:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc not in ASYNC_NPROCS:
        raise ValueError(f"--nproc {nproc!r} with --schedule async; valid: {', '.join(map(str, ASYNC_NPROCS))} "
                         "(a rollout pool and a training pool)")
    return nproc


def model_spec_of(cfg) -> ModelSpec:
    """The cost model's spec of the run's model, in the run's dtype."""
    spec = MODEL_CATALOG[cfg.model.path] if cfg.model.path in MODEL_CATALOG else \
        ModelSpec.from_hf_config(cfg.model.path)
    return dataclasses.replace(spec, dtype=DTYPE_NAMES[cfg.model.dtype])


def tokens_per_s(rows: list[dict]) -> float:
    """Generated tokens per second of wall time over `rows` (metrics or simulated rows)."""
    tokens = sum(r["generated_tokens"] if "generated_tokens" in r else r["gen_tokens_mean"] * r["episodes"]
                 for r in rows)
    wall = sum(r["step_time_s"] if "step_time_s" in r else r["step_s"] for r in rows)
    return tokens / wall if wall > 0 else 0.0


def simulate_async(cfg, spec: ModelSpec, trace: Path, prof: HardwareProfile, steps: int, nproc: int,
                   rollout_gpus: int, partial: bool | None = None,
                   stretch: tuple[float, float] = (1.0, 1.0)) -> Simulation:
    """The simulator's async scheduler with the runtime's per-step feed on `trace`: tp1 replicas
    filling `rollout_gpus` processes, tp1 training filling the rest, each pool's prices
    `stretch` (rollout, training) times the profile's (`pool_stretch`) (micro-batches packed up
    to the trainer's token budget, as `earl validate` packs them; the experience stage's log-prob
    passes are the sync run's, `logprob_passes`: the async trainer skips the old policy's pass
    the same way and adds the reference's with a KL term)."""
    def priced(factor: float) -> CostModel:
        p = slowed(prof, factor)
        return CostModel(spec, local_cluster(p, nproc), p)

    cm = priced(stretch[1])
    adv = advantage_spec(cfg)
    episodes = cfg.episodes_per_step
    longest = max(sum(o + g for o, g, _ in turns) for line in load_trace(trace) for turns in line)
    per_rank = -(-episodes // (nproc - rollout_gpus))
    train = f"tp1-mb{max(1, min(per_rank, cfg.trainer.token_budget // max(1, longest)))}"
    sc = Scenario(name="validate-async", steps=steps, model=spec.name if spec.name in MODEL_CATALOG else "tiny",
                  hardware="cpu", nodes=1, gpus_per_node=nproc,
                  workload=WorkloadSpec(episodes_per_step=episodes, trace=str(trace),
                                        max_context=cfg.sampling.max_context),
                  rollout_plan="tp1", experience_plan=train, train_plan=train, selector="static",
                  dispatcher=cfg.policy.dispatcher, max_num_seqs=cfg.engine_batch or episodes,
                  logprob_passes=logprob_passes(cfg.trainer), mode="async",
                  max_staleness=cfg.schedule.max_staleness, rollout_gpus=rollout_gpus,
                  partial_rollout=cfg.schedule.partial_rollout if partial is None else partial)
    return Simulation(sc, "static", cfg.policy.dispatcher, cost_model=cm, engine=sim_engine(cfg.engine),
                      padded=True, token_budget=cfg.trainer.token_budget, fsdp=True, handoff=True,
                      head_on="generated", train_placement="balanced", async_feed="per-step",
                      rollout_cost_model=priced(stretch[0]) if stretch[0] != stretch[1] else None,
                      # each learner rank computes the step's advantages over every episode
                      # itself (earl.runtime.async_rl.experience): no reduction between ranks
                      stat_reductions=0, estimator=adv.key, kv_round=sim_kv_round(cfg.engine)).run()


def pool_busy(sim: Simulation, scored: int) -> tuple[float, float]:
    """(rollout, training) pool's busy fraction of the wall time of the last `scored` steps of an
    async simulation: a rollout rank's "rollout" spans (mean over the ranks), the training
    pool's stages after its wait for samples."""
    rows = sim.rows[-scored:]
    wall = sum(r["step_time_s"] for r in rows)
    if wall <= 0:
        return 1.0, 1.0
    steps = [r["step"] for r in rows]
    rollout = span_seconds(sim.spans, steps, ("rollout",))["rollout"] * len(steps)
    train = sum(r[k] for r in rows for k in ("experience_s", "dispatch_s", "train_s", "reshard_s", "sync_s"))
    return min(1.0, rollout / wall), min(1.0, train / wall)


def pool_stretch(prof: HardwareProfile, pools: dict, busy: tuple[float, float], device: str) -> tuple[float, float]:
    """(rollout, training) pool's stretch on a CPU host (`host_stretch` of the ranks running):
    while the other pool works (its busy fraction b of the time) a pool's ranks share the cores
    with all N ranks, the rest of the time with their own pool's only; its rate is the mean of
    the two rates over time, so its stretch is their harmonic mean. (1, 1) on a GPU."""
    if device != "cpu":
        return 1.0, 1.0
    both = host_stretch(prof, pools["rollout"] + pools["train"], device)

    def one(own: int, other_busy: float) -> float:
        return 1.0 / (other_busy / both + (1.0 - other_busy) / host_stretch(prof, own, device))

    return one(pools["rollout"], busy[1]), one(pools["train"], busy[0])


STRETCH_ROUNDS = 6  # simulations at most to find the pools' stretch (`simulate_async_on_host`)


def simulate_async_on_host(cfg, spec: ModelSpec, trace: Path, prof: HardwareProfile, steps: int, nproc: int,
                           pools: dict, device: str, scored: int) -> tuple[Simulation, tuple[float, float]]:
    """The async simulation with its pools' stretch at a fixed point: from both pools always
    busy (every rank stretched by N / host_parallel), simulate, take the pools' busy fractions
    (`pool_busy`, over the `scored` steps), re-stretch (`pool_stretch`), until the busy fractions
    move by under 0.01 (each round moves them half way: no oscillation). A GPU needs one round."""
    busy = (1.0, 1.0)
    for _ in range(STRETCH_ROUNDS):
        stretch = pool_stretch(prof, pools, busy, device)
        sim = simulate_async(cfg, spec, trace, prof, steps, nproc, pools["rollout"], stretch=stretch)
        got = pool_busy(sim, scored)
        if device != "cpu" or max(abs(a - b) for a, b in zip(got, busy, strict=True)) < 0.01:
            break
        busy = tuple((a + b) / 2 for a, b in zip(got, busy, strict=True))
    return sim, stretch


def span_seconds(spans: list[Span], steps: list[int], names: tuple[str, ...]) -> dict[str, float]:
    """name -> seconds per step of each rollout rank's spans of that name over `steps`, averaged
    over the ranks that have any."""
    per: dict[str, dict[int, float]] = {n: {} for n in names}
    for sp in spans:
        if sp.name in per and sp.step in steps:
            per[sp.name][sp.rank] = per[sp.name].get(sp.rank, 0.0) + sp.duration_s
    return {n: (sum(v.values()) / len(v) / len(steps) if v else 0.0) for n, v in per.items()}


def handoff_spans(spans: list[Span]) -> list[Span]:
    """The runtime's rollout ranks' hand-off waits, which it does not record as spans: from the
    end of a rank's rollout of step s to the start of its next span (step s's episodes put in
    its send queue, waiting only while the queue is full), attributed to step s."""
    by_rank: dict[int, list[Span]] = {}
    for sp in spans:
        if sp.name in ("rollout", "wait_weights"):
            by_rank.setdefault(sp.rank, []).append(sp)
    out = []
    for rank, sps in by_rank.items():
        sps.sort(key=lambda s: s.t_start)
        for a, b in zip(sps, sps[1:], strict=False):
            if a.name == "rollout":
                out.append(Span(name="hand-off", stage="dispatch", rank=rank, t_start=a.t_end, t_end=b.t_start,
                                step=a.step))
    return out


def _mean(rows: list[dict], key: str) -> float:
    return sum(float(r[key]) for r in rows) / len(rows) if rows else 0.0


def report_rows(sync_rows, async_rows, sim_sync, sim_async: Simulation, spans: list[Span]) -> list:
    """The comparison's rows: tokens/s of each schedule and their ratio, staleness, per-pool
    stage seconds per scored step (the metrics rows and simulated rows given are the scored ones,
    each simulation's times already on this host: `sim_sync` stretched, `sim_async` with its
    pools' stretch)."""
    steps = [r["step"] for r in async_rows]
    sim_steps = [r["step"] for r in sim_async.rows[-len(async_rows):]]
    m_sync, m_async = tokens_per_s(sync_rows), tokens_per_s(async_rows)
    p_sync, p_async = tokens_per_s(sim_sync), tokens_per_s(sim_async.rows[-len(async_rows):])
    out = [{"what": "sync generated tokens/s", "measured": m_sync, "simulated": p_sync},
           {"what": "async generated tokens/s", "measured": m_async, "simulated": p_async},
           {"what": "async / sync tokens/s", "measured": m_async / m_sync if m_sync else math.nan,
            "simulated": p_async / p_sync if p_sync else math.nan},
           {"what": "staleness mean", "measured": _mean(async_rows, "staleness_mean"),
            "simulated": _mean(sim_async.rows[-len(async_rows):], "staleness_mean")},
           {"what": "staleness max", "measured": float(max(r["staleness_max"] for r in async_rows)),
            "simulated": float(max(r["staleness_max"] for r in sim_async.rows[-len(async_rows):]))}]
    measured_spans = span_seconds(spans + handoff_spans(spans), steps, ("rollout", "wait_weights", "hand-off"))
    sim_spans = span_seconds(sim_async.spans, sim_steps, ("rollout", "wait_weights", "hand-off"))
    sim_rows = sim_async.rows[-len(async_rows):]
    sim_pool = {"wait_samples_s": _mean(sim_rows, "rollout_s"), "weight_push_s": _mean(sim_rows, "sync_s"),
                "train_s": sum(_mean(sim_rows, k) for k in ("experience_s", "dispatch_s", "train_s", "reshard_s"))}
    for what, key, pool in POOL_STAGES:
        if key in measured_spans:
            m, p = measured_spans[key], sim_spans[key]
        else:
            m, p = _mean(async_rows, key), sim_pool[key]
        out.append({"what": f"{pool}: {what} s/step", "measured": m, "simulated": p})
    return out


def compare_runs(config, prof: HardwareProfile, sync_dir: Path, async_dir: Path, nproc: int,
                 warmup_steps: int) -> tuple[list[dict], dict, float, tuple[float, float]]:
    """(report_rows, the async run's pools, the sync run's host stretch, the async pools'
    stretch) of a finished sync run and async run of `config` on `nproc` processes, each
    simulated on its own recorded workload."""
    sync_rows, async_rows = read_metrics(sync_dir), read_metrics(async_dir)
    cfg_sync = apply_overrides(config, {"schedule.mode": "sync"})
    cfg_async = apply_overrides(config, {"schedule.mode": "async"})
    spec, steps = model_spec_of(config), len(async_rows)
    device = device_of(config)
    stretch = host_stretch(prof, nproc, device)
    sim_sync = _simulate(cfg_sync, spec, sync_dir / "workload.jsonl", prof, len(sync_rows), nproc)
    pools = {"rollout": async_rows[0]["rollout_pool"], "train": async_rows[0]["train_pool"]}
    sim_async, ps = simulate_async_on_host(cfg_async, spec, async_dir / "workload.jsonl", prof, steps, nproc,
                                           pools, device, steps - warmup_steps)
    # the sync run on this host: every stage stretched, its ranks' rollouts sharing the cores
    on_host = [{**r, "step_time_s": (r["step_time_s"] - r["rollout_s"]) * stretch
                + rollout_on_host(r, prof, nproc, device, stretch)} for r in sim_sync]
    rows = report_rows(sync_rows[warmup_steps:], async_rows[warmup_steps:], on_host[warmup_steps:], sim_async,
                       read_chrome_trace(async_dir / "trace.json"))
    return rows, pools, stretch, ps


def run_async_validation(*, config, profile: str, steps: int = 5, warmup_steps: int = 1, out_dir: str | Path,
                         nproc: int = 2) -> AsyncValidation:
    """Run `config` under `earl run --nproc N` synchronously, then asynchronously, simulate both
    with `profile`, and write async_validation.json / .csv under `out_dir`."""
    check_async_nproc(nproc)
    if steps - warmup_steps < 2:  # the first async step has no run-ahead: score at least one more
        raise ValueError(f"--steps {steps} leaves too little to score after {warmup_steps} warm-up step(s) "
                         f"with --schedule async; use --steps >= {warmup_steps + 2}")
    base = {"steps": steps, "plots": False, "checkpoints": False}
    prof, out = load_profile(profile), check_out_dir(out_dir)
    cfg_sync = apply_overrides(config, {**base, "schedule.mode": "sync"})
    cfg_async = apply_overrides(config, {**base, "schedule.mode": "async"})
    dirs = {"sync": out / "runs" / "sync", "async": out / "runs" / "async"}
    _run_runtime(cfg_sync, dirs["sync"], nproc)
    _run_runtime(cfg_async, dirs["async"], nproc)
    rows, pools, stretch, ps = compare_runs(config, prof, dirs["sync"], dirs["async"], nproc, warmup_steps)
    res = AsyncValidation(nproc=nproc, profile=str(profile), max_staleness=cfg_async.schedule.max_staleness,
                          pools=pools, scored_steps=steps - warmup_steps, host_stretch=stretch,
                          pool_stretch=tuple(round(x, 4) for x in ps), rows=rows,
                          run_dirs={k: str(v) for k, v in dirs.items()})
    atomic_write_text(out / "async_validation.json", json.dumps(dataclasses.asdict(res), indent=1) + "\n")
    atomic_write_text(out / "async_validation.csv", "what,measured,simulated\n" + "".join(
        f"{r['what']},{r['measured']:.6g},{r['simulated']:.6g}\n" for r in rows))
    return res


def async_table(res: AsyncValidation) -> Table:
    """What `earl validate --schedule async` prints."""
    t = Table(title=f"earl validate --schedule async (cpu x{res.nproc}: rollout pool {res.pools['rollout']}, "
                    f"training pool {res.pools['train']}; max_staleness {res.max_staleness}; profile "
                    f"{Path(res.profile).stem}; {res.scored_steps} scored steps; for the shared host: sync predicted "
                    f"x{res.host_stretch:g}, async pools x{res.pool_stretch[0]:.2f} / x{res.pool_stretch[1]:.2f})")
    for col in ("", "measured", "simulated", "simulated / measured"):
        t.add_column(col, justify="left" if not col else "right")
    for r in res.rows:
        m, p = r["measured"], r["simulated"]
        t.add_row(r["what"], f"{m:.4g}", f"{p:.4g}", f"{p / m:.2f}" if m else "-")
    return t
