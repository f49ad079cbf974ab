"""Split-K: a launch strategy for products whose output tiles cannot keep the GPU busy.

A GEMM kernel gives each block one tile of C and walks all of K. When M and N are small
and K is long (512×512×8192 has sixteen 128×128 tiles), most SMs of a large GPU have
nothing to do: sixteen blocks on 132 SMs leave 88 % of the machine idle however fast each
block is. Split-K cuts K into ``SPLIT_K`` slices of whole k-tiles; block (tile, slice)
computes the tile's partial product over its slice into a workspace, and a second, small
kernel adds the slices of each element **in a fixed order** (slice 0, 1, 2...) and applies
``alpha``, ``beta`` and C. There are no atomics, so the same inputs give bit-identical
results on every call, whatever order the blocks ran in.

The workspace has the product's dtype (float32 or float64) and ``SPLIT_K`` times the size
of C: slice s of product p is ``W[p * SPLIT_K + s]``. A split-K block runs alone on its SM
(it needs more than 128 registers in float32), so ``shape_params`` in the pipelined rung
chooses the number of slices for one block per SM.

Each program keeps one workspace per CUDA stream and device and reuses it across calls:
allocating (and later freeing, which synchronises the device) on every call would cost
more than the reduction itself. The two launches of one call are enqueued together under
a lock, so two host threads sharing a stream cannot interleave their partial sums.

Private module (no ``SPEC``): imports numba only when a program is launched.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from tilegemm import simulator
from tilegemm.backends.cuda_launch import launch_kernel
from tilegemm.kernels.cuda._kmajor import RowMajorProgram
from tilegemm.launch import MAX_GRID_X, ceil_div

REDUCE_THREADS = 256
cuda: Any = None  # numba.cuda, bound by reduce_kernel() (see tilegemm.kernels.cuda docstring)


def reduce_launch(total: int) -> tuple[int, int]:
    """(blocks, threads a block) of the sum over ``total`` elements: one thread an element
    on a GPU, up to the grid's limit (past it, its grid-stride loop takes the rest). On
    numba's simulator every thread is a Python thread, started and joined: one warp strides
    over all of C instead (the same sums, and the stride loop run on every call)."""
    if simulator.enabled():
        return 1, 32
    return max(1, min(ceil_div(total, REDUCE_THREADS), MAX_GRID_X)), REDUCE_THREADS


@dataclass(frozen=True)
class SplitKProgram(RowMajorProgram):
    """A pipelined kernel built with ``SPLIT_K`` > 1, launched as partial products + sum
    (after the operand copies any :class:`RowMajorProgram` makes first, as rung 9's).

    ``kernel`` writes the partial products (``C`` of shape (batch × slices, M, N)); it has
    the same signature as every rung, so resource reports and PTX analysis see it as usual.
    """

    slices: int = 2

    def launch_product(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any,
                       stream: Any) -> None:
        batch, m, n = C.shape
        dtype = np.dtype(C.dtype)
        one, zero = dtype.type(1), dtype.type(0)
        blocks, threads = reduce_launch(batch * m * n)
        with self.workspaces.lock:  # (held already where operands were copied first)
            work = self.workspaces.get((self.slices * batch, m, n), dtype, stream)
            self.launch_with(self.kernel, A, B, work, one, zero, stream)
            launch_kernel(reduce_kernel(), blocks, threads, stream, 0, (work, C, alpha, beta))


@cache
def reduce_kernel() -> Any:
    """``reduce(W, C, alpha, beta)``: ``C[p] = alpha * sum_s W[p * slices + s] + beta * C[p]``,
    the slices added in order 0, 1, 2... (reproducible); C is read only when beta != 0, so a
    NaN left in C by the caller never reaches the result."""
    global cuda
    from numba import cuda

    @cuda.jit
    def reduce_slices(W, C, alpha, beta):  # noqa: N803 - the rungs' names for operands
        batch, m, n = C.shape
        slices = W.shape[0] // batch
        plane = m * n
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < batch * plane:
            p = i // plane
            r = (i - p * plane) // n
            c = i - p * plane - r * n
            s = W[p * slices, r, c]
            for t in range(1, slices):
                s += W[p * slices + t, r, c]
            if beta == 0:
                C[p, r, c] = alpha * s
            else:
                C[p, r, c] = alpha * s + beta * C[p, r, c]
            i += cuda.gridDim.x * cuda.blockDim.x

    return reduce_slices
