"""Rung 9 — pipelined: double-buffered shared tiles and grouped block order.

What changed from warptile, two things:

1. Double buffering. Shared memory holds two A and two B tiles. While the block computes on
   tile k from one buffer, each thread has already issued the global loads of tile k+1
   into registers; after its FMAs it stores them into the other buffer, and one barrier per
   k-tile separates the phases (rung 8 needs two: one before computing, one before
   overwriting). The global-load latency (~500 cycles) now overlaps a whole k-tile of FMAs
   instead of stalling every warp at the barrier, and half the barriers are gone. This is
   the two-stage SIMT pipeline of CUTLASS's classic SGEMM (128×128×8, 256 threads), whose
   tile sizes are the defaults here: BK=8 keeps the doubled tiles at 16 KB in float32 (32
   KB in float64, under the 48 KB static limit) and the staging registers at one 128-bit
   vector of A and one of B per thread.
2. Grouped block order (GROUP_M). Blocks run roughly in launch order, so which tiles of C
   are in flight together decides what L2 holds. Row-major order puts ~one SM count of
   tiles along a row of C: every one reads the same A panel but a different B panel.
   Numbering the tiles in column-major groups of GROUP_M tile rows (Triton's "L2 cache
   optimisation") makes the tiles in flight a near-square patch, so each A and B panel
   loaded into L2 is reused by several blocks: at 4096³ with 128×128 tiles and 132 SMs,
   ~25 distinct panels instead of ~36. The grid is one-dimensional over tiles (grid-stride),
   batches in z.

What it should buy: the last big step of siboehm's ladder (kernels 11–12, +5–10 %), and
the L2 reuse that matters most at large sizes, where the gap to cuBLAS is otherwise set
by DRAM traffic.
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


def _wmiter(p: Mapping[str, int]) -> int:
    per_sub = 32 * p["TM"] * p["TN"] * p["WNITER"]  # outputs of one warp sub-tile step
    return (p["WM"] * p["WN"]) // per_sub if (p["WM"] * p["WN"]) % per_sub == 0 else 0


def _valid_warp(p: Mapping[str, int]) -> bool:
    """The 32 lanes exactly cover one WSUBM×WSUBN sub-tile with TM×TN each."""
    wmiter = _wmiter(p)
    if wmiter == 0 or p["WM"] % wmiter or p["WN"] % p["WNITER"]:
        return False
    wsubm, wsubn = p["WM"] // wmiter, p["WN"] // p["WNITER"]
    return (wsubm % p["TM"] == 0 and wsubn % p["TN"] == 0
            and (wsubm // p["TM"]) * (wsubn // p["TN"]) == 32)


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) * 32


def _smem(p: Mapping[str, int], itemsize: int) -> int:
    return 2 * (p["BK"] * p["BM"] + p["BK"] * p["BN"]) * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    BM, BN, BK, TM, TN = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    WM, WN, WNITER, GROUP_M = p["WM"], p["WN"], p["WNITER"], p["GROUP_M"]
    WMITER = _wmiter(p)
    WSUBM, WSUBN = WM // WMITER, WN // WNITER
    LCOLS = WSUBN // TN  # lanes across a warp sub-tile
    WCOLS = BN // WN  # warps across the block tile
    RT, CT = WMITER * TM, WNITER * TN  # a thread's outputs: RT × CT
    NT = _threads(p)
    W = width(dtype.itemsize)
    ISZ = dtype.itemsize
    VB = VECTOR_BYTES
    A_VPR, B_VPR = BK // W, BN // W
    A_VECS, B_VECS = BM * A_VPR, BK * B_VPR
    A_ROUNDS, B_ROUNDS = ceil_div(A_VECS, NT), ceil_div(B_VECS, NT)
    RPW = max(W, 32 * W // BK)  # rows of A one warp loads per round: the swizzle period
    SA, SB = A_ROUNDS * W, B_ROUNDS * W  # staging registers per thread
    ld, st, vload, vstore, gather, scatter, address, ALIGN = access_ops()
    zero = dtype.type(0)
    nptype = dtype.type

    @kernel_jit(NT)
    def pipelined(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0 (see rung 5)
        warp = tid // 32
        lane = tid % 32
        wr0 = (warp // WCOLS) * WM
        wc0 = (warp % WCOLS) * WN
        tr0 = wr0 + (lane // LCOLS) * TM
        tc0 = wc0 + (lane % LCOLS) * TN
        a_vec = (k_len % W == 0 and address(A) % VB == 0 and A.strides[2] == ISZ
                 and A.strides[1] % VB == 0 and A.strides[0] % VB == 0)
        b_vec = (n % W == 0 and address(B) % VB == 0 and B.strides[2] == ISZ
                 and B.strides[1] % VB == 0 and B.strides[0] % VB == 0)
        c_vec = (n % W == 0 and address(C) % VB == 0 and C.strides[2] == ISZ
                 and C.strides[1] % VB == 0 and C.strides[0] % VB == 0)

        As = cuda.shared.array((2, BK, BM), nptype, alignment=ALIGN)  # transposed, swizzled
        Bs = cuda.shared.array((2, BK, BN), nptype, alignment=ALIGN)
        acc = cuda.local.array((RT, CT), nptype)
        ra = cuda.local.array(RT, nptype)
        rb = cuda.local.array(CT, nptype)
        sa = cuda.local.array(SA, nptype)  # the next tile, staged in registers
        sb = cuda.local.array(SB, nptype)
        cv = cuda.local.array(W, nptype)

        tiles_m = (m + BM - 1) // BM
        tiles_n = (n + BN - 1) // BN
        group = GROUP_M * tiles_n  # tiles in one group of GROUP_M tile rows
        k_tiles = (k_len + BK - 1) // BK
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            t = cuda.blockIdx.x
            while t < tiles_m * tiles_n:
                # Grouped order: column-major inside groups of GROUP_M tile rows.
                first = (t // group) * GROUP_M
                gsize = min(tiles_m - first, GROUP_M)
                row0 = (first + (t % group) % gsize) * BM
                col0 = ((t % group) // gsize) * BN
                for i in range(RT):
                    for j in range(CT):
                        acc[i, j] = zero
                for kt in range(k_tiles + 1):
                    # Stage tile kt (if any) from global memory into registers...
                    if kt < k_tiles:
                        k0 = kt * BK
                        for rnd in range(A_ROUNDS):
                            v = tid + rnd * NT
                            r = v // A_VPR
                            c = (v % A_VPR) * W
                            gr = row0 + r
                            gc = k0 + c
                            if v < A_VECS and a_vec and gr < m and gc < k_len:
                                scatter(sa, (rnd * W,), vload(A, (za, gr, gc)))
                            else:
                                for q in range(W):
                                    if v < A_VECS and gr < m and gc + q < k_len:
                                        sa[rnd * W + q] = ld(A, (za, gr, gc + q))
                                    else:
                                        sa[rnd * W + q] = zero
                        for rnd in range(B_ROUNDS):
                            v = tid + rnd * NT
                            r = v // B_VPR
                            c = (v % B_VPR) * W
                            gr = k0 + r
                            gc = col0 + c
                            if v < B_VECS and b_vec and gr < k_len and gc < n:
                                scatter(sb, (rnd * W,), vload(B, (zb, gr, gc)))
                            else:
                                for q in range(W):
                                    if v < B_VECS and gr < k_len and gc + q < n:
                                        sb[rnd * W + q] = ld(B, (zb, gr, gc + q))
                                    else:
                                        sb[rnd * W + q] = zero
                    # ...compute on tile kt-1 (its buffer was filled before the last
                    # barrier) while those loads are in flight...
                    if kt > 0:
                        cur = (kt - 1) % 2
                        kk = 0
                        while kk < BK:
                            sk = ((kk // W) * RPW) & (BM - 1)
                            for i in range(0, RT, W):
                                rr = tr0 + (i // TM) * WSUBM + i % TM
                                scatter(ra, (i,), vload(As, (cur, kk, rr ^ sk)))
                            for j in range(0, CT, W):
                                scatter(rb, (j,), vload(Bs, (cur, kk, tc0 + (j // TN) * WSUBN
                                                             + j % TN)))
                            for i in range(RT):
                                for j in range(CT):
                                    acc[i, j] += ra[i] * rb[j]
                            kk += 1
                    # ...then store tile kt into the other buffer. Nobody reads that buffer
                    # now: its last readers (tile kt-2) finished before the last barrier.
                    if kt < k_tiles:
                        nxt = kt % 2
                        for rnd in range(A_ROUNDS):
                            v = tid + rnd * NT
                            if v < A_VECS:
                                r = v // A_VPR
                                c = (v % A_VPR) * W
                                swz = r ^ (((c // W) * RPW) & (BM - 1))
                                for q in range(W):
                                    st(As, (nxt, c + q, swz), sa[rnd * W + q])
                        for rnd in range(B_ROUNDS):
                            v = tid + rnd * NT
                            if v < B_VECS:
                                r = v // B_VPR
                                c = (v % B_VPR) * W
                                vstore(Bs, (nxt, r, c), gather(sb, (rnd * W,)))
                    cuda.syncthreads()  # the one barrier per k-tile
                # C: row 0 of acc written, rows shift up (constant indices, see rung 6).
                for i in range(RT):
                    gr = row0 + tr0 + (i // TM) * WSUBM + i % TM
                    if gr < m:
                        for j in range(0, CT, W):
                            gc = col0 + tc0 + (j // TN) * WSUBN + j % TN
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
                    for r in range(RT - 1):
                        for j in range(CT):
                            acc[r, j] = acc[r + 1, j]
                t += cuda.gridDim.x
            z += cuda.gridDim.z

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(m, BM) * ceil_div(n, BN), 1, batch)

    return CudaProgram(pipelined, (NT, 1, 1), grid)


SPEC = KernelSpec(
    name="pipelined",
    backend="cuda",
    rung=9,
    title="double-buffered shared tiles, one barrier per k-tile, grouped block order",
    build=build,
    params=(
        Param("BM", 128, (32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 8, (8, 16, 32), "depth of the shared-memory tiles"),
        Param("WM", 64, (16, 32, 64, 128), "rows of C per warp"),
        Param("WN", 32, (16, 32, 64, 128), "columns of C per warp"),
        Param("WNITER", 2, (1, 2, 4), "warp sub-tiles across WN"),
        Param("TM", 8, (4, 8), "rows of C per thread per sub-tile (whole vectors)"),
        Param("TN", 4, (4, 8), "columns of C per thread per sub-tile (whole vectors)"),
        Param("GROUP_M", 8, (1, 2, 4, 8, 16), "tile rows per group of the block order"),
    ),
    constraints=(
        Constraint("BM % WM == 0 and BN % WN == 0",
                   lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0),
        Constraint("32 lanes cover one WSUBM x WSUBN sub-tile: WMITER = WM*WN/(32*TM*TN*WNITER)"
                   " integral, (WSUBM/TM)*(WSUBN/TN) == 32", _valid_warp),
        Constraint("(BM/WM)*(BN/WN)*32 <= 1024 threads",
                   lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0
                   and _threads(p) <= 1024),
        Constraint("float32 tiles fit the 48 KB of static shared memory",
                   lambda p: _smem(p, 4) <= 48 * 1024),
    ),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    auto=True,  # kernel="auto" before tuning: the top rung at its defaults (float32 and 64)
    sim_params={"BM": 32, "BN": 16, "BK": 8, "WM": 32, "WN": 16, "WNITER": 1,
                "TM": 4, "TN": 4, "GROUP_M": 2},
)
