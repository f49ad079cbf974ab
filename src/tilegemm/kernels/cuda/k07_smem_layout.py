"""Rung 7 — smem_layout: A transposed and swizzled in shared memory, conflict-free reads.

What changed from vectorized: the A tile is stored transposed, ``As[k][m]``, so that in the
compute loop each thread reads its TM values of A for one k as whole 128-bit vectors, like
it already reads B; and both tiles are laid out / read so that no shared-memory access
conflicts on banks:

- Stores of A (a 16-byte global vector → W scalar shared stores down a column of As): a
  warp's 32 threads cover RPW = 32·W/BK rows × BK/W vector columns; without care their
  W-th element lands in row k of As at column m, so all threads with the same m share a
  bank (4-way conflicts at BM=128, BK=16). Column ``m`` is therefore stored at
  ``m XOR S(k)`` with ``S(k) = (k // W) · RPW`` (mod BM): each of the BK/W vector columns
  gets its own group of RPW banks, and the XOR, being by a multiple of W, keeps every
  aligned group of W columns contiguous, so the 128-bit reads still work.
- Reads of A and B in the compute loop: a thread's TM rows (TN columns) are no longer one
  contiguous run but TM/W (TN/W) vectors spaced a panel apart (``row = iv·BM/(TM/W) +
  ty·W``), so neighbouring threads read neighbouring 16-byte chunks. With contiguous runs
  of 8 (rung 6), the 8 threads of a quarter-warp read chunks 32 bytes apart — two passes
  over the banks for every ``ld.shared.v4``.

tests/test_cuda_perf_banks.py counts the shared-memory wavefronts of both rungs' index
expressions (float32, defaults, per warp request): rung 6 reads A 2-way conflicted (scalar
loads of two thread rows 128 words apart) and B 2-way (8 wavefronts per ``ld.shared.v4``
instead of 4); storing A transposed without the swizzle would be 4-way; rung 7 is at the
minimum everywhere (1 wavefront per scalar store, 4 per 128-bit read).
What it should buy: shared-memory bandwidth is what register tiling leaves as the
bottleneck; siboehm's kernels 7–8 (transposed A, conflict-free layout) gain a few percent
on A6000 and more where loads are issued back to back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import access_ops, width
from tilegemm.kernels.cuda._kmajor import FFMA_COPIES, RowMajorProgram
from tilegemm.kernels.cuda.k06_vectorized import SPEC as VECTORIZED
from tilegemm.launch import tile_grid
from tilegemm.registry import changed

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)

# Rung 6's tiles, with TM in whole 128-bit vectors too: a thread's rows of A are now read
# as vectors.
PARAMS = changed(VECTORIZED.params, "TM", choices=(4, 8, 16),
                 help="rows of C per thread (whole 128-bit vectors)")


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    BM, BN, TM, TN = p["BM"], p["BN"], p["TM"], p["TN"]
    NT = VECTORIZED.threads(p)
    TCOLS = BN // TN  # threads across a block tile row
    W = width(dtype.itemsize)  # elements per 128-bit vector
    PM = BM // (TM // W)  # a thread's row vectors are PM rows apart
    PN = BN // (TN // W)  # and its column vectors PN columns apart

    # The kernel is generated with its k steps written out (see rung 8, whose generator
    # it shares): thread (ty, tx) owns rows ty*W + (i//W)*PM + i%W, columns likewise.
    from tilegemm.kernels.cuda.k08_warptile import generate

    namespace = dict(cuda=cuda, TM=TM, TN=TN, TCOLS=TCOLS, PM=PM, PN=PN, NT=NT)
    mapping = ["tx = tid % TCOLS", "ty = tid // TCOLS", "tr0 = ty * W", "tc0 = tx * W"]
    kernel = generate("smem_layout", p, dtype, namespace, mapping, TM, TN,
                      "(i // W) * PM + i % W", "(j // W) * PN + j % W",
                      lambda i: (i // W) * PM + i % W, lambda j: (j // W) * PN + j % W,
                      access_ops())

    return RowMajorProgram(kernel, (NT, 1, 1), tile_grid(BM, BN), **FFMA_COPIES)


# Rung 6 with A's layout in shared memory changed: its limits, threads and shared memory.
SPEC = replace(
    VECTORIZED,
    name="smem_layout",
    rung=7,
    title="A transposed + swizzled in shared memory, bank-conflict-free vector reads",
    build=build,
    params=PARAMS,
    doc=__doc__,
)
