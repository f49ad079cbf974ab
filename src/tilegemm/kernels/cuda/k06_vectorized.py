"""Rung 6 — vectorized: the register2d block tile, moved with 128-bit loads and stores.

What changed from register2d: every global→shared copy, every shared→register read of B
and every store of C moves 16 bytes per instruction (``ld.global.v4.f32``,
``st.shared.v4.f32``, ``ld.shared.v4.f32``, ``st.global.v4.f32``; two float64 per vector)
instead of 4 (or 8). The block still computes a BM×BN tile of C by walking K in steps of BK
through shared tiles ``As[BM][BK]`` and ``Bs[BK][BN]``, and each thread still accumulates a
TM×TN outer product in registers.

Why it should help: register2d's inner loop is already mostly FMAs, but its tile loads
issue one instruction (and one address computation) per element; with four elements per
instruction the load/store instruction count drops ~4×, fewer load-store-unit slots are
spent per byte and the copy phase between the two barriers gets shorter. siboehm's SGEMM
kernel 6 gains ~15–20 % over kernel 5 on an A6000 from this change. A is still stored
row-major in shared memory, so the compute loop reads it one element at a time (rung 7
transposes it).

The 128-bit path needs 16-byte-aligned addresses: the data pointer 16-byte aligned, the
row stride a multiple of 16 bytes (``K % 4 == 0`` for A, ``N % 4 == 0`` for B and C in
float32) and a column offset that is a multiple of 4. That is tested once per launch, per
operand; an operand that fails (any odd K or N, a strided view) takes the scalar path with
per-element bounds, so every M, N, K is correct and only speed differs. Vectors are loaded
with an ``@intrinsic`` (see ``kernels/cuda/_access.py``), replaced by element accesses
under the simulator.
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
    return (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    BM, BN, BK, TM, TN = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    NT = _threads(p)
    TCOLS = BN // TN  # threads across a block tile row
    W = width(dtype.itemsize)  # elements per 128-bit vector
    ISZ = dtype.itemsize
    VB = VECTOR_BYTES
    # Vectors in each tile and how many rounds of NT threads copy them.
    A_VPR, B_VPR = BK // W, BN // W
    A_VECS, B_VECS = BM * A_VPR, BK * B_VPR
    A_ROUNDS, B_ROUNDS = ceil_div(A_VECS, NT), ceil_div(B_VECS, NT)
    ld, st, vload, vstore, gather, scatter, address, ALIGN = access_ops()
    zero = dtype.type(0)
    nptype = dtype.type

    @kernel_jit(NT)
    def vectorized(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0 (see rung 5)
        tx = tid % TCOLS
        ty = tid // TCOLS
        # Can each operand be moved in aligned 16-byte vectors? (decided once per launch)
        a_vec = (k_len % W == 0 and address(A) % VB == 0 and A.strides[2] == ISZ
                 and A.strides[1] % VB == 0 and A.strides[0] % VB == 0)
        b_vec = (n % W == 0 and address(B) % VB == 0 and B.strides[2] == ISZ
                 and B.strides[1] % VB == 0 and B.strides[0] % VB == 0)
        c_vec = (n % W == 0 and address(C) % VB == 0 and C.strides[2] == ISZ
                 and C.strides[1] % VB == 0 and C.strides[0] % VB == 0)

        As = cuda.shared.array((BM, BK), nptype, alignment=ALIGN)
        Bs = cuda.shared.array((BK, BN), nptype, alignment=ALIGN)
        acc = cuda.local.array((TM, TN), nptype)
        ra = cuda.local.array(TM, nptype)
        rb = cuda.local.array(TN, nptype)
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
                        # A tile: BM rows of BK, one 128-bit vector per thread per round.
                        for rnd in range(A_ROUNDS):
                            v = tid + rnd * NT
                            if v < A_VECS:
                                r = v // A_VPR
                                c = (v % A_VPR) * W
                                gr = row0 + r
                                gc = k0 + c
                                if a_vec and gr < m and gc < k_len:
                                    vstore(As, (r, c), vload(A, (za, gr, gc)))
                                else:
                                    for q in range(W):
                                        if gr < m and gc + q < k_len:
                                            As[r, c + q] = ld(A, (za, gr, gc + q))
                                        else:
                                            As[r, c + q] = zero
                        # B tile: BK rows of BN.
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
                            for i in range(TM):
                                ra[i] = ld(As, (ty * TM + i, kk))
                            for j in range(0, TN, W):
                                scatter(rb, (j,), vload(Bs, (kk, tx * TN + j)))
                            for i in range(TM):
                                for j in range(TN):
                                    acc[i, j] += ra[i] * rb[j]
                            kk += 1
                        cuda.syncthreads()
                        k0 += BK
                    # C tile, one thread row at a time: 128-bit stores where the row
                    # allows, else element by element. Row 0 of acc is always the one
                    # written and the rows shift up after it, so every index into acc is a
                    # compile-time constant and acc stays in registers (a loop over i that
                    # LLVM does not unroll would force acc into local memory).
                    for i in range(TM):
                        gr = row0 + ty * TM + i
                        if gr < m:
                            for j in range(0, TN, W):
                                gc = col0 + tx * TN + j
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

    return CudaProgram(vectorized, (NT, 1, 1), grid)


SPEC = KernelSpec(
    name="vectorized",
    backend="cuda",
    rung=6,
    title="register2d with 128-bit global/shared loads and stores",
    build=build,
    params=(
        Param("BM", 128, (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 16, (8, 16, 32), "depth of the shared-memory tiles"),
        Param("TM", 8, (2, 4, 8, 16), "rows of C per thread"),
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
