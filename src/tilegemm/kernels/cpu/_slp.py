"""Turning LLVM's SLP vectoriser on for one Numba compilation.

Numba disables the superword-level-parallelism vectoriser by default
(``NUMBA_SLP_VECTORIZE=0``), but the blocked rung's micro-kernel is written as MR×NR named
scalars and depends on exactly that pass to pack them into vector registers. Numba reads
``config.SLP_VECTORIZE`` when it builds the pass pipeline for a library, so setting it while
one function compiles (eagerly, with an explicit signature) affects that function only; the
compiled code keeps its vector instructions when later linked into callers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()


@contextmanager
def slp_enabled() -> Iterator[None]:
    """Compile with SLP vectorisation inside this block (process-wide flag, restored after)."""
    from numba.core import config

    with _LOCK:
        old = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = 1
        try:
            yield
        finally:
            config.SLP_VECTORIZE = old
