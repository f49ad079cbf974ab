"""Rung 8 — warptile: a warp-level tile between the block tile and the thread tile.

What changed from smem_layout: the BM×BN block tile is split into warp tiles WM×WN, one
per warp, and inside a warp tile the 32 threads form a (WSUBM/TM)×(WSUBN/TN) grid that
steps over WMITER×WNITER sub-tiles of WSUBM×WSUBN (siboehm's SGEMM kernel 10). Each
thread still owns WMITER·TM × WNITER·TN outputs (64 at the defaults), now as 1×2 separate
8×4 pieces of the warp tile. Loading (A transposed and swizzled, B row-major, 128-bit) is
rung 7's.

Why it should help: the warp becomes the unit that owns a compact, contiguous piece of C.
Per k step a warp now reads WM + WN = 96 distinct shared words (rung 7: 2·TM + BN = 144,
because its 32 threads span two thread rows across the whole 128-wide tile), so shared-
memory traffic per FMA drops by a third and each ``ld.shared.v4`` request is served from
fewer distinct 16-byte chunks (broadcasts inside a quarter-warp). It also ties the
schedule to the hardware hierarchy (block → SM shared memory, warp → scheduler, thread →
registers), the structure every faster GEMM (CUTLASS, tensor cores) builds on. siboehm
measures kernel 10 at ~ +5–10 % over his best non-warptiled kernel on A6000. Reads stay
conflict-free: a quarter-warp reads 4 consecutive B chunks and 2 A chunks 32 bytes apart.

Machine code (docs/performance.md): the kernel is generated as source at build time with
the BK k steps of a tile written out (``_codegen``), so every shared load is a per-thread
base plus a constant; blocks wholly inside the operands take an interior path that issues
all global loads of a k-tile before any shared store, at per-thread offsets bumped per
k-tile (``vload_at``), with no bounds checks; float32 asks for two blocks per SM (128
registers). FFMA share of an interior k-tile on sm_90: 68 % before, 90 % now. The
accumulators are named scalars, a new name per written-out k step (``k_step``), not a
local array: the same machine code, compiled in about 40 % of the time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.kernels.cuda._access import VECTOR_BYTES, access_ops, vload_at, width
from tilegemm.kernels.cuda._codegen import compile_source, indent
from tilegemm.kernels.cuda._jit import kernel_jit
from tilegemm.kernels.cuda._kmajor import FFMA_COPIES, RowMajorProgram
from tilegemm.launch import ceil_div, tile_grid
from tilegemm.registry import Constraint, KernelSpec, Param

cuda: Any = None  # numba.cuda, bound by build() (see tilegemm.kernels.cuda docstring)


def _wmiter(p: Mapping[str, int]) -> int:
    per_sub = 32 * p["TM"] * p["TN"] * p["WNITER"]  # outputs of one warp sub-tile step
    return (p["WM"] * p["WN"]) // per_sub if (p["WM"] * p["WN"]) % per_sub == 0 else 0


def _valid_warp(p: Mapping[str, int]) -> bool:
    """The 32 lanes exactly cover one WSUBM×WSUBN sub-tile with TM×TN each."""
    wmiter = _wmiter(p)
    if wmiter == 0 or p["WM"] % wmiter or p["WN"] % p["WNITER"]:
        return False
    wsubm, wsubn = p["WM"] // wmiter, p["WN"] // p["WNITER"]
    return (wsubm % p["TM"] == 0 and wsubn % p["TN"] == 0
            and (wsubm // p["TM"]) * (wsubn // p["TN"]) == 32)


def _threads(p: Mapping[str, int]) -> int:
    return (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) * 32


def _smem(p: Mapping[str, int], itemsize: int) -> int:
    return (p["BK"] * p["BM"] + p["BK"] * p["BN"]) * itemsize


@dataclass(frozen=True)
class WarpTiles:
    """A warp-tiled rung's tile sizes and what follows from them, by the names its
    generated kernel uses (rungs 8 and 9)."""

    BM: int
    BN: int
    BK: int
    TM: int
    TN: int
    WM: int
    WN: int
    WSUBM: int  # a warp sub-tile is WSUBM × WSUBN
    WSUBN: int
    LCOLS: int  # lanes across a warp sub-tile
    WCOLS: int  # warps across the block tile
    RT: int  # a thread's outputs: RT × CT
    CT: int
    NT: int  # threads per block

    @classmethod
    def of(cls, p: Mapping[str, int]) -> WarpTiles:
        wmiter = _wmiter(p)
        wsubm, wsubn = p["WM"] // wmiter, p["WN"] // p["WNITER"]
        return cls(BM=p["BM"], BN=p["BN"], BK=p["BK"], TM=p["TM"], TN=p["TN"], WM=p["WM"],
                   WN=p["WN"], WSUBM=wsubm, WSUBN=wsubn, LCOLS=wsubn // p["TN"],
                   WCOLS=p["BN"] // p["WN"], RT=wmiter * p["TM"], CT=p["WNITER"] * p["TN"],
                   NT=_threads(p))

    def names(self) -> dict[str, int]:
        return asdict(self)

    # A thread's i-th row is tr0 + row_off(i): TM rows in each of its WMITER sub-tiles,
    # WSUBM apart (columns likewise); ROW_EXPR and COL_EXPR say the same in the source.
    ROW_EXPR = "(i // TM) * WSUBM + i % TM"
    COL_EXPR = "(j // TN) * WSUBN + j % TN"

    def row_off(self, i: int) -> int:
        return (i // self.TM) * self.WSUBM + i % self.TM

    def col_off(self, j: int) -> int:
        return (j // self.TN) * self.WSUBN + j % self.TN


# How a thread of a warp-tiled kernel finds its warp's tile and its own first row and column.
WARP_MAPPING = ["warp = tid // 32", "lane = tid % 32",
                "wr0 = (warp // WCOLS) * WM  # this warp's tile inside the block tile",
                "wc0 = (warp % WCOLS) * WN",
                "tr0 = wr0 + (lane // LCOLS) * TM  # this thread's first row/column",
                "tc0 = wc0 + (lane % LCOLS) * TN"]

# The rules of warp tiling (rung 9 keeps them).
WARP_CONSTRAINTS = (
    Constraint("BM % WM == 0 and BN % WN == 0",
               lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0),
    Constraint("32 lanes cover one WSUBM x WSUBN sub-tile: WMITER = WM*WN/(32*TM*TN*WNITER)"
               " integral, (WSUBM/TM)*(WSUBN/TN) == 32", _valid_warp),
    Constraint("(BM/WM)*(BN/WN)*32 <= 1024 threads",
               lambda p: p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0
               and _threads(p) <= 1024),
)


def build(p: Mapping[str, int], dtype: np.dtype) -> CudaProgram:
    global cuda
    from numba import cuda

    t = WarpTiles.of(p)
    kernel = generate("warptile", p, dtype, dict(cuda=cuda, **t.names()), WARP_MAPPING,
                      t.RT, t.CT, t.ROW_EXPR, t.COL_EXPR, t.row_off, t.col_off, access_ops())
    return RowMajorProgram(kernel, (t.NT, 1, 1), tile_grid(t.BM, t.BN), **FFMA_COPIES)


def generate(name: str, p: Mapping[str, int], dtype: np.dtype, namespace: dict[str, Any],
             mapping: list[str], rt: int, ct: int, row_expr: str, col_expr: str,
             row_off: Callable[[int], int], col_off: Callable[[int], int], ops: Any,
             a_rows: bool = False) -> Any:
    """The kernel of a register-tiled rung with A transposed and swizzled in shared memory
    (rungs 7 and 8): ``mapping`` sets this thread's first row ``tr0`` and column ``tc0``
    from ``tid``; its i-th row is ``tr0 + row_off(i)`` (``row_expr`` in the epilogue's
    loop), its j-th column ``tc0 + col_off(j)``. ``ops``: the rung's ``access_ops()``.

    ``a_rows``: A stays row-major and unswizzled in shared memory, ``As[BM][BK]``, and is
    read one element per row per k step (rung 6; see ``_compute_rows``)."""
    BM, BN, BK = p["BM"], p["BN"], p["BK"]
    NT = namespace["NT"]
    W = width(dtype.itemsize)
    A_VPR, B_VPR = BK // W, BN // W
    A_VECS, B_VECS = BM * A_VPR, BK * B_VPR
    RPW = max(W, 32 * W // BK)  # rows of A one warp loads per round: the swizzle period
    ld, st, vload, vstore, gather, scatter, address, ALIGN = ops
    namespace = dict(
        namespace, BM=BM, BN=BN, BK=BK, RT=rt, CT=ct, W=W, ISZ=dtype.itemsize,
        VB=VECTOR_BYTES, A_VPR=A_VPR, B_VPR=B_VPR, A_VECS=A_VECS, B_VECS=B_VECS,
        A_ROUNDS=ceil_div(A_VECS, NT), B_ROUNDS=ceil_div(B_VECS, NT), RPW=RPW, ld=ld, st=st,
        vload=vload, vstore=vstore, gather=gather, scatter=scatter, address=address,
        vload_at=vload_at(), ALIGN=ALIGN, zero=dtype.type(0), nptype=dtype.type)
    source = KERNEL.replace("KERNEL_NAME", name)
    source = source.replace("#@STORE_C", indent(store_c(rt, ct, row_expr, col_expr), 16))
    source = source.replace("#@ZERO_ACC", indent(zero_acc(rt, ct), 16))
    source = source.replace("#@MAPPING", indent(mapping, 4))
    source = source.replace("#@BASES", indent(
        _bases(p, W, RPW, NT, rt, ct, row_off, col_off, a_rows), 4))
    source = source.replace("#@FAST_LOADS", indent(_fast_loads(p, W, NT, a_rows), 24))
    source = source.replace("#@COMPUTE", indent(
        _compute_rows(p, W, rt, ct, dtype.itemsize == 4) if a_rows
        else _compute(p, W, RPW, rt, ct), 20))
    source = source.replace("#@DECLARE_A", indent([A_ROWS if a_rows else A_TRANSPOSED], 4))
    source = source.replace("#@STORE_A", indent(
        STORE_A_ROWS if a_rows else STORE_A_TRANSPOSED, 32))
    offsets, bumps = _offsets(p, W, NT)
    source = source.replace("#@BLOCK_OFFSETS", indent(offsets, 16))
    source = source.replace("#@BUMP", indent(bumps, 20))
    # float32: two 256-thread blocks per SM, i.e. at most 128 registers a thread.
    return kernel_jit(NT, 2 if dtype.itemsize == 4 and NT <= 256 else 0)(
        compile_source(source, name, namespace))


def _sk(kk: int, w: int, rpw: int, bm: int) -> int:
    """The swizzle of k row ``kk`` of the transposed A tile (constant per k step)."""
    return ((kk // w) * rpw) & (bm - 1)


def _bases(p: Mapping[str, int], w: int, rpw: int, nt: int, RT: int, CT: int,
           row_off: Callable[[int], int], col_off: Callable[[int], int],
           a_rows: bool = False) -> list[str]:
    """Per-thread shared offsets, computed once: the k loop adds only constants to them."""
    lines = []
    if a_rows:  # row-major A: two bases of the same rows (see _compute_rows)
        lines += ["xa = tr0", "ya = tr0 + cuda.threadIdx.y  # == tr0: the block is 1-D"]
    else:
        for sk in sorted({_sk(kk, w, rpw, p["BM"]) for kk in range(p["BK"])}):
            for i in range(0, RT, w):
                lines.append(f"xa_{sk}_{i} = (tr0 + {row_off(i)}) ^ {sk}")
    for j in range(0, CT, w):
        lines.append(f"xb_{j} = tc0 + {col_off(j)}")
    a_vpr, b_vpr = p["BK"] // w, p["BN"] // w
    for rnd in range(ceil_div(p["BM"] * a_vpr, nt)):
        lines += [f"ar{rnd} = (tid + {rnd * nt}) // {a_vpr}",
                  f"ac{rnd} = ((tid + {rnd * nt}) % {a_vpr}) * {w}"]
        if not a_rows:
            lines.append(f"asw{rnd} = ar{rnd} ^ (((ac{rnd} // {w}) * {rpw}) & {p['BM'] - 1})")
    for rnd in range(ceil_div(p["BK"] * b_vpr, nt)):
        lines += [f"br{rnd} = (tid + {rnd * nt}) // {b_vpr}",
                  f"bc{rnd} = ((tid + {rnd * nt}) % {b_vpr}) * {w}"]
    return lines


def _fast_loads(p: Mapping[str, int], w: int, nt: int, a_rows: bool = False) -> list[str]:
    """An interior k-tile: every global load first (no bounds checks), then the stores."""
    a_vecs, b_vecs = p["BM"] * (p["BK"] // w), p["BK"] * (p["BN"] // w)
    loads, stores = [], []
    for rnd in range(ceil_div(a_vecs, nt)):
        load = f"ga{rnd} = vload_at(A, (za, row0 + ar{rnd}, k0 + ac{rnd}), oa{rnd})"
        store = ([f"vstore(As, (ar{rnd}, ac{rnd}), ga{rnd})"] if a_rows else
                 [f"st(As, (ac{rnd} + {q}, asw{rnd}), ga{rnd}[{q}])" for q in range(w)])
        if (rnd + 1) * nt <= a_vecs:
            loads.append(load)
            stores += store
        else:  # a partial last round: its threads load and store at once
            stores += [f"if tid + {rnd * nt} < {a_vecs}:", "    " + load,
                       *("    " + x for x in store)]
    for rnd in range(ceil_div(b_vecs, nt)):
        load = f"gb{rnd} = vload_at(B, (zb, k0 + br{rnd}, col0 + bc{rnd}), ob{rnd})"
        store = [f"vstore(Bs, (br{rnd}, bc{rnd}), gb{rnd})"]
        if (rnd + 1) * nt <= b_vecs:
            loads.append(load)
            stores += store
        else:
            stores += [f"if tid + {rnd * nt} < {b_vecs}:", "    " + load, "    " + store[0]]
    return loads + stores


def _offsets(p: Mapping[str, int], w: int, nt: int,
             strided: bool = False) -> tuple[list[str], list[str]]:
    """Element offsets of this thread's global loads in the first k-tile of a block tile,
    and what one k-tile adds to them. Used on the interior path, where A's k stride and
    B's n stride are one element; ``strided``: with those strides too (``sa2``, ``sb2``),
    so that the edge path can address its elements from them (rung 9)."""
    a_rounds = ceil_div(p["BM"] * (p["BK"] // w), nt)
    b_rounds = ceil_div(p["BK"] * (p["BN"] // w), nt)
    sa2, sb2 = (" * sa2", " * sb2") if strided else ("", "")
    offsets = [f"oa{r} = za * sa0 + (row0 + ar{r}) * sa1 + ac{r}{sa2}" for r in range(a_rounds)]
    b_col = "(col0 + bc{r}) * sb2" if strided else "col0 + bc{r}"
    offsets += [f"ob{r} = zb * sb0 + br{r} * sb1 + " + b_col.format(r=r)
                for r in range(b_rounds)]
    bumps = [f"oa{r} += BK{sa2}" for r in range(a_rounds)]
    bumps += [f"ob{r} += BK * sb1" for r in range(b_rounds)]
    return offsets, bumps


def _compute(p: Mapping[str, int], w: int, rpw: int, RT: int, CT: int,
             buf: str = "") -> list[str]:
    """The BK k steps of one tile, written out: shared loads at base + constant, FMAs.

    Every k step's operands get names of their own (``a3_k5``; ``_b1`` for buffer 1 of
    pipelined), and so do its sums (``c3_5_k5``, see :func:`k_step`), so each is assigned
    once: numba's SSA reconstruction looks up the reaching definition of a reassigned
    variable with a linear scan of its block, which made it quadratic in the length of the
    written-out code. The last step sums into the accumulators themselves (``c3_5``).

    Those are the loop's carried values, and numba's phi removal places each one's copy
    for the back edge by scanning the block that ends the loop body, comparing statements
    field by field: ~1 s for rungs 6-8, whose k-tile and its bumps were one block. Their
    kernel therefore issues the barrier after the k steps under ``if tid >= 0``, which
    is always true (``tid`` is ``threadIdx.x & 1023``) and removed by LLVM, so the machine
    code is the same, but it ends numba's block there. Rung 9's k-tiles already end in a
    branch."""
    lines = []
    tag = f"_b{buf[0]}" if buf else ""
    for kk in range(p["BK"]):
        sk = _sk(kk, w, rpw, p["BM"])
        lines += [f"# k step {kk}", *k_step(
            RT, CT, w, f"_k{kk}{tag}",
            [f"({buf}{kk}, xa_{sk}_{i})" for i in range(0, RT, w)],
            [f"({buf}{kk}, xb_{j})" for j in range(0, CT, w)],
            c_in=_sum_suffix(kk - 1, p["BK"], tag), c_out=_sum_suffix(kk, p["BK"], tag))]
    return lines


def _sum_suffix(kk: int, bk: int, tag: str) -> str:
    """The suffix of the partial sums after written-out k step ``kk`` of ``bk``: none
    before the first step and after the last (the accumulators ``c3_5`` themselves)."""
    return "" if kk < 0 or kk == bk - 1 else f"_k{kk}{tag}"


def acc_name(i: int, j: int, sfx: str = "") -> str:
    """The accumulator of a thread's output row ``i``, column ``j`` (``sfx``: a partial
    sum of a written-out k-tile)."""
    return f"c{i}_{j}{sfx}"


def zero_acc(RT: int, CT: int) -> list[str]:
    """The accumulators set to zero before a tile of C."""
    return [f"{acc_name(i, j)} = zero" for i in range(RT) for j in range(CT)]


def k_step(RT: int, CT: int, w: int, sfx: str, a_at: list[str], b_at: list[str],
           a_vectors: bool = True, c_in: str = "", c_out: str = "") -> list[str]:
    """One k step of a thread tile, as source: its RT values of A and CT of B from shared
    memory into ``a{i}{sfx}`` and ``b{j}{sfx}``, then the RT × CT FMAs
    ``c{i}_{j}{c_out} = c{i}_{j}{c_in} + a{i}{sfx} * b{j}{sfx}``.

    B comes in 128-bit loads at the indices ``b_at`` (one per vector); A likewise at
    ``a_at``, or with ``a_vectors=False`` one element per row (``a_at``: one per row).
    Shared by the generated compute loops of rungs 6-9.

    The accumulators are plain local names, not a ``cuda.local.array``: ``acc[i, j] +=``
    is an array read, a multiply-add and an array write, each typed and lowered by numba
    (and the array left to LLVM to split into registers again), three times the work of
    one assignment; typing and lowering are most of a first call's compile time. A loop
    (``c_in == c_out``) updates the accumulators in place; written-out steps chain new
    names (``c3_5_k6`` from ``c3_5_k5``) so that no name is assigned twice in one block
    (see :func:`_compute`). The sum is the same expression as before, so NVVM contracts
    it into the same fused multiply-add, in the same k order."""
    def names(x: str, first: int) -> str:
        return ", ".join(f"{x}{first + q}{sfx}" for q in range(w))

    if a_vectors:
        lines = [f"{names('a', i)} = vload(As, {at})" for i, at in zip(range(0, RT, w), a_at)]
    else:
        lines = [f"a{i}{sfx} = ld(As, {at})" for i, at in zip(range(RT), a_at)]
    lines += [f"{names('b', j)} = vload(Bs, {at})" for j, at in zip(range(0, CT, w), b_at)]
    for i in range(RT):
        lines += [f"{acc_name(i, j, c_out)} = {acc_name(i, j, c_in)} + a{i}{sfx} * b{j}{sfx}"
                  for j in range(CT)]
    return lines


def _compute_rows(p: Mapping[str, int], w: int, RT: int, CT: int,
                  written_out: bool = True) -> list[str]:
    """The BK k steps of one tile with A row-major in shared memory (rung 6), written out:
    per k step one scalar load per row of A (``As[row][k]``), the 128-bit loads of B, the
    FMAs.

    Even k steps address A through ``xa``, odd ones through ``ya``, the same value that
    LLVM cannot prove equal: with one base, LLVM's load-store vectorizer fuses the scalar
    loads of four consecutive k steps into one 128-bit load along k, which keeps 4·TM
    values of A live (32 registers at the defaults) and spills at the 128 registers two
    blocks per SM allow. Reading A along k in vectors is a different kernel, not rung 6.

    ``written_out=False`` (float64) keeps the k steps a loop: written out, they need more
    than 255 registers on sm_90 next to the 128 registers of float64 accumulators."""
    def step(k: object, base: str, sfx: str, c_in: str = "", c_out: str = "") -> list[str]:
        return k_step(RT, CT, w, sfx, [f"({base} + {i}, {k})" for i in range(RT)],
                      [f"({k}, xb_{j})" for j in range(0, CT, w)], a_vectors=False,
                      c_in=c_in, c_out=c_out)

    if not written_out:
        return ["kk = 0", "while kk < BK:", *("    " + ln for ln in step("kk", "xa", "")),
                "    kk += 1"]
    lines = []
    for kk in range(p["BK"]):
        lines += [f"# k step {kk}", *step(kk, "ya" if kk % 2 else "xa", f"_k{kk}",
                                          _sum_suffix(kk - 1, p["BK"], ""),
                                          _sum_suffix(kk, p["BK"], ""))]
    return lines


# How the generated kernel declares and fills the A tile: transposed and swizzled (rungs
# 7-9) or row-major (rung 6). On the edge path STORE_A puts av (the W elements at row r,
# columns c...c+W-1 of the tile) in place.
A_TRANSPOSED = "As = cuda.shared.array((BK, BM), nptype, alignment=ALIGN)  # transposed, swizzled"
A_ROWS = "As = cuda.shared.array((BM, BK), nptype, alignment=ALIGN)  # row-major"
STORE_A_TRANSPOSED = ["swz = r ^ (((c // W) * RPW) & (BM - 1))",
                      "for q in range(W):",
                      "    st(As, (c + q, swz), av[q])"]
STORE_A_ROWS = ["vstore(As, (r, c), gather(av, (0,)))"]

# The epilogue of the warp-tiled kernels (rungs 8 and 9): C, one thread row at a time. Row 0
# of acc is always the one written and the rows shift up after it, so every index into acc
# is a compile-time constant and acc stays in registers (a loop over i that LLVM does not
# unroll would put acc in local memory). ROW_EXPR and COL_EXPR: a thread's i-th row and
# j-th column from its first (WarpTiles).
STORE_C = """\
for i in range(RT):
    gr = row0 + tr0 + ROW_EXPR
    if gr < m:
        for j in range(0, CT, W):
            gc = col0 + tc0 + COL_EXPR
            if c_vec and gc < n_vec:
                if beta == 0:
                    for q in range(W):
                        cv[q] = alpha * acc[0, j + q]
                else:
                    scatter(cv, (0,), vload(C, (z, gr, gc)))
                    for q in range(W):
                        cv[q] = alpha * acc[0, j + q] + beta * cv[q]
                vstore(C, (z, gr, gc), gather(cv, (0,)))
            else:
                for q in range(W):
                    if gc + q < n:
                        if beta == 0:
                            st(C, (z, gr, gc + q), alpha * acc[0, j + q])
                        else:
                            st(C, (z, gr, gc + q), alpha * acc[0, j + q]
                               + beta * ld(C, (z, gr, gc + q)))
    for r in range(RT - 1):
        for j in range(CT):
            acc[r, j] = acc[r + 1, j]
"""


def store_c(RT: int, CT: int, row_expr: str, col_expr: str) -> list[str]:
    """The lines of STORE_C for a thread layout whose rows and columns are ``row_expr``
    and ``col_expr`` (in i and j) away from its first, after the accumulators are copied
    into ``acc`` (an RT × CT ``cuda.local.array``).

    Why the copy: written with the accumulators' names instead (the row loop moving names
    up, the columns written out), the epilogue is the same arithmetic, but LLVM and ptxas
    lay the kernel out differently: on sm_80, warptile float32 then spilled 96 bytes in
    its k loop (FFMA share 90 % -> 86 %) and pipelined gained 28 moves per pair of
    k-tiles. With the copy, the PTX is the one the array-based kernel had, instruction for
    instruction, and the 64 copies cost numba little next to the ~1,000 FMAs of a k-tile."""
    copy = [f"acc[{i}, {j}] = {acc_name(i, j)}" for i in range(RT) for j in range(CT)]
    return copy + STORE_C.replace("ROW_EXPR", row_expr).replace("COL_EXPR", col_expr
                                                                ).splitlines()


# Whether each operand moves in 128-bit vectors: unit stride along its rows, its base,
# row and batch strides 16-byte aligned. Checked once per launch, per operand; one that
# fails takes the element-wise path. A row's length need not be whole vectors (a copy's
# rows are padded to 16 bytes, an out= view may be narrower than its rows): on the edge
# paths a vector that would cross the row's end goes element by element. Rungs 6-9
# share it.
VECTOR_CHECKS = """\
    a_vec = (address(A) % VB == 0 and A.strides[2] == ISZ and A.strides[1] % VB == 0
             and A.strides[0] % VB == 0)
    b_vec = (address(B) % VB == 0 and B.strides[2] == ISZ and B.strides[1] % VB == 0
             and B.strides[0] % VB == 0)
    c_vec = (address(C) % VB == 0 and C.strides[2] == ISZ and C.strides[1] % VB == 0
             and C.strides[0] % VB == 0)
    k_vec = k_len - (W - 1)  # a vector from column gc lies inside a row of A if gc < k_vec
    n_vec = n - (W - 1)  # ... of B or C if gc < n_vec
"""

# The kernel, as source: #@ lines are replaced by generated code in build(); the vector
# checks here, at import.
KERNEL = """
def KERNEL_NAME(A, B, C, alpha, beta):
    m, n, k_len = C.shape[1], C.shape[2], A.shape[2]
    tid = cuda.threadIdx.x & 1023  # < 1024 anyway; tells LLVM tid >= 0 (see rung 5)
#@MAPPING
#@VECTOR_CHECKS

#@DECLARE_A
    Bs = cuda.shared.array((BK, BN), nptype, alignment=ALIGN)
    av = cuda.local.array(W, nptype)
    acc = cuda.local.array((RT, CT), nptype)  # the accumulators, for the epilogue only
    cv = cuda.local.array(W, nptype)
    sa0, sa1 = A.strides[0] // ISZ, A.strides[1] // ISZ  # strides in elements
    sb0, sb1 = B.strides[0] // ISZ, B.strides[1] // ISZ
#@BASES

    z = cuda.blockIdx.z
    while z < C.shape[0]:
        za = z if A.shape[0] > 1 else 0
        zb = z if B.shape[0] > 1 else 0
        bm = cuda.blockIdx.y
        while bm < (m + BM - 1) // BM:
            bn = cuda.blockIdx.x
            while bn < (n + BN - 1) // BN:
                row0 = bm * BM
                col0 = bn * BN
#@BLOCK_OFFSETS
#@ZERO_ACC
                # Block-uniform: the whole tile is inside A, B and C, and vectors are safe.
                inner = a_vec and b_vec and row0 + BM <= m and col0 + BN <= n
                k0 = 0
                while k0 < k_len:
                    if inner and k0 + BK <= k_len:
#@FAST_LOADS
                    else:
                        for rnd in range(A_ROUNDS):
                            v = tid + rnd * NT
                            if v < A_VECS:
                                r = v // A_VPR
                                c = (v % A_VPR) * W
                                gr = row0 + r
                                gc = k0 + c
                                if a_vec and gr < m and gc < k_vec:
                                    scatter(av, (0,), vload(A, (za, gr, gc)))
                                else:
                                    for q in range(W):
                                        if gr < m and gc + q < k_len:
                                            av[q] = ld(A, (za, gr, gc + q))
                                        else:
                                            av[q] = zero
#@STORE_A
                        for rnd in range(B_ROUNDS):
                            v = tid + rnd * NT
                            if v < B_VECS:
                                r = v // B_VPR
                                c = (v % B_VPR) * W
                                gr = k0 + r
                                gc = col0 + c
                                if b_vec and gr < k_len and gc < n_vec:
                                    vstore(Bs, (r, c), vload(B, (zb, gr, gc)))
                                else:
                                    for q in range(W):
                                        if gr < k_len and gc + q < n:
                                            Bs[r, c + q] = ld(B, (zb, gr, gc + q))
                                        else:
                                            Bs[r, c + q] = zero
                    cuda.syncthreads()
#@COMPUTE
                    if tid >= 0:  # always true; ends the k-tile's block for numba (_compute)
                        cuda.syncthreads()
                    k0 += BK
#@BUMP
                # C, one thread row at a time (see STORE_C).
#@STORE_C
                bn += cuda.gridDim.x
            bm += cuda.gridDim.y
        z += cuda.gridDim.z
""".replace("#@VECTOR_CHECKS\n", VECTOR_CHECKS)


SPEC = KernelSpec(
    name="warptile",
    backend="cuda",
    rung=8,
    title="warp tiles between block and thread tiles (siboehm kernel 10)",
    build=build,
    params=(
        Param("BM", 128, (32, 64, 128, 256), "rows of C per block"),
        Param("BN", 128, (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", 16, (8, 16, 32), "depth of the shared-memory tiles"),
        Param("WM", 64, (16, 32, 64, 128), "rows of C per warp"),
        Param("WN", 32, (16, 32, 64, 128), "columns of C per warp"),
        Param("WNITER", 2, (1, 2, 4), "warp sub-tiles across WN"),
        Param("TM", 8, (4, 8), "rows of C per thread per sub-tile (whole vectors)"),
        Param("TN", 4, (4, 8), "columns of C per thread per sub-tile (whole vectors)"),
    ),
    constraints=(
        *WARP_CONSTRAINTS,
        Constraint("float32 tiles fit the 48 KB of static shared memory",
                   lambda p: _smem(p, 4) <= 48 * 1024),
    ),
    threads=_threads,
    smem=_smem,
    doc=__doc__,
    sim_params={"BM": 32, "BN": 16, "BK": 8, "WM": 32, "WN": 16, "WNITER": 1,
                "TM": 4, "TN": 4},
)
