"""The dot-product tile: a few rows of A against a few rows of a matrix given as W = B's
transpose, both read along K, where they lie.

``x @ W.T`` with a few rows of x (the layout of a linear layer's weights, W of shape
(outputs, inputs)) hands the blocked rung B as its transpose: (N, K) storage whose rows are
the columns of B. The tiles of products of a few rows (``_small_tile``) read B's rows,
which this storage does not hold, so such products were packed (all of W copied into
strips for a few multiply-adds per element; 0.7-1.0× NumPy on an AMD Zen 5). Here each
element of C is a dot product of a row of A and a row of W, both contiguous: one tile
computes ``rows`` rows × ``cols`` columns of C, vectors along K, one running vector of
sums per element (``rows*cols`` of them in registers), each K step loading ``rows``
vectors of A and ``cols`` of W for ``rows*cols`` multiply-adds. W's rows are streamed
front to back, which the hardware prefetcher follows.

The sums are not the packed path's: each element sums K in ``lanes`` interleaved partial
sums (element p goes to lane p mod ``lanes``; the last vector masked to the K that exists)
then adds the lanes in a fixed tree. A float result can differ from the plain-layout
product's in the last bits; it is the same on every call. Integers wrap as NumPy's do,
exactly.

The one-row tile also computes matrix-vector products (``A @ x``, and ``x @ W.T`` for one
row x): x against ``cols`` rows of the matrix at a time, so a row of ``x @ W.T`` has the
same bits whether x has one row or a few.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilegemm.kernels.cpu._small_tile import (
    _masked,
    counted_loop,
    eight_row_vectors,
    tile_intrinsic,
    tile_module_ir,
)
from tilegemm.kernels.cpu._vector_tile import _Arithmetic, _splat


def dot_columns(rows: int, vector_bits: int | None) -> int:
    """Columns of C in the tile of ``rows`` rows (4, 2 or 1): sums, A's and W's vectors
    within the vector registers (32 on AVX-512 and NEON: 4×4, 2×4, 1×8; 16 on AVX2: 4×2,
    2×4, 1×4). All divide ``DOT_GROUP``."""
    wide = vector_bits in (512, 128)
    return {4: 4 if wide else 2, 2: 4, 1: 8 if wide else 4}[rows]


# Rows of W the tiles of all heights take in turn (4, 2 then 1 rows of A), so that a product
# of 7 rows reads each group of W from memory once and from cache for the other tiles.
DOT_GROUP = 8
# Products of 2 to this many rows less one with B given transposed take these tiles, on
# every ISA (tiles of 4 rows in turn for more than 7: the group of W stays in L1). 8-15
# rows were packed. x @ w.T, 8, 12 and 15 rows × 1024 × 1024, time against NumPy packed →
# these tiles, on an Intel Xeon family 6 model 167 (2 vCPUs): AVX-512 code float32
# 0.86-1.12× → 1.75-2.28×, float64 0.81-0.96× → 1.07-1.42×; AVX2 code (AVX-512 off,
# NumPy's AVX2 kernels) float32 0.67-0.96× → 1.24-1.52×, float64 0.95-1.36× → 1.28-1.83×.
DOT_MAX = 16
# ... and, where the CPU has the wide 8-row tile, products of 16 to DOT_TILED_ROWS - 1 rows
# while A takes at most DOT_TILED_A_BYTES: every group of W's rows reads all of A again,
# tile after tile. x @ w.T on an Intel Xeon family 6 model 207 (2 vCPUs, L2 2 MiB per
# core), µs packed → these tiles, the two generated modules in one process in alternating
# blocks: float32 16×1024×1024 433 → 306 (NumPy 562), 24×1024×1024 555 → 444, 32×1024×512
# 346 → 249, 39×1024×512 385 → 310, 16×4096×1024 1416 → 993, 16×1024×2048 775 → 601;
# float64 16×1024×1024 642 → 508 (664), 32×1024×512 529 → 459. Beyond 128 KiB of A they
# fell behind: float64 24×1024×1024 874 → 1011, 39×1024×512 633 → 741, 24×1024×2048 1401
# → 1823, float32 24×1024×2048 925 → 1016 (at 160 KiB about even: float32 39×1024×1024
# 561 → 560). One exception inside the limit: float64 24×2048×512 863 → 906.
DOT_TILED_ROWS = 40
DOT_TILED_A_BYTES = 128 * 1024


def dot_limit(vector_bits: int | None) -> int:
    """Products of fewer rows than this, B given transposed, take the dot-product tiles
    (while A is within ``DOT_TILED_A_BYTES`` from ``DOT_MAX`` rows on): ``DOT_TILED_ROWS``
    where the CPU has the wide 8-row tile (AVX-512, NEON), else ``DOT_MAX``."""
    return DOT_TILED_ROWS if eight_row_vectors(vector_bits) > 1 else DOT_MAX


def dot_tile(rows: int, cols: int, lanes: int, dtype: np.dtype) -> Any:
    """The intrinsic ``dtile(k, A, a0, lda, W, w0, ldw, C, c0, ldc, nc, alpha, bb, mode)``.

    Computes ``C[r, j] = alpha * sum_p A[r, p] * W[j, p]`` over ``k`` steps for ``rows``
    rows and ``nc`` columns (1 ≤ nc ≤ ``cols``; W's rows past ``nc`` are not read): row r
    of A at element ``a0 + r*lda`` of A's data, row j of W at ``w0 + j*ldw``, C[r, j] at
    ``c0 + r*ldc + j`` (element offsets). ``mode`` 0: C is not read; otherwise ``+ bb*C``.
    """
    dtype = np.dtype(dtype)
    return tile_intrinsic(lambda builder, *operands: emit_dot(
        builder, *operands, rows, cols, lanes, dtype))


def emit_dot(builder: Any, k: Any, a_ptr: Any, a0: Any, lda: Any, w_ptr: Any, w0: Any,
             ldw: Any, c_ptr: Any, c0: Any, ldc: Any, nc: Any, alpha: Any, bb: Any,
             mode: Any, rows: int, cols: int, lanes: int, dtype: np.dtype) -> None:
    """Append the tile (see :func:`dot_tile`) at ``builder``'s position: integer operands
    i64, pointers to the first element of each array's data, ``alpha``/``bb`` scalars."""
    from llvmlite import ir

    arith = _Arithmetic(dtype, lanes)
    vec = arith.vec
    i64, i32 = ir.IntType(64), ir.IntType(32)
    align = i32(dtype.itemsize)
    vptr = vec.as_pointer()
    load_v = _masked(builder, "load", vec)
    a_rows = [builder.gep(a_ptr, [builder.add(a0, builder.mul(lda, i64(r)))], inbounds=True)
              for r in range(rows)]
    # W's row j, or its last row in the tile for j >= nc (read again, never stored)
    w_rows = [builder.gep(w_ptr, [builder.add(w0, builder.mul(ldw, builder.select(
        builder.icmp_signed("<", i64(j), nc), i64(j), builder.sub(nc, i64(1)))))],
        inbounds=True) for j in range(cols)]
    nfull = builder.udiv(k, i64(lanes))
    tail_at = builder.mul(nfull, i64(lanes))

    def step(at: Any, acc: list[Any], mask: Any = None) -> list[Any]:
        def load(row: Any) -> Any:
            ptr = builder.bitcast(builder.gep(row, [at], inbounds=True), vptr)
            if mask is None:
                return builder.load(ptr, align=dtype.itemsize)
            return builder.call(load_v, [ptr, align, mask, arith.zeros])

        av = [load(row) for row in a_rows]
        wv = [load(row) for row in w_rows]
        return [arith.muladd(builder, av[r], wv[j], acc[r * cols + j])
                for r in range(rows) for j in range(cols)]

    sums = counted_loop(builder, nfull, [arith.zeros] * (rows * cols),
                        lambda q, acc: step(builder.mul(q, i64(lanes)), acc))
    after = builder.basic_block
    rem = builder.sub(k, tail_at)
    ivec = ir.VectorType(i64, lanes)
    mask = builder.icmp_signed("<", ir.Constant(ivec, list(range(lanes))),
                               _splat(builder, ivec, rem))
    with builder.if_then(builder.icmp_signed(">", rem, i64(0))):
        tail = step(tail_at, sums, mask)
        tail_block = builder.basic_block
    merged = []
    for before, value in zip(sums, tail, strict=True):
        phi = builder.phi(vec)
        phi.add_incoming(before, after)
        phi.add_incoming(value, tail_block)
        merged.append(phi)
    totals = [_reduce(builder, v, arith) for v in merged]

    def c_at(r: int, j: int) -> Any:
        return builder.gep(c_ptr, [builder.add(c0, builder.add(builder.mul(ldc, i64(r)),
                                                               i64(j)))], inbounds=True)

    def store(r: int, j: int, value_of: Any) -> None:
        if j == 0:
            builder.store(value_of(c_at(r, j)), c_at(r, j))
            return
        with builder.if_then(builder.icmp_signed("<", i64(j), nc)):
            ptr = c_at(r, j)
            builder.store(value_of(ptr), ptr)

    with builder.if_else(builder.icmp_signed("==", mode, i64(0))) as (plain, scaled):
        with plain:
            for r in range(rows):
                for j in range(cols):
                    total = totals[r * cols + j]
                    store(r, j, lambda ptr, t=total: _mul(builder, arith, alpha, t))
        with scaled:
            for r in range(rows):
                for j in range(cols):
                    total = totals[r * cols + j]
                    store(r, j, lambda ptr, t=total: _muladd(
                        builder, arith, alpha, t, _mul(builder, arith, bb, builder.load(ptr))))


def _mul(builder: Any, arith: _Arithmetic, x: Any, y: Any) -> Any:
    return builder.fmul(x, y) if arith.is_float else builder.mul(x, y)


def _muladd(builder: Any, arith: _Arithmetic, x: Any, y: Any, acc: Any) -> Any:
    """``x*y + acc`` on scalars, one fused multiply-add for floats where the CPU has one
    (as the other tiles write C back)."""
    from llvmlite import ir
    from numba.core import cgutils

    if not arith.is_float:
        return builder.add(builder.mul(x, y), acc)
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(x.type, [x.type] * 3),
        "llvm.fmuladd.f32" if isinstance(x.type, ir.FloatType) else "llvm.fmuladd.f64")
    return builder.call(fma, [x, y, acc])


def _reduce(builder: Any, v: Any, arith: _Arithmetic) -> Any:
    """The lanes of ``v`` added in a fixed tree: halves, then quarters, ..., lane 0."""
    from llvmlite import ir

    i32 = ir.IntType(32)
    width = v.type.count
    while width > 1:
        half = width // 2
        lo = builder.shuffle_vector(v, ir.Constant(v.type, None),
                                    ir.Constant(ir.VectorType(i32, half), list(range(half))))
        hi = builder.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(
            ir.VectorType(i32, half), list(range(half, width))))
        v = builder.fadd(lo, hi) if arith.is_float else builder.add(lo, hi)
        width = half
    return builder.extract_element(v, i32(0))


def module_ir(rows: int, cols: int, lanes: int, dtype: np.dtype, triple: str = "") -> str:
    """LLVM IR of a module holding one tile alone, ``@dtile`` (see
    ``_small_tile.tile_module_ir``), built by :func:`emit_dot` as the rung builds it."""
    dtype = np.dtype(dtype)
    return tile_module_ir(f"dtile_{rows}x{cols}x{lanes}", dtype, triple,
                          lambda builder, *operands: emit_dot(
                              builder, *operands, rows, cols, lanes, dtype))
