# Call 1 of the 2026-11-27 H200 visit: the changes to rungs 6-9 since the last hardware run
# (operands copied into the kernel's layout, vector paths at any K and N, rung 9's edge
# stage) checked on the GPU, then the FP32 ladder at 4096^3 against cuBLAS (first timing
# since 2026-11-23), whether the copies repay themselves (benchmarks/operand_layouts.py),
# kernel="auto" over the eight target shapes, and rung wgmma's 16-bit B read N-major.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TILEGEMM_CACHE_DIR=/tmp/tilegemm-cache
export CUPY_TF32=0 NVIDIA_TF32_OVERRIDE=0
END=$(( $(date +%s) + ${STEP_SECONDS:-540} ))
lim() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo $(( l > 0 ? l : 1 )) || echo "$1"; }
R=$OUT/run.log
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader
  python3 -c "import sys, numba, numba_cuda, cupy, torch, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
  lscpu | grep -E "Model name|^CPU\(s\)"; git log -1 --format='commit %H %s'; } > $R 2>&1
timeout $(lim 160) python3 benchmarks/gpu_smoke.py > $OUT/smoke.log 2>&1 &
TILEGEMM_GPU_TESTS=1 timeout $(lim 160) python3 -m pytest -q -n 14 -p no:cacheprovider -rf -W ignore \
  -m "cudasim or gpu" tests/test_cuda_row_major_copies.py tests/test_cuda_splitk.py tests/test_wgmma_rung.py \
  "tests/test_cuda_rungs.py" -k "not (naive or coalesced or register1d or shared-float or shared] or shared-)" > $OUT/gpu-tests.log 2>&1
echo "gpu tests: exit $?"; wait; echo "smoke done"
echo "== ladder" >> $R
timeout $(lim 150) python3 -m tilegemm.cli bench --reports ladder --ladder-sizes 4096 --backend cuda \
  --no-rivals --save $OUT >> $R 2>&1; echo "ladder: exit $?"
echo "== layouts" >> $R
timeout $(lim 100) python3 benchmarks/operand_layouts.py --sizes 4096 4097 2048 >> $R 2>&1; echo "layouts: exit $?"
echo "== targets auto" >> $R
timeout $(lim 110) python3 benchmarks/perf_targets.py --auto --no-triton --json $OUT/targets-auto.json >> $R 2>&1
echo "targets: exit $?"
echo "== wgmma BCOPY=2" >> $R
env -u NVIDIA_TF32_OVERRIDE timeout $(lim 50) python3 benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 \
  --modes float16 bfloat16 --no-triton --params BCOPY=2 >> $R 2>&1; echo "bcopy2: exit $?"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> $R
grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests.log | tail -12
grep -c "^ok" $OUT/smoke.log; grep -E "^(FAIL|[0-9]+ failed)" $OUT/smoke.log | tail -5
sed -n '/== ladder/,$p' $R | grep -v -E "^\s*$" | tail -60
