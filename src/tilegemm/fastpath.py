"""Repeated host products without re-deciding what an earlier call decided.

A call such as ``matmul(a, b)`` on NumPy matrices spends 50–70 µs in Python before any
arithmetic: describing the operands, NumPy's dtype rules, choosing the backend and the
rung, looking up tuned parameters, checking ``out``. For an 8×8×8 product the kernel takes
1 µs of that; at 256³ (about 0.1 ms of arithmetic on two cores) it is still a third of
the call, and it is paid again on every call of a loop that multiplies the same shapes.

So the full path (:func:`tilegemm.api.gemm`) remembers what it decided for a plain call —
NumPy arrays (not subclasses) of one native dtype, computed in that dtype, with default
arguments, on a host backend — keyed by (dtype, shape of ``a``, shape of ``b``, storage
order of each). The next call with the same key skips straight to the compiled program the
full path ran, with the same output allocation (and NaN poisoning when ``TILEGEMM_POISON``
is set). What qualifies:

- 2-D operands, each C-ordered, or Fortran-ordered (``x.T`` of a C-ordered array) when
  the rung packs transposed operands itself, as the full path hands them to it;
- N-D operands, C-ordered, with the same leading (batch) dimensions, or one of them 2-D
  (the same matrix for every product of the batch);
- ``out=`` a C-ordered array of exactly the result's shape and dtype that shares no
  memory with ``a`` or ``b`` (written in place, as the full path does); any other ``out``
  takes the full path, which handles strides, casting and overlap.

Anything else (another shape, dtype or layout, any keyword, an ndarray subclass, a device
array, a broadcast batch) takes the full path, which validates everything as before.

What is remembered is a decision, so it is made again when something it depends on
changes: the table is emptied when the tuning cache file (``tilegemm tune``'s results, in
this process or another) changes, checked with one ``stat`` per call as the full path
does, and :func:`forget` empties it on request.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tilegemm.backends.base import poison_enabled, poison_value

_LIMIT = 256  # remembered cases at most (the table is cleared when full)
_KINDS = "fiu"  # dtypes whose product NumPy computes in the operands' own dtype

_table: dict[tuple[Any, ...], Any] = {}
# the tuning cache file the decisions read, its mtime then, and TILEGEMM_CACHE_DIR then
# (which moves the file: a decision made under another directory is stale too)
_watch: list[Any] = [None, None, None]
_NDARRAY = np.ndarray


def _mtime(path: str | None) -> int | None:
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None


def _layout(x: np.ndarray) -> int:
    """0: C-ordered; 1: a 2-D Fortran-ordered matrix (the transpose of a C-ordered one);
    -1: anything else."""
    flags = x.flags
    if flags.c_contiguous:
        return 0
    if flags.f_contiguous and x.ndim == 2:
        return 1
    return -1


def _key(a: Any, b: Any) -> tuple[Any, ...] | None:
    """The table key of ``a @ b``, or None when the case can never be remembered."""
    if type(a) is not _NDARRAY or type(b) is not _NDARRAY or a.ndim < 2 or b.ndim < 2:
        return None
    dtype = a.dtype
    if b.dtype is not dtype:
        return None
    return dtype, a.shape, b.shape, _layout(a), _layout(b)


def _stored(x: np.ndarray, layout: int) -> np.ndarray:
    """The (batch or 1, rows, cols) C-ordered array the rung reads: ``x`` itself, or for
    a Fortran-ordered matrix its storage, the C-ordered transpose (no copy)."""
    if layout:
        x = x.T
    return x.reshape((-1,) + x.shape[-2:])


def try_remembered(a: Any, b: Any, out: Any = None) -> Any:
    """The product ``a @ b`` (written into ``out`` when given) if an earlier call decided
    this case, else None (and nothing written)."""
    key = _key(a, b)
    if key is None:
        return None
    program = _table.get(key)
    if program is None:
        return None
    if (_mtime(_watch[0]) != _watch[1]  # tuning results changed, or moved: decide again
            or os.environ.get("TILEGEMM_CACHE_DIR") != _watch[2]):
        _table.clear()
        return None
    dtype = key[0]
    shape = (a.shape[:-2] if a.ndim >= b.ndim else b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if out is None:
        c = np.empty(shape, dtype)
        if poison_enabled():
            c.fill(poison_value(dtype))
    elif (type(out) is _NDARRAY and out.dtype is dtype and out.shape == shape
          and out.flags.c_contiguous and out.flags.writeable
          and not np.may_share_memory(out, a) and not np.may_share_memory(out, b)):
        c = out
    else:
        return None
    m, n = shape[-2], shape[-1]
    one = dtype.type(1)
    a3, b3 = _stored(a, key[3]), _stored(b, key[4])
    c3 = c.reshape(-1, m, n)
    tr = key[3] | key[4] << 1
    if tr:
        program(a3, b3, c3, one, one - one, tr)
    else:
        program(a3, b3, c3, one, one - one)
    return c


def remember(a: Any, b: Any, program: Any, tuning_cache: str | None,
             tuning_mtime: int | None = None) -> None:
    """Record ``program`` (the compiled rung the full path just ran on the host with
    alpha=1, beta=0, in the operands' own dtype, after reading the tuning cache file
    ``tuning_cache`` as it was at ``tuning_mtime``) for calls like ``matmul(a, b)``, if
    this case qualifies. Decisions remembered under another state of the file are dropped:
    a shape decided before a tuning run must not keep its old program because another
    shape was decided after it."""
    key = _key(a, b)
    if key is None:
        return
    dtype, sa, sb, la, lb = key
    if (dtype.kind not in _KINDS or not dtype.isnative or la < 0 or lb < 0
            or sa[-1] != sb[-2] or 0 in sa or 0 in sb
            or (sa[:-2] != sb[:-2] and len(sa) > 2 and len(sb) > 2)):
        return
    if (la or lb) and not getattr(program, "takes_transposed", False):
        return  # the full path hands this rung C-ordered copies: leave that to it
    if tuning_mtime is None:
        tuning_mtime = _mtime(tuning_cache)
    where = os.environ.get("TILEGEMM_CACHE_DIR")
    if len(_table) >= _LIMIT or _watch != [tuning_cache, tuning_mtime, where]:
        _table.clear()
    _watch[:] = [tuning_cache, tuning_mtime, where]
    _table[key] = program


def forget() -> None:
    """Drop every remembered decision (the next calls take the full path again)."""
    _table.clear()
