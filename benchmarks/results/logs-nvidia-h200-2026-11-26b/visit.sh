#!/usr/bin/env bash
# One call on the lent GPU (2026-11-26, second session): rung wgmma with BCOPY=1.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
unset NVIDIA_TF32_OVERRIDE
O=${OUT:-/tmp/out}; mkdir -p "$O"
D=benchmarks/results/logs-nvidia-h200-2026-11-26b
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.limit --format=csv
  python3 -c "import sys, numba, numba_cuda, torch, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null; git status --short | head -20; lscpu | grep 'Model name'; } > "$O/info.log" 2>&1
t0=$(date +%s)
TILEGEMM_GPU_TESTS=1 timeout -k 5 170 python3 -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_wgmma_rung.py > "$O/tests.log" 2>&1; echo "tests: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$O/tests.log" | tail -12
t0=$(date +%s)
timeout -k 5 150 python3 $D/kmajor_probe.py 4096 4,6 > "$O/probe.log" 2>&1; echo "probe: exit $? ($(( $(date +%s) - t0 )) s)"
cat "$O/probe.log" | grep -v Warning | tail -20
t0=$(date +%s)
timeout -k 5 110 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  --params BCOPY=1 > "$O/tensor-bcopy1.log" 2>&1; echo "tensor BCOPY=1: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "TFLOP|FAILED|target" "$O/tensor-bcopy1.log"
t0=$(date +%s)
timeout -k 5 70 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  --modes tf32 bfloat16 > "$O/tensor-bcopy0.log" 2>&1; echo "tensor BCOPY=0: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "TFLOP|FAILED|target" "$O/tensor-bcopy0.log"
sections="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
timeout -k 5 40 ncu --clock-control none --kernel-name "regex:^wgmma_" --launch-skip 1 --launch-count 1 $sections \
  python3 benchmarks/ncu_rung.py --kernel wgmma --dtype float32 --precision tf32 --params BCOPY=1 > "$O/ncu-wgmma-tf32-bcopy1.txt" 2>&1
echo "ncu: exit $?"
grep -E "Duration|Compute \(SM\) Throughput|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Memory Throughput|==WARNING== No kernels" "$O/ncu-wgmma-tf32-bcopy1.txt"
