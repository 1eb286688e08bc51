"""`earl validate`: run the runtime for a few steps, simulate the same config on its recorded
workload trace with a calibrated profile (and with the datasheet profile, for contrast), and
report predicted vs. measured time per stage, peak memory, and whether the simulator ranks
several config variants in the measured order (Kendall tau).

The runtime here is the single-process one (`earl run` without --nproc): one CPU core or one
GPU, so every plan is tp1-dp1 and dispatch is local. The simulator replays step k of the trace
as its step k-1 with the same selector, dispatcher, engine batch and log-prob passes; the first
`warmup_steps` steps (allocator, lazy init) are reported but not scored. The simulator models
this runtime's own mechanics: its engine plays turns in lockstep over padded rows
(`Simulation(engine="turn-sync")`), its micro-batches are right-padded and packed up to the
config's token budget, and a calibrated profile adds the host costs of its code (see
earl.calibrate.hostcost). On a CPU shared with other processes a stage's wall time also holds
their time slices, which a simulated dedicated device does not: each stage is therefore also
scored against the CPU time it got (wall x its step's CPU share, from the runtime's
step_cpu_s / step_s). That estimate holds for stages longer than a scheduler slice; a
sub-millisecond stage (dispatch) usually runs unpreempted, and its wall-time error is the one
to read.

    earl validate --steps 4 --hardware earl/cost_model/profiles/cpu-measured.json --out /tmp/val
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from earl.config import parse_sets
from earl.cost_model import CostModel
from earl.cost_model.profile import HardwareProfile, check_stamp, datasheet_profile, load_profile
from earl.specs import MODEL_CATALOG, ClusterSpec, ModelSpec
from earl.trace import atomic_write_text

STAGES = ("rollout", "experience", "dispatch", "train", "reshard")
MEASURED_KEYS = {"rollout": "rollout_s", "experience": "experience_s", "dispatch": "dispatch_s",
                 "train": "train_s", "reshard": None}  # one process never re-shards
DTYPE_NAMES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """One config variant: measured per-step stage times and both predictions."""

    name: str  # e.g. "base" or "engine_batch=4"
    overrides: dict  # config overrides of this variant
    measured: list[dict]  # per scored step: stage -> seconds
    predicted: list[dict]  # same, calibrated profile
    datasheet: list[dict]  # same, datasheet profile
    peak_mem_measured: float  # bytes (CUDA: max_memory_allocated; CPU: process RSS)
    peak_mem_predicted: float  # bytes allocated at the predicted peak (reserve excluded)
    run_dir: str  # where the runtime wrote its outputs
    # per scored step: the process's CPU seconds / wall seconds (the runtime's step_cpu_s /
    # step_s; CPU device with one thread only, else 1): on a shared host other processes take
    # the rest, which the simulator (a dedicated device) does not model
    cpu_share: list[float] = field(default_factory=list)

    def measured_cpu(self) -> list[dict]:
        """Measured stage times scaled by their step's CPU share: the seconds of CPU they got."""
        shares = self.cpu_share or [1.0] * len(self.measured)
        return [{k: v * f for k, v in r.items()} for r, f in zip(self.measured, shares, strict=True)]

    def total(self, which: str) -> float:
        rows = getattr(self, which)
        return sum(sum(r.values()) for r in rows)


@dataclass(frozen=True, kw_only=True)
class ValidationResult:
    variants: list[VariantResult]
    profile: str  # calibrated profile used
    datasheet: str  # datasheet profile used for contrast
    device: str  # cpu | cuda
    memory_comparable: bool  # CUDA: allocator peak vs. prediction; CPU RSS is not comparable
    table: list[dict] = field(default_factory=list)  # per-stage errors (see stage_table)
    kendall_tau: float | None = None  # calibrated prediction vs measurement over variants
    kendall_tau_datasheet: float | None = None


def _rel(p: float, m: float) -> float:
    return abs(p - m) / m if m > 0 else (0.0 if p == 0 else math.inf)


def stage_table(variants: list[VariantResult]) -> list[dict]:
    """Per stage: summed measured / predicted seconds and the median per-step relative error,
    against the wall time and against the CPU time the stage got (wall x its step's CPU share)."""
    out = []
    for stage in STAGES:
        m = [r[stage] for v in variants for r in v.measured]
        mc = [r[stage] for v in variants for r in v.measured_cpu()]
        p = [r[stage] for v in variants for r in v.predicted]
        d = [r[stage] for v in variants for r in v.datasheet]
        if not any(m) and not any(p) and not any(d):
            continue
        out.append({"stage": stage, "measured_s": sum(m), "predicted_s": sum(p), "datasheet_s": sum(d),
                    "median_err": float(np.median([_rel(a, b) for a, b in zip(p, m, strict=True)])),
                    "measured_cpu_s": sum(mc),
                    "cpu_median_err": float(np.median([_rel(a, b) for a, b in zip(p, mc, strict=True)])),
                    "datasheet_median_err": float(np.median([_rel(a, b) for a, b in zip(d, m, strict=True)]))})
    return out


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(a, b).statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def random_checkpoint(name: str, directory: Path, dtype: str, device: str = "cpu") -> Path:
    """A random-initialised HF checkpoint of a catalog model's shapes (no weights downloaded),
    with the runtime's built-in tokenizer, so the runtime can load a real-size model. The
    weights are initialised on `device` (a GPU does a 1.5B model in a second)."""
    import torch
    from transformers import AutoModelForCausalLM

    from earl.runtime.hf_model import TORCH_DTYPES, Policy, hf_config_from_spec, save_hf
    from earl.runtime.tokenizer import CharTokenizer

    if (directory / "config.json").is_file():
        return directory
    spec = MODEL_CATALOG[name]
    cfg = hf_config_from_spec(spec, dtype)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=TORCH_DTYPES[dtype])
    save_hf(Policy(model=model, tokenizer=CharTokenizer(), spec=spec, source=name), directory)
    return directory


def _simulate(cfg, spec: ModelSpec, trace: Path, prof: HardwareProfile, steps: int) -> list[dict]:
    from earl.sim.scenario import Scenario
    from earl.sim.simulation import Simulation
    from earl.sim.workload import WorkloadSpec, load_trace

    cm = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), prof)
    episodes = cfg.episodes_per_step
    # the runtime packs sequences into micro-batches of token_budget padded tokens: so does the plan
    longest = max(sum(o + g for o, g, _ in turns) for line in load_trace(trace) for turns in line)
    mb = max(1, min(episodes, cfg.trainer.token_budget // max(1, longest)))
    sc = Scenario(name="validate", steps=steps, model=spec.name if spec.name in MODEL_CATALOG else "tiny",
                  hardware="cpu", nodes=1, gpus_per_node=1,
                  workload=WorkloadSpec(episodes_per_step=episodes, trace=str(trace),
                                        max_context=cfg.sampling.max_context),
                  rollout_plan="tp1-dp1", experience_plan=f"tp1-dp1-mb{mb}", train_plan=f"tp1-dp1-mb{mb}",
                  selector=cfg.policy.selector, dispatcher=cfg.policy.dispatcher,
                  max_num_seqs=cfg.engine_batch or episodes,
                  logprob_passes=2 if cfg.trainer.kl_coef else 1)
    # the PyTorch runtime's engine plays turns in lockstep; its micro-batches are padded
    engine = "turn-sync" if cfg.engine == "pytorch" else "continuous"
    sim = Simulation(sc, cfg.policy.selector, cfg.policy.dispatcher, cost_model=cm, engine=engine, padded=True,
                     token_budget=cfg.trainer.token_budget, head_on="generated").run()
    return sim.rows


def _predicted_peak(rows: list[dict], cm_capacity: float, reserve: float) -> float:
    used = [(1 - r[k]) * cm_capacity - reserve for r in rows
            for k in ("headroom_experience", "headroom_train") if r.get(k) is not None]
    return max(used, default=0.0)


def run_variant(cfg, name: str, overrides: dict, out_dir: Path, prof: HardwareProfile,
                sheet: HardwareProfile, warmup_steps: int) -> VariantResult:
    from earl.runtime.run import train

    run_dir = out_dir / "runs" / name.replace("=", "-").replace(",", "_")
    if str(cfg.model.device).startswith("cuda"):
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()  # each variant's own peak
    res = train(cfg, run_dir, progress=False, echo=lambda *_: None)
    rows = res.metrics
    spec = MODEL_CATALOG[cfg.model.path] if cfg.model.path in MODEL_CATALOG else \
        ModelSpec.from_hf_config(cfg.model.path)
    spec = dataclasses.replace(spec, dtype=DTYPE_NAMES[cfg.model.dtype])
    trace = run_dir / "workload.jsonl"

    def stage_rows(sim_rows: list[dict] | None) -> list[dict]:
        out = []
        for i, r in enumerate(rows):
            if i < warmup_steps:
                continue
            if sim_rows is None:
                out.append({s: float(r[k]) if k else 0.0 for s, k in MEASURED_KEYS.items()})
            else:
                sr = sim_rows[i]
                out.append({s: float(sr[f"{s}_s"]) + (float(sr["sync_s"]) if s == "reshard" else 0.0)
                            for s in STAGES})
        return out

    sim_cal = _simulate(cfg, spec, trace, prof, len(rows))
    sim_sheet = _simulate(cfg, spec, trace, sheet, len(rows))
    cm = CostModel(spec, ClusterSpec.for_gpus(prof.hardware, 1), prof)
    one_core = not str(cfg.model.device).startswith("cuda") and cfg.threads == 1
    share = [min(1.0, r["step_cpu_s"] / r["step_s"]) if one_core and r.get("step_s") else 1.0
             for r in rows[warmup_steps:]]
    return VariantResult(name=name, overrides=overrides, measured=stage_rows(None), cpu_share=share,
                         predicted=stage_rows(sim_cal), datasheet=stage_rows(sim_sheet),
                         peak_mem_measured=float(max(r["peak_mem_bytes"] for r in rows)),
                         peak_mem_predicted=_predicted_peak(sim_cal, cm.capacity, cm.reserve),
                         run_dir=str(run_dir))


def parse_variants(text: str | None) -> list[tuple[str, dict]]:
    """`"engine_batch=4;engine_batch=16,reuse_kv=false"` -> named override sets; None: one."""
    if not text:
        return [("base", {})]
    out = []
    for part in (p.strip() for p in text.split(";") if p.strip()):
        out.append((part, parse_sets(part.split(","), flag="--variants")))
    return out


def validation_config(config_file: str | None = None, sets: dict | None = None, *, device: str | None = None,
                      dtype: str | None = None):
    """`earl validate`'s run config: the file (or the default), `--set`s, then `--device` (cuda
    defaults the dtype to bf16) and `--dtype`; a cuda device must be present."""
    from earl.runtime.run import resolve_config

    overrides = dict(sets or {})
    if device is not None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}; valid: cpu, cuda")
        overrides["model.device"] = device
        if device == "cuda" and dtype is None:
            dtype = "bf16"
    if dtype is not None:
        overrides["model.dtype"] = dtype
    cfg = resolve_config(config_file, overrides=overrides)
    if str(cfg.model.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' is not available here; use --device cpu")
    return cfg


def run_validation(*, config, profile: str, steps: int = 4, warmup_steps: int = 1,
                   variants: list[tuple[str, dict]] | None = None, out_dir: str | Path,
                   model: str | None = None, progress=None) -> ValidationResult:
    """Run each variant of `config` on the runtime and the simulator; write the report.
    `model`: a runtime model (built-in name or checkpoint dir) or any catalog name, for which
    a random-initialised checkpoint of that shape is written under `out_dir/model`."""
    from earl.runtime.config import apply_overrides
    from earl.runtime.hf_model import BUILTIN_MODELS

    if steps < warmup_steps + 1:
        raise ValueError(f"--steps {steps} leaves nothing to score after {warmup_steps} warm-up "
                         f"step(s); use --steps >= {warmup_steps + 1}")
    from earl.outputs import check_out_dir

    out = check_out_dir(out_dir)
    prof = load_profile(profile)
    for _, ov in variants or []:
        apply_overrides(config, ov, where="--variants")  # a typo in a variant fails before anything runs
    if model and model.lower() in MODEL_CATALOG and model.lower() not in BUILTIN_MODELS:
        from earl.runtime.resources import check_resources

        check_resources(config, MODEL_CATALOG[model.lower()], 1)  # before writing a random checkpoint
        model = str(random_checkpoint(model.lower(), out / "model", config.model.dtype,
                                      str(config.model.device)))
    if model:
        config = apply_overrides(config, {"model.path": model})
    device = "cuda" if str(config.model.device).startswith("cuda") else "cpu"
    from earl.calibrate.runner import current_stamp

    check_stamp(prof, current_stamp(device))  # a mismatch warns; it never silently guesses
    if device == "cpu" and prof.stamp.get("threads") and config.threads != prof.stamp["threads"]:
        # the profile describes one rank with this many threads; the runtime must match it
        config = apply_overrides(config, {"threads": prof.stamp["threads"]})
    sheet_name = prof.hardware.name if prof.hardware.name in ("cpu", "a100-sxm-80gb", "h100-sxm-80gb",
                                                              "h200-sxm-141gb") else "h100-sxm-80gb"
    from earl.specs import HARDWARE_CATALOG

    sheet = datasheet_profile(HARDWARE_CATALOG[sheet_name])
    results = []
    for name, ov in variants or [("base", {})]:
        # throwaway runs: no checkpoints (a 1.5B model's fp32 masters and Adam states are ~20 GB each)
        cfg = apply_overrides(config, {**ov, "steps": steps, "plots": False, "checkpoints": False})
        results.append(run_variant(cfg, name, ov, out, prof, sheet, warmup_steps))
        if progress:
            progress(name)
    meas = [v.total("measured") for v in results]
    res = ValidationResult(
        variants=results, profile=str(profile), datasheet=sheet_name, device=device,
        memory_comparable=device == "cuda", table=stage_table(results),
        kendall_tau=kendall_tau(meas, [v.total("predicted") for v in results]),
        kendall_tau_datasheet=kendall_tau(meas, [v.total("datasheet") for v in results]))
    write_report(res, out)
    return res


def validation_table(res: ValidationResult, hardware: str, scored_steps: int):
    """Predicted vs measured time per stage and peak memory per variant (what the CLI prints)."""
    from rich.table import Table

    t = Table(title=f"earl validate ({res.device}, profile {hardware}, {len(res.variants)} variant(s), "
                    f"{scored_steps} scored step(s) each)")
    for col in ("stage", "measured s", "predicted s", "median err", f"datasheet ({res.datasheet}) s",
                "datasheet err", "err vs CPU time"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for r in res.table:  # last column: measured x the step's CPU share (other processes excluded)
        t.add_row(r["stage"], f"{r['measured_s']:.4f}", f"{r['predicted_s']:.4f}", f"{r['median_err']:.1%}",
                  f"{r['datasheet_s']:.4f}", f"{r['datasheet_median_err']:.1%}", f"{r['cpu_median_err']:.1%}")
    for v in res.variants:
        err = abs(v.peak_mem_predicted - v.peak_mem_measured) / v.peak_mem_measured
        what = f"peak memory, {v.name}" + ("" if res.memory_comparable else " (CPU RSS: not comparable)")
        t.add_row(what, f"{v.peak_mem_measured / 2**30:.3f} GiB",
                  f"{v.peak_mem_predicted / 2**30:.3f} GiB", f"{err:.1%}" if res.memory_comparable else "-",
                  "", "", "")
    return t


def ranking_line(res: ValidationResult) -> str | None:
    """The Kendall tau of the variants' ranking, when there are several variants."""
    if len(res.variants) < 2:
        return None
    fmt = lambda x: "n/a" if x is None else f"{x:+.2f}"  # noqa: E731
    return (f"Kendall tau of the variants' total time, predicted vs measured: calibrated "
            f"{fmt(res.kendall_tau)}, datasheet {fmt(res.kendall_tau_datasheet)}")


def to_dict(res: ValidationResult) -> dict:
    return {"profile": res.profile, "datasheet": res.datasheet, "device": res.device,
            "stages": res.table, "kendall_tau": res.kendall_tau,
            "kendall_tau_datasheet": res.kendall_tau_datasheet,
            "memory_comparable": res.memory_comparable,
            "variants": [dataclasses.asdict(v) for v in res.variants]}


def write_report(res: ValidationResult, out: Path) -> None:
    atomic_write_text(out / "validation.json", json.dumps(to_dict(res), indent=1) + "\n")
    lines = ["variant,step,stage,measured_s,predicted_s,datasheet_s,measured_cpu_s"]
    for v in res.variants:
        for i, (m, p, d, c) in enumerate(zip(v.measured, v.predicted, v.datasheet, v.measured_cpu(), strict=True)):
            lines += [f"{v.name},{i},{s},{m[s]:.6g},{p[s]:.6g},{d[s]:.6g},{c[s]:.6g}" for s in STAGES]
    atomic_write_text(out / "validation.csv", "\n".join(lines) + "\n")
    scatter_plot(res, out / "scatter.png")


def scatter_plot(res: ValidationResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5.5))
    lo, hi = math.inf, 0.0
    for which, marker, label in (("predicted", "o", "calibrated"), ("datasheet", "x", "datasheet")):
        for stage in STAGES[:4]:
            xs = [r[stage] for v in res.variants for r in v.measured]
            ys = [r[stage] for v in res.variants for r in getattr(v, which)]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
            if not pts:
                continue
            ax.scatter(*zip(*pts, strict=True), marker=marker, label=f"{stage} ({label})", alpha=0.8)
            lo = min(lo, *(min(p) for p in pts))
            hi = max(hi, *(max(p) for p in pts))
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="predicted = measured")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured s (per step)")
    ax.set_ylabel("predicted s (per step)")
    ax.set_title(f"earl validate: {res.device}, profile {Path(res.profile).stem}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
