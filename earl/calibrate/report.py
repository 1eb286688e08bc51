"""Fit-quality report of a calibration: held-out error of each fitted curve and link, and
how well the cost model's per-operator rule (max of compute and memory time plus the operator
overhead, with the fitted profile) reproduces every measured point.

    earl calibrate --device cpu --budget-s 30 --out /tmp/p.json    # prints this table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.table import Table

from earl.cost_model.compute import gemm_work
from earl.cost_model.profile import HardwareProfile
from earl.trace import atomic_write_text

if TYPE_CHECKING:
    from earl.calibrate.bench import Measurement
    from earl.calibrate.runner import CalibrationResult

UNITS = {"matmul": ("GFLOP/s", 1e9), "attention": ("GFLOP/s", 1e9), "attention_decode": ("GFLOP/s", 1e9),
         "memory": ("GB/s", 1e9)}


def roofline_s(prof: HardwareProfile, m: Measurement) -> float:
    """Seconds the cost model's per-operator rule (earl.cost_model.compute) gives this call:
    max(compute, memory) time plus the operator overhead (the bare one: a micro-benchmark
    calls one operator, not a model layer)."""
    hw = prof.hardware
    t_m = m.bytes / (hw.hbm_bw_bytes_s * prof.memory(m.bytes)) if m.bytes > 0 else 0.0
    curve = {"attention": prof.attention, "attention_decode": prof.attention_decode or prof.attention,
             }.get(m.kind, prof.matmul)
    work = gemm_work(m.flops, m.rows, prof) if m.kind == "matmul" else m.flops
    t_c = work / (hw.peak_flops * curve(work)) if m.flops > 0 and m.kind != "memory" else 0.0
    bare = prof.fit_quality.get("op_overhead", {}).get("bare_op_s", prof.op_overhead_s)
    return max(t_c, t_m) + bare


def roofline_checks(prof: HardwareProfile, ms: list[Measurement]) -> dict[str, dict]:
    """Per kind: relative error |predicted - measured| / measured over all measured points."""
    out: dict[str, dict] = {}
    for kind in ("matmul", "attention", "attention_decode", "memory"):
        pts = [m for m in ms if m.kind == kind]
        if not pts:
            continue
        err = np.array([abs(roofline_s(prof, m) - m.time_s) / m.time_s for m in pts])
        out[kind] = {"n": len(pts), "median_err": round(float(np.median(err)), 4),
                     "p90_err": round(float(np.quantile(err, 0.9)), 4),
                     "max_err": round(float(np.max(err)), 4)}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def quality_table(res: CalibrationResult) -> Table:
    prof = res.profile
    t = Table(title=f"calibration fit quality ({prof.stamp.get('device', '?')}, "
                    f"{prof.stamp.get('dtype', '?')}, {res.wall_s:.0f} s)")
    for col in ("fit", "points fit/held", "parameters", "achieved", "held-out median err",
                "held-out max err", "roofline median err (all pts)"):
        t.add_column(col, justify="left" if col in ("fit", "parameters") else "right")
    curves = {"matmul": prof.matmul, "attention": prof.attention,
              "attention_decode": prof.attention_decode, "memory": prof.memory}
    for kind in ("matmul", "attention", "attention_decode", "memory"):
        chk = res.checks.get(kind, {})
        if kind in res.fits:
            f, c = res.fits[kind], curves[kind]
            unit, scale = UNITS[kind]
            t.add_row(kind, f"{f.n_fit}/{f.n_held}",
                      f"peak_frac {c.peak_frac:.3f}, half_size {c.half_size:.3g}"
                      + (f", rows_half {prof.gemm_rows_half:.1f}" if kind == "matmul" and prof.gemm_rows_half else ""),
                      f"{f.rate / scale:.1f} {unit}", _pct(f.heldout_median_err),
                      _pct(f.heldout_max_err), _pct(chk.get("median_err")))
        elif chk:
            t.add_row(kind, f"0/{chk['n']}", "(not fitted)", "-", "-", "-",
                      _pct(chk.get("median_err")))
    if res.link:
        for op, ol in res.link.ops.items():
            t.add_row(f"{op} ({res.link.backend} x{res.link.world})", f"{ol.n_fit}/{ol.n_held}",
                      f"alpha {ol.link.alpha_s * 1e6:.1f} us", f"{ol.link.bw_bytes_s / 1e9:.2f} GB/s",
                      _pct(ol.heldout_median_err), _pct(ol.heldout_max_err), "-")
    if res.overhead:
        o = res.overhead
        t.add_row("op overhead (eager forwards)", f"{len(o.points)} (leave-one-out)",
                  f"{o.op_overhead_s * 1e6:.1f} us per counted op"
                  f"{' (at its floor, the bare op: the forwards showed no more)' if o.at_floor else ''}, "
                  f"elementwise x{o.elem_factor:.2f} the copy curve", "-", _pct(o.heldout_median_err), "-", "-")
    if res.engine:
        e = res.engine
        t.add_row("engine (runtime's own)", f"{len(e.points)} turns",
                  f"{e.step_overhead_s * 1e3:.3f} ms + {e.step_seq_overhead_s * 1e6:.1f} us/seq + "
                  f"{e.step_kv_token_s * 1e9:.1f} ns/cached token per iteration; "
                  f"{e.turn_overhead_s * 1e3:.3f} ms + {e.turn_seq_overhead_s * 1e6:.1f} us/seq per turn",
                  "-", "-", "-", "-")
    if res.host:
        h = res.host
        t.add_row("runtime stage code", f"{sum(len(v) for v in h.points.values())} points",
                  f"log-prob pass {h.logprob_pass_s * 1e3:.2f} ms + {h.logprob_token_s * 1e9:.0f} ns/token, "
                  f"train pass {h.train_pass_s * 1e3:.2f} ms + {h.train_token_s * 1e9:.0f} ns/token, "
                  f"optimizer {h.optimizer_step_s * 1e3:.2f} ms + {h.optimizer_tensor_s * 1e6:.1f} us/tensor, "
                  f"experience {h.experience_fixed_s * 1e3:.2f} ms + {h.experience_seq_s * 1e6:.0f} us/seq, "
                  f"dispatch {h.dispatch_fixed_s * 1e3:.2f} ms, "
                  f"rollout {h.rollout_fixed_s * 1e3:.2f} ms + {h.rollout_episode_s * 1e6:.0f} us/episode"
                  + (f", hand-off and batch after a rollout past the {h.host_cache_bytes / 2**20:.0f} MiB cache "
                     f"x{h.host_cold_factor:.2f}" if h.host_cache_bytes else "")
                  + (f", its spread over repetitions {h.host_spread:.3f}" if h.host_spread else ""),
                  "-", "-", "-", "-")
    cq = prof.fit_quality.get("corun")
    if cq and cq.get("ratios"):
        t.add_row("co-run slowdown", f"{len(cq['ratios'])} pairs",
                  f"x{prof.corun_slowdown:.2f} with {cq['procs']} processes computing at once "
                  f"(pairs {min(cq['ratios']):.2f}-{max(cq['ratios']):.2f})", "-", "-", "-", "-")
    dq, fq = prof.fit_quality.get("dispatch_path"), prof.fit_quality.get("fsdp")
    if dq:
        d = prof.dispatch_path
        t.add_row("dispatch path (gloo runs)", f"{dq['n']} points",
                  f"{d.message_s * 1e6:.0f} us/message, round {d.round_s * 1e6:.0f} us (+{d.sync_s * 1e6:.0f} us "
                  f"oversubscribed, +{d.wake_sync_s * 1e6:.0f} us waking), reduction {d.reduce_s * 1e6:.0f} us "
                  f"(+{d.reduce_sync_s * 1e6:.0f} us), cold start "
                  f"{d.cold_round_s * 1e3:.2f} ms/round + {d.cold_byte_s * 1e12:.0f} ms/GB", "-", "-", "-",
                  f"{_pct(dq['fit_median_err'])} (fit)")
    if fq:
        t.add_row("FSDP2 host costs (gloo)", f"{len(fq['points'])} points",
                  f"{prof.fsdp_unit_s * 1e3:.2f} ms/unit x micro-batch, {prof.fsdp_tensor_s * 1e6:.0f} us/tensor "
                  f"per optimizer step, weight sync {prof.reshard_fixed_s * 1e3:.2f} ms + "
                  f"{prof.reshard_tensor_s * 1e6:.0f} us/tensor + "
                  f"{prof.reshard_byte_s * 1e9:.2f} ns/byte + {prof.reshard_shard_byte_s * 1e9:.2f} ns/shard byte "
                  f"(busy {prof.reshard_busy:.2f}, waking "
                  f"{prof.reshard_wake_s * 1e3:.2f} ms), step start {prof.train_lead_s * 1e3:.2f} ms + "
                  f"{prof.train_lead_tensor_s * 1e6:.1f} us/tensor", "-", "-",
                  "-", f"{_pct(fq['fit_median_err'])} (fit)")
    t.caption = (f"op overhead {prof.op_overhead_s * 1e6:.2f} us; attention backend "
                 f"{prof.stamp.get('attention', '?')}; peak {prof.hardware.peak_flops / 1e9:.1f} GFLOP/s, "
                 f"memory {prof.hardware.hbm_bw_bytes_s / 1e9:.1f} GB/s")
    return t


def write_measurements(res: CalibrationResult, path: str | Path) -> Path:
    """The raw points (and collective medians) as JSON, for plots and re-fits."""
    path = Path(path)
    doc = {"stamp": res.profile.stamp,
           "measurements": [m.to_dict() for m in res.measurements],
           "collectives": ({"backend": res.collectives.backend, "world": res.collectives.world,
                            "times": res.collectives.times} if res.collectives else None)}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path
