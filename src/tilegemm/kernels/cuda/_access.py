"""Memory-access intrinsics for the fast CUDA rungs (128-bit vectors, no index fix-ups),
and their simulator stand-ins.

numba-cuda has no way to view a float32 array as float4, so a kernel that wants
``ld.global.v4.f32`` needs a small extension. This module defines three ``@intrinsic``
functions with numba's extending API (pure LLVM IR, no C++ and no inline assembly, so the
optimiser still sees ordinary loads and stores it can schedule):

- ``load(arr, idx)`` / ``store(arr, idx, value)`` are ``arr[idx]`` without the
  negative-index fix-up numba emits for signed indices (a compare-and-select per index that
  also defeats constant address offsets: in the register-tiled inner loop it cost rung 6
  ~16 registers of precomputed row addresses; in the scalar edge paths, where each access
  also kept its own fixed-up row offset live across the K loop, another ~24). Indices must
  be in range and >= 0; a tuple may mix integer widths (``cuda.blockIdx`` is int32), each
  index is widened to 64 bits;

- ``vload(arr, idx)`` returns the ``W = 16 // itemsize`` consecutive elements starting at
  ``arr[idx]`` as a tuple (4 float32 or 2 float64), from one ``load <W x T>, align 16``;
- ``vstore(arr, idx, values)`` writes such a tuple with one ``store <W x T>, align 16``;
- ``gather(arr, idx)`` / ``scatter(arr, idx, values)`` move the same W-tuple with W scalar
  accesses: they connect the tuples to per-thread register arrays (``cuda.local.array``,
  which must stay scalar so LLVM keeps them in registers) without the kernel having to
  spell out a tuple of dtype-dependent length;
- ``address(arr)`` is the data pointer as an integer, for the 16-byte alignment test.

NVVM turns the vector load/store into ``ld.global.v4.f32`` / ``st.shared.v4.f32`` etc.: kernel
pointer parameters are known to be global and shared arrays are known to be shared, so the
address space is inferred (tests/test_cuda_perf_ptx.py checks the PTX).

The caller guarantees alignment: the element index along the last axis is a multiple of W,
the row stride is a multiple of 16 bytes and the data pointer is 16-byte aligned (global
operands are checked at run time from ``address`` and the strides, see ``k06_vectorized``;
shared arrays are declared with ``alignment=Access.align``). A misaligned vector access is
a hardware fault, which is why every rung that uses these keeps a scalar path.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) an intrinsic cannot execute, so
:func:`vector_ops` returns plain-Python functions with the same signatures: the simulator runs
exactly the same kernel code and index arithmetic, only the single vector instruction is
replaced by W element accesses. ``address`` returns 0 there (the simulator has no device
addresses), so the stride/shape conditions alone pick the vector path, which is what lets
simulator tests exercise both paths. Shared arrays cannot take ``alignment=`` in the
simulator, hence ``align`` is ``None`` there.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

VECTOR_BYTES = 16


class Access(NamedTuple):
    load: Any
    store: Any
    vload: Any
    vstore: Any
    gather: Any
    scatter: Any
    address: Any
    align: int | None  # the alignment= to declare shared arrays with


def width(itemsize: int) -> int:
    """Elements per 128-bit vector for an element of ``itemsize`` bytes (4 for float32)."""
    return VECTOR_BYTES // itemsize


@cache
def access_ops() -> Access:
    """The vector helpers for the current mode (real compilation or the simulator)."""
    from tilegemm import simulator

    if simulator.enabled():
        return Access(_py_load, _py_store, _py_vload, _py_vstore, _py_gather, _py_scatter,
                      _py_address, None)
    return _compiled_ops()


@cache
def vload_at() -> Any:
    """``vload_at(arr, idx, off)``: the W elements at element offset ``off`` from ``arr``'s
    data pointer, ``idx`` being the same position as an index tuple.

    Compiled, only ``off`` is used: a kernel keeps one offset per load and adds a constant
    per k-tile, instead of rebuilding the address from three 64-bit indices and the shape
    every time (~15 integer instructions per load). The offset must be that of ``idx``
    (``sum(i * stride / itemsize)``); the simulator stand-in checks exactly that, then
    loads through ``idx``, so simulator tests catch a wrong offset and the tracer sees an
    ordinary access.
    """
    from tilegemm import simulator

    if simulator.enabled():
        return _py_vload_at
    return _compiled_offset_load(vector=True)


@cache
def load_at() -> Any:
    """``load_at(arr, idx, off)``: ``arr[idx]`` read at element offset ``off`` from ``arr``'s
    data pointer, the scalar companion of :func:`vload_at` (edge paths that step a kept
    offset by the operand's strides; the device copies of operands). Compiled, only
    ``off`` is used, read-only (``invariant.load``); the simulator stand-in checks that
    ``off`` is ``idx``'s offset, then reads through ``idx``."""
    from tilegemm import simulator

    if simulator.enabled():
        return _py_load_at
    return _compiled_offset_load(vector=False)


# --- simulator stand-ins -------------------------------------------------------------------


def _py_vload_at(arr: Any, idx: tuple[int, ...], off: int) -> tuple[Any, ...]:
    isz = arr.dtype.itemsize
    expect = sum(int(i) * (st // isz) for i, st in zip(idx, arr.strides))
    if int(off) != expect:
        raise AssertionError(f"vload_at: offset {off} is not that of index {idx} ({expect})")
    return _py_vload(arr, idx)



def _py_load_at(arr: Any, idx: Any, off: Any) -> Any:
    isz = arr.dtype.itemsize
    expect = sum(int(i) * (st // isz) for i, st in zip(idx, arr.strides))
    if int(off) != expect:
        raise AssertionError(f"load_at: offset {off} is not that of index {idx} ({expect})")
    return arr[tuple(int(i) for i in idx)]


def _py_load(arr: Any, idx: tuple[int, ...]) -> Any:
    return arr[idx]


def _py_store(arr: Any, idx: tuple[int, ...], value: Any) -> None:
    arr[idx] = value


def _check_aligned(arr: Any, idx: tuple[int, ...], what: str) -> None:
    """A vector access must start on a 16-byte boundary from the array's data pointer
    (which the simulator takes as aligned, ``address`` being 0 there): on a GPU a
    misaligned one is a fault, so a simulator test must fail on it too."""
    at = sum(int(i) * st for i, st in zip(idx, arr.strides))
    if at % VECTOR_BYTES:
        raise AssertionError(f"{what}: index {idx} is {at} bytes from the array's start, "
                             f"not a multiple of {VECTOR_BYTES}")


def _py_gather(arr: Any, idx: tuple[int, ...]) -> tuple[Any, ...]:
    w = width(arr.dtype.itemsize)
    head, last = idx[:-1], idx[-1]
    return tuple(arr[head + (last + q,)] for q in range(w))


def _py_scatter(arr: Any, idx: tuple[int, ...], values: tuple[Any, ...]) -> None:
    head, last = idx[:-1], idx[-1]
    for q, v in enumerate(values):
        arr[head + (last + q,)] = v


def _py_vload(arr: Any, idx: tuple[int, ...]) -> tuple[Any, ...]:
    _check_aligned(arr, idx, "vload")
    return _py_gather(arr, idx)


def _py_vstore(arr: Any, idx: tuple[int, ...], values: tuple[Any, ...]) -> None:
    _check_aligned(arr, idx, "vstore")
    _py_scatter(arr, idx, values)


def _py_address(arr: Any) -> int:
    return 0


# --- compiled intrinsics -------------------------------------------------------------------
# Typing and lowering helpers shared by the intrinsics here and in _tensorcore.py (numba is
# imported when they run: while a kernel compiles).


def check_index(arr: Any, idx: Any, what: str) -> None:
    """Typing: ``arr`` is an array and ``idx`` a tuple of one integer per dimension."""
    from numba import types
    from numba.core.errors import TypingError

    if not isinstance(arr, types.Array):
        raise TypingError(f"{what}: needs an array, got {arr}")
    if (not isinstance(idx, types.BaseTuple) or len(idx) != arr.ndim
            or not all(isinstance(t, types.Integer) for t in idx)):
        raise TypingError(f"{what}: needs a tuple of {arr.ndim} integer indices")


def item_pointer(context: Any, builder: Any, arrty: Any, arr: Any, idxty: Any,
                 idx: Any) -> Any:
    """Lowering: the address of ``arr[idx]``, without negative-index wraparound."""
    from numba.cuda import cgutils
    from numba.cuda.api_util import normalize_indices

    idxty, indices = normalize_indices(context, builder, idxty, idx, arrty, arrty.dtype)
    ary = context.make_array(arrty)(context, builder, value=arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, indices, wraparound=False)



@cache
def _compiled_ops() -> Access:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def check(arr: Any, idx: Any, what: str) -> int:
        if not isinstance(arr, types.Array) or not isinstance(arr.dtype, types.Number):
            raise TypingError(f"{what}: needs a numeric array, got {arr}")
        check_index(arr, idx, what)
        w = VECTOR_BYTES // (arr.dtype.bitwidth // 8)
        if w < 2:
            raise TypingError(f"{what}: {arr.dtype} is too wide for a 128-bit vector")
        return w

    def check_store(arr: Any, idx: Any, values: Any, what: str) -> int:
        """``check``, and ``values`` a tuple of one value per lane (scatter and vstore)."""
        w = check(arr, idx, what)
        if not isinstance(values, types.BaseTuple) or len(values) != w:
            raise TypingError(f"{what}: needs a tuple of {w} values for {arr.dtype}")
        return w

    def vector_pointer(context: Any, builder: Any, arrty: Any, arr: Any, idxty: Any,
                       idx: Any, w: int) -> Any:
        ptr = item_pointer(context, builder, arrty, arr, idxty, idx)
        vec = ir.VectorType(context.get_value_type(arrty.dtype), w)
        return builder.bitcast(ptr, vec.as_pointer()), vec

    @intrinsic
    def load(typingctx: Any, arr: Any, idx: Any) -> Any:
        check_index(arr, idx, "load")
        sig = arr.dtype(arr, idx)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            ptr = item_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            return builder.load(ptr)

        return sig, codegen

    @intrinsic
    def store(typingctx: Any, arr: Any, idx: Any, value: Any) -> Any:
        check_index(arr, idx, "store")
        sig = types.void(arr, idx, value)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            arrty, idxty, valty = sig.args
            ptr = item_pointer(context, builder, arrty, args[0], idxty, args[1])
            builder.store(context.cast(builder, args[2], valty, arrty.dtype), ptr)

        return sig, codegen

    @intrinsic
    def vload(typingctx: Any, arr: Any, idx: Any) -> Any:
        w = check(arr, idx, "vload")
        sig = types.UniTuple(arr.dtype, w)(arr, idx)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            vptr, _ = vector_pointer(context, builder, sig.args[0], args[0], sig.args[1],
                                     args[1], w)
            v = builder.load(vptr, align=VECTOR_BYTES)
            items = [builder.extract_element(v, ir.Constant(ir.IntType(32), q))
                     for q in range(w)]
            return context.make_tuple(builder, sig.return_type, items)

        return sig, codegen

    def element_pointers(context: Any, builder: Any, arrty: Any, arr: Any, idxty: Any,
                         idx: Any, w: int) -> list[Any]:
        ptr = item_pointer(context, builder, arrty, arr, idxty, idx)
        return [builder.gep(ptr, [ir.Constant(ir.IntType(64), q)]) for q in range(w)]

    @intrinsic
    def gather(typingctx: Any, arr: Any, idx: Any) -> Any:
        w = check(arr, idx, "gather")
        sig = types.UniTuple(arr.dtype, w)(arr, idx)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            ptrs = element_pointers(context, builder, sig.args[0], args[0], sig.args[1],
                                    args[1], w)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.load(p) for p in ptrs])

        return sig, codegen

    @intrinsic
    def scatter(typingctx: Any, arr: Any, idx: Any, values: Any) -> Any:
        w = check_store(arr, idx, values, "scatter")
        sig = types.void(arr, idx, values)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            arrty, idxty, valty = sig.args
            ptrs = element_pointers(context, builder, arrty, args[0], idxty, args[1], w)
            items = cgutils.unpack_tuple(builder, args[2], count=w)
            for p, x, t in zip(ptrs, items, valty):
                builder.store(context.cast(builder, x, t, arrty.dtype), p)

        return sig, codegen

    @intrinsic
    def vstore(typingctx: Any, arr: Any, idx: Any, values: Any) -> Any:
        w = check_store(arr, idx, values, "vstore")
        sig = types.void(arr, idx, values)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            arrty, idxty, valty = sig.args
            vptr, vec = vector_pointer(context, builder, arrty, args[0], idxty, args[1], w)
            items = cgutils.unpack_tuple(builder, args[2], count=w)
            v = ir.Constant(vec, ir.Undefined)
            for q, (x, t) in enumerate(zip(items, valty)):
                x = context.cast(builder, x, t, arrty.dtype)
                v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), q))
            builder.store(v, vptr, align=VECTOR_BYTES)

        return sig, codegen

    @intrinsic
    def address(typingctx: Any, arr: Any) -> Any:
        if not isinstance(arr, types.Array):
            raise TypingError(f"address: needs an array, got {arr}")
        sig = types.uint64(arr)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            return builder.ptrtoint(ary.data, ir.IntType(64))

        return sig, codegen

    return Access(load, store, vload, vstore, gather, scatter, address, VECTOR_BYTES)


@cache
def _compiled_offset_load(vector: bool) -> Any:
    """The intrinsic behind :func:`vload_at` (``vector``: W elements, one 16-byte load) or
    :func:`load_at` (one element): a load at an element offset from the data pointer."""
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    name = "vload_at" if vector else "load_at"

    def offset_load(typingctx: Any, arr: Any, idx: Any, off: Any) -> Any:
        if not isinstance(arr, types.Array) or not isinstance(off, types.Integer):
            raise TypingError(f"{name}: needs an array, an index tuple and an integer offset")
        w = VECTOR_BYTES // (arr.dtype.bitwidth // 8)
        sig = (types.UniTuple(arr.dtype, w) if vector else arr.dtype)(arr, idx, off)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arrty, _, offty = sig.args
            ary = context.make_array(arrty)(context, builder, value=args[0])
            ptr = builder.gep(ary.data, [context.cast(builder, args[2], offty, types.int64)])
            if vector:
                vec = ir.VectorType(context.get_value_type(arrty.dtype), w)
                v = builder.load(builder.bitcast(ptr, vec.as_pointer()), align=VECTOR_BYTES)
            else:
                v = builder.load(ptr)
            # Read-only for the whole kernel (the operands; an output that overlaps them
            # goes to a temporary): NVPTX may then use the non-coherent read-only path,
            # ld.global.nc (LDG.E.128.CONSTANT), as CUDA C does for const __restrict__.
            v.set_metadata("invariant.load", builder.module.add_metadata([]))
            if not vector:
                return v
            items = [builder.extract_element(v, ir.Constant(ir.IntType(32), q))
                     for q in range(w)]
            return context.make_tuple(builder, sig.return_type, items)

        return sig, codegen

    offset_load.__name__ = offset_load.__qualname__ = name
    return intrinsic(offset_load)
