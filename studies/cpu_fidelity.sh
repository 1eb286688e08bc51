#!/usr/bin/env bash
# CPU fidelity check: calibrate this host once, then hold the profile against runs it was not
# fitted on, and time dispatch on gloo next to the one dispatch price. Calibration runs the tiny
# model on Tic-Tac-Toe, the dispatch executor and the FSDP2 training step + weight sync on 2 and 4
# gloo ranks (phases dispatch and fsdp); the validations use
#   - a held-out model: qwen2-27m (Qwen2-shaped, 27M parameters, random weights, vocab 8192),
#     on the calibration's environment and on a held-out one (calculator);
#   - the multi-process runtime: --nproc 2 and 4 (tiny model, calculator; 8 scored steps, two runs each);
#   - the multi-process runtime on the held-out model: --nproc 2 and 4 (qwen2-27m, calculator; 4
#     scored steps, one run each: heldout-nprocN, outside the scorecard's tiny-model counts);
# and benchmarks/bench_dispatch.py at 2 / 4 / 8 processes. Everything lands in $OUT (default
# ./cpu_fidelity): logs, validation.json per run, the profile. Needs a quiet host (other
# processes' time slices show up as stage time): the load average is logged before each part.
# About 10 minutes on 2 cores (2026-12-04: 9, the held-out model's two runs about a minute each).
#
#   OUT=docs/cpu bash studies/cpu_fidelity.sh                         # calibrate, then check
#   PROFILE=cpu-measured OUT=/tmp/f bash studies/cpu_fidelity.sh      # check a shipped profile
#   QUICK=1 OUT=/tmp/f bash studies/cpu_fidelity.sh                   # smoke run (~2 min)
set -euo pipefail

OUT_DIR="${OUT:-./cpu_fidelity}"
QUICK="${QUICK:-0}"
PY="${PYTHON:-python3}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(cd "$(dirname "$0")/.." && pwd)"
export OMP_NUM_THREADS=1
if [ "$QUICK" = 1 ]; then
  STEPS=2; MP_STEPS=2; RUNS=1; BUDGET=8; DISPATCH=(--procs 2 --contexts 1024 --repeats 2 --rounds 1); MP=(2); HELD=()
else  # the multi-process runs: 8 scored steps, twice each, alternating (issue #24's protocol)
  STEPS=5; MP_STEPS=9; RUNS=2; BUDGET=90; DISPATCH=(--rounds 3); MP=(2 4); HELD=(2 4)
fi
mkdir -p "$OUT_DIR"
load() { echo "[$(date -u +%T)] load average: $(cut -d' ' -f1-3 /proc/loadavg) -- $*"; }

if [ -n "${PROFILE:-}" ]; then
  PROFILE_PATH="$PROFILE"
  load "calibration skipped: checking $PROFILE" | tee "$OUT_DIR/calibrate.log"
else
  PROFILE_PATH="$OUT_DIR/profile-cpu.json"
  { load "calibrate"; "$PY" -m earl.cli calibrate --budget-s "$BUDGET" --out "$PROFILE_PATH" --force \
      --measurements "$OUT_DIR/measurements-cpu.json"; } 2>&1 | tee "$OUT_DIR/calibrate.log"
fi

validate() {  # name, steps, then validate's arguments
  local name="$1" steps="$2"; shift 2
  rm -rf "${OUT_DIR:?}/$name"
  { load "validate $name: --steps $steps $*"; "$PY" -m earl.cli validate --hardware "$PROFILE_PATH" --steps "$steps" \
      --out "$OUT_DIR/$name" "$@"; load "done"; } 2>&1 | grep -v -e "Writing model" -e "Loading weights" \
      | tee "$OUT_DIR/$name.log"
}
SMALL=(--set groups=4 --set group_size=4)
validate model-tictactoe "$STEPS" --model qwen2-27m "${SMALL[@]}"
validate model-calculator "$STEPS" --model qwen2-27m --set env.name=calculator "${SMALL[@]}"
for run in $(seq "$RUNS"); do
  for n in "${MP[@]}"; do
    validate "nproc$n-calculator-run$run" "$MP_STEPS" --nproc "$n" --set env.name=calculator "${SMALL[@]}"
  done
done
for n in "${HELD[@]}"; do  # about a minute each: 4 scored steps of seconds-long training steps
  validate "heldout-nproc$n" "$STEPS" --nproc "$n" --model qwen2-27m --set env.name=calculator "${SMALL[@]}"
done
{ load "bench_dispatch ${DISPATCH[*]}"; "$PY" benchmarks/bench_dispatch.py --profile "$PROFILE_PATH" "${DISPATCH[@]}"; } \
  2>&1 | tee "$OUT_DIR/dispatch.txt"
# the multi-process scorecard: per run and stage the median per-step error, the level-fitted
# error and the summed ratio, then the count within 25% (studies/cpu_fidelity_scorecard.py)
if ls "$OUT_DIR"/nproc*/validation.json >/dev/null 2>&1; then
  "$PY" "$(dirname "$0")/cpu_fidelity_scorecard.py" "$OUT_DIR" | tee "$OUT_DIR/scorecard.txt"
fi
if ls "$OUT_DIR"/heldout-nproc*/validation.json >/dev/null 2>&1; then
  "$PY" "$(dirname "$0")/cpu_fidelity_scorecard.py" --runs heldout-nproc "$OUT_DIR" | tee "$OUT_DIR/scorecard-heldout.txt"
fi
if ls "$OUT_DIR"/model-*/validation.json >/dev/null 2>&1; then  # ... and its one-process runs
  "$PY" "$(dirname "$0")/cpu_fidelity_scorecard.py" --runs model "$OUT_DIR" | tee "$OUT_DIR/scorecard-model.txt"
fi
# keep what is worth committing: the random checkpoints' weights and the runs' HF exports are
# rebuilt on demand; a checkpoint's config.json stays (`earl validate --rescore` prices its shape)
find "$OUT_DIR" -path '*/model/*' -type f ! -name config.json -delete
rm -rf "$OUT_DIR"/*/runs/*/hf
load "all done" | tee -a "$OUT_DIR/dispatch.txt"
