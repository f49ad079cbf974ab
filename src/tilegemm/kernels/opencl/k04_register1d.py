"""Rung 4 — register1d: each work-item computes R outputs of a column of the tile.

the optimisation note's outputs-per-thread (ILP) kernel: the B value read from local memory is kept
in a register and used for R multiply-adds, with R independent accumulators. A work-group of
TILE × TILE/R work-items covers a TILE × TILE tile. More outputs per work-item mean fewer
local reads per multiply-add, until registers and the smaller work-group cost occupancy
(the note measured a peak at R = 8 on its GPU).

Fixed from the original: the hard-coded ``+16`` row offset is TILE/R, and any M, N, K work.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.registry import Constraint, KernelSpec, Param


def _local_bytes(p: Mapping[str, int], itemsize: int) -> int:
    return 2 * p["TILE"] ** 2 * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    t, r = p["TILE"], p["R"]
    return make_program("register1d", "k04_register1d.cl", p, dtype, local=(t, t // r),
                        tile=(t, t), local_mem=_local_bytes(p, dtype.itemsize))


SPEC = KernelSpec(
    name="register1d",
    backend="opencl",
    rung=4,
    title="R outputs per work-item (the optimisation note's ILP sweep)",
    build=build,
    params=(
        Param("TILE", 32, (8, 16, 32), "tile side (TILE × TILE outputs per work-group)"),
        Param("R", 8, (1, 2, 4, 8, 16, 32), "outputs per work-item (rows TILE/R apart)"),
    ),
    constraints=(Constraint("R <= TILE", lambda p: p["R"] <= p["TILE"]),),
    threads=lambda p: p["TILE"] * (p["TILE"] // p["R"]),
    smem=_local_bytes,
    doc=__doc__,
)
