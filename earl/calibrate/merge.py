"""Several calibrations of one host merged into one profile (`earl calibrate --median-of A B C`):
every fitted number is the median of its values over the calibrations.

Why: on a shared host one calibration's constants move from run to run by as much as the
errors they leave (docs/validate-history.md, fifteenth session: x1.1-2.9 between calibrations minutes
apart). Taken one by one, each constant's median over several calibrations is the estimate the
others' outliers move least. Measured on the 2-core VM (seventeenth session): the median of five
calibrations priced the same twenty recorded multi-process runs within 25% in 74 of 100
stage-runs, each run's own calibration in 66.

What is merged: every number (int or float) of the profile's JSON form, key by key, over the
calibrations that have it (a key only some have, such as a field newer calibrations fit, is
their median); everything else (names, flags, lists) comes from the first that has it. The
constants are fitted together within a calibration (an efficiency curve's two parameters, the
FSDP2 terms); their medians are taken apart, which keeps each within the calibrations' range.
`fit_quality`'s figures are merged the same way (its point lists are the first's), and it
records where each constant's values lay (`fit_quality["median_of"]`); `stamp.median_of` names
the inputs.

    earl calibrate --median-of cf1/profile-cpu.json,cf2/profile-cpu.json,cf3/profile-cpu.json --out merged.json
"""

from __future__ import annotations

import statistics

from earl.cost_model.profile import HardwareProfile, load_profile
from earl.outputs import check_out_file

# taken from the first calibration, not merged: what it ran on
NOT_MERGED = ("stamp",)
# stamp fields that must agree: calibrations of different machines or setups are not merged
SAME_SETUP = ("device", "dtype", "threads", "torch")
# stamp fields that describe one calibration's run, dropped from the merged stamp
ONE_RUN = ("load_avg_1m", "wall_s", "cpu_share")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _merge(values: list, path: str, spread: dict[str, list[float]]):
    first = values[0]
    if isinstance(first, dict):  # every key any calibration has (the first's order, then the others' new ones)
        keys = list(dict.fromkeys(k for v in values if isinstance(v, dict) for k in v))
        return {k: _merge([v[k] for v in values if isinstance(v, dict) and k in v],
                          f"{path}.{k}" if path else k, spread) for k in keys}
    if isinstance(first, list) and first and all(_number(x) for x in first):  # e.g. estimator_s pairs
        same = [v for v in values if isinstance(v, list) and len(v) == len(first)]
        return [_merge([v[i] for v in same], f"{path}[{i}]", spread) for i in range(len(first))]
    if not _number(first):
        return first
    nums = [float(v) for v in values if _number(v)]
    med = statistics.median(nums)
    if max(nums) > min(nums):
        spread[path] = [min(nums), med, max(nums)]
    return int(round(med)) if isinstance(first, int) else med


def median_profile(profiles: list[dict], names: list[str] | None = None) -> dict:
    """The JSON form of the profile whose numbers are the medians of `profiles`' (JSON forms of
    calibrated profiles of one setup; at least two). ValueError if they are fewer or their stamps
    name different setups (`SAME_SETUP`)."""
    names = names or [f"profile {i + 1}" for i in range(len(profiles))]
    if len(profiles) < 2:
        raise ValueError(f"--median-of needs at least 2 calibrations, got {len(profiles)}")
    stamps = [p.get("stamp") or {} for p in profiles]
    for key in SAME_SETUP:
        seen = {str(s.get(key)) for s in stamps}
        if len(seen) > 1:
            raise ValueError(f"--median-of: the calibrations differ in {key} ({', '.join(sorted(seen))}); "
                             "merge calibrations of one setup only")
    spread: dict[str, list[float]] = {}
    body = _merge([{k: v for k, v in p.items() if k not in NOT_MERGED} for p in profiles], "", spread)
    stamp = {k: v for k, v in stamps[0].items() if k not in ONE_RUN}
    stamp["median_of"] = list(names)  # still "source": "calibrated", so its stamp is checked on load
    stamp["date"] = max(str(s.get("date", "")) for s in stamps)
    constants = {k: v for k, v in spread.items() if not k.startswith("fit_quality.")}
    quality = {**body.get("fit_quality", {}), "median_of": {"calibrations": list(names), "min_median_max": constants}}
    return {**body, "stamp": stamp, "fit_quality": quality}


def merge_profile_files(paths: list[str], out: str, force: bool = False) -> tuple[HardwareProfile, dict]:
    """`earl calibrate --median-of PATHS --out OUT`: read each calibrated profile (checked as any
    profile is loaded), write their median profile to `out` (not over an existing file unless
    `force`). Returns (the merged profile, {constant: [min, median, max]} where they differed)."""
    if not out.endswith(".json"):
        raise ValueError(f"--out {out!r} must name a .json file")
    check_out_file(out, force=force)
    # each checked as any profile is loaded (a clear error for a missing or malformed one) before
    # anything is written
    dicts = [load_profile(p).to_dict() for p in paths]
    merged = median_profile(dicts, [str(p) for p in paths])
    prof = HardwareProfile.from_dict(merged, source=out)
    prof.save(out)
    return prof, merged["fit_quality"]["median_of"]["min_median_max"]
