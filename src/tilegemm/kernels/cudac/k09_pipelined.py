"""Rung 9 — pipelined (CUDA C): rung 8 with two shared-memory stages and grouped blocks.

``k09_pipelined.cu``: the Numba rung 9 algorithm in CUDA C, same parameters and
constraints. Each thread issues the global loads of k-tile kt into registers, computes on
k-tile kt-1 from one shared stage, then stores tile kt into the other stage: one barrier
per k-tile, and the load latency hidden behind a k-tile of FMAs (CUTLASS's two-stage SIMT
SGEMM, 128 × 128 × 8). Tiles are numbered column-major within groups of GROUP_M tile rows
for L2 reuse; one grid dimension over tiles, batches in z.
"""

from __future__ import annotations

from tilegemm.kernels.cuda.k09_pipelined import SPEC as NUMBA_RUNG
from tilegemm.kernels.cudac._program import cudac_spec
from tilegemm.launch import flat_tile_grid

SPEC = cudac_spec(
    NUMBA_RUNG, __doc__,
    title="double-buffered shared tiles, one barrier per k-tile, grouped order (CUDA C)",
    block=lambda p: (NUMBA_RUNG.threads(p), 1, 1),
    grid=lambda p: flat_tile_grid(p["BM"], p["BN"]),  # grouped tile order, batches in z
    # the same tiles; split-K and shifted edge tiles are the Numba rung's only
    params=tuple(x for x in NUMBA_RUNG.params if x.name not in ("SPLIT_K", "SHIFT_EDGES")),
    auto=True,  # kernel="auto" on this backend, as the Numba rung is on "cuda"
)
