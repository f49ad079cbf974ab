# Call 3: rung wgmma's 16-bit products at 4096^3 with and without B's copy, beside cuBLAS,
# in rounds (half_probe.py.txt); two processes for FP16, one for BF16.
set -u
D=benchmarks/results/logs-nvidia-h100-2026-11-26e
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
cp $D/half_probe.py.txt /tmp/half_probe.py
q() { nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
for dt in ${DTYPES:-float16 float16 bfloat16}; do
  q >> $OUT/half.log
  echo "== $dt" >> $OUT/half.log
  timeout 100 python3 /tmp/half_probe.py --dtype $dt >> $OUT/half.log 2>&1; echo "$dt: exit $?"
done
q >> $OUT/half.log
grep -v -i "warn" $OUT/half.log
