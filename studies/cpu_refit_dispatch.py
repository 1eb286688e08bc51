"""Refit a calibrated profile's dispatch path on the gloo points its calibration recorded
(`fit_quality["dispatch_path"]["points"]`), under the current dispatch price, with the
statistics reduction's loop figures given (`DispatchPath.reduce_s`, `reduce_sync_s`; the
calibrations before the twenty-fifth session did not time the reduction). Nothing is measured
again: each point's executor time, its cold time and its process group's barrier loop come from
the file, so a profile refitted with no reduction figures reproduces its own dispatch path.

    python studies/cpu_refit_dispatch.py IN.json OUT.json --reduce-ms 0.26,1.08   # 2 and 4 ranks, 2 cores
    python studies/cpu_refit_dispatch.py IN.json OUT.json --reduce-ms from:A.json,B.json  # their median

`from:` takes the median of the named calibrations' own loop figures (reduce_s at the fitting
count, reduce_s + reduce_sync_s beyond it). Prints the terms before and after and the fit's
median / max error; writes OUT with the refitted path and its fit quality (`refit` names what was
given). docs/validate-history.md, twenty-fifth session.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from earl.calibrate.dispatchfit import DispatchPoint, fit_dispatch_path  # noqa: E402
from earl.cost_model.profile import HardwareProfile, load_profile  # noqa: E402

LABEL = re.compile(r"(\S+) n=(\d+) (\d+)x(\d+)$")
SHOWN = ("message_s", "oversubscribed_exp", "sync_s", "wire_bw_bytes_s", "reduce_s", "reduce_sync_s")


def loop_reduction(profiles: list[HardwareProfile]) -> tuple[float, float]:
    """(reduction at the fitting process count, beyond it): the median of the profiles' own
    measured loop figures."""
    got = [(p.dispatch_path.reduce_s, p.dispatch_path.reduce_s + p.dispatch_path.reduce_sync_s)
           for p in profiles if p.dispatch_path.reduce_s > 0]
    if not got:
        raise ValueError("none of the --reduce-ms from: profiles timed the statistics reduction (reduce_s is 0)")
    return statistics.median(a for a, _ in got), statistics.median(b for _, b in got)


def refit(prof: HardwareProfile, reduction: tuple[float, float] | None) -> HardwareProfile:
    """`prof` with its dispatch path refitted on its recorded points; `reduction`: seconds per
    statistics reduction with the node's processes within its cores and beyond them (None: not
    timed, the points' reductions are priced as two rounds)."""
    q = prof.fit_quality.get("dispatch_path")
    if not q or not q.get("points"):
        raise ValueError("the profile records no dispatch-path points (fit_quality.dispatch_path.points): "
                         "give a profile `earl calibrate` wrote with its dispatch phase")
    path = prof.dispatch_path
    points = []
    for p in q["points"]:
        m = LABEL.match(p["label"])
        if not m:
            raise ValueError(f"unreadable dispatch point label {p['label']!r}")
        kind, procs, per_rank, context = m[1], int(m[2]), int(m[3]), int(m[4])
        beyond = procs > path.host_parallel  # the barrier loop's figure at this count, as measured
        loop = q["round_s"] + (q["sync_s_loop"] if beyond else 0.0)
        red = math.nan if reduction is None else reduction[beyond]
        points.append(DispatchPoint(procs=procs, per_rank=per_rank, context=context, kind=kind,
                                    seconds=p["measured_s"], busiest_bytes=0.0, cold_seconds=p["cold_measured_s"],
                                    share=path.host_share, round_s=loop, reduce_s=red,
                                    reductions=q.get("reductions", 1),  # recorded before 2026-12-06: one
                                    start_rounds=q.get("start_rounds", 1)))  # and the start barrier's round
    host = {"object_s": path.object_s, "copy_bw_bytes_s": path.copy_bw_bytes_s, "sample_s": path.sample_s}
    new, quality = fit_dispatch_path(prof, points, host, host_parallel=path.host_parallel)
    quality["probe_s"] = q.get("probe_s")
    quality["refit"] = ("recorded points, no reduction timed" if reduction is None else
                        f"recorded points, reduction {reduction[0] * 1e3:.3f} ms within the cores, "
                        f"{reduction[1] * 1e3:.3f} ms beyond")
    return dataclasses.replace(prof, dispatch_path=new, fit_quality={**prof.fit_quality, "dispatch_path": quality})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="a calibrated profile JSON (or a shipped profile's name)")
    ap.add_argument("out", type=Path, help="where to write the refitted profile (a new file, or --force)")
    ap.add_argument("--force", action="store_true", help="replace an existing OUT")
    ap.add_argument("--reduce-ms", default=None,
                    help="ms per statistics reduction within the host's cores and beyond them (2 and 4 "
                         "ranks on 2 cores: '0.26,1.08'), or 'from:A.json,B.json' "
                         "(the median of those calibrations' loop figures); default: none timed")
    args = ap.parse_args(argv)
    try:
        if args.out.exists() and not args.force:
            raise ValueError(f"{args.out} exists; pass --force to replace it")
        if not args.out.parent.is_dir():
            raise ValueError(f"{args.out.parent} is not a folder; give OUT in an existing folder")
        prof = load_profile(args.profile)
        reduction = None
        if args.reduce_ms and args.reduce_ms.startswith("from:"):
            reduction = loop_reduction([load_profile(x) for x in args.reduce_ms[5:].split(",") if x])
        elif args.reduce_ms:
            try:
                vals = [float(x) for x in args.reduce_ms.split(",")]
            except ValueError:
                vals = []
            if len(vals) != 2 or min(vals) <= 0:
                raise ValueError(f"--reduce-ms wants two positive ms figures (within the cores, beyond them) "
                                 f"or from:FILES, got {args.reduce_ms!r}")
            reduction = (vals[0] / 1e3, vals[1] / 1e3)
        new = refit(prof, reduction)
    except (ValueError, FileNotFoundError, KeyError) as e:
        ap.error(str(e))  # exit code 2
    before, after = prof.fit_quality["dispatch_path"], new.fit_quality["dispatch_path"]
    print(f"{args.profile}: fit median {before['fit_median_err']:.3f} -> {after['fit_median_err']:.3f}, "
          f"max {before['fit_max_err']:.2f} -> {after['fit_max_err']:.2f}")
    for k in SHOWN:
        print(f"  {k:20s} {getattr(prof.dispatch_path, k):.4g} -> {getattr(new.dispatch_path, k):.4g}")
    try:
        new.save(args.out)
    except OSError as e:
        ap.error(f"cannot write {args.out}: {e.strerror}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
