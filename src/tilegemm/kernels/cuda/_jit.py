"""``kernel_jit(threads)``: ``cuda.jit`` with launch bounds, so every block size launches.

Without launch bounds ptxas may give a kernel up to 255 registers per thread, but a block
must fit the 65,536-register file of an SM: at 1,024 threads that is 64 registers each.
numba's index arithmetic is 64-bit and needs 70–80 registers even for the naive kernel,
so a 32×32 block compiled without bounds fails at launch ("too many resources requested").
Telling ptxas the block size (``.maxntid`` in the PTX) makes it fit the registers to the
block, spilling if it must, and the resource report (tilegemm.analysis.resources) compiles
with the same bounds. Numba's simulator has no ``launch_bounds`` option and needs none.

Private (underscore) module, so discovery does not look for a SPEC here; it imports numba
only when called (from a rung's build()).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def kernel_jit(threads: int, min_blocks: int = 0) -> Callable[[Callable[..., Any]], Any]:
    """The decorator for a rung's kernel launched with exactly ``threads`` threads a block.

    ``min_blocks`` > 0 also asks ptxas to fit that many blocks per SM (``.minnctapersm``):
    at 256 threads and 2 blocks, at most 128 registers a thread.
    """
    from numba import cuda

    from tilegemm import simulator

    if simulator.enabled():
        from tilegemm.kernels.cuda._simulator import install

        install()  # numba's simulator races on cuda.shared.array; see _simulator.py
        return cuda.jit
    from tilegemm.kernels.cuda._numba_compile import install as speed_up_lowering

    speed_up_lowering()  # same PTX, a faster numba-cuda lowering step; see _numba_compile.py
    return cuda.jit(launch_bounds=(threads, min_blocks) if min_blocks else threads)
