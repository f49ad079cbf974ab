"""Rung 3 — shared (CUDA C): cuda-samples' ``MatrixMulCUDA<BLOCK_SIZE>``, for any shape.

``k03_shared.cu``: block (bx, by) walks A's row panel and B's column panel one TILE × TILE
tile at a time, staging both tiles in shared memory, so every value loaded from global
memory is used TILE times (the optimisation note's ``matmul_ShareMemory`` is the same
algorithm). Fixed from the sample and the note: out-of-range elements load as zeros and
only the store is guarded (no thread leaves before a barrier), any M, N, K, batches in
grid z, grid-stride tile loops.
"""

from __future__ import annotations

from tilegemm.kernels.cuda.k03_shared import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import cudac_spec
from tilegemm.launch import tile_grid

SPEC = cudac_spec(
    NUMBA_RUNG, __doc__,
    title="TILE×TILE shared-memory tiles (cuda-samples MatrixMulCUDA<BLOCK_SIZE>)",
    block=lambda p: (p["TILE"], p["TILE"], 1),
    grid=lambda p: tile_grid(p["TILE"], p["TILE"]),
)
