"""Rung 4 — register1d: each thread computes R outputs of a column, reusing one B value R times.

Rung 3 does two shared-memory loads per multiply-add (``sA[ty, k]`` and ``sB[k, tx]``), so
shared-memory bandwidth, not arithmetic, bounds it. Here the block still stages TILE×TILE
tiles of A and B, but has only TILE × TILE/R threads: thread (tx, ty) computes the R
outputs in rows ``ty + r·TILE/R`` (r = 0..R-1) of column ``tx``. In the inner loop it
loads ``sB[k, tx]`` once into a register and uses it for R multiply-adds with R values of
A: R + 1 shared loads for R multiply-adds instead of 2R, and R independent accumulators
give the scheduler instruction-level parallelism to hide latency. Each thread also copies
R elements of each tile, in rows ``ty + r·TILE/R`` (coalesced along x).

This is the optimisation note's ``matrixMulSharedILPkernel`` generalised: the original hard-codes R
= 2 and a ``+16`` row offset (valid only for TILE = 32) and assumes square sizes that are multiples
of TILE. The optimisation note's sweep at 1024³ with 32×32 tiles (R = 1, 2, 4, 8, 16, 32 → 3.67,
4.80, 6.02, 6.77, 6.67, 5.32 TFLOP/s) shows the trade-off: more outputs per thread mean more
reuse but fewer threads per block and more registers, until occupancy falls.

The accumulators are a ``cuda.local.array`` indexed only inside loops with constant trip
counts; LLVM unrolls them and keeps the array in registers (no local memory; checked in
tests/test_cuda_resources.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.launch import tile_grid
from tilegemm.registry import FLOATS, INTS, Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    tile, r_out = p["TILE"], p["R"]
    rows = tile // r_out  # threads along y; also the row step between a thread's outputs
    zero = dtype.type(0)
    nptype = dtype.type

    @kernel_jit(tile * rows)
    def register1d(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        sA = cuda.shared.array((tile, tile), nptype)
        sB = cuda.shared.array((tile, tile), nptype)
        acc = cuda.local.array(r_out, nptype)
        # ``& 1023`` changes nothing (indices < 1024) but tells the compiler they are >= 0,
        # so numba's negative-index wraparound folds away in the shared-memory addresses.
        tx = cuda.threadIdx.x & 1023  # column within the tile
        ty = cuda.threadIdx.y & 1023  # first row within the tile; the others are ty + r * rows
        k_tiles = (k_len + tile - 1) // tile
        # Loop bounds below depend on block indices and shapes only: uniform per block.
        tiles_m = (m + tile - 1) // tile
        tiles_n = (n + tile - 1) // tile
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            ti = cuda.blockIdx.y
            while ti < tiles_m:
                tj = cuda.blockIdx.x
                while tj < tiles_n:
                    i0 = ti * tile + ty
                    j = tj * tile + tx
                    for r in range(r_out):
                        acc[r] = zero
                    for t in range(k_tiles):
                        ka = t * tile + tx  # column of A this thread copies
                        for r in range(r_out):
                            i = i0 + r * rows
                            kb = t * tile + ty + r * rows  # row of B this thread copies
                            sA[ty + r * rows, tx] = A[za, i, ka] if i < m and ka < k_len else zero
                            sB[ty + r * rows, tx] = B[zb, kb, j] if kb < k_len and j < n else zero
                        cuda.syncthreads()  # the tiles are complete
                        for kk in range(tile):
                            b = sB[kk, tx]  # one shared load, reused for R outputs
                            for r in range(r_out):
                                acc[r] += sA[ty + r * rows, kk] * b
                        cuda.syncthreads()  # everyone is done before the tiles are overwritten
                    if j < n:
                        for r in range(r_out):
                            i = i0 + r * rows
                            if i < m:
                                if beta == 0:
                                    C[z, i, j] = alpha * acc[r]
                                else:
                                    C[z, i, j] = alpha * acc[r] + beta * C[z, i, j]
                    tj += cuda.gridDim.x
                ti += cuda.gridDim.y
            z += cuda.gridDim.z

    return CudaProgram(register1d, (tile, rows, 1), tile_grid(tile, tile))


SPEC = KernelSpec(
    name="register1d",
    backend="cuda",
    rung=4,
    title="R outputs per thread down a column, B value kept in a register (the optimisation "
          "note's ILP kernel)",
    build=build,
    params=(
        Param("TILE", 32, (8, 16, 32), "tile side (TILE × TILE tiles of A, B and C)"),
        Param("R", 4, (1, 2, 4, 8, 16, 32), "outputs per thread (rows ty + r·TILE/R)"),
    ),
    constraints=(
        Constraint("TILE % R == 0 (each thread's R rows must divide the tile evenly)",
                   lambda p: p["TILE"] % p["R"] == 0),
    ),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["TILE"] * (p["TILE"] // p["R"]),
    smem=lambda p, itemsize: 2 * p["TILE"] ** 2 * itemsize,
    doc=__doc__,
    sim_params={"TILE": 8, "R": 2},
)
