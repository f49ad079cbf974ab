"""Rung 7 — smem_layout: A transposed and swizzled in shared memory, conflict-free reads.

What changed from vectorized: the A tile is stored transposed, ``As[k][m]``, so that in the
compute loop each thread reads its TM values of A for one k as whole 128-bit vectors, like
it already reads B; and both tiles are laid out / read so that no shared-memory access
conflicts on banks:

- Stores of A (a 16-byte global vector → W scalar shared stores down a column of As): a
  warp's 32 threads cover RPW = 32·W/BK rows × BK/W vector columns; without care their
  W-th element lands in row k of As at column m, so all threads with the same m share a
  bank (4-way conflicts at BM=128, BK=16). Column ``m`` is therefore stored at
  ``m XOR S(k)`` with ``S(k) = (k // W) · RPW`` (mod BM): each of the BK/W vector columns
  gets its own group of RPW banks, and the XOR, being by a multiple of W, keeps every
  aligned group of W columns contiguous, so the 128-bit reads still work.
- Reads of A and B in the compute loop: a thread's TM rows (TN columns) are no longer one
  contiguous run but TM/W (TN/W) vectors spaced a panel apart (``row = iv·BM/(TM/W) +
  ty·W``), so neighbouring threads read neighbouring 16-byte chunks. With contiguous runs
  of 8 (rung 6), the 8 threads of a quarter-warp read chunks 32 bytes apart — two passes
  over the banks for every ``ld.shared.v4``.

tests/test_cuda_perf_banks.py counts the shared-memory wavefronts of both rungs' index
expressions (float32, defaults, per warp request): rung 6 reads A 2-way conflicted (scalar
loads of two thread rows 128 words apart) and B 2-way (8 wavefronts per ``ld.shared.v4``
instead of 4); storing A transposed without the swizzle would be 4-way; rung 7 is at the
minimum everywhere (1 wavefront per scalar store, 4 per 128-bit read).
What it should buy: shared-memory bandwidth is what register tiling leaves as the
bottleneck; siboehm's kernels 7–8 (transposed A, conflict-free layout) gain a few percent
on A6000 and more where loads are issued back to back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import VECTOR_BYTES, access_ops, width
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])


def _smem(p: Mapping[str, int], itemsize: int) -> int:
    return (p["BK"] * p["BM"] + p["BK"] * p["BN"]) * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    BM, BN, BK, TM, TN = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    NT = _threads(p)
    TCOLS = BN // TN  # threads across a block tile row
    W = width(dtype.itemsize)  # elements per 128-bit vector
    ISZ = dtype.itemsize
    VB = VECTOR_BYTES
    A_VPR, B_VPR = BK // W, BN // W
    A_VECS, B_VECS = BM * A_VPR, BK * B_VPR
    A_ROUNDS, B_ROUNDS = ceil_div(A_VECS, NT), ceil_div(B_VECS, NT)
    RPW = max(W, 32 * W // BK)  # rows of A one warp loads per round: the swizzle period
    PM = BM // (TM // W)  # a thread's row vectors are PM rows apart
    PN = BN // (TN // W)  # and its column vectors PN columns apart
    ld, st, vload, vstore, gather, scatter, address, ALIGN = access_ops()
    zero = dtype.type(0)
    nptype = dtype.type

    @kernel_jit(NT)
    def smem_layout(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0 (see rung 5)
        tx = tid % TCOLS
        ty = tid // TCOLS
        a_vec = (k_len % W == 0 and address(A) % VB == 0 and A.strides[2] == ISZ
                 and A.strides[1] % VB == 0 and A.strides[0] % VB == 0)
        b_vec = (n % W == 0 and address(B) % VB == 0 and B.strides[2] == ISZ
                 and B.strides[1] % VB == 0 and B.strides[0] % VB == 0)
        c_vec = (n % W == 0 and address(C) % VB == 0 and C.strides[2] == ISZ
                 and C.strides[1] % VB == 0 and C.strides[0] % VB == 0)

        As = cuda.shared.array((BK, BM), nptype, alignment=ALIGN)  # transposed: As[k][m]
        Bs = cuda.shared.array((BK, BN), nptype, alignment=ALIGN)
        acc = cuda.local.array((TM, TN), nptype)
        ra = cuda.local.array(TM, nptype)
        rb = cuda.local.array(TN, nptype)
        av = cuda.local.array(W, nptype)
        cv = cuda.local.array(W, nptype)

        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            bm = cuda.blockIdx.y
            while bm < (m + BM - 1) // BM:
                bn = cuda.blockIdx.x
                while bn < (n + BN - 1) // BN:
                    row0 = bm * BM
                    col0 = bn * BN
                    for i in range(TM):
                        for j in range(TN):
                            acc[i, j] = zero
                    k0 = 0
                    while k0 < k_len:
                        # A tile: a 128-bit vector along k from global, W scalar stores down
                        # the swizzled column of As (element (r, k) lives at As[k, r ^ S(k)]).
                        for rnd in range(A_ROUNDS):
                            v = tid + rnd * NT
                            if v < A_VECS:
                                r = v // A_VPR
                                c = (v % A_VPR) * W
                                gr = row0 + r
                                gc = k0 + c
                                if a_vec and gr < m and gc < k_len:
                                    scatter(av, (0,), vload(A, (za, gr, gc)))
                                else:
                                    for q in range(W):
                                        if gr < m and gc + q < k_len:
                                            av[q] = ld(A, (za, gr, gc + q))
                                        else:
                                            av[q] = zero
                                swz = r ^ (((c // W) * RPW) & (BM - 1))
                                for q in range(W):
                                    st(As, (c + q, swz), av[q])
                        for rnd in range(B_ROUNDS):
                            v = tid + rnd * NT
                            if v < B_VECS:
                                r = v // B_VPR
                                c = (v % B_VPR) * W
                                gr = k0 + r
                                gc = col0 + c
                                if b_vec and gr < k_len and gc < n:
                                    vstore(Bs, (r, c), vload(B, (zb, gr, gc)))
                                else:
                                    for q in range(W):
                                        if gr < k_len and gc + q < n:
                                            Bs[r, c + q] = ld(B, (zb, gr, gc + q))
                                        else:
                                            Bs[r, c + q] = zero
                        cuda.syncthreads()
                        kk = 0
                        while kk < BK:
                            sk = ((kk // W) * RPW) & (BM - 1)
                            for i in range(0, TM, W):
                                scatter(ra, (i,), vload(As, (kk, ((i // W) * PM + ty * W) ^ sk)))
                            for j in range(0, TN, W):
                                scatter(rb, (j,), vload(Bs, (kk, (j // W) * PN + tx * W)))
                            for i in range(TM):
                                for j in range(TN):
                                    acc[i, j] += ra[i] * rb[j]
                            kk += 1
                        cuda.syncthreads()
                        k0 += BK
                    # C tile, one row at a time with row 0 of acc written and the rows
                    # shifting up (constant indices keep acc in registers, see rung 6).
                    for i in range(TM):
                        gr = row0 + (i // W) * PM + ty * W + i % W
                        if gr < m:
                            for j in range(0, TN, W):
                                gc = col0 + (j // W) * PN + tx * W
                                if c_vec and gc < n:
                                    if beta == 0:
                                        for q in range(W):
                                            cv[q] = alpha * acc[0, j + q]
                                    else:
                                        scatter(cv, (0,), vload(C, (z, gr, gc)))
                                        for q in range(W):
                                            cv[q] = alpha * acc[0, j + q] + beta * cv[q]
                                    vstore(C, (z, gr, gc), gather(cv, (0,)))
                                else:
                                    for q in range(W):
                                        if gc + q < n:
                                            if beta == 0:
                                                st(C, (z, gr, gc + q), alpha * acc[0, j + q])
                                            else:
                                                st(C, (z, gr, gc + q), alpha * acc[0, j + q]
                                                   + beta * ld(C, (z, gr, gc + q)))
                        for r in range(TM - 1):
                            for j in range(TN):
                                acc[r, j] = acc[r + 1, j]
                    bn += cuda.gridDim.x
                bm += cuda.gridDim.y
            z += cuda.gridDim.z

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(n, BN), ceil_div(m, BM), batch)

    return CudaProgram(smem_layout, (NT, 1, 1), grid)


SPEC = KernelSpec(
    name="smem_layout",
    backend="cuda",
    rung=7,
    title="A transposed + swizzled in shared memory, bank-conflict-free vector reads",
    build=build,
    params=(
        Param("BM", 128, (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 16, (8, 16, 32), "depth of the shared-memory tiles"),
        Param("TM", 8, (4, 8, 16), "rows of C per thread (whole 128-bit vectors)"),
        Param("TN", 8, (4, 8, 16), "columns of C per thread (whole 128-bit vectors)"),
    ),
    constraints=(
        Constraint("BM % TM == 0 and BN % TN == 0", lambda p: p["BM"] % p["TM"] == 0
                   and p["BN"] % p["TN"] == 0),
        Constraint("16 <= (BM/TM)*(BN/TN) <= 1024 threads",
                   lambda p: p["BM"] % p["TM"] == 0 and p["BN"] % p["TN"] == 0
                   and 16 <= _threads(p) <= 1024),
        Constraint("float32 tiles fit the 48 KB of static shared memory",
                   lambda p: _smem(p, 4) <= 48 * 1024),
    ),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    sim_params={"BM": 16, "BN": 16, "BK": 8, "TM": 4, "TN": 4},
)
