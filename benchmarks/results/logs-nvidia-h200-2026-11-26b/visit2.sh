#!/usr/bin/env bash
# Second call (2026-11-26, second session): ROUND=0, the transpose's cost, ncu of BCOPY=1.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
unset NVIDIA_TF32_OVERRIDE
O=${OUT:-/tmp/out}; mkdir -p "$O"
D=benchmarks/results/logs-nvidia-h200-2026-11-26b
t0=$(date +%s)
TILEGEMM_GPU_TESTS=1 timeout -k 5 120 python3 -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_wgmma_rung.py > "$O/tests2.log" 2>&1; echo "tests: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$O/tests2.log" | tail -12
t0=$(date +%s)
timeout -k 5 120 python3 $D/kmajor_probe2.py > "$O/probe2.log" 2>&1; echo "probe2: exit $? ($(( $(date +%s) - t0 )) s)"
grep -v Warn "$O/probe2.log" | tail -12
t0=$(date +%s)
timeout -k 5 60 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  --modes tf32 --params BCOPY=1,ROUND=0 > "$O/tensor-round0.log" 2>&1
timeout -k 5 50 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  --modes tf32 --params BCOPY=0,ROUND=0 >> "$O/tensor-round0.log" 2>&1; echo "tensor ROUND=0: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "TFLOP|FAILED|target" "$O/tensor-round0.log"
sections="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
for run in "float32 tf32 BCOPY=1,ROUND=0" "bfloat16 - BCOPY=1"; do
  set -- $run
  prec=$([ "$2" = - ] && echo "" || echo "--precision $2")
  timeout -k 5 40 ncu --clock-control none --kernel-name "regex:^wgmma_" --launch-skip 1 --launch-count 1 $sections \
    python3 benchmarks/ncu_rung.py --kernel wgmma --dtype $1 $prec --params $3 > "$O/ncu-wgmma-$1-$3.txt" 2>&1
  echo "ncu $1 $3: exit $?"
  grep -E "Duration|Compute \(SM\) Throughput|L1/TEX Cache Throughput|No Eligible|Warp Cycles Per Issued|==WARNING== No kernels" "$O/ncu-wgmma-$1-$3.txt"
done
