# Call 2: compute-sanitizer (memcheck, racecheck) on rungs 5-9, at the odd shapes and at two
# where an operand is copied into the kernel's layout with rows padded (65x2049x67: A;
# 2049x65x67: B); then rung wgmma's 16-bit default (BCOPY=1, B copied K-major) against
# BCOPY=2 (B read N-major, no copy) alternating in one run; then whether copying pays
# below the 2048 multiply-adds per element of FFMA_MIN_REUSE (batched 1024^3 and 512^3,
# so that the GPU's time, not the host's call, is measured).
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
export CUPY_TF32=0
END=$(( $(date +%s) + ${STEP_SECONDS:-320} ))
lim() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo $(( l > 0 ? l : 1 )) || echo "$1"; }
R=$OUT/run.log
git log -1 --format='commit %H %s' > $R
K="--kernel register2d --kernel vectorized --kernel smem_layout --kernel warptile --kernel pipelined"
S="--shape 257 129 65 --shape 257 128 64 --shape 65 2049 67 --shape 2049 65 67"
for tool in memcheck racecheck; do
  timeout $(lim 150) compute-sanitizer --tool $tool --error-exitcode 3 python3 benchmarks/gpu_sanitize.py $K $S \
    > $OUT/$tool.log 2>&1 &
done
wait
for tool in memcheck racecheck; do echo "== $tool"; grep -E "ERROR SUMMARY|^FAIL|failed" $OUT/$tool.log | tail -5; grep -c "^ok" $OUT/$tool.log; done
echo "== wgmma BCOPY=1 / 2 alternating" >> $R
for p in BCOPY=1 BCOPY=2 BCOPY=1 BCOPY=2; do
  timeout $(lim 30) python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --modes float16 bfloat16 \
    --no-triton --params $p >> $R 2>&1; echo "$p: exit $?"
done
echo "== layouts below the threshold" >> $R
timeout $(lim 50) python3 benchmarks/operand_layouts.py --sizes 1024 --batch 64 >> $R 2>&1; echo "layouts 1024: exit $?"
timeout $(lim 40) python3 benchmarks/operand_layouts.py --sizes 512 --batch 512 --layouts A.T B.T >> $R 2>&1; echo "layouts 512: exit $?"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> $R
grep -E "TFLOP|ms per|^ +[0-9]+ +[A-Z]|FAIL|Error|commit" $R
