"""Rung 2 — coalesced (CUDA C): the optimisation note's global-memory kernel, x → column.

``matMul_GlobalKernel`` of the CUDA optimisation note (``k02_coalesced.cu``): the only change
from rung 1 is that threadIdx.x walks columns, so a warp reads 32 consecutive elements of B,
one (broadcast) element of A, and writes 32 consecutive elements of C: the optimisation
note's 5 load transactions per warp and k-step. Fixed from the note: any M, N, K and
rectangular shapes, bounds on every access, batches, grid-stride loops.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.kernels.cudac._program import CudacProgram
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import FLOATS, INTS, KernelSpec, Param


def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
    bs = p["BLOCK"]

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(n, bs), ceil_div(m, bs), batch)  # x → columns

    return CudacProgram("coalesced", tuple(sorted(p.items())), dtype.name, (bs, bs, 1), grid)


SPEC = KernelSpec(
    name="coalesced",
    backend="cudac",
    rung=2,
    title="one thread per output, x → column (the optimisation note's global-memory kernel)",
    build=build,
    params=(Param("BLOCK", 16, (8, 16, 32), "threads per block side (BLOCK × BLOCK)"),),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["BLOCK"] ** 2,
    smem=lambda p, itemsize: 0,
    doc=__doc__,
)
