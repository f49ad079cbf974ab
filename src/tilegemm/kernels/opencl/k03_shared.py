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
from dataclasses import replace

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.kernels.cuda.k03_shared import SPEC as CUDA_RUNG


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    t = p["TILE"]
    return make_program("shared", "k03_shared.cl", p, dtype, local=(t, t), tile=(t, t),
                        local_mem=CUDA_RUNG.smem(p, dtype.itemsize))


# Rung 3 of the CUDA ladder (its parameters, dtypes, block and local memory), with this kernel.
SPEC = replace(
    CUDA_RUNG,
    backend="opencl",
    title="local-memory tiles (the Numba ROC example's matmulfast), any shape",
    build=build,
    doc=__doc__,
    sim_params=None,
)
