# Call 3 (on the machine call 2 left warm): rung wgmma at the tile an untuned call takes at
# 4096^3 (128x256), FP16 and BF16, with B copied K-major before the kernel (the default then,
# BCOPY=1) and read N-major (BCOPY=2), alternating twice. Call 2 had compared the two at
# 128x128 only (--params replaces the fitted tile). Its output is in call3-run.log.
export PYTHONPATH=$PWD/src TILEGEMM_CACHE_DIR=/tmp/tc
for p in "" "--params BN=256,BCOPY=2" "" "--params BN=256,BCOPY=2"; do
  timeout 40 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --modes float16 bfloat16 \
    --no-triton $p 2>&1 | grep -E "TFLOP|rror"
done
