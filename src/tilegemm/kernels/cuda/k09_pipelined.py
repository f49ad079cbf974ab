"""Rung 9 — pipelined: double-buffered shared tiles and grouped block order.

What changed from warptile, two things (1, 2), and two variants its parameters choose (3, 4):

1. Double buffering. Shared memory holds two A and two B tiles. While the block computes on
   tile k from one buffer, each thread has already issued the global loads of tile k+1
   into registers; after its FMAs it stores them into the other buffer, and one barrier per
   k-tile separates the phases (rung 8 needs two: one before computing, one before
   overwriting). The global-load latency (~500 cycles) now overlaps a whole k-tile of FMAs
   instead of stalling every warp at the barrier, and half the barriers are gone. This is
   the two-stage SIMT pipeline of CUTLASS's classic SGEMM (128×128×8, 256 threads), whose
   tile sizes are the defaults here: BK=8 keeps the doubled tiles at 16 KB in float32 (32
   KB in float64, under the 48 KB static limit) and the staging registers at one 128-bit
   vector of A and one of B per thread.
2. Grouped block order (GROUP_M). Blocks run roughly in launch order, so which tiles of C
   are in flight together decides what L2 holds. Row-major order puts ~one SM count of
   tiles along a row of C: every one reads the same A panel but a different B panel.
   Numbering the tiles in column-major groups of GROUP_M tile rows (Triton's "L2 cache
   optimisation") makes the tiles in flight a near-square patch, so each A and B panel
   loaded into L2 is reused by several blocks: at 4096³ with 128×128 tiles and 132 SMs,
   ~25 distinct panels instead of ~36. The grid is one-dimensional over tiles (grid-stride),
   batches in z.

3. Split-K (``SPLIT_K`` > 1), a way of launching the same kernel: blocks also split K into
   slices, write partial products to a workspace, and a second small kernel adds the
   slices in a fixed order and applies alpha, beta and C (``_splitk.py``). It is for
   products whose tiles of C are fewer than the GPU's SMs (512×512×8192: 16 tiles for 132
   SMs). ``kernel="auto"`` chooses it, or a smaller 128×64 tile, from the SM count when
   nothing was tuned for the shape (:func:`shape_params`); with ``SPLIT_K=1`` the
   kernel is exactly the one without split-K.

4. Shifted edge tiles (``SHIFT_EDGES=1``, off by default until timed on a GPU): a tile that
   would cross the bottom or right edge of C starts a whole tile back from that edge, so
   it overlaps its neighbour and stages on the interior path like every other block
   (see ``SHIFT``). A product of one wave lasts as long as its slowest block, and at
   1000³ the edge blocks are the ones that take the checked path; shifted, they compute
   no more multiply-adds than before (a partial tile multiplies zeros) and load as the
   interior does. Costs one instruction per k-tile (sm_80 and sm_90, float32).

What it should buy: the last big step of siboehm's ladder (kernels 11–12, +5–10 %), and
the L2 reuse that matters most at large sizes, where the gap to cuBLAS is otherwise set
by DRAM traffic.

Machine code (docs/performance.md): generated as source at build time like rungs 7–8
(``_codegen``, warptile's per-thread shared bases and written-out k steps). The k loop is
written out two k-tiles at a time, one per buffer, so the buffer is a constant in every
shared address (no parity arithmetic at all). Interior blocks stage the next tile with
128-bit loads at per-thread offsets bumped per k-tile, no bounds checks, issued before the
current tile's FMAs; edge blocks and unaligned operands stage element by element,
addressed from the same offsets (see ``_slow_stage``). Which path a stage takes is one
compare per k-tile against ``k_fast``, the last k an interior tile is staged at, set
once per block tile. float32 asks for two blocks per SM (128 registers); float64 keeps
the k steps of a tile a loop (written out, they spill on sm_80). FFMA share on sm_90:
hot loop 76 % → 87 % → 89 %, interior k-tile 63 % → 87 % → 89 % (the last step: the
edge path's addressing and the per-tile test, 2026-11-27).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import VECTOR_BYTES, access_ops, load_at, vload_at, width
from tilegemm.kernels.cuda._codegen import compile_source, fill
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda._kmajor import FFMA_COPIES, RowMajorProgram
from tilegemm.kernels.cuda._splitk import SplitKProgram
from tilegemm.kernels.cuda.k08_warptile import SPEC as WARPTILE
from tilegemm.kernels.cuda.k08_warptile import (
    VECTOR_CHECKS,
    WARP_CONSTRAINTS,
    WARP_MAPPING,
    WarpTiles,
    _bases,
    _compute,
    _offsets,
    k_step,
    store_c,
    zero_acc,
)
from tilegemm.launch import GROUP_M, ceil_div, flat_tile_grid
from tilegemm.registry import Constraint, Param, changed

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)


def _smem(p: Mapping[str, int], itemsize: int) -> int:
    return 2 * (p["BK"] * p["BM"] + p["BK"] * p["BN"]) * itemsize


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    t = WarpTiles.of(p)
    BM, BN, BK, RT, CT, NT = t.BM, t.BN, t.BK, t.RT, t.CT, t.NT
    SPLIT = p["SPLIT_K"]
    W = width(dtype.itemsize)
    # staging registers a thread holds per operand: its share of the tile's vectors
    A_ROUNDS, B_ROUNDS = ceil_div(BM * (BK // W), NT), ceil_div(BK * (BN // W), NT)
    RPW = max(W, 32 * W // BK)  # rows of A one warp loads per round: the swizzle period
    ld, st, vload, vstore, gather, scatter, address, ALIGN = access_ops()
    namespace = dict(
        cuda=cuda, **t.names(), GROUP_M=p["GROUP_M"], W=W, ISZ=dtype.itemsize,
        VB=VECTOR_BYTES, SA=A_ROUNDS * W, SB=B_ROUNDS * W, RPW=RPW,
        ld=ld, st=st, vload=vload, vstore=vstore, gather=gather, scatter=scatter,
        address=address, vload_at=vload_at(), load_at=load_at(), ALIGN=ALIGN,
        zero=dtype.type(0), nptype=dtype.type, SPLIT=SPLIT)
    offsets, bumps = _offsets(p, W, NT, strided=True)
    if SPLIT > 1:  # the first k-tile of a slice starts at k_beg, not at 0
        offsets = [x + (" + k_beg * sa2" if x.startswith("oa") else " + k_beg * sb1")
                   for x in offsets]
    # float64: k steps written out need more than 255 registers on sm_80 (the next step's
    # operands next to 128 of accumulators and the staged tile), so they stay a loop there.
    if dtype.itemsize == 4:
        computes = [_compute(p, W, RPW, RT, CT, f"{buf}, ") for buf in (0, 1)]
    else:
        computes = [_compute_loop(p, W, RPW, RT, CT, buf, t.row_off, t.col_off)
                    for buf in (0, 1)]
    parts = {
        "MAPPING": WARP_MAPPING,
        "BASES": _bases(p, W, RPW, NT, RT, CT, t.row_off, t.col_off),
        "SHIFT_FLAGS": SHIFT_FLAGS if p["SHIFT_EDGES"] else [],
        "SHIFT": SHIFT if p["SHIFT_EDGES"] else [],
        "BLOCK_OFFSETS": offsets,
        "STAGE": _stage(p, W, NT, bumps),
        "COMPUTE0": computes[0],
        "COMPUTE1": computes[1],
        "STORE0": _store(p, W, NT, 0),
        "STORE1": _store(p, W, NT, 1),
        "SLICES": ["k_beg = 0", "k_end = k_len"] if SPLIT == 1 else [],
        "PRODUCT": SINGLE_PRODUCT if SPLIT == 1 else SPLIT_PRODUCT,
        "ZERO_ACC": zero_acc(RT, CT),
        "STORE_C": store_c(RT, CT, WarpTiles.ROW_EXPR, WarpTiles.COL_EXPR),
    }
    source = fill(KERNEL, parts)
    # float32: two 256-thread blocks per SM, i.e. at most 128 registers a thread. Not with
    # split-K: the slice's end, a computed value where the plain kernel compares with a
    # kernel argument, took ptxas past 128 registers into ~160 spills (sm_90); split-K
    # runs one block per SM instead, and shape_params sizes the split for that.
    two_blocks = dtype.itemsize == 4 and NT <= 256 and SPLIT == 1
    kernel = kernel_jit(NT, 2 if two_blocks else 0)(
        compile_source(source, "pipelined", namespace))

    grid = flat_tile_grid(BM, BN)
    if SPLIT == 1:
        return RowMajorProgram(kernel, (NT, 1, 1), grid, **FFMA_COPIES)
    return SplitKProgram(kernel, (NT, 1, 1), grid, slices=SPLIT, **FFMA_COPIES)


# SHIFT_EDGES=1: a tile that would cross the bottom or right edge of C starts BM (BN)
# back from that edge instead, so it overlaps its neighbour and every block of a product
# at least one tile wide takes the interior path (128-bit loads, no checks). The
# overlapped outputs are computed twice, by the same sequence of multiply-adds in the same
# k order, so both blocks write the same bits. Not when C is read (beta != 0: a block could
# read an element its neighbour has already written), and columns only where the shifted
# start stays on a 128-bit boundary (N a multiple of the vector width).
SHIFT_FLAGS = ["last_row = m - BM if beta == 0 and m >= BM else m",
               "last_col = n - BN if beta == 0 and n >= BN and n % W == 0 else n"]
SHIFT = ["row0 = min(row0, last_row)", "col0 = min(col0, last_col)"]

# How a block finds its product and its range of K. Without split-K: all of K.
SINGLE_PRODUCT = ["za = z if A.shape[0] > 1 else 0", "zb = z if B.shape[0] > 1 else 0"]
# With split-K, C is the workspace: slice s of product p at C[p * SPLIT + s], so finding
# them divides by the constant SPLIT (a shift), not by the run-time number of products.
# Slices are whole k-tiles, so a slice starts at a multiple of BK: a 128-bit aligned
# element whenever row starts are.
SPLIT_PRODUCT = ["zp = z // SPLIT  # the product; z % SPLIT is the slice",
                 "za = zp if A.shape[0] > 1 else 0",
                 "zb = zp if B.shape[0] > 1 else 0",
                 "k_beg = (z % SPLIT) * (((k_len + SPLIT - 1) // SPLIT + BK - 1) // BK * BK)",
                 "k_end = min(k_len, k_beg + ((k_len + SPLIT - 1) // SPLIT + BK - 1) // BK * BK)"]


def _compute_loop(p: Mapping[str, int], w: int, rpw: int, RT: int, CT: int, buf: int,
                  row_off: Callable[[int], int], col_off: Callable[[int], int]) -> list[str]:
    """The BK k steps of one tile as a loop over ``kk`` (float64, see build())."""
    step = k_step(RT, CT, w, "", [f"({buf}, kk, (tr0 + {row_off(i)}) ^ sk)"
                                  for i in range(0, RT, w)],
                  [f"({buf}, kk, tc0 + {col_off(j)})" for j in range(0, CT, w)])
    return ["for kk in range(BK):", f"    sk = ((kk // {w}) * {rpw}) & {p['BM'] - 1}",
            *("    " + x for x in step)]


def _stage(p: Mapping[str, int], w: int, nt: int, bumps: list[str]) -> list[str]:
    """Tile ``kn`` from global memory into the staging registers ``sa``/``sb``: on the
    interior path every 128-bit load at a bumped offset, no bounds checks; otherwise
    element by element with checks (edges, rows off 16 bytes, other strided views)."""
    a_vecs, b_vecs = p["BM"] * (p["BK"] // w), p["BK"] * (p["BN"] // w)
    fast = []
    for rnd in range(ceil_div(a_vecs, nt)):
        load = (f"scatter(sa, ({rnd * w},), "
                f"vload_at(A, (za, row0 + ar{rnd}, kn + ac{rnd}), oa{rnd}))")
        fast += [load] if (rnd + 1) * nt <= a_vecs else [
            f"if tid + {rnd * nt} < {a_vecs}:", "    " + load]
    for rnd in range(ceil_div(b_vecs, nt)):
        load = (f"scatter(sb, ({rnd * w},), "
                f"vload_at(B, (zb, kn + br{rnd}, col0 + bc{rnd}), ob{rnd}))")
        fast += [load] if (rnd + 1) * nt <= b_vecs else [
            f"if tid + {rnd * nt} < {b_vecs}:", "    " + load]
    return (["if kn <= k_fast:"] + ["    " + x for x in fast]
            + ["else:"] + ["    " + x for x in _slow_stage(p, w, nt)] + bumps)


def _slow_stage(p: Mapping[str, int], w: int, nt: int) -> list[str]:
    """The edge path of a stage: tile ``kn`` into the staging registers, each vector of
    the tile (``ar``/``ac`` of A, ``br``/``bc`` of B: the same per-thread positions as the
    interior path's) loaded whole where the operand allows it and the vector lies inside,
    else element by element, zero outside.

    Elements are addressed from the interior path's offsets ``oa``/``ob``, which carry
    the operands' strides along k and n (``_offsets(strided=True)``), not by indexing the
    arrays: indexed, the edge path's address arithmetic (a 64-bit row times stride and a
    pointer, per operand) was computed on every k-tile of the interior path too, ahead of
    its branch, 8 instructions per pair of k-tiles on sm_90, and with ``k_fast`` below it
    left no room in 128 registers (116 bytes spilled)."""
    a_vecs, b_vecs = p["BM"] * (p["BK"] // w), p["BK"] * (p["BN"] // w)
    lines = []
    for x, vecs, row, col, off, rows, cols, step in (
            ("a", a_vecs, "row0 + ar{r}", "kn + ac{r}", "oa{r}", "m", "k_end", "sa2"),
            ("b", b_vecs, "kn + br{r}", "col0 + bc{r}", "ob{r}", "k_end", "n", "sb2")):
        X = x.upper()  # noqa: N806 - the operand's name in the kernel
        for r in range(ceil_div(vecs, nt)):
            o = off.format(r=r)
            mine = f"tid + {r * nt} < {vecs} and " if (r + 1) * nt > vecs else ""
            lines += [f"gr = {row.format(r=r)}", f"gc = {col.format(r=r)}",
                      f"if {mine}{x}_vec and gr < {rows} and gc < {cols} - (W - 1):",
                      f"    scatter(s{x}, ({r * w},), vload_at({X}, (z{x}, gr, gc), {o}))",
                      "else:"]
            for q in range(w):
                lines += [f"    if {mine}gr < {rows} and gc + {q} < {cols}:",
                          f"        s{x}[{r * w + q}] = load_at({X}, (z{x}, gr, gc + {q}), "
                          f"{o} + {q} * {step})",
                          "    else:",
                          f"        s{x}[{r * w + q}] = zero"]
    return lines


def _store(p: Mapping[str, int], w: int, nt: int, buf: int) -> list[str]:
    """The staged tile into shared buffer ``buf``: A transposed and swizzled, B as is."""
    a_vecs, b_vecs = p["BM"] * (p["BK"] // w), p["BK"] * (p["BN"] // w)
    lines = []
    for rnd in range(ceil_div(a_vecs, nt)):
        store = [f"st(As, ({buf}, ac{rnd} + {q}, asw{rnd}), sa[{rnd * w + q}])"
                 for q in range(w)]
        lines += store if (rnd + 1) * nt <= a_vecs else [
            f"if tid + {rnd * nt} < {a_vecs}:", *("    " + x for x in store)]
    for rnd in range(ceil_div(b_vecs, nt)):
        store = f"vstore(Bs, ({buf}, br{rnd}, bc{rnd}), gather(sb, ({rnd * w},)))"
        lines += [store] if (rnd + 1) * nt <= b_vecs else [
            f"if tid + {rnd * nt} < {b_vecs}:", "    " + store]
    return lines


# The kernel, as source: #@ lines are replaced by generated code in build() (rung 8's
# vector checks at import). The k loop is written out two k-tiles at a time, one per
# shared buffer, so buffer parity is a constant in every shared address.
KERNEL = """
def pipelined(A, B, C, alpha, beta):
    m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
    tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0 (see rung 5)
    #@MAPPING
    #@VECTOR_CHECKS

    As = cuda.shared.array((2, BK, BM), nptype, alignment=ALIGN)  # transposed, swizzled
    Bs = cuda.shared.array((2, BK, BN), nptype, alignment=ALIGN)
    acc = cuda.local.array((RT, CT), nptype)  # the accumulators, for the epilogue only
    sa = cuda.local.array(SA, nptype)  # the next tile, staged in registers
    sb = cuda.local.array(SB, nptype)
    cv = cuda.local.array(W, nptype)
    sa0, sa1 = A.strides[0] // ISZ, A.strides[1] // ISZ  # strides in elements
    sb0, sb1 = B.strides[0] // ISZ, B.strides[1] // ISZ
    sa2, sb2 = A.strides[2] // ISZ, B.strides[2] // ISZ
    #@BASES

    tiles_m = (m + BM - 1) // BM
    tiles_n = (n + BN - 1) // BN
    group = GROUP_M * tiles_n  # tiles in one group of GROUP_M tile rows
    #@SHIFT_FLAGS
    #@SLICES
    z = cuda.blockIdx.z
    while z < C.shape[0]:
        #@PRODUCT
        t = cuda.blockIdx.x
        while t < tiles_m * tiles_n:
            # Grouped order: column-major inside groups of GROUP_M tile rows.
            first = (t // group) * GROUP_M
            gsize = min(tiles_m - first, GROUP_M)
            row0 = (first + (t % group) % gsize) * BM
            col0 = ((t % group) // gsize) * BN
            #@SHIFT
            #@BLOCK_OFFSETS
            #@ZERO_ACC
            # Block-uniform: the whole tile is inside A, B and C, and vectors are safe.
            inner = a_vec and b_vec and row0 + BM <= m and col0 + BN <= n
            # The last k at which a tile is staged on the interior path (none: below
            # k_beg): each stage then tests kn <= k_fast, one 64-bit compare.
            k_fast = k_end - BK if inner else k_beg - 1
            # Prologue: tile 0 into buffer 0.
            kn = k_beg
            #@STAGE
            cuda.syncthreads()  # this block's previous tile may still be reading buffer 0
            #@STORE0
            cuda.syncthreads()
            k0 = k_beg
            while k0 < k_end:
                # Buffer 0 holds tile k0. Issue tile k0 + BK's global loads (into
                # registers), compute on buffer 0 while they are in flight, then store
                # them into buffer 1. Nobody reads buffer 1 now: its last readers finished
                # before the last barrier. One barrier per k-tile.
                kn = k0 + BK
                if kn < k_end:
                    #@STAGE
                #@COMPUTE0
                if kn >= k_end:
                    break
                #@STORE1
                cuda.syncthreads()
                k0 = kn
                # The same with the buffers swapped.
                kn = k0 + BK
                if kn < k_end:
                    #@STAGE
                #@COMPUTE1
                if kn >= k_end:
                    break
                #@STORE0
                cuda.syncthreads()
                k0 = kn
            # C: row 0 of acc written, rows shift up (constant indices, see rung 8's STORE_C).
            #@STORE_C
            t += cuda.gridDim.x
        z += cuda.gridDim.z
""".replace("    #@VECTOR_CHECKS\n", VECTOR_CHECKS)


# kernel="auto" on a real GPU, when nothing was tuned for the shape (see shape_params).
FILL = 0.9  # "about one wave": tiles for at least 90 % of the SMs
# The smaller tile for products whose 128x128 tiles leave SMs idle: 128x64, still 256
# threads (8 warps a block, as the default), 8x4 outputs a thread. Checked with ptxas for
# sm_90 (`tilegemm kernels --resources`): float32 and float64 without spills.
SMALL_TILE = {"BM": 128, "BN": 64, "WM": 32, "WN": 32, "WNITER": 1, "TM": 8, "TN": 4}
MIN_SLICE_TILES = 16  # a split-K slice walks at least 16 k-tiles (prologue amortised)
MAX_WORKSPACE = 256 * 1024 * 1024  # bytes of partial products split-K may allocate


def shape_params(p: Mapping[str, int], prob: Any, target: Any
                 ) -> tuple[dict[str, int], str] | None:
    """Parameters for one product on one device, from ``p`` (the defaults or the
    database's), when its tiles of C cannot keep every SM busy; None to keep ``p``.

    A block runs on one SM, so a product with fewer tiles than SMs leaves SMs idle
    whatever the kernel does. In order:

    1. ``p``'s tiles fill about one wave (at least ``FILL`` × SMs blocks): keep ``p``.
    2. The defaults with a tile of 128×64 (``SMALL_TILE``) fill about one wave: use it
       (1024³ on 132 SMs: 128 blocks instead of 64).
    3. Split-K: the smallest ``SPLIT_K`` whose tiles × slices fill about one wave, each
       slice at least ``MIN_SLICE_TILES`` k-tiles and the workspace at most
       ``MAX_WORKSPACE`` (512×512×8192 on 132 SMs: 8 slices of 1024, 128 blocks). A
       split-K block needs more than 128 registers in float32 (see build()), so it runs
       one block per SM: a wave is one block per SM, and more slices would start a
       second wave.
    4. Otherwise the smaller tile if it gives more blocks, else ``p``.

    Reads the SM count from ``target.compute_units``; a device that does not report it
    keeps ``p``. ``p`` asking for split-K already is kept.
    """
    sms = int(getattr(target, "compute_units", 0) or 0)
    m, n, k, batch = prob.m, prob.n, prob.k, prob.batch
    if sms <= 0 or p["SPLIT_K"] != 1 or m * n * k * batch == 0:
        return None

    def tiles(q: Mapping[str, int]) -> int:
        return ceil_div(m, q["BM"]) * ceil_div(n, q["BN"]) * batch

    have = tiles(p)
    if have >= FILL * sms:
        return None
    small = {**p, **SMALL_TILE} if p == SPEC.defaults() else None
    if small is not None and tiles(small) >= FILL * sms:
        return small, (f"{tiles(small)} tiles of {small['BM']}x{small['BN']} for {sms} SMs "
                       f"({have} of {p['BM']}x{p['BN']})")
    itemsize = np.dtype(prob.dtype).itemsize
    split = 1
    for s in sorted(v for v in _SPLITS if v > 1):
        if ceil_div(k, s) < MIN_SLICE_TILES * p["BK"]:
            break
        if s * batch * m * n * itemsize > MAX_WORKSPACE:
            break
        split = s
        if have * s >= FILL * sms:
            break
    if split > 1:
        return ({**p, "SPLIT_K": split},
                f"split-K: {have} tiles x {split} slices of K for {sms} SMs")
    if small is not None and tiles(small) > have:
        return small, f"{tiles(small)} tiles of {small['BM']}x{small['BN']} for {sms} SMs"
    return None


# Rung 8's warp tiles and threads, in two shared-memory stages.
SPEC = replace(
    WARPTILE,
    name="pipelined",
    rung=9,
    title="double-buffered shared tiles, one barrier per k-tile, grouped block order",
    build=build,
    params=(
        # BK = 8 by default: two stages of 8 hold what one of 16 did
        *changed(WARPTILE.params, "BK", default=8),
        GROUP_M,
        Param("SHIFT_EDGES", 0, (0, 1),
              "1: edge tiles start a tile back from the edge, overlapping their neighbours, "
              "and take the unchecked path (0: partial tiles, checked loads)",
              searched=False),  # not yet timed on a GPU: held at 0 until it is
        Param("SPLIT_K", 1, (1, 2, 4, 8, 16),
              "slices of K computed by separate blocks, then summed in order (1: none)",
              searched=False),  # chosen per shape (shape_params); the tuner holds it
    ),
    constraints=(
        *WARP_CONSTRAINTS,
        Constraint("float32 tiles fit the 48 KB of static shared memory",
                   lambda p: _smem(p, 4) <= 48 * 1024),
    ),
    smem=_smem,
    doc=__doc__,
    shape_params=lambda p, prob, target: shape_params(p, prob, target),
    auto=True,  # kernel="auto" before tuning: the top rung at its defaults (float32 and 64)
    sim_params={"BM": 32, "BN": 16, "BK": 8, "WM": 32, "WN": 16, "WNITER": 1,
                "TM": 4, "TN": 4, "GROUP_M": 2},
)

_SPLITS = next(x.choices for x in SPEC.params if x.name == "SPLIT_K")
