"""Rung 8 — warptile (CUDA C): block → warp → thread tiles, siboehm's SGEMM kernel 10.

``k08_warptile.cu``: the Numba rung 8 algorithm written in CUDA C, with the same
parameters and constraints (so one parameter set compiles on both): BM × BN block tiles,
WM × WN warp tiles stepped in WMITER × WNITER sub-tiles, TM × TN outputs per thread and
sub-tile, A transposed (and swizzled) in shared memory, 16-byte global and shared
accesses. Its interior is what nvcc makes of the textbook kernel (fully unrolled inner
loops, read-only vector loads), which makes it the yardstick for the Numba rung's SASS;
its edges handle any shape.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.kernels.cuda.k08_warptile import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import CudacProgram
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import KernelSpec


def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
    bm, bn = p["BM"], p["BN"]

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(n, bn), ceil_div(m, bm), batch)

    threads = NUMBA_RUNG.threads(p)
    return CudacProgram("warptile", tuple(sorted(p.items())), dtype.name, (threads, 1, 1), grid)


SPEC = KernelSpec(
    name="warptile",
    backend="cudac",
    rung=8,
    title="warp tiles between block and thread tiles (siboehm kernel 10, CUDA C)",
    build=build,
    params=NUMBA_RUNG.params,
    constraints=NUMBA_RUNG.constraints,
    dtypes=NUMBA_RUNG.dtypes,
    threads=NUMBA_RUNG.threads,
    smem=NUMBA_RUNG.smem,
    doc=__doc__,
)
