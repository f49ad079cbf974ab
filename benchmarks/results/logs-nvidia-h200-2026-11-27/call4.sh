# Call 4 (call 3 was a one-line comparison: wgmma 128x256 at BCOPY=1 and BCOPY=2, FP16/BF16,
# alternating twice): the new defaults checked on the hardware, an untuned 16-bit wgmma
# product with B read N-major (BCOPY=2) and rungs 6-9 copying operands from 512
# multiply-adds per element copied (FFMA_MIN_REUSE 2048 -> 512): the wgmma and copy tests,
# the tensor-core timing at the defaults, and a batch of 1024^3 products on transposed
# operands (copied now by default).
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache CUPY_TF32=0
R=$OUT/run.log
git log -1 --format='commit %H %s' > $R
TILEGEMM_GPU_TESTS=1 NVIDIA_TF32_OVERRIDE=0 timeout 95 python3 -m pytest -q -n 14 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_wgmma_rung.py tests/test_cuda_row_major_copies.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests: exit $?"
timeout 50 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --modes float16 bfloat16 tf32 --no-triton >> $R 2>&1
echo "tensor: exit $?"
NVIDIA_TF32_OVERRIDE=0 timeout 30 python3 benchmarks/operand_layouts.py --sizes 1024 --batch 64 --layouts A.T B.T >> $R 2>&1
echo "layouts: exit $?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests.log | tail -8
grep -E "TFLOP|ms per|^ +[0-9]+ +[A-Z]|FAIL|Error" $R
