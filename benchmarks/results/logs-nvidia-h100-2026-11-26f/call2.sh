# Call 2: the two tests call 1 failed, fixed (a case remembered by an earlier test of the
# same layout; numba's .T copies on a GPU), the interop tests again, the whole smoke test
# (call 1's was cut at 110 s, 81 checks passed) beside them, then small products on CUDA.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
export CUPY_TF32=0
timeout 200 python3 benchmarks/gpu_smoke.py > $OUT/smoke.log 2>&1 &
TILEGEMM_GPU_TESTS=1 NVIDIA_TF32_OVERRIDE=0 timeout 150 python3 -m pytest -q -n 6 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_cuda_interop.py tests/test_fastpath_device.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests: exit $?"
wait; echo "smoke done"
timeout 90 python3 benchmarks/small_calls.py --backends cuda --dtypes float32 --sizes 8 64 256 --no-save > $OUT/small-calls.log 2>&1
echo "small calls: exit $?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests.log | tail -8
grep -c "^ok" $OUT/smoke.log; grep -E "^(FAIL|[0-9]+ failed)" $OUT/smoke.log | tail -5
grep -E "per call|µs|us" $OUT/small-calls.log | head -30
