#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
unset NVIDIA_TF32_OVERRIDE CUPY_TF32
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $(git rev-parse HEAD 2>/dev/null || cat gpu-plan/commit)"
timeout 45 python3 gpu-plan/auto.py > "$OUT/auto.log" 2>&1; echo "auto: exit $?"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
timeout 50 ncu --clock-control none --kernel-name regex:wgmma_float32 --launch-skip 1 --launch-count 1 $S python3 gpu-plan/prof.py wgmma float32 > "$OUT/ncu-wgmma-tf32.txt" 2>&1; echo "ncu wgmma tf32: exit $?"
timeout 45 ncu --clock-control none --kernel-name regex:[^gw]mma_float32 --launch-skip 1 --launch-count 1 $S python3 gpu-plan/prof.py mma float32 > "$OUT/ncu-mma-tf32.txt" 2>&1; echo "ncu mma tf32: exit $?"
timeout 45 ncu --clock-control none --kernel-name regex:wgmma_bfloat16 --launch-skip 1 --launch-count 1 $S python3 gpu-plan/prof.py wgmma bfloat16 > "$OUT/ncu-wgmma-bf16.txt" 2>&1; echo "ncu wgmma bf16: exit $?"
echo "== auto"; grep -v Warn "$OUT/auto.log" | tail -8
for f in "$OUT"/ncu-*.txt; do echo "== $f"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|==ERR|==WARN|error" "$f" | head -16; done
