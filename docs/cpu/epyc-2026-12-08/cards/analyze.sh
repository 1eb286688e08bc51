#!/bin/bash
cd /work/main && . .venv/bin/activate && export OMP_NUM_THREADS=1
S=studies/cpu_fidelity_scorecard.py
NEW="/tmp/cf198 /tmp/cf199 /tmp/cf200 /tmp/cf201 /tmp/cf202 /tmp/cf203"
OLD="$(ls -d /tmp/cf18[2-9] /tmp/cf19[0-7])"
mkdir -p /tmp/s43/cards
python $S --common $NEW > /tmp/s43/cards/new-tiny.txt
python $S --runs heldout-nproc --common $NEW > /tmp/s43/cards/new-heldout.txt
python $S --runs model --common $NEW > /tmp/s43/cards/new-model.txt
python $S --runs model --common $OLD > /tmp/s43/cards/old-model.txt
python $S --common /tmp/cf196 /tmp/cf197 > /tmp/s43/cards/cf196-197-tiny.txt
python $S --runs heldout-nproc --common /tmp/cf196 /tmp/cf197 > /tmp/s43/cards/cf196-197-heldout.txt
# the shipped profile on every fresh pass of today
PROFILE=$PWD/earl/cost_model/profiles/cpu-measured.json python docs/cpu/epyc-2026-12-07/s42/whatif/loo.py /tmp/s43/ship /tmp/cf19[6-9] /tmp/cf20[0-3] > /dev/null
python $S --common /tmp/s43/ship/cf* > /tmp/s43/cards/ship-tiny.txt
python $S --runs heldout-nproc --common /tmp/s43/ship/cf* > /tmp/s43/cards/ship-heldout.txt
python - <<'PY'
import json, glob, statistics
def ratios(dirs, prefix):
    out = {}
    for d in dirs:
        for f in sorted(glob.glob(f"{d}/{prefix}*/validation.json")):
            v = json.load(open(f))
            for s in v["stages"]:
                if s["measured_s"]:
                    out.setdefault(s["stage"], []).append(s["predicted_s"] / s["measured_s"])
    return {k: (round(statistics.median(x), 3), len(x)) for k, x in out.items()}
new = [f"/tmp/cf{n}" for n in range(198, 204)]
old = [f"/tmp/cf{n}" for n in range(182, 198)]
print("one-process held-out, predicted/measured medians: old", ratios(old, "model-"), "new", ratios(new, "model-"))
PY
