"""Where a matrix-vector product is worth the threads on this machine: whole ``A @ x`` calls
with the matrix read on the calling thread against the same calls on Numba's threads, and
NumPy's, over matrix sizes from a share of the L2 to a few MiB.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/vector_threads.py            # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/vector_threads.py --no-save --kib 512 1024 --dtypes float32

Why: the CPU rung runs a product of one row or one column on the calling thread while its
matrix is within the parameter VECTOR_KB (0, the default: three quarters of the L2), and on
the threads beyond it. Where that size lies depends on what starting the threads costs, not
on the L2 alone: on a 2-vCPU AMD EPYC Zen 3 guest, whose TBB worker arrives 10-20 µs into a
region (``benchmarks/parallel_region.py``) and whose Python runs slowly right after a
matrix has been streamed past the L2, the calling thread was faster up to 3 MiB. The
crossover this prints is what a database entry for the machine sets as VECTOR_KB.

Each size is timed three ways, in alternating blocks of calls (about 20 ms each) with a
pause before each block (OpenBLAS's threads spin after a call): ``kernel="blocked"`` with
VECTOR_KB = 8192 (on the calling thread up to the rung's limit for any product), with
VECTOR_KB = 256 (on the threads), and ``np.matmul``. Times are medians over ``--rounds``
blocks, in µs per call; ``threads_over_calling`` > 1 means the calling thread was faster.
Writes ``benchmarks/results/vector-threads-<cpu>-<isa>-m<family>-<model>.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm.bench.timing import alternating, call_block, calls_per_block  # noqa: E402
from tilegemm.kernels.cpu import k02_blocked  # noqa: E402

CALLING, THREADS = 8192, 256  # VECTOR_KB that keeps every size here on one side
KIB = (384, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120)


def measure(kib: int, dtype: str, rounds: int, pause: float,
            rng: np.random.Generator) -> dict | None:
    """One matrix size: µs per call on the calling thread, on the threads, and NumPy's."""
    itemsize = np.dtype(dtype).itemsize
    n = int(math.sqrt(kib * 1024 / itemsize))
    if n * n > k02_blocked.DIRECT_PRODUCT:
        return None  # beyond the rung's calling-thread limit for any product
    w = rng.standard_normal((n, n)).astype(dtype)
    x = rng.standard_normal((n, 1)).astype(dtype)
    calls = {}
    for name, vector_kb in (("calling", CALLING), ("threads", THREADS)):
        plan = tilegemm.plan(w, x, kernel="blocked", backend="cpu", VECTOR_KB=vector_kb)
        expected = "on the calling thread" if name == "calling" else "split over"
        assert expected in plan.path, (name, plan.path)  # the size sits on the side asked
        def call(vkb: int = vector_kb) -> np.ndarray:
            return tilegemm.matmul(w, x, kernel="blocked", backend="cpu", VECTOR_KB=vkb)

        tilegemm.assert_close(call(), w, x, what=f"{dtype} {n}x{n} @ x")  # checked, untimed
        calls[name] = call
    calls["numpy"] = lambda: np.matmul(w, x)
    per_block = calls_per_block(calls["calling"])
    times = alternating({name: call_block(c, per_block) for name, c in calls.items()}, rounds,
                        pause=pause)
    us = {name: round(float(np.median(t)) * 1e6, 1) for name, t in times.items()}
    return {"dtype": dtype, "kib": round(n * n * itemsize / 1024), "n": n, "us": us,
            "threads_over_calling": round(us["threads"] / us["calling"], 3),
            "numpy_over_calling": round(us["numpy"] / us["calling"], 3),
            "calls_per_block": per_block}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--kib", nargs="+", type=int, default=list(KIB),
                    help="matrix sizes in KiB (each an n x n matrix of about that size)")
    cpu_blocked.add_run_arguments(ap, rounds=9, pause=0.3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for dtype in args.dtypes:
        for kib in args.kib:
            row = measure(kib, dtype, args.rounds, args.pause, rng)
            if row is None:
                continue
            rows.append(row)
            us = row["us"]
            print(f"{dtype:8s} {row['kib']:6d} KiB  calling {us['calling']:8.1f} µs  "
                  f"threads {us['threads']:8.1f} µs  NumPy {us['numpy']:8.1f} µs  "
                  f"threads/calling {row['threads_over_calling']:5.2f}", flush=True)
    if not args.no_save:
        cpu_blocked.save_results("vector-threads", {
            "method": "whole matmul(w, x) calls (w n x n, x n x 1, C-ordered), kernel='blocked' "
                      f"with VECTOR_KB={CALLING} (calling thread) and VECTOR_KB={THREADS} "
                      f"(threads), and np.matmul; blocks of about 20 ms after one untimed "
                      f"call, alternating, {args.pause} s idle before each block, "
                      f"{args.rounds} rounds, median block; µs per call",
            "cases": rows,
        }, suffix=args.suffix)


if __name__ == "__main__":
    main()
