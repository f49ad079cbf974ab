#!/usr/bin/env bash
# The GPU runbook (docs/gpu-session.md) as a few long commands, for a lent GPU machine that
# has numba-cuda, CuPy and PyTorch in its system Python and no network:
#
#   bash benchmarks/gpu_run.sh check   # steps 0-2: what is there, smoke test, the GPU test
#                                      # run and compute-sanitizer (memcheck, racecheck) on
#                                      # every rung, the last three side by side (~9.5 min
#                                      # on the first H100 run; if it prints "gpu tests:
#                                      # exit 124", run the `tests` step for the rest)
#   bash benchmarks/gpu_run.sh bench   # step 3-4: the ladder against cuBLAS (bench --full)
#                                      # and the fast rungs over the eight target shapes
#   bash benchmarks/gpu_run.sh tests   # the GPU test run alone, on every core
#   bash benchmarks/gpu_run.sh tune    # step 4: tuning at 4096^3, then the targets tuned
#   bash benchmarks/gpu_run.sh tensor  # step 4, tensor cores at 4096^3: rung mma in TF32,
#                                      # 3xTF32, FP16 and BF16 against cuBLAS at the same
#                                      # precision; then rung wgmma (an H100 only) in the
#                                      # same four; then each mode's error against float64;
#                                      # then extras (a 96 KB ring, 2048^3) (~9 min)
#   bash benchmarks/gpu_run.sh rivals  # Triton's tutorial matmul (Python-authored) against
#                                      # the fastest rungs and cuBLAS: FP32 over the eight
#                                      # target shapes, TF32/FP16/BF16 at 4096^3 (~6 min)
#   bash benchmarks/gpu_run.sh small   # one small matmul per call on cuda, cudac and the
#                                      # CPU against NumPy and an empty kernel's launch
#   bash benchmarks/gpu_run.sh visit   # a short visit (STEP_SECONDS=400: ~6.5 minutes, room
#                                      # for a second call in a 15-minute lease): the smoke
#                                      # test (every rung once), the tensor-core, staging
#                                      # and interop tests on the GPU, small calls on CUDA,
#                                      # FP32 auto at 1000^3-1024^3 and 4097^3 (edge blocks
#                                      # or none; then with edge tiles shifted), mma and
#                                      # wgmma at 4096^3 in every precision against cuBLAS
#                                      # (and wgmma's 16-bit B copied K-major first,
#                                      # BCOPY=1), the host's time per call beside the
#                                      # GPU's (1024^3-4096^3), then Nsight
#                                      # Compute on one launch of each (wgmma TF32 and BF16,
#                                      # mma TF32)
#
# The other steps leave Triton out (--no-rivals, --no-triton): its first use compiles and
# autotunes 16 configurations per shape class, which their time limits were not set for.
#
# Logs and results go to $OUT (default ./gpu-out). Nothing here times two things at once:
# the check step runs its three correctness jobs together, the timing steps run alone.
#
# Each step ends within STEP_SECONDS (default 580, plus 5 s for a part to exit after its
# time is up): a lent machine runs one command for at most 600 s, and a command cut off
# there loses the parts it had not reached. Every part has its own time limit (seconds),
# shortened to what is left of the step; a part with less than 20 s left is skipped,
# saying so. The parts come in order of what is most needed.
set -uo pipefail
STEP=${1:-check}
# an unknown step (--help, a typo) says so before anything is made (an empty $OUT was)
case "$STEP" in
check|bench|tests|tune|tensor|rivals|small|visit) ;;
*) echo "usage: $0 check|bench|tests|tune|tensor|rivals|small|visit" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEP_END=$(( $(date +%s) + ${STEP_SECONDS:-580} ))

# limit SECONDS: SECONDS (a whole number; anything else counts as no limit of its own), or
# what is left of the step if less; 0 when under 20 s are left
limit() {
  local left=$(( STEP_END - $(date +%s) )) want=$1
  case "$want" in ''|*[!0-9]*) want=$left ;; esac
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi
}

# part LABEL SECONDS LOG CMD...: run CMD under `timeout` (see limit), its output appended
# to LOG, and print "LABEL: exit N" (124: its time ran out), or "LABEL: skipped" when the
# step's time is spent
part() {
  local label=$1 t log=$3
  t=$(limit "$2"); shift 3
  if [ "$t" -eq 0 ]; then echo "$label: skipped (the step's ${STEP_SECONDS:-580} s are spent)"; return 0; fi
  timeout -k 5 "$t" "$@" >> "$log" 2>&1
  echo "$label: exit $?"
}

# fresh LOG...: empty these logs under $OUT (parts append to theirs)
fresh() { for f; do : > "$OUT/$f"; done; }

export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
# The cache directory is named: platformdirs may be missing from a system Python.
export TILEGEMM_CACHE_DIR=${TILEGEMM_CACHE_DIR:-/tmp/tilegemm-cache}
# FP32 steps: no TF32 anywhere in cuBLAS. The tensor-core steps compare with cuBLAS TF32,
# which NVIDIA_TF32_OVERRIDE=0 would silently turn into SGEMM: they unset it (below).
export CUPY_TF32=0 NVIDIA_TF32_OVERRIDE=0
PY=${PY:-python3}
[ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && {
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site; }

info() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.limit \
      --format=csv
  $PY -c "import sys, numba, numba_cuda, cupy, torch, numpy; print(sys.version.split()[0], \
'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, \
'torch', torch.__version__, 'numpy', numpy.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null || true
  $PY -m tilegemm.cli info
}

case "$STEP" in
check)
  fresh smoke.log memcheck.log racecheck.log gpu-tests.log
  info 2>&1 | tee "$OUT/info.log"
  # the smoke test checks cuBLAS's TF32 too, which NVIDIA_TF32_OVERRIDE=0 would make SGEMM
  part smoke 200 "$OUT/smoke.log" env -u NVIDIA_TF32_OVERRIDE $PY benchmarks/gpu_smoke.py
  grep -E '^(FAIL|[0-9]+ failed)' "$OUT/smoke.log"
  # the three jobs together, each until the step's end (at most 420 s)
  t=$(limit 420)
  part memcheck "$t" "$OUT/memcheck.log" compute-sanitizer --tool memcheck --error-exitcode 3 \
      $PY benchmarks/gpu_sanitize.py &
  part racecheck "$t" "$OUT/racecheck.log" compute-sanitizer --tool racecheck --error-exitcode 3 \
      $PY benchmarks/gpu_sanitize.py &
  TILEGEMM_GPU_TESTS=1 part "gpu tests" "$t" "$OUT/gpu-tests.log" \
      $PY -m pytest -q -n 8 -p no:cacheprovider -m "cudasim or gpu" tests &
  wait
  for f in memcheck racecheck; do echo "== $f"; grep -E 'ERROR SUMMARY|^FAIL|failed' "$OUT/$f.log"; done
  echo "== gpu tests"; tail -25 "$OUT/gpu-tests.log"
  ;;
bench)
  # BENCH_ARGS: the full run by default; "--reports ladder,compile --ladder-sizes 1024,4096"
  # is the ladder against cuBLAS alone, in about two minutes.
  info > "$OUT/bench.log" 2>&1
  fresh targets.log
  part bench 330 "$OUT/bench.log" $PY -m tilegemm.cli bench ${BENCH_ARGS:---full} \
      --backend cuda --no-rivals --save "$OUT"
  # kernel="auto": the defaults adapted to the SM count (128x64 tiles, split-K); three
  # builds of pipelined (about 35 s each on the first call on the H100, before the compile
  # was cut)
  part "targets auto" 240 "$OUT/targets.log" \
      $PY benchmarks/perf_targets.py --auto --no-triton --json "$OUT/targets-auto.json"
  for k in pipelined warptile; do
    part "targets $k" 150 "$OUT/targets.log" \
        $PY benchmarks/perf_targets.py --kernel $k --no-triton --json "$OUT/targets-$k.json"
  done
  tail -40 "$OUT/bench.log"; cat "$OUT/targets.log"
  ;;
tests)
  # the GPU test run alone, every core compiling (TEST_TIMEOUT seconds at most)
  fresh gpu-tests.log
  TILEGEMM_GPU_TESTS=1 part "gpu tests" "${TEST_TIMEOUT:-400}" "$OUT/gpu-tests.log" \
      $PY -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore -m "cudasim or gpu" \
      ${TEST_ARGS:-tests}
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -30
  ;;
tune)
  info > "$OUT/info.log" 2>&1
  fresh tune.log targets-tuned.log
  for k in pipelined warptile; do
    part "tune $k" 170 "$OUT/tune.log" $PY -m tilegemm.cli tune --backend cuda --kernel $k \
        --m 4096 --n 4096 --k 4096 --strategy random --budget 30
  done
  cp "$TILEGEMM_CACHE_DIR"/*.json "$OUT/" 2>/dev/null
  part "targets tuned" 200 "$OUT/targets-tuned.log" \
      $PY benchmarks/perf_targets.py --tuned --no-triton
  tail -30 "$OUT/tune.log"; cat "$OUT/targets-tuned.log"
  ;;
tensor)
  unset NVIDIA_TF32_OVERRIDE
  # The tensor-core targets first (4096^3: TF32 and BF16 against cuBLAS at the same
  # precision, 3xTF32 against FP32 SGEMM), then the Hopper rung, then the errors, then
  # extras, so that a short step still answers the targets.
  info > "$OUT/tensor.log" 2>&1
  fresh tensor-errors.log
  part "tensor cores, mma 4096" 200 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 4096 --no-triton
  # the Hopper rung (compute capability 9.0 only; exits 2 elsewhere)
  part "tensor cores, wgmma 4096" 200 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
      --modes tf32 3xtf32 float16 bfloat16
  part "tensor-core errors" 100 "$OUT/tensor-errors.log" \
      $PY benchmarks/tensor_core_errors.py --k 256 4096 --mn 1024 \
      --json "$OUT/tensor-core-errors-gpu.json"
  # rung wgmma's 16-bit B copied K-major before the kernel (BCOPY=1), beside the default
  # that reads it as it lies (BCOPY=2: 1.17x BCOPY=1 on an H200, 2026-11-27)
  part "tensor cores, wgmma BCOPY=1 4096" 80 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --no-triton \
      --modes float16 bfloat16 --params BN=256,BCOPY=1
  # a deeper tile: 96 KB of dynamic shared memory in float32 (the opt-in, well past 48 KB)
  part "tensor cores, mma BK=32 STAGES=3" 150 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 4096 --modes tf32 float16 --no-triton \
      --params BK=32,STAGES=3
  # TF32 operands rounded by copies before the kernel, at both depths (RCOPY=1)
  part "tensor cores, mma RCOPY=1" 120 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 4096 --modes tf32 --no-triton --params RCOPY=1
  part "tensor cores, mma RCOPY=1 BK=32 STAGES=3" 120 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 4096 --modes tf32 --no-triton \
      --params RCOPY=1,BK=32,STAGES=3
  # a 64x64 warp tile (4 warps a 128x128 block, 255 registers on sm_80, no spills): a
  # third less shared memory read per multiply-add than the default 64x32
  part "tensor cores, mma WN=64" 150 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 4096 --modes tf32 float16 bfloat16 --no-triton \
      --params WN=64
  part "tensor cores, mma WN=64 RCOPY=1" 100 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 4096 --modes tf32 --no-triton \
      --params WN=64,RCOPY=1
  part "tensor cores, mma 2048" 120 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --sizes 2048 --no-triton
  tail -40 "$OUT/tensor.log"; tail -15 "$OUT/tensor-errors.log"
  ;;
rivals)
  # Triton's tutorial matmul on the same operands as the rungs (skipped, with the reason,
  # where triton does not import): FP32 without TF32 against rung pipelined over the eight
  # target shapes, then TF32, FP16 and BF16 against rung mma at 4096^3
  info > "$OUT/rivals.log" 2>&1
  part "targets pipelined + Triton" 300 "$OUT/rivals.log" \
      $PY benchmarks/perf_targets.py --kernel pipelined --json "$OUT/targets-pipelined-triton.json"
  part "tensor cores + Triton" 270 "$OUT/rivals.log" \
      env -u NVIDIA_TF32_OVERRIDE $PY benchmarks/tensor_cores.py --sizes 4096 --modes tf32 float16 bfloat16
  tail -40 "$OUT/rivals.log"
  ;;
small)
  # the time of one small matmul on NumPy arrays per backend (CUDA rungs and the CUDA C
  # yardstick, the CPU for comparison), against NumPy and an empty kernel's launch
  info > "$OUT/small-calls.log" 2>&1
  part "small calls" 300 "$OUT/small-calls.log" $PY benchmarks/small_calls.py \
      --backends cuda cudac cpu --out "$OUT/small-calls-gpu.json"
  tail -30 "$OUT/small-calls.log"
  ;;
visit)
  # What a 15-minute lease can answer in one call of ~5 minutes (2026-11-26: four short
  # calls found and fixed two bugs only a GPU showed, and met the 3xTF32 target).
  unset NVIDIA_TF32_OVERRIDE
  info > "$OUT/visit.log" 2>&1
  fresh gpu-tests.log tensor.log smoke.log host.log small-calls.log edge-sizes.log \
      layouts.log
  # every rung once on numba, CuPy and PyTorch arrays (~100 s on an H200)
  part smoke 120 "$OUT/smoke.log" $PY benchmarks/gpu_smoke.py
  TILEGEMM_GPU_TESTS=1 part "tensor-core tests" 100 "$OUT/gpu-tests.log" \
      $PY -m pytest -q -n 16 -p no:cacheprovider -rf -W ignore -m "cudasim or gpu" \
      tests/test_wgmma.py tests/test_wgmma_rung.py tests/test_cuda_mma.py \
      tests/test_cuda_mma_store.py tests/test_cuda_tensorcore.py tests/test_cuda_kmajor.py \
      tests/test_cuda_staging.py tests/test_cuda_interop.py tests/test_fastpath_device.py
  # small products on NumPy and device arrays (NumPy arrays: the driver's copies into
  # kept buffers, 2026-11-26 on the H100's host 628 us at 8^3 float32, 1071 with numba's)
  part "small calls" 60 "$OUT/small-calls.log" $PY benchmarks/small_calls.py \
      --backends cuda --out "$OUT/small-calls-gpu.json"
  # FP32 kernel="auto" near 1000^3, its weakest target (0.59 of cuBLAS on an H200,
  # 2026-11-27, 90 us where 1024^3 took 70): the same 128 blocks with edges or without
  # (FP32 cuBLAS: CUPY_TF32=0, set above). Early in the visit: never yet measured, where
  # the tensor-core timings after it repeat figures of earlier visits
  part "edge sizes" 75 "$OUT/edge-sizes.log" \
      $PY benchmarks/perf_targets.py --auto --no-triton --queued 20 --shapes 1000x1000x1000 \
      1008x1008x1008 1016x1016x1016 1024x1024x1024 4097x4097x4097
  # the same with edge tiles shifted back a tile (rung pipelined's SHIFT_EDGES=1: every
  # block on the unchecked path; at 4097^3 rows shift, columns cannot)
  part "edge sizes, shifted" 75 "$OUT/edge-sizes.log" \
      $PY benchmarks/perf_targets.py --auto --no-triton --queued 20 --params SHIFT_EDGES=1 \
      --shapes 1000x1000x1000 1008x1008x1008 1016x1016x1016 1024x1024x1024 4097x4097x4097
  for k in wgmma mma; do
    part "tensor cores, $k 4096" 60 "$OUT/tensor.log" \
        $PY benchmarks/tensor_cores.py --kernel $k --sizes 4096 --no-triton
  done
  # rung wgmma's 16-bit B copied K-major before the kernel (BCOPY=1, at the 128x256 tile
  # an untuned 4096^3 call takes) beside the default that reads it as it lies (BCOPY=2:
  # 0.83-0.84 of cuBLAS against 0.70-0.71 on an H200, 2026-11-27)
  part "tensor cores, wgmma BCOPY=1 4096" 40 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --kernel wgmma --sizes 4096 --modes float16 bfloat16 \
      --no-triton --params BN=256,BCOPY=1
  # rung mma's TF32 with A and B rounded by copies before the kernel (RCOPY=1; one H100
  # run, 2026-11-26: 1.31x the default)
  part "tensor cores, mma RCOPY=1 4096" 40 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --kernel mma --sizes 4096 --modes tf32 --no-triton \
      --params RCOPY=1
  # the host's time per call beside the GPU's: what bounds products below ~4096^3
  part "host overhead" 60 "$OUT/host.log" $PY benchmarks/host_overhead.py
  # rungs 6-9 copy a transposed operand from 512 multiply-adds per element copied, set on
  # an H200 (2026-11-27: 1.01x and 1.30x at 512): at that edge on this GPU, with and
  # without the copy
  part "operand layouts" 40 "$OUT/layouts.log" \
      $PY benchmarks/operand_layouts.py --sizes 512 --batch 512 --layouts A.T B.T
  sections="--section SpeedOfLight --section Occupancy --section WarpStateStats \
--section SchedulerStats --section MemoryWorkloadAnalysis"
  for run in "wgmma float32 tf32" "wgmma bfloat16 -" "mma float32 tf32"; do
    set -- $run
    prec=$([ "$3" = - ] && echo "" || echo "--precision $3")
    part "ncu $1 $2" 30 "$OUT/ncu-$1-$2.txt" ncu --clock-control none \
        --kernel-name "regex:$($PY benchmarks/ncu_rung.py --name "$1")" --launch-skip 1 \
        --launch-count 1 $sections $PY benchmarks/ncu_rung.py --kernel "$1" --dtype "$2" $prec
  done
  # last, if time is left: rung mma with a 64x64 warp tile (multiply-adds per byte of
  # shared memory moved, explain --sass: TF32 2.59 -> 3.14, RCOPY=1 3.82 -> 5.17, FP16
  # 7.31 -> 10.04)
  part "tensor cores, mma WN=64 4096" 60 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --kernel mma --sizes 4096 --modes tf32 float16 \
      --no-triton --params WN=64
  part "tensor cores, mma WN=64 RCOPY=1 4096" 40 "$OUT/tensor.log" \
      $PY benchmarks/tensor_cores.py --kernel mma --sizes 4096 --modes tf32 --no-triton \
      --params WN=64,RCOPY=1
  grep -E "^(FAIL|[0-9]+ failed)" "$OUT/smoke.log"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -10
  grep -E "TFLOP|FAILED|target" "$OUT/tensor.log"
  grep -E "\^3|needs|Error" "$OUT/host.log"
  grep -E "ratio|needs|Error" "$OUT/edge-sizes.log"
  grep -E "^ +[0-9]+ +A|FAIL|needs|Error" "$OUT/layouts.log"
  grep -E "per call" "$OUT/small-calls.log" | grep -v -E "cupy|torch"
  for f in "$OUT"/ncu-*.txt; do
    echo "== $f"; grep -E "Duration|Compute \(SM\) Throughput|No Eligible|Warp Cycles Per \
Issued|Achieved Occupancy|==WARNING== No kernels" "$f" || true
  done
  ;;
esac
