# What-if: each run's per-step predictions x (the run's host-probe median / the calibration's reading
# in the phase whose constants price the stage)^alpha; runs counted within 25% (median per-step error).
import json, glob, csv, statistics as st, sys
import numpy as np
from collections import Counter
STAGES = ("rollout", "experience", "dispatch", "train", "reshard")
def refs(prof, n, how):
    hp = prof["fit_quality"].get("host_probe", {})
    bp, rp = hp.get("by_phase", {}), hp.get("ranks_by_phase", {})
    glob_ref = prof.get("host_probe_ranks_s", {}).get(str(n)) or prof["host_probe_s"]
    if how == "global":
        return dict.fromkeys(STAGES, glob_ref)
    one = st.median(bp["runtime"]) if "runtime" in bp else prof["host_probe_s"]
    disp = rp.get("dispatch", {}).get(str(n), glob_ref)
    fsdp = rp.get("fsdp", {}).get(str(n), glob_ref)
    if how == "phase":
        return {"rollout": one, "experience": one, "dispatch": disp, "train": fsdp, "reshard": fsdp}
    if how == "phase-ranks":  # rank-phase readings for every stage at n ranks (co-running ranks read slower)
        return {"rollout": glob_ref * one / prof["host_probe_s"], "experience": glob_ref * one / prof["host_probe_s"],
                "dispatch": disp, "train": fsdp, "reshard": fsdp}
def score(pat, prof_of, how, alpha, prefix):
    c = Counter(); tot = Counter()
    for d in sorted(glob.glob(pat)):
        prof = json.load(open(prof_of(d)))
        for f in sorted(x for x in glob.glob(d + f"/{prefix}*") if not x.endswith(".log")):
            if not f.endswith(("run1", "run2")) and prefix == "nproc":
                continue
            v = json.load(open(f + "/validation.json")); n = v["nproc"]; var = v["variants"][0]
            run = var.get("host_probe_s")
            r = refs(prof, n, how) if how != "none" else None
            rows = list(csv.DictReader(open(f + "/validation.csv")))
            for s in STAGES:
                k = 1.0 if how == "none" or not run else (run / r[s]) ** alpha
                e = st.median(abs(float(x["predicted_s"]) * k / float(x["measured_s"]) - 1) for x in rows if x["stage"] == s)
                c[(n, s)] += e <= 0.25; tot[(n, s)] += 1
    return c, tot
hosts = [("epyc", "/work/main/docs/cpu/epyc-2026-12-07/cf1[5-7]?", lambda d: d + "/profile-cpu.json"),
         ("xeon", "/tmp/s40/base_x/cf1*", lambda d: d.replace("/tmp/s40/base_x", "/tmp/s40/xeon_src") + "/profile-cpu.json")]
for lab, pat, pf in hosts:
    for prefix in ("nproc", "heldout-nproc"):
        for how, alpha in (("none", 0), ("global", 1.0), ("phase", 1.0), ("phase", 0.5), ("phase-ranks", 1.0)):
            c, tot = score(pat, pf, how, alpha, prefix)
            print(f"{lab} {prefix:14s} {how:11s} a={alpha:.1f}: {sum(c.values()):3d}/{sum(tot.values())}  " +
                  " ".join(f"{n}{s[:4]} {c[(n, s)]}" for n in (2, 4) for s in STAGES))
