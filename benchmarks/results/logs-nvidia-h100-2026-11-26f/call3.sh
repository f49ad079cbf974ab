# Call 3: the workspace's device found once per context (numba's query of the current
# device was on every wgmma call's K-major copy), the imports and np.prod out of the
# launch: the interop tests again, then the host's time per call at 16 bits and small calls.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
export CUPY_TF32=0
TILEGEMM_GPU_TESTS=1 NVIDIA_TF32_OVERRIDE=0 timeout 80 python3 -m pytest -q -n 6 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_cuda_interop.py tests/test_cuda_kmajor.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests: exit $?"
timeout 70 python3 benchmarks/host_overhead.py --sizes 1024 4096 --modes float16 bfloat16 > $OUT/host.log 2>&1
echo "host overhead: exit $?"
timeout 40 python3 benchmarks/small_calls.py --backends cuda --dtypes float32 --sizes 8 64 --no-save > $OUT/small-calls.log 2>&1
echo "small calls: exit $?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests.log | tail -8
grep -E "\^3|needs|Error" $OUT/host.log
grep -E "per call" $OUT/small-calls.log | head -12
