#!/usr/bin/env bash
# Third call (2026-11-26, third session): where a call's time goes below 4096³.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
unset NVIDIA_TF32_OVERRIDE
O=${OUT:-/tmp/out}; mkdir -p "$O"
D=benchmarks/results/logs-nvidia-h200-2026-11-26c
t0=$(date +%s)
timeout -k 5 140 python3 $D/host_probe.py.txt > "$O/host.log" 2>&1; echo "host: exit $? ($(( $(date +%s) - t0 )) s)"
grep -v Warn "$O/host.log" | tail -12
head -45 "$O/profile-launch.txt"
