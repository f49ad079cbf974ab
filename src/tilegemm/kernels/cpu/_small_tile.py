"""The unpacked tiles: rows of C, one or a few vectors wide, read from A and B in place.

The blocked rung computes small products (``direct``), narrow ones, a few vectors of
columns wide at any size (``takes_rows``), mid-size ones up to ``UNPACKED_PRODUCT`` where
the CPU has the wide 8-row tile (``eight_row_vectors``: AVX-512, NEON; also
``takes_rows``), and products of fewer than eight rows (sixteen with the wide tile,
``few_rows_limit``, and up to ``TILED_ROWS`` while B is at most ``TILED_BYTES``) at any
size (``takes_few``) with these tiles instead of packing.

Products too small to repay packing (a few thousand multiply-adds each, or fewer than
eight rows or columns: 4×4 transforms, batches of 16×16 blocks) used to run as plain
loops: for each row of C, a row of A times B, into a row of running sums. LLVM vectorised
the loop over columns in blocks of 64 (float32 on AVX-512: 16 lanes, 4 blocks per trip), so
a row of 4, 8 or 16 columns never reached vector code, and a batch of 16×16×16 products
took 0.9 µs each on an AMD Zen 5 against NumPy's 0.07.

Here one call computes ``rows`` rows of C times one vector of columns (``width`` lanes; the
last vector of a row masked to the columns that exist), with A and B read where they lie:
per K step, one (masked) vector load of B's row, and per row of C one broadcast of A's
element and one multiply-add into that row's accumulator, which stays in a register over
the whole K panel. Each element is the packed path's sum, term for term: started from zero,
one ``llvm.fmuladd`` per K step in K order (``_vector_tile``), and written back as the
packed tiles are (``alpha*acc``, or ``alpha*acc + bb*C`` as one multiply-add). So a product
gives the same bits on either path.

Masked loads and stores (``llvm.masked.load``/``store``) never touch the lanes they leave
out: AVX-512 and AVX2 suppress faults there, and other CPUs get per-lane code for the
right edge only.

Products of 2-7 rows (a few vectors of input times a weight matrix) take tiles several
vectors wide (:func:`few_vectors`): one vector per K step made 8 multiply-adds at most
and read 64 bytes of a row of B before jumping a whole row of B to the next K step, so
they waited on B, and packing B instead copied all of it for a few rows of use (0.3-0.8x
NumPy on an AMD Zen 5). Those tiles also ask the CPU to fetch the next tile's columns of
the same row of B (``prefetch``): the tiles walk B a few hundred bytes per row at a time,
too little for the hardware prefetcher to follow, and float32 4×4096×4096 (B from memory)
went from 4.9 ms to 1.6 ms with it (2 threads, Zen 5; packing B: 2.5 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilegemm.kernels.cpu._vector_tile import _Arithmetic, _splat, applies


def width(itemsize: int, vector_bits: int | None) -> int:
    """Lanes per vector of a dtype of ``itemsize`` bytes for code that may use
    ``vector_bits`` (None: LLVM's choice, taken as 256 bits, as the packed tile does)."""
    return max(1, (vector_bits or 256) // (8 * itemsize))


# Products at most this many vectors wide are computed with these tiles at any size, their
# rows split over the threads (``takes_rows`` in the rung): packing would copy all of A
# for a few columns of use per element. One thread, AMD Zen 5, AVX-512, tiles / packed
# loop nest: float32 2048×16×2048 0.85 / 2.04 ms, 2048×32×2048 1.59 / 1.87 ms, 2048×64×2048
# 3.24 / 3.15 ms; float64 2048×16×2048 2.13 / 2.87 ms, ×32× 3.78 / 3.86 ms, ×64× 8.0 / 6.0 ms.
NARROW_VECTORS = 2


def narrow_columns(itemsize: int, vector_bits: int | None) -> int:
    """The widest product (columns of C) computed with these tiles at any size."""
    return NARROW_VECTORS * width(itemsize, vector_bits)


# Products of fewer rows than this take tiles of all their rows, ``few_vectors`` wide, at
# any size (``takes_few`` in the rung).
FEW_ROWS = 8
# They run on the calling thread while B is at most the rung's parameter FEW_KB (KiB; its
# default and measurements at ``k02_blocked.FEW_KB``), else their columns split over the
# threads.
# Products of 8-15 rows do twice the multiply-adds per byte of B or more, so the second
# thread pays from a smaller B than FEW_KB's default (``few_split_bytes``). AMD Zen 5, µs
# one thread / two: float32 8 rows, B 512×512 (1 MiB) 19.1 / 25.2, 1024×512 (2 MiB)
# 38.6 / 38.9, 1024² 82.9 / 60.1; 12 rows 1 MiB 28.7 / 30.5, 2 MiB 62.5 / 51.1; float64
# 8 rows 256² (0.5 MiB) 9.0 / 11.5, 512² (2 MiB) 38.5 / 26.7.
FEW_SPLIT_BYTES_8 = 1 << 20
# Products of 9-15 rows sum K in panels of at most this many steps (the packed path's sums
# with KC this small): the tile of the rows past 8 reads again the piece of B the 8-row tile
# has just read (this many rows of B by its width: 12 KiB with AVX-512), which then is still
# in L1. With the packed path's KC = 512 the piece (96 KiB) came back from L2 and the second
# tile cost as much as the first: an Intel Xeon (family 6 model 167, 48 KiB of L1, 2
# threads), ms per product KC 512 / 64: float32 12×4096×4096 6.6-7.2 / 3.3-3.5, float64
# 12×4096×4096 20.8 / 8.4, 15×4096×4096 23.1 / 9.3, 12×1024×1024 0.57 / 0.37. Eight rows
# alone read each piece once, and short panels only cost them (float32 8×4096×4096 3.6 /
# 5.2).
REREAD_KC = 64
# A product of 2-7 rows whose B rows lie a multiple of ALIASED_STRIDE bytes apart sums K in
# panels of at most ALIASED_KC steps, whatever FEW_KC says. Its tile walks a panel's rows of
# B down one narrow strip of columns, a cache line or two per row: at such a stride every
# row of the strip falls in the same few sets of each cache (two of the L2's 1,024 on an AMD
# Zen 3 at 32 KiB, 64 of its L3's), so a walk of FEW_KC = 1024 rows no longer fits even the
# L3 and the next strip, the next line of the same rows, comes from memory. On the 2-vCPU
# Zen 3 (family 25 model 1), ms per product, alternating blocks, 64 / 1024 steps: float64
# 4×4096×4096 14.5 / 22.0 (NumPy 14.5; 4×4000×4000, no aliasing: 14.1 / 13.3), float64
# 4×4096×2048 7.9 / 10.6, float32 4×8192×2048 8.7 / 10.4; at 16 KiB and less no consistent
# difference there (docs/cpu.md, "Few rows").
ALIASED_STRIDE = 32 * 1024
ALIASED_KC = 64


def few_rows_limit(vector_bits: int | None) -> int:
    """Products of fewer rows than this take the few-row path (``takes_few``): ``FEW_ROWS``,
    or twice that where the wide 8-row tile exists (AVX-512, NEON: ``eight_row_vectors``),
    whose products of 8-15 rows take it and a tile of the other rows on the same columns."""
    return 2 * FEW_ROWS if eight_row_vectors(vector_bits) > 1 else FEW_ROWS


# Products of 16 to TILED_ROWS - 1 rows take the few-row path too, where the CPU has the
# wide 8-row tile, while their B is at most TILED_BYTES: per K panel of REREAD_KC steps and
# piece of columns, the wide tile on each 8 rows in turn, then a tile of the rest, so B is
# read where it lies once, and again from L1 by every tile after the first. Packed, each
# thread copied its part of B for 16-39 multiply-adds per element. Intel Xeon family 6
# model 207 (2 vCPUs, L2 2 MiB per core), µs per product, packed → tiled, in alternating
# blocks in one process: float64 16×1024² 702 → 549 (NumPy 663), 16×512² 224 → 166
# (165), 32×512² 288 → 253 (236), 32×1024² 986 → 870 (923), 20×999×1000 732 → 637 (797),
# 16×2048² 2497 → 1940 (2475); float32 16×1024² 357 → 322 (414), 24×1024² 419 → 380
# (501), 20×999×1000 500 → 355 (414), 16×2048² 1235 → 845 (1598); about even at 36-40
# rows (float64 36×1024² 1022 → 1053, 40×1024² 1141 → 1164) and for 24-32 rows of a B
# of 32 MiB (float64 32×2048² 3761 → 3786). With a B of 64-128 MiB, 24 and 32 rows ran
# 0.7-1.16× as fast as packed, in runs that disagreed: each short K panel adds all the
# rows of C again to the traffic, and the pieces of B, rows N elements apart, are read
# where no prefetcher follows them.
TILED_ROWS = 40
TILED_BYTES = 32 << 20


def few_tiled_limit(vector_bits: int | None) -> int:
    """Products of fewer rows than this take the few-row path (``takes_few``) with B given
    plainly, beyond ``few_rows_limit`` while B is at most ``TILED_BYTES``: ``TILED_ROWS``
    where the wide 8-row tile exists (AVX-512, NEON), else ``FEW_ROWS``."""
    return TILED_ROWS if eight_row_vectors(vector_bits) > 1 else FEW_ROWS


def few_split_bytes(rows: int, few_kb: int) -> int:
    """The largest B (bytes) a few-row product of ``rows`` rows reads on one thread, where
    the rung's parameter FEW_KB is ``few_kb`` (it applies to 2-7 rows): ``FEW_SPLIT_BYTES_8``
    for 8-15 rows, and for more rows that divided by their whole 8-row tiles, since each 8
    rows do as many multiply-adds per byte of B again (float32 20×512×400, B 800 KiB, on
    an Intel Xeon family 6 model 207: 83 µs on one thread, 66 on two)."""
    return few_kb * 1024 if rows < FEW_ROWS else FEW_SPLIT_BYTES_8 // (rows // FEW_ROWS)


def few_vectors(rows: int, vector_bits: int | None) -> int:
    """Vectors of columns in the tile of a product of ``rows`` rows (fewer than
    ``FEW_ROWS``): as many as fit the vector registers (32 on AVX-512 and NEON, 16 on AVX2)
    with two to spare, each vector needing a sum per row, B's vector at the K step, and,
    except on AVX-512, its mask; at most 6: AVX-512 has 7 mask registers (more vectors
    kept theirs on the stack), and 12 sums of a two-row tile keep two FMA units busy."""
    registers = 32 if vector_bits in (512, 128) else 16
    per_vector = rows + 1 + (vector_bits != 512)
    return max(1, min(6, (registers - 2) // per_vector))


def eight_row_vectors(vector_bits: int | None) -> int:
    """Vectors of columns in the wide 8-row tile of small, narrow and mid-size products:
    3 on AVX-512 (24 sums, and each row's element of A broadcast by the multiply-add's
    memory operand), 2 on NEON (its broadcasts take registers of their own: 3 vectors kept
    sums on the stack), 1 on AVX2 (16 registers; there the wide tile is not used)."""
    return {512: 3, 128: 2}.get(vector_bits or 0, 1)


def wide_columns(itemsize: int, vector_bits: int | None) -> int:
    """Columns of C that one pass of the wide 8-row tile covers (``eight_row_vectors``
    vectors) for a dtype of ``itemsize`` bytes: 48 float32 or 24 float64 with AVX-512
    code; one vector's worth where that tile is not used."""
    return eight_row_vectors(vector_bits) * width(itemsize, vector_bits)


def small_tile(rows: int, lanes: int, dtype: np.dtype, vectors: int = 1,
               prefetch: bool = False, whole: int = 0) -> Any:
    """The intrinsic ``stile(kc, A, a0, lda, B, b0, ldb, C, c0, ldc, w, alpha, bb, mode)``.

    Computes ``rows`` rows × ``w`` columns (1 ≤ w ≤ ``vectors*lanes``) of C over ``kc`` K
    steps (``vectors`` vectors of ``lanes``, each masked to the columns that exist; the
    first ``whole`` vectors not masked, for callers that pass w > ``whole*lanes``: a mask
    known only at run time costs every load of B, and a pass of 40 float32 columns of the
    3-vector tile took 1.4× a pass of 48):
    row r of A at element ``a0 + r*lda`` of A's data, K step p of B's row at ``b0 +
    p*ldb``, row r of C at ``c0 + r*ldc`` (element offsets; A, B, C any arrays of the dtype,
    C-contiguous in the rows read). ``mode`` 0: ``C = alpha*acc`` (C not read); otherwise
    ``C = alpha*acc + bb*C``. ``prefetch``: at each K step, ask for the cache lines of the
    next ``vectors*lanes`` columns of B's row (the next tile's, in a walk along the row);
    a prefetch never faults, past the end of B included."""
    dtype = np.dtype(dtype)
    if not applies(dtype):
        raise ValueError(f"no small-product tile for {dtype}")
    return tile_intrinsic(lambda builder, *operands: emit_small(
        builder, *operands, rows, lanes, dtype, vectors, prefetch, whole))


def tile_intrinsic(emit: Any) -> Any:
    """A Numba intrinsic ``tile(k, A, a0, lda, B, b0, ldb, C, c0, ldc, w, alpha, bb, mode)``
    whose code is ``emit(builder, k, a_ptr, a0, lda, b_ptr, b0, ldb, c_ptr, c0, ldc, w,
    alpha, bb, mode)``: integers as i64, the arrays as pointers to their first element,
    ``alpha`` and ``bb`` in C's dtype (the calling convention of this module's tiles and
    ``_dot_tile``'s)."""
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def tile(typingctx, k, a, a0, lda, b, b0, ldb, c, c0, ldc, w, alpha, bb,  # noqa: ANN001, ANN202
             mode):  # noqa: ANN001 - Numba's protocol
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ints = {0, 2, 3, 5, 6, 8, 9, 10, 13}  # k, a0, lda, b0, ldb, c0, ldc, w, mode
            vals = [context.cast(builder, v, t, types.int64) if n in ints else v
                    for n, (v, t) in enumerate(zip(args, signature.args, strict=True))]
            for n in (1, 4, 7):
                vals[n] = context.make_array(signature.args[n])(context, builder,
                                                                vals[n]).data
            for n in (11, 12):
                vals[n] = context.cast(builder, vals[n], signature.args[n],
                                       signature.args[7].dtype)
            emit(builder, *vals)
            return context.get_dummy_value()

        sig = types.void(k, a, a0, lda, b, b0, ldb, c, c0, ldc, w, alpha, bb, mode)
        return sig, codegen

    return tile


def tile_module_ir(name: str, dtype: np.dtype, triple: str, emit: Any) -> str:
    """LLVM IR of a module holding one tile alone, as ``void @<name>(i64 k, T* a, i64 lda,
    T* b, i64 ldb, T* c, i64 ldc, i64 w, T alpha, T bb, i64 mode)`` (``noalias`` pointers
    to the first element of each operand, offsets 0), built by ``emit`` (as for
    :func:`tile_intrinsic`) as the rung builds it: its machine code for any CPU LLVM knows,
    on any host (the tests read it)."""
    from llvmlite import ir

    dtype = np.dtype(dtype)
    scalar = _Arithmetic(dtype, 1).scalar
    ptr, i64 = scalar.as_pointer(), ir.IntType(64)
    module = ir.Module(name=f"{name}_{dtype.name}")
    module.triple = triple
    fnty = ir.FunctionType(ir.VoidType(), [i64, ptr, i64, ptr, i64, ptr, i64, i64, scalar,
                                           scalar, i64])
    fn = ir.Function(module, fnty, name)
    for n in (1, 3, 5):
        fn.args[n].add_attribute("noalias")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    k, a, lda, b, ldb, c, ldc, w, alpha, bb, mode = fn.args
    zero = i64(0)
    emit(builder, k, a, zero, lda, b, zero, ldb, c, zero, ldc, w, alpha, bb, mode)
    builder.ret_void()
    return str(module)


def counted_loop(builder: Any, count: Any, init: list[Any], body: Any) -> list[Any]:
    """Emit ``for i in range(count): acc = body(i, acc)`` (``count`` an i64, skipped when
    not positive) with the accumulators carried in registers (phis), ``acc`` starting at
    ``init``; returns their values after the loop, at the builder's new position."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    fn = builder.function
    entry = builder.basic_block
    loop = fn.append_basic_block("tile.k")
    done = fn.append_basic_block("tile.done")
    builder.cbranch(builder.icmp_signed(">", count, i64(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    acc_in = [builder.phi(v.type) for v in init]
    acc = body(i, acc_in)
    i_next = builder.add(i, i64(1))
    loop_end = builder.basic_block
    builder.cbranch(builder.icmp_signed("<", i_next, count), loop, done)
    i.add_incoming(i64(0), entry)
    i.add_incoming(i_next, loop_end)
    for phi, start, value in zip(acc_in, init, acc, strict=True):
        phi.add_incoming(start, entry)
        phi.add_incoming(value, loop_end)
    builder.position_at_end(done)
    final = []
    for start, value in zip(init, acc, strict=True):
        phi = builder.phi(start.type)
        phi.add_incoming(start, entry)
        phi.add_incoming(value, loop_end)
        final.append(phi)
    return final


def _masked(builder: Any, op: str, vec: Any) -> Any:
    """``llvm.masked.load`` or ``llvm.masked.store`` for ``vec``, named with the typed-pointer
    mangling, which LLVM versions with opaque pointers rename on reading."""
    from llvmlite import ir
    from numba.core import cgutils

    mask = ir.VectorType(ir.IntType(1), vec.count)
    elem = ("f" if isinstance(vec.element, (ir.FloatType, ir.DoubleType)) else "i")
    bits = {ir.FloatType: 32, ir.DoubleType: 64}.get(type(vec.element))
    name = f"v{vec.count}{elem}{bits or vec.element.width}"
    if op == "load":
        fnty = ir.FunctionType(vec, [vec.as_pointer(), ir.IntType(32), mask, vec])
    else:
        fnty = ir.FunctionType(ir.VoidType(), [vec, vec.as_pointer(), ir.IntType(32), mask])
    return cgutils.get_or_insert_function(builder.module, fnty,
                                          f"llvm.masked.{op}.{name}.p0{name}")


def emit_small(builder: Any, kc: Any, a_ptr: Any, a0: Any, lda: Any, b_ptr: Any, b0: Any,
               ldb: Any, c_ptr: Any, c0: Any, ldc: Any, w: Any, alpha: Any, bb: Any,
               mode: Any, rows: int, lanes: int, dtype: np.dtype, vectors: int = 1,
               prefetch: bool = False, whole: int = 0) -> None:
    """Append the tile (see :func:`small_tile`) at ``builder``'s position: integer operands
    i64, pointers to the first element of each array's data, ``alpha``/``bb`` scalars of
    the dtype."""
    from llvmlite import ir

    from tilegemm.kernels.cpu._slp import emit_prefetch

    arith = _Arithmetic(dtype, lanes)
    vec = arith.vec
    i64, i32 = ir.IntType(64), ir.IntType(32)
    align = i32(dtype.itemsize)
    vptr = vec.as_pointer()
    load_v, store_v = _masked(builder, "load", vec), _masked(builder, "store", vec)
    ivec = ir.VectorType(i64, lanes)
    masks = [builder.icmp_signed("<", ir.Constant(ivec, [v * lanes + x for x in range(lanes)]),
                                 _splat(builder, ivec, w)) for v in range(vectors)]
    a_rows = [builder.gep(a_ptr, [builder.add(a0, builder.mul(lda, i64(r)))], inbounds=True)
              for r in range(rows)]
    tiles = [(r, v) for r in range(rows) for v in range(vectors)]

    def vload(ptr: Any, v: int) -> Any:  # vector v of a row: whole, or masked
        if v < whole:
            return builder.load(ptr, align=dtype.itemsize)
        return builder.call(load_v, [ptr, align, masks[v], arith.zeros])

    def vstore(value: Any, ptr: Any, v: int) -> None:
        if v < whole:
            builder.store(value, ptr, align=dtype.itemsize)
        else:
            builder.call(store_v, [value, ptr, align, masks[v]])

    def step(p: Any, acc_in: list[Any]) -> list[Any]:
        b_at = builder.gep(b_ptr, [builder.add(b0, builder.mul(p, ldb))], inbounds=True)
        bv = [vload(builder.bitcast(builder.gep(b_at, [i64(v * lanes)], inbounds=True), vptr),
                    v) for v in range(vectors)]
        if prefetch:  # the next tile's lines of this row (GEPs not inbounds: may pass B's end)
            ahead = builder.bitcast(builder.gep(b_at, [i64(vectors * lanes)]),
                                    ir.IntType(8).as_pointer())
            for off in range(0, vectors * lanes * dtype.itemsize, 64):
                emit_prefetch(builder, builder.gep(ahead, [i64(off)]))
        acc = []
        for r in range(rows):
            a = builder.load(builder.gep(a_rows[r], [p], inbounds=True), align=dtype.itemsize)
            av = _splat(builder, vec, a)
            for v in range(vectors):
                acc.append(arith.muladd(builder, av, bv[v], acc_in[r * vectors + v]))
        return acc

    final = counted_loop(builder, kc, [arith.zeros] * len(tiles), step)
    va = _splat(builder, vec, alpha)
    vb = _splat(builder, vec, bb)
    c_at = [builder.bitcast(builder.gep(c_ptr, [builder.add(c0, builder.add(
        builder.mul(ldc, i64(r)), i64(v * lanes)))], inbounds=True), vptr) for r, v in tiles]
    with builder.if_else(builder.icmp_signed("==", mode, i64(0))) as (plain, scaled):
        with plain:
            for t, (_, v) in enumerate(tiles):
                vstore(arith.mul(builder, va, final[t]), c_at[t], v)
        with scaled:
            old = [vload(c_at[t], v) for t, (_, v) in enumerate(tiles)]
            for t, (_, v) in enumerate(tiles):
                value = arith.muladd(builder, va, final[t], arith.mul(builder, vb, old[t]))
                vstore(value, c_at[t], v)


def module_ir(rows: int, lanes: int, dtype: np.dtype, triple: str = "", vectors: int = 1,
              prefetch: bool = False, whole: int = 0) -> str:
    """LLVM IR of a module holding one tile alone, ``@stile`` (see :func:`tile_module_ir`),
    built by :func:`emit_small` as the rung builds it."""
    dtype = np.dtype(dtype)
    return tile_module_ir(f"stile_{rows}x{lanes}", dtype, triple,
                          lambda builder, *operands: emit_small(
                              builder, *operands, rows, lanes, dtype, vectors, prefetch,
                              whole))
