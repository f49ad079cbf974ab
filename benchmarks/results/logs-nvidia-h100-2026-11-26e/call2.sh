# Call 2 of the 2026-11-26 (evening) H100 visit: the A/B of the NumPy-array copies, then
# rung wgmma's FP16 and BF16 at 4096^3 twice (call 1 had FP16 at 0.56 of cuBLAS, 0.71 before).
set -u
D=benchmarks/results/logs-nvidia-h100-2026-11-26e
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
unset NVIDIA_TF32_OVERRIDE
q() { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
q > $OUT/gpu-state.log
git log -1 --format='commit %H' >> $OUT/gpu-state.log 2>/dev/null
timeout 170 python3 $D/copies_probe.py > $OUT/copies.log 2>&1; echo "probe: exit $?"
for i in 1 2; do
  timeout 90 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 \
      --modes float16 bfloat16 --no-triton >> $OUT/tensor-half.log 2>&1
  echo "tensor $i: exit $?"; q >> $OUT/gpu-state.log
done
cat $OUT/copies.log | grep -v Warning | grep -v "warn("
grep -E "TFLOP" $OUT/tensor-half.log; cat $OUT/gpu-state.log
