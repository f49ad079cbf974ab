"""Rung 10 — mma: tensor cores (TF32, 3×TF32, FP16, BF16), fed by ldmatrix and cp.async.

What changed from pipelined: the multiply-adds leave the CUDA cores.

1. Tensor cores. Each warp computes its WM×WN tile as (WM/16)×(WN/8) fragments of
   ``mma.sync.m16n8k8`` with TF32 inputs and float32 accumulation: one instruction does
   16·8·8 multiply-adds, where an FFMA does one. Each operand value is first rounded to
   TF32 (10 mantissa bits, ``cvt.rna``), so the result is *less precise* than the FFMA
   rungs: this rung runs only when the caller asks for it with ``precision="tf32"``, never
   for ``kernel="auto"`` at the default ``precision="ieee"``. ``precision="3xtf32"`` (PASSES
   = 3) splits each operand into a TF32 "big" part and a TF32 "small" remainder and adds
   small·big + big·small + big·big: three mma per step and near-float32 accuracy (see
   docs/tensor-cores.md for the errors measured against float64).
2. ``cp.async`` pipeline. Global → shared copies bypass registers (``LDGSTS``), so a
   STAGES-deep ring of shared tiles is in flight at once: tile k+STAGES-1 is being copied
   while tile k is multiplied, with one barrier per k-tile. Edges are zero-filled by the
   copy itself (its source size is the valid part), so the hot loop has no bounds tests.
   The ring is dynamic shared memory, sized by the launch: 4 stages of 128×16 + 16×128
   float32 by default, 64 KB, more than the 48 KB a kernel may declare statically, so
   before its first launch on a device the kernel is opted in to that much
   (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``; backends/cuda_program.py), and
   the limit checks use the device's opt-in maximum (227 KB on an H100, 163 KB on an A100,
   99 KB on other GPUs since sm_80).
3. Conflict-free fragment loads. A fragments come from ``ldmatrix.x4`` (one instruction
   per 16×8 fragment instead of four loads) out of an A tile whose 16-byte chunks are
   XOR-swizzled by row, so the eight rows each ldmatrix phase reads fall in distinct banks;
   the B tile's chunks are swizzled by k so the scalar B-fragment loads are conflict-free.

float16 and bfloat16 operands use ``mma.sync.m16n8k16`` with f16 or bf16 inputs and
float32 accumulation; both fragments come from ``ldmatrix`` (B's with ``.trans``, from the
row-major k×n tile), and BK must be a multiple of 16. Rows that are not 16-byte aligned are
staged with plain loads (``cp.async`` copies 4 bytes at least). The result is 16-bit like
the operands (NumPy's rule) or, with ``dtype=np.float32``, the float32 sums unrounded.

Machine code (docs/tensor-cores.md): the kernel is generated as source (``_codegen``) with
the k steps of a tile written out, so every ldmatrix and shared load is a per-thread base
plus a constant; blocks wholly inside the operands run an interior loop whose copies are
unconditional 16-byte ``cp.async`` from per-thread global addresses bumped per k-tile; for
TF32 each thread rounds the chunks it copied once, in shared memory, instead of every warp
rounding its fragments, and for 3×TF32 splits them there into big and small parts (the
small parts in two alternating slots after the ring); a ring of a power-of-two size wraps by
a mask. HMMA share of the hot loop on sm_90: tf32 4.5 % → 20.9 %, 3×TF32 17 % → 29 %,
float16 5.2 % → 44 %. With ``RCOPY=1`` (TF32 only) A and B are rounded by copies made
before the kernel, one pass over each (``_kmajor.RowMajorProgram``), and the kernel has no
rounding pass: 110 instructions a k-tile instead of 153, HMMA 29.1 % (not yet timed on a
GPU, so not the default; on rung wgmma the same move was worth a third of its speed).
Device operands laid out the other way (A M-major as in ``x.T @ y``, B K-major as in ``x @
w.T``, rows on 16 bytes) get a copy in the kernel's row-major layout first, by the same
program and the same launch, instead of the plain-load path on every k-tile.

What it should buy: TF32 tensor cores peak at ~495 TFLOP/s dense on an H100 against ~67
for FP32 FFMA, so a compute-bound product can run several times faster; 3×TF32 spends three
mma per step to keep float32-like accuracy and should still beat FFMA by ~1.5–2×.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from types import CodeType, FunctionType
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import MIN_OPTIN_SMEM_SM80, CudaProgram
from tilegemm.errors import InvalidValueError
from tilegemm.kernels.cuda._access import access_ops
from tilegemm.kernels.cuda._codegen import compile_source, fill
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda._kmajor import RowMajorProgram
from tilegemm.kernels.cuda._tensorcore import tensorcore_ops
from tilegemm.launch import ceil_div, flat_tile_grid
from tilegemm.registry import Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)

# precision= value -> PASSES (mma per k step). The API sets PASSES from precision=.
PRECISIONS: dict[str, int] = {"tf32": 1, "3xtf32": 3}


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) * 32


def _smem(p: Mapping[str, int], itemsize: int) -> int:
    """Bytes of dynamic shared memory: the ring of STAGES A and B tiles, and for 3×TF32 two
    slots for the small parts of one stage (see _split_own)."""
    slots = STAGES_OF_SMALL_PARTS if itemsize == 4 and p.get("PASSES", 1) == 3 else 0
    return (p["STAGES"] + slots) * (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * itemsize


# 3×TF32 keeps the small parts of the stage being read in one of two slots, alternating per
# k-tile: a slot is rewritten two k-tiles after it was read, behind a barrier.
STAGES_OF_SMALL_PARTS = 2


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    if np.dtype(dtype).name in ("float16", "bfloat16"):
        return _build_16bit(p, np.dtype(dtype).name)
    return _build_tf32(p)


def _rcopy(p: Mapping[str, int], dtype: str) -> bool:
    """Whether A and B reach the kernel rounded to TF32 by copies made before it (RCOPY=1,
    float32 with one pass), so the kernel does no rounding pass in shared memory."""
    return dtype == "float32" and p.get("PASSES", 1) == 1 and bool(p.get("RCOPY", 0))


def _dtype_check(p: Mapping[str, int], dtype: np.dtype) -> str | None:
    name = np.dtype(dtype).name
    if p.get("RCOPY", 0) and (name != "float32" or p.get("PASSES", 1) != 1):
        return (f"RCOPY=1 rounds float32 operands for one TF32 pass (precision='tf32'); "
                f"{name} operands with PASSES={p.get('PASSES', 1)} take RCOPY=0")
    if np.dtype(dtype).itemsize == 2 and p["BK"] % 16:
        return f"{name} needs BK a multiple of 16 (one m16n8k16 step), got BK={p['BK']}"
    if np.dtype(dtype).itemsize == 2 and p.get("PASSES", 1) != 1:
        # the big/small split is of float32 operands into TF32 parts; a 16-bit operand is
        # already what the mma reads, and the kernel would have run one pass regardless
        return (f"{name} takes one mma per step (PASSES=1); PASSES=3 is the 3xTF32 split "
                "of float32 operands (precision='3xtf32')")
    return None


def _swizzle(c: int, r: int, chunks: int) -> int:
    """Physical 16-byte chunk of logical chunk ``c`` in row ``r`` of a tile with ``chunks``
    chunks a row: XOR with the row's position among the rows of the same 128-byte bank
    line, so 8 consecutive rows reading one logical chunk hit 8 distinct bank groups."""
    return c ^ ((r // max(1, 8 // chunks)) % min(chunks, 8))


def _build_16bit(p: Mapping[str, int], dtype: str) -> CudaProgram:
    """float16 or bfloat16 operands: m16n8k16 mma with float32 accumulation; A and B
    fragments by ldmatrix (B with .trans) from chunk-swizzled tiles; BK a multiple of 16.

    bfloat16 arrays arrive as their 16-bit patterns (int16, as PyTorch views them too), which
    the copies and ldmatrix move unchanged and only the mma reads as bfloat16. C is
    written through ``store_f32``, which converts by C's own type: a 16-bit result like the
    operands, or float32 (``dtype=np.float32``) unrounded."""
    if p["BK"] % 16:
        raise InvalidValueError(f"mma: {dtype} needs BK a multiple of 16 (one m16n8k16 "
                                f"step), got BK={p['BK']}")
    kernel = _generate(p, dtype)
    arg_types = ("int16", "float32") if dtype == "bfloat16" else None
    return RowMajorProgram(kernel, (_threads(p), 1, 1), flat_tile_grid(p["BM"], p["BN"]),
                           arg_types, dynamic_smem=_smem(p, 2))


def _build_tf32(p: Mapping[str, int]) -> CudaProgram:
    return RowMajorProgram(_generate(p, "float32"), (_threads(p), 1, 1),
                           flat_tile_grid(p["BM"], p["BN"]), dynamic_smem=_smem(p, 4),
                           round_tf32=_rcopy(p, "float32"))


def _generate(p: Mapping[str, int], dtype: str) -> Any:
    """The kernel for ``dtype`` (float32: TF32 with PASSES mma per step; float16/bfloat16),
    generated as source (``_codegen``): the k steps of a tile written out, every shared
    address a per-thread base plus a constant, and an interior-tile loop whose copies are
    unconditional 16-byte ``cp.async`` from per-thread offsets bumped per k-tile."""
    global cuda
    from numba import cuda

    BM, BN, BK, WM, WN = p["BM"], p["BN"], p["BK"], p["WM"], p["WN"]
    STAGES, GROUP_M, PASSES = p["STAGES"], p["GROUP_M"], p.get("PASSES", 1)
    tf32 = dtype == "float32"
    ISZ = 4 if tf32 else 2
    VW = 16 // ISZ  # elements per 16-byte chunk
    MI, NI = WM // 16, WN // 8
    NT = _threads(p)
    ACH, BCH = BK // VW, BN // VW  # chunks per row of the A and B tiles
    A_CHUNKS, B_CHUNKS = BM * ACH, BK * BCH
    load, store, _, _, _, _, address, ALIGN = access_ops()
    tc = tensorcore_ops()
    ns: dict[str, Any] = dict(
        cuda=cuda, BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, STAGES=STAGES, GROUP_M=GROUP_M,
        MI=MI, NI=NI, WCOLS=BN // WN, NT=NT, ACH=ACH, BCH=BCH, A_CHUNKS=A_CHUNKS, B_CHUNKS=B_CHUNKS,
        A_ROUNDS=ceil_div(A_CHUNKS, NT), B_ROUNDS=ceil_div(B_CHUNKS, NT), VW=VW, ISZ=ISZ,
        SA=BM * BK * ISZ, SB=BK * BN * ISZ, B_BYTES=STAGES * BM * BK * ISZ,
        SMALL=STAGES * (BM * BK + BK * BN) * ISZ, SLOT=(BM * BK + BK * BN) * ISZ,
        A_OFF=0, A_TILE=BM * BK, A_W=BK, B_OFF=STAGES * BM * BK, B_TILE=BK * BN, B_W=BN,
        load=load, store=store, address=address, ALIGN=ALIGN,
        f32=np.float32, zero=np.float32(0), split_tf32_at=tc.split_tf32_at,
        ldsm=tc.ldmatrix_x4_at,
        ldsm_t=tc.ldmatrix_x4_trans_at, cp16=tc.cp_async16, cp4=tc.cp_async4,
        cp16_ptr=tc.cp_async16_ptr, round_tf32=tc.round_tf32_at, commit=tc.cp_commit,
        wait_ring=tc.cp_wait(STAGES - 2), wait_all=tc.cp_wait(0), lds1=tc.lds_at(1),
        mma={"float32": tc.mma_tf32, "float16": tc.mma_f16, "bfloat16": tc.mma_bf16}[dtype],
        elt={"float32": np.float32, "float16": np.float16, "bfloat16": np.int16}[dtype])
    # A tile [BM][BK], B tile [BK][BN], row-major per stage, 16-byte chunks XOR-swizzled by
    # row: chunk c of row r sits at c ^ swz(r), with swz depending on r % 8 only (so the
    # swizzle of a fragment's rows is the same for every i and k step).
    if tf32:
        ns.update(ASWZ=8 // ACH, BSWZ=BCH - 1)
        a_swz, b_swz = "((r // ASWZ) % ACH)", "((2 * (r % 4)) & BSWZ)"
    else:
        ns.update(ASH=max(1, 8 // ACH), AMOD=min(ACH, 8), BSH=max(1, 8 // BCH),
                  BMOD=min(BCH, 8))
        a_swz, b_swz = "((r // ASH) % AMOD)", "((r // BSH) % BMOD)"
    ns["a_swz_of"] = _swz_fn(a_swz, ns)
    ns["b_swz_of"] = _swz_fn(b_swz, ns)
    ns["load_stage"] = _general_loader(ns, tf32)

    # The k steps are written out twice, in the interior loop and the edge loop, with
    # names of their own in each ("e" for the edge loop): numba's SSA reconstruction
    # rewrites the whole function once per variable assigned in more than one place.
    parts = (lambda sfx: _tf32_parts(p, PASSES, sfx)) if tf32 else (
        lambda sfx: _16bit_parts(p, sfx))
    bases, compute = parts("")
    compute_edge = parts("e")[1]
    copies, offsets, bumps = _fast_copies(p, NT, ACH, BCH, VW)
    bases += copies[0]
    # each thread holds two adjacent columns of a row per register pair (c_layout): one
    # put stores both (see _put)
    epilogue = ["er = row0 + wm0 + g", "ec = col0 + wn0 + 2 * t"]
    for i in range(MI):
        for j in range(NI):
            for h in range(2):
                epilogue.append(f"put(C, z, er + {16 * i + 8 * h}, ec + {8 * j}, "
                                f"acc[{i}, {j}, {2 * h}], acc[{i}, {j}, {2 * h + 1}], "
                                f"alpha, beta, m, n)")
    ns["put"] = _put()
    # (with RCOPY=1 the operands arrive rounded: nothing to do in shared memory)
    round_bases, rounding = (_round_own(p, NT, ACH, BCH, PASSES)
                             if tf32 and not _rcopy(p, dtype) else ([], []))
    bases += round_bases
    # Byte offsets of the stage read (rs) and written (ws) in this k-tile, rotating through
    # the ring; A's and B's are one variable when their stages have the same size.
    same = BM == BN
    init = ["rsa = 0", "wsa = (STAGES - 1) * SA"]
    step = ["rsa += SA"]
    if tf32 and PASSES == 3:  # the slot of the small parts, alternating (see _round_own)
        init.append("ss = 0")
        step.append("ss = SLOT - ss")
    if not same:
        init += ["rsb = 0", "wsb = (STAGES - 1) * SB"]
        step += ["rsb += SB"]
    if all(_pow2(STAGES * s) for s in (ns["SA"], ns["SB"])):
        # a ring of a power-of-two size wraps by a mask: no compare and select, and the
        # offsets are known to fit 32 bits (numba's integers are 64-bit)
        step = [s.replace("+= SA", "= (rsa + SA) & (STAGES * SA - 1)")
                .replace("+= SB", "= (rsb + SB) & (STAGES * SB - 1)") for s in step]
        wrap = []
    else:
        wrap = ["if rsa == STAGES * SA:", "    rsa = 0", *(["    rsb = 0"] if not same else [])]
    ws = ["wsa = rsa", *(["wsb = rsb"] if not same else [])]
    source = fill(KERNEL, {"BASES": bases, "OFFSETS": offsets, "FAST_COPIES": copies[1],
                           "BUMP": bumps, "COMPUTE": compute, "COMPUTE_EDGE": compute_edge,
                           "EPILOGUE": epilogue,
                           "ROUND": rounding or ["pass"], "STAGE_INIT": init,
                           "STAGE_NEXT_WS": ws + step + wrap, "STAGE_NEXT": step + wrap})
    if same:
        source = source.replace("rsb", "rsa").replace("wsb", "wsa")
    name = f"mma_{dtype}_kernel"
    return kernel_jit(NT)(compile_source(source.replace("KERNEL_NAME", name), name, ns))


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _swz_fn(expr: str, ns: dict[str, Any]) -> Any:
    """A device function ``swz(r)``: the chunk swizzle of tile row ``r``."""
    return compile_source(
        f"@cuda.jit(device=True, inline=True)\ndef swz(r):\n    return {expr}\n", "swz",
        dict(ns))


def _put() -> Any:
    """``put(C, z, row, col, v0, v1, alpha, beta, m, n)``: the epilogue's store of the two
    results of columns ``col`` and ``col + 1`` of a row, alpha/beta applied, C read only
    when beta != 0, nothing outside M×N (rung wgmma's too).

    In the mma accumulator layout a thread holds two adjacent columns (``c_layout``), so a
    warp storing one value per thread writes 8 rows × 16 bytes: 8 sectors, each half used
    (a quarter for 16-bit C). Storing the pair as one access (float32: 8 bytes,
    ``STG.E.64``; 16-bit: 4 bytes, ``STG.E``) writes 8 rows × 32 bytes: the same 8
    sectors, wholly used, in half the store instructions (and, with beta != 0, half the
    loads of C). That needs the pair inside N (``col`` is even, so an odd N leaves the last
    column alone) and an address that is a multiple of the pair's size, asked per pair
    (``pair_aligned``): C may be any strided view, and a row stride of an odd number of
    elements (a contiguous C with odd N) misaligns every other row. Otherwise each value
    is stored alone, as before. The test is on the address the store computes anyway, so
    the k loop's machine code is the same as without it (docs/performance.md).

    Inlined by NVVM, not by numba (see :func:`_nvvm_inlined`): the epilogue calls it once
    per accumulator pair (32 times at the defaults), and numba's own inlining copied its
    IR, with its branches, into the kernel at every call, which every later numba pass
    walks again. The machine code is the same."""
    ops = tensorcore_ops()
    store_f32, load_f32 = ops.store_f32, ops.load_f32
    store2_f32, load2_f32, pair_aligned = ops.store2_f32, ops.load2_f32, ops.pair_aligned

    def put(C, z, gr, gc, v0, v1, alpha, beta, m, n):  # noqa: ANN001, ANN202
        if gr < m:
            if gc + 1 < n and pair_aligned(C, (z, gr, gc)):
                if beta == 0:
                    store2_f32(C, (z, gr, gc), alpha * v0, alpha * v1)
                else:
                    c0, c1 = load2_f32(C, (z, gr, gc))
                    store2_f32(C, (z, gr, gc), alpha * v0 + beta * c0, alpha * v1 + beta * c1)
            else:
                if gc < n:
                    if beta == 0:
                        store_f32(C, (z, gr, gc), alpha * v0)
                    else:
                        store_f32(C, (z, gr, gc), alpha * v0 + beta * load_f32(C, (z, gr, gc)))
                if gc + 1 < n:
                    if beta == 0:
                        store_f32(C, (z, gr, gc + 1), alpha * v1)
                    else:
                        store_f32(C, (z, gr, gc + 1),
                                  alpha * v1 + beta * load_f32(C, (z, gr, gc + 1)))

    from numba import cuda

    return nvvm_inlined(cuda.jit(device=True, inline=True)(put))


def nvvm_inlined(fn: Any) -> Any:
    """``fn`` (a ``cuda.jit(device=True, inline=True)`` function that returns nothing) as
    the kernel calls it: inlined by NVVM (:func:`_nvvm_inlined`), or as it is in the
    simulator, which runs it as Python. For the device functions with many blocks that the
    kernel calls: numba's own inlining copies their IR into the kernel at every call, and
    every later numba pass walks it again."""
    from tilegemm import simulator

    return fn if simulator.enabled() else _nvvm_inlined(fn.py_func)


def _nvvm_inlined(pyfunc: Any) -> Any:
    """An intrinsic that calls ``pyfunc`` (returning nothing) compiled as a numba
    subroutine marked ``alwaysinline``, so that NVVM inlines it at every call.

    A ``cuda.jit(device=True, forceinline=True)`` function would do the same on a GPU, but
    numba-cuda compiles one for the current device's architecture, so it needs a GPU, and
    PTX and SASS are also made without one (resource reports, tests); a subroutine is only
    lowered to LLVM IR, which NVVM compiles with the kernel for the kernel's architecture.
    numba compiles it once per argument types (its subroutine cache), keyed as
    :func:`_keyed_by_globals` says."""
    import inspect

    from numba import types
    from numba.cuda.extending import intrinsic
    from numba.cuda.flags import CUDAFlags

    subroutine = _keyed_by_globals(pyfunc)

    def codegen(context, builder, sig, llargs):  # noqa: ANN001, ANN202
        flags = CUDAFlags()
        flags.forceinline = True  # LLVM's alwaysinline on the subroutine
        flags.error_model = "numpy"  # as numba-cuda compiles kernels
        cres = context.compile_subroutine(builder, subroutine, sig, flags=flags)
        context.call_internal(builder, cres.fndesc, sig, llargs)
        return context.get_dummy_value()

    def typer(*args):  # noqa: ANN002, ANN202
        return types.void(*args), codegen

    # The intrinsic takes pyfunc's parameters by name (an intrinsic's *args would reach
    # the lowering as one tuple).
    names = ", ".join(inspect.signature(pyfunc).parameters)
    scope: dict[str, Any] = {"typer": typer}
    exec(f"def call(typingctx, {names}):\n    return typer({names})\n", scope)  # noqa: S102
    return intrinsic(scope["call"])


_UNIQUE = itertools.count()


def _keyed_by_globals(pyfunc: Any) -> Any:
    """``pyfunc`` renamed so that numba's subroutine cache tells it apart by its globals.

    numba keeps a compiled subroutine per process, keyed by the function's code object,
    argument types and closure, but not by its globals. Two loaders generated from the
    same text for other tile shapes (``load_stage`` reads BN, NT, the chunk counts... as
    globals) are equal code objects, so the second kernel a process compiled got the
    first one's loader: wrong products or illegal addresses on a GPU whenever one process
    built two shapes (a tuner, a test run, a user trying parameters), unseen under the
    simulator and in a fresh process. The copy's name carries a hash of the globals its
    code reads (``fingerprint``), so equal shapes still share one compile; globals with no
    stable description get a name of their own."""
    from tilegemm.kernels.cuda._codegen import Unfingerprintable, fingerprint

    names: set[str] = set()
    stack = [pyfunc.__code__]
    while stack:  # the names its code and any nested code (comprehensions) read
        code = stack.pop()
        names.update(code.co_names)
        stack += [c for c in code.co_consts if isinstance(c, CodeType)]
    read = {k: pyfunc.__globals__[k] for k in sorted(names) if k in pyfunc.__globals__}
    try:
        tag = fingerprint(read)[:16]
    except Unfingerprintable:
        tag = f"own{next(_UNIQUE)}"
    code = pyfunc.__code__.replace(co_name=f"{pyfunc.__code__.co_name}_{tag}")
    copy = FunctionType(code, pyfunc.__globals__, code.co_name, pyfunc.__defaults__,
                              pyfunc.__closure__)
    copy.__qualname__ = f"{pyfunc.__qualname__}_{tag}"
    return copy


def _general_loader(ns: dict[str, Any], tf32: bool) -> Any:
    """Copies one k-tile into stage ``s`` with bounds checks: the edge tiles, and every tile
    of a block that is not wholly inside the operands. Partial 16-byte chunks are
    zero-filled by the copy; rows that are not 16-byte aligned go by 4-byte ``cp.async``
    (float32) or plain loads and stores (16-bit: cp.async copies 4 bytes at least)."""
    # A's tile is rows row0.. by columns k0..; B's is rows k0.. by columns col0..
    rounds = [operand_round(op, r0, c0, rows, cols, zz, tf32)
              for op, r0, c0, rows, cols, zz in (("A", "row0", "k0", "m", "k_len", "za"),
                                                 ("B", "k0", "col0", "k_len", "n", "zb"))]
    return loader_call(compile_source(GENERAL_LOADER + "".join(rounds), "load_stage",
                                      dict(ns)), ns["STAGES"])


def loader_call(load_stage: Any, stages: int) -> Any:
    """The checked loader ``load_stage`` as the kernel calls it (rungs mma and wgmma): it
    has dozens of blocks, so numba's inlining of it (prologue and edge loop) took 15-20 %
    of the first compile; NVVM inlines it instead (:func:`nvvm_inlined`) when ``stages``
    is a power of two, which gives the same machine code. With another ring depth the
    edge loop's stage is a true remainder (``nt % STAGES``) and NVVM's code differs
    (registers and instructions, both ways), so those keep numba's inlining."""
    return nvvm_inlined(load_stage) if _pow2(stages) else load_stage


def operand_round(op: str, row0: str, col0: str, rows: str, cols: str, zz: str,
                  tf32: bool, panels: bool = False) -> str:
    """The checked copy of one operand's tile into a stage (the body lines of a loader
    function; see OPERAND_ROUND): operand ``op`` ("A" or "B"), a ``rows`` × ``cols`` matrix
    of batch ``zz`` whose tile starts at row ``row0`` and column ``col0`` (names or
    expressions of the loader's scope). The namespace must hold ``{op}_ROUNDS``,
    ``{op}_CHUNKS``, ``{op}CH``, ``{op}_OFF``, ``{op}_TILE``, ``{op}_W`` and
    ``{op.lower()}_swz_of``; rung wgmma copies its A tile with it too. ``panels``: the
    tile's rows are cut into panels of 8 chunks, ``{op}_PANEL`` elements apart, each
    swizzled on its own (rung wgmma's MN-major B: 64 columns of 16-bit values a panel)."""
    text = OPERAND_ROUND + (ODD_TF32 if tf32 else ODD_16BIT) + "\n"
    if panels:
        text = (text.replace("pc = c ^ op_swz_of(r)", "pc = (c % 8) ^ op_swz_of(r)")
                .replace("pc * VW  #", "pc * VW + (c // 8) * OP_PANEL  #"))
    return (text.replace("ROW0", row0).replace("COL0", col0)
            .replace("ROWS", rows).replace("COLS", cols).replace("ZZ", zz)
            .replace("OP", op).replace("op_", op.lower() + "_"))


GENERAL_LOADER = """
@cuda.jit(device=True, inline=True)
def load_stage(As, Bs, A, B, s, k0, za, zb, row0, col0, m, n, k_len, a_vec, b_vec, tid):
"""
# One operand's chunks (OP: A or B, a ROWS x COLS matrix of batch ZZ, whose tile starts at
# row ROW0 and column COL0): whole 16-byte chunks by cp.async, zero-filled past the edges.
OPERAND_ROUND = """\
    for rnd in range(OP_ROUNDS):
        v = tid + rnd * NT
        if v < OP_CHUNKS:
            r = v // OPCH
            c = v % OPCH
            pc = c ^ op_swz_of(r)
            sx = OP_OFF + s * OP_TILE + r * OP_W + pc * VW  # in the one shared buffer
            gr = ROW0 + r
            gc = COL0 + c * VW
            if op_vec:
                nb = 0
                if gr < ROWS and gc < COLS:
                    nb = min(COLS - gc, VW) * ISZ
                cp16(OPs, (sx,), OP, (ZZ, min(gr, ROWS - 1), min(gc, COLS - 1)), nb)
"""
# The unaligned path of one chunk (OP: A or B, a ROWS x COLS matrix of batch ZZ).
ODD_TF32 = """\
            else:
                for q in range(VW):
                    ok = gr < ROWS and gc + q < COLS
                    cp4(OPs, (sx + q,), OP,
                        (ZZ, min(gr, ROWS - 1), min(gc + q, COLS - 1)), 4 if ok else 0)"""
ODD_16BIT = """\
            else:  # cp.async copies 4 bytes at least: plain loads for odd rows
                for q in range(VW):
                    x = elt(0)
                    if gr < ROWS and gc + q < COLS:
                        x = load(OP, (ZZ, gr, gc + q))
                    store(OPs, (sx + q,), x)"""


def _fast_copies(p: Mapping[str, int], nt: int, ach: int, bch: int,
                 vw: int) -> tuple[tuple[list[str], list[str]], list[str], list[str]]:
    """The interior path's copies: (per-thread bases, the copies of one k-tile), the global
    addresses at a block tile's first fast k-tile, and what one k-tile adds to them.

    Chunk ``v = tid + rnd * NT`` of a tile; its shared offset (``da``/``db``, swizzled) is
    fixed, its global offset (``oa``/``ob``) moves by BK columns of A and BK rows of B per
    k-tile. Every copy is a whole 16 bytes: no bounds tests, no clamps."""
    a_chunks, b_chunks = p["BM"] * ach, p["BK"] * bch
    bases, copies, offsets, bumps = [], [], [], []
    for rnd in range(ceil_div(a_chunks, nt)):
        bases += [f"ar{rnd} = (tid + {rnd * nt}) // ACH",
                  f"ac{rnd} = (tid + {rnd * nt}) % ACH",
                  f"da{rnd} = (ar{rnd} * BK + (ac{rnd} ^ a_swz_of(ar{rnd})) * VW) * ISZ"]
        offsets.append(f"oa{rnd} = address(A) + (za * sa0 + (row0 + ar{rnd}) * sa1 + kf "
                       f"+ ac{rnd} * VW) * ISZ")
        bumps.append(f"oa{rnd} += BK * ISZ")
        cp = (f"cp16_ptr(As, wsa + da{rnd}, A, (za, row0 + ar{rnd}, kf + ac{rnd} * VW), "
              f"oa{rnd}, 16)")
        copies += [cp] if (rnd + 1) * nt <= a_chunks else [
            f"if tid < {a_chunks - rnd * nt}:", "    " + cp]
    for rnd in range(ceil_div(b_chunks, nt)):
        bases += [f"br{rnd} = (tid + {rnd * nt}) // BCH",
                  f"bc{rnd} = (tid + {rnd * nt}) % BCH",
                  f"db{rnd} = B_BYTES + (br{rnd} * BN + (bc{rnd} ^ b_swz_of(br{rnd})) * VW) * ISZ"]
        offsets.append(f"ob{rnd} = address(B) + (zb * sb0 + (kf + br{rnd}) * sb1 + col0 "
                       f"+ bc{rnd} * VW) * ISZ")
        bumps.append(f"ob{rnd} += bstep")
        cp = (f"cp16_ptr(Bs, wsb + db{rnd}, B, (zb, kf + br{rnd}, col0 + bc{rnd} * VW), "
              f"ob{rnd}, 16)")
        copies += [cp] if (rnd + 1) * nt <= b_chunks else [
            f"if tid < {b_chunks - rnd * nt}:", "    " + cp]
    return (bases, copies), offsets, bumps


def _round_own(p: Mapping[str, int], nt: int, ach: int, bch: int,
               passes: int) -> tuple[list[str], list[str]]:
    """(per-thread bases, lines): each thread rounds (TF32) or splits (3×TF32) the chunks it
    copied into the stage about to be read, between its own ``cp.async`` wait and the
    barrier that publishes the stage. Every value is then converted once per block (16 a
    thread and k-tile at the defaults) instead of once per warp that reads it as a fragment
    (48), and the fragments go from shared memory to the mma unchanged. The copies of a
    chunk, on either path, are always made by the same thread, so the thread that converts
    it is the one that waited.

    TF32 rounds in place. 3×TF32 stores the big part in place and the small part in slot
    ``ss`` (two slots after the ring, alternating per k-tile, laid out like a stage: A's
    tile then B's), from which the fragments of the small parts are read like the big ones;
    a slot is rewritten two k-tiles later, after every warp has passed the barrier that
    follows its last read."""
    a_chunks, b_chunks = p["BM"] * ach, p["BK"] * bch
    bases, lines = [], []
    for op, chunks in (("a", a_chunks), ("b", b_chunks)):
        arr, stage = ("As", "rsa") if op == "a" else ("Bs", "rsb")
        for rnd in range(ceil_div(chunks, nt)):
            own = f"d{op}{rnd}"
            if passes == 3:
                # the same chunk's place in a slot (B's offsets include the ring's B_BYTES)
                rel = own if op == "a" else f"SA + {own} - B_BYTES"
                bases.append(f"s{own} = SMALL + {rel}")
                line = f"split_tf32_at({arr}, {stage} + {own}, ss + s{own})"
            else:
                line = f"round_tf32({arr}, {stage} + {own})"
            lines += [line] if (rnd + 1) * nt <= chunks else [
                f"if tid < {chunks - rnd * nt}:", "    " + line]
    return bases, lines


def _tf32_parts(p: Mapping[str, int], passes: int,
                sfx: str = "") -> tuple[list[str], list[str]]:
    """Per-thread shared bases and the written-out k steps (8 k each) of the TF32 kernel.

    A fragments: ldmatrix from the swizzled A tile; the swizzle of a lane's row depends on
    its row mod 8 only, so the fragment of row block i and k step q is at ``xa{q}`` +
    i·16·BK. B fragments: scalar loads (the two values of a lane's fragment lie in k rows 4
    apart, so no vector load can fetch a pair, and ptxas would copy register pairs
    together), one base per column block j: the swizzle depends on k mod 4 = t only."""
    BK, BN, MI, NI = p["BK"], p["BN"], p["WM"] // 16, p["WN"] // 8
    bases = ["r_l = wm0 + lane % 8 + 8 * (mat % 2)  # this lane's ldmatrix row",
             "s_a = (r_l // ASWZ) % ACH"]
    for q in range(BK // 8):
        bases.append(f"xa{q} = (r_l * BK + (({2 * q} + mat // 2) ^ s_a) * 4) * 4")
        if passes == 3:  # the same place in a slot of small parts (see _round_own)
            bases.append(f"sxa{q} = SMALL + xa{q}")
    if passes == 3:
        bases.append("z4 = (zero, zero, zero, zero)  # C of each k step's first mma")
    for j in range(NI):
        bases += [f"xb{j} = B_BYTES + (t * BN + (((wn0 + {8 * j} + g) // 4) ^ ((2 * t) & BSWZ))"
                  f" * 4 + g % 4) * 4"]
        if passes == 3:
            bases.append(f"sxb{j} = SMALL + SA + xb{j} - B_BYTES")
    # Fragments straight from shared memory, where they were rounded, or split into their
    # big and small parts (3xTF32), once per block (see _round_own).
    lines = []
    for q in range(BK // 8):
        kk, v = 8 * q, f"{q}{sfx}"  # v: the k step's tag in value names
        lines.append(f"# k step {q} (k {kk}..{kk + 7} of the tile)")
        for i in range(MI):
            a_regs = ", ".join(f"a{i}_{r}_{v}" for r in range(4))
            lines.append(f"{a_regs} = ldsm(As, rsa + xa{q} + {i * 16 * BK * 4})")
            if passes == 3:
                lines.append(f"{a_regs.replace('a', 'as')} = "
                             f"ldsm(As, ss + sxa{q} + {i * 16 * BK * 4})")
        for j in range(NI):
            for h in range(2):
                row = (kk + 4 * h) * BN * 4
                lines.append(f"b{j}_{h}_{v}, = lds1(Bs, rsb + xb{j} + {row})")
                if passes == 3:
                    lines.append(f"bs{j}_{h}_{v}, = lds1(Bs, ss + sxb{j} + {row})")
        for i in range(MI):
            a = f"(a{i}_0_{v}, a{i}_1_{v}, a{i}_2_{v}, a{i}_3_{v})"
            asm = f"(as{i}_0_{v}, as{i}_1_{v}, as{i}_2_{v}, as{i}_3_{v})"
            for j in range(NI):
                b, bs = f"(b{j}_0_{v}, b{j}_1_{v})", f"(bs{j}_0_{v}, bs{j}_1_{v})"
                c = f"(acc[{i}, {j}, 0], acc[{i}, {j}, 1], acc[{i}, {j}, 2], acc[{i}, {j}, 3])"
                d = [f"d{i}_{j}_{r}_{v}" for r in range(4)]
                if passes == 3:
                    # a fresh partial per k step (C = 0), added to acc by the thread: the
                    # tensor core's accumulation truncates, and summing all of K there lost
                    # the small parts' correction on an H100 (see _promotion in rung wgmma)
                    lines += [f"e{i}_{j}_{v} = mma({asm}, {b}, z4)",
                              f"f{i}_{j}_{v} = mma({a}, {bs}, e{i}_{j}_{v})",
                              f"{', '.join(d)} = mma({a}, {b}, f{i}_{j}_{v})"]
                    lines += [f"acc[{i}, {j}, {r}] += {d[r]}" for r in range(4)]
                else:
                    lines.append(f"{', '.join(d)} = mma({a}, {b}, {c})")
                    lines += [f"acc[{i}, {j}, {r}] = {d[r]}" for r in range(4)]
    return bases, lines


def _16bit_parts(p: Mapping[str, int], sfx: str = "") -> tuple[list[str], list[str]]:
    """Per-thread shared bases and the written-out k steps (16 k each), float16/bfloat16.

    A as for TF32 (chunks of 8 halves). B by ldmatrix.trans from the row-major k×n tile:
    lane l addresses k row ``l % 8 + 8 * (mat % 2)`` of the k step, n chunk ``wn0/8 + 2jj``
    (+1 for matrices 2, 3: the next column block); the swizzle depends on the k row mod 8
    only, so each jj has one base for every k step."""
    BK, BN, MI, NI = p["BK"], p["BN"], p["WM"] // 16, p["WN"] // 8
    NB = (NI + 1) // 2
    bases = ["r_l = wm0 + lane % 8 + 8 * (mat % 2)  # this lane's ldmatrix row (A)",
             "s_a = (r_l // ASH) % AMOD",
             "k_l = lane % 8 + 8 * (mat % 2)  # ... and k row (B)",
             "s_b = (k_l // BSH) % BMOD"]
    for q in range(BK // 16):
        bases.append(f"xa{q} = (r_l * BK + (({2 * q} + mat // 2) ^ s_a) * 8) * 2")
    for jj in range(NB):
        nxt = "mat // 2" if 2 * jj + 1 < NI else "0"
        bases.append(f"xb{jj} = B_BYTES + (k_l * BN + ((wn0 // 8 + {2 * jj} + {nxt}) ^ s_b)"
                     f" * 8) * 2")
    lines = []
    for q in range(BK // 16):
        kk, v = 16 * q, f"{q}{sfx}"
        lines.append(f"# k step {q} (k {kk}..{kk + 15} of the tile)")
        for i in range(MI):
            lines.append(f"{', '.join(f'a{i}_{r}_{v}' for r in range(4))} = "
                         f"ldsm(As, rsa + xa{q} + {i * 16 * BK * 2})")
        for jj in range(NB):
            lines.append(f"b{2 * jj}_0_{v}, b{2 * jj}_1_{v}, b{2 * jj + 1}_0_{v}, "
                         f"b{2 * jj + 1}_1_{v} = ldsm_t(Bs, rsb + xb{jj} + {kk * BN * 2})")
        for i in range(MI):
            a = f"(a{i}_0_{v}, a{i}_1_{v}, a{i}_2_{v}, a{i}_3_{v})"
            for j in range(NI):
                c = f"(acc[{i}, {j}, 0], acc[{i}, {j}, 1], acc[{i}, {j}, 2], acc[{i}, {j}, 3])"
                d = [f"d{i}_{j}_{r}_{v}" for r in range(4)]
                lines.append(f"{', '.join(d)} = mma({a}, (b{j}_0_{v}, b{j}_1_{v}), {c})")
                lines += [f"acc[{i}, {j}, {r}] = {d[r]}" for r in range(4)]
    return bases, lines


# The kernel, as source: #@ lines are replaced by generated code in _generate().
KERNEL = """
def KERNEL_NAME(A, B, C, alpha_in, beta_in):
    m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
    alpha = f32(alpha_in)
    beta = f32(beta_in)
    tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0
    warp = tid // 32
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    mat = lane // 8  # the ldmatrix matrix this lane addresses a row of
    wm0 = (warp // WCOLS) * WM
    wn0 = (warp % WCOLS) * WN
    # whole 16-byte chunks: rows on 16 bytes (a chunk past a row's end is zero-filled)
    a_vec = (address(A) % 16 == 0 and A.strides[2] == ISZ and A.strides[1] % 16 == 0
             and A.strides[0] % 16 == 0)
    b_vec = (address(B) % 16 == 0 and B.strides[2] == ISZ and B.strides[1] % 16 == 0
             and B.strides[0] % 16 == 0)
    # One dynamic shared buffer, sized by the launch (so the ring may exceed the 48 KB of
    # static shared memory): A's STAGES tiles [BM][BK], then B's [BK][BN] from byte B_BYTES,
    # each row-major with its 16-byte chunks swizzled. As and Bs name the same buffer; every
    # access is by offset (B's include B_BYTES), as a view of part of it would cost a
    # run-time reshape.
    As = cuda.shared.array(0, elt, alignment=ALIGN)
    Bs = As
    acc = cuda.local.array((MI, NI, 4), f32)
    sa0, sa1 = A.strides[0] // ISZ, A.strides[1] // ISZ  # strides in elements
    sb0, sb1 = B.strides[0] // ISZ, B.strides[1] // ISZ
    bstep = BK * sb1 * ISZ  # bytes one k-tile moves down B
    #@BASES

    tiles_m = (m + BM - 1) // BM
    tiles_n = (n + BN - 1) // BN
    group = GROUP_M * tiles_n
    k_tiles = (k_len + BK - 1) // BK
    k_full = k_len // BK  # k-tiles wholly inside K
    kf0 = (STAGES - 1) * BK  # k of the first tile the interior loop copies
    k_fast = k_full - (STAGES - 1)  # k-tiles whose successor STAGES-1 on is wholly inside K
    z = cuda.blockIdx.z
    while z < C.shape[0]:
        za = z if A.shape[0] > 1 else 0
        zb = z if B.shape[0] > 1 else 0
        tile = cuda.blockIdx.x
        while tile < tiles_m * tiles_n:
            first = (tile // group) * GROUP_M
            gsize = min(tiles_m - first, GROUP_M)
            row0 = (first + (tile % group) % gsize) * BM
            col0 = ((tile % group) // gsize) * BN
            for i in range(MI):
                for j in range(NI):
                    for r in range(4):
                        acc[i, j, r] = zero
            # Prologue: tiles 0..STAGES-2 in flight, one commit group each.
            for s in range(STAGES - 1):
                if s < k_tiles:
                    load_stage(As, Bs, A, B, s, s * BK, za, zb, row0, col0, m, n, k_len,
                               a_vec, b_vec, tid)
                commit()
            # Element offsets of the stage read (rs) and written (ws) in this k-tile.
            #@STAGE_INIT
            kt = 0
            if a_vec and b_vec and row0 + BM <= m and col0 + BN <= n:
                # Interior: while the tile being copied is wholly inside K, every copy is
                # a whole 16-byte chunk at a per-thread offset that moves by a constant.
                kf = kf0
                #@OFFSETS
                while kt < k_fast:
                    wait_ring()  # tile kt has landed (this thread's copies)...
                    #@ROUND
                    cuda.syncthreads()  # ...and everyone's; stage (kt-1) % STAGES is free
                    #@FAST_COPIES
                    commit()
                    #@COMPUTE
                    #@BUMP
                    kf += BK
                    #@STAGE_NEXT_WS
                    kt += 1
            while kt < k_tiles:  # edge blocks, and the last STAGES-1 k-tiles of any block
                wait_ring()
                #@ROUND
                cuda.syncthreads()
                nt = kt + STAGES - 1
                if nt < k_tiles:
                    load_stage(As, Bs, A, B, nt % STAGES, nt * BK, za, zb, row0, col0, m,
                               n, k_len, a_vec, b_vec, tid)
                commit()  # always, so group counts stay aligned with tiles
                #@COMPUTE_EDGE
                #@STAGE_NEXT
                kt += 1
            wait_all()
            cuda.syncthreads()  # the next tile's prologue overwrites the ring
            #@EPILOGUE
            tile += cuda.gridDim.x
        z += cuda.gridDim.z
"""


SPEC = KernelSpec(
    name="mma",
    backend="cuda",
    rung=10,
    title="tensor cores (TF32, 3xTF32, FP16, BF16) with ldmatrix and a cp.async pipeline",
    build=build,
    params=(
        Param("BM", 128, (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (8, 16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 16, (8, 16, 32), "depth of a pipeline stage"),
        Param("WM", 64, (16, 32, 64, 128), "rows of C per warp (16 per mma fragment)"),
        Param("WN", 32, (8, 16, 32, 64), "columns of C per warp (8 per mma fragment)"),
        Param("STAGES", 4, (2, 3, 4), "shared tiles in the cp.async ring (dynamic shared "
              "memory: above 48 KB the kernel is opted in before its launch)"),
        Param("GROUP_M", 8, (1, 2, 4, 8, 16), "tile rows per group of the block order"),
        Param("PASSES", 1, (1, 3),
              "mma per step: 1 (precision='tf32') or 3 (precision='3xtf32'); set by precision="),
        Param("RCOPY", 0, (0, 1), "TF32 (PASSES=1) only: 1 = A and B rounded to TF32 by "
              "copies made before the kernel (one pass over each), 0 = each k-tile rounded "
              "in shared memory by the kernel"),
    ),
    constraints=(
        Constraint("BM % WM == 0 and BN % WN == 0",
                   lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0),
        Constraint("(BM/WM)*(BN/WN)*32 <= 1024 threads",
                   lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0
                   and _threads(p) <= 1024),
        Constraint("the float16 ring fits the 99 KB of dynamic shared memory every GPU "
                   "since sm_80 offers (float32 needs twice as much: checked against the "
                   "device's own maximum for the dtype before a launch)",
                   lambda p: _smem(p, 2) <= MIN_OPTIN_SMEM_SM80),
    ),
    dtypes=("float32", "float16", "bfloat16"),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    sim_params={"BM": 32, "BN": 16, "BK": 16, "WM": 16, "WN": 16, "STAGES": 2, "GROUP_M": 2,
                "PASSES": 1},  # BK=16: one m16n8k16 step for float16
    precisions=PRECISIONS, precision_param="PASSES", min_cc=(8, 0), dtype_check=_dtype_check,
    dynamic_smem=True,
)
