# What-if (forty-first session): stage recorded passes with their weight-sync constants refitted
# from their own recorded points (fit_quality.fsdp.points, kind "sync") under the four sync terms
# the fit now has (reshard_fixed_s, reshard_tensor_s, reshard_byte_s, reshard_shard_byte_s), and
# `reshard_wake_s` re-derived as the fit derives it (the staggered points' recorded stretch kept:
# their leads are not recorded); BASE=1 stages the profile as recorded; TERMS=a,b,... fits only
# those of the four (the others 0: TERMS=reshard_fixed_s,reshard_tensor_s,reshard_byte_s is
# "fixed", TERMS=reshard_fixed_s,reshard_tensor_s,reshard_shard_byte_s "shard"). Then rescore the staged
# passes with ../../s40/whatif/nokd.py (NOKD=0) and score them with studies/cpu_fidelity_scorecard.py.
# usage: python refit.py OUTROOT SRC_PASS_DIRS...   (each with profile-cpu.json and *nproc* runs)
import json, os, re, sys, statistics, dataclasses
from pathlib import Path
from earl.calibrate import fsdpfit as F
base = os.environ.get("BASE") == "1"
out = Path(sys.argv[1])
for src in map(Path, sys.argv[2:]):
    prof = json.loads((src / "profile-cpu.json").read_text())
    q = prof["fit_quality"]["fsdp"]
    hp = q["host_parallel"]
    pts = []
    for r in q["points"]:
        if r["kind"] not in ("sync", "wake"):
            continue
        m = re.match(r"weight sync (\d+) layers( wide)?", r["label"])
        c = r["counts"]
        counts = {"reshard_fixed_s": 1, "reshard_tensor_s": c["reshard_tensor_s"],
                  "reshard_shard_byte_s": c["reshard_byte_s"] / r["procs"], "reshard_byte_s": c["reshard_byte_s"]}
        pts.append(F.FsdpPoint(kind=r["kind"], procs=r["procs"], layers=int(m[1]), wide=bool(m[2]), label=r["label"],
                               measured_s=r["measured_s"], counts=counts, priced_s=r["priced_without_s"] / r["stretch"],
                               share=r["share"], stretch=r["stretch"]))
    if not base:
        terms = tuple(os.environ["TERMS"].split(",")) if os.environ.get("TERMS") else F.FIELDS["sync"]
        fields = {**dict.fromkeys(F.FIELDS["sync"], 0.0), **F.fit_constants([p for p in pts if p.kind == "sync"], terms)}
        wake = [p.measured_s - p.predicted_s(fields) for p in pts if p.kind == "wake" and p.procs > hp]
        fields["reshard_wake_s"] = max(0.0, statistics.median(wake)) if wake else 0.0
        before = {k: prof.get(k, 0.0) for k in fields}
        prof.update(fields)
        print(src.name, " ".join(f"{k} {before[k]:.3g}->{v:.3g}" for k, v in fields.items()), flush=True)
    dst = out / src.name
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "profile-cpu.json").write_text(json.dumps(prof))
    for r in sorted(src.glob("*nproc*")):
        if not r.is_dir():
            continue
        d = dst / r.name
        d.mkdir(exist_ok=True)
        for f in ("runs", "validation.json", "validation.csv", "model"):
            if (r / f).exists() and not (d / f).exists():
                os.symlink(r.resolve() / f, d / f)
