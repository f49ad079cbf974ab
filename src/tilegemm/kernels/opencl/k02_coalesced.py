"""Rung 2 — coalesced: the same kernel with dimension 0 mapped to the column of C.

Consecutive work-items now read consecutive elements of B's row and write consecutive
elements of C's row (one memory transaction per group of work-items on a GPU, one vector
on a CPU), and share one element of A (a broadcast). Nothing else changes, so the
difference from rung 1 is the cost of strided access alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.kernels.opencl.k01_naive import SPEC as NAIVE


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    bs = p["BLOCK"]
    return make_program("coalesced", "k02_coalesced.cl", p, dtype, local=(bs, bs),
                        tile=(bs, bs))


# Rung 1's parameters, dtypes and work-group: only the mapping of work-items to C changes.
SPEC = replace(
    NAIVE,
    name="coalesced",
    rung=2,
    title="one work-item per output, dim 0 → column (coalesced)",
    build=build,
    doc=__doc__,
)
