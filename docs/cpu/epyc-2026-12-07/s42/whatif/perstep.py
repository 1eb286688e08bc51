# What-if: each scored step's prediction x (that step's host-probe reading, median over ranks, over
# the calibration's reference)^a, against the run's one factor (validate's host_speed)^a.
import csv, glob, json, os, sys, statistics as st
from collections import Counter, defaultdict
from pathlib import Path
STAGES = ("rollout", "experience", "dispatch", "train", "reshard")
def probes(run):
    # a rescored run folder holds no trace: TRACES=ROOT reads ROOT/<pass>/<run>/runs (the staged passes)
    src = run if (run / "runs").exists() else Path(os.environ["TRACES"]) / run.parent.name / run.name
    t = json.load(open(src / "runs/base/trace.json")); ev = t["traceEvents"] if isinstance(t, dict) else t
    by = defaultdict(list)
    for e in ev:
        if e.get("name") == "host_probe" and e.get("args", {}).get("probe_s"):
            by[e["args"]["step"]].append(e["args"]["probe_s"])
    return {k: st.median(v) for k, v in by.items()}
def main(prefix, dirs):
    res = defaultdict(Counter); tot = Counter()
    for d in dirs:
        for r in sorted(Path(d).glob(prefix + "*")):
            if not (r / "validation.json").exists() or r.name.endswith(".log"):
                continue
            v = json.loads((r / "validation.json").read_text()); var = v["variants"][0]; n = v["nproc"]
            if n < 2 or not var.get("host_probe_s"):
                continue
            ref = var["host_probe_s"] / var["host_speed"]
            pr = probes(r)
            rows = list(csv.DictReader(open(r / "validation.csv")))
            steps = sorted({int(x["step"]) for x in rows})
            # validation.csv step index i -> trace step: scored steps are the run's last len(steps)
            tsteps = sorted(pr)[-len(steps):]
            f_step = {s: pr[t] / ref for s, t in zip(steps, tsteps)}
            for s in STAGES:
                xs = [x for x in rows if x["stage"] == s]
                for lab, fn in (("none", lambda x: 1.0), ("run", lambda x: var["host_speed"]),
                                ("run^.5", lambda x: var["host_speed"] ** .5),
                                ("step", lambda x: f_step[int(x["step"])]), ("step^.5", lambda x: f_step[int(x["step"])] ** .5)):
                    e = st.median(abs(float(x["predicted_s"]) * fn(x) / float(x["measured_s"]) - 1) for x in xs)
                    res[lab][(n, s)] += e <= 0.25
                tot[(n, s)] += 1
    for lab, c in res.items():
        print(f"{prefix:14s} {lab:8s} {sum(c.values()):4d}/{sum(tot.values())}  " + " ".join(f"{n}{s[:4]} {c[(n, s)]}" for n in (2, 4) for s in STAGES))
main(sys.argv[1], sys.argv[2:])
