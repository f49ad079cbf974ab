"""Rung 2 — coalesced: the naive kernel with threadIdx.x on *columns* instead of rows.

The only change from rung 1 is which thread index walks which dimension of C. With
``threadIdx.x`` → column, the 32 threads of a warp hold consecutive columns of one row:
they read 32 consecutive elements of B (one row of B per k-step: 4 32-byte sectors for
float32, the minimum), all read the *same* element of A (a broadcast: one sector), and
write 32 consecutive elements of C. In rung 1 every one of those accesses to A and C
touched a different sector. Same arithmetic, same number of instructions, far fewer memory
transactions: this rung isolates the effect of coalescing (the optimisation note's transaction
analysis: 5 transactions per warp per k-step).

Arithmetic intensity is unchanged (every k-step still loads two values from global memory
for one multiply-add); caches, not reuse, are what keep it off DRAM. Rung 3 adds reuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda.k01_naive import SPEC as NAIVE
from tilegemm.launch import tile_grid

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    bs = p["BLOCK"]
    zero = dtype.type(0)

    @kernel_jit(bs * bs)
    def coalesced(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        # grid-stride loops as `while`: range() with a run-time step costs a 64-bit
        # division and two live counters per loop (see kernels/cuda/__init__.py)
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            # y → row i, x → column j: a warp covers consecutive columns of one row
            i = cuda.blockIdx.y * bs + cuda.threadIdx.y
            while i < m:
                j = cuda.blockIdx.x * bs + cuda.threadIdx.x
                while j < n:
                    acc = zero
                    for k in range(k_len):
                        acc += A[za, i, k] * B[zb, k, j]
                    if beta == 0:
                        C[z, i, j] = alpha * acc
                    else:
                        C[z, i, j] = alpha * acc + beta * C[z, i, j]
                    j += cuda.gridDim.x * bs
                i += cuda.gridDim.y * bs
            z += cuda.gridDim.z

    return CudaProgram(coalesced, (bs, bs, 1), tile_grid(bs, bs))


# Rung 1's parameters, dtypes and block: only the mapping of threads to C changes.
SPEC = replace(
    NAIVE,
    name="coalesced",
    rung=2,
    title="one thread per output, x → column (coalesced B loads and C stores)",
    build=build,
    doc=__doc__,
)
