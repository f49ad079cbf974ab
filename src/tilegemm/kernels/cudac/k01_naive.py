"""Rung 1 — naive (CUDA C): one thread per element of C, threadIdx.x → row (uncoalesced).

The kernel of Numba's documentation example written in CUDA C (``k01_naive.cu``), with the
same mapping as the Numba rung 1, so the two compilers can be compared on the same code:
the 32 threads of a warp hold consecutive *rows*, so their loads of A and stores to C are a
row apart. Any M, N, K, batches in grid z, grid-stride loops.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.kernels.cudac._program import CudacProgram
from tilegemm.launch import capped_grid, ceil_div
from tilegemm.registry import FLOATS, INTS, KernelSpec, Param


def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
    bs = p["BLOCK"]

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(m, bs), ceil_div(n, bs), batch)  # x → rows

    return CudacProgram("naive", tuple(sorted(p.items())), dtype.name, (bs, bs, 1), grid)


SPEC = KernelSpec(
    name="naive",
    backend="cudac",
    rung=1,
    title="one thread per output, x → row (Numba's example in CUDA C)",
    build=build,
    params=(Param("BLOCK", 16, (8, 16, 32), "threads per block side (BLOCK × BLOCK)"),),
    dtypes=FLOATS + INTS,
    threads=lambda p: p["BLOCK"] ** 2,
    smem=lambda p, itemsize: 0,
    doc=__doc__,
)
