"""Rung 1 — naive: one work-item per element of C, the original example's mapping (dimension 0 →
row).

This is the Numba ROC example's ``matmul`` (Numba ROC): ``i = get_global_id(0)``, ``j =
get_global_id(1)`` and a loop over k. Work-items that are consecutive in dimension 0 walk
down a column of row-major C, so they read A and write C a whole row apart; the next rung
changes only that.

Fixed from the original: any M, N, K (bounds checks), batches in dimension 2, accumulation in
the output dtype, alpha/beta with C read only when beta != 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.kernels.cuda.k01_naive import SPEC as CUDA_RUNG


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    bs = p["BLOCK"]
    return make_program("naive", "k01_naive.cl", p, dtype, local=(bs, bs), tile=(bs, bs),
                        dim0_is_row=True)


# Rung 1 of the CUDA ladder (its parameters, dtypes and block), with this kernel.
SPEC = replace(
    CUDA_RUNG,
    backend="opencl",
    title="one work-item per output, the Numba example's mapping (dim 0 → row)",
    build=build,
    doc=__doc__,
    sim_params=None,
)
