"""Keeping the libraries tilegemm builds on working together across their releases, and
with threads.

numba-cuda 0.30 registers a GPU implementation for every NumPy array function it supports
when ``numba.cuda`` is first compiled for, ``np.row_stack`` among them. NumPy 2.5 removed
``row_stack`` (deprecated since 2.0 as an alias of ``np.vstack``), so with NumPy ≥ 2.5 every
CUDA launch failed with ``AttributeError: module 'numpy' has no attribute 'row_stack'``
(seen on an H100 machine with NumPy 2.5.2 and numba-cuda 0.30.4). Restoring the alias, only
where it is missing, is what NumPy itself shipped until 2.4; nothing else changes.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


def restore_numpy_aliases() -> None:
    """Put back the NumPy aliases that released numba-cuda versions still reference."""
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]


_NUMBA_LOCK = threading.Lock()
_numba: list[Any] = []  # the module, once imported in full


def import_numba() -> Any:
    """Numba, imported in full by one thread while any others wait.

    Numba's modules import each other in cycles. When several threads make a fresh
    process's first CPU products at once, each starting the import, Python hands some of
    them a module that another thread is still initialising: ``ImportError: cannot
    import name 'CodeLibrary' from partially initialized module 'numba.core.codegen'``
    for that call (in 2 of 5 processes with 24 threads). Every place where a CPU call
    first needs Numba (the CPU features its decision reads, the rungs' builds, the
    thread pool) imports it through here first, so later imports find complete modules.
    Returns the ``numba`` module."""
    if _numba:
        return _numba[0]
    with _NUMBA_LOCK:
        if not _numba:
            import numba
            import numba.core.cgutils
            import numba.core.codegen
            import numba.core.config
            import numba.extending  # noqa: F401 (the rungs' intrinsics)

            _numba.append(numba)
    return _numba[0]
