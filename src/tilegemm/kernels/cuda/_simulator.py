"""A fix for a race in numba's CUDA simulator, installed before any rung runs on it.

The simulator runs a block's threads as Python threads, and ``cuda.shared.array`` finds a
block's array by a check-then-create on a dict keyed by the calling source line. Two
threads can both miss and each create its own array, so some threads of a block then
write to a private "shared" array: rarely, a correct tiled kernel computes a wrong result,
and the traced analysis sees phantom bank conflicts. This module replaces the method with
the same logic under a lock. The original keys allocations by its caller's frame, so the
replacement reimplements it (a wrapper would change the caller) rather than wrapping it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_installed = False


def _locked_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
    import numpy as np
    from numba.core import types
    from numba.np import numpy_support

    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:  # dynamic shared memory: one buffer, as in the simulator
        # np.dtype(): a scalar type such as np.float32 has no itemsize of its own (numba's
        # version fails on it; compiled kernels accept it)
        count = self._dynshared_size // np.dtype(dtype).itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _LOCK:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = np.empty(shape, dtype)
    return res


def install() -> None:
    """Replace ``FakeCUDAShared.array`` with the locked version (idempotent)."""
    global _installed
    if _installed:
        return
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    FakeCUDAShared.array = _locked_array
    _installed = True
