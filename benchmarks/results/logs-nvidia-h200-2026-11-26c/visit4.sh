#!/usr/bin/env bash
# Fourth call (2026-11-26, third session): launches through numba's compiled overload
# (backends/cuda_launch.py). The smoke test runs every rung six times through matmul on
# numba, CuPy and PyTorch arrays, each result checked (the first launch of each argument
# type is numba's own, the next ones the direct call); then the host's time per call.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
unset NVIDIA_TF32_OVERRIDE
O=${OUT:-/tmp/out}; mkdir -p "$O"
D=benchmarks/results/logs-nvidia-h200-2026-11-26c
t0=$(date +%s)
timeout -k 5 45 python3 $D/host_probe.py.txt > "$O/host-direct.log" 2>&1; echo "host: exit $? ($(( $(date +%s) - t0 )) s)"
grep -v Warn "$O/host-direct.log" | tail -6
for f in "$O"/profile-*.txt; do mv "$f" "${f%.txt}-direct.txt"; done
t0=$(date +%s)
timeout -k 5 110 python3 benchmarks/gpu_smoke.py > "$O/smoke-direct.log" 2>&1; echo "smoke: exit $? ($(( $(date +%s) - t0 )) s)"
grep -E "^FAIL|failed" "$O/smoke-direct.log" | head -20
