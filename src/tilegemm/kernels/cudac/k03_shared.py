"""Rung 3 — shared (CUDA C): cuda-samples' ``MatrixMulCUDA<BLOCK_SIZE>``, for any shape.

``k03_shared.cu``: block (bx, by) walks A's row panel and B's column panel one TILE × TILE
tile at a time, staging both tiles in shared memory, so every value loaded from global
memory is used TILE times (the optimisation note's ``matmul_ShareMemory`` is the same
algorithm). Fixed from the sample and the note: out-of-range elements load as zeros and
only the store is guarded (no thread leaves before a barrier), any M, N, K, batches in
grid z, grid-stride tile loops.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.kernels.cudac._program import CudacProgram
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import FLOATS, INTS, KernelSpec, Param


def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
    tile = p["TILE"]

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(n, tile), ceil_div(m, tile), batch)

    return CudacProgram("shared", tuple(sorted(p.items())), dtype.name, (tile, tile, 1), grid)


SPEC = KernelSpec(
    name="shared",
    backend="cudac",
    rung=3,
    title="TILE×TILE shared-memory tiles (cuda-samples MatrixMulCUDA<BLOCK_SIZE>)",
    build=build,
    params=(Param("TILE", 16, (8, 16, 32), "tile side (the sample's BLOCK_SIZE)"),),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["TILE"] ** 2,
    smem=lambda p, itemsize: 2 * p["TILE"] ** 2 * itemsize,
    doc=__doc__,
)
