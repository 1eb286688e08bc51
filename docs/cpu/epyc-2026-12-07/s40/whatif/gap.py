# The host work each rank does between leaving the training dispatch and starting its training
# step (padded_batch + the memory-budget check: in no stage's span), from the runtime's traces.
import json, sys, glob, statistics as st
from collections import defaultdict
for pat in sys.argv[1:]:
    G = []; TOK = []
    for f in sorted(glob.glob(pat)):
        t = json.load(open(f)); ev = [e for e in t["traceEvents"] if e.get("ph") == "X" and e["args"].get("step", 0) >= 1]
        d = {}; tr = {}
        for e in ev:
            key = (e["args"]["step"], e["tid"])
            if e["name"] == "layout-aware": d[key] = e["ts"] + e["dur"]
            if e["name"] == "train_step": tr[key] = (e["ts"], e["args"].get("tokens", 0))
        for k in d:
            if k in tr:
                G.append((tr[k][0] - d[k]) / 1e3); TOK.append(tr[k][1])
    q = st.quantiles(G, n=4)
    print(f"{pat[:60]:60s} gap median {st.median(G):.2f} ms (q25 {q[0]:.2f}, q75 {q[2]:.2f}) n={len(G)}, tokens/rank median {st.median(TOK):.0f}")
