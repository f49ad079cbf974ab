"""Rung 3 — shared: TILE × TILE tiles of A and B staged in work-group local memory.

the Numba ROC example's ``matmulfast`` (``roc.shared.array``, ``roc.barrier``) and the
MatrixMulCUDA walk-through's
``MatrixMulCUDA``: each element loaded from global memory is used TILE times from local
memory, cutting global traffic by a factor TILE.

Fixed from the original: it assumed N = gridsize × blocksize (square, a multiple of the
tile) and used the grid size as the number of K tiles; here out-of-range loads fill zeros,
K is walked in ceil(K / TILE) steps, and no work-item returns before a barrier.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.registry import FLOATS, INTS, KernelSpec, Param


def _local_bytes(p: Mapping[str, int], itemsize: int) -> int:
    return 2 * p["TILE"] ** 2 * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    t = p["TILE"]
    return make_program("shared", "k03_shared.cl", p, dtype, local=(t, t), tile=(t, t),
                        local_mem=_local_bytes(p, dtype.itemsize))


SPEC = KernelSpec(
    name="shared",
    backend="opencl",
    rung=3,
    title="local-memory tiles (the Numba ROC example's matmulfast), any shape",
    build=build,
    params=(Param("TILE", 16, (8, 16, 32), "tile side: TILE × TILE work-items and outputs"),),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["TILE"] ** 2,
    smem=_local_bytes,
    doc=__doc__,
)
