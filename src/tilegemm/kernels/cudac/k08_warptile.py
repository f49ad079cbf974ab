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

from tilegemm.kernels.cuda.k08_warptile import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import cudac_spec
from tilegemm.launch import tile_grid

SPEC = cudac_spec(
    NUMBA_RUNG, __doc__,
    title="warp tiles between block and thread tiles (siboehm kernel 10, CUDA C)",
    block=lambda p: (NUMBA_RUNG.threads(p), 1, 1),
    grid=lambda p: tile_grid(p["BM"], p["BN"]),
)
