#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_END=$(( $(date +%s) + ${STEP_SECONDS:-470} ))
limit() { local left=$(( STEP_END - $(date +%s) )) want=$1
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi; }
part() { local label=$1 t log=$3; t=$(limit "$2"); shift 3
  if [ "$t" -eq 0 ]; then echo "$label: skipped"; return 0; fi
  local s=$(date +%s); timeout -k 5 "$t" "$@" >> "$log" 2>&1; local rc=$?
  echo "$label: exit $rc after $(( $(date +%s) - s )) s"; }
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
unset NVIDIA_TF32_OVERRIDE CUPY_TF32
PY=python3
part "diag interior" 150 "$OUT/diag.log" $PY gpu-plan/diag.py
part "tf32 vs cuBLAS TF32 (mma, wgmma)" 130 "$OUT/tensor-tf32.log" bash -c "$PY benchmarks/tensor_cores.py --sizes 4096 --no-triton --modes tf32; $PY benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton --modes tf32"
TILEGEMM_GPU_TESTS=1 part "wgmma tests -rs" 80 "$OUT/wgmma-tests.log" $PY -m pytest -q -n 16 -p no:cacheprovider -rs -W ignore --timeout 70 -m "cudasim or gpu" tests/test_wgmma.py tests/test_wgmma_rung.py
part "errors" 150 "$OUT/tensor-errors.log" $PY benchmarks/tensor_core_errors.py --k 256 1024 4096 --mn 1024 --json "$OUT/tensor-core-errors-gpu.json"
echo "== diag"; cat "$OUT/diag.log" | grep -v Warning | tail -25
echo "== tf32"; grep -E "TFLOP|FAILED|target" "$OUT/tensor-tf32.log"
echo "== wgmma tests"; grep -E "SKIPPED|passed|failed" "$OUT/wgmma-tests.log" | cut -c1-200 | tail -20
echo "== errors"; tail -15 "$OUT/tensor-errors.log"
