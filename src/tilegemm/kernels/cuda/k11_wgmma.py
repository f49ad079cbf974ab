"""Rung 11 — wgmma: Hopper warpgroup MMA (sm_90a) from 128-byte-swizzled shared tiles.

What changed from mma: the tensor core reads its operands from shared memory itself. Each
warpgroup (4 warps, 128 threads) issues ``wgmma.mma_async.m64nBNk8`` (TF32) or
``m64nBNk16`` (float16/bfloat16) on its 64-row slice of the BM×BN block tile, A and B named
by 64-bit shared-memory descriptors, so no thread loads a fragment (mma's ldmatrix and
shared loads disappear) and the product runs asynchronously while the threads copy the
next tiles. Only H100-class GPUs (compute capability 9.0, the architecture-specific target
``sm_90a``) have it; on any other GPU asking for this rung is an error.

1. Shared tiles in the 128-byte swizzle layout (PTX ISA "Shared Memory Matrix Layout",
   descriptor swizzle mode 1), both operands K-major: every row of a tile is 128 bytes of K
   (BK = 32 TF32 or 64 16-bit values), 8 rows form a 1024-byte atom, and the 16-byte chunk
   ``j`` of row ``r`` is stored at chunk ``j ^ (r % 8)``: the 8 rows a copy or a tensor-core
   read touches at once fall in 8 distinct bank groups. The ring starts 1024-byte aligned
   (the swizzle is applied to address bits), so the descriptors' base offset is 0; the four
   k steps of a tile add 32 bytes each to the descriptor's start address, as CUTLASS's
   descriptor iterator does.
2. A arrives by ``cp.async`` (16-byte copies, zero-filled past the edges, 4-byte or plain
   copies for unaligned rows: mma's loader, whose A tile is this layout already), a
   STAGES-deep ring in dynamic shared memory, ``STAGES - 2`` tiles ahead. B (K×N, N
   contiguous in the common case) must be K-major too (TF32 has no transposed form). With
   BCOPY=1 (the default) it is transposed once, before the kernel, into a K-major copy
   (``_kmajor``; a B that is K-major already is read in place), and its tiles arrive by
   the same ``cp.async`` copies as A's; TF32 operands are rounded by those copies (A gets a
   rounded copy of its own), so the kernel reads every tile as it landed. With BCOPY=0 it
   is transposed on its way in: each thread reads 4 (TF32) or 8 (16-bit) values down one
   column of B (a warp reads 32 adjacent columns: coalesced), rounds or packs them, and
   stores them as one 16-byte chunk of that column's row of the tile (conflict-free, one
   ``st.shared.v4``). TF32 A chunks are rounded in place by the thread that copied them.
   Blocks wholly inside the operands run an interior loop while the tile being copied is
   wholly inside K: A by unconditional 16-byte ``cp.async`` from per-thread addresses
   bumped per k-tile (mma's interior copies), B by loads without bounds tests from
   per-thread offsets bumped BK rows per k-tile, issued one k-tile ahead into registers
   (so their latency overlaps the wait, the barrier and the next products) and rounded or
   packed only when stored; edge blocks and the last k-tiles take the checked loader.
   With BCOPY=2 (float16/bfloat16 only) B is not transposed at all: its tiles are copied
   as they lie (N contiguous) by ``cp.async`` into the 128-byte swizzle's N-major layout
   (panels of 64 columns, ``_wgmma.mn_swizzle_offset``) and the wgmma reads them with
   its transposed-B form (``imm-trans-b`` = 1): no copy before the kernel. Device operands
   laid out the other way (A with M contiguous, B with K contiguous) are not copied
   either: the program (``_kmajor.InPlaceProgram``) passes their transposed views to a
   kernel compiled for that layout (A's tiles M-major for the transposed-A form, B's
   K-major). On an H200 (2026-11-27) this ran 1.17x as fast as BCOPY=1 at 4096³, so an
   untuned 16-bit product takes it (``shape_params``); BCOPY=1 stays the rung's default,
   which TF32 needs.
3. Ordering, one barrier per k-tile: wait for this thread's copies of tile kt,
   ``fence.proxy.async`` (generic-proxy writes become visible to the tensor core), barrier,
   ``wgmma.fence``, four ``mma_async`` on stage kt, commit; then the copies of tile
   kt + STAGES - 2, then ``wgmma.wait_group 1``: tile kt-1's product has retired, tile kt's
   may still run. The stage the copies overwrite last held tile kt - 2, whose product every
   warpgroup retired (wait_group 1 in iteration kt-1) before it passed this iteration's
   barrier, so no in-flight wgmma can read a stage while it is rewritten.

``precision="3xtf32"`` (PASSES=3) splits each float32 operand into a TF32 big part and a
TF32 small part and issues small × big, big × small and big × big per k step: float32-like
accuracy at three times the tensor work. The split is done once per value, in shared
memory, by the thread that copied or stored it (the big part in place, the small part in
one of SMALL_SLOTS slots after the ring, which rotate per k-tile; see ``_rounding``).

float16 and bfloat16 operands use the 16-bit instructions with float32 accumulation; the
result is 16-bit like the operands or, with ``dtype=np.float32``, the float32 sums. Any M,
N, K, batch and strides, alpha/beta, as rung mma.

On hardware (H100 and H200, 2026-11-26): correct on every test shape in every precision
(the descriptors and the swizzle read as the simulator's stand-in reads them), so
``kernel="auto"`` runs it for tensor-core requests on compute capability 9.0 and rung mma
elsewhere.

What it should buy (a prediction): mma.sync keeps a warp issuing fragment loads and HMMA
(21-45 % of its hot loop), and on an H100 cannot reach more than about half of the tensor
cores' peak; wgmma at 128×128 tiles with the loads overlapped should reach 60-75 % of
cuBLAS in TF32 and BF16 at 4096³, which uses the same instruction. Measured at 4096³ on an
H200 with B transposed through registers (BCOPY=0, STAGES=4): TF32 106 TFLOP/s (26 % of
cuBLAS TF32), BF16 269 (34 %): 45 % of the stalls were waits for B's loads, issued only
one k-tile ahead. With B copied K-major before the kernel (BCOPY=1), rounding in those
copies and a 6-deep ring, the copies included: TF32 280 (70 % of cuBLAS's 401, the same
error), FP16 474 (63 %), BF16 489 (62 %), 3×TF32 88.4 (1.72× SGEMM, a quarter of its
error). With 128x256 tiles, which an untuned call takes for products of at least two
blocks per SM (``shape_params``): TF32 315 (79 %), FP16 546 (72 %), BF16 562 (71 %);
with 16-bit B read as it lies (BCOPY=2, what an untuned 16-bit product runs since
2026-11-27) FP16 640 (84 %), BF16 659 (83 %) (docs/tensor-cores.md, "On hardware").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import access_ops, load_at
from tilegemm.kernels.cuda._codegen import compile_source, fill
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda._kmajor import InPlaceProgram, KMajorBProgram
from tilegemm.kernels.cuda._tensorcore import tensorcore_ops
from tilegemm.kernels.cuda._wgmma import shared_alignment, wgmma_ops
from tilegemm.kernels.cuda.k10_mma import (
    _fast_copies,
    _put,
    _swz_fn,
    loader_call,
    operand_round,
)
from tilegemm.launch import GROUP_M, ceil_div, flat_tile_grid
from tilegemm.registry import Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)

ROW = 128  # bytes of K per tile row: the 128-byte swizzle's width
ATOM = 8 * ROW  # bytes of one 8-row swizzle atom (the descriptors' stride, SBO)
KSTEP = 32  # bytes of K one wgmma reads: k8 TF32, k16 16-bit
SMEM_SM90 = 227 * 1024  # dynamic shared memory an sm_90 block may opt in to
PRECISIONS: dict[str, int] = {"tf32": 1, "3xtf32": 3}
# 3×TF32: the small parts of a tile live in one of SMALL_SLOTS slots after the ring, in turn
# (see _rounding): a slot written in iteration kt last held tile kt - 3's, whose products
# every warpgroup retired before the barrier of iteration kt - 1.
SMALL_SLOTS = 3
# 3×TF32's partial sums, added to the result every PROMOTE k-tiles (see _promotion). Measured
# at 4096³ on an H200 against cuBLAS SGEMM (51.4 TFLOP/s, max error 3.3e-7 scaled by
# max |A|·|B|): the tensor core accumulating all of K, 86.5 TFLOP/s and 3.9e-6;
# PROMOTE=1 80.5 and 8.7e-8; 2 82.4 and 8.7e-8; 4 83.6 and 1.3e-7.
PROMOTE_DEFAULT = 2
# The deepest ring STAGES=0 picks. Measured at 4096³ on an H200 with BCOPY=1 (TFLOP/s, the
# copies before the kernel included, STAGES 4 / 5 / 6): TF32 225 / 269 / 277, BF16
# 422 / 486 / 491, FP16 415 / 479 / 484. With BCOPY=0 a deeper ring was slower (TF32 107
# at 4, 104 at 6; BF16 266, 237: its B loads, one k-tile ahead, go no further ahead), so
# BCOPY=0 runs best with STAGES=4 given.
AUTO_STAGES = 6


def _threads(p: Mapping[str, int]) -> int:
    return 2 * p["BM"]  # one warpgroup (128 threads) per 64 rows


def _smem(p: Mapping[str, int], itemsize: int = 4) -> int:
    """Bytes of dynamic shared memory: STAGES A tiles (BM rows) and B tiles (BN rows), each
    row 128 bytes of K whatever the dtype; for 3×TF32 also SMALL_SLOTS slots of one A and
    one B tile for the small parts."""
    slots = SMALL_SLOTS if itemsize == 4 and p.get("PASSES", 1) == 3 else 0
    return (stages(p) + slots) * (p["BM"] + p["BN"]) * ROW


def stages(p: Mapping[str, int]) -> int:
    """The ring's depth: STAGES, or for STAGES=0 the deepest ring of at most AUTO_STAGES
    that fits an sm_90 block's shared memory."""
    if p.get("STAGES", 0):
        return p["STAGES"]
    return next((d for d in range(AUTO_STAGES, 3, -1)
                 if _smem({**p, "STAGES": d}) <= SMEM_SM90), 3)


# kernel="auto" with nothing tuned: the larger tiles a product gets when it has enough of
# them (see shape_params). Measured on an H200 (2026-11-26; TFLOP/s with the copies before
# the kernel, 128x128 / 128x256 / 256x128, the ring 6 / 4 / 4 deep): 4096³ TF32 279 / 312
# / 312 (kernel alone 314 / 367 / 363), BF16 496 / 563 / 560; 8192³ TF32 302 / 356 / 345,
# BF16 590 / 668 / 661. Where the larger tiles make under two waves they lose or tie:
# 1536x1536x4096 TF32 100 / 69 / 79 (72 blocks of 128x256 on 132 SMs), 8192x384x4096 TF32
# 136 / 83 / 100, 2048³ BF16 127 / 112 / 126, 1024x4096x4096 TF32 114 / 122 / 118 (one
# wave). A 64-row slice of a 256-column tile reads 64 + 256 rows of shared memory per
# 64 × 256 products, against 64 + 128 per 64 × 128: 17 % more products per shared byte.
BIG_TILES = ({"BM": 128, "BN": 256}, {"BM": 256, "BN": 128})
BIG_TILE_WAVES = 2  # the larger tiles only where they make at least this many blocks per SM


# An untuned 16-bit product reads B N-major by the wgmma's transposed-B form (BCOPY=2)
# instead of copying it K-major before the kernel (BCOPY=1, the rung's default, which TF32
# needs). Measured on an H200 (2026-11-27, 4096³, the two alternating, twice each; share of
# cuBLAS at the same precision): 128x256 tiles FP16 0.83-0.84 against 0.71, BF16
# 0.82-0.83 against 0.70; 128x128 FP16 0.72 against 0.62, BF16 0.69-0.70 against 0.60-0.61.
# The kernel reading N-major tiles was no slower: the time saved is the copy's (and its
# launch).
SIXTEEN_BIT_BCOPY = 2


def shape_params(p: Mapping[str, int], prob: Any, target: Any
                 ) -> tuple[dict[str, int], str] | None:
    """The parameters for one product on one device, from the defaults ``p``: 16-bit
    operands read as they lie (``SIXTEEN_BIT_BCOPY``) where B's rows lie on 16 bytes, and
    the block tile (:func:`_tile`); None where neither changes ``p``."""
    q, why = dict(p), []
    isz = np.dtype(prob.dtype).itemsize
    # Only where B's rows lie on 16 bytes (N a multiple of 8): BCOPY=2 reads rows off 16
    # bytes element by element on every k-tile, where BCOPY=1's copy pads them once.
    if isz == 2 and q.get("BCOPY", 1) == 1 and prob.n * isz % 16 == 0:
        q["BCOPY"] = SIXTEEN_BIT_BCOPY
        why.append("16-bit B read N-major, not copied (BCOPY=2)")
    tile = _tile(q, prob, target)
    if tile is not None:
        q, reason = tile
        why.append(reason)
    return (q, "; ".join(why)) if why else None


def _tile(p: Mapping[str, int], prob: Any, target: Any
          ) -> tuple[dict[str, int], str] | None:
    """The block tile for one product on one device, from the defaults ``p``: one of
    ``BIG_TILES`` when the product has at least ``BIG_TILE_WAVES`` × SMs blocks of it,
    else None (keep ``p``).

    Each SM runs one block at a time (the ring takes most of its shared memory). A
    block of a larger tile does twice the work of a 128x128 one at about 1.17x its rate
    once every SM has several blocks to run (4096³ on 132 SMs: 512 blocks), but with
    fewer blocks than two per SM the larger tiles measured slower or no faster (see
    ``BIG_TILES``). Of the two larger tiles, the one with fewer blocks (less padding
    past the edges: 256x128 for 32768x384) wins, 128x256 on a tie. 3xTF32 keeps 128x128:
    its small parts' slots leave no room for a ring of larger tiles. Reads the SM count
    from ``target.compute_units``; a device that does not report it keeps ``p``.
    """
    sms = int(getattr(target, "compute_units", 0) or 0)
    m, n, batch = prob.m, prob.n, prob.batch
    if sms <= 0 or (p["BM"], p["BN"]) != (128, 128) or m * n * prob.k * batch == 0:
        return None

    def tiles(q: Mapping[str, int]) -> int:
        return ceil_div(m, q["BM"]) * ceil_div(n, q["BN"]) * batch

    # a ring of 3 larger tiles ran at 0.6 of cuBLAS where 4 ran at 0.9 (TF32, BF16)
    fits = [q for q in ({**p, **big} for big in BIG_TILES)
            if stages(q) >= 4 and _smem(q) <= SMEM_SM90 and tiles(q) >= BIG_TILE_WAVES * sms]
    if not fits:
        return None
    best = min(fits, key=tiles)
    return best, (f"{tiles(best)} tiles of {best['BM']}x{best['BN']} for {sms} SMs "
                  f"({tiles(p)} of {p['BM']}x{p['BN']})")


def _dtype_check(p: Mapping[str, int], dtype: np.dtype) -> str | None:
    if np.dtype(dtype).itemsize == 4 and p.get("BCOPY", 1) == 2:
        return ("BCOPY=2 (B read N-major by the wgmma's transposed form) is for float16 and "
                "bfloat16 operands: PTX has no transposed form for TF32, whose B must be "
                "K-major (BCOPY=0 or 1)")
    if np.dtype(dtype).itemsize == 2 and p.get("ROUND", 1) != 1:
        return (f"{np.dtype(dtype).name} operands are what the wgmma reads already; ROUND=0 "
                "is TF32's choice not to round float32 operands (precision='tf32')")
    if np.dtype(dtype).itemsize == 2 and p.get("PASSES", 1) != 1:
        # the big/small split is of float32 operands into TF32 parts; 16-bit operands are
        # what the wgmma reads already, and the kernel ran one pass regardless
        return (f"{np.dtype(dtype).name} takes one wgmma per k step (PASSES=1); PASSES=3 is "
                "the 3xTF32 split of float32 operands (precision='3xtf32')")
    return None


def build(p: Mapping[str, int], dtype: np.dtype, ahead: int | None = None) -> CudaProgram:
    """The program; ``ahead`` (tiles copied ahead of the one multiplied, STAGES - 2 unless
    given) exists for the test that shows the simulator catching a stage rewritten while a
    product still reads it (ahead = STAGES - 1)."""
    name = np.dtype(dtype).name
    kernel = _generate(p, name, ahead)
    arg_types = ("int16", "float32") if name == "bfloat16" else None
    how = dict(block=(_threads(p), 1, 1), grid=flat_tile_grid(p["BM"], p["BN"]),
               arg_types=arg_types, dynamic_smem=_smem(p, np.dtype(dtype).itemsize))
    if _b_kmajor(p):  # B copied K-major (and TF32 operands rounded) before the kernel
        return KMajorBProgram(kernel, **how, round_tf32=_rounds(p, name))
    if _b_mn(p):  # A and B read as they lie, each in either layout (16-bit)
        def variant(a_mn: bool, b_kmajor: bool) -> Any:
            return _generate({**p, "BCOPY": 1 if b_kmajor else 2}, name, ahead, a_mn)

        return InPlaceProgram(kernel, **how, variant=variant)
    return CudaProgram(kernel, **how)


def _b_kmajor(p: Mapping[str, int]) -> bool:
    """Whether B reaches the kernel K-major (BCOPY=1, the default), copied like A."""
    return p.get("BCOPY", 1) == 1


def _b_mn(p: Mapping[str, int]) -> bool:
    """Whether B's tiles stay N-major (BCOPY=2, 16-bit operands): copied as they lie in B
    (K×N, N contiguous) by ``cp.async``, and read by the wgmma's transposed-B form."""
    return p.get("BCOPY", 1) == 2


def _rounds(p: Mapping[str, int], dtype: str) -> bool:
    """Whether TF32 operands are rounded to nearest (PASSES=1 with ROUND=1): in shared
    memory by the kernel (BCOPY=0), or by the copies made before it (BCOPY=1)."""
    return dtype == "float32" and p.get("PASSES", 1) == 1 and bool(p.get("ROUND", 1))


def _generate(p: Mapping[str, int], dtype: str, ahead: int | None = None,
              a_mn: bool = False) -> Any:
    """The kernel for parameters ``p``. ``a_mn`` (16-bit operands only): A is given as a
    (batch, K, M) view with M contiguous (the transpose of a C-ordered array, as in ``x.T @
    y``), its tiles copied M-major as they lie and read by the wgmma's transposed-A form."""
    global cuda
    from numba import cuda

    BM, BN, STAGES = p["BM"], p["BN"], stages(p)
    tf32 = dtype == "float32"
    split = tf32 and p.get("PASSES", 1) == 3  # 3×TF32
    kmajor = _b_kmajor(p)  # B arrives K-major (see _kmajor), copied like A
    mn = _b_mn(p)  # B's tiles copied N-major, read transposed by the wgmma
    if a_mn and (dtype == "float32" or not (mn or kmajor)):
        raise ValueError("an M-major A is read in place by BCOPY=2's 16-bit kernels only")
    # TF32 operands rounded to nearest in shared memory (ROUND=1 with BCOPY=0; with BCOPY=1
    # they arrive rounded), or left as float32 for the tensor core to truncate (ROUND=0);
    # ``raw``: B stored as loaded (3×TF32 splits it)
    rounds = _rounds(p, dtype) and not kmajor
    raw = tf32 and not rounds
    ISZ = 4 if tf32 else 2
    VW = 16 // ISZ  # elements per 16-byte chunk
    BK = ROW // ISZ
    NT = _threads(p)
    P = STAGES - 2 if ahead is None else ahead  # tiles copied ahead of the one multiplied
    A_CHUNKS, B_CHUNKS = BM * (ROW // 16), BN * (ROW // 16)
    load, store, _, _, _, _, address, _ = access_ops()
    tc, wg = tensorcore_ops(), wgmma_ops()
    ns: dict[str, Any] = dict(
        cuda=cuda, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=p["GROUP_M"], NT=NT, VW=VW,
        ISZ=ISZ, P=P, ACH=ROW // 16, A_CHUNKS=A_CHUNKS, B_CHUNKS=B_CHUNKS,
        A_ROUNDS=ceil_div(A_CHUNKS, NT), B_ROUNDS=ceil_div(B_CHUNKS, NT),
        SA=BM * ROW, SB=BN * ROW, SA16=BM * ROW // 16, SB16=BN * ROW // 16,
        B_BYTES=STAGES * BM * ROW, A_OFF=0, A_TILE=BM * BK, A_W=BK, WG_A=64 * ROW, ATOM=ATOM,
        ALIGN=shared_alignment(ATOM), load=load, store=store, address=address,
        f32=np.float32, u64=np.uint64, u32=np.uint32, i64=np.int64,
        elt={"float32": np.float32, "float16": np.float16, "bfloat16": np.int16}[dtype],
        cp16=tc.cp_async16, cp4=tc.cp_async4, commit_cp=tc.cp_commit,
        wait_ring=tc.cp_wait(max(P - 1, 0)), wait_all=tc.cp_wait(0), to_tf32=tc.to_tf32,
        round_tf32=tc.round_tf32_at, fence=wg.fence, commit=wg.commit, wait0=wg.wait(0),
        wait1=wg.wait(1), fence_proxy_async=wg.fence_proxy_async,
        smem_desc=wg.smem_desc_128b, smem_desc_mn=wg.smem_desc_128b_mn, sts4=wg.sts4_at,
        pack=wg.pack_halves,
        load_at=load_at(), cp16_ptr=tc.cp_async16_ptr,
        mma=(wg.mma_tf32(BN) if tf32 else
             {"float16": wg.mma_f16, "bfloat16": wg.mma_bf16}[dtype](BN, b_mn=mn, a_mn=a_mn)),
        SMALL=STAGES * (BM + BN) * ROW, SLOT=(BM + BN) * ROW, SMALL_SLOTS=SMALL_SLOTS,
        split_tf32_at=tc.split_tf32_at,
        # B's tiles as operand_round copies them when B arrives K-major: BN rows of K
        B_OFF=STAGES * BM * BK, B_TILE=BN * BK, B_W=BK, BCH=ROW // 16,
    )
    # M- or N-major tiles: BK rows of BM or BN values in panels of 64 (mn_swizzle_offset),
    # PANEL bytes apart (A: one panel per warpgroup)
    ns.update(PANEL=BK * ROW, A_PANEL=BK * ROW // ISZ, B_PANEL=BK * ROW // ISZ)  # elements
    if mn:
        ns["BCH"] = BN // VW
    if a_mn:
        ns["ACH"] = BM // VW
    # A's tile: mma's row-major [BM][BK] tile with 8 chunks a row, swizzled by r % 8: the
    # 128-byte swizzle layout (see the module docstring)
    ns["a_swz_of"] = ns["b_swz_of"] = _swz_fn("r % 8", ns)
    ns["put"] = _put()
    ns["load_stage"] = loader_call(compile_source(_loader(tf32, VW, raw, kmajor, mn, a_mn),
                                                  "load_stage", dict(ns)), STAGES)

    # Per-thread copy bases: A's chunks (mma's interior copies: the byte offset ``da`` in
    # a stage, the global address ``oa`` bumped per k-tile) and B's (``db``, ``ob``)
    if a_mn:
        a = _fast_mn("A", A_CHUNKS, NT)
        bases, a_copies, offsets, bumps = a["BASES"], a["STORES"], a["OFFSETS"], a["BUMP"]
    else:
        (bases, a_copies), offsets, bumps = _fast_copies({"BM": BM, "BK": BK}, NT, ROW // 16,
                                                         0, VW)
    if kmajor:
        b = _fast_b_kmajor(B_CHUNKS, NT)
    elif mn:
        b = _fast_mn("B", B_CHUNKS, NT)
    else:
        b = _fast_b(B_CHUNKS, NT, VW, tf32, raw)
    bases, offsets, bumps = bases + b["BASES"], offsets + b["OFFSETS"], bumps + b["BUMP"]
    round_bases, rounding = _rounding(A_CHUNKS, B_CHUNKS, NT, split or rounds, split)
    bases += round_bases
    # 3xTF32 with PROMOTE > 0: the tensor core sums into a partial ``t`` that starts afresh
    # (scale-d 0) every PROMOTE k-tiles and is then added to ``acc`` by the threads
    # (see ``_promotion``); otherwise the tensor core accumulates into ``acc`` itself.
    promote = p.get("PROMOTE", PROMOTE_DEFAULT) if split else 0
    d_acc = "t" if promote else "acc"
    steps = []
    for s in range(ROW // KSTEP):
        # a k step is 32 bytes along a K-major tile's rows, or two atoms of 8 k rows
        # further into each panel of an M- or N-major one
        d = f" + u64({s * KSTEP // 16})"
        d_mn = f" + u64({s * 2 * ATOM // 16})"
        da, db = (d_mn if a_mn else d), (d_mn if mn else d)
        if split:  # the small products first, then big x big (CUTLASS's order)
            steps += [f"{d_acc} = mma({d_acc}, dsas{d}, dsb{d}, 1)",
                      f"{d_acc} = mma({d_acc}, dsa{d}, dsbs{d}, 1)"]
        steps.append(f"{d_acc} = mma({d_acc}, dsa{da}, dsb{db}, 1)")
    if promote:
        steps[0] = steps[0].replace(", 1)", ", sd)")  # a fresh partial after a promotion
        steps.append("sd = 1")
    slot_init = ["ss = 0  # byte offset of this k-tile's slot of small parts"] if split else []
    # the next k-tile's stages (A's and B's ring, the copies' stage, 3×TF32's slot)
    next_stage = ["rsa = rsa + SA if rsa < (STAGES - 1) * SA else 0",
                  "rsb = rsb + SB if rsb < (STAGES - 1) * SB else 0",
                  "ws = ws + 1 if ws < STAGES - 1 else 0"]
    if split:
        next_stage.append("ss = ss + SLOT if ss < (SMALL_SLOTS - 1) * SLOT else 0")
    small_desc = (["dsas = dsas0 + u64(ss >> 4)", "dsbs = dsbs0 + u64(ss >> 4)"]
                  if split else [])
    # accumulators 2i and 2i+1 are adjacent columns of one row: one put stores both
    epilogue = ["er = row0 + wg * 64 + 16 * w + g", "ec = col0 + 2 * q"]
    for i in range(0, BN // 2, 2):
        epilogue.append(f"put(C, z, er + {8 * ((i // 2) % 2)}, ec + {8 * (i // 4)}, "
                        f"acc[{i}], acc[{i + 1}], alpha, beta, m, n)")
    # eight-value tuples joined: a long tuple display becomes a list-to-tuple in CPython
    # 3.11's bytecode, which numba-cuda's bytecode reader refuses (BN/2 is a multiple of 8)
    zeros = " + ".join(["(" + ", ".join(["zf"] * 8) + ")"] * (BN // 16))
    partial_init, retire, retire_all = _promotion(promote, BN)
    head = fill(ITERATION_HEAD, {"ROUND": rounding or ["pass"], "STEPS": steps,
                                 "SMALL_DESC": small_desc})
    small_bases = (["dsas0 = smem_desc(As, SMALL + wg * WG_A, ATOM)",
                    "dsbs0 = smem_desc(As, SMALL + SA, ATOM)"] if split else [])
    source = fill(KERNEL, {"BASES": bases + small_bases, "OFFSETS": offsets, "BUMP": bumps,
                           "FAST_COPIES": a_copies + b["STORES"], "EPILOGUE": epilogue,
                           "HEAD": head.splitlines(), "B_INIT": b["INIT"],
                           "B_LOADS": b["LOADS"] or ["pass"],
                           "B_PRELOAD": (b["PRELOAD"] + b["BUMP"]) if b["PRELOAD"] else ["pass"],
                           "VEC": _vec(kmajor or mn),
                           "DIMS": ["m, n, k_len = C.shape[1], C.shape[2], "
                                    f"A.shape[{1 if a_mn else 2}]"],
                           "A_DESC": [("dsa0 = smem_desc_mn(As, wg * WG_A, WG_A, ATOM)" if a_mn
                                       else "dsa0 = smem_desc(As, wg * WG_A, ATOM)")
                                      + "  # this warpgroup's 64 rows of A, stage 0"],
                           "B_DESC": [("dsb0 = smem_desc_mn(As, B_BYTES, PANEL, ATOM)" if mn
                                       else "dsb0 = smem_desc(As, B_BYTES, ATOM)")],
                           "SLOT_INIT": slot_init, "NEXT_STAGE": next_stage,
                           "PARTIAL_INIT": partial_init, "RETIRE": retire,
                           "RETIRE_ALL": retire_all})
    source = source.replace("#@ZEROS", zeros)
    name = (f"wgmma_{dtype}{'_3x' if split else ''}{f'_p{promote}' if promote else ''}"
            f"{'_bt' if kmajor else ''}{'_bn' if mn else ''}{'_am' if a_mn else ''}"
            f"{'_trunc' if tf32 and not p.get('ROUND', 1) else ''}"
            "_kernel")
    return kernel_jit(NT, 1)(compile_source(source.replace("KERNEL_NAME", name), name, ns))


def _vec(b_copied: bool) -> list[str]:
    """Kernel lines setting ``a_vec`` and ``b_vec``: whether every 16-byte chunk of the
    operand's tiles starts on 16 bytes, so that whole-chunk ``cp.async`` copies apply
    (``b_copied``: B's tiles are copied so, K-major or N-major). A row's length need not be
    whole chunks (a copy's rows are padded to 16 bytes): the checked copies zero-fill a
    chunk past the row's end. B transposed through registers is read one value at a time,
    so only A's test counts."""
    def aligned(x: str) -> str:
        return (f"(address({x}) % 16 == 0 and {x}.strides[2] == ISZ "
                f"and {x}.strides[1] % 16 == 0 and {x}.strides[0] % 16 == 0)")
    return [f"a_vec = {aligned('A')}",
            f"b_vec = {aligned('B') if b_copied else 'a_vec'}"]


def _promotion(promote: int, bn: int) -> tuple[list[str], list[str], list[str]]:
    """(per output tile, end of each k-tile, after the last) lines for 3×TF32's promotion
    of partial sums; ``promote`` = 0 (TF32 and 16-bit operands): the tensor core
    accumulates into ``acc`` and each k-tile ends by waiting for the previous one's
    products (``wait1``).

    Why: the tensor core adds its products into the accumulator with truncation, not
    rounding to nearest. Accumulating a whole K into one register that way, 3×TF32's error
    on an H100 and an H200 grew with K to 12× SGEMM's at 4096³ (3.9e-6 against 3.3e-7,
    scaled by max |A|·|B|): the small parts' correction was lost in the big sum's
    truncation. With ``promote`` > 0 the products of ``promote`` k-tiles go into a fresh
    partial ``t`` (the first wgmma after a promotion has scale-d 0) and the threads add it
    to ``acc`` in float32, rounded to nearest: the truncation then applies to small partial sums
    only. It costs BN/2 float32 registers and, once per ``promote`` k-tiles, a wait for
    the products in flight (``wait0``) and BN/2 additions a thread."""
    if not promote:
        return [], ["acc = wait1(acc)  # tile kt-1's product has retired; kt's may run on"], [
            "acc = wait0(acc)"]
    add = " + ".join("(" + ", ".join(f"acc[{i}] + t[{i}]" for i in range(j, j + 8)) + ")"
                     for j in range(0, bn // 2, 8))
    retire = [f"if (kt + 1) & {promote - 1} == 0:  # promote: t's sums into acc",
              "    t = wait0(t)", f"    acc = {add}", "    sd = 0",
              "else:", "    t = wait1(t)  # tile kt-1's product has retired; kt's may run on"]
    return ["t = acc", "sd = 0  # the next wgmma starts a fresh partial"], retire, [
        "t = wait0(t)", "if sd == 1:  # sums not yet promoted", f"    acc = {add}"]


def _b_parts() -> dict[str, list[str]]:
    """The kernel parts a B copier fills (see :func:`_fast_b`), empty."""
    return {k: [] for k in ("BASES", "INIT", "OFFSETS", "LOADS", "PRELOAD", "STORES", "BUMP")}


def _fast_b(chunks: int, nt: int, vw: int, tf32: bool, raw: bool) -> dict[str, list[str]]:
    """B's interior copies, one k-tile ahead through registers. Chunk ``v = tid + rnd * NT``
    is column ``bn = v % BN`` and k ``bc * VW`` … of the tile: VW loads without bounds tests
    down the column from one offset (``ob``, bumped BK rows per k-tile), rounded or packed
    in registers (``y``) as loaded, and one 16-byte store at the fixed, swizzled byte offset
    ``db`` of the write stage. The loads of tile kt+STAGES-1 are issued in iteration kt,
    after its copies, and stored in iteration kt+1: their latency overlaps a whole k-tile
    (the wait, the barrier, the next products) instead of stalling the copies.

    Returns the kernel's parts: BASES (per thread), INIT (typed zero registers), OFFSETS
    (at the first interior k-tile), LOADS (of the tile at ``kf + BK``), PRELOAD (of the tile
    at ``kf``, before the loop), STORES, BUMP."""
    parts = _b_parts()
    for rnd in range(ceil_div(chunks, nt)):
        v = f"(tid + {rnd * nt})"
        parts["BASES"] += [f"bn{rnd} = {v} % BN", f"bc{rnd} = {v} // BN",
                           f"db{rnd} = B_BYTES + bn{rnd} * 128 + ((bc{rnd} ^ (bn{rnd} % 8)) * 16)"]
        regs = [f"y{rnd}_{q}" for q in range(vw)]  # the loaded values, as loaded
        parts["INIT"] += [f"{r} = zero_b" for r in regs]
        parts["OFFSETS"].append(f"ob{rnd} = zb * sb0 + (kf + bc{rnd} * VW) * sb1 + col0 + bn{rnd}")
        parts["BUMP"].append(f"ob{rnd} += BK * sb1")

        def loads(k: str, rnd: int = rnd, regs: list[str] = regs) -> list[str]:
            lines = [f"pb = ob{rnd}"]
            for q in range(vw):
                lines.append(f"{regs[q]} = load_at(B, (zb, {k} + bc{rnd} * VW + {q}, "
                             f"col0 + bn{rnd}), pb)")
                if q < vw - 1:
                    lines.append("pb += sb1")
            return lines

        def guard(lines: list[str], rnd: int = rnd) -> list[str]:
            return _guarded(lines, rnd, nt, chunks)

        parts["LOADS"] += guard(loads("kf + BK"))
        parts["PRELOAD"] += guard(loads("kf"))
        # rounded or packed only here, so the loads are first used one k-tile later; ``raw``
        # stored as loaded (3×TF32: split by _rounding in the iteration that reads the tile)
        if raw:
            vals = ", ".join(regs)
        elif tf32:
            vals = ", ".join(f"to_tf32({r})" for r in regs)
        else:
            vals = ", ".join(f"pack({regs[2 * j]}, {regs[2 * j + 1]})" for j in range(vw // 2))
        parts["STORES"] += guard([f"sts4(As, wsb + db{rnd}, {vals})"])
    return parts


def _fast_b_kmajor(chunks: int, nt: int) -> dict[str, list[str]]:
    """B's interior copies when B arrives K-major (batch, N, K): A's, with rows of B for
    rows of A. Chunk ``v = tid + rnd * NT`` is row ``br = v // 8`` (column col0 + br of the
    product) and k chunk ``bc = v % 8`` of the tile, at the fixed, swizzled byte offset
    ``db`` (from the ring's start, B_BYTES included) of the write stage; its global address
    ``ob`` moves BK values along K per k-tile. The same parts as :func:`_fast_b`, with no
    loads into registers."""
    parts = _b_parts()
    for rnd in range(ceil_div(chunks, nt)):
        v = f"(tid + {rnd * nt})"
        parts["BASES"] += [f"br{rnd} = {v} // BCH", f"bc{rnd} = {v} % BCH",
                           f"db{rnd} = B_BYTES + br{rnd} * 128 + ((bc{rnd} ^ (br{rnd} % 8)) * 16)"]
        parts["OFFSETS"].append(f"ob{rnd} = address(B) + (zb * sb0 + (col0 + br{rnd}) * sb1 "
                                f"+ kf + bc{rnd} * VW) * ISZ")
        parts["BUMP"].append(f"ob{rnd} += BK * ISZ")
        parts["STORES"] += _guarded([f"cp16_ptr(As, wsb + db{rnd}, B, (zb, col0 + br{rnd}, "
                                     f"kf + bc{rnd} * VW), ob{rnd}, 16)"], rnd, nt, chunks)
    return parts


def _fast_mn(op: str, chunks: int, nt: int) -> dict[str, list[str]]:
    """The interior copies of an operand whose tiles stay M- or N-major (``op`` "B": B (K×N)
    with BCOPY=2; "A": A given as its (batch, K, M) transpose): chunk ``v = tid + rnd * NT``
    is k row ``{o}k = v // {op}CH`` and values ``{o}q * VW`` … of the tile's M or N (a warp
    copies consecutive 16 bytes of the operand's rows: coalesced), at the fixed, swizzled
    byte offset ``d{o}`` of the write stage (panel ``{o}q // 8``, PANEL bytes apart; chunk
    ``{o}q % 8`` of row ``{o}k`` swizzled by ``{o}k % 8``: :func:`mn_swizzle_offset`); its
    global address ``o{o}`` moves BK rows per k-tile. The same parts as :func:`_fast_b`,
    with no loads into registers."""
    o = op.lower()
    z, first, ring = ("zb", "col0", "B_BYTES + ") if op == "B" else ("za", "row0", "")
    parts = _b_parts()
    parts["BASES"].append(f"{o}step = BK * s{o}1 * ISZ  # bytes of BK rows of {op}")
    for rnd in range(ceil_div(chunks, nt)):
        v = f"(tid + {rnd * nt})"
        k, q = f"{o}k{rnd}", f"{o}q{rnd}"
        parts["BASES"] += [f"{k} = {v} // {op}CH", f"{q} = {v} % {op}CH",
                           f"d{o}{rnd} = {ring}({q} // 8) * PANEL + {k} * 128 "
                           f"+ ((({q} % 8) ^ ({k} % 8)) * 16)"]
        parts["OFFSETS"].append(f"o{o}{rnd} = address({op}) + ({z} * s{o}0 + (kf + {k}) * "
                                f"s{o}1 + {first} + {q} * VW) * ISZ")
        parts["BUMP"].append(f"o{o}{rnd} += {o}step")
        parts["STORES"] += _guarded([f"cp16_ptr(As, ws{o} + d{o}{rnd}, {op}, ({z}, kf + {k}, "
                                     f"{first} + {q} * VW), o{o}{rnd}, 16)"], rnd, nt, chunks)
    return parts


def _guarded(lines: list[str], rnd: int, nt: int, chunks: int) -> list[str]:
    """``lines`` for chunk ``tid + rnd * nt`` of ``chunks``: as they are when every thread
    has one in this round, else under the test that this thread does."""
    return lines if (rnd + 1) * nt <= chunks else [
        f"if tid < {chunks - rnd * nt}:", *("    " + x for x in lines)]


def _rounding(a_chunks: int, b_chunks: int, nt: int, convert: bool,
              split: bool) -> tuple[list[str], list[str]]:
    """(per-thread bases, lines) converting the tile about to be read (``convert``:
    rounding or splitting TF32 operands; nothing for 16-bit ones, for ROUND=0, or for TF32
    operands the copies before the kernel rounded (BCOPY=1)), run by each thread
    between its own copies' wait and the barrier that publishes the stage, on the chunks it
    copied or stored itself (the same chunks on every path, so no other thread's writes are
    involved). TF32: A's chunks are rounded in place (B's were rounded as they were stored).
    3×TF32: A's and B's chunks (B's stored unrounded) are split, the big part in place and
    the small part at the same place in slot ``ss`` (A's tile, then B's, laid out like a
    stage): the four small-part descriptors of a k step then read it like the big ones."""
    bases: list[str] = []
    lines: list[str] = []
    if not convert:
        return bases, lines

    def guard(line: str, rnd: int, chunks: int) -> list[str]:
        return _guarded([line], rnd, nt, chunks)

    for rnd in range(ceil_div(a_chunks, nt)):
        if split:
            bases.append(f"sma{rnd} = SMALL + da{rnd}")
            lines += guard(f"split_tf32_at(As, rsa + da{rnd}, ss + sma{rnd})", rnd, a_chunks)
        else:
            lines += guard(f"round_tf32(As, rsa + da{rnd})", rnd, a_chunks)
    if split:  # B's chunk offsets ``db`` include the ring's start B_BYTES
        for rnd in range(ceil_div(b_chunks, nt)):
            bases.append(f"smb{rnd} = SMALL + SA + db{rnd} - B_BYTES")
            lines += guard(f"split_tf32_at(As, rsb + db{rnd}, ss + smb{rnd})", rnd, b_chunks)
    return bases, lines


def _loader(tf32: bool, vw: int, raw: bool = False, kmajor: bool = False,
            mn: bool = False, a_mn: bool = False) -> str:
    """``load_stage``: one k-tile into stage ``s``, with bounds checks. A by mma's checked
    ``cp.async`` copies (:func:`operand_round`); B transposed through registers: chunk ``v``
    of the tile is column ``nn = v % BN`` of B and k ``c * VW`` … ``c * VW + VW - 1``,
    zero past the edges, stored as row ``nn`` of the K-major tile, chunk ``c ^ (nn % 8)``;
    or, ``kmajor``, B (batch, N, K) by the same copies as A. ``raw``: TF32 B stored
    unrounded (split by the storing thread when the tile is read, for 3×TF32). ``mn``: B's
    tile N-major, BK rows of B (K×N) copied as they lie, in panels of 64 columns;
    ``a_mn``: A's M-major the same way, A given as its (batch, K, M) transpose."""
    a_round = (operand_round("A", "k0", "row0", "k_len", "m", "za", tf32, panels=True)
               if a_mn else operand_round("A", "row0", "k0", "m", "k_len", "za", tf32))
    if mn:
        return (LOADER_HEAD + a_round + "\n"
                + operand_round("B", "k0", "col0", "k_len", "n", "zb", tf32, panels=True)
                + "\n")
    if kmajor:
        return (LOADER_HEAD + a_round + "\n"
                + operand_round("B", "col0", "k0", "n", "k_len", "zb", tf32) + "\n")
    values = []
    for q in range(vw):
        values += [f"x{q} = zero_b", f"if gc < n and kb + {q} < k_len:",
                   f"    x{q} = load(B, (zb, kb + {q}, gc))"]
    if raw:
        store_line = "sts4(As, sx, " + ", ".join(f"x{q}" for q in range(vw)) + ")"
    elif tf32:
        store_line = ("sts4(As, sx, " + ", ".join(f"to_tf32(x{q})" for q in range(vw)) + ")")
    else:
        store_line = ("sts4(As, sx, " + ", ".join(f"pack(x{2 * h}, x{2 * h + 1})"
                                                  for h in range(vw // 2)) + ")")
    body = "\n".join("            " + line for line in values + [store_line])
    return (LOADER_HEAD + a_round + "\n" + B_ROUND.replace("#@B_VALUES", body.lstrip()) + "\n")


LOADER_HEAD = """
@cuda.jit(device=True, inline=True)
def load_stage(As, A, B, s, k0, za, zb, row0, col0, m, n, k_len, a_vec, b_vec, tid):
    zero_b = elt(0)
    Bs = As
"""
B_ROUND = """\
    for rnd in range(B_ROUNDS):
        v = tid + rnd * NT
        if v < B_CHUNKS:
            nn = v % BN
            c = v // BN
            gc = col0 + nn
            kb = k0 + c * VW
            sx = B_BYTES + s * SB + nn * 128 + (c ^ (nn % 8)) * 16
            #@B_VALUES
"""

# The start of every k-tile of the main loop, in both of its paths: tile kt in stage
# (byte offsets rsa in A's ring, rsb in B's) has landed; multiply it.
ITERATION_HEAD = """\
wait_ring()  # this thread's copies of tile kt have landed
#@ROUND
fence_proxy_async()  # this thread's shared writes, visible to the tensor core
cuda.syncthreads()  # ... and everyone's; tile kt-2's products have all retired
fence()
dsa = dsa0 + u64(rsa >> 4)
dsb = dsb0 + u64(rsb >> 4)
#@SMALL_DESC
#@STEPS
commit()
"""

# The kernel, as source: #@ lines are replaced by generated code in _generate().
KERNEL = """
def KERNEL_NAME(A, B, C, alpha_in, beta_in):
    #@DIMS
    alpha = f32(alpha_in)
    beta = f32(beta_in)
    tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0
    wg = tid // 128  # this thread's warpgroup: rows wg*64.. of the block tile
    w = (tid % 128) // 32
    g = (tid % 32) // 4
    q = tid % 4
    #@VEC
    sa0, sa1 = A.strides[0] // ISZ, A.strides[1] // ISZ  # strides in elements
    sb0, sb1 = B.strides[0] // ISZ, B.strides[1] // ISZ
    # One dynamic shared buffer, 1024-byte aligned (the swizzle is applied to address
    # bits): A's STAGES tiles [BM rows][128 bytes], then from byte B_BYTES B's STAGES tiles
    # [BN rows][128 bytes], all in the 128-byte swizzle layout.
    As = cuda.shared.array(0, elt, alignment=ALIGN)
    #@A_DESC
    #@B_DESC
    zf = f32(0)
    zero_b = elt(0)  # B's type (bfloat16: its bits as int16)
    #@BASES

    tiles_m = (m + BM - 1) // BM
    tiles_n = (n + BN - 1) // BN
    group = GROUP_M * tiles_n
    k_tiles = (k_len + BK - 1) // BK
    k_fast = k_len // BK - P  # k-tiles whose successor P on is wholly inside K
    z = cuda.blockIdx.z
    while z < C.shape[0]:
        za = z if A.shape[0] > 1 else 0
        zb = z if B.shape[0] > 1 else 0
        tile = cuda.blockIdx.x
        while tile < tiles_m * tiles_n:
            # mma's grouped order, divided in 32 bits: a 64-bit division is a subroutine
            # call, and ptxas serializes every wgmma of a function that makes one
            gi = i64(u32(tile) // u32(group))
            gr = tile - gi * group
            first = gi * GROUP_M
            gsize = min(tiles_m - first, GROUP_M)
            gj = i64(u32(gr) // u32(gsize))
            row0 = (first + gr - gj * gsize) * BM
            col0 = gj * BN
            acc = #@ZEROS
            #@PARTIAL_INIT
            # Prologue: tiles 0..P-1 in flight, one cp.async group each.
            for s in range(P):
                if s < k_tiles:
                    load_stage(As, A, B, s, s * BK, za, zb, row0, col0, m, n, k_len, a_vec,
                               b_vec, tid)
                commit_cp()
            kt = 0
            rsa = 0  # byte offsets of the stage of tile kt in A's and B's rings
            rsb = 0
            ws = P  # the stage tile kt + P is copied into
            #@SLOT_INIT
            #@B_INIT
            if a_vec and b_vec and row0 + BM <= m and col0 + BN <= n:
                # Interior: while the tile being copied is wholly inside K, every copy is
                # unchecked, from per-thread offsets that move by a constant per k-tile.
                kf = P * BK  # k of the tile copied in this iteration
                #@OFFSETS
                if k_fast > 0:
                    #@B_PRELOAD
                while kt < k_fast:
                    #@HEAD
                    wsa = ws * SA  # into the stage of tile kt-2 (see the module docstring)
                    wsb = ws * SB
                    #@FAST_COPIES
                    commit_cp()
                    if kt + 1 < k_fast:  # B of the next tile copied, into registers
                        #@B_LOADS
                    #@RETIRE
                    #@BUMP
                    kf += BK
                    kt += 1
                    #@NEXT_STAGE
            while kt < k_tiles:  # edge blocks, and the last P k-tiles of any block
                #@HEAD
                if kt + P < k_tiles:  # into the stage of tile kt-2 (see the docstring)
                    load_stage(As, A, B, ws, (kt + P) * BK, za, zb, row0, col0, m, n, k_len,
                               a_vec, b_vec, tid)
                commit_cp()  # always, so cp.async group counts stay aligned with tiles
                #@RETIRE
                kt += 1
                #@NEXT_STAGE
            #@RETIRE_ALL
            wait_all()
            cuda.syncthreads()  # the next tile's prologue overwrites the ring
            #@EPILOGUE
            tile += cuda.gridDim.x
        z += cuda.gridDim.z
"""


SPEC = KernelSpec(
    name="wgmma",
    backend="cuda",
    rung=11,
    title="Hopper warpgroup MMA (sm_90a) from 128-byte-swizzled shared tiles",
    build=build,
    params=(
        Param("BM", 128, (64, 128, 192, 256), "rows of C per block (64 per warpgroup)"),
        Param("BN", 128, (16, 32, 64, 128, 256),
              "columns of C per block (the n of each warpgroup's m64nNk instruction)"),
        Param("STAGES", 0, (0, 3, 4, 5, 6), "shared tiles in the ring (dynamic shared "
              "memory); STAGES - 2 are copied ahead of the one multiplied. 0: the deepest "
              f"ring of at most {AUTO_STAGES} that fits (6 for TF32 and 16-bit operands at "
              "128x128 tiles, 4 for 3xTF32; with BCOPY=0, 4 is faster)"),
        GROUP_M,
        Param("PASSES", 1, (1, 3), "wgmma per k step for float32 operands: 1 = "
              "precision='tf32', 3 = '3xtf32'; set by precision="),
        Param("BCOPY", 1, (0, 1, 2), "how B (K×N, N contiguous) reaches the tensor core: "
              "0 = transposed to K-major by the kernel through registers; 1 = transposed "
              "once, before the product, into a K-major copy (none when B is K-major "
              "already) that the kernel copies like A, by cp.async (see _kmajor); 2 = "
              "float16/bfloat16 only: no operand copied, whatever its layout: B's tiles "
              "copied by cp.async as they lie, N-major for the wgmma's transposed-B form "
              "(BN a multiple of 64), or K-major (x @ w.T); A's K-major, or M-major for the "
              "transposed-A form (x.T @ y)"),
        Param("ROUND", 1, (0, 1), "TF32 (PASSES=1) only: 1 = operands rounded to the "
              "nearest TF32 value (by the copies before the kernel with BCOPY=1, in shared "
              "memory with BCOPY=0); 0 = left as float32, the tensor core ignoring their "
              "last 13 bits (truncation: about 2.7x the error, a few % faster)",
              searched=False),  # accuracy is the caller's choice, not the tuner's
        Param("PROMOTE", PROMOTE_DEFAULT, (1, 2, 4), "3xTF32 only: k-tiles the tensor core "
              "sums into a fresh partial before the threads add it to the result in "
              "float32 (see _promotion)"),
    ),
    constraints=(
        Constraint("the ring fits the 227 KB of shared memory an sm_90 block may opt in to",
                   lambda p: _smem(p) <= SMEM_SM90),
        Constraint("BN/2 accumulators per thread: BN <= 128 with BM > 128 (registers)",
                   lambda p: p["BM"] <= 128 or p["BN"] <= 128),
        Constraint("BCOPY=2 reads B in panels of 64 columns: BN a multiple of 64",
                   lambda p: p["BCOPY"] != 2 or p["BN"] % 64 == 0),
        Constraint("ROUND=0 applies to TF32 (PASSES = 1): 3xTF32 splits its operands exactly",
                   lambda p: p["PASSES"] == 1 or p["ROUND"] == 1),
        Constraint(f"PROMOTE applies to 3xTF32 only (PASSES = 3); otherwise it stays "
                   f"{PROMOTE_DEFAULT}",
                   lambda p: p["PASSES"] == 3 or p["PROMOTE"] == PROMOTE_DEFAULT),
    ),
    dtypes=("float32", "float16", "bfloat16"),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    sim_params={"BM": 64, "BN": 32, "STAGES": 3, "GROUP_M": 2, "PASSES": 1},
    precisions=PRECISIONS, precision_param="PASSES", min_cc=(9, 0), only_cc=(9, 0),
    dynamic_smem=True, dtype_check=_dtype_check,
    shape_params=lambda p, prob, target: shape_params(p, prob, target),
)
