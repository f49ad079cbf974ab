"""Rung 6 — vectorized: rung 5 with VW-wide vector loads, accumulators and stores.

Tiles of A and B are fetched from global memory as ``floatVW`` (``doubleVW``) vectors and
B's tile is kept in local memory as vectors; each work-item's TN columns are TN/VW
vectors, so the inner loop is TM × TN/VW vector multiply-adds. On GPUs this halves or
quarters the number of load instructions (128-bit loads at VW = 4 in float32); on CPU
OpenCL devices such as PoCL the explicit vectors are what fills the SIMD lanes.

Vector accesses are taken only when legal (the operand's rows start on a multiple of VW,
and the whole vector is inside the matrix); edges and odd row lengths fall back to
element-wise loads and stores with bounds, so every shape is correct.

With one work-item per work-group (BM = TM and BN = TN) there is nobody to share a tile
with, so the kernel skips the local-memory stage and reads A and B from global memory
directly (BK is then unused), walking row blocks in dimension 0 so that consecutive
work-groups reuse one panel of B from cache. That is the measured default on CPU devices
(``device_defaults``: an 8 × 16 block per work-item in 8-wide vectors, 16 vector
accumulators): a CPU runs a work-group's work-items one after another, its local memory is
ordinary cached memory, and staging there only copies data. See docs/opencl.md.

Where reading B in place is costly and several work-groups share each panel
(``OpenCLProgram.packs``), the direct path reads A and B packed: the backend first copies
A into K×TM row panels and B into K×TN column panels on the device (``pack_panels``, one
pass over each), so each work-item reads two sequential streams. Read in place, the rows
of a work-item's strip of B lie N elements apart; when that is a multiple of 4 KB (1024 or
2048 in float32) they all fall in the same few cache sets and are evicted before the next
row block reads them: packing made 1024³ and 2048³ products 2–3× faster on an AVX-512
Xeon. Packing also gives rows that are whole aligned vectors when N is not a multiple of
VW, where in place B would be read element by element (5× at 1000³ in ``float16``).

Every loop over the register tile is unrolled (``#pragma unroll``): the accumulators must
have constant indices to live in registers, and PoCL's LLVM otherwise keeps a rolled row
loop with the accumulators on the stack (half the speed on a Zen 5 EPYC).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilegemm.backends.opencl_program import OpenCLProgram, make_program
from tilegemm.registry import Constraint, KernelSpec, Param


def _local_bytes(p: Mapping[str, int], itemsize: int) -> int:
    if _threads(p) == 1:
        return 0  # one work-item per group reads global memory directly (see the .cl)
    return (p["BM"] + p["BN"]) * p["BK"] * itemsize


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])


def _direct_tile(p: Mapping[str, int]) -> bool:
    """One work-item per work-group (the direct path), with BK at the smallest value the
    constraints allow, so no tile is timed twice under BK values it does not read."""
    return _threads(p) == 1 and p["BK"] == max(4, p["VW"])


def build(p: Mapping[str, int], dtype: np.dtype) -> OpenCLProgram:
    direct = _threads(p) == 1  # the kernel then walks row blocks in dimension 0
    return make_program(
        "vectorized", "k06_vectorized.cl", p, dtype,
        local=(p["BN"] // p["TN"], p["BM"] // p["TM"]),
        tile=(p["BM"], p["BN"]) if direct else (p["BN"], p["BM"]), dim0_is_row=direct,
        vector_width=p["VW"], local_mem=_local_bytes(p, dtype.itemsize),
        # the direct path can read A and B packed in panels (see the .cl)
        panels=(p["TM"], p["TN"]) if direct else (0, 0),
    )


SPEC = KernelSpec(
    name="vectorized",
    backend="opencl",
    rung=6,
    title="register2d with floatVW vector loads, accumulators and stores",
    build=build,
    params=(
        # 12: BM = TM = 12 is a one-work-item tile of 12 rows (24 float16 accumulators, the
        # 32 registers of AVX-512 less the B vectors and the broadcast). 6: BM = TM = 6,
        # TN = 16 in float8 is BLIS's AVX2 tile (12 of the 16 ymm registers), 1.2-1.4x the
        # CPU default 8x16 on an AVX2 EPYC (the database's entry for it).
        Param("BM", 64, (4, 6, 8, 12, 16, 32, 64, 128), "rows of C per work-group"),
        Param("BN", 64, (8, 16, 32, 64, 128), "columns of C per work-group"),
        Param("BK", 16, (4, 8, 16, 32, 64, 128), "k per local-memory stage"),
        Param("TM", 4, (1, 2, 4, 6, 8, 12, 16), "rows of C per work-item"),
        Param("TN", 4, (1, 2, 4, 8, 16, 32), "columns of C per work-item (TN/VW vectors)"),
        # 16: one 512-bit register per float16 on AVX-512 CPUs, where LLVM's preference for
        # 256-bit vectors keeps float8 code in ymm registers (see docs/opencl.md, Zen 5).
        Param("VW", 4, (1, 2, 4, 8, 16), "vector width in elements"),
    ),
    constraints=(
        Constraint("TM <= BM", lambda p: p["TM"] <= p["BM"]),
        Constraint("TN <= BN", lambda p: p["TN"] <= p["BN"]),
        Constraint("BM % TM == 0", lambda p: p["BM"] % p["TM"] == 0),
        Constraint("BN % TN == 0", lambda p: p["BN"] % p["TN"] == 0),
        Constraint("TN % VW == 0", lambda p: p["TN"] % p["VW"] == 0),
        Constraint("BK % VW == 0", lambda p: p["BK"] % p["VW"] == 0),
    ),
    threads=_threads,
    smem=_local_bytes,
    doc=__doc__,
    # Measured on PoCL (AVX2 code, 2 cores): see docs/opencl.md.
    device_defaults={"cpu": {"BM": 8, "BN": 16, "BK": 8, "TM": 8, "TN": 16, "VW": 8}},
    # On a CPU, tiles staged through local memory only copy data (docs/opencl.md): the tuner
    # times one-work-item tiles there, each once (BK, unused by them, at its first valid value).
    device_space={"cpu": _direct_tile},
    auto=True,  # kernel="auto" on OpenCL (a rung added above it is run only by name)
)
