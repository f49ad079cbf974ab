"""Every CUDA rung once at odd shapes, for NVIDIA's compute-sanitizer (one process per tool).

    compute-sanitizer --tool memcheck  --error-exitcode 3 python3 benchmarks/gpu_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python3 benchmarks/gpu_sanitize.py

Running the whole ladder in one process keeps the sanitizer's start-up (and numba's
compilations) to once per tool instead of once per rung. Each rung runs at 257×129×65 (the
scalar path: no dimension a multiple of four) and 257×128×64 (the 128-bit path), for every
floating dtype it computes and every precision the tensor-core rung offers, into an output
poisoned with NaN and compared with float64 NumPy, so a launch that the sanitizer passes
but that computes the wrong thing fails here too. Exit status 1 if any result was wrong.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import tilegemm
from tilegemm.precision import TOLERANCE_EPS
from tilegemm.reference import assert_close, random_operands

SHAPES = [(257, 129, 65), (257, 128, 64)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", help="only these rungs (repeatable)")
    parser.add_argument("--shape", type=int, nargs=3, action="append", metavar=("M", "N", "K"),
                        help="instead of the two odd shapes (small ones for the simulator)")
    args = parser.parse_args()
    names = {spec.name for spec in tilegemm.kernels("cuda")}
    unknown = sorted(set(args.kernel or ()) - names)
    if unknown:  # a misspelt rung would run nothing and report "0 failed"
        parser.error(f"--kernel: no CUDA rung {', '.join(unknown)}; the rungs are "
                     f"{', '.join(sorted(names))}")
    from tilegemm.backends import get_backend

    status = get_backend("cuda").status()
    if not status.usable:  # each rung would fail alike, looking like wrong results
        print(f"needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1): {status.reason}")
        return 2
    from numba import cuda

    failed = []
    for spec in tilegemm.kernels("cuda"):
        if args.kernel and spec.name not in args.kernel:
            continue
        dtypes = [d for d in spec.dtypes if d in ("float32", "float64", "float16", "bfloat16")]
        # precision= picks the tensor-core mode for float32; 16-bit operands have just one
        runs = [(p, "float32") for p in spec.precisions if "float32" in dtypes] + [
            (None, d) for d in dtypes if not spec.precisions or d in ("float16", "bfloat16")]
        for precision, dtype in runs:
            if True:
                for m, n, k in args.shape or SHAPES:
                    what = f"{spec.name:12s} {dtype:9s} {m}x{n}x{k}" + (
                        f" {precision}" if precision else "")
                    try:
                        a, b = random_operands((m, k), (k, n), dtype)
                        if dtype in ("float16", "bfloat16"):
                            # NumPy operands: numba has no device arrays of bfloat16
                            host = tilegemm.matmul(a, b, backend="cuda", kernel=spec.name)
                        else:
                            out = cuda.to_device(np.full((m, n), np.nan, dtype=a.dtype))
                            tilegemm.matmul(cuda.to_device(a), cuda.to_device(b), out=out,
                                            backend="cuda", kernel=spec.name,
                                            precision=precision)
                            cuda.synchronize()
                            host = out.copy_to_host()
                        assert not np.isnan(host.astype(np.float64)).any(), "unwritten output"
                        assert_close(host, a, b, what=what,
                                     eps=TOLERANCE_EPS.get(precision) if precision else None)
                        print(f"ok    {what}", flush=True)
                    except Exception as exc:  # go on: one run shows every failure
                        failed.append(what)
                        print(f"FAIL  {what}: {type(exc).__name__}: {exc}", flush=True)
    print(f"{len(failed)} failed" + (": " + "; ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
