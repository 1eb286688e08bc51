#!/usr/bin/env bash
# GPU check: the `gpu` tests, the engine's decode throughput against the HBM roofline,
# calibration of one GPU (GEMMs, attention, memory bandwidth, the runtime's host costs) and
# `earl validate` (the simulator vs the runtime on a random-initialised model of a real shape,
# Qwen2.5-1.5B). Everything lands in one folder: $OUT if set, else ./gpu_check.
#
# At most DEADLINE_S (default 480 s = 8 minutes) on one H200: the phases run in the order of what a
# GPU session most needs measured, each under `timeout` at the smaller of its own cap and the time
# left before the deadline (a phase with under 10 s left is skipped and makes the status 1), and
# `timings.txt` records each phase's seconds, limit and exit code. The benchmarks print a row as
# soon as it is measured, so a phase cut short keeps the rows it finished. Caps (s): compiled
# decode, Qwen2.5-0.5B shape 90 / Qwen2.5-7B shape at batch 1 70; eager decode 30; gpu tests 100;
# calibration 2 x BUDGET + 25 (BUDGET 25 s of measuring); validation 100 (2 variants x 3 steps).
# PROFILE=NAME|PATH skips calibration and validates with that profile. The CPU path
# (DEVICE=cpu QUICK=1) is what the tests run.
#
#   bash studies/gpu_check.sh                        # on a CUDA machine
#   PROFILE=h200-measured bash studies/gpu_check.sh  # re-check with the shipped profile
#   DEVICE=cpu QUICK=1 OUT=/tmp/gc bash studies/gpu_check.sh   # ~40 s CPU smoke run
set -euo pipefail

OUT_DIR="${OUT:-./gpu_check}"
DEVICE="${DEVICE:-cuda}"
QUICK="${QUICK:-0}"
DEADLINE_S="${DEADLINE_S:-480}"
if [ "$QUICK" = 1 ]; then
  BUDGET="${BUDGET:-8}"; MODEL="${MODEL:-tiny}"; STEPS="${STEPS:-2}"; VALIDATE_CAP=240
  WORKLOAD=(--set groups=2 --set group_size=2); VARIANTS="engine_batch=0;engine_batch=1"
else
  BUDGET="${BUDGET:-25}"; MODEL="${MODEL:-qwen2.5-1.5b}"; STEPS="${STEPS:-3}"; VALIDATE_CAP=100
  WORKLOAD=(--set groups=4 --set group_size=8 --set env.name=calculator)
  VARIANTS="engine_batch=0;engine_batch=16"
fi
PY="${PYTHON:-python3}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT_DIR"
TIMINGS="$OUT_DIR/timings.txt"
: > "$TIMINGS"
START=$SECONDS
status=0

# phase NAME CAP LOG CMD...: CMD under `timeout` at min(CAP, seconds left before the deadline),
# its output shown and kept in LOG; the phase's seconds, limit and exit code go to timings.txt
phase() {
  local name=$1 cap=$2 log=$3 left limit t0 rc=0
  shift 3
  left=$((DEADLINE_S - (SECONDS - START)))
  limit=$((cap < left ? cap : left))
  if [ "$limit" -lt 10 ]; then
    echo "$name: skipped, ${left} s left of the ${DEADLINE_S} s deadline" | tee -a "$TIMINGS" "$log"
    status=1
    return 0
  fi
  t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log" || rc=$?
  echo "$name: $((SECONDS - t0)) s (limit ${limit} s) exit ${rc}" >> "$TIMINGS"
  [ "$rc" = 0 ] || status=1
  return 0
}

{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  device: $DEVICE  quick: $QUICK  deadline: ${DEADLINE_S} s"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no gpu')"
  "$PY" -c "import typer, rich, scipy, simpy, transformers; print('modules ok: transformers', transformers.__version__)"
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; fi
} > "$OUT_DIR/env.txt" 2>&1 || status=1
cat "$OUT_DIR/env.txt"

ROOF=("$PY" benchmarks/bench_decode_roofline.py)
# 0. decode against the roofline: compiled first (forward + sampling in CUDA graphs, 8 decode
# steps per host sync: never measured on a GPU before), then a model big enough that its weights,
# not kernel launches, bound a batch-1 step, then eager (1 and 8 steps per sync), then the tests
if [ "$DEVICE" = cuda ]; then
  phase decode-compiled 90 "$OUT_DIR/decode-compiled.txt" \
    "${ROOF[@]}" --model qwen2.5-0.5b --device cuda --compile on --decode-steps 8 --batches 1,16,64
  phase decode-compiled-7b 70 "$OUT_DIR/decode-compiled-7b.txt" \
    "${ROOF[@]}" --model qwen2.5-7b --device cuda --compile on --decode-steps 8 --batches 1
  phase decode-eager 30 "$OUT_DIR/decode.txt" \
    "${ROOF[@]}" --model qwen2.5-0.5b --device cuda --decode-steps 1,8 --batches 1,16
  phase gpu-tests 100 "$OUT_DIR/gpu-tests.log" "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/gpu
else
  phase decode-compiled 180 "$OUT_DIR/decode-compiled.txt" \
    "${ROOF[@]}" --model tiny --device cpu --dtype fp32 --new 8 --batches 1 --compile on --decode-steps 8
  phase decode-eager 120 "$OUT_DIR/decode.txt" \
    "${ROOF[@]}" --model tiny --device cpu --dtype fp32 --new 8 --batches 1,4 --decode-steps 1,8
fi

# 1. calibration (collectives need 2+ GPUs: a one-GPU machine keeps the datasheet link)
if [ -n "${PROFILE:-}" ]; then
  PROFILE_PATH="$PROFILE"
  echo "calibration skipped: validating with the profile $PROFILE" | tee "$OUT_DIR/calibrate.log"
else
  PROFILE_PATH="$OUT_DIR/profile-$DEVICE.json"
  phase calibrate $((BUDGET * 2 + 25)) "$OUT_DIR/calibrate.log" \
    "$PY" -m earl.cli calibrate --device "$DEVICE" --budget-s "$BUDGET" \
    --phases matmul,attention,memory,overhead,runtime --out "$PROFILE_PATH" \
    --measurements "$OUT_DIR/measurements-$DEVICE.json"
fi

# 2. validation against the runtime, with the profile just measured (no checkpoints: weights and
# fp32 optimizer states of a 1.5B model would fill the disk)
phase validate "$VALIDATE_CAP" "$OUT_DIR/validate.log" \
  "$PY" -m earl.cli validate --device "$DEVICE" --model "$MODEL" \
  --steps "$STEPS" --hardware "$PROFILE_PATH" --out "$OUT_DIR/validate" \
  --variants "$VARIANTS" "${WORKLOAD[@]}"
rm -rf "$OUT_DIR/validate/model" "$OUT_DIR"/validate/runs/*/checkpoints "$OUT_DIR"/validate/runs/*/hf  # weights

echo "total: $((SECONDS - START)) s of the ${DEADLINE_S} s deadline" >> "$TIMINGS"
cat "$TIMINGS"
echo "gpu_check finished with status $status; results in $OUT_DIR"
ls -la "$OUT_DIR"
exit "$status"
