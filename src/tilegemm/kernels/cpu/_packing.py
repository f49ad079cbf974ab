"""Vector copies for packing the blocked rung's panels (Numba intrinsics, LLVM IR).

Packing copies each panel of A and B into the strips the micro-kernel reads. Written as
Numba loops, element by element, neither copy was vectorised: Numba's array indexing
keeps a negative-index fix-up that LLVM cannot prove away, so the strip copies of B came
out as scalar moves and scatters, and the transposing copy of A as one scalar load and
store per element. Both ran at 12–17 GB/s with their data in L2 (AMD Zen 5, one core),
a fifth of a float32 256³ product on one thread (see docs/cpu.md).

- :func:`copy_run` copies a run of contiguous elements with ``llvm.memcpy``; with a
  constant length (an NR-wide piece of a row of B) LLVM expands it into a few vector
  moves: 67 against 14 GB/s packing a 256×256 float32 panel.
- :func:`transposer` builds ``pack_cols(Ap, (r, q, 0), A, (i, p))``: MR rows of A, W
  columns each, loaded as MR vectors, transposed by one vector shuffle (which the x86
  backend lowers to ``vpermt2ps``/``vpermt2pd``) and stored as the W·MR contiguous
  elements of the A strip: 41 against 17 GB/s (float32, MR = 8).
- :func:`block_transposer` builds ``transpose_block``, an 8×8 block of a matrix moved to
  its transpose's place through vector registers: the copy of an operand given transposed
  for the unpacked path of small products.

Both only move values: the packed panels are bit for bit what the loops wrote.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def _item_pointer(context: Any, builder: Any, aryty: Any, ary: Any, index: Any) -> Any:
    from numba.core import cgutils

    arr = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, arr,
                                    cgutils.unpack_tuple(builder, index), wraparound=False)


def _rows_in_one_vector(context: Any, builder: Any, aryty: Any, ary: Any, start: Any,
                        rows: int, w: int) -> Any:
    """``rows`` rows of the 2-D C-ordered ``ary`` from ``start`` (row, column), ``w``
    elements each, loaded as vectors and concatenated into one vector of rows·w elements
    (a tree of shuffles; undefined rows pad it to a power of two rows): what the
    transposing copies reorder."""
    from llvmlite import ir
    from numba.core import cgutils

    elt = context.get_data_type(aryty.dtype)
    row_t = ir.VectorType(elt, w)
    arr = context.make_array(aryty)(context, builder, ary)
    r0, c0 = cgutils.unpack_tuple(builder, start)
    vecs = []
    for r in range(rows):
        ptr = cgutils.get_item_pointer(context, builder, aryty, arr,
                                       [builder.add(r0, ir.Constant(r0.type, r)), c0],
                                       wraparound=False)
        vecs.append(builder.load(builder.bitcast(ptr, row_t.as_pointer()),
                                 align=context.get_abi_sizeof(elt)))
    span = 1
    while span < rows:
        span *= 2
    vecs += [ir.Constant(row_t, ir.Undefined)] * (span - rows)
    width = w
    while len(vecs) > 1:  # concatenate pairwise
        mask = ir.Constant(ir.VectorType(ir.IntType(32), 2 * width), list(range(2 * width)))
        vecs = [builder.shuffle_vector(x, y, mask)
                for x, y in zip(vecs[0::2], vecs[1::2], strict=True)]
        width *= 2
    return vecs[0]


def _copy_run_intrinsic() -> Any:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def copy_run(typingctx, dst, di, src, si, n):  # noqa: ANN001, ANN202 - Numba's protocol
        """``dst[di + (0..n)] = src[si + (0..n)]`` along the last axis (both C-ordered,
        the runs inside the arrays: no bounds are checked), as one ``llvm.memcpy``."""
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            dty, _, sty, _, _ = signature.args
            dp = _item_pointer(context, builder, dty, args[0], args[1])
            sp = _item_pointer(context, builder, sty, args[2], args[3])
            itemsize = context.get_abi_sizeof(context.get_data_type(dty.dtype))
            i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
            nbytes = builder.mul(args[4], ir.Constant(i64, itemsize))
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i8p, i64, ir.IntType(1)])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.memcpy.p0.p0.i64")
            builder.call(fn, [builder.bitcast(dp, i8p), builder.bitcast(sp, i8p), nbytes,
                              ir.Constant(ir.IntType(1), 0)])
            return context.get_dummy_value()

        return types.void(dst, di, src, si, n), codegen

    return copy_run


@functools.cache
def copy_run() -> Any:
    """The ``copy_run(dst, dst_index, src, src_index, n)`` intrinsic, built once."""
    return _copy_run_intrinsic()


def columns_per_pack(dtype: np.dtype, vector_bits: int | None) -> int:
    """Columns of A that :func:`transposer` moves per call: one vector of the widest width
    the code may use (256 bits when LLVM chooses), at least 4."""
    return max(4, (vector_bits or 256) // (8 * np.dtype(dtype).itemsize))


def transposer(mr: int, w: int) -> Any:
    """The intrinsic ``pack_cols(Ap, (r, q, 0), A, (i, p))``: ``Ap[r, q + c, k] =
    A[i + k, p + c]`` for k < ``mr``, c < ``w`` (both C-ordered; no bounds checked).

    The MR loaded rows are concatenated into one vector of MR·W elements (a tree of
    shuffles, padded to a power of two) and reordered by a single shuffle into the strip's
    order, column by column; LLVM picks the target's permutes for it.
    """
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def pack_cols(typingctx, dst, di, src, si):  # noqa: ANN001, ANN202 - Numba's protocol
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            dty, _, sty, _ = signature.args
            elt = context.get_data_type(dty.dtype)
            align = context.get_abi_sizeof(elt)
            whole = _rows_in_one_vector(context, builder, sty, args[2], args[3], mr, w)
            order = [(e % mr) * w + e // mr for e in range(mr * w)]
            strip = builder.shuffle_vector(
                whole, ir.Constant(whole.type, ir.Undefined),
                ir.Constant(ir.VectorType(ir.IntType(32), mr * w), order))
            dp = _item_pointer(context, builder, dty, args[0], args[1])
            builder.store(strip, builder.bitcast(dp, ir.VectorType(elt, mr * w).as_pointer()),
                          align=align)
            return context.get_dummy_value()

        return types.void(dst, di, src, si), codegen

    return pack_cols


def block_transposer(w: int) -> Any:
    """The intrinsic ``transpose_block(dst, (d0, d1), src, (s0, s1))``: ``dst[d0 + c, d1 +
    r] = src[s0 + r, s1 + c]`` for r, c < ``w`` (both 2-D C-ordered; no bounds checked).

    The ``w`` rows are loaded as ``w`` vectors, concatenated as in :func:`transposer`, and
    each column taken out by one shuffle and stored as a row of ``dst``. A transposing
    copy written as a Numba loop moves one element per load and store (see above): copying
    a 100×100 float32 operand given transposed so took 9 µs, most of what computing a
    small product unpacked saved (Intel Xeon family 6 model 207)."""
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def transpose_block(typingctx, dst, di, src, si):  # noqa: ANN001, ANN202 - Numba's protocol
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            from numba.core import cgutils

            dty, _, sty, _ = signature.args
            elt = context.get_data_type(dty.dtype)
            align = context.get_abi_sizeof(elt)
            row_t = ir.VectorType(elt, w)
            dst_arr = context.make_array(dty)(context, builder, args[0])
            d0, d1 = cgutils.unpack_tuple(builder, args[1])
            whole = _rows_in_one_vector(context, builder, sty, args[2], args[3], w, w)
            undef = ir.Constant(whole.type, ir.Undefined)
            for c in range(w):
                column = builder.shuffle_vector(
                    whole, undef,
                    ir.Constant(ir.VectorType(ir.IntType(32), w), [r * w + c for r in range(w)]))
                ptr = cgutils.get_item_pointer(
                    context, builder, dty, dst_arr,
                    [builder.add(d0, ir.Constant(d0.type, c)), d1], wraparound=False)
                builder.store(column, builder.bitcast(ptr, row_t.as_pointer()), align=align)
            return context.get_dummy_value()

        return types.void(dst, di, src, si), codegen

    return transpose_block
