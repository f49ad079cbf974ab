"""Measure a tensor-core rung on a GPU against cuBLAS at the same precision (PyTorch's cuBLAS).

    PYTHONPATH=src python benchmarks/tensor_cores.py [--repeat 20] [--sizes 2048 4096] \
        [--params BK=32,STAGES=3] [--kernel mma|wgmma]

``--kernel wgmma`` measures the Hopper rung instead of ``mma`` (compute capability 9.0
only; its 3×TF32 ring with the small parts takes 224 KB of shared memory at the defaults).
What follows is written for ``mma``; the modes mean the same for both.

For each size n (n×n×n products) and mode:

- ``tf32``: mma with PASSES=1 against cuBLAS with TF32 enabled
  (``torch.backends.cuda.matmul.fp32_precision = "tf32"``, or ``allow_tf32 = True`` on an
  older torch). Target at 4096³: >= 60 % of cuBLAS.
- ``3xtf32``: mma with PASSES=3 against cuBLAS FP32 SGEMM (no TF32). Targets at 4096³:
  >= 1.5× SGEMM's speed, and a maximum error against float64 no worse than SGEMM's.
- ``float16``: mma on float16 operands against cuBLAS half GEMM with float32 accumulation
  (``allow_fp16_reduced_precision_reduction = False``). Target at 4096³: >= 60 %.
- ``bfloat16``: the same for ``ml_dtypes.bfloat16`` operands against cuBLAS BF16
  (``allow_bf16_reduced_precision_reduction = False``). Target at 4096³: >= 60 %.

The rung runs at its defaults fitted to the shape as an untuned call fits them (the
rung's ``shape_params``: wgmma takes 128x256 tiles at 4096³, and reads 16-bit B as it
lies, BCOPY=2) or with ``--params``
overriding the defaults; each line names the tile and the ring's shared memory. Every
result is checked against float64 NumPy before it is timed: the maximum error, scaled by
max(|A|·|B|), is printed for tilegemm and for cuBLAS, and a tilegemm error more
than 4× cuBLAS's (same precision) fails the run. Times: CUDA events, median of --repeat,
after two warm-up launches, through the benchmarks' timing loop (``bench.timing.steady``);
the checked launch writes a NaN-poisoned output (a NaN error fails the run). Needs a real
GPU of compute capability 8.0 or newer, and torch.

Then, where ``triton`` imports (``--no-triton``: not at all), Triton's tutorial matmul
(``bench.vendors``' rival) at each case's precision (TF32: ``input_precision="tf32"``;
3xTF32: FP32 with ``"ieee"``; FP16/BF16 inputs with float32 accumulation) on the same
operands, timed the same way: one line per case with its TFLOP/s, its share of the same
cuBLAS, the rung's speed relative to it and its error. It runs after every rung line,
because its first call per precision compiles and autotunes every configuration of the
tutorial (expected: about a minute each, not yet measured); a Triton result with more
than 4× cuBLAS's error is shown as wrong, without a speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import numpy as np

MODES = ("tf32", "3xtf32", "float16", "bfloat16")
HALF = ("float16", "bfloat16")


def _set_torch_fp32(torch: Any, precision: str) -> None:
    """cuBLAS FP32 GEMMs as "ieee" (SGEMM) or "tf32" (TF32 tensor cores)."""
    matmul = torch.backends.cuda.matmul
    if getattr(matmul, "fp32_precision", None) is not None:
        matmul.fp32_precision = precision
    else:
        matmul.allow_tf32 = precision == "tf32"


def _torch_run(torch: Any, a: np.ndarray, b: np.ndarray, repeat: int) -> tuple[float, Any]:
    from tilegemm.backends.base import Prepared
    from tilegemm.bench.timing import fixed, steady
    from tilegemm.bench.vendors import _from_torch, _to_torch  # bfloat16 through its bits

    da, db = _to_torch(torch, a), _to_torch(torch, b)
    out = torch.matmul(da, db)

    def elapsed(n: int) -> list[float]:
        events = []
        for _ in range(n):
            start, stop = (torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True))
            start.record()
            torch.matmul(da, db, out=out)
            stop.record()
            events.append((start, stop))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in events]

    fetch = lambda: _from_torch(torch, out)  # noqa: E731
    prepared = Prepared(lambda: torch.matmul(da, db, out=out), fetch, elapsed)
    times = steady(prepared, fixed(repeat, warmup=2))
    return statistics.median(times), fetch()


def _triton_run(torch: Any, vendor: Any, a: np.ndarray, b: np.ndarray,
                repeat: int) -> tuple[float, np.ndarray, dict[str, int]]:
    """Triton's matmul as ``_torch_run`` times cuBLAS: the first launch autotunes (apart,
    untimed), then the same steady loop; the median, the result and the chosen tile."""
    from tilegemm.bench.timing import fixed, steady
    from tilegemm.problem import problem_for

    n_m, n_k = a.shape
    prepared = vendor.prepare(problem_for(n_m, b.shape[1], n_k, a.dtype), a[None], b[None])
    prepared.launch()
    torch.cuda.synchronize()
    result = prepared.fetch()
    times = steady(prepared, fixed(repeat, warmup=2))
    return statistics.median(times), result, vendor.config()


def _error(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = float(np.max(np.abs(a64) @ np.abs(b64)))
    return float(np.max(np.abs(c.astype(np.float64) - a64 @ b64))) / scale


def main() -> int:
    from tilegemm.commands._params import comma_params

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--params", type=comma_params, default={},
                        help="rung parameters over the defaults, e.g. BK=32,STAGES=3 (none: "
                             "the defaults fitted to the shape, as an untuned call runs)")
    parser.add_argument("--kernel", choices=("mma", "wgmma"), default="mma",
                        help="the tensor-core rung to time (wgmma: compute capability 9.0)")
    parser.add_argument("--no-triton", action="store_true",
                        help="do not time Triton's tutorial matmul after the rung")
    args = parser.parse_args()
    over = args.params

    try:
        import torch
    except ImportError as exc:
        print(f"needs a real GPU and torch with CUDA: {exc}")
        return 2

    from tilegemm import registry
    from tilegemm.backends import get_backend
    from tilegemm.bench.timing import fixed, poisoned, steady
    from tilegemm.problem import problem_for
    from tilegemm.tune.select import for_shape

    backend = get_backend("cuda")
    status = backend.status()
    if not status.usable or status.simulated or not torch.cuda.is_available():
        print(f"needs a real GPU and torch with CUDA: {status.reason}")
        return 2
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 0):
        print(f"needs compute capability 8.0 or newer; this GPU is {major}.{minor}")
        return 2
    from tilegemm.bench.vendors import tf32_overridden

    why = tf32_overridden() if "tf32" in args.modes else None
    if why:
        print(why)
        return 2
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"device: {status.devices[0]}, torch {torch.__version__}")
    spec = registry.get(args.kernel, "cuda")
    if spec.only_cc and (major, minor) != spec.only_cc:
        print(f"rung {spec.name} runs only on compute capability "
              f"{spec.only_cc[0]}.{spec.only_cc[1]}; this GPU is {major}.{minor}")
        return 2
    failed = False
    ref = {"tf32": "cuBLAS TF32", "3xtf32": "cuBLAS SGEMM", "float16": "cuBLAS FP16",
           "bfloat16": "cuBLAS BF16"}
    done = []  # (n, mode, dtype, rung seconds, cuBLAS seconds, cuBLAS error) for Triton
    for n in args.sizes:
        for mode in args.modes:
            if mode not in HALF and mode not in spec.precisions:
                print(f"{n:>5}^3 {mode:<8} {spec.name}: no such mode (precisions: "
                      f"{', '.join(spec.precisions)}), skipped")
                continue
            dtype = np.dtype(mode) if mode in HALF else np.dtype(np.float32)
            rng = np.random.default_rng([n, MODES.index(mode)])  # Triton: the same operands
            a = rng.standard_normal((1, n, n)).astype(dtype)
            b = rng.standard_normal((1, n, n)).astype(dtype)
            params = spec.resolve(over if mode in HALF
                                  else {**over, spec.precision_param: spec.precisions[mode]})
            if not over:  # what an untuned call runs: the defaults fitted to the shape
                params = for_shape(backend, backend.target(), problem_for(n, n, n, dtype),
                                   spec, params, "")[1]
            backend.check_limits(spec, params, dtype, backend.target())  # the opt-in maximum
            with poisoned():  # an element the kernel never writes stays NaN
                prepared = backend.prepare(spec, params, problem_for(n, n, n, dtype), a, b)
                prepared.launch()
            ours_err = _error(prepared.fetch().reshape(n, n), a[0], b[0])
            ours = statistics.median(steady(prepared, fixed(args.repeat, warmup=2)))
            _set_torch_fp32(torch, "tf32" if mode == "tf32" else "ieee")
            theirs, c = _torch_run(torch, a[0], b[0], args.repeat)
            theirs_err = _error(c, a[0], b[0])
            ratio = theirs / ours
            flops = 2.0 * n**3
            done.append((n, mode, dtype, ours, theirs, theirs_err))
            shown = (("BM", "BN", "BK", "STAGES", "BCOPY")
                     + (("PROMOTE",) if mode == "3xtf32" else ()))
            shape = " ".join(f"{k}={params[k]}" for k in shown if k in params)
            print(f"{n:>5}^3 {mode:<8} {spec.name} {flops / ours / 1e12:7.1f} TFLOP/s  {ref[mode]} "
                  f"{flops / theirs / 1e12:7.1f}  ratio {ratio:.2f}  max error "
                  f"{ours_err:.1e} vs {theirs_err:.1e}  "
                  f"({shape}: {spec.smem(params, dtype.itemsize) // 1024} KB shared)")
            if not ours_err <= 4 * theirs_err + 1e-7:  # NaN fails too
                print("  FAILED: error more than 4x cuBLAS's")
                failed = True
            if n == 4096:
                goal = 1.5 if mode == "3xtf32" else 0.6
                met = ratio >= goal and (mode != "3xtf32" or ours_err <= theirs_err)
                print(f"  target ratio >= {goal}"
                      + (" and error <= SGEMM's" if mode == "3xtf32" else "")
                      + f": {'MET' if met else 'NOT MET'}")
    if not args.no_triton and done:
        _triton_lines(torch, backend.target(), spec.name, done, args.repeat, ref)
    return 1 if failed else 0


def _triton_lines(torch: Any, target: Any, rung: str, done: list[tuple[Any, ...]],
                  repeat: int, ref: dict[str, str]) -> None:
    """One line per case measured above: Triton's matmul at that case's precision."""
    from tilegemm.bench.vendors import find_rival, vendor_math

    made: dict[str, Any] = {}
    for n, mode, dtype, ours, theirs, theirs_err in done:
        math = vendor_math(dtype, "tf32" if mode == "tf32" else "ieee")
        if math not in made:
            made[math], note = find_rival("triton", target, dtype, math)
            print(note)
        vendor = made[math]
        if vendor is None:
            continue
        rng = np.random.default_rng([n, MODES.index(mode)])
        a = rng.standard_normal((n, n)).astype(dtype)
        b = rng.standard_normal((n, n)).astype(dtype)
        try:
            t, c, config = _triton_run(torch, vendor, a, b, repeat)
        except Exception as exc:  # a compile or launch failure: Triton's, not the rung's
            print(f"{n:>5}^3 {mode:<8} Triton raised {type(exc).__name__}: {exc}")
            continue
        err = _error(c.reshape(n, n), a, b)
        if not err <= 4 * theirs_err + 1e-7:
            print(f"{n:>5}^3 {mode:<8} Triton WRONG: max error {err:.1e} vs {ref[mode]} "
                  f"{theirs_err:.1e}")
            continue
        print(f"{n:>5}^3 {mode:<8} {vendor.name:<11} {2.0 * n**3 / t / 1e12:7.1f} TFLOP/s  "
              f"{100 * theirs / t:5.1f}% of {ref[mode]}  {rung}/Triton {t / ours:.2f}  "
              f"max error {err:.1e}  ({' '.join(f'{k}={v}' for k, v in config.items())})")


if __name__ == "__main__":
    sys.exit(main())
