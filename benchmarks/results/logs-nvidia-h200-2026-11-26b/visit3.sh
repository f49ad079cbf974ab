#!/usr/bin/env bash
# Third call (2026-11-26, second session): copies that round, ring depth, all modes.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
unset NVIDIA_TF32_OVERRIDE
O=${OUT:-/tmp/out}; mkdir -p "$O"
D=benchmarks/results/logs-nvidia-h200-2026-11-26b
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.limit --format=csv
  python3 -c "import sys, numba, numba_cuda, torch, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"; } > "$O/info3.log" 2>&1
t0=$(date +%s)
TILEGEMM_GPU_TESTS=1 timeout -k 5 100 python3 -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_wgmma_rung.py > "$O/tests3.log" 2>&1; echo "tests: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$O/tests3.log" | tail -12
t0=$(date +%s)
timeout -k 5 150 python3 $D/kmajor_probe3.py > "$O/probe3.log" 2>&1; echo "probe3: exit $? ($(( $(date +%s) - t0 )) s)"
grep -v Warn "$O/probe3.log" | tail -16
t0=$(date +%s)
timeout -k 5 70 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  --modes tf32 float16 bfloat16 --params BCOPY=1,STAGES=6 > "$O/tensor3.log" 2>&1
timeout -k 5 40 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  --modes 3xtf32 --params BCOPY=1 >> "$O/tensor3.log" 2>&1; echo "tensor: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "TFLOP|FAILED|target" "$O/tensor3.log"
