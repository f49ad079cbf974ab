"""Keeping the libraries tilegemm builds on working together across their releases.

numba-cuda 0.30 registers a GPU implementation for every NumPy array function it supports
when ``numba.cuda`` is first compiled for, ``np.row_stack`` among them. NumPy 2.5 removed
``row_stack`` (deprecated since 2.0 as an alias of ``np.vstack``), so with NumPy ≥ 2.5 every
CUDA launch failed with ``AttributeError: module 'numpy' has no attribute 'row_stack'``
(seen on an H100 machine with NumPy 2.5.2 and numba-cuda 0.30.4). Restoring the alias, only
where it is missing, is what NumPy itself shipped until 2.4; nothing else changes.
"""

from __future__ import annotations

import numpy as np


def restore_numpy_aliases() -> None:
    """Put back the NumPy aliases that released numba-cuda versions still reference."""
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]
