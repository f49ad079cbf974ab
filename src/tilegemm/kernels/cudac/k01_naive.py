"""Rung 1 — naive (CUDA C): one thread per element of C, threadIdx.x → row (uncoalesced).

The kernel of Numba's documentation example written in CUDA C (``k01_naive.cu``), with the
same mapping as the Numba rung 1, so the two compilers can be compared on the same code:
the 32 threads of a warp hold consecutive *rows*, so their loads of A and stores to C are a
row apart. Any M, N, K, batches in grid z, grid-stride loops.
"""

from __future__ import annotations

from tilegemm.kernels.cuda.k01_naive import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import cudac_spec
from tilegemm.launch import tile_grid

SPEC = cudac_spec(
    NUMBA_RUNG, __doc__,
    title="one thread per output, x → row (Numba's example in CUDA C)",
    block=lambda p: (p["BLOCK"], p["BLOCK"], 1),
    grid=lambda p: tile_grid(p["BLOCK"], p["BLOCK"], rows_in_x=True),  # x → rows
)
