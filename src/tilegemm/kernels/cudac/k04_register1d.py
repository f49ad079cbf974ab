"""Rung 4 — register1d (CUDA C): the optimisation note's ILP kernel with R outputs a thread.

``k04_register1d.cu`` (the note's ``matrixMulSharedILPkernel``): TILE × TILE shared tiles
as in rung 3, but TILE × TILE/R threads, each computing R outputs down a column; one shared
load of B feeds R multiply-adds held in R registers. The note hard-codes R = 2 and a
``+16`` row offset (right only for 32 × 32 tiles) and assumes multiples of the tile; here
any R dividing TILE and any M, N, K.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.kernels.cudac._program import CudacProgram
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import FLOATS, INTS, Constraint, KernelSpec, Param


def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
    tile, rows = p["TILE"], p["TILE"] // p["R"]

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(n, tile), ceil_div(m, tile), batch)

    return CudacProgram("register1d", tuple(sorted(p.items())), dtype.name, (tile, rows, 1),
                        grid)


SPEC = KernelSpec(
    name="register1d",
    backend="cudac",
    rung=4,
    title="R outputs per thread down a column (the optimisation note's ILP kernel, any R)",
    build=build,
    params=(
        Param("TILE", 32, (8, 16, 32), "tile side (TILE × TILE tiles of A, B and C)"),
        Param("R", 4, (1, 2, 4, 8, 16, 32), "outputs per thread (rows ty + r·TILE/R)"),
    ),
    constraints=(
        Constraint("TILE % R == 0 (each thread's R rows must divide the tile evenly)",
                   lambda p: p["TILE"] % p["R"] == 0),
    ),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["TILE"] * (p["TILE"] // p["R"]),
    smem=lambda p, itemsize: 2 * p["TILE"] ** 2 * itemsize,
    doc=__doc__,
)
