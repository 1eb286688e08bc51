"""How far apart do calibrations of one host land? The fitted constants of several CPU profiles
(`earl calibrate` outputs: the `studies/cpu_fidelity.sh` passes' profile-cpu.json, or
back-to-back calibrations), constant by constant: each profile's value, then the spread (largest
over smallest) and the deviation of the worst profile from the median. A constant that moves
xK between calibrations moves every prediction it prices by up to xK, whatever the model's
shape: with a 25% bar, a constant whose spread exceeds 1.25 / 0.75 = 1.67 cannot leave every
run of every calibration within it.

Printed per constant (the scalars, the dispatch path's, the curves' asymptotes in FLOP/s or
bytes/s, the probe's readings), largest spread first; constants zero in every profile are left
out, as are bookkeeping fields (dates, versions, flags). The fixed and per-unit parameters of one
affine fit trade off against each other, so a stage's price spreads less than its parameters do:
`earl validate --rescore <run> --hardware <profile>` of one recorded run under each profile gives
the price's own spread (docs/validate-history.md, fifteenth session).

    python studies/cpu_calibration_spread.py docs/cpu/epyc-2026-12-03b/cf2{3,4,5,6} docs/cpu/epyc-2026-12-04/cf2{7,8}
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SKIP = {"version", "dp_grad_overlap", "grad_bucket_bytes", "mem_reserve_bytes", "mem_reserve_frac", "host_share",
        "tp_comm_overlap", "gpus_per_node", "hbm_bytes", "full_duplex", "host_parallel"}
CURVES = ("matmul", "elementwise", "memory", "attention", "attention_decode")


def profile_path(arg: Path) -> Path:
    p = arg / "profile-cpu.json" if arg.is_dir() else arg
    if not p.is_file():
        raise ValueError(f"{arg}: no profile (give a profile JSON or a studies/cpu_fidelity.sh OUT folder)")
    return p


def constants(profile: dict) -> dict[str, float]:
    """The profile's fitted numbers by name (curves as their asymptote: peak_frac x peak)."""
    def scalars(d: dict, prefix: str = "") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in d.items()
                if k not in SKIP and isinstance(v, (int, float)) and not isinstance(v, bool)}

    out = {**scalars(profile), **scalars(profile.get("dispatch_path") or {}, "dispatch_path.")}
    hw = profile.get("hardware") or {}
    peak = {"matmul": hw.get("peak_flops"), "attention": hw.get("peak_flops"),
            "attention_decode": hw.get("peak_flops"), "elementwise": hw.get("hbm_bw_bytes_s"),
            "memory": hw.get("hbm_bw_bytes_s")}
    for c in CURVES:
        if profile.get(c) and peak.get(c):
            out[f"{c} asymptote"] = profile[c]["peak_frac"] * peak[c]
    for n, v in (profile.get("host_probe_ranks_s") or {}).items():
        out[f"host_probe_ranks_s[{n}]"] = float(v)
    return out


def spread(paths: list[Path]) -> str:
    profiles = [json.loads(profile_path(p).read_text()) for p in paths]
    if len(profiles) < 2:
        raise ValueError(f"give at least two profiles, got {len(profiles)}")
    got = [constants(p) for p in profiles]
    names = sorted({k for g in got for k in g if any(g2.get(k) for g2 in got)})
    rows = []
    for k in names:
        vals = [g.get(k, 0.0) for g in got]
        pos = [v for v in vals if v > 0]
        if len(pos) < len(vals):  # zero or absent in some calibration (a fit at its floor, or an older profile)
            rows.append((float("inf"), k, vals, float("nan")))
            continue
        med = statistics.median(vals)
        rows.append((max(vals) / min(vals), k, vals, max(abs(v / med - 1) for v in vals)))
    rows.sort(key=lambda r: (-r[0], r[1]))
    labels = [profile_path(p).parent.name if p.is_dir() else p.stem for p in paths]
    lines = [f"{len(profiles)} calibrations: " + ", ".join(labels),
             f"{'constant':34s} {'spread':>7s} {'worst vs median':>16s}  values"]
    for sp, k, vals, dev in rows:
        s = "   (0 in some)" if sp == float("inf") else f"x{sp:6.2f} {100 * dev:15.0f}%"
        lines.append(f"{k:34s} {s}  " + " ".join(f"{v:.3g}" for v in vals))
    fitted = [r for r in rows if r[0] != float("inf")]
    wide = [r for r in fitted if r[0] > 1.25 / 0.75]
    lines.append("")
    lines.append(f"{len(wide)} of {len(fitted)} constants fitted in every calibration spread more than x1.67 "
                 f"(no level is within 25% of every calibration's); {len(rows) - len(fitted)} are 0 in some")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="profile JSONs or studies/cpu_fidelity.sh OUT folders")
    try:
        print(spread(ap.parse_args().profiles))
    except ValueError as e:
        ap.error(str(e))  # exit code 2
