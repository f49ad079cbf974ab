"""Kernels whose inner loops are written out at build time, as Python source.

Why: numba lowers ``for kk in range(BK)`` to a loop with a 64-bit counter, and LLVM does not
unroll a body of 64 FMAs and a few shared loads 16 times. In the loop every shared address
is rebuilt from ``kk`` on every step (the swizzle, the row offset) and nothing overlaps one
step's loads with the previous step's FMAs: about 20 integer instructions per 64 FMAs. With
the steps written out, every shared address is a per-thread base plus a constant, which
ptxas folds into the load instruction (``LDS.128 R8, [R2+0x400]``), and ptxas can issue
the next step's loads among this step's FMAs. The generated source is an ordinary numba
kernel: it compiles, runs on the simulator and is traced like the hand-written rungs.

``indent(lines, spaces)`` indents generated lines, ``fill(template, parts)`` puts them in
place of ``#@NAME`` marker lines; ``compile_source(source, name,
namespace)`` turns the text into a function whose globals are ``namespace`` (the rung's
constants and helpers, and ``cuda``: numba's simulator swaps ``cuda`` in a kernel's globals,
so it must be a global there, not a closure variable). The text is registered with
``linecache`` so tracebacks, the simulator and ``tilegemm explain``'s tracer can show it,
and remembered (:func:`generated_source`), so that ``kernel_jit`` can write a generated
kernel to a real file and let numba-cuda cache its machine code on disk (see ``_jit.py``).
:func:`fingerprint` describes the globals such a kernel is compiled with: numba freezes
globals into the machine code, and its cache does not look at them, so they must be part
of the cache key.
"""

from __future__ import annotations

import hashlib
import itertools
import linecache
import re
import types
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

_serial = itertools.count()
# The text behind every generated filename (linecache's copy can be cleared by anyone).
_SOURCES: dict[str, str] = {}


def indent(lines: Iterable[str], spaces: int) -> str:
    """``lines`` joined, each indented by ``spaces`` (the first too)."""
    pad = " " * spaces
    return "\n".join(pad + line for line in lines)


def compile_source(source: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Define the function ``name`` from ``source`` with ``namespace`` as its globals."""
    filename = f"<tilegemm generated {name} #{next(_serial)}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    _SOURCES[filename] = source
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated text
    return namespace[name]


def fill(template: str, parts: dict[str, list[str]]) -> str:
    """``template`` with every line ``#@NAME`` replaced by ``parts[NAME]``, each line
    indented like the marker (so one part can go to several depths)."""

    def lines(match: re.Match[str]) -> str:
        return indent(parts[match.group(2)], len(match.group(1)))

    return re.sub(r"^( *)#@(\w+)$", lines, template, flags=re.MULTILINE)


def generated_source(fn: Any) -> str | None:
    """The source text ``fn`` (a function, or a numba dispatcher of one) was defined from by
    :func:`compile_source`; None for any other function."""
    code = getattr(getattr(fn, "py_func", fn), "__code__", None)
    return None if code is None else _SOURCES.get(code.co_filename)


class Unfingerprintable(TypeError):
    """A kernel's global has no stable description, so its compiled code cannot be keyed."""


def fingerprint(value: Any) -> str:
    """A stable text (a hash) of ``value`` as a compiled kernel depends on it.

    numba compiles a kernel's globals in as constants (numbers, dtypes) or as the code they
    stand for (intrinsics, device functions), so two kernels with the same source but other
    globals are different machine code. Numbers, strings, types and modules are described
    by value or name; a function by its module and qualified name (tilegemm's own are
    covered by the hash of the kernel sources in the cache key) plus, recursively, the
    values its closure captured (``cp_wait(2)`` and ``cp_wait(0)`` are one function with
    other cells), or by its generated source and globals; a numba dispatcher or intrinsic by
    the Python function behind it and its options. Anything else raises
    :class:`Unfingerprintable` rather than risk two kernels sharing a cache entry.
    """
    return hashlib.sha256(repr(_describe(value, set())).encode()).hexdigest()


def _describe(v: Any, active: set[int]) -> Any:  # noqa: PLR0911 - one case per kind of value
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (np.generic, np.dtype)):
        return (type(v).__name__, repr(v))
    if isinstance(v, type):
        return ("type", v.__module__, v.__qualname__)
    if isinstance(v, types.ModuleType):
        return ("module", v.__name__)
    if id(v) in active:  # a function reaching itself (through its own globals)
        return ("cycle", getattr(v, "__qualname__", type(v).__name__))
    active.add(id(v))
    try:
        return _describe_object(v, active)
    finally:
        active.discard(id(v))


def _describe_object(v: Any, active: set[int]) -> Any:
    if isinstance(v, (tuple, list, set, frozenset)):
        items = [_describe(x, active) for x in v]
        return (type(v).__name__, sorted(items, key=repr) if isinstance(v, (set, frozenset))
                else items)
    if isinstance(v, dict):
        return ("dict", sorted(((repr(_describe(k, active)), _describe(x, active))
                                for k, x in v.items())))
    if isinstance(v, types.FunctionType):
        cells = [_describe(c.cell_contents, active) for c in v.__closure__ or ()]
        source = _SOURCES.get(v.__code__.co_filename)
        if source is not None:  # generated: its text and its globals (see compile_source)
            names = {k: x for k, x in v.__globals__.items() if not k.startswith("__")}
            return ("generated", v.__qualname__, source, cells, _describe(names, active))
        return ("function", v.__module__, v.__qualname__, cells)
    if isinstance(v, types.BuiltinFunctionType):
        return ("builtin", getattr(v, "__module__", None), v.__qualname__)
    py_func = getattr(v, "py_func", None)  # a numba dispatcher (device function, kernel)
    if isinstance(py_func, types.FunctionType):
        return ("dispatcher", type(v).__qualname__, _describe(py_func, active),
                _describe(getattr(v, "targetoptions", {}), active))
    defn = getattr(v, "_defn", None)  # a numba @intrinsic
    if isinstance(defn, types.FunctionType):
        return ("intrinsic", type(v).__qualname__, _describe(defn, active))
    text = repr(v)
    if re.search(r"0x[0-9a-fA-F]{4,}", text):  # an address: not the same in another process
        raise Unfingerprintable(f"no stable description of {type(v).__qualname__}: {text}")
    # numba types (float32, int16) and LLVM types (i32) describe themselves by value
    return ("value", type(v).__module__, type(v).__qualname__, text)
