"""Rung 9 — pipelined (CUDA C): rung 8 with two shared-memory stages and grouped blocks.

``k09_pipelined.cu``: the Numba rung 9 algorithm in CUDA C, same parameters and
constraints. Each thread issues the global loads of k-tile kt into registers, computes on
k-tile kt-1 from one shared stage, then stores tile kt into the other stage: one barrier
per k-tile, and the load latency hidden behind a k-tile of FMAs (CUTLASS's two-stage SIMT
SGEMM, 128 × 128 × 8). Tiles are numbered column-major within groups of GROUP_M tile rows
for L2 reuse; one grid dimension over tiles, batches in z.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.kernels.cuda.k09_pipelined import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import CudacProgram
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import KernelSpec


def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
    bm, bn = p["BM"], p["BN"]

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(m, bm) * ceil_div(n, bn), 1, batch)

    threads = NUMBA_RUNG.threads(p)
    return CudacProgram("pipelined", tuple(sorted(p.items())), dtype.name, (threads, 1, 1),
                        grid)


SPEC = KernelSpec(
    name="pipelined",
    backend="cudac",
    rung=9,
    title="double-buffered shared tiles, one barrier per k-tile, grouped order (CUDA C)",
    build=build,
    # the same tiles; split-K is a launch strategy of the Numba rung only
    params=tuple(x for x in NUMBA_RUNG.params if x.name != "SPLIT_K"),
    constraints=NUMBA_RUNG.constraints,
    dtypes=NUMBA_RUNG.dtypes,
    threads=NUMBA_RUNG.threads,
    smem=NUMBA_RUNG.smem,
    doc=__doc__,
)
