"""Refit a calibrated profile's FSDP2 host constants from the points its calibration recorded,
under the current code's prices: what `earl calibrate`'s fsdp phase (earl.calibrate.fsdpfit)
would have fitted from the same measurements. For re-pricing committed passes after a change
to how the cost model prices the FSDP2 gathers (docs/validate-history.md, nineteenth session).

Each profile's `fit_quality.fsdp.points` (measured seconds, counts, the ranks' core share) go
through `fsdpfit.fit_fsdp_costs` again with its own `reshard_busy`, and a copy of
the profile written with them; a line per profile gives the old and new constants and each
weight sync point's predicted / measured.

    python studies/cpu_fsdp_refit.py docs/cpu/epyc-2026-12-04f/cf4[4-5]/profile-cpu.json --out /tmp/refit
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from earl.calibrate.fsdpfit import STAGGER_S, FsdpPoint, fit_fsdp_costs, spec_of, sync_counts  # noqa: E402
from earl.cost_model.profile import load_profile  # noqa: E402


def points(quality: dict) -> list[FsdpPoint]:
    """The recorded points of a profile's fsdp fit (its `fit_quality["fsdp"]`), a weight sync's
    counted quantities as the current fit counts them (`fsdpfit.sync_counts`: the fits before the
    forty-first session counted no fixed part and no shard bytes)."""
    out = []
    for r in quality["points"]:
        lab, counts = r["label"], r["counts"]
        if r["kind"] in ("train", "lead"):  # "2L 16x96 budget 192[ start]"
            layers, wide = int(lab.split("L")[0]), False
        else:  # "weight sync 2 layers[ wide][ staggered]"
            layers, wide = int(lab.split()[2]), " wide" in lab
            counts = sync_counts(spec_of(layers, wide), r["procs"])
        # a staggered sync's ranks arrived STAGGER_S apart (their measured leads are not recorded)
        leads = tuple(STAGGER_S * i for i in range(r["procs"])) if r["kind"] == "wake" else ()
        out.append(FsdpPoint(kind=r["kind"], procs=r["procs"], layers=layers, wide=wide, label=lab,
                             measured_s=r["measured_s"], counts=counts, share=r["share"], leads=leads))
    return out


def refit(path: str) -> tuple[dict, dict[str, float], list[tuple[int, str, float]]]:
    """(the profile's JSON with the refitted constants, those constants, per sync point (ranks,
    label, predicted / measured))."""
    prof = load_profile(path)
    data = json.loads(Path(path).read_text())
    quality = data.get("fit_quality", {}).get("fsdp")
    if not quality or not quality.get("points"):
        raise ValueError(f"{path}: no recorded fsdp points (fit_quality.fsdp.points); calibrate with phase fsdp")
    # the recorded points carry no busy readings: the profile's own reshard_busy prices them
    fields, fit = fit_fsdp_costs(prof, points(quality), quality.get("host_parallel"))
    syncs = [(r["procs"], r["label"].replace("weight sync ", ""), r["predicted_s"] / r["measured_s"])
             for r in fit["points"] if r["kind"] == "sync"]
    return {**data, **fields}, fields, syncs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", help="calibrated profile JSON files with an fsdp fit")
    ap.add_argument("--out", help="folder to write each refitted profile into (as <parent folder>.json)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else None
    if out:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--out {out}: cannot create it ({e.strerror})")
    rows = []
    for path in args.profiles:
        try:
            data, fields, syncs = refit(path)
        except (ValueError, OSError) as e:
            ap.error(str(e).splitlines()[0])
        old = json.loads(Path(path).read_text())
        consts = " ".join(f"{f} {old.get(f, 0.0):.3g} -> {v:.3g}" for f, v in fields.items())
        rows.append(f"{path}: {consts}\n  syncs predicted / measured: "
                    + " ".join(f"{n}r {lab} x{r:.2f}" for n, lab, r in syncs))
        if out:
            dataclasses.replace(load_profile(path), **fields)  # the refitted values pass the profile's checks
            (out / f"{Path(path).parent.name}.json").write_text(json.dumps(data, indent=1))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
