"""Rung 1 (CPU) — the optimisation note's triple loop ``matrixMulCpu``, compiled with Numba
``@njit``.

i over rows, j over columns, l over K: the innermost loop walks B down a column (stride N),
so every iteration touches a new cache line of B and nothing is vectorised. It is the
baseline every other rung is measured against, and the CPU analogue of the naive GPU
kernel. Generalised from the original: any M, N, K, batches, alpha/beta, every dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.registry import FLOATS, INTS, KernelSpec


def build(p: Mapping[str, int], dtype: np.dtype) -> Any:
    from tilegemm._compat import import_numba

    numba = import_numba()
    zero = dtype.type(0)
    # One explicit signature, operands read-only (as the CPU backend hands them over): a
    # writeable operand is converted to it, not compiled for again (a remembered call,
    # tilegemm.fastpath, passes the caller's arrays as they are).
    t = numba.from_dtype(dtype)
    ro, rw = numba.types.Array(t, 3, "C", readonly=True), numba.types.Array(t, 3, "C")

    @numba.njit(numba.void(ro, ro, rw, t, t), cache=False)
    def triple_loop(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        for z in range(C.shape[0]):
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            for i in range(m):
                for j in range(n):
                    acc = zero
                    for l in range(k_len):
                        acc += A[za, i, l] * B[zb, l, j]
                    if beta == 0:
                        C[z, i, j] = alpha * acc
                    else:
                        C[z, i, j] = alpha * acc + beta * C[z, i, j]

    return triple_loop


SPEC = KernelSpec(
    name="triple_loop",
    backend="cpu",
    rung=1,
    title="the optimisation note's CPU triple loop (i, j, l)",
    build=build,
    dtypes=FLOATS + INTS,
    doc=__doc__,
)
