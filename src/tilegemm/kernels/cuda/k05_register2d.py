"""Rung 5 — register2d: a BM×BN block tile, each thread a TM×TN register tile of outer products.

Rung 4 reuses a B value across R outputs of one column, but still loads one A value from
shared memory per multiply-add. Here each thread owns a TM×TN tile of C in registers. For
every k in the block's BK-deep slice it loads a TM-element column fragment of the A tile
and a TN-element row fragment of the B tile from shared memory into registers and adds
their outer product: TM + TN shared loads for TM·TN multiply-adds (16 loads for 64 FMAs
at the defaults, against 5 for 4 in rung 4). Larger block tiles (BM = BN = 128) also
halve or quarter global traffic per FLOP compared with 32×32 tiles, and the
(BM/TM)·(BN/TN) = 256 threads each copy (BM·BK + BK·BN)/threads elements of the next
slice with consecutive threads on consecutive addresses (coalesced).

Thread (row r, column c) of the (BM/TM)×(BN/TN) thread grid owns rows ``r + i·BM/TM`` and
columns ``c + j·BN/TN`` of the block tile (interleaved, not contiguous): a warp then reads
consecutive B elements (no bank conflicts; contiguous TN-wide strips would give TN-way
conflicts), few distinct A rows (broadcasts), and stores consecutive columns of C.
Contiguous strips become worthwhile with 128-bit vector loads, a later rung.

The accumulator and the two fragments are ``cuda.local.array`` indexed only in loops with
constant trip counts, which LLVM fully unrolls, so they live in registers (checked in
tests/test_cuda_resources.py: no local memory, no spills at the float32 defaults on sm_80
and sm_90). Partial tiles at the edges are zero-filled in shared memory and the stores
are guarded, so any M, N, K works; all loop bounds are uniform per block, so every thread
reaches every barrier.

Two habits of Numba cost instructions here, and plain Numba can avoid both (counted with
``tilegemm explain register2d --sass`` on sm_90, float32 defaults):

- Numba indexes like Python: a signed index may be negative and then counts from the end,
  so every ``A[z, i, k]`` carries a compare-and-select per index. The copies index with
  ``np.uint64(...)``, which Numba knows cannot be negative: about 17 fewer instructions per
  k step in the k-tile (the FFMA share of a k-tile rises from 48 % to 55 %).
- ``for kk in range(BK)`` keeps a 64-bit trip count and index beside the loop; a ``while``
  loop on one counter saves 4–5 instructions per k step (hot loop 65 % → 71 % FFMA).

The later rungs go further (written-out k steps, 128-bit loads, no per-element bounds
checks inside the matrix): see docs/performance.md, "Machine code".
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


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    bm, bn, bk, tm, tn = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    threads = _threads(p)
    row_step = bm // tm  # thread rows; also the row distance between a thread's outputs
    col_step = bn // tn  # thread columns; also the column distance between its outputs
    loads_a = bm * bk // threads  # elements of the A slice (bm × bk) each thread copies
    loads_b = bk * bn // threads  # elements of the B slice (bk × bn) each thread copies
    outputs = tm * tn  # a closure constant: numba needs a literal array shape
    zero = dtype.type(0)
    nptype = dtype.type

    @kernel_jit(threads)
    def register2d(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        sA = cuda.shared.array((bm, bk), nptype)
        sB = cuda.shared.array((bk, bn), nptype)
        acc = cuda.local.array(outputs, nptype)
        frag_a = cuda.local.array(tm, nptype)
        frag_b = cuda.local.array(tn, nptype)
        # ``& 1023`` changes nothing (tid < 1024) but tells the compiler tid >= 0, so the
        # sign fix-ups of // and % and numba's negative-index wraparound fold away and the
        # fragment addresses become constant offsets (about 50 fewer registers).
        tid = cuda.threadIdx.x & 1023
        t_row = tid // col_step
        t_col = tid % col_step
        k_tiles = (k_len + bk - 1) // bk
        # Loop bounds below depend on block indices and shapes only: uniform per block.
        tiles_m = (m + bm - 1) // bm
        tiles_n = (n + bn - 1) // bn
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            ti = cuda.blockIdx.y
            while ti < tiles_m:
                tj = cuda.blockIdx.x
                while tj < tiles_n:
                    row0 = ti * bm
                    col0 = tj * bn
                    for x in range(outputs):
                        acc[x] = zero
                    for t in range(k_tiles):
                        k0 = t * bk
                        # Copy the slices; consecutive threads take consecutive addresses.
                        for l in range(loads_a):
                            e = tid + l * threads
                            r = e // bk
                            c = e % bk
                            i = row0 + r
                            kk = k0 + c
                            sA[r, c] = (A[np.uint64(za), np.uint64(i), np.uint64(kk)]
                                        if i < m and kk < k_len else zero)
                        for l in range(loads_b):
                            e = tid + l * threads
                            r = e // bn
                            c = e % bn
                            kk = k0 + r
                            j = col0 + c
                            sB[r, c] = (B[np.uint64(zb), np.uint64(kk), np.uint64(j)]
                                        if kk < k_len and j < n else zero)
                        cuda.syncthreads()  # the slices are complete
                        kk = np.uint32(0)  # a while loop: one counter (see the docstring)
                        while kk < bk:
                            for i in range(tm):
                                frag_a[i] = sA[t_row + i * row_step, kk]
                            for j in range(tn):
                                frag_b[j] = sB[kk, t_col + j * col_step]
                            for i in range(tm):
                                for j in range(tn):
                                    acc[i * tn + j] += frag_a[i] * frag_b[j]
                            kk += np.uint32(1)
                        cuda.syncthreads()  # everyone is done before the slices are overwritten
                    for i in range(tm):
                        row = row0 + t_row + i * row_step
                        if row < m:
                            for j in range(tn):
                                col = col0 + t_col + j * col_step
                                if col < n:
                                    if beta == 0:
                                        C[z, row, col] = alpha * acc[i * tn + j]
                                    else:
                                        C[z, row, col] = (alpha * acc[i * tn + j]
                                                          + beta * C[z, row, col])
                    tj += cuda.gridDim.x
                ti += cuda.gridDim.y
            z += cuda.gridDim.z

    return CudaProgram(register2d, (threads, 1, 1), tile_grid(bm, bn))


SPEC = KernelSpec(
    name="register2d",
    backend="cuda",
    rung=5,
    title="BM×BN×BK block tile, TM×TN register tile per thread (outer products)",
    build=build,
    params=(
        Param("BM", 128, (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 8, (4, 8, 16, 32), "depth of the A and B slices staged in shared memory"),
        Param("TM", 8, (1, 2, 4, 8, 16), "rows of C per thread"),
        Param("TN", 8, (1, 2, 4, 8, 16), "columns of C per thread"),
    ),
    constraints=(
        Constraint("BM % TM == 0 and BN % TN == 0 (the thread tiles cover the block tile)",
                   lambda p: p["BM"] % p["TM"] == 0 and p["BN"] % p["TN"] == 0),
        Constraint("32 <= (BM/TM)·(BN/TN) <= 1024 threads per block (a full warp, the CUDA "
                   "limit)", lambda p: 32 <= _threads(p) <= 1024),
        Constraint("(BM·BK) % threads == 0 and (BK·BN) % threads == 0 (each thread copies a "
                   "whole number of elements of each slice)",
                   lambda p: (p["BM"] * p["BK"]) % _threads(p) == 0
                   and (p["BK"] * p["BN"]) % _threads(p) == 0),
        Constraint("TM·TN <= 64 (a larger register tile spills to local memory)",
                   lambda p: p["TM"] * p["TN"] <= 64),
    ),
    dtypes=FLOATS + INTS,
    threads=_threads,
    smem=lambda p, itemsize: (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * itemsize,
    doc=__doc__,
    sim_params={"BM": 16, "BN": 16, "BK": 4, "TM": 2, "TN": 2},
)
