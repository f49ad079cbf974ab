# the staging change on the hardware: its tests, the small-call probe, the smoke test, small calls
export PYTHONPATH=$PWD/src TILEGEMM_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %H' ; git status --short
TILEGEMM_GPU_TESTS=1 timeout 60 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_cuda_staging.py > $OUT/staging-tests.log 2>&1; echo "staging tests: exit $?"; tail -3 $OUT/staging-tests.log
timeout 50 python3 benchmarks/probes/small_probe.py > $OUT/small-probe.log 2>&1; echo "probe: exit $?"; grep "\^3" $OUT/small-probe.log
timeout 110 python3 benchmarks/gpu_smoke.py > $OUT/smoke.log 2>&1; echo "smoke: exit $?"; grep -E "^(FAIL|[0-9]+ failed)" $OUT/smoke.log
timeout 60 python3 benchmarks/small_calls.py --backends cuda --out $OUT/small-calls-gpu.json > $OUT/small-calls.log 2>&1; echo "small calls: exit $?"; grep "per call" $OUT/small-calls.log | grep -v torch | head -20
