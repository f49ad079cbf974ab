#!/usr/bin/env bash
# One call on the lent GPU (2026-11-26, third session): the short visit (cut at 295 s: smoke test with the
# BCOPY=1 defaults, tensor-core tests, wgmma against cuBLAS), then wgmma by block tile.
set -u
cd "$(dirname "$0")/../../.."
D=benchmarks/results/logs-nvidia-h200-2026-11-26c
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
STEP_SECONDS=295 bash benchmarks/gpu_run.sh visit; echo "visit: exit $? ($(( $(date +%s) - t0 )) s)"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
unset NVIDIA_TF32_OVERRIDE
t0=$(date +%s)
timeout -k 5 150 python3 $D/tiles_probe.py.txt 4096 > "$O/tiles.log" 2>&1; echo "tiles: exit $? ($(( $(date +%s) - t0 )) s)"
grep -v Warn "$O/tiles.log" | tail -24
