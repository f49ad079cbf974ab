"""Does copying an operand into the kernel's layout repay itself? Rungs 6-9 on CuPy arrays
laid out four ways, with and without the copy, against cuBLAS on the same arrays.

Usage (on a machine with an NVIDIA GPU and CuPy, from the repository root)::

    PYTHONPATH=src python benchmarks/operand_layouts.py [--sizes 4096 4097 2048] \
        [--batch 64] [--kernel pipelined] [--rounds 5]

Rungs 6-9 read A with K contiguous and B with N contiguous, by 16-byte loads. A device
operand laid out otherwise (``x.T @ y``: A with M contiguous; ``x @ w.T``: B with K
contiguous) or with rows off 16 bytes (K or N not a multiple of 4 in float32, as at 4097³)
is copied into the kernel's layout before the product when the product does at least
``FFMA_MIN_REUSE`` multiply-adds per element copied (``kernels/cuda/_kmajor.py``);
without the copy, the kernel reads it element by element. On an H200 (2026-11-27) the
copy paid at every size timed, down to 512 multiply-adds per element, which is where the
threshold now stands (it was 2048, from a model).

For each size n and layout (``C``: both C-ordered; ``A.T``: A the transpose of a
C-ordered array; ``B.T``: B likewise; ``A.T B.T``: both), one line: tilegemm's time per
call as the threshold decides (``default``), with no copy (``copies_for`` returning
none), with the copy whatever the threshold says (``always``), cuBLAS's (``cupy.matmul``
on the same arrays), then the ratios of cuBLAS's time to the first three. ``--batch``
runs a batch of n×n×n products per call, so that products under 2048³ still time the
GPU and not the host's call. Each result is checked against a float64 product on the
GPU (relative Frobenius error under 1e-5) before it is timed. Times: CUDA events around
blocks of ``--calls`` calls, the median over ``--rounds`` rounds in which the four
contenders alternate.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable
from typing import Any

LAYOUTS = ("C", "A.T", "B.T", "A.T B.T")


def _operands(cp: Any, n: int, batch: int, layout: str, rng: Any) -> tuple[Any, Any]:
    shape = (batch, n, n) if batch > 1 else (n, n)
    a = cp.asarray(rng.standard_normal(shape, dtype="float32"))
    b = cp.asarray(rng.standard_normal(shape, dtype="float32"))
    if "A.T" in layout:  # the same values, M contiguous
        a = cp.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2)
    if "B.T" in layout:
        b = cp.ascontiguousarray(b.swapaxes(-1, -2)).swapaxes(-1, -2)
    return a, b


def _per_call(cp: Any, call: Callable[[], Any], calls: int) -> float:
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    call()
    start.record()
    for _ in range(calls):
        call()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 4097, 2048])
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--kernel", default="pipelined")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1,
                        help="a batch of products, each n×n×n: below 2048³ a single product "
                        "times the host's call, not the GPU")
    args = parser.parse_args()

    import numpy as np

    import tilegemm
    from tilegemm.backends import get_backend

    status = get_backend("cuda").status()
    if not status.usable or status.simulated:
        print(f"needs a real GPU: {status.reason or 'the simulator runs no timings'}")
        return 2
    try:
        import cupy as cp
    except ImportError as exc:
        print(f"needs CuPy: {exc}")
        return 2
    from tilegemm.kernels.cuda import _kmajor

    real = _kmajor.RowMajorProgram.copies_for
    copying = {"mode": "copy"}

    def copies_for(self: Any, A: Any, B: Any, out_shape: Any) -> Any:  # noqa: N803
        mode = copying["mode"]
        if mode == "always":
            return real(dataclasses.replace(self, min_reuse=0), A, B, out_shape)
        return real(self, A, B, out_shape) if mode == "copy" else []

    _kmajor.RowMajorProgram.copies_for = copies_for
    rng = np.random.default_rng(7)
    print(f"{'n':>5} {'layout':>8}  {'default':>8} {'no copy':>8} {'always':>8} {'cuBLAS':>8}"
          f"  ms per call (batch {args.batch}); ratios to cuBLAS: default, none, always")
    for n in args.sizes:
        for layout in args.layouts:
            a, b = _operands(cp, n, args.batch, layout, rng)
            ref = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
            calls: dict[str, Callable[[], Any]] = {
                "copy": lambda a=a, b=b: tilegemm.matmul(a, b, kernel=args.kernel),
                "none": lambda a=a, b=b: tilegemm.matmul(a, b, kernel=args.kernel),
                "always": lambda a=a, b=b: tilegemm.matmul(a, b, kernel=args.kernel),
                "cublas": lambda a=a, b=b: cp.matmul(a, b),
            }
            for name, call in calls.items():
                copying["mode"] = name
                err = float(cp.linalg.norm((call() - ref).ravel()) / cp.linalg.norm(ref.ravel()))
                if not err < 1e-5:
                    print(f"FAIL {n} {layout} {name}: relative error {err:.3g}")
                    return 1
            times: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(args.rounds):
                for name, call in calls.items():
                    copying["mode"] = name
                    times[name].append(_per_call(cp, call, args.calls))
            t = {k: statistics.median(v) for k, v in times.items()}
            print(f"{n:>5} {layout:>8}  " + " ".join(f"{t[k] * 1e3:8.3f}" for k in calls)
                  + "  " + " ".join(f"{t['cublas'] / t[k]:.3f}" for k in
                                    ("copy", "none", "always")), flush=True)
            del a, b, ref
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
