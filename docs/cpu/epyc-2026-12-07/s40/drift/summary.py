# Summary of drift.jsonl (drift.py's records): each series' spread, its correlation with the
# rollout's (raw, and as running medians over 9 and 45 records: ~12 s and ~1 min), minute medians.
import json, sys
import numpy as np
r = [json.loads(line) for line in open(sys.argv[1] if len(sys.argv) > 1 else "drift.jsonl")]
print(len(r), "records over %.1f min" % ((r[-1]["t"] - r[0]["t"]) / 60))
keys = ["rollout", "probe_cpu", "probe_wall", "l3", "py"]
A = {k: np.log(np.array([x[k] for x in r])) for k in keys}
for k in keys:
    v = np.exp(A[k])
    print("%-10s median %.4g  p10 %.4g p90 %.4g  sd(log) %.3f" % (k, np.median(v), np.percentile(v, 10),
                                                                   np.percentile(v, 90), A[k].std()))
def roll(x, w):
    return np.array([np.median(x[max(0, i - w // 2):i + w // 2 + 1]) for i in range(len(x))])
for w in (1, 9, 45):
    print("running median over", w, "records: corr with the rollout's:",
          " ".join("%s %.2f" % (k, np.corrcoef(roll(A["rollout"], w), roll(A[k], w))[0, 1]) for k in keys[1:]))
t0 = r[0]["t"]
mins = np.array([(x["t"] - t0) // 60 for x in r])
for m in range(int(mins.max()) + 1):
    s = mins == m
    print("minute %2d" % m, " ".join("%s %.4g" % (k, np.median(np.exp(A[k][s]))) for k in keys))
