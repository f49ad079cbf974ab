#!/usr/bin/env bash
# 2026-11-26: tensor-core targets (issue 17) and the tensor-core tests on the hardware, in one call
set -uo pipefail
cd "$(dirname "$0")/.."
STEP_END=$(( $(date +%s) + ${STEP_SECONDS:-540} ))
limit() { local left=$(( STEP_END - $(date +%s) )) want=$1
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi; }
part() { local label=$1 t log=$3; t=$(limit "$2"); shift 3
  if [ "$t" -eq 0 ]; then echo "$label: skipped"; return 0; fi
  local s=$(date +%s); timeout -k 5 "$t" "$@" >> "$log" 2>&1; local rc=$?
  echo "$label: exit $rc after $(( $(date +%s) - s )) s"; }
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0 NVIDIA_TF32_OVERRIDE=0
PY=python3
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.limit --format=csv
  $PY -c "import sys, numba, numba_cuda, cupy, torch, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
  lscpu | grep 'Model name'; echo "commit $(cat gpu-plan/commit)"; } > "$OUT/info.log" 2>&1
cat "$OUT/info.log"
part "mma 4096" 170 "$OUT/tensor.log" $PY benchmarks/tensor_cores.py --sizes 4096 --no-triton --modes tf32 3xtf32 bfloat16 float16
part "wgmma 4096" 150 "$OUT/tensor.log" $PY benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton --modes tf32 3xtf32 bfloat16 float16
TILEGEMM_GPU_TESTS=1 part "tensor-core tests" 230 "$OUT/gpu-tests.log" $PY -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore --timeout 150 -m "cudasim or gpu" tests/test_wgmma.py tests/test_wgmma_rung.py tests/test_cuda_mma.py tests/test_cuda_mma_store.py tests/test_cuda_tensorcore.py
echo "== tensor"; grep -vE '^\s*$' "$OUT/tensor.log" | tail -30
echo "== tests"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout" "$OUT/gpu-tests.log" | tail -30
