#!/usr/bin/env bash
# GPU check: the `gpu` tests, the engine's decode throughput against the HBM roofline,
# calibration of one GPU (GEMMs, attention, memory bandwidth, the runtime's host costs) and
# `earl validate` (the simulator vs the runtime on a random-initialised model of a real shape,
# Qwen2.5-1.5B). Everything lands in one folder: $OUT if set, else ./gpu_check. Sized for about
# 10 minutes on one H200 (tests ~3 min, decode ~1 min eager + ~2 min compiled, calibration
# BUDGET s of measuring, then 3 config variants x 3 runtime steps of the calculator env); PROFILE=NAME|PATH skips calibration
# and validates with that profile. The CPU path (DEVICE=cpu QUICK=1) is what the tests run.
#
#   bash studies/gpu_check.sh                        # on a CUDA machine
#   PROFILE=h200-measured bash studies/gpu_check.sh  # re-check with the shipped profile
#   DEVICE=cpu QUICK=1 OUT=/tmp/gc bash studies/gpu_check.sh   # ~30 s CPU smoke run
set -euo pipefail

OUT_DIR="${OUT:-./gpu_check}"
DEVICE="${DEVICE:-cuda}"
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  BUDGET="${BUDGET:-8}"; MODEL="${MODEL:-tiny}"; STEPS="${STEPS:-2}"; VALIDATE_LIMIT=240
  WORKLOAD=(--set groups=2 --set group_size=2); VARIANTS="engine_batch=0;engine_batch=1"
else
  BUDGET="${BUDGET:-120}"; MODEL="${MODEL:-qwen2.5-1.5b}"; STEPS="${STEPS:-3}"; VALIDATE_LIMIT=200
  WORKLOAD=(--set groups=4 --set group_size=8 --set env.name=calculator)
  VARIANTS="engine_batch=0;engine_batch=16;engine_batch=8"
fi
PY="${PYTHON:-python3}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT_DIR"
status=0

{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  device: $DEVICE  quick: $QUICK"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no gpu')"
  "$PY" -c "import typer, rich, scipy, simpy, transformers; print('modules ok: transformers', transformers.__version__)"
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; fi
} > "$OUT_DIR/env.txt" 2>&1 || status=1
cat "$OUT_DIR/env.txt"

# 0. the gpu-marked tests (they skip without CUDA) and the decode roofline
if [ "$DEVICE" = cuda ]; then
  timeout 330 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT_DIR/gpu-tests.log" || status=1
  # eager (1 and 8 decode steps per host sync), then compiled (CUDA graphs) in its own run, so a
  # compile failure keeps the eager numbers
  timeout 120 "$PY" benchmarks/bench_decode_roofline.py --model qwen2.5-0.5b --device cuda --decode-steps 1,8 \
    2>&1 | tee "$OUT_DIR/decode.txt" || status=1
  timeout 200 "$PY" benchmarks/bench_decode_roofline.py --model qwen2.5-0.5b --device cuda --compile on \
    --decode-steps 8 2>&1 | tee "$OUT_DIR/decode-compiled.txt" || status=1
else
  timeout 120 "$PY" benchmarks/bench_decode_roofline.py --model tiny --device cpu --dtype fp32 --new 8 \
    --batches 1,4 --decode-steps 1,8 2>&1 | tee "$OUT_DIR/decode.txt" || status=1
  timeout 180 "$PY" benchmarks/bench_decode_roofline.py --model tiny --device cpu --dtype fp32 --new 8 \
    --batches 1 --compile on --decode-steps 8 2>&1 | tee "$OUT_DIR/decode-compiled.txt" || status=1
fi

# 1. calibration (collectives need 2+ GPUs: a one-GPU machine keeps the datasheet link)
if [ -n "${PROFILE:-}" ]; then
  PROFILE_PATH="$PROFILE"
  echo "calibration skipped: validating with the profile $PROFILE" | tee "$OUT_DIR/calibrate.log"
else
  PROFILE_PATH="$OUT_DIR/profile-$DEVICE.json"
  timeout $((BUDGET * 2 + 90)) "$PY" -m earl.cli calibrate --device "$DEVICE" --budget-s "$BUDGET" \
    --phases matmul,attention,memory,overhead,runtime --out "$PROFILE_PATH" \
    --measurements "$OUT_DIR/measurements-$DEVICE.json" 2>&1 | tee "$OUT_DIR/calibrate.log" || status=1
fi

# 2. validation against the runtime, with the profile just measured
if "$PY" -m earl.cli validate --help >/dev/null 2>&1; then
  timeout "$VALIDATE_LIMIT" "$PY" -m earl.cli validate --device "$DEVICE" --model "$MODEL" \
    --steps "$STEPS" --hardware "$PROFILE_PATH" --out "$OUT_DIR/validate" \
    --variants "$VARIANTS" "${WORKLOAD[@]}" 2>&1 | tee "$OUT_DIR/validate.log" || status=1
  rm -rf "$OUT_DIR/validate/model" "$OUT_DIR"/validate/runs/*/checkpoints "$OUT_DIR"/validate/runs/*/hf  # weights
else
  echo "earl validate is not available in this checkout: validation skipped" | tee "$OUT_DIR/validate.log"
fi

echo "gpu_check finished with status $status; results in $OUT_DIR"
ls -la "$OUT_DIR"
exit "$status"
