"""Code-generation switches for one Numba compilation: the SLP vectoriser, vector width.

Numba disables the superword-level-parallelism vectoriser by default
(``NUMBA_SLP_VECTORIZE=0``). The blocked rung's micro-kernel, once MR×NR named scalars for
that pass to pack into vector registers, is explicit vector code now (see ``_vector_tile``)
and still compiles with the pass on. Numba reads
``config.SLP_VECTORIZE`` when it builds the pass pipeline for a library, so setting it while
one function compiles (eagerly, with an explicit signature) affects that function only; the
compiled code keeps its vector instructions when later linked into callers.

LLVM's tuning for Intel's AVX-512 server cores (Skylake-SP through Sapphire and Emerald
Rapids) *prefers 256-bit vectors*: its vectorisers then fill ymm registers only, half of
what the FMA units take, and the blocked rung ran at half of NumPy's speed on a Xeon. Clang's
``-mprefer-vector-width=512`` sets two function attributes that lift this per function;
:func:`vector_width` adds the same attributes to every function Numba compiles inside it
(Numba has no option for it). It patches Numba's code library class while the block runs,
so a user's own Numba code compiled by another thread at that moment gets the attributes
too (harmless: they only allow wider vectors); tilegemm enters such blocks only while it
compiles its rung.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# One re-entrant lock for both settings: a helper compiled on first use (see _lazy)
# re-enters the settings it was declared under, possibly while its caller's compilation
# holds them, and with one lock no two threads can take the two in opposite orders.
_LOCK = threading.RLock()
_WIDTHS: list[int | None] = []  # the vector widths in force, innermost last
_SLP_BEFORE: list[int] = []  # Numba's SLP setting outside each slp_enabled block in force


@contextmanager
def slp_enabled() -> Iterator[None]:
    """Compile with SLP vectorisation inside this block (process-wide flag, restored after)."""
    from numba.core import config

    with _LOCK:
        old = config.SLP_VECTORIZE
        _SLP_BEFORE.append(old)
        config.SLP_VECTORIZE = 1
        try:
            yield
        finally:
            config.SLP_VECTORIZE = old
            _SLP_BEFORE.pop()


_DEFINE = re.compile(r"^(define [^\n]*?)\s*(\{?)[ \t]*$", re.M)


def with_vector_width(ir: str, bits: int) -> str:
    """LLVM IR text with every function definition asking for ``bits``-wide vectors."""
    attrs = f' "prefer-vector-width"="{bits}" "min-legal-vector-width"="{bits}" '
    return _DEFINE.sub(lambda m: m.group(1) + attrs + m.group(2), ir)


@contextmanager
def vector_width(bits: int | None) -> Iterator[None]:
    """Functions Numba compiles inside this block use vectors up to ``bits`` wide (None:
    LLVM's choice for this CPU). Works by rewriting each function's IR text as Numba adds
    it to its code library, so it applies to compilations made inside the block (eager
    ones, with explicit signatures). Blocks nest: the innermost width applies."""
    with _LOCK:
        # None inside a block of another width must undo it; None outside any needs nothing
        patch = bool(bits) or any(_WIDTHS)
        if patch:
            from numba.core import codegen

            library = codegen.CPUCodeLibrary
            outer = library.add_ir_module
            if not _PRISTINE:
                _PRISTINE.append(outer)
            library.add_ir_module = _width_adder(bits) if bits else _PRISTINE[0]
        _WIDTHS.append(bits)
        try:
            yield
        finally:
            _WIDTHS.pop()
            if patch:
                library.add_ir_module = outer


_PRISTINE: list = []  # Numba's own CPUCodeLibrary.add_ir_module, before any block


def _width_adder(bits: int) -> Callable:
    """A replacement for CPUCodeLibrary.add_ir_module that asks for ``bits``-wide vectors."""

    def add_ir_module(self, ir_module) -> None:  # noqa: ANN001 - a llvmlite ir.Module
        from llvmlite import binding as ll
        from numba.core import cgutils

        self._raise_if_finalized()
        text = with_vector_width(cgutils.normalize_ir_text(str(ir_module)), bits)
        ll_module = ll.parse_assembly(text)
        ll_module.name = ir_module.name
        ll_module.verify()
        self.add_llvm_module(ll_module)

    return add_ir_module


def held_by_a_lost_thread(lock: threading.RLock) -> bool:
    """In a forked child: whether ``lock`` is held by a thread of the parent, which does
    not exist here and will never release it (one held by the forking thread, which
    continues here, is not)."""
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True


def _after_fork_in_child() -> None:
    """A child forked while another thread of the parent was inside a settings block (a
    rung function compiling or loading on its first call): that thread does not exist
    here, so its block never ends and the lock it holds would hang the child's first
    compile for ever. Start the child with no block in force and a free lock."""
    global _LOCK
    if not held_by_a_lost_thread(_LOCK):
        return
    _LOCK = threading.RLock()
    _WIDTHS.clear()
    if _PRISTINE:
        from numba.core import codegen

        codegen.CPUCodeLibrary.add_ir_module = _PRISTINE[0]
    if _SLP_BEFORE:
        from numba.core import config

        config.SLP_VECTORIZE = _SLP_BEFORE[0]
        _SLP_BEFORE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def current_vector_width() -> int | None:
    """The width :func:`vector_width` sets where this is called (None: LLVM's choice)."""
    with _LOCK:
        return _WIDTHS[-1] if _WIDTHS else None


def _prefetch_intrinsic() -> object:
    """``prefetch_write(C, i, j)``: ask the CPU to bring the cache line of ``C[i, j]`` in
    for writing (LLVM's ``llvm.prefetch``, rw=1, locality 3: every level), without waiting.

    Built lazily so importing this module does not import Numba.
    """
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch_write(typingctx, arr, i, j):  # noqa: ANN001, ANN202 - Numba's protocol
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1], args[2]],
                                           wraparound=False)
            emit_prefetch(builder, ptr, write=True)
            return context.get_dummy_value()

        return types.void(arr, i, j), codegen

    return prefetch_write


def emit_prefetch(builder: Any, ptr: Any, write: bool = False) -> None:
    """Ask the CPU for the cache line holding ``ptr`` (any pointer), into every cache level,
    without waiting (``llvm.prefetch``; never faults, whatever the address)."""
    from llvmlite import ir
    from numba.core import cgutils

    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), i32(int(write)), i32(3), i32(1)])


@functools.cache
def prefetch_write() -> object:
    """The ``prefetch_write`` intrinsic (see ``_prefetch_intrinsic``), built once."""
    return _prefetch_intrinsic()
