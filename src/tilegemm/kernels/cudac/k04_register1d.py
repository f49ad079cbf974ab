"""Rung 4 — register1d (CUDA C): the optimisation note's ILP kernel with R outputs a thread.

``k04_register1d.cu`` (the note's ``matrixMulSharedILPkernel``): TILE × TILE shared tiles
as in rung 3, but TILE × TILE/R threads, each computing R outputs down a column; one shared
load of B feeds R multiply-adds held in R registers. The note hard-codes R = 2 and a
``+16`` row offset (right only for 32 × 32 tiles) and assumes multiples of the tile; here
any R dividing TILE and any M, N, K.
"""

from __future__ import annotations

from tilegemm.kernels.cuda.k04_register1d import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import cudac_spec
from tilegemm.launch import tile_grid

SPEC = cudac_spec(
    NUMBA_RUNG, __doc__,
    title="R outputs per thread down a column (the optimisation note's ILP kernel, any R)",
    block=lambda p: (p["TILE"], p["TILE"] // p["R"], 1),  # TILE × TILE/R threads
    grid=lambda p: tile_grid(p["TILE"], p["TILE"]),
)
