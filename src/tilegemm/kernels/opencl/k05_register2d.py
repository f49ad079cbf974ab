"""Rung 5 — register2d: a BM × BN block per work-group, a TM × TN outer product per work-item.

Each K step stages a BM × BK tile of A (transposed) and a BK × BN tile of B in local
memory; every work-item then reads TM values of A and TN of B per k and does TM·TN
multiply-adds from registers. Local-memory reads per multiply-add fall from 2 (rung 3) and
1 + 1/R (rung 4) to (TM + TN)/(TM·TN), and global reads per multiply-add to
1/BM + 1/BN. Work-items' rows and columns are interleaved so neighbouring work-items
always touch neighbouring addresses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.kernels.cuda.k05_register2d import SPEC as CUDA_RUNG
from tilegemm.registry import FLOATS, Constraint, Param


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    return make_program(
        "register2d", "k05_register2d.cl", p, dtype,
        local=(p["BN"] // p["TN"], p["BM"] // p["TM"]), tile=(p["BN"], p["BM"]),
        local_mem=CUDA_RUNG.smem(p, dtype.itemsize),
    )


# Rung 5 of the CUDA ladder (its work-items and local memory per tile), with this kernel
# and the tiles and constraints of its own.
SPEC = replace(
    CUDA_RUNG,
    backend="opencl",
    title="BM×BN×BK block tile, TM×TN outer product per work-item",
    build=build,
    params=(
        Param("BM", 64, (8, 16, 32, 64, 128), "rows of C per work-group"),
        Param("BN", 64, (8, 16, 32, 64, 128), "columns of C per work-group"),
        Param("BK", 16, (4, 8, 16, 32, 64), "k per local-memory stage"),
        Param("TM", 4, (1, 2, 4, 8, 16), "rows of C per work-item"),
        Param("TN", 4, (1, 2, 4, 8, 16), "columns of C per work-item"),
    ),
    constraints=(
        Constraint("TM <= BM", lambda p: p["TM"] <= p["BM"]),
        Constraint("TN <= BN", lambda p: p["TN"] <= p["BN"]),
    ),
    dtypes=FLOATS,
    doc=__doc__,
    sim_params=None,
)
