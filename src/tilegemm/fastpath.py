"""Small host products without re-deciding what an earlier call decided.

A call such as ``matmul(a, b)`` on two small NumPy matrices spends almost all of its time
in Python: describing the operands, NumPy's dtype rules, choosing the backend and the rung,
looking up tuned parameters, allocating and poisoning the output. For an 8×8×8 product
that is ~70 µs around a kernel that takes 1 µs, against NumPy's 1–2 µs per call.

So the full path (:func:`tilegemm.api.gemm`) remembers what it decided for a plain call —
two C-contiguous 2-D ``numpy.ndarray`` operands of one dtype, default arguments, a host
backend, a product of at most :data:`MAX_PRODUCT` multiply-adds — keyed by (dtype, M, K,
N). The next call with the same key skips straight to the compiled program the full path
ran, with the same output allocation (and NaN poisoning when ``TILEGEMM_POISON`` is set).
Anything else (another shape, dtype or layout, any keyword, an ndarray subclass, a device
array, ``out=``) takes the full path, which validates everything as before.

What is remembered is a decision, so it is made again when something it depends on
changes: the table is emptied when the tuning cache file (``tilegemm tune``'s results, in
this process or another) changes, checked with one ``stat`` per call as the full path
does, and :func:`forget` empties it on request.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tilegemm.backends.base import poison_enabled

# Only products this small are remembered: above it the kernel's own time dominates and the
# full path's ~70 µs do not matter.
MAX_PRODUCT = 64 * 64 * 64
_LIMIT = 256  # remembered shapes at most (the table is cleared when full)

_table: dict[tuple[Any, int, int, int], Any] = {}
_watch: list[Any] = [None, None]  # the tuning cache file the decisions saw, and its mtime
_NDARRAY = np.ndarray


def _mtime(path: str | None) -> int | None:
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None


def try_small(a: Any, b: Any) -> Any:
    """The product ``a @ b`` if an earlier call decided this case, else None."""
    if type(a) is not _NDARRAY or type(b) is not _NDARRAY or a.ndim != 2 or b.ndim != 2:
        return None
    m, k = a.shape
    n = b.shape[1]
    dtype = a.dtype
    program = _table.get((dtype, m, k, n))
    if (program is None or b.dtype is not dtype or b.shape[0] != k
            or not (a.flags.c_contiguous and b.flags.c_contiguous)):
        return None
    if _mtime(_watch[0]) != _watch[1]:  # tuning results changed: decide again
        _table.clear()
        return None
    c = np.empty((m, n), dtype)
    if poison_enabled():
        c.fill(np.nan)
    one = dtype.type(1)
    program(a.reshape(1, m, k), b.reshape(1, k, n), c.reshape(1, m, n), one, one - one)
    return c


def remember(a: Any, b: Any, program: Any, tuning_cache: str | None) -> None:
    """Record ``program`` (the compiled rung the full path just ran on the host with
    alpha=1, beta=0, after reading the tuning cache file ``tuning_cache``) for calls like
    ``matmul(a, b)``, if this case qualifies."""
    if type(a) is not _NDARRAY or type(b) is not _NDARRAY or a.ndim != 2 or b.ndim != 2:
        return
    (m, k), n = a.shape, b.shape[1]
    if (a.dtype is not b.dtype or a.dtype.kind != "f" or not a.dtype.isnative
            or not 0 < m * n * k <= MAX_PRODUCT
            or not (a.flags.c_contiguous and b.flags.c_contiguous)):
        return
    if len(_table) >= _LIMIT or _watch[0] != tuning_cache:
        _table.clear()
    _watch[:] = [tuning_cache, _mtime(tuning_cache)]
    _table[(a.dtype, m, k, n)] = program


def forget() -> None:
    """Drop every remembered decision (the next calls take the full path again)."""
    _table.clear()
