# Call 1 of the 2026-11-26 (night) H100 visit: the direct launches (backends/cuda_launch:
# the driver's cuLaunchKernel once numba has launched a key; backends/cuda_direct:
# repeated plain calls on CuPy/PyTorch arrays on views of their memory) checked on the
# hardware, then the host's time per call with them and without them (numba's launch).
set -u
D=benchmarks/results/logs-nvidia-h100-2026-11-26f
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
export CUPY_TF32=0
q() { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
{ q; python3 -c "import sys, numba, numba_cuda, cupy, torch, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"; lscpu | grep -E "Model name|^CPU\(s\)"; } > $OUT/info.log 2>&1
TILEGEMM_GPU_TESTS=1 NVIDIA_TF32_OVERRIDE=0 timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_cuda_interop.py tests/test_cuda_kmajor.py tests/test_cuda_splitk.py \
  tests/test_wgmma.py tests/test_cuda_staging.py tests/test_fastpath_device.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests: exit $?"
timeout 110 python3 benchmarks/gpu_smoke.py > $OUT/smoke.log 2>&1; echo "smoke: exit $?"
timeout 130 python3 benchmarks/host_overhead.py --sizes 1024 4096 --modes tf32 float16 bfloat16 > $OUT/host.log 2>&1
echo "host overhead: exit $?"
timeout 60 python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --modes float16 bfloat16 tf32 --no-triton > $OUT/tensor.log 2>&1
echo "tensor: exit $?"; q >> $OUT/info.log
grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests.log | tail -8
grep -E "^(FAIL|[0-9]+ failed)|checks" $OUT/smoke.log | tail -5
grep -E "\^3|needs|Error" $OUT/host.log
grep -E "TFLOP|Error" $OUT/tensor.log
