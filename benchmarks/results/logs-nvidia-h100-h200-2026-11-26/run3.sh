#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_END=$(( $(date +%s) + ${STEP_SECONDS:-200} ))
limit() { local left=$(( STEP_END - $(date +%s) )) want=$1
  if [ "$left" -lt 15 ]; then echo 0; elif [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi; }
part() { local label=$1 t log=$3; t=$(limit "$2"); shift 3
  if [ "$t" -eq 0 ]; then echo "$label: skipped"; return 0; fi
  local s=$(date +%s); timeout -k 5 "$t" "$@" >> "$log" 2>&1; local rc=$?
  echo "$label: exit $rc after $(( $(date +%s) - s )) s"; }
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
unset NVIDIA_TF32_OVERRIDE CUPY_TF32
PY=python3
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $(cat gpu-plan/commit)"
for pr in 1 2 0 4; do
  part "wgmma 3xtf32 PROMOTE=$pr" 45 "$OUT/promote.log" $PY benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton --modes 3xtf32 --params PROMOTE=$pr
done
TILEGEMM_GPU_TESTS=1 part "tensor-core tests" 100 "$OUT/gpu-tests.log" $PY -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore --timeout 90 -m "cudasim or gpu" tests/test_wgmma.py tests/test_wgmma_rung.py tests/test_cuda_mma.py tests/test_cuda_mma_store.py tests/test_cuda_tensorcore.py
echo "== promote"; grep -E "TFLOP|FAILED|target|Error" "$OUT/promote.log"
echo "== tests"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout" "$OUT/gpu-tests.log" | tail -20
