"""Rung 2 — coalesced (CUDA C): the optimisation note's global-memory kernel, x → column.

``matMul_GlobalKernel`` of the CUDA optimisation note (``k02_coalesced.cu``): the only change
from rung 1 is that threadIdx.x walks columns, so a warp reads 32 consecutive elements of B,
one (broadcast) element of A, and writes 32 consecutive elements of C: the optimisation
note's 5 load transactions per warp and k-step. Fixed from the note: any M, N, K and
rectangular shapes, bounds on every access, batches, grid-stride loops.
"""

from __future__ import annotations

from tilegemm.kernels.cuda.k02_coalesced import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import cudac_spec
from tilegemm.launch import tile_grid

SPEC = cudac_spec(
    NUMBA_RUNG, __doc__,
    title="one thread per output, x → column (the optimisation note's global-memory kernel)",
    block=lambda p: (p["BLOCK"], p["BLOCK"], 1),
    grid=lambda p: tile_grid(p["BLOCK"], p["BLOCK"]),  # x → columns
)
