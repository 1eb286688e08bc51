# Each recorded weight-sync fit refitted with and without the per-sync fixed part and the shard-byte
# term: per point (ranks, depth, wide) predicted / measured; the last lines give the median per
# point over the fits and the largest error. python fitpoints.py "xeon-2026-12-07/cf1[45]?" "epyc-2026-12-07/cf1[5-8]?" (from docs/cpu)
import json, glob, sys, numpy as np, statistics as st
from scipy.optimize import nnls
def fit(rows, cols):
    w = np.array([r["stretch"] / r["measured_s"] for r in rows])
    A = np.array([[c(r) for c in cols] for r in rows])
    y = np.array([r["measured_s"] / r["stretch"] - r["priced_without_s"] / r["stretch"] for r in rows])
    x, _ = nnls(A * w[:, None], y * w)
    pred = (A @ x + np.array([r["priced_without_s"] / r["stretch"] for r in rows])) * np.array([r["stretch"] for r in rows])
    return x, [p / r["measured_s"] for p, r in zip(pred, rows)]
one = lambda r: 1.0
ten = lambda r: r["counts"]["reshard_tensor_s"]
byt = lambda r: r["counts"]["reshard_byte_s"]
shard = lambda r: r["counts"]["reshard_byte_s"] / r["procs"]
models = {"3term": [one, ten, byt], "shard": [one, ten, shard], "4term": [one, ten, byt, shard]}
agg = {k: [] for k in models}
for pat in sys.argv[1:]:
    for d in sorted(glob.glob(pat)):
        p = json.load(open(d + "/profile-cpu.json"))
        rows = [r for r in p["fit_quality"]["fsdp"]["points"] if r["kind"] == "sync"]
        lab = [f"{r['procs']}{r['label'].replace('weight sync ', '').replace(' layers', 'L')}" for r in rows]
        for k, cols in models.items():
            x, res = fit(rows, cols)
            agg[k].append(res)
            print(d.split("/")[-1], f"{k:6s}", " ".join(f"{v:.3g}" for v in x), " ".join(f"{l}:{v:.2f}" for l, v in zip(lab, res)))
for k, v in agg.items():
    arr = np.array(v)
    print(k, "median per point:", " ".join(f"{m:.2f}" for m in np.median(arr, axis=0)), " max|err|", f"{np.max(np.abs(arr-1)):.2f}")
