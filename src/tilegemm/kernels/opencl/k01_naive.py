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

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.registry import FLOATS, INTS, KernelSpec, Param


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    bs = p["BLOCK"]
    return make_program("naive", "k01_naive.cl", p, dtype, local=(bs, bs), tile=(bs, bs),
                        dim0_is_row=True)


SPEC = KernelSpec(
    name="naive",
    backend="opencl",
    rung=1,
    title="one work-item per output, the Numba example's mapping (dim 0 → row)",
    build=build,
    params=(Param("BLOCK", 16, (8, 16, 32), "work-group side (BLOCK × BLOCK work-items)"),),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["BLOCK"] ** 2,
    smem=lambda p, itemsize: 0,
    doc=__doc__,
)
