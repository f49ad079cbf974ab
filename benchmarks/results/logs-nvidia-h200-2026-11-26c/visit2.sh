#!/usr/bin/env bash
# Second call (2026-11-26, third session): wgmma's larger tiles, now what an untuned call
# runs for large products: the rung's tests on the GPU (the larger tiles on odd shapes in
# every dtype), the 4096³ targets with the fitted tiles, and the tile choice by shape.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
unset NVIDIA_TF32_OVERRIDE
O=${OUT:-/tmp/out}; mkdir -p "$O"
D=benchmarks/results/logs-nvidia-h200-2026-11-26c
t0=$(date +%s)
TILEGEMM_GPU_TESTS=1 timeout -k 5 90 python3 -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_wgmma_rung.py > "$O/tests2.log" 2>&1; echo "tests: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$O/tests2.log" | tail -12
t0=$(date +%s)
timeout -k 5 70 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
  > "$O/tensor2.log" 2>&1; echo "tensor: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "TFLOP|FAILED|target" "$O/tensor2.log"
t0=$(date +%s)
timeout -k 5 130 python3 $D/shapes_probe.py.txt > "$O/shapes.log" 2>&1; echo "shapes: exit $? ($(( $(date +%s) - t0 )) s)"
grep -v Warn "$O/shapes.log" | tail -16
