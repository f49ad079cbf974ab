"""Rung 6 — vectorized: the register2d block tile, moved with 128-bit loads and stores.

What changed from register2d: every global→shared copy, every shared→register read of B
and every store of C moves 16 bytes per instruction (``ld.global.v4.f32``,
``st.shared.v4.f32``, ``ld.shared.v4.f32``, ``st.global.v4.f32``; two float64 per vector)
instead of 4 (or 8). The block still computes a BM×BN tile of C by walking K in steps of BK
through shared tiles ``As[BM][BK]`` and ``Bs[BK][BN]``, and each thread still accumulates a
TM×TN outer product in registers.

Why it should help: register2d's inner loop is already mostly FMAs, but its tile loads
issue one instruction (and one address computation) per element; with four elements per
instruction the load/store instruction count drops ~4×, fewer load-store-unit slots are
spent per byte and the copy phase between the two barriers gets shorter. siboehm's SGEMM
kernel 6 gains ~15–20 % over kernel 5 on an A6000 from this change. A is still stored
row-major in shared memory, so the compute loop reads it one element at a time (rung 7
transposes it).

The 128-bit path needs 16-byte-aligned addresses: the data pointer 16-byte aligned, the
row stride a multiple of 16 bytes (for contiguous arrays in float32, ``K % 4 == 0`` for A,
``N % 4 == 0`` for B and C) and a column offset that is a multiple of 4. That is tested
once per launch, per operand; an operand that fails (such an odd K or N, a strided view)
takes the scalar path with per-element bounds, so every M, N, K is correct and only speed
differs; a vector that would cross the end of a row is moved element by element. In a
large enough product, a device operand laid out transposed (``x.T`` of a CuPy array or
PyTorch tensor, as A in ``x.T @ y`` or B in ``x @ w.T``) or with rows off 16 bytes is
first copied into the layout the kernel reads, one pass over it, its rows padded to 16
bytes, so it takes the vector path whatever K or N (``_kmajor.RowMajorProgram``, rungs
6-9; docs/performance.md). Vectors are loaded with an ``@intrinsic`` (see
``kernels/cuda/_access.py``), replaced by element accesses under the simulator.

Machine code (docs/performance.md): the kernel comes from the generator rungs 7-9 use
(``k08_warptile.generate``, with A kept row-major), so the same Numba-specific fixes
apply and the rungs above differ from this one only in what their docstrings say. The BK
k steps of a tile are written out at build time (every shared load is a per-thread base
plus a constant, and the next step's loads overlap this step's FMAs); blocks wholly inside
the operands issue all of a k-tile's 128-bit global loads, read-only and at offsets bumped
per k-tile, before any shared store; float32 asks for two blocks per SM (128 registers).
FFMA share of an interior k-tile on sm_90: 69 % before, 84 % now (8 scalar reads of A and
2 vector reads of B per 64 FMAs). float64 keeps the k steps a loop (registers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import access_ops
from tilegemm.kernels.cuda._kmajor import FFMA_COPIES, RowMajorProgram
from tilegemm.kernels.cuda.k05_register2d import SPEC as REGISTER2D
from tilegemm.launch import tile_grid
from tilegemm.registry import FLOATS, Constraint, changed

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)

# Rung 5's block and thread tiles (and so its thread count and shared memory), with this
# rung's own choices of BK, TM and TN: TN in whole 128-bit vectors of B and C.
PARAMS = changed(REGISTER2D.params, "BK", default=16, choices=(8, 16, 32),
                 help="depth of the shared-memory tiles")
PARAMS = changed(PARAMS, "TM", choices=(2, 4, 8, 16))
PARAMS = changed(PARAMS, "TN", choices=(4, 8, 16),
                 help="columns of C per thread (whole 128-bit vectors)")


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    BM, BN, TM, TN = p["BM"], p["BN"], p["TM"], p["TN"]
    NT = REGISTER2D.threads(p)
    TCOLS = BN // TN  # threads across a block tile row

    # The kernel is generated with its k steps written out, by the generator rungs 7-9
    # use (k08_warptile.generate), with A kept row-major in shared memory: thread (ty, tx)
    # owns the contiguous rows ty*TM + i and columns tx*TN + j, as in register2d.
    from tilegemm.kernels.cuda.k08_warptile import generate

    namespace = dict(cuda=cuda, TM=TM, TN=TN, TCOLS=TCOLS, NT=NT)
    mapping = ["tx = tid % TCOLS", "ty = tid // TCOLS", "tr0 = ty * TM", "tc0 = tx * TN"]
    kernel = generate("vectorized", p, dtype, namespace, mapping, TM, TN, "i", "j",
                      lambda i: i, lambda j: j, access_ops(), a_rows=True)

    return RowMajorProgram(kernel, (NT, 1, 1), tile_grid(BM, BN), **FFMA_COPIES)


SPEC = replace(
    REGISTER2D,
    name="vectorized",
    rung=6,
    title="register2d with 128-bit global/shared loads and stores",
    build=build,
    params=PARAMS,
    constraints=(
        Constraint("BM % TM == 0 and BN % TN == 0", lambda p: p["BM"] % p["TM"] == 0
                   and p["BN"] % p["TN"] == 0),
        Constraint("16 <= (BM/TM)*(BN/TN) <= 1024 threads",
                   lambda p: p["BM"] % p["TM"] == 0 and p["BN"] % p["TN"] == 0
                   and 16 <= REGISTER2D.threads(p) <= 1024),
        Constraint("float32 tiles fit the 48 KB of static shared memory",
                   lambda p: REGISTER2D.smem(p, 4) <= 48 * 1024),
    ),
    dtypes=FLOATS,
    doc=__doc__,
    sim_params={"BM": 16, "BN": 16, "BK": 8, "TM": 4, "TN": 4},
)
