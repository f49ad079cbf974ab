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
   contiguous in the common case) must be K-major too (TF32 has no transposed form), so it
   is transposed on its way in: each thread reads 4 (TF32) or 8 (16-bit) values down one
   column of B (a warp reads 32 adjacent columns: coalesced), rounds or packs them, and
   stores them as one 16-byte chunk of that column's row of the tile (conflict-free, one
   ``st.shared.v4``). TF32 A chunks are rounded in place by the thread that copied them.
3. Ordering, one barrier per k-tile: wait for this thread's copies of tile kt,
   ``fence.proxy.async`` (generic-proxy writes become visible to the tensor core), barrier,
   ``wgmma.fence``, four ``mma_async`` on stage kt, commit; then the copies of tile
   kt + STAGES - 2, then ``wgmma.wait_group 1``: tile kt-1's product has retired, tile kt's
   may still run. The stage the copies overwrite last held tile kt - 2, whose product every
   warpgroup retired (wait_group 1 in iteration kt-1) before it passed this iteration's
   barrier, so no in-flight wgmma can read a stage while it is rewritten.

float16 and bfloat16 operands use the 16-bit instructions with float32 accumulation; the
result is 16-bit like the operands or, with ``dtype=np.float32``, the float32 sums. Any M,
N, K, batch and strides, alpha/beta, as rung mma.

Not yet verified on a GPU: this rung has only run under numba's simulator (whose stand-in
decodes the swizzled descriptors from the same reading of the PTX ISA) and been compiled
offline for sm_90a. It is therefore chosen only by name (``kernel="wgmma"``):
``kernel="auto"`` keeps rung mma until a GPU session has checked and timed it.

What it should buy (a prediction): mma.sync keeps a warp issuing fragment loads and HMMA
(21-45 % of its hot loop), and on an H100 cannot reach more than about half of the tensor
cores' peak; wgmma at 128×128 tiles with the loads overlapped should reach 60-75 % of
cuBLAS in TF32 and BF16 at 4096³, which uses the same instruction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import access_ops
from tilegemm.kernels.cuda._codegen import compile_source, fill
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda._tensorcore import tensorcore_ops
from tilegemm.kernels.cuda._wgmma import shared_alignment, wgmma_ops
from tilegemm.kernels.cuda.k10_mma import _put, _swz_fn, operand_round
from tilegemm.launch import GROUP_M, ceil_div, flat_tile_grid
from tilegemm.registry import Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)

ROW = 128  # bytes of K per tile row: the 128-byte swizzle's width
ATOM = 8 * ROW  # bytes of one 8-row swizzle atom (the descriptors' stride, SBO)
KSTEP = 32  # bytes of K one wgmma reads: k8 TF32, k16 16-bit
SMEM_SM90 = 227 * 1024  # dynamic shared memory an sm_90 block may opt in to
PRECISIONS: dict[str, int] = {"tf32": 1}


def _threads(p: Mapping[str, int]) -> int:
    return 2 * p["BM"]  # one warpgroup (128 threads) per 64 rows


def _smem(p: Mapping[str, int], itemsize: int = 4) -> int:
    """Bytes of dynamic shared memory: STAGES A tiles (BM rows) and B tiles (BN rows), each
    row 128 bytes of K whatever the dtype."""
    return p["STAGES"] * (p["BM"] + p["BN"]) * ROW


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    name = np.dtype(dtype).name
    kernel = _generate(p, name)
    arg_types = ("int16", "float32") if name == "bfloat16" else None
    return CudaProgram(kernel, (_threads(p), 1, 1), flat_tile_grid(p["BM"], p["BN"]),
                       arg_types, dynamic_smem=_smem(p))


def _generate(p: Mapping[str, int], dtype: str) -> Any:
    global cuda
    from numba import cuda

    BM, BN, STAGES = p["BM"], p["BN"], p["STAGES"]
    tf32 = dtype == "float32"
    ISZ = 4 if tf32 else 2
    VW = 16 // ISZ  # elements per 16-byte chunk
    BK = ROW // ISZ
    NT = _threads(p)
    P = STAGES - 2  # tiles copied ahead of the one multiplied
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
        smem_desc=wg.smem_desc_128b, sts4=wg.sts4_at, pack=wg.pack_halves,
        mma={"float32": wg.mma_tf32, "float16": wg.mma_f16, "bfloat16": wg.mma_bf16}[dtype](BN),
    )
    # A's tile: mma's row-major [BM][BK] tile with 8 chunks a row, swizzled by r % 8: the
    # 128-byte swizzle layout (see the module docstring)
    ns["a_swz_of"] = _swz_fn("r % 8", ns)
    ns["put"] = _put()
    ns["load_stage"] = compile_source(_loader(tf32, VW), "load_stage", dict(ns))

    rounding = []
    if tf32:  # each thread rounds the A chunks it copied, in the stage about to be read
        for rnd in range(ceil_div(A_CHUNKS, NT)):
            line = f"round_tf32(As, st * SA + ra{rnd})"
            rounding += [line] if (rnd + 1) * NT <= A_CHUNKS else [
                f"if tid < {A_CHUNKS - rnd * NT}:", "    " + line]
    bases = []
    for rnd in range(ceil_div(A_CHUNKS, NT)):
        bases += [f"ar{rnd} = (tid + {rnd * NT}) // ACH",
                  f"ra{rnd} = ar{rnd} * 128 + (((tid + {rnd * NT}) % ACH) ^ (ar{rnd} % 8)) * 16"]
    steps = [f"acc = mma(acc, da + u64({s * KSTEP // 16}), db + u64({s * KSTEP // 16}), 1)"
             for s in range(ROW // KSTEP)]
    epilogue = ["er = row0 + wg * 64 + 16 * w + g", "ec = col0 + 2 * q"]
    for i in range(BN // 2):
        epilogue.append(f"put(C, z, er + {8 * ((i // 2) % 2)}, ec + {8 * (i // 4) + i % 2}, "
                        f"acc[{i}], alpha, beta, m, n)")
    # eight-value tuples joined: a long tuple display becomes a list-to-tuple in CPython
    # 3.11's bytecode, which numba-cuda's bytecode reader refuses (BN/2 is a multiple of 8)
    zeros = " + ".join(["(" + ", ".join(["zf"] * 8) + ")"] * (BN // 16))
    source = fill(KERNEL, {"BASES": bases, "ROUND": rounding or ["pass"], "STEPS": steps,
                           "EPILOGUE": epilogue})
    source = source.replace("#@ZEROS", zeros)
    name = f"wgmma_{dtype}_kernel"
    return kernel_jit(NT, 1)(compile_source(source.replace("KERNEL_NAME", name), name, ns))


def _loader(tf32: bool, vw: int) -> str:
    """``load_stage``: one k-tile into stage ``s``, with bounds checks. A by mma's checked
    ``cp.async`` copies (:func:`operand_round`); B transposed through registers: chunk ``v``
    of the tile is column ``nn = v % BN`` of B and k ``c * VW`` … ``c * VW + VW - 1``,
    zero past the edges, stored as row ``nn`` of the K-major tile, chunk ``c ^ (nn % 8)``."""
    values = []
    for q in range(vw):
        values += [f"x{q} = zero_b", f"if gc < n and kb + {q} < k_len:",
                   f"    x{q} = load(B, (zb, kb + {q}, gc))"]
    if tf32:
        store_line = ("sts4(As, sx, " + ", ".join(f"to_tf32(x{q})" for q in range(vw)) + ")")
    else:
        store_line = ("sts4(As, sx, " + ", ".join(f"pack(x{2 * h}, x{2 * h + 1})"
                                                  for h in range(vw // 2)) + ")")
    body = "\n".join("            " + line for line in values + [store_line])
    return (LOADER_HEAD + operand_round("A", "row0", "k0", "m", "k_len", "za", tf32) + "\n"
            + B_ROUND.replace("#@B_VALUES", body.lstrip()) + "\n")


LOADER_HEAD = """
@cuda.jit(device=True, inline=True)
def load_stage(As, A, B, s, k0, za, zb, row0, col0, m, n, k_len, a_vec, tid):
    zero_b = elt(0)
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

# The kernel, as source: #@ lines are replaced by generated code in _generate().
KERNEL = """
def KERNEL_NAME(A, B, C, alpha_in, beta_in):
    m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
    alpha = f32(alpha_in)
    beta = f32(beta_in)
    tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0
    wg = tid // 128  # this thread's warpgroup: rows wg*64.. of the block tile
    w = (tid % 128) // 32
    g = (tid % 32) // 4
    q = tid % 4
    a_vec = (k_len % VW == 0 and address(A) % 16 == 0 and A.strides[2] == ISZ
             and A.strides[1] % 16 == 0 and A.strides[0] % 16 == 0)
    # One dynamic shared buffer, 1024-byte aligned (the swizzle is applied to address
    # bits): A's STAGES tiles [BM rows][128 bytes], then from byte B_BYTES B's STAGES tiles
    # [BN rows][128 bytes], all in the 128-byte swizzle layout.
    As = cuda.shared.array(0, elt, alignment=ALIGN)
    da0 = smem_desc(As, wg * WG_A, ATOM)  # this warpgroup's 64 rows of A, stage 0
    db0 = smem_desc(As, B_BYTES, ATOM)
    zf = f32(0)
    #@BASES

    tiles_m = (m + BM - 1) // BM
    tiles_n = (n + BN - 1) // BN
    group = GROUP_M * tiles_n
    k_tiles = (k_len + BK - 1) // BK
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
            # Prologue: tiles 0..P-1 in flight, one cp.async group each.
            for s in range(P):
                if s < k_tiles:
                    load_stage(As, A, B, s, s * BK, za, zb, row0, col0, m, n, k_len, a_vec,
                               tid)
                commit_cp()
            kt = 0
            st = 0  # the stage of tile kt
            ws = P  # the stage tile kt + P is copied into
            while kt < k_tiles:
                wait_ring()  # this thread's copies of tile kt have landed
                #@ROUND
                fence_proxy_async()  # this thread's shared writes, visible to the tensor core
                cuda.syncthreads()  # ... and everyone's; tile kt-2's products all retired
                fence()
                da = da0 + u64(st * SA16)
                db = db0 + u64(st * SB16)
                #@STEPS
                commit()
                if kt + P < k_tiles:  # into the stage of tile kt-2 (see the docstring)
                    load_stage(As, A, B, ws, (kt + P) * BK, za, zb, row0, col0, m, n, k_len,
                               a_vec, tid)
                commit_cp()  # always, so cp.async group counts stay aligned with tiles
                acc = wait1(acc)  # tile kt-1's product has retired; tile kt's may run on
                kt += 1
                st = st + 1 if st < STAGES - 1 else 0
                ws = ws + 1 if ws < STAGES - 1 else 0
            acc = wait0(acc)
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
        Param("STAGES", 4, (3, 4, 5, 6), "shared tiles in the ring (dynamic shared memory); "
              "STAGES - 2 are copied ahead of the one multiplied"),
        GROUP_M,
        Param("PASSES", 1, (1,), "precision='tf32' for float32 operands; set by precision="),
    ),
    constraints=(
        Constraint("the ring fits the 227 KB of shared memory an sm_90 block may opt in to",
                   lambda p: _smem(p) <= SMEM_SM90),
        Constraint("BN/2 accumulators per thread: BN <= 128 with BM > 128 (registers)",
                   lambda p: p["BM"] <= 128 or p["BN"] <= 128),
    ),
    dtypes=("float32", "float16", "bfloat16"),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    sim_params={"BM": 64, "BN": 32, "STAGES": 3, "GROUP_M": 2, "PASSES": 1},
    precisions=PRECISIONS, precision_param="PASSES", min_cc=(9, 0), only_cc=(9, 0),
    named_only=True, dynamic_smem=True,
)
