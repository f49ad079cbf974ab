"""The blocked rung's K loop written as explicit vector code (LLVM IR), for every dtype.

Why not write the tile as MR×NR named scalars and leave it to LLVM's SLP vectoriser, as
the rung first did? For floats, the vectoriser packs the scalars into vectors well, but
it emits the vector FMAs *column by column*: all MR rows against B's first vector, then
all MR rows against the second. Each broadcast of A is then live across the whole step,
and a tile that needs every register spills. On AVX2 (16 vector registers) BLIS's 6×16
float32 tile needs 12 accumulators + 2 vectors of B + 1 broadcast = 15: the vectoriser's
order made it 12 + 2 + 6 = 20, so the accumulators went through the stack (32 stack
accesses per 48 FMAs) and the tile ran at half speed. The same loop written here row by
row, each broadcast used at once by the row's NR/W FMAs, keeps all 12 accumulators in
registers with no stack access at all, so the tile that fits the register file is usable
at last; with AVX-512 the broadcast is folded into the FMA (``{1to16}``) either way. On
64-bit ARM (NEON: 32 registers of 128 bits) LLVM multiplies by each value of A in place
(``fmla`` by element), and the NEON tiles' 24 accumulators stay in registers;
:func:`module_ir` builds the loop alone so that it can be compiled for such a CPU on any
host.

For integers the named scalars did worse still. In Numba ``a * b`` of two int32 values is
an int64, so the tile multiplied and added 64-bit halves (``vpmuludq``/``vpaddq``), with
scalar ``imul`` and gathers around them; the vectoriser took 16 s (int32) to 11 s (int64)
on the micro-kernel alone and produced 8,000 instructions. Written here, int32 tiles are
``vpmulld``/``vpaddd`` on full vectors and int64 tiles ``vpmullq`` (AVX-512) or LLVM's
expansion of it (AVX2), each micro-kernel compiling in half a second; the rung ran 2.7-3.7×
(int32) and 1.5-1.7× (int64) faster on an Intel Xeon (see docs/cpu.md).

The loop is built by a Numba intrinsic (`tile_loop`), so it is compiled and cached with
the rest of the rung. For the strip pair (A strip at element ``a0`` of ``Ap``, B strip at
``b0`` of ``Bp``) it computes ``T = Ap_strip.T @ Bp_strip`` over ``kc`` steps, ``unroll``
steps per loop trip then a remainder loop, each element the same K-ordered sum of
``llvm.fmuladd`` (one rounding per step where the CPU has FMA, as the scalar code with
``contract`` gives; for integers a multiply and an add, wrapping in the dtype's width), and
stores the MR×NR tile into ``T`` (C-contiguous, MR×NR).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def applies(dtype: np.dtype) -> bool:
    """The dtypes this loop is written for: floats and signed integers (the rung's
    float32, float64, int32 and int64)."""
    return np.dtype(dtype).kind in "fi"


class _Arithmetic:
    """The element type and the two operations the tile needs, for one dtype and width.

    Floats multiply-add with ``llvm.fmuladd`` (see :func:`_declare`). Integers multiply and
    add in their own width, wrapping as NumPy's integer matmul does: two's-complement
    products and sums keep the same low bits whatever the order, so the result equals
    NumPy's exactly."""

    def __init__(self, dtype: np.dtype, width: int) -> None:
        from llvmlite import ir

        dtype = np.dtype(dtype)
        if not applies(dtype):
            raise ValueError(f"no vector tile for {dtype}")
        self.is_float = dtype.kind == "f"
        if self.is_float:
            self.scalar = ir.FloatType() if dtype.itemsize == 4 else ir.DoubleType()
        else:
            self.scalar = ir.IntType(8 * dtype.itemsize)
        self.vec = ir.VectorType(self.scalar, width)
        self.zeros = ir.Constant(self.vec, [0] * width)
        self._fma_name = f"llvm.fmuladd.v{width}f{dtype.itemsize * 8}"

    def mul(self, builder: Any, x: Any, y: Any) -> Any:
        return builder.fmul(x, y) if self.is_float else builder.mul(x, y)

    def muladd(self, builder: Any, x: Any, y: Any, acc: Any) -> Any:
        """``x*y + acc``: one fused multiply-add for floats where the CPU has one."""
        if self.is_float:
            fma = _declare(builder.module, self._fma_name, self.vec)
            return builder.call(fma, [x, y, acc])
        return builder.add(builder.mul(x, y), acc)


def lanes(nr: int, dtype: np.dtype, vector_bits: int | None) -> int:
    """Elements per vector for an NR-wide row of ``dtype``: the widest vector the code may
    use (``vector_bits``, 256 when LLVM chooses), at most NR and dividing it."""
    width = (vector_bits or 256) // (8 * np.dtype(dtype).itemsize)
    w = max(1, min(nr, width))
    while nr % w:
        w //= 2
    return w


def tile_loop(mr: int, nr: int, dtype: np.dtype, vector_bits: int | None,
              unroll: int) -> Any:
    """The intrinsic ``kloop(kc, Ap, a0, Bp, b0, T)`` for one tile shape (see the module),
    in vectors of :func:`lanes` elements for code that may use ``vector_bits``."""
    from numba.core import types
    from numba.extending import intrinsic

    dtype = np.dtype(dtype)
    if not applies(dtype):
        raise ValueError(f"no vector tile loop for {dtype}")

    @intrinsic
    def kloop(typingctx, kc, ap, a0, bp, b0, t):  # noqa: ANN001, ANN202 - Numba's protocol
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            kc_v, ap_v, a0_v, bp_v, b0_v, t_v = args
            kc_v = context.cast(builder, kc_v, signature.args[0], types.int64)
            a0_v = context.cast(builder, a0_v, signature.args[2], types.int64)
            b0_v = context.cast(builder, b0_v, signature.args[4], types.int64)
            a_ptr = builder.gep(context.make_array(signature.args[1])(
                context, builder, ap_v).data, [a0_v], inbounds=True)
            b_ptr = builder.gep(context.make_array(signature.args[3])(
                context, builder, bp_v).data, [b0_v], inbounds=True)
            t_ptr = context.make_array(signature.args[5])(context, builder, t_v).data
            emit_loop(builder, kc_v, a_ptr, b_ptr, t_ptr, mr, nr, dtype,
                      lanes(nr, dtype, vector_bits), unroll)
            return context.get_dummy_value()

        return types.void(kc, ap, a0, bp, b0, t), codegen

    return kloop


def tile_store(mr: int, nr: int, dtype: np.dtype, vector_bits: int | None,
               scale_c: bool) -> Any:
    """The intrinsic that writes the MR×NR tile T (C-contiguous) into C at row ``i``, column
    ``j``: ``tstore(T, C, i, j, alpha)`` does ``C[i:i+MR, j:j+NR] = alpha*T``, or, with
    ``scale_c``, ``tstore(T, C, i, j, alpha, bb)`` does ``= alpha*T + bb*C``, as one
    multiply-add per element (``llvm.fmuladd(alpha, T, bb*C)``: what LLVM makes of
    ``alpha*T + bb*C`` with ``contract``; integers wrap, as NumPy's), in vectors of
    :func:`lanes` elements.

    Why an intrinsic: written as MR·NR named scalars, this update was left to the SLP
    vectoriser, which took about 6 s of the rung's 18 s compile per float dtype to pack
    8×32 statements back into the vectors they came from."""
    from numba.core import types
    from numba.extending import intrinsic

    dtype = np.dtype(dtype)
    if not applies(dtype):
        raise ValueError(f"no vector tile store for {dtype}")
    width = lanes(nr, dtype, vector_bits)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        t_ty, c_ty = signature.args[0], signature.args[1]
        t_arr = context.make_array(t_ty)(context, builder, args[0])
        c_arr = context.make_array(c_ty)(context, builder, args[1])
        i_v = context.cast(builder, args[2], signature.args[2], types.int64)
        j_v = context.cast(builder, args[3], signature.args[3], types.int64)
        alpha = context.cast(builder, args[4], signature.args[4], c_ty.dtype)
        bb = (context.cast(builder, args[5], signature.args[5], c_ty.dtype) if scale_c
              else None)
        row_stride = builder.extract_value(c_arr.strides, 0)  # bytes; columns are unit
        emit_store(builder, t_arr.data, c_arr.data, row_stride, i_v, j_v, alpha, bb, mr, nr,
                   dtype, width)
        return context.get_dummy_value()

    if scale_c:
        @intrinsic
        def tstore(typingctx, t, c, i, j, alpha, bb):  # noqa: ANN001, ANN202
            return types.void(t, c, i, j, alpha, bb), codegen
    else:
        @intrinsic
        def tstore(typingctx, t, c, i, j, alpha):  # noqa: ANN001, ANN202
            return types.void(t, c, i, j, alpha), codegen
    return tstore


def emit_store(builder: Any, t_ptr: Any, c_ptr: Any, row_stride: Any, i: Any, j: Any,
               alpha: Any, bb: Any, mr: int, nr: int, dtype: np.dtype, width: int) -> None:
    """Append the tile's write-back (see :func:`tile_store`) at ``builder``'s position:
    ``t_ptr``, ``c_ptr`` element pointers, ``row_stride`` C's row stride in bytes, ``i``,
    ``j`` i64, ``alpha``/``bb`` scalars (``bb`` None: C is not read)."""
    from llvmlite import ir

    dtype = np.dtype(dtype)
    arith = _Arithmetic(dtype, width)
    scalar, vec = arith.scalar, arith.vec
    i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()
    va = _splat(builder, vec, alpha)
    vb = None if bb is None else _splat(builder, vec, bb)
    c_bytes = builder.bitcast(c_ptr, i8p)
    col = builder.mul(j, i64(dtype.itemsize))
    # every load of T (and of C) before the first store to C: as far as LLVM knows, they
    # may alias, and a load after a store could not be moved or combined
    rows = []
    for r in range(mr):
        offset = builder.add(builder.mul(builder.add(i, i64(r)), row_stride), col)
        row = builder.bitcast(builder.gep(c_bytes, [offset], inbounds=True),
                              scalar.as_pointer())
        for v in range(nr // width):
            t_at = builder.gep(t_ptr, [i64(r * nr + v * width)], inbounds=True)
            tv = builder.load(builder.bitcast(t_at, vec.as_pointer()), align=dtype.itemsize)
            c_at = builder.bitcast(builder.gep(row, [i64(v * width)], inbounds=True),
                                   vec.as_pointer())
            cv = None if vb is None else builder.load(c_at, align=dtype.itemsize)
            rows.append((c_at, tv, cv))
    for c_at, tv, cv in rows:
        value = (arith.mul(builder, va, tv) if cv is None
                 else arith.muladd(builder, va, tv, arith.mul(builder, vb, cv)))
        builder.store(value, c_at, align=dtype.itemsize)


def emit_loop(builder: Any, kc: Any, a_ptr: Any, b_ptr: Any, t_ptr: Any, mr: int, nr: int,
              dtype: np.dtype, width: int, unroll: int) -> None:
    """Append the K loop (see the module) at ``builder``'s position, in vectors of ``width``
    elements: ``kc`` an i64, the pointers to the first element of the A strip, of the B
    strip and of the tile T. The one definition of the loop, used by the Numba intrinsic
    and by :func:`module_ir`, which compiles it alone for another CPU."""
    from llvmlite import ir

    dtype = np.dtype(dtype)
    arith = _Arithmetic(dtype, width)
    vec, zeros = arith.vec, arith.zeros
    nv = nr // width
    i64 = ir.IntType(64)

    def step(p: Any, acc: list[Any]) -> list[Any]:
        """One K step: NR/W vectors of B, then row by row a broadcast and its FMAs."""
        b_row = builder.gep(b_ptr, [builder.mul(p, i64(nr))], inbounds=True)
        bvals = []
        for v in range(nv):
            ptr = builder.gep(b_row, [i64(v * width)], inbounds=True)
            bvals.append(builder.load(builder.bitcast(ptr, vec.as_pointer()),
                                      align=dtype.itemsize))
        a_row = builder.gep(a_ptr, [builder.mul(p, i64(mr))], inbounds=True)
        out = list(acc)
        for i in range(mr):
            a = _splat(builder, vec, builder.load(builder.gep(a_row, [i64(i)], inbounds=True),
                                                  align=dtype.itemsize))
            for v in range(nv):
                out[i * nv + v] = arith.muladd(builder, a, bvals[v], acc[i * nv + v])
        return out

    fn = builder.function
    n_acc = mr * nv
    entry = builder.basic_block
    main = fn.append_basic_block("tile.main")
    mid = fn.append_basic_block("tile.mid")
    rem = fn.append_basic_block("tile.rem")
    done = fn.append_basic_block("tile.done")
    nmain = builder.udiv(kc, i64(unroll))
    builder.cbranch(builder.icmp_unsigned(">", nmain, i64(0)), main, mid)

    builder.position_at_end(main)
    q = builder.phi(i64)
    acc_in = [builder.phi(vec) for _ in range(n_acc)]
    acc = list(acc_in)
    base = builder.mul(q, i64(unroll))
    for u in range(unroll):
        acc = step(builder.add(base, i64(u)), acc)
    q_next = builder.add(q, i64(1))
    main_end = builder.basic_block
    builder.cbranch(builder.icmp_unsigned("<", q_next, nmain), main, mid)
    q.add_incoming(i64(0), entry)
    q.add_incoming(q_next, main_end)
    for phi, value in zip(acc_in, acc, strict=True):
        phi.add_incoming(zeros, entry)
        phi.add_incoming(value, main_end)

    builder.position_at_end(mid)
    acc_mid = []
    for value in acc:
        phi = builder.phi(vec)
        phi.add_incoming(zeros, entry)
        phi.add_incoming(value, main_end)
        acc_mid.append(phi)
    start = builder.mul(nmain, i64(unroll))
    builder.cbranch(builder.icmp_unsigned("<", start, kc), rem, done)

    builder.position_at_end(rem)
    p = builder.phi(i64)
    racc_in = [builder.phi(vec) for _ in range(n_acc)]
    racc = step(p, racc_in)
    p_next = builder.add(p, i64(1))
    rem_end = builder.basic_block
    builder.cbranch(builder.icmp_unsigned("<", p_next, kc), rem, done)
    p.add_incoming(start, mid)
    p.add_incoming(p_next, rem_end)
    for phi, before, value in zip(racc_in, acc_mid, racc, strict=True):
        phi.add_incoming(before, mid)
        phi.add_incoming(value, rem_end)

    builder.position_at_end(done)
    final = []
    for k in range(n_acc):
        phi = builder.phi(vec)
        phi.add_incoming(acc_mid[k], mid)
        phi.add_incoming(racc[k], rem_end)
        final.append(phi)
    for k, phi in enumerate(final):
        i, v = divmod(k, nv)
        ptr = builder.gep(t_ptr, [i64(i * nr + v * width)], inbounds=True)
        builder.store(phi, builder.bitcast(ptr, vec.as_pointer()), align=dtype.itemsize)


def module_ir(mr: int, nr: int, dtype: np.dtype, vector_bits: int | None, unroll: int,
              triple: str = "") -> str:
    """LLVM IR of a module holding the K loop alone, as ``void @kloop(i64 kc, T* a, T* b,
    T* t)`` (``noalias`` pointers to the A strip, the B strip and the tile), built by
    :func:`emit_loop` exactly as the rung builds it. Compiling this text for another
    triple shows the machine code that CPU would run (the tests compile it for AArch64 on
    any host), without Numba's host-only code around it."""
    from llvmlite import ir

    dtype = np.dtype(dtype)
    ptr = _Arithmetic(dtype, 1).scalar.as_pointer()
    module = ir.Module(name=f"kloop_{mr}x{nr}_{dtype.name}")
    module.triple = triple
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(64), ptr, ptr, ptr]),
                     "kloop")
    for arg in fn.args[1:]:
        arg.add_attribute("noalias")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    kc, a_ptr, b_ptr, t_ptr = fn.args
    emit_loop(builder, kc, a_ptr, b_ptr, t_ptr, mr, nr, dtype, lanes(nr, dtype, vector_bits),
              unroll)
    builder.ret_void()
    return str(module)


def _splat(builder: Any, vec: Any, x: Any) -> Any:
    """The scalar ``x`` in every lane of a ``vec`` (insert into lane 0, then a shuffle with
    an all-zero mask: the broadcast LLVM turns into ``vbroadcastss``/``{1to16}``)."""
    from llvmlite import ir

    lane0 = builder.insert_element(ir.Constant(vec, None), x, ir.IntType(32)(0))
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vec.count), [0] * vec.count)
    return builder.shuffle_vector(lane0, ir.Constant(vec, None), mask)


def _declare(module: Any, name: str, vec: Any) -> Any:
    """``llvm.fmuladd`` for ``vec``: a fused multiply-add where the CPU has one (what the
    scalar code compiles to with ``contract``), a multiply and an add elsewhere, never a
    call to the C library's exact ``fma``."""
    from llvmlite import ir
    from numba.core import cgutils

    return cgutils.get_or_insert_function(module, ir.FunctionType(vec, [vec, vec, vec]), name)
