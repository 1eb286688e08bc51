"""`run_calibration`: measure this device within a time budget, fit the cost model's
parameters and build a version-stamped `HardwareProfile`.

The cost model prices with a profile; this is where a profile's numbers come from. Phases, each
with a share of the budget: matmul, attention, memory, collectives, overhead (whole eager
forwards), runtime (the runtime's own host costs, earl.calibrate.hostcost), dispatch
(earl.calibrate.dispatchfit) and fsdp (earl.calibrate.fsdpfit). Parameters not measured come
from the `base` profile. How each fitted number maps onto the profile: docs/calibration.md,
"Design notes".

    earl calibrate --device cpu --budget-s 60 --out /tmp/cpu.json
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBars

from earl.calibrate import bench, dispatchfit, fsdpfit, hostcost, hostload, overhead
from earl.calibrate.collectives import CPU_SIZES, CUDA_SIZES, CollectiveResult, run_collectives
from earl.calibrate.fit import (
    MIN_FIT_POINTS,
    MIN_HELD_POINTS,
    ROW_FACTOR_ROWS,
    AffineFit,
    fit_affine,
    fit_gemm,
    fit_row_factors,
)
from earl.calibrate.host import current_stamp
from earl.calibrate.linkfit import LinkFit, fit_link
from earl.calibrate.report import roofline_checks, write_measurements
from earl.calibrate.timing import resolve_device, resolve_dtype
from earl.cost_model.profile import HardwareProfile, datasheet_profile, load_profile
from earl.outputs import check_out_file
from earl.runtime.hostprobe import HostProbe, median_probe
from earl.specs import HARDWARE_CATALOG, HardwareSpec

PHASES = ("matmul", "attention", "memory", "collectives", "overhead", "runtime", "dispatch", "fsdp")
PHASE_WEIGHTS = {"matmul": 0.25, "attention": 0.20, "memory": 0.10, "collectives": 0.15, "overhead": 0.15,
                 "runtime": 0.15, "dispatch": 0.10, "fsdp": 0.10}
MIN_BUDGET_S = {"cpu": 8.0, "cuda": 20.0}
COLLECTIVE_STARTUP_S = 3.0  # spawning ranks and importing torch, not spent benchmarking

# GPU model names (torch.cuda.get_device_name) -> catalog entries
_GPU_NAMES = (("H200", "h200-sxm-141gb"), ("H100", "h100-sxm-80gb"), ("A100", "a100-sxm-80gb"))


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """What `run_calibration` produced."""

    profile: HardwareProfile  # the fitted profile (not yet written anywhere)
    fits: dict[str, AffineFit]  # matmul / attention / memory fits
    link: LinkFit | None  # collective fit (None when not measured)
    checks: dict[str, dict] = field(default_factory=dict)  # roofline error per kind, see report
    measurements: list[bench.Measurement] = field(default_factory=list)
    collectives: CollectiveResult | None = None
    overhead: overhead.OverheadFit | None = None  # effective per-operator cost of real forwards
    engine: overhead.EngineFit | None = None  # generation-engine cost per iteration beyond the forward
    host: hostcost.HostCostFit | None = None  # host costs of the runtime's stage code (phase runtime)
    wall_s: float = 0.0  # seconds the calibration took


class Progress:
    """Progress sink: the CLI passes a rich-backed subclass; the default is silent."""

    def phase(self, name: str, total: int) -> None:
        """A phase of `total` steps begins."""

    def step(self, name: str, label: str) -> None:
        """One step of phase `name` finished (or was skipped for lack of budget)."""


def base_hardware(device: torch.device) -> HardwareSpec:
    """The catalog entry for this device (CPU: 'cpu'; a known GPU: its datasheet; an unknown
    GPU: H100 numbers with this card's memory, to be replaced by measured peaks)."""
    if device.type == "cpu":
        return HARDWARE_CATALOG["cpu"]
    name = torch.cuda.get_device_name(device)
    for key, entry in _GPU_NAMES:
        if key in name:
            return HARDWARE_CATALOG[entry]
    total = torch.cuda.get_device_properties(device).total_memory
    slug = "cuda-" + "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return dataclasses.replace(HARDWARE_CATALOG["h100-sxm-80gb"], name=slug, hbm_bytes=float(total))


def parse_phases(text: str) -> tuple[str, ...]:
    if text.strip() == "all":
        return PHASES
    got = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in got if p not in PHASES]
    if bad or not got:
        raise ValueError(f"unknown calibration phase {bad[0] if bad else text!r}; valid: all, "
                         f"{', '.join(PHASES)}")
    return got


def _fit_kind(ms: list[bench.Measurement], kind: str, overhead_s: float,
              memory_s=None) -> tuple[AffineFit | None, float, dict[str, float]]:
    """(fit, gemm_rows_half, gemm_row_factors) of one kind's points, less the operator overhead
    the cost model adds itself, under the memory roofline `memory_s(bytes)` (None: no floor);
    GEMMs that carry their row counts get the row penalty fitted too (`fit_gemm`, on the points
    of other row counts than ROW_FACTOR_ROWS) and those row counts' factors
    (`fit_row_factors`), others 0 and none. (None, 0, {}) when nothing was measured."""
    pts = [m for m in ms if m.kind == kind]
    if not pts:
        return None, 0.0, {}
    times = [max(m.time_s - overhead_s, 0.1 * m.time_s) for m in pts]
    floor = [memory_s(m.bytes) for m in pts] if memory_s else None
    if kind == "matmul" and memory_s and all(m.rows > 0 for m in pts):
        main = [i for i, m in enumerate(pts) if m.rows not in ROW_FACTOR_ROWS]
        apart = len(main) >= MIN_FIT_POINTS + MIN_HELD_POINTS
        if not apart:  # a short budget: one smooth fit of all the points, no factors
            main = list(range(len(pts)))
        fit, half = fit_gemm([pts[i].flops for i in main], [pts[i].rows for i in main], [times[i] for i in main],
                             floor_s=[floor[i] for i in main])
        factors = fit_row_factors(fit, half, [m.flops for m in pts], [m.rows for m in pts], times, floor) \
            if apart else {}
        return fit, half, factors
    return fit_affine([m.flops if memory_s else m.size for m in pts], times, floor_s=floor,
                      what=f"{kind} fit"), 0.0, {}


def run_calibration(*, device: str = "cpu", budget_s: float = 90.0, phases: tuple[str, ...] = PHASES,
                    dtype: str = "auto", threads: int = 0, base: str | None = None,
                    seed: int = 0, progress: Progress | None = None) -> CalibrationResult:
    """Measure, fit and return a profile. `threads` 0: one per rank on CPU (a CPU "device" is
    one core, as in the runtime's gloo ranks)."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    for p in phases:
        if p not in PHASES:
            raise ValueError(f"unknown calibration phase {p!r}; valid: {', '.join(PHASES)}")
    if not budget_s >= MIN_BUDGET_S[dev.type]:
        raise ValueError(f"--budget-s {budget_s:g} is too small to fit anything on {dev.type}; "
                         f"need at least {MIN_BUDGET_S[dev.type]:g} s")
    if threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: automatic), got {threads}")
    base_prof = load_profile(base) if base else datasheet_profile(base_hardware(dev))
    progress = progress or Progress()
    t_start = time.perf_counter()
    prev_threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(threads or 1)
    try:
        return _calibrate(dev, dt, budget_s, phases, base_prof, seed, progress, t_start)
    finally:
        torch.set_num_threads(prev_threads)


# the phases run in this process, whose constants price rollout, experience and one-process
# training; the gloo phases read the probe on their own ranks (fsdpfit, dispatchfit)
ONE_PROCESS_PHASES = ("matmul", "attention", "memory", "overhead", "runtime")


class _Probing(Progress):
    """Passes progress on and reads the host probe at each step of a one-process phase: the
    host's speed while those constants were measured, sampled as often as their cases run
    (HardwareProfile.host_probe_s)."""

    def __init__(self, inner: Progress, probe: HostProbe):
        self.inner, self.probe, self.readings = inner, probe, {}

    def phase(self, name: str, total: int) -> None:
        self.inner.phase(name, total)

    def step(self, name: str, label: str) -> None:
        if name in ONE_PROCESS_PHASES:
            self.readings.setdefault(name, []).append(round(self.probe.time(), 9))
        self.inner.step(name, label)


def _calibrate(dev, dt, budget_s, phases, base_prof, seed, progress, t_start) -> CalibrationResult:
    probing = _Probing(progress, HostProbe()) if dev.type == "cpu" else None
    res = _calibrate_phases(dev, dt, budget_s, phases, base_prof, seed, probing or progress, t_start)
    if probing is None:
        return res
    prof = res.profile
    alone = median_probe(r for v in probing.readings.values() for r in v)
    # per process count, the gloo phases' readings (each phase's median at that count)
    gloo = [prof.fit_quality.get(ph, {}).get("probe_s", {}) for ph in ("fsdp", "dispatch_path")]
    ranks = {n: median_probe(g.get(n) for g in gloo) for n in sorted({n for g in gloo for n in g}, key=int)}
    quality = {"by_phase": probing.readings, "ranks_by_phase": dict(zip(("fsdp", "dispatch"), gloo, strict=True))}
    return dataclasses.replace(res, profile=dataclasses.replace(
        prof, host_probe_s=round(alone or 0.0, 9),
        host_probe_ranks_s={n: round(v, 9) for n, v in ranks.items() if v},
        fit_quality={**prof.fit_quality, "host_probe": quality}))


def _calibrate_phases(dev, dt, budget_s, phases, base_prof, seed, progress, t_start) -> CalibrationResult:
    weights = {p: PHASE_WEIGHTS[p] for p in phases}
    total_w = sum(weights.values())
    share = {p: budget_s * w / total_w for p, w in weights.items()}
    # the share of a core the one-process phases got (earl.calibrate.hostload), for the record
    # only: their timed windows (medians of calls shorter than a scheduler slice) run as on a
    # dedicated core, loaded or not, so their constants are a dedicated core's (host_share 1);
    # the multi-process phases measure their own share and fit dedicated constants with it
    load = hostload.CpuShare(procs=torch.get_num_threads() if dev.type == "cpu" else 1)
    with load:
        res = _one_process_phases(dev, dt, phases, share, base_prof, seed, progress, t_start, load)
    if dev.type == "cpu":
        stamp = {**res.profile.stamp, "cpu_share": round(load.share(), 4)}
        res = dataclasses.replace(res, profile=dataclasses.replace(res.profile, stamp=stamp))
    if dev.type == "cpu" and "runtime" in phases:  # the runtime's ranks compute at once on this host
        # 25 short pairs (~3 s on 2 cores) in a full calibration, five in a quick one
        corun = hostload.corun_slowdown(repeats=25 if budget_s >= 30 else 5)
        res = dataclasses.replace(res, profile=dataclasses.replace(
            res.profile, corun_slowdown=round(corun["corun_slowdown"], 4),
            fit_quality={**res.profile.fit_quality, "corun": corun}))
    if "dispatch" in phases:
        res = _fit_dispatch_path(res, share["dispatch"], progress)
    if "fsdp" in phases:
        res = _fit_fsdp(res, dev, share["fsdp"], progress)
    wall = time.perf_counter() - t_start
    stamp = {**res.profile.stamp, "wall_s": round(wall, 1)}
    return dataclasses.replace(res, profile=dataclasses.replace(res.profile, stamp=stamp), wall_s=wall)


def _one_process_phases(dev, dt, phases, share, base_prof, seed, progress, t_start,
                        load: hostload.CpuShare) -> CalibrationResult:
    """Phases matmul, attention, memory, collectives, overhead and runtime."""
    plan = bench.CPU_PLAN if dev.type == "cpu" else bench.CUDA_PLAN
    esize = torch.empty((), dtype=dt).element_size()
    overhead_s = bench.measure_op_overhead(dev)
    measurements: list[bench.Measurement] = []
    attn = bench.attention_cases(plan, esize)
    groups = {  # phase -> [(cases in coarse-to-fine order, share of the phase's budget)]
        "matmul": [(bench.coarse_to_fine(bench.matmul_cases(plan, esize), key=lambda c: c.flops), 1.0)],
        "attention": [
            (bench.coarse_to_fine([c for c in attn if c.kind == "attention"], key=lambda c: c.flops), 0.5),
            (bench.coarse_to_fine([c for c in attn if c.kind == "attention_decode"], key=lambda c: c.bytes), 0.5)],
        "memory": [(bench.coarse_to_fine(bench.memory_cases(plan), key=lambda c: c.bytes), 1.0)],
    }
    for phase in (p for p in ("matmul", "attention", "memory") if p in phases):
        progress.phase(phase, sum(len(cases) for cases, _ in groups[phase]))
        for cases, frac in groups[phase]:
            measurements += bench.run_cases(
                cases, device=dev, dtype=dt, budget_s=share[phase] * frac, seed=seed,
                on_case=lambda m, ph=phase: progress.step(ph, m.label if m else "skipped"))
    coll = None
    if "collectives" in phases:
        with load.paused():  # its ranks' load is not the one-process probes'
            coll = _run_collectives(dev, share["collectives"], progress)
    res = _build_profile(dev, dt, base_prof, overhead_s, measurements, coll, time.perf_counter() - t_start)
    if "overhead" in phases:
        res = _fit_forward_overhead(res, dev, dt, share["overhead"], progress)
    elif "overhead" in base_prof.stamp.get("measured", ()):  # the base's effective cost, not the bare one
        res = dataclasses.replace(res, profile=dataclasses.replace(res.profile, op_overhead_s=base_prof.op_overhead_s))
    if "runtime" in phases:
        res = _fit_host_costs(res, dev, dt, share["runtime"], progress)
    return res


def _fit_forward_overhead(res: CalibrationResult, dev, dt, budget_s: float,
                          progress: Progress) -> CalibrationResult:
    """Replace the bare per-operator cost by the effective one of real eager forwards."""
    progress.phase("overhead", overhead.cases_count(dev) + 1)
    points = overhead.measure_forward_points(
        device=dev, dtype=dt, prof=res.profile, budget_s=budget_s,
        on_case=lambda p: progress.step("overhead", p.label if p else "skipped"))
    fit = overhead.fit_overhead(points, floor_s=res.profile.op_overhead_s)
    prof = dataclasses.replace(res.profile, op_overhead_s=fit.op_overhead_s,
                               elementwise=fit.elementwise_curve(res.profile.memory))
    engine = overhead.measure_engine(device=dev, dtype=dt, prof=prof)
    progress.step("overhead", "engine")
    quality = {**res.profile.fit_quality, "step_overhead": engine.quality(),
               "op_overhead": {**fit.quality(), "bare_op_s": res.profile.op_overhead_s}}
    stamp = {**res.profile.stamp, "measured": sorted([*res.profile.stamp["measured"], "overhead"])}
    prof = dataclasses.replace(prof, **engine.profile_fields(), fit_quality=quality, stamp=stamp)
    return dataclasses.replace(res, profile=prof, overhead=fit, engine=engine)


def _fit_host_costs(res: CalibrationResult, dev, dt, budget_s: float, progress: Progress) -> CalibrationResult:
    """Host-side costs of the runtime's own stage code (earl.calibrate.hostcost), priced on
    top of the profile measured so far (best after the overhead phase)."""
    progress.phase("runtime", hostcost.cases_count(dev))
    fit = hostcost.measure_host_costs(device=dev, dtype=dt, prof=res.profile, budget_s=budget_s,
                                      on_case=lambda label: progress.step("runtime", label))
    stamp = {**res.profile.stamp, "measured": sorted([*res.profile.stamp["measured"], "runtime"])}
    prof = dataclasses.replace(res.profile, **fit.profile_fields(), stamp=stamp,
                               fit_quality={**res.profile.fit_quality, "host_costs": fit.quality()})
    return dataclasses.replace(res, profile=prof, host=fit)


def _fit_dispatch_path(res: CalibrationResult, budget_s: float, progress: Progress) -> CalibrationResult:
    """The dispatch path (earl.calibrate.dispatchfit): the runtime's dispatch executor on 2 and
    4 local gloo processes (CPU tensors, whatever the device), fitted through the one dispatch
    price on the links measured so far."""

    progress.phase("dispatch", 1)
    prof = dispatchfit.calibrate_dispatch(res.profile, budget_s)
    progress.step("dispatch", "gloo runs")
    stamp = {**prof.stamp, "measured": sorted([*prof.stamp["measured"], "dispatch"])}
    return dataclasses.replace(res, profile=dataclasses.replace(prof, stamp=stamp))


def _fit_fsdp(res: CalibrationResult, dev, budget_s: float, progress: Progress) -> CalibrationResult:
    """The multi-process runtime's FSDP2 host costs (earl.calibrate.fsdpfit): its training step
    and weight sync on 2 and 4 local gloo ranks, fitted on the profile measured so far. CPU
    only (on CUDA the ranks would run NCCL, one GPU each); elsewhere the terms stay 0."""

    progress.phase("fsdp", 1)
    if dev.type != "cpu":
        progress.step("fsdp", "skipped: gloo ranks on the CPU only")
        return res
    prof = fsdpfit.calibrate_fsdp(res.profile, budget_s)
    progress.step("fsdp", "gloo runs")
    stamp = {**prof.stamp, "measured": sorted([*prof.stamp["measured"], "fsdp"])}
    return dataclasses.replace(res, profile=dataclasses.replace(prof, stamp=stamp))


def _run_collectives(dev: torch.device, share_s: float, progress: Progress) -> CollectiveResult | None:
    progress.phase("collectives", 1)
    if dev.type == "cuda":
        world = min(torch.cuda.device_count(), 8)
        if world < 2:  # NCCL needs one GPU per rank
            progress.step("collectives", "skipped: one GPU")
            return None
        res = run_collectives(backend="nccl", world=world, sizes=CUDA_SIZES,
                              budget_s=max(1.0, share_s - COLLECTIVE_STARTUP_S))
    else:
        res = run_collectives(backend="gloo", world=2, sizes=CPU_SIZES,
                              budget_s=max(1.0, share_s - COLLECTIVE_STARTUP_S))
    progress.step("collectives", f"{res.backend} x{res.world}")
    return res


def _build_profile(dev, dt, base_prof: HardwareProfile, overhead_s: float,
                   ms: list[bench.Measurement], coll: CollectiveResult | None,
                   wall_s: float) -> CalibrationResult:
    hw = base_prof.hardware
    fits: dict[str, AffineFit] = {}
    # 1. memory first: it is the floor under every compute fit
    mem_fit, _, _ = _fit_kind(ms, "memory", overhead_s)
    mem_curve = base_prof.memory
    if mem_fit:
        fits["memory"] = mem_fit
        if dev.type == "cpu" or mem_fit.rate > 1.5 * hw.hbm_bw_bytes_s:  # no datasheet / beyond it
            hw = dataclasses.replace(hw, hbm_bw_bytes_s=mem_fit.rate)
        mem_curve = mem_fit.to_curve(hw.hbm_bw_bytes_s)

    def memory_s(nbytes: float) -> float:
        return nbytes / (hw.hbm_bw_bytes_s * mem_curve(nbytes)) if nbytes > 0 else 0.0

    # 2. compute curves under that floor (decode attention gets its own curve)
    rows_half = 0.0  # no GEMMs measured (or no row counts): the base's law, as before
    row_factors: dict[str, float] = {}
    for kind in ("matmul", "attention", "attention_decode"):
        f, half, factors = _fit_kind(ms, kind, overhead_s, memory_s)
        if f:
            fits[kind] = f
            rows_half, row_factors = (half, factors) if kind == "matmul" else (rows_half, row_factors)
    # only the compute-bound kinds identify the peak: decode attention is memory-bound, and its
    # time barely moves with FLOPs, so its fitted rate can run off to absurd values (seen on an
    # H200: 3.5e19 FLOP/s); a rate beyond 1.5x the peak is capped at the peak below
    rates = [fits[k].rate for k in ("matmul", "attention") if k in fits]
    if dev.type == "cpu" and "matmul" in fits:  # no datasheet: the GEMM asymptote is the peak
        hw = dataclasses.replace(hw, peak_flops=fits["matmul"].rate)
    if rates and max(rates) > 1.5 * hw.peak_flops:  # faster than its datasheet entry
        hw = dataclasses.replace(hw, peak_flops=max(rates))
    for kind, f in list(fits.items()):
        if kind != "memory" and f.rate > 1.5 * hw.peak_flops:  # a runaway slope, not a measurement
            fits[kind] = dataclasses.replace(f, rate=hw.peak_flops)
    # 3. links
    link = fit_link(coll) if coll else None
    if link:
        hw = dataclasses.replace(hw, intra_bw_bytes_s=link.link.bw_bytes_s,
                                 intra_latency_s=max(link.link.alpha_s, 1e-9))
    backends = Counter(m.backend for m in ms if m.kind == "attention" and m.backend)
    backend = backends.most_common(1)[0][0] if backends else base_prof.stamp.get("attention", "unknown")
    stamp = current_stamp(dev.type, backend)
    stamp.update({
        "dtype": str(dt).replace("torch.", ""),
        "threads": torch.get_num_threads() if dev.type == "cpu" else 0,
        "measured": sorted({*fits, *(("collectives",) if link else ())}),
        "base": base_prof.stamp.get("source", "datasheet") + ":" + base_prof.name,
        "collectives": f"{coll.backend} x{coll.world}" if coll else "not measured",
        "wall_s": round(wall_s, 1),
    })
    if dev.type == "cpu" and hasattr(os, "getloadavg"):  # how shared the machine was
        stamp["load_avg_1m"] = round(os.getloadavg()[0], 2)
    quality = {k: f.quality() for k, f in fits.items()}
    if "matmul" in quality:
        quality["matmul"]["rows_half"] = rows_half
        quality["matmul"]["row_factors"] = row_factors
    if link:
        quality["links"] = link.quality()

    def curve(kind: str, fallback):
        return fits[kind].to_curve(hw.peak_flops) if kind in fits else fallback

    # what this run measures replaces the base's; the rest (host costs of phases not run, the
    # dispatch path, the FSDP2 constants) is the base's, as `--base` promises. The GEMM p-norm
    # belongs to the datasheet curves: fitted curves take max(compute, memory)
    prof = dataclasses.replace(
        base_prof,
        hardware=hw,
        matmul=curve("matmul", base_prof.matmul),
        attention=curve("attention", base_prof.attention),
        attention_decode=curve("attention_decode", base_prof.attention_decode),
        memory=mem_curve,
        intra=link.link if link else base_prof.intra,
        collective_links=link.collective_links if link else dict(base_prof.collective_links),
        op_overhead_s=overhead_s,
        gemm_norm=None,
        gemm_rows_half=rows_half if "matmul" in fits else base_prof.gemm_rows_half,
        gemm_row_factors=row_factors if "matmul" in fits else dict(base_prof.gemm_row_factors),
        stamp=stamp,
        fit_quality={**base_prof.fit_quality, **quality},
    )
    checks = roofline_checks(prof, ms)
    prof = dataclasses.replace(prof, fit_quality={**quality, "roofline": checks})
    return CalibrationResult(profile=prof, fits=fits, link=link, checks=checks, measurements=ms,
                             collectives=coll, wall_s=wall_s)


def default_out(device: str) -> str:
    return os.path.join(os.getcwd(), f"earl-profile-{device}.json")


class RichProgress(Progress):
    """One rich progress bar per phase (what `earl calibrate` shows on stderr)."""

    def __init__(self, rich_progress):
        self.p, self.tasks = rich_progress, {}

    def phase(self, name, total):
        self.tasks[name] = self.p.add_task(name, total=total, label="")

    def step(self, name, label):
        self.p.update(self.tasks[name], advance=1, label=label)


def calibrate_to_file(*, device: str = "cpu", budget_s: float = 90.0, out: str | None = None,
                      phases: str = "all", dtype: str = "auto", threads: int = 0, base: str | None = None,
                      seed: int = 0, measurements: str | None = None, console=None,
                      force: bool = False) -> tuple[CalibrationResult, str]:
    """`earl calibrate`: measure, fit, save the profile to `out` (default ./earl-profile-<device>.json)
    and the raw points to `measurements` if given; progress bars on the rich `console`."""


    chosen = parse_phases(phases)
    out_path = out or default_out(device)
    if not out_path.endswith(".json"):
        raise ValueError(f"--out {out_path!r} must name a .json file")

    check_out_file(out_path, force=force)  # before measuring: nothing replaced unless --force
    if measurements:
        check_out_file(measurements, flag="--measurements", force=force)
    columns = (TextColumn("{task.description:12s}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[label]}"))
    with RichBars(*columns, console=console, transient=False) as rp:
        res = run_calibration(device=device, budget_s=budget_s, phases=chosen, dtype=dtype,
                              threads=threads, base=base, seed=seed, progress=RichProgress(rp))
    res.profile.save(out_path)
    if measurements:
        write_measurements(res, measurements)
    return res, out_path
