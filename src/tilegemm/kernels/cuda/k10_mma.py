"""Rung 10 — mma: tensor cores (TF32, 3×TF32, FP16, BF16), fed by ldmatrix and cp.async.

What changed from pipelined: the multiply-adds leave the CUDA cores.

1. Tensor cores. Each warp computes its WM×WN tile as (WM/16)×(WN/8) fragments of
   ``mma.sync.m16n8k8`` with TF32 inputs and float32 accumulation: one instruction does
   16·8·8 multiply-adds, where an FFMA does one. Each operand value is first rounded to
   TF32 (10 mantissa bits, ``cvt.rna``), so the result is *less precise* than the FFMA
   rungs: this rung runs only when the caller asks for it with ``precision="tf32"``, never
   for ``kernel="auto"`` at the default ``precision="ieee"``. ``precision="3xtf32"`` (PASSES
   = 3) splits each operand into a TF32 "big" part and a TF32 "small" remainder and adds
   small·big + big·small + big·big: three mma per step and near-float32 accuracy (see
   docs/tensor-cores.md for the errors measured against float64).
2. ``cp.async`` pipeline. Global → shared copies bypass registers (``LDGSTS``), so a
   STAGES-deep ring of shared tiles is in flight at once: tile k+STAGES-1 is being copied
   while tile k is multiplied, with one barrier per k-tile. Edges are zero-filled by the
   copy itself (its source size is the valid part), so the hot loop has no bounds tests.
   The ring stays within the 48 KB of static shared memory (3 stages of 128×16 + 16×128
   float32 by default); more stages or deeper tiles would need dynamic shared memory with
   the opt-in attribute, which this rung does not use.
3. Conflict-free fragment loads. A fragments come from ``ldmatrix.x4`` (one instruction
   per 16×8 fragment instead of four loads) out of an A tile whose 16-byte chunks are
   XOR-swizzled by row, so the eight rows each ldmatrix phase reads fall in distinct banks;
   the B tile's chunks are swizzled by k so the scalar B-fragment loads are conflict-free.

float16 and bfloat16 operands use ``mma.sync.m16n8k16`` with f16 or bf16 inputs and
float32 accumulation; both fragments come from ``ldmatrix`` (B's with ``.trans``, from the
row-major k×n tile), and BK must be a multiple of 16. Rows that are not 16-byte aligned are
staged with plain loads (``cp.async`` copies 4 bytes at least). The result is 16-bit like
the operands (NumPy's rule) or, with ``dtype=np.float32``, the float32 sums unrounded.

What it should buy: TF32 tensor cores peak at ~495 TFLOP/s dense on an H100 against ~67
for FP32 FFMA, so a compute-bound product can run several times faster; 3×TF32 spends three
mma per step to keep float32-like accuracy and should still beat FFMA by ~1.5–2×.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.errors import InvalidValueError
from tilegemm.kernels.cuda._access import access_ops
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda._tensorcore import tensorcore_ops
from tilegemm.launch import ceil_div, flat_tile_grid
from tilegemm.registry import Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)

# precision= value -> PASSES (mma per k step). The API sets PASSES from precision=.
PRECISIONS: dict[str, int] = {"tf32": 1, "3xtf32": 3}


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) * 32


def _smem(p: Mapping[str, int], itemsize: int) -> int:
    return p["STAGES"] * (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    if np.dtype(dtype).name in ("float16", "bfloat16"):
        return _build_16bit(p, np.dtype(dtype).name)
    return _build_tf32(p)


def _dtype_check(p: Mapping[str, int], dtype: np.dtype) -> str | None:
    if np.dtype(dtype).itemsize == 2 and p["BK"] % 16:
        return (f"{np.dtype(dtype).name} needs BK a multiple of 16 (one m16n8k16 step), "
                f"got BK={p['BK']}")
    return None


def _swizzle(c: int, r: int, chunks: int) -> int:
    """Physical 16-byte chunk of logical chunk ``c`` in row ``r`` of a tile with ``chunks``
    chunks a row: XOR with the row's position among the rows of the same 128-byte bank
    line, so 8 consecutive rows reading one logical chunk hit 8 distinct bank groups."""
    return c ^ ((r // max(1, 8 // chunks)) % min(chunks, 8))


def _build_16bit(p: Mapping[str, int], dtype: str) -> CudaProgram:
    """float16 or bfloat16 operands: m16n8k16 mma with float32 accumulation; A and B
    fragments by ldmatrix (B with .trans) from chunk-swizzled tiles; BK a multiple of 16.

    bfloat16 arrays arrive as their 16-bit patterns (int16, as PyTorch views them too), which
    the copies and ldmatrix move unchanged and only the mma reads as bfloat16. C is
    written through ``store_f32``, which converts by C's own type: a 16-bit result like the
    operands, or float32 (``dtype=np.float32``) unrounded."""
    global cuda
    from numba import cuda

    BM, BN, BK, WM, WN = p["BM"], p["BN"], p["BK"], p["WM"], p["WN"]
    STAGES, GROUP_M = p["STAGES"], p["GROUP_M"]
    if BK % 16:
        raise InvalidValueError(f"mma: {dtype} needs BK a multiple of 16 (one m16n8k16 "
                                f"step), got BK={BK}")
    MI, NI = WM // 16, WN // 8
    NB = (NI + 1) // 2  # ldmatrix.x4.trans loads two n-blocks of B
    NB2 = 2 * NB
    ACC = MI * NI * 4
    WCOLS = BN // WN
    NT = _threads(p)
    ACH, BCH = BK // 8, BN // 8  # 16-byte chunks (8 halves) per tile row
    A_CHUNKS, B_CHUNKS = BM * ACH, BK * BCH
    A_ROUNDS, B_ROUNDS = ceil_div(A_CHUNKS, NT), ceil_div(B_CHUNKS, NT)
    ASH, AMOD = max(1, 8 // ACH), min(ACH, 8)
    BSH, BMOD = max(1, 8 // BCH), min(BCH, 8)
    load, store, _, _, _, _, address, ALIGN = access_ops()
    tc = tensorcore_ops()
    mma = tc.mma_f16 if dtype == "float16" else tc.mma_bf16
    ldsm, ldsm_t = tc.ldmatrix_x4, tc.ldmatrix_x4_trans
    cp16, commit = tc.cp_async16, tc.cp_commit
    load_f32, store_f32 = tc.load_f32, tc.store_f32
    wait_ring = tc.cp_wait(STAGES - 2)
    wait_all = tc.cp_wait(0)
    elt = np.float16 if dtype == "float16" else np.int16  # bfloat16: its bit patterns
    f32 = np.float32
    zero = f32(0)  # (a float16 constant frozen as a closure variable makes NVVM reject the IR)

    @cuda.jit(device=True, inline=True)
    def load_stage(As, Bs, A, B, s, k0, za, zb, row0, col0, m, n, k_len, a_vec, b_vec, tid):
        for rnd in range(A_ROUNDS):
            v = tid + rnd * NT
            if v < A_CHUNKS:
                r = v // ACH
                c = v % ACH
                pc = c ^ ((r // ASH) % AMOD)
                gr = row0 + r
                gc = k0 + c * 8
                if a_vec:
                    nb = 0
                    if gr < m and gc < k_len:
                        nb = min(k_len - gc, 8) * 2
                    cp16(As, (s, r, pc * 8), A, (za, min(gr, m - 1), min(gc, k_len - 1)), nb)
                else:  # cp.async copies 4 bytes at least: plain loads for odd rows
                    for q in range(8):
                        x = elt(0)
                        if gr < m and gc + q < k_len:
                            x = load(A, (za, gr, gc + q))
                        store(As, (s, r, pc * 8 + q), x)
        for rnd in range(B_ROUNDS):
            v = tid + rnd * NT
            if v < B_CHUNKS:
                r = v // BCH
                c = v % BCH
                pc = c ^ ((r // BSH) % BMOD)
                gr = k0 + r
                gc = col0 + c * 8
                if b_vec:
                    nb = 0
                    if gr < k_len and gc < n:
                        nb = min(n - gc, 8) * 2
                    cp16(Bs, (s, r, pc * 8), B, (zb, min(gr, k_len - 1), min(gc, n - 1)), nb)
                else:
                    for q in range(8):
                        x = elt(0)
                        if gr < k_len and gc + q < n:
                            x = load(B, (zb, gr, gc + q))
                        store(Bs, (s, r, pc * 8 + q), x)

    @cuda.jit(device=True, inline=True)
    def put(C, z, gr, gc, v, alpha, beta, m, n):
        if gr < m and gc < n:
            if beta == 0:
                store_f32(C, (z, gr, gc), alpha * v)
            else:
                store_f32(C, (z, gr, gc), alpha * v + beta * load_f32(C, (z, gr, gc)))

    @kernel_jit(NT)
    def mma_16bit_kernel(A, B, C, alpha_h, beta_h):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        alpha = f32(alpha_h)
        beta = f32(beta_h)
        tid = cuda.threadIdx.x & 1023
        warp = tid // 32
        lane = tid % 32
        wm0 = (warp // WCOLS) * WM
        wn0 = (warp % WCOLS) * WN
        a_vec = (k_len % 8 == 0 and address(A) % 16 == 0 and A.strides[2] == 2
                 and A.strides[1] % 16 == 0 and A.strides[0] % 16 == 0)
        b_vec = (n % 8 == 0 and address(B) % 16 == 0 and B.strides[2] == 2
                 and B.strides[1] % 16 == 0 and B.strides[0] % 16 == 0)
        As = cuda.shared.array((STAGES, BM, BK), elt, alignment=ALIGN)
        Bs = cuda.shared.array((STAGES, BK, BN), elt, alignment=ALIGN)
        acc = cuda.local.array(ACC, f32)  # fragment (i, j) at 4 * (i * NI + j)
        fa = cuda.local.array((MI, 4), np.uint32)
        fb = cuda.local.array((NB2, 2), np.uint32)
        tiles_m = (m + BM - 1) // BM
        tiles_n = (n + BN - 1) // BN
        group = GROUP_M * tiles_n
        k_tiles = (k_len + BK - 1) // BK
        mat = lane // 8
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            tile = cuda.blockIdx.x
            while tile < tiles_m * tiles_n:
                first = (tile // group) * GROUP_M
                gsize = min(tiles_m - first, GROUP_M)
                row0 = (first + (tile % group) % gsize) * BM
                col0 = ((tile % group) // gsize) * BN
                for q in range(ACC):
                    acc[q] = zero
                for s in range(STAGES - 1):
                    if s < k_tiles:
                        load_stage(As, Bs, A, B, s, s * BK, za, zb, row0, col0, m, n, k_len,
                                   a_vec, b_vec, tid)
                    commit()
                kt = 0
                while kt < k_tiles:
                    wait_ring()
                    cuda.syncthreads()
                    nt = kt + STAGES - 1
                    if nt < k_tiles:
                        load_stage(As, Bs, A, B, nt % STAGES, nt * BK, za, zb, row0, col0, m,
                                   n, k_len, a_vec, b_vec, tid)
                    commit()
                    cur = kt % STAGES
                    kk = 0
                    while kk < BK:
                        for i in range(MI):
                            r = wm0 + i * 16 + lane % 8 + 8 * (mat % 2)
                            c = kk // 8 + mat // 2
                            x0, x1, x2, x3 = ldsm(As, (cur, r, (c ^ ((r // ASH) % AMOD)) * 8))
                            fa[i, 0] = x0
                            fa[i, 1] = x1
                            fa[i, 2] = x2
                            fa[i, 3] = x3
                        kr = kk + lane % 8 + 8 * (mat % 2)
                        for jj in range(NB):
                            # matrices: k +0/+8 of n-block 2jj, then of n-block 2jj+1 (if any)
                            c = wn0 // 8 + 2 * jj + (mat // 2 if 2 * jj + 1 < NI else 0)
                            y0, y1, y2, y3 = ldsm_t(Bs, (cur, kr, (c ^ ((kr // BSH) % BMOD)) * 8))
                            fb[2 * jj, 0] = y0
                            fb[2 * jj, 1] = y1
                            fb[2 * jj + 1, 0] = y2
                            fb[2 * jj + 1, 1] = y3
                        for i in range(MI):
                            for j in range(NI):
                                q = 4 * (i * NI + j)
                                d0, d1, d2, d3 = mma(
                                    (fa[i, 0], fa[i, 1], fa[i, 2], fa[i, 3]),
                                    (fb[j, 0], fb[j, 1]),
                                    (acc[q], acc[q + 1], acc[q + 2], acc[q + 3]))
                                acc[q] = d0
                                acc[q + 1] = d1
                                acc[q + 2] = d2
                                acc[q + 3] = d3
                        kk += 16
                    kt += 1
                wait_all()
                cuda.syncthreads()
                g = lane // 4
                t = lane % 4
                for i in range(MI):
                    for j in range(NI):
                        gr = row0 + wm0 + i * 16 + g
                        gc = col0 + wn0 + j * 8 + 2 * t
                        put(C, z, gr, gc, acc[0], alpha, beta, m, n)
                        put(C, z, gr, gc + 1, acc[1], alpha, beta, m, n)
                        put(C, z, gr + 8, gc, acc[2], alpha, beta, m, n)
                        put(C, z, gr + 8, gc + 1, acc[3], alpha, beta, m, n)
                        # fragment (i, j) written from constant indices; the rest shift
                        # down (an epilogue loop not unrolled must not index acc by i, j,
                        # or acc moves to local memory)
                        for q in range(ACC - 4):
                            acc[q] = acc[q + 4]
                tile += cuda.gridDim.x
            z += cuda.gridDim.z

    grid = flat_tile_grid(BM, BN)
    arg_types = ("int16", "float32") if dtype == "bfloat16" else None
    return CudaProgram(mma_16bit_kernel, (NT, 1, 1), grid, arg_types)


def _build_tf32(p: Mapping[str, int]) -> CudaProgram:
    global cuda
    from numba import cuda

    BM, BN, BK, WM, WN = p["BM"], p["BN"], p["BK"], p["WM"], p["WN"]
    STAGES, GROUP_M, PASSES = p["STAGES"], p["GROUP_M"], p["PASSES"]
    MI, NI = WM // 16, WN // 8  # mma fragments per warp tile
    WCOLS = BN // WN
    NT = _threads(p)
    ACH, BCH = BK // 4, BN // 4  # 16-byte chunks per row of the A and B tiles
    A_CHUNKS, B_CHUNKS = BM * ACH, BK * BCH
    A_ROUNDS, B_ROUNDS = ceil_div(A_CHUNKS, NT), ceil_div(B_CHUNKS, NT)
    ASWZ = 8 // ACH  # rows sharing one 128-byte line of the A tile
    BSWZ = BCH - 1
    load, store, _, _, _, _, address, ALIGN = access_ops()
    tc = tensorcore_ops()
    mma, to_tf32, ldsm = tc.mma_tf32, tc.to_tf32, tc.ldmatrix_x4
    cp16, cp4, commit = tc.cp_async16, tc.cp_async4, tc.cp_commit
    wait_ring = tc.cp_wait(STAGES - 2)
    wait_all = tc.cp_wait(0)
    f32 = np.float32
    zero = f32(0)

    @cuda.jit(device=True, inline=True)
    def put(C, z, gr, gc, v, alpha, beta, m, n):
        if gr < m and gc < n:
            if beta == 0:
                store(C, (z, gr, gc), alpha * v)
            else:
                store(C, (z, gr, gc), alpha * v + beta * load(C, (z, gr, gc)))

    @cuda.jit(device=True, inline=True)
    def load_stage(As, Bs, A, B, s, k0, za, zb, row0, col0, m, n, k_len, a_vec, b_vec, tid):
        """cp.async copies of the k-tile at k0 into ring stage s, chunks swizzled; what
        lies outside A or B is zero-filled by the copies' source size."""
        for rnd in range(A_ROUNDS):
            v = tid + rnd * NT
            if v < A_CHUNKS:
                r = v // ACH
                c = v % ACH
                pc = c ^ ((r // ASWZ) % ACH)
                gr = row0 + r
                gc = k0 + c * 4
                if a_vec:
                    nb = 0
                    if gr < m and gc < k_len:
                        nb = min(k_len - gc, 4) * 4
                    cp16(As, (s, r, pc * 4), A, (za, min(gr, m - 1), min(gc, k_len - 1)), nb)
                else:
                    for q in range(4):
                        ok = gr < m and gc + q < k_len
                        cp4(As, (s, r, pc * 4 + q), A,
                            (za, min(gr, m - 1), min(gc + q, k_len - 1)),
                            4 if ok else 0)
        for rnd in range(B_ROUNDS):
            v = tid + rnd * NT
            if v < B_CHUNKS:
                r = v // BCH
                c = v % BCH
                pc = c ^ ((2 * (r % 4)) & BSWZ)
                gr = k0 + r
                gc = col0 + c * 4
                if b_vec:
                    nb = 0
                    if gr < k_len and gc < n:
                        nb = min(n - gc, 4) * 4
                    cp16(Bs, (s, r, pc * 4), B, (zb, min(gr, k_len - 1), min(gc, n - 1)), nb)
                else:
                    for q in range(4):
                        ok = gr < k_len and gc + q < n
                        cp4(Bs, (s, r, pc * 4 + q), B,
                            (zb, min(gr, k_len - 1), min(gc + q, n - 1)),
                            4 if ok else 0)

    @kernel_jit(NT)
    def mma_kernel(A, B, C, alpha, beta):
        m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
        tid = cuda.threadIdx.x & 1023
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        wm0 = (warp // WCOLS) * WM
        wn0 = (warp % WCOLS) * WN
        a_vec = (k_len % 4 == 0 and address(A) % 16 == 0 and A.strides[2] == 4
                 and A.strides[1] % 16 == 0 and A.strides[0] % 16 == 0)
        b_vec = (n % 4 == 0 and address(B) % 16 == 0 and B.strides[2] == 4
                 and B.strides[1] % 16 == 0 and B.strides[0] % 16 == 0)

        As = cuda.shared.array((STAGES, BM, BK), f32, alignment=ALIGN)  # chunks swizzled
        Bs = cuda.shared.array((STAGES, BK, BN), f32, alignment=ALIGN)
        acc = cuda.local.array((MI, NI, 4), f32)
        fa = cuda.local.array((MI, 4), f32)  # A fragments: TF32 (big) part
        fas = cuda.local.array((MI, 4), f32)  # small parts (3xTF32)
        fb = cuda.local.array((NI, 2), f32)
        fbs = cuda.local.array((NI, 2), f32)

        tiles_m = (m + BM - 1) // BM
        tiles_n = (n + BN - 1) // BN
        group = GROUP_M * tiles_n
        k_tiles = (k_len + BK - 1) // BK
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            za = z if A.shape[0] > 1 else 0
            zb = z if B.shape[0] > 1 else 0
            tile = cuda.blockIdx.x
            while tile < tiles_m * tiles_n:
                first = (tile // group) * GROUP_M
                gsize = min(tiles_m - first, GROUP_M)
                row0 = (first + (tile % group) % gsize) * BM
                col0 = ((tile % group) // gsize) * BN
                for i in range(MI):
                    for j in range(NI):
                        for r in range(4):
                            acc[i, j, r] = zero
                # Prologue: tiles 0..STAGES-2 in flight, one commit group each.
                for s in range(STAGES - 1):
                    if s < k_tiles:
                        k0 = s * BK
                        load_stage(As, Bs, A, B, s, k0, za, zb, row0, col0, m, n, k_len,
                                   a_vec, b_vec, tid)
                    commit()
                kt = 0
                while kt < k_tiles:
                    wait_ring()  # tile kt has landed (this thread's copies)...
                    cuda.syncthreads()  # ...and everyone's; stage (kt-1) % STAGES is free
                    nt = kt + STAGES - 1
                    if nt < k_tiles:
                        s = nt % STAGES
                        k0 = nt * BK
                        load_stage(As, Bs, A, B, s, k0, za, zb, row0, col0, m, n, k_len,
                                   a_vec, b_vec, tid)
                    commit()  # always, so group counts stay aligned with tiles
                    cur = kt % STAGES
                    kk = 0
                    while kk < BK:
                        for i in range(MI):
                            # Lane l addresses row l % 8 of matrix l // 8: rows +0/+8,
                            # k chunks kk/4 and kk/4 + 1.
                            mat = lane // 8
                            r = wm0 + i * 16 + lane % 8 + 8 * (mat % 2)
                            c = kk // 4 + mat // 2
                            x0, x1, x2, x3 = ldsm(As, (cur, r, (c ^ ((r // ASWZ) % ACH)) * 4))
                            fa[i, 0] = to_tf32(x0)
                            fa[i, 1] = to_tf32(x1)
                            fa[i, 2] = to_tf32(x2)
                            fa[i, 3] = to_tf32(x3)
                            if PASSES == 3:
                                fas[i, 0] = to_tf32(x0 - fa[i, 0])
                                fas[i, 1] = to_tf32(x1 - fa[i, 1])
                                fas[i, 2] = to_tf32(x2 - fa[i, 2])
                                fas[i, 3] = to_tf32(x3 - fa[i, 3])
                        for j in range(NI):
                            col = wn0 + j * 8 + g
                            for h in range(2):
                                kr = kk + t + 4 * h
                                pc = (col // 4) ^ ((2 * (kr % 4)) & BSWZ)
                                y = load(Bs, (cur, kr, pc * 4 + col % 4))
                                big = to_tf32(y)
                                fb[j, h] = big
                                if PASSES == 3:
                                    fbs[j, h] = to_tf32(y - big)
                        for i in range(MI):
                            for j in range(NI):
                                a = (fa[i, 0], fa[i, 1], fa[i, 2], fa[i, 3])
                                b = (fb[j, 0], fb[j, 1])
                                d = (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
                                if PASSES == 3:
                                    d = mma((fas[i, 0], fas[i, 1], fas[i, 2], fas[i, 3]), b, d)
                                    d = mma(a, (fbs[j, 0], fbs[j, 1]), d)
                                d0, d1, d2, d3 = mma(a, b, d)
                                acc[i, j, 0] = d0
                                acc[i, j, 1] = d1
                                acc[i, j, 2] = d2
                                acc[i, j, 3] = d3
                        kk += 8
                    kt += 1
                wait_all()
                cuda.syncthreads()  # the next tile's prologue overwrites the ring
                for i in range(MI):
                    for j in range(NI):
                        gr = row0 + wm0 + i * 16 + g
                        gc = col0 + wn0 + j * 8 + 2 * t
                        put(C, z, gr, gc, acc[i, j, 0], alpha, beta, m, n)
                        put(C, z, gr, gc + 1, acc[i, j, 1], alpha, beta, m, n)
                        put(C, z, gr + 8, gc, acc[i, j, 2], alpha, beta, m, n)
                        put(C, z, gr + 8, gc + 1, acc[i, j, 3], alpha, beta, m, n)
                tile += cuda.gridDim.x
            z += cuda.gridDim.z

    grid = flat_tile_grid(BM, BN)
    return CudaProgram(mma_kernel, (NT, 1, 1), grid)


SPEC = KernelSpec(
    name="mma",
    backend="cuda",
    rung=10,
    title="tensor cores (TF32, 3xTF32, FP16, BF16) with ldmatrix and a cp.async pipeline",
    build=build,
    params=(
        Param("BM", 128, (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (8, 16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 16, (8, 16, 32), "depth of a pipeline stage"),
        Param("WM", 64, (16, 32, 64, 128), "rows of C per warp (16 per mma fragment)"),
        Param("WN", 32, (8, 16, 32, 64), "columns of C per warp (8 per mma fragment)"),
        Param("STAGES", 3, (2, 3, 4), "shared tiles in the cp.async ring"),
        Param("GROUP_M", 8, (1, 2, 4, 8, 16), "tile rows per group of the block order"),
        Param("PASSES", 1, (1, 3),
              "mma per step: 1 (precision='tf32') or 3 (precision='3xtf32'); set by precision="),
    ),
    constraints=(
        Constraint("BM % WM == 0 and BN % WN == 0",
                   lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0),
        Constraint("(BM/WM)*(BN/WN)*32 <= 1024 threads",
                   lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0
                   and _threads(p) <= 1024),
        Constraint("the float16 ring fits the 48 KB of static shared memory (float32 "
                   "needs twice as much: checked for the dtype before a launch)",
                   lambda p: _smem(p, 2) <= 48 * 1024),
    ),
    dtypes=("float32", "float16", "bfloat16"),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    sim_params={"BM": 32, "BN": 16, "BK": 16, "WM": 16, "WN": 16, "STAGES": 2, "GROUP_M": 2,
                "PASSES": 1},  # BK=16: one m16n8k16 step for float16
    precisions=PRECISIONS, precision_param="PASSES", min_cc=(8, 0), dtype_check=_dtype_check,
)
