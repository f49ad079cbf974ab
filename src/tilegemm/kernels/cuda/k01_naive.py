"""Rung 1 — naive: one thread per element of C, with the original example's mapping
(threadIdx.x → row).

This is Numba's documentation example ``matmul``: ``i, j = cuda.grid(2)`` and a loop over k.
Because x is the fastest-varying thread index and it walks *rows* of row-major C, the 32
threads of a warp read A and write C with a stride of a whole row: every warp access touches
up to 32 different 32-byte sectors (uncoalesced). B is read along a column per thread but
the warp shares one address per k (a broadcast). The rung is kept exactly so, because the
next rung fixes only this and the difference is measurable (``tilegemm bench``) and
countable (``tilegemm explain``).

Fixed from the original: any M, N, K (bounds checks), batches in grid z, grid-stride loops so
no grid dimension exceeds the hardware limit, accumulation in the output dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.launch import tile_grid
from tilegemm.registry import FLOATS, INTS, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    bs = p["BLOCK"]
    zero = dtype.type(0)

    @kernel_jit(bs * bs)
    def naive(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        # grid-stride loops as `while`: range() with a run-time step costs a 64-bit
        # division and two live counters per loop (see kernels/cuda/__init__.py)
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            # x → row i (the original example's mapping), y → column j
            i = cuda.blockIdx.x * bs + cuda.threadIdx.x
            while i < m:
                j = cuda.blockIdx.y * bs + cuda.threadIdx.y
                while j < n:
                    acc = zero
                    for k in range(k_len):
                        acc += A[za, i, k] * B[zb, k, j]
                    if beta == 0:
                        C[z, i, j] = alpha * acc
                    else:
                        C[z, i, j] = alpha * acc + beta * C[z, i, j]
                    j += cuda.gridDim.y * bs
                i += cuda.gridDim.x * bs
            z += cuda.gridDim.z

    return CudaProgram(naive, (bs, bs, 1), tile_grid(bs, bs, rows_in_x=True))


SPEC = KernelSpec(
    name="naive",
    backend="cuda",
    rung=1,
    title="one thread per output, the Numba example's mapping (x → row)",
    build=build,
    params=(Param("BLOCK", 16, (8, 16, 32), "threads per block side (BLOCK × BLOCK)"),),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["BLOCK"] ** 2,
    smem=lambda p, itemsize: 0,
    doc=__doc__,
    sim_params={"BLOCK": 8},  # smallest block: the simulator runs a thread each
)
