"""Source of the blocked CPU rung, written out once per (tile, dtype) and cached.

:mod:`tilegemm.compile_cache` copies this file with the lines between the ``@header``
markers replaced by one tile's constants (MR, NR; the cache blocks MC, KC, NC are
arguments, bound by ``bind``) and the ``@ukernel`` block replaced by
the generated MR×NR micro-kernel, then imports the copy. Every function is compiled with
an explicit signature and ``cache=CACHE``, so Numba stores the machine code beside the
copy and a new process loads it instead of compiling for several seconds; and only the
functions Python calls are loaded (``CALLED_FROM_PYTHON``), each on its first call: the
others' code is already inside theirs (see ``_lazy``), except the few heavy pieces that
compiled code calls through ``call_*`` (``called_by_name``): those are compiled once and
loaded with the first function that reaches them. Module constants (not closures)
carry the parameters: Numba freezes them into the code, and a closure over other compiled
functions cannot be cached. See ``k02_blocked`` for what the loop nest does and why.
"""

import itertools

import numba
import numpy as np
from numba import prange

from tilegemm.kernels.cpu._dot_tile import (
    DOT_GROUP,
    DOT_MAX,
    DOT_TILED_A_BYTES,
    dot_columns,
    dot_limit,
    dot_tile,
)
from tilegemm.kernels.cpu._lazy import called_by_name, load_compiled
from tilegemm.kernels.cpu._lazy import njit_when_called as when_called
from tilegemm.kernels.cpu._packing import (
    block_transposer,
    columns_per_pack,
    copy_run,
    transposer,
)
from tilegemm.kernels.cpu._slp import prefetch_write, slp_enabled
from tilegemm.kernels.cpu._small_tile import (
    ALIASED_KC,
    ALIASED_STRIDE,
    FEW_ROWS,
    FEW_SPLIT_BYTES_8,
    REREAD_KC,
    TILED_BYTES,
    eight_row_vectors,
    few_rows_limit,
    few_tiled_limit,
    few_vectors,
    narrow_columns,
    small_tile,
    wide_columns,
)
from tilegemm.kernels.cpu._small_tile import width as small_width
from tilegemm.kernels.cpu._threads import (
    InParallel,
    parallel_unsafe,
    place_workers,
    pool_threads,
)
from tilegemm.kernels.cpu._vector_tile import tile_loop, tile_store
from tilegemm.kernels.cpu._workspace import workspace
from tilegemm.kernels.cpu.k02_blocked import b_chunk_bytes, l2_budget, vector_direct_bytes

# @header (replaced for each parameter set; these values only make the template importable)
MR, NR = 16, 8
DTYPE = "float32"
CACHE = False
SMALL_PRODUCT = 96 * 96 * 96
DIRECT_PRODUCT = 64 * 64 * 64
UNPACKED_PRODUCT = 384 * 384 * 384
BATCH_PRODUCT = 256 * 256 * 256
BATCH_SPLIT_MIN = 2
VECTOR_BITS = None  # widest vectors the code may use (None: LLVM's choice for the CPU)
K_UNROLL = 4  # K steps per trip of the micro-kernel's loop
# more than MC rows are one row block only with this many columns of B per task
# (k02_blocked.ONE_BLOCK_TASK_COLUMNS)
ONE_BLOCK_TASK_COLUMNS = 256
# products up to this many multiply-adds are one row block too, with at least
# ONE_REGION_TASK_COLUMNS columns per thread (k02_blocked.ONE_REGION_PRODUCT)
ONE_REGION_PRODUCT = 384 * 384 * 384
ONE_REGION_TASK_COLUMNS = 64
# products of at most this many columns, A given transposed, are computed as their
# transpose (k02_blocked.TRANSPOSE_COLUMNS, see swaps_narrow)
TRANSPOSE_COLUMNS = 64
# @end-header

BATCH_TASKS = 4  # runs of small products per thread in a batch (phase 2)
# How much of B a task of one row block packs at a time, and the share of this CPU's L2
# that decides which products of more than MC rows are one row block too (see
# k02_blocked.one_row_block): module globals, read by ``blocked`` on every call, so tests
# can set them.
B_CHUNK_BYTES = b_chunk_bytes()
L2_BUDGET = l2_budget()

mr, nr = MR, NR
_dt = np.dtype(DTYPE)
nbt = numba.from_dtype(_dt)
zero = _dt.type(0)
one = _dt.type(1)
uint64 = numba.uint64
nr_u = np.uint64(nr)
FLAGS: dict = {"error_model": "numpy", "boundscheck": False, "cache": CACHE}
if _dt.kind == "f":
    FLAGS["fastmath"] = {"contract"}
i8, flag = numba.int64, numba.boolean
# Every parameter but the tile is an argument, not a constant: a tile compiles once for
# every value a tuner, the database or a test gives them. ``bind`` puts them in one tuple,
# ``cb``, that compiled code passes on:
#   cb[0], cb[1], cb[2]: the cache blocks MC, KC, NC (rows, depth and columns of a block);
#   cb[3]: FEW_KC, K steps per panel, at most, of a product of 2-7 rows (``few_rows``);
#   cb[4]: FEW_KB in bytes, B up to which a product of 2-7 rows runs on the calling thread;
#   cb[5]: UNPACKED_KB in bytes, B up to which a mid-size product runs unpacked
#          (``takes_rows``).
blocks = numba.types.UniTuple(i8, 6)
ro1, ro2, ro3 = (numba.types.Array(nbt, nd, "C", readonly=True) for nd in (1, 2, 3))
a1, a2, a3, a4 = nbt[::1], nbt[:, ::1], nbt[:, :, ::1], nbt[:, :, :, ::1]
# Scratch arrays start on 64-byte boundaries of the workspace (in elements).
ALIGN = max(1, 64 // _dt.itemsize)
ITEMSIZE = _dt.itemsize
prefetch_w = prefetch_write()
# The micro-kernel's K loop, as explicit vector code (see _vector_tile) ...
kloop = tile_loop(MR, NR, _dt, VECTOR_BITS, K_UNROLL)
# ... and the tile's write-back into C (C = alpha*tile, or alpha*tile + bb*C)
tstore = tile_store(MR, NR, _dt, VECTOR_BITS, False)
tstore_c = tile_store(MR, NR, _dt, VECTOR_BITS, True)
# Packing's vector copies (see _packing): runs of a row, and MR rows × PACK_W columns of A
# transposed into a strip.
copy_n = copy_run()
PACK_W = columns_per_pack(_dt, VECTOR_BITS)
pack_cols = transposer(MR, PACK_W)
pack_cols_b = transposer(NR, PACK_W)  # B given as its transpose: NR rows of it per strip
# The unpacked tiles of small and narrow products (see _small_tile): 8, 4, 2 or 1 rows of
# C × one vector of columns.
SMALL_W = small_width(_dt.itemsize, VECTOR_BITS)
NARROW_N = narrow_columns(_dt.itemsize, VECTOR_BITS)  # products this narrow take them at any size
stile8, stile4, stile2, stile1 = (small_tile(rows, SMALL_W, _dt) for rows in (8, 4, 2, 1))
# ... and 8 rows × as many vectors as the registers hold (``eight_row_vectors``: 3 on
# AVX-512, 2 on NEON, 1 on AVX2, where this tile is not used) for the full-width part of the
# rows: per K step each load of A feeds several FMAs, not one (float32 96³ on one Zen 5 core
# 10.0 -> 7.2 µs); with it, products up to UNPACKED_PRODUCT run unpacked (``small``,
# ``takes_rows``)
DW8 = wide_columns(_dt.itemsize, VECTOR_BITS)
wtile8 = small_tile(8, SMALL_W, _dt, eight_row_vectors(VECTOR_BITS))
# ... and the same for the columns left after its full passes where, with AVX-512 code, they
# fill more than two of its three vectors (measured there; NEON's two-vector tile never
# gets more than one vector left, single-vector passes take it): only the last one masked
rtile8 = small_tile(8, SMALL_W, _dt, eight_row_vectors(VECTOR_BITS),
                    whole=eight_row_vectors(VECTOR_BITS) - 1)
# Products of 8-15 rows on those CPUs (``FEW_MAX`` = 16; 8 elsewhere): the wide tile on
# their first 8 rows, then a tile of the other 1-7 rows exactly as wide, on the same
# columns (``few_rows``); and of 16 to ``FEW_TILED`` - 1 rows with B within TILED_BYTES:
# the wide tile on each 8 rows in turn, then the other rows' tile
FEW_MAX = few_rows_limit(VECTOR_BITS)
FEW_TILED = few_tiled_limit(VECTOR_BITS)
# ... and with B given transposed, 16 to ``DOT_TILED`` - 1 rows while A is within
# DOT_TILED_A_BYTES: dot products (``_dot_tile``)
DOT_TILED = dot_limit(VECTOR_BITS)
ptile8 = small_tile(8, SMALL_W, _dt, eight_row_vectors(VECTOR_BITS), prefetch=True)
rtile1, rtile2, rtile3, rtile4, rtile5, rtile6, rtile7 = (
    small_tile(rows, SMALL_W, _dt, eight_row_vectors(VECTOR_BITS)) for rows in range(1, 8))
# Products of 2-7 rows: one tile of all their rows, FW2..FW7 columns wide, prefetching the
# next tile's part of each row of B (see _small_tile.few_vectors).
FW2, FW3, FW4, FW5, FW6, FW7 = (few_vectors(rows, VECTOR_BITS) * SMALL_W for rows in range(2, 8))
ftile2, ftile3, ftile4, ftile5, ftile6, ftile7 = (
    small_tile(rows, SMALL_W, _dt, few_vectors(rows, VECTOR_BITS), prefetch=True)
    for rows in range(2, 8))
# ... and, with B given as its transpose, tiles of 4, 2 and 1 rows × DC4/DC2/DC1 columns of
# dot products along K (see _dot_tile)
DC4, DC2, DC1 = (dot_columns(rows, VECTOR_BITS) for rows in (4, 2, 1))
dtile4, dtile2, dtile1 = (dot_tile(rows, dot_columns(rows, VECTOR_BITS), SMALL_W, _dt)
                          for rows in (4, 2, 1))


# @ukernel (replaced by k02_blocked.micro_kernel_source(), its one definition)
def ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, bb, mode):
    raise NotImplementedError
# @end-ukernel


# the micro-kernel alone is compiled with the SLP vectoriser on
ukernel = when_called(numba.void(i8, a3, i8, a3, i8, a2, a2, i8, i8, nbt, nbt, i8),
                      settings=(slp_enabled,), **FLAGS)(ukernel)


@when_called(a3(i8, i8, i8, a3), **FLAGS)
def aligned3(d0, d1, d2, like):
    """An uninitialised C-contiguous (d0, d1, d2) array of ``like``'s dtype that starts on a
    64-byte boundary. Numba aligns arrays to 32 bytes, so with AVX-512 every other 64-byte
    load of a packed B row would straddle two cache lines (measured: 5 % of the rung)."""
    n = d0 * d1 * d2
    isz = like.itemsize
    buf = np.empty(n + 64 // isz, dtype=like.dtype)
    off = ((64 - buf.ctypes.data % 64) % 64) // isz
    return buf[off:off + n].reshape((d0, d1, d2))


# Operands given transposed (an F-ordered array, ``x.T``): packed from that layout, with no
# transposing copy first. A row of the stored array is contiguous in K here.
PACK_KB = 32  # K steps per pass of pack_bt: its rows' pieces and the strip lines in L1


@when_called(numba.void(ro2, i8, i8, i8, i8, a3, i8, i8), **FLAGS)
def pack_bt(Bt, pc, kc, jc, nc, Bp, s0, s1):
    """Bp[s, p, j] = Bt[jc + s*NR + j, pc + p], zero beyond column nc: B stored as its
    transpose (N, K). Each stored row (one column of B) is read front to back in passes of
    ``PACK_KB`` K steps, each value written NR elements from the last: the NR rows of a
    strip and the ``PACK_KB`` lines of the strip they fill stay in L1 during a pass. Whole
    strips go ``PACK_W`` steps at a time, NR rows loaded as vectors and transposed in
    registers (``pack_cols_b``)."""
    kv = kc // PACK_W * PACK_W
    for s in range(s0, s1):
        j0 = s * nr
        width = max(0, min(nr, nc - j0))
        if width == nr:  # a whole strip: PACK_W steps at a time, transposed in registers
            for q in range(0, kv, PACK_W):
                pack_cols_b(Bp, (s, q, 0), Bt, (jc + j0, pc + q))
            for j in range(nr):
                row = Bt[jc + j0 + j]
                for q in range(kv, kc):
                    Bp[s, q, j] = row[pc + q]
            continue
        for q0 in range(0, kc, PACK_KB):
            q1 = min(kc, q0 + PACK_KB)
            for j in range(width):
                row = Bt[jc + j0 + j]
                for q in range(q0, q1):
                    Bp[s, q, j] = row[pc + q]
            for j in range(width, nr):
                for q in range(q0, q1):
                    Bp[s, q, j] = zero


@when_called(numba.void(ro2, i8, i8, i8, i8, a3), **FLAGS)
def pack_at(At, ic, mc, pc, kc, Ap):
    """Ap[r, p, i] = At[pc + p, ic + r*MR + i], zero beyond row mc: A stored as its
    transpose (K, M). For each p, one stored row holds the MR values of every strip side
    by side: read front to back, copied MR at a time (``copy_n``, vector moves)."""
    full = mc // mr
    nstrips = (mc + mr - 1) // mr
    for q in range(kc):
        row = At[pc + q]
        for r in range(full):
            copy_n(Ap, (r, q, 0), At, (pc + q, ic + r * mr), mr)
        for r in range(full, nstrips):
            i0 = r * mr
            height = min(mr, mc - i0)
            for i in range(height):
                Ap[r, q, i] = row[ic + i0 + i]
            for i in range(height, mr):
                Ap[r, q, i] = zero


@when_called(numba.void(ro2, i8, i8, i8, i8, a3, i8, i8, flag), **FLAGS)
def pack_b(B, pc, kc, jc, nc, Bp, s0, s1, tb):
    """Bp[s, p, j] = B[pc + p, jc + s*NR + j], zero beyond column nc (``tb``: B is given as
    its transpose, an (N, K) array, see ``pack_bt``).

    Rows of B outermost: each row's part of strips s0..s1 is read once, front to back, and
    scattered into the strips. Strip by strip instead, every NR-wide piece of a row lies
    in another page (B's rows are N elements apart), so the hardware prefetcher never
    engaged: packing B took 25-30 % longer (measured at 1024³, see docs/cpu.md). Each
    whole NR-wide piece is one ``copy_n`` (vector moves; element by element, Numba's
    indexing left scalar moves and scatters: 4-5× slower with the panel in L2).
    """
    if tb:
        pack_bt(B, pc, kc, jc, nc, Bp, s0, s1)
        return
    full = max(s0, min(s1, nc // nr))  # strips s0..full lie wholly inside the panel
    for q in range(kc):
        row = B[pc + q]
        for s in range(s0, full):
            copy_n(Bp, (s, q, 0), B, (pc + q, jc + s * nr), nr)
        for s in range(full, s1):
            j0 = s * nr
            width = max(0, min(nr, nc - j0))
            for j in range(width):
                Bp[s, q, j] = row[jc + j0 + j]
            for j in range(width, nr):
                Bp[s, q, j] = zero


@when_called(numba.void(ro2, i8, i8, i8, i8, a3, flag), **FLAGS)
def pack_a(A, ic, mc, pc, kc, Ap, ta):
    """Ap[r, p, i] = A[ic + r*MR + i, pc + p], zero beyond row mc (``ta``: A is given as
    its transpose, a (K, M) array, see ``pack_at``).

    Whole strips are written in the order they are stored (for each p, the MR values of
    one column), reading MR rows of A side by side; row by row, each value was a store
    MR elements from the last, and packing A took about 35 % longer (measured at 1024³,
    see docs/cpu.md). ``PACK_W`` columns at a time are loaded as MR vectors and transposed
    in registers (``pack_cols``): 2.2-2.5× faster than element by element. A partial last
    strip goes row by row, zero-filled.
    """
    if ta:
        pack_at(A, ic, mc, pc, kc, Ap)
        return
    full = mc // mr
    kv = kc // PACK_W * PACK_W
    for r in range(full):
        i0 = ic + r * mr
        for q in range(0, kv, PACK_W):
            pack_cols(Ap, (r, q, 0), A, (i0, pc + q))
        for q in range(kv, kc):
            for i in range(mr):
                Ap[r, q, i] = A[i0 + i, pc + q]
    for r in range(full, (mc + mr - 1) // mr):
        i0 = r * mr
        height = min(mr, mc - i0)
        for i in range(height):
            row = A[ic + i0 + i]
            for q in range(kc):
                Ap[r, q, i] = row[pc + q]
        for i in range(height, mr):
            for q in range(kc):
                Ap[r, q, i] = zero


@when_called(numba.void(a3, a3, a2, i8, i8, i8, i8, i8, i8, i8, nbt, nbt, flag, a2),
             **FLAGS)
def macro(Ap, Bp, C, ic, mc, jc, nc, kc, s0, s1, alpha, beta, first, T):
    """Every MR×NR tile of C[ic:ic+mc, jc:jc+nc] in strips s0..s1 from packed panels.

    C gets ``alpha*T (+ beta*C)`` on the first K panel and ``+= alpha*T`` after; tiles
    that stick out of C (edges) store only the part that exists.
    """
    for s in range(s0, s1):
        j = jc + s * nr
        w = min(nr, jc + nc - j)
        for r in range((mc + mr - 1) // mr):
            i = ic + r * mr
            h = min(mr, ic + mc - i)
            # Start fetching the tile's rows of C now: they are read and written only after
            # the micro-kernel's KC steps, and each row lies in another page and, with C
            # larger than L2, misses to L3 or memory, where the prefetch hides the latency.
            for ii in range(h):
                prefetch_w(C, i + ii, j)
                prefetch_w(C, i + ii, j + w - 1)
            if h == mr and w == nr:
                # Whole tile: written from the accumulators, with no scratch tile between.
                if first and beta == zero:
                    ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, beta, 1)
                else:
                    ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, beta if first else one, 2)
            else:
                ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, beta, 0)
                for ii in range(h):
                    for jj in range(w):
                        v = alpha * T[ii, jj]
                        if not first:
                            C[i + ii, j + jj] += v
                        elif beta == zero:
                            C[i + ii, j + jj] = v
                        else:
                            C[i + ii, j + jj] = v + beta * C[i + ii, j + jj]


# The loop nest's heavy pieces, called through symbols of their own (see _lazy): their
# machine code is made once, not once per function that reaches them.
call_pack_a, call_pack_b, call_macro = (called_by_name(f) for f in (pack_a, pack_b, macro))


@when_called(numba.void(ro2, ro2, a2, nbt, nbt, a3, a3, a2, i8, blocks), **FLAGS)
def gemm_serial(A, B, C, alpha, beta, Ap, Bp, T, tr, cb):
    """One product on the calling thread (the batch-parallel path). ``tr``: bit 0, A is
    given as its transpose (K, M); bit 1, B as its transpose (N, K). ``cb``: the bound
    parameters (``blocks``), of which it reads the cache blocks MC, KC, NC."""
    mc, kc_max, nc_max = cb[0], cb[1], cb[2]
    ta, tb = (tr & 1) != 0, (tr & 2) != 0
    m, n = C.shape[0], C.shape[1]
    k = A.shape[0] if ta else A.shape[1] if tb else B.shape[0]
    for jc in range(0, n, nc_max):
        nc = min(nc_max, n - jc)
        for pc in range(0, k, kc_max):
            kc = min(kc_max, k - pc)
            call_pack_b(B, pc, kc, jc, nc, Bp, 0, (nc + nr - 1) // nr, tb)
            for ic in range(0, m, mc):
                mcc = min(mc, m - ic)
                call_pack_a(A, ic, mcc, pc, kc, Ap, ta)
                call_macro(Ap, Bp, C, ic, mcc, jc, nc, kc, 0, (nc + nr - 1) // nr,
                           alpha, beta, pc == 0, T)


@when_called(numba.void(a1, a1, i8, i8, nbt, nbt, flag), **FLAGS)
def fold(y, acc, j0, j1, alpha, beta, first):
    """y[j0:j1] gets one K panel's sums ``acc``: ``alpha*acc (+ beta*y)`` for the first
    panel (y unread when beta == 0), ``+= alpha*acc`` after, as the packed path updates C."""
    if not first:
        for j in range(j1 - j0):
            y[j0 + j] += alpha * acc[j]
    elif beta == zero:
        for j in range(j1 - j0):
            y[j0 + j] = alpha * acc[j]
    else:
        for j in range(j1 - j0):
            y[j0 + j] = alpha * acc[j] + beta * y[j0 + j]


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, blocks, i8, i8, i8, i8), **FLAGS)
def few_rows(A, B, C, alpha, beta, cb, z, j0, j1, tr):
    """Columns j0..j1 of product z, a product of 2 to 7 rows (``FEW_ROWS``; with the wide
    8-row tile 8 to ``FEW_TILED`` - 1 too, see below), unpacked: per K panel, one tile of
    all its rows walks the columns, a few vectors at a time (``FW2``..``FW7``: the width
    that keeps the tile's sums in registers), reading B where it lies.
    Packing B for so few rows copied all of it for a few multiply-adds per element. The
    same sums as the packed path and ``direct`` with KC = ``min(KC, FEW_KC)`` (K in
    panels of that many steps, in K order; ``ALIASED_KC`` where B's rows lie a multiple of
    ``ALIASED_STRIDE`` bytes apart), bit for bit. ``j0`` should be a multiple of
    ``few_width`` (the threads' column ranges are).

    ``tr`` bit 1: B is given as its transpose (batch|1, N, K) (A is plain, ``tr`` bit 0
    clear; 2 to 15 rows, ``DOT_MAX``, on every ISA, and more with the wide 8-row tile,
    ``tiled_dots``); then each element is a dot product
    of a row of A and a row of that storage, in groups of ``DOT_GROUP`` columns taken by
    tiles of 4 rows, then 2 and 1, in turn (see ``_dot_tile``; not the packed path's
    order of summation), the group's rows of that storage reused from L1 by every tile.

    8 to ``FEW_TILED`` - 1 rows (CPUs with the wide 8-row tile; B plain): per K panel,
    ``DW8`` columns at a time, the wide tile on each 8 rows in turn, then a tile of the
    other rows exactly as wide (``rtile1``..``rtile7``) on the same columns, whose piece of
    B is then in cache: in L1, as 9 rows or more sum K in panels of at most ``REREAD_KC``
    steps. The packed path's sums with KC that small, bit for bit (those of the same rows
    computed packed with a longer KC differ in the last bits).
    """
    m, n = C.shape[1], C.shape[2]
    k = A.shape[2] if tr & 2 else B.shape[1]
    lda, ldb = A.shape[2], B.shape[2]  # row strides (operands' rows may lie apart)
    sa = m * lda if A.shape[0] > 1 else 0
    if tr & 2:
        sb = n * ldb if B.shape[0] > 1 else 0
        mode = 0 if beta == zero else 1
        for g in range(j0, j1, DOT_GROUP):
            ge = min(g + DOT_GROUP, j1)
            i = 0
            while m - i >= 4:
                for j in range(g, ge, DC4):
                    dtile4(k, A, z * sa + i * lda, lda, B, z * sb + j * ldb, ldb, C,
                           (z * m + i) * n + j, n, min(DC4, ge - j), alpha, beta, mode)
                i += 4
            if m - i >= 2:
                for j in range(g, ge, DC2):
                    dtile2(k, A, z * sa + i * lda, lda, B, z * sb + j * ldb, ldb, C,
                           (z * m + i) * n + j, n, min(DC2, ge - j), alpha, beta, mode)
                i += 2
            if m - i >= 1:
                for j in range(g, ge, DC1):
                    dtile1(k, A, z * sa + i * lda, lda, B, z * sb + j * ldb, ldb, C,
                           (z * m + i) * n + j, n, min(DC1, ge - j), alpha, beta, mode)
        return
    sb = k * ldb if B.shape[0] > 1 else 0
    # 2-7 rows: panels of at most FEW_KC steps (the parameter); 9-15 rows: short enough
    # that the second tile finds B's piece in L1
    kc_max = cb[1]
    kp = min(kc_max, cb[3]) if m < FEW_ROWS else kc_max if m == 8 else min(kc_max, REREAD_KC)
    if m < FEW_ROWS and (ldb * ITEMSIZE) % ALIASED_STRIDE == 0:
        kp = min(kp, ALIASED_KC)  # B's rows in the same few cache sets (see ALIASED_STRIDE)
    for pc in range(0, k, kp):
        kc = min(kp, k - pc)
        mode = 0 if pc == 0 and beta == zero else 1
        bb = beta if pc == 0 else one
        a0, b0, c0 = z * sa + pc, z * sb + pc * ldb, z * m * n
        if m >= 8:
            # 8 or more rows (CPUs with the wide tile): the wide tile on each 8 rows, then
            # the other rows on the same columns, their piece of B read again from cache
            r8 = m - m % 8
            a8, c8 = a0 + r8 * lda, c0 + r8 * n
            for j in range(j0, j1, DW8):
                w = min(DW8, j1 - j)
                for r in range(0, r8, 8):
                    ptile8(kc, A, a0 + r * lda, lda, B, b0 + j, ldb, C, c0 + r * n + j, n, w,
                           alpha, bb, mode)
                rest = m - r8
                if rest == 1:
                    rtile1(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
                elif rest == 2:
                    rtile2(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
                elif rest == 3:
                    rtile3(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
                elif rest == 4:
                    rtile4(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
                elif rest == 5:
                    rtile5(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
                elif rest == 6:
                    rtile6(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
                elif rest == 7:
                    rtile7(kc, A, a8, lda, B, b0 + j, ldb, C, c8 + j, n, w, alpha, bb, mode)
        elif m == 2:
            for j in range(j0, j1, FW2):
                ftile2(kc, A, a0, lda, B, b0 + j, ldb, C, c0 + j, n, min(FW2, j1 - j), alpha, bb,
                       mode)
        elif m == 3:
            for j in range(j0, j1, FW3):
                ftile3(kc, A, a0, lda, B, b0 + j, ldb, C, c0 + j, n, min(FW3, j1 - j), alpha, bb,
                       mode)
        elif m == 4:
            for j in range(j0, j1, FW4):
                ftile4(kc, A, a0, lda, B, b0 + j, ldb, C, c0 + j, n, min(FW4, j1 - j), alpha, bb,
                       mode)
        elif m == 5:
            for j in range(j0, j1, FW5):
                ftile5(kc, A, a0, lda, B, b0 + j, ldb, C, c0 + j, n, min(FW5, j1 - j), alpha, bb,
                       mode)
        elif m == 6:
            for j in range(j0, j1, FW6):
                ftile6(kc, A, a0, lda, B, b0 + j, ldb, C, c0 + j, n, min(FW6, j1 - j), alpha, bb,
                       mode)
        else:
            for j in range(j0, j1, FW7):
                ftile7(kc, A, a0, lda, B, b0 + j, ldb, C, c0 + j, n, min(FW7, j1 - j), alpha, bb,
                       mode)


@when_called(numba.int64(i8, i8), **FLAGS)
def few_width(m, tr):
    """Columns ``few_rows`` takes at a time for a product of ``m`` rows (2..7, or 8 and more
    with the wide 8-row tile): its tile's width, or ``DOT_GROUP`` with B given transposed
    (``tr`` bit 1)."""
    if tr & 2:
        return DOT_GROUP
    return DW8 if m >= 8 else (FW2, FW3, FW4, FW5, FW6, FW7)[m - 2]


# called by name (see _lazy): the tiles compiled once, not into every caller
call_few_rows = called_by_name(few_rows)


@when_called(flag(i8, i8), **FLAGS)
def few_row_product(m, n):
    """Whether ``direct`` computes a whole product of these sizes as one tile of all its
    rows (``few_rows``): 2 to 7 rows (15 with the wide 8-row tile) wider than
    ``NARROW_N``."""
    return 2 <= m < FEW_MAX and n > NARROW_N


@when_called(flag(i8, i8), **FLAGS)
def tiled_dots(m, k):
    """Whether a product of ``m`` rows with B given transposed, from ``DOT_MAX`` rows on,
    takes the dot-product tiles (``few_rows``) where its size calls for the threads or
    packing: fewer than ``DOT_TILED`` rows (the wide 8-row tile) and A, read again for every
    group of W's rows, within ``DOT_TILED_A_BYTES``."""
    return DOT_MAX <= m < DOT_TILED and m * k * ITEMSIZE <= DOT_TILED_A_BYTES


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, blocks, i8, i8, i8, i8), **FLAGS)
def direct(A, B, C, alpha, beta, cb, z0, z1, r0, r1):
    """Rows r0..r1 of products z0..z1 of the batch on the calling thread, unpacked: A and B
    read where they lie, C in tiles of 8, 4, 2 or 1 rows × one vector of columns whose sums
    stay in registers (``_small_tile``; the right edge masked to the columns that exist),
    each tile's rows of A (8 × KC at most) reused from L1 by every vector of columns; where
    the registers allow (AVX-512, NEON), the 8-row tiles take ``DW8`` columns (several
    vectors) at a time across the full-width part of the rows, so each element of A loaded
    feeds several multiply-adds, not one, then one pass of that tile with its last vector
    masked (``rtile8``) where the columns left fill more than two vectors (float32
    2048×40×2048 on one thread of an Intel Xeon family 6 model 207: 4.8 ms as three
    single-vector passes, 3.6 as one pass with every vector masked), else one vector at a
    time for the rest; or,
    for whole products of 2-7 rows (to 15 with the wide tile) wider than ``NARROW_N``
    columns, one tile of all the rows, several vectors wide (``few_rows``).

    Each element is summed as in the packed path, with the same bits: K in panels of
    KC steps (``cb[1]``; at most FEW_KC for ``few_rows``' 2-7 rows, ``REREAD_KC``
    for its 9-15), each panel's sum started from zero in K order and added into C (a
    single running sum over all of K lost accuracy for long products with few outputs:
    2×2×350000 in float32, 100× NumPy's error).

    No packing and no parallel region, whose wake-up costs more than the whole product
    below ``DIRECT_PRODUCT`` multiply-adds. Called by name (``call_direct``) with a whole
    run of products, and the tiles are intrinsics, so a tiny product costs no call: a call
    per product (with its reference counting of three arrays) made batches of 4×4×4
    products 3.5× slower.
    """
    m, n, k = C.shape[1], C.shape[2], B.shape[1]
    if k == 0:  # no products: C = alpha*0 (+ beta*C; C unread when beta == 0)
        base = alpha * zero
        for z in range(z0, z1):
            for i in range(r0, r1):
                for j in range(n):
                    C[z, i, j] = base if beta == zero else base + beta * C[z, i, j]
        return
    if r0 == 0 and r1 == m and few_row_product(m, n):
        for z in range(z0, z1):
            call_few_rows(A, B, C, alpha, beta, cb, z, 0, n, 0)
        return
    kc_max = cb[1]
    lda, ldb = A.shape[2], B.shape[2]  # row strides (operands' rows may lie apart)
    sa = m * lda if A.shape[0] > 1 else 0
    sb = k * ldb if B.shape[0] > 1 else 0
    for z in range(z0, z1):
        for pc in range(0, k, kc_max):
            kc = min(kc_max, k - pc)
            first = pc == 0
            mode = 0 if first and beta == zero else 1  # C = alpha*sum, or alpha*sum + bb*C
            bb = beta if first else one
            # 8-row tiles, then one each of 4, 2 and 1 rows for the rest; for each, every
            # vector of columns in turn (the tile's rows of A stay in L1)
            b_p, i = z * sb + pc * ldb, r0
            while i + 8 <= r1:
                a0, c0 = z * sa + i * lda + pc, (z * m + i) * n
                wide = 0  # columns the wide tile took
                if DW8 > SMALL_W:
                    while wide + DW8 <= n:
                        wtile8(kc, A, a0, lda, B, b_p + wide, ldb, C, c0 + wide, n, DW8, alpha, bb,
                               mode)
                        wide += DW8
                    if n - wide > 2 * SMALL_W:  # AVX-512: all but its last vector left
                        rtile8(kc, A, a0, lda, B, b_p + wide, ldb, C, c0 + wide, n, n - wide,
                               alpha, bb, mode)
                        wide = n
                for j in range(wide, n, SMALL_W):
                    stile8(kc, A, a0, lda, B, b_p + j, ldb, C, c0 + j, n, min(SMALL_W, n - j),
                           alpha, bb, mode)
                i += 8
            if r1 - i >= 4:
                a0, c0 = z * sa + i * lda + pc, (z * m + i) * n
                for j in range(0, n, SMALL_W):
                    stile4(kc, A, a0, lda, B, b_p + j, ldb, C, c0 + j, n, min(SMALL_W, n - j),
                           alpha, bb, mode)
                i += 4
            if r1 - i >= 2:
                a0, c0 = z * sa + i * lda + pc, (z * m + i) * n
                for j in range(0, n, SMALL_W):
                    stile2(kc, A, a0, lda, B, b_p + j, ldb, C, c0 + j, n, min(SMALL_W, n - j),
                           alpha, bb, mode)
                i += 2
            if r1 - i >= 1:
                a0, c0 = z * sa + i * lda + pc, (z * m + i) * n
                for j in range(0, n, SMALL_W):
                    stile1(kc, A, a0, lda, B, b_p + j, ldb, C, c0 + j, n, min(SMALL_W, n - j),
                           alpha, bb, mode)


# called by name (see _lazy): the tiles compiled once, not into every caller
call_direct = called_by_name(direct)


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, i8, i8, i8, blocks), **FLAGS)
def products_serial(A, B, C, alpha, beta, z0, z1, tr, cb):
    """Products z0..z1 of the batch, one after another on the calling thread, through the
    packed loop nest (``gemm_serial``), with one set of scratch sized to the product (not
    to the cache blocks, so small products stay cheap). ``tr``, ``cb`` as in
    ``blocked_threads``. Reached through ``small``, which sends it the products that
    packing repays."""
    mc, kc_max, nc_max = cb[0], cb[1], cb[2]
    k = A.shape[1] if tr & 1 else A.shape[2] if tr & 2 else B.shape[1]
    m, n = C.shape[1], C.shape[2]
    kcap = min(kc_max, k)
    Ap = np.empty((min(mc // mr, (m + mr - 1) // mr), kcap, mr), dtype=C.dtype)
    Bp = aligned3((min(nc_max, n) + nr - 1) // nr, kcap, nr, C)
    T = np.empty((mr, nr), dtype=C.dtype)
    for z in range(z0, z1):
        gemm_serial(A[z if A.shape[0] > 1 else 0], B[z if B.shape[0] > 1 else 0], C[z],
                    alpha, beta, Ap, Bp, T, tr, cb)


# --- Products with one row or one column (vector-matrix, matrix-vector) -----------------
# Packing would copy the whole matrix for one pass over it, and an MR×NR tile would be
# mostly padding, so these run unpacked: the matrix is streamed once, front to back.
GEMV_ROWS = 8  # rows of B combined per pass over y in the vector-matrix form


@when_called(numba.void(ro2, ro2, a2, nbt, nbt, i8, i8, i8, flag), **FLAGS)
def gemv_part(A, B, C, alpha, beta, c, nchunks, kc_max, backward):
    """Chunk ``c`` of ``nchunks`` of a product with M == 1 or N == 1 (2-D operands).

    M == 1, ``y = x @ B``: chunk c is a range of columns of y; each column is the same
    K-ordered sum as in the packed path (``GEMV_ROWS`` rows of B are folded into a column's
    running sum per pass, in order, so y is read and written once per ``GEMV_ROWS`` rows
    rather than once per row). N == 1, ``y = A @ x``: chunk c is a range of rows of A, each
    element a dot product along K taken by the one-row dot tile (``_dot_tile``: x against
    ``DC1`` rows of A at a time, lane sums added in a fixed tree), the same sums for a row
    whatever the chunks, and the same as a row of ``x @ W.T`` with a few rows of x.
    ``backward`` (see ``gemv_threads``): ``A @ x`` takes the chunk's rows of A last tile
    first; ``x @ B`` takes B's K panels last first, each from its first row as always, and
    adds the panels' sums into y in K order after the last: the same sums either way.
    """
    m, n, k = C.shape[0], C.shape[1], B.shape[0]
    if m == 1:
        j0, j1 = c * n // nchunks, (c + 1) * n // nchunks
        if j1 <= j0:
            return
        x = A[0]
        y = C[0]
        panels = (k + kc_max - 1) // kc_max  # K in panels, as the packed path sums (direct)
        # backward: each panel's sums kept apart, added into y in K order once all are done
        accs = np.empty((panels if backward else 1, j1 - j0), dtype=C.dtype)
        for q in range(panels):
            pn = panels - 1 - q if backward else q
            acc = accs[pn if backward else 0]
            pc = pn * kc_max
            acc[:] = zero
            kend = min(k, pc + kc_max)
            kk = pc + (kend - pc) // GEMV_ROWS * GEMV_ROWS
            for p in range(pc, kk, GEMV_ROWS):
                a0, a1_, a2_, a3_ = x[p], x[p + 1], x[p + 2], x[p + 3]
                a4_, a5, a6, a7 = x[p + 4], x[p + 5], x[p + 6], x[p + 7]
                r0, r1, r2, r3 = B[p, j0:j1], B[p + 1, j0:j1], B[p + 2, j0:j1], B[p + 3, j0:j1]
                r4, r5, r6 = B[p + 4, j0:j1], B[p + 5, j0:j1], B[p + 6, j0:j1]
                r7 = B[p + 7, j0:j1]
                for j in range(j1 - j0):
                    t = acc[j]
                    t += a0 * r0[j]
                    t += a1_ * r1[j]
                    t += a2_ * r2[j]
                    t += a3_ * r3[j]
                    t += a4_ * r4[j]
                    t += a5 * r5[j]
                    t += a6 * r6[j]
                    t += a7 * r7[j]
                    acc[j] = t
            for p in range(kk, kend):
                a = x[p]
                row = B[p, j0:j1]
                for j in range(j1 - j0):
                    acc[j] += a * row[j]
            if not backward:
                fold(y, acc, j0, j1, alpha, beta, pc == 0)
        if backward:
            for pn in range(panels):
                fold(y, accs[pn], j0, j1, alpha, beta, pn == 0)
    else:
        i0, i1 = c * m // nchunks, (c + 1) * m // nchunks
        mode = 0 if beta == zero else 1
        tiles = (i1 - i0 + DC1 - 1) // DC1
        for q in range(tiles):
            i = i0 + (tiles - 1 - q if backward else q) * DC1
            # x, one column, is dense (a column with its rows apart was copied); A's rows
            # may lie apart
            dtile1(k, B, 0, k, A, i * A.shape[1], A.shape[1], C, i, 1, min(DC1, i1 - i), alpha,
                   beta, mode)


call_gemv_part = called_by_name(gemv_part)


# Up to this many multiply-adds per product, or with fewer than PACKED_MIN_SIDE rows or
# columns, ``small`` runs ``direct``; above, packing pays for itself even on one thread.
# Measured on an AMD Zen 5 (µs per product, direct / packed, one thread): AVX-512 code,
# float32 32³ 0.38 / 0.73, 48³ 1.1 / 3.2, 64³ 2.8 / 3.5, 96³ 9.0 / 9.0; AVX2 code on the
# same CPU, float32 32³ 0.79 / 1.05, 48³ 2.5 / 2.4, 64³ 6.0 / 5.3 (float64 alike).
PACKED_MIN_PRODUCT = 48 * 48 * 48
# Products with one row take the vector path (``gemv_part``) above this many multiply-adds,
# and products with one column (of more than one row) above MATVEC_MIN_PRODUCT: there a
# tile of C one row high (or one column wide: one lane of each vector) leaves the rows'
# independent sums (or the vector lanes) idle, which the vector path's sums fill. Below,
# its call per product costs more (about 70 ns). µs per product of a batch, one thread,
# AMD Zen 5, direct / vector path: float32 16×1×16 0.056 / 0.085, 24×1×24 0.112 / 0.108,
# 32×1×32 0.195 / 0.117, 64×1×64 0.70 / 0.35, 20×1×400 1.49 / 0.40, 1×64×64 0.24 / 0.41;
# AVX2 code on the same CPU alike (24×1×24 0.120 / 0.097; float64 0.112 / 0.113).
VECTOR_MIN_PRODUCT = 20 * 20 * 20
MATVEC_MIN_PRODUCT = 24 * 24
PACKED_MIN_SIDE = 8


@when_called(flag(i8, i8, i8), **FLAGS)
def unpacked_small(m, n, k):
    """Whether ``small`` computes a product of these sizes unpacked (``direct``): too small
    for packing to pay, too narrow or too short for packed tiles, or, with the wide 8-row
    tile, up to ``UNPACKED_PRODUCT``."""
    size = m * n * k
    return (k == 0 or size <= PACKED_MIN_PRODUCT or min(m, n) < PACKED_MIN_SIDE
            or n <= NARROW_N or (DW8 > SMALL_W and size <= UNPACKED_PRODUCT))


# A transposing copy moves blocks of this many rows × columns (``transpose_block``).
TRANSPOSE_W = 8
transpose_block = block_transposer(TRANSPOSE_W)


@when_called(numba.void(a2, ro2, i8, i8), **FLAGS)
def transpose_into(D, S, rows, cols):
    """``D[:cols, :rows] = S[:rows, :cols].T``: blocks of ``TRANSPOSE_W`` rows and columns
    through vector registers (``transpose_block``), the edges element by element."""
    rw = rows - rows % TRANSPOSE_W
    cw = cols - cols % TRANSPOSE_W
    for i in range(0, rw, TRANSPOSE_W):
        for j in range(0, cw, TRANSPOSE_W):
            transpose_block(D, (j, i), S, (i, j))
        for r in range(i, i + TRANSPOSE_W):
            for j in range(cw, cols):
                D[j, r] = S[r, j]
    for r in range(rw, rows):
        for j in range(cols):
            D[j, r] = S[r, j]


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, i8, i8, i8, blocks), **FLAGS)
def direct_transposed(A, B, C, alpha, beta, z0, z1, tr, cb):
    """Products z0..z1 of the batch with an operand given as its transpose (``tr``, see
    ``blocked_threads``), unpacked (``direct``) as the plain product is: the operand given
    transposed copied to the plain layout first (M·K or K·N elements, against M·N·K
    multiply-adds), or, with both given so (Fortran-ordered operands), ``C.T = B.T @ A.T``
    from the two storages as they lie, into a scratch C.T copied into C. Packed instead,
    both operands were copied into tiles for the packed loop nest, whose setup a small
    product does not repay: float32 8³ took 1.65 µs against 0.85 for plain operands, 100³
    25.7 against 15.0 (Intel Xeon family 6 model 207). Each element is the sum the plain
    operands give: the transpose is taken only where neither it nor the product would go
    to ``few_rows``, whose K panels (FEW_KC) may be shorter than the others' (KC). The
    scratch is made once for the run of products, and an operand the batch shares is
    copied once (a batch of 1000 float32 16³ products with B given transposed: 368 µs with
    an allocation per product, 339 so; the plain batch took 74, NumPy 267)."""
    m, n = C.shape[1], C.shape[2]
    k = A.shape[1] if tr & 1 else A.shape[2]  # as ``small`` takes it: either operand may
    # be wider than it is (rows apart), and only its first M (A given transposed), K or N
    # columns are read
    swap = tr == 3 and not (few_row_product(m, n) or few_row_product(n, m))
    Ct = np.empty((1, n if swap else 0, m), dtype=C.dtype)
    Ap = np.empty((1, m if tr & 1 and not swap else 0, k), dtype=C.dtype)
    Bp = np.empty((1, k if tr & 2 and not swap else 0, n), dtype=C.dtype)
    for z in range(z0, z1):
        Az = A[z if A.shape[0] > 1 else 0]
        Bz = B[z if B.shape[0] > 1 else 0]
        Cz = C[z]
        if swap:
            if beta != zero:
                transpose_into(Ct[0], Cz, m, n)
            call_direct(Bz.reshape((1, n, Bz.shape[1])), Az.reshape((1, k, Az.shape[1])), Ct,
                        alpha, beta, cb, 0, 1, 0, n)
            transpose_into(Cz, Ct[0], n, m)
            continue
        if tr & 1 and (z == z0 or A.shape[0] > 1):
            transpose_into(Ap[0], Az, k, m)
        if tr & 2 and (z == z0 or B.shape[0] > 1):
            transpose_into(Bp[0], Bz, n, k)
        if tr == 3:
            call_direct(Ap, Bp, Cz.reshape((1, m, n)), alpha, beta, cb, 0, 1, 0, m)
        elif tr == 1:
            call_direct(Ap, Bz.reshape((1, k, Bz.shape[1])), Cz.reshape((1, m, n)), alpha, beta,
                        cb, 0, 1, 0, m)
        else:
            call_direct(Az.reshape((1, m, Az.shape[1])), Bp, Cz.reshape((1, m, n)), alpha, beta,
                        cb, 0, 1, 0, m)


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, i8, i8, i8, blocks), **FLAGS)
def small(A, B, C, alpha, beta, z0, z1, tr, cb):
    """Products z0..z1 of the batch on the calling thread (no parallel region: waking the
    pool costs more than a product of at most ``DIRECT_PRODUCT`` multiply-adds; the batch
    path's threads each run a share of the batch here): one row or one column per product
    through the vector path (``gemv_part``, as the threaded vector path computes it), the
    packed loop nest (``products_serial``, scratch sized to the product) where packing
    pays, else (small or narrow products) ``direct``, which gives the packed path's sums.
    Operands given transposed (``tr``, see ``blocked_threads``) take the packed loop nest,
    which reads them in place, except a product of a few rows with B given transposed
    (``few_rows``'s dot products, as the threaded path computes it) and a product that
    ``direct`` would compute given plainly (``direct_transposed``).
    """
    m, n = C.shape[1], C.shape[2]
    k = A.shape[1] if tr & 1 else A.shape[2] if tr & 2 else B.shape[1]
    size = m * n * k
    if tr == 2 and n > NARROW_N and k > 0 and (
            2 <= m < DOT_MAX or (size > DIRECT_PRODUCT and tiled_dots(m, k))):
        # few rows, B transposed (from DOT_MAX rows on, as the threads take them)
        for z in range(z0, z1):
            call_few_rows(A, B, C, alpha, beta, cb, z, 0, n, tr)
    elif tr != 0 and k > 0 and unpacked_small(m, n, k):
        direct_transposed(A, B, C, alpha, beta, z0, z1, tr, cb)
    elif tr != 0 and k > 0:
        products_serial(A, B, C, alpha, beta, z0, z1, tr, cb)
    elif k > 0 and (m == 1 or n == 1) and size > (MATVEC_MIN_PRODUCT if m > 1
                                                  else VECTOR_MIN_PRODUCT):
        for z in range(z0, z1):
            call_gemv_part(A[z if A.shape[0] > 1 else 0], B[z if B.shape[0] > 1 else 0], C[z],
                           alpha, beta, 0, 1, cb[1], False)
    elif unpacked_small(m, n, k):
        call_direct(A, B, C, alpha, beta, cb, z0, z1, 0, m)
    else:
        products_serial(A, B, C, alpha, beta, z0, z1, 0, cb)


# ``small`` is reached from the parallel region (batches of small products), the threaded
# driver and ``small_matrix``: through its own symbol, its code (with the packed loop nest
# it runs) is generated once, not again inside each of those and the wrappers Numba makes
# around the parallel region.
call_small = called_by_name(small)


@when_called(a2(ro2, ro2, blocks), **FLAGS)
def small_matrix(A, B, cb):
    """A new ``A @ B`` of two C-ordered matrices, a product ``small`` computes (``bind``'s
    ``takes_small``): what a remembered plain call runs (``tilegemm.fastpath``). One compiled
    call allocates the result, views the operands as the 3-D arrays ``small`` reads and
    computes the product, where the same steps in Python (``np.empty``, three reshapes, the
    bound program's checks and a call of nine arguments) took about 1 µs, a third of an
    8×8×8 call on an Intel Xeon family 6 model 167."""
    m, n = A.shape[0], B.shape[1]
    C = np.empty((m, n), dtype=A.dtype)
    call_small(A.reshape((1, m, A.shape[1])), B.reshape((1, B.shape[0], n)),
               C.reshape((1, m, n)), one, zero, 0, 1, 0, cb)
    return C


@when_called(a2(ro2, ro2, i8, blocks), **FLAGS)
def small_matrix_transposed(As, Bs, tr, cb):
    """A new ``A @ B`` from the C-ordered storages of its operands, either of them given as
    its transpose (``tr``: A = As.T, B = Bs.T; Fortran-ordered matrices, ``x.T``), a product
    ``small`` computes (``bind``'s ``call_for``): what a remembered call on such operands
    runs (``tilegemm.fastpath``), as ``small_matrix`` does for C-ordered ones. Through the
    bound program's Python it took 2 µs longer than the same product given C-ordered
    (float32 8³ on an Intel Xeon family 6 model 207)."""
    m = As.shape[1] if tr & 1 else As.shape[0]
    n = Bs.shape[0] if tr & 2 else Bs.shape[1]
    C = np.empty((m, n), dtype=_dt)
    call_small(As.reshape((1, As.shape[0], As.shape[1])),
               Bs.reshape((1, Bs.shape[0], Bs.shape[1])), C.reshape((1, m, n)), one, zero, 0, 1,
               tr, cb)
    return C


@when_called(numba.void(i8, i8, ro3, ro3, a3, i8, nbt, nbt, i8, i8, i8, i8, i8, i8, a3, a4, a3,
                        i8, i8, blocks), parallel=True, **FLAGS)
def run_parallel(phase, ntasks, A, B, C, z, alpha, beta, jc, nc, pc, kc, nblk, ngroups, Bp,
                 Ap_all, T_all, tr, chunk, cb):
    """The one parallel region, so Numba compiles one parfor, not one per phase.

    phase 0: task t packs the t-th of ``ntasks`` slices of the B panel of product z;
    phase 1: task t = (row block of ``nblk``, strip group of ``ngroups``) packs its A
    block and computes its tiles (blocks differ by at most one MR strip, so threads stay
    balanced). With one row block (``nblk == 1``) there is no phase 0: each task packs
    its own strips of B, ``chunk`` strips at a time, just before computing them, for every
    K panel (``pc``, ``kc``: all of K), so the product takes one region. There,
    each packed strip is read by one task only, so packing the panel whole bought no reuse:
    it went to memory and came back (8 MB per 512 x 2048 float64 panel), and short, wide
    products (32 x 2048 x 2048 float64) ran at half NumPy's speed;
    phase 2: task t is the t-th of ``ntasks`` runs of whole products of the batch (small
    products), with one set of scratch arrays for its run;
    phase 3: task t computes the t-th of ``ntasks`` runs of 8-row tiles of product z
    unpacked (``direct``: narrow products and, with the wide 8-row tile, products up to
    ``UNPACKED_PRODUCT``; see ``takes_rows``);
    phase 4: task t computes the t-th of ``ntasks`` ranges of columns of product z, a
    product of a few rows, unpacked (``few_rows``, see ``takes_few``).
    """
    nstrips = (nc + nr - 1) // nr
    msr = (C.shape[1] + mr - 1) // mr
    za = z if A.shape[0] > 1 else 0
    zb = z if B.shape[0] > 1 else 0
    for tu in prange(ntasks):
        t = np.int64(tu)  # prange indices are unsigned; keep index arithmetic signed
        if phase == 0:
            call_pack_b(B[zb], pc, kc, jc, nc, Bp, t * nstrips // ntasks,
                        (t + 1) * nstrips // ntasks, (tr & 2) != 0)
        elif phase == 1:
            blk, g = t // ngroups, t % ngroups
            ic = blk * msr // nblk * mr
            mcc = min((blk + 1) * msr // nblk * mr, C.shape[1]) - ic
            s0, s1 = g * nstrips // ngroups, (g + 1) * nstrips // ngroups
            if nblk > 1:  # the B panel was packed whole (phase 0), for every row block
                call_pack_a(A[za], ic, mcc, pc, kc, Ap_all[t], (tr & 1) != 0)
                call_macro(Ap_all[t], Bp, C[z], ic, mcc, jc, nc, kc, s0, s1, alpha, beta,
                           pc == 0, T_all[t])
                continue
            # One row block: this task alone reads its strips of B, so it packs them
            # itself, a chunk at a time, into the first strips of its own part of Bp; and
            # it alone writes their columns of C, so it runs every K panel of them here
            # (pc, kc: all of K, in panels of at most KC), in one parallel region per
            # product rather than one per panel.
            cs = max(1, min(s1 - s0, chunk))
            Bc = Bp[s0:s0 + cs]
            for pp in range(pc, pc + kc, cb[1]):
                kp = min(cb[1], pc + kc - pp)
                call_pack_a(A[za], ic, mcc, pp, kp, Ap_all[t], (tr & 1) != 0)
                for sc in range(s0, s1, cs):
                    w = min(s1, sc + cs) - sc
                    call_pack_b(B[zb], pp, kp, jc + sc * nr, nc - sc * nr, Bc, 0, w,
                                (tr & 2) != 0)
                    call_macro(Ap_all[t], Bc, C[z], ic, mcc, jc + sc * nr, nc - sc * nr, kp,
                               0, w, alpha, beta, pp == 0, T_all[t])
        elif phase == 3:
            # rows of product z, in runs of whole 8-row tiles, computed unpacked
            units = (C.shape[1] + 7) // 8
            r0, r1 = t * units // ntasks * 8, min(C.shape[1], (t + 1) * units // ntasks * 8)
            if r1 > r0:
                call_direct(A, B, C, alpha, beta, cb, z, z + 1, r0, r1)
        elif phase == 4:
            # columns of product z, in whole tiles
            w = few_width(C.shape[1], tr)
            units = (C.shape[2] + w - 1) // w
            j0, j1 = t * units // ntasks * w, min(C.shape[2], (t + 1) * units // ntasks * w)
            if j1 > j0:
                call_few_rows(A, B, C, alpha, beta, cb, z, j0, j1, tr)
        else:
            # runs of whole products, each by the path that suits its size
            batch = C.shape[0]
            call_small(A, B, C, alpha, beta, t * batch // ntasks, (t + 1) * batch // ntasks,
                       tr, cb)


# ``blocked_threads`` starts the parallel region at six places: through its own symbol, the
# region and the three wrappers Numba makes around it are generated once, in this library.
call_run_parallel = called_by_name(run_parallel)


@when_called(numba.boolean(i8, i8, i8, i8, i8), **FLAGS)
def splits_batch(batch, m, n, k, nthreads):
    """Whether the threads split the batch (each product whole on one thread) rather
    than each product: small products, or mid-size ones with enough of them per thread."""
    if batch < 2:
        return False
    size = m * n * k
    return size <= SMALL_PRODUCT or (size <= BATCH_PRODUCT
                                     and batch >= BATCH_SPLIT_MIN * nthreads)


@when_called(numba.boolean(i8, i8, i8, i8, i8, i8, i8, blocks), **FLAGS)
def takes_rows(batch, m, n, k, nthreads, direct_max, tr, cb):
    """Whether the threads compute each product unpacked, its rows split between them
    (``direct``), above the small-product path, not one row or one column (the vector
    path) and not a batch the threads split (each of those products takes the same tiles
    on its thread, see ``small``): narrow products, at most ``NARROW_N`` columns wide at
    any size, A given plainly (``tr`` bit 0 clear: A given as its transpose is read in
    place by the packed path; a plain copy of it, strided, took 25 ms for float32 X.T @ w,
    X 2048×2048 and w 16 columns wide, against NumPy's 0.95; B, a few columns, is copied if
    given so); and, with the wide 8-row tile, products of ``FEW_MAX`` rows or more given
    plainly: at any size those at most ``DW8`` columns wide (one pass of that tile per 8
    rows and K panel, whose piece of B stays in L2, as a narrow product's does), and wider
    ones of at most ``UNPACKED_PRODUCT`` multiply-adds, B within UNPACKED_KB (``cb[5]``
    bytes; each thread reads all of it per 8 of its rows), with runs of 8 rows for every
    thread (the same test as ``k02_blocked.unpacked_rows``)."""
    if k == 0 or batch * m * n * k <= direct_max or m == 1 or n == 1 or tr & 1:
        return False
    if n > NARROW_N:
        if tr != 0 or DW8 == SMALL_W or m < FEW_MAX:
            return False
        units = (m + 7) // 8
        if n > DW8 and (m * n * k > UNPACKED_PRODUCT or k * n * ITEMSIZE > cb[5]
                        or (units < 2 * nthreads and m % (8 * nthreads) != 0)):
            return False
    return not splits_batch(batch, m, n, k, nthreads)


@when_called(numba.boolean(i8, i8, i8, i8, i8, i8, i8), **FLAGS)
def takes_few(batch, m, n, k, nthreads, direct_max, tr):
    """Whether the threads compute each product unpacked, its columns split between them
    (``few_rows``): products of 2 to 7 rows (to 15 with the wide 8-row tile, ``FEW_MAX``,
    and to ``FEW_TILED`` - 1 while B is at most ``TILED_BYTES``) wider than ``NARROW_N``,
    above the small-product path and not a batch the threads split; with B given as its
    transpose (``tr`` bit 1), 2 to 15 rows (``DOT_MAX``) on every ISA, and with the wide
    tile to ``DOT_TILED`` - 1 while A is at most ``DOT_TILED_A_BYTES``, as dot products
    along K (A, 2 to 7 rows, is copied if given so; 8 rows or more with A given transposed
    are packed, in place)."""
    if tr & 1:
        rows = FEW_ROWS
    elif tr == 2:  # from DOT_MAX rows on, A within DOT_TILED_A_BYTES
        rows = DOT_TILED if m < DOT_MAX or tiled_dots(m, k) else DOT_MAX
    else:  # from 16 rows on, B within TILED_BYTES
        rows = FEW_TILED if m < FEW_MAX or k * n * ITEMSIZE <= TILED_BYTES else FEW_MAX
    if (k == 0 or batch * m * n * k <= direct_max or m < 2 or m >= rows
            or n <= NARROW_N):
        return False
    return not splits_batch(batch, m, n, k, nthreads)


@when_called(numba.types.UniTuple(i8, 8)(i8, i8, i8, i8, i8, i8, i8, i8, blocks, i8),
             **FLAGS)
def layout(batch, m, n, k, nthreads, direct_max, chunk_bytes, budget, cb, tr):
    """How the packed path splits the work and its scratch, for one call.

    Returns (nblk, ngroups_max, strip_cap, kcap, rows_per_blk, ap_at, t_at, size):
    row blocks and strip groups per panel; the B panel ``Bp`` (strip_cap, kcap, NR) at
    element 0 of the workspace, the A blocks ``Ap_all`` (nblk*ngroups_max, rows_per_blk,
    kcap, MR) at ``ap_at`` and the scratch tiles ``T_all`` (nblk*ngroups_max, MR, NR) at
    ``t_at``, ``size`` elements in all (each part 64-byte aligned when the workspace is).
    All zeros when the call takes a path without scratch: no K, at most ``direct_max``
    multiply-adds in all, a batch of small products, narrow products or products of a few
    rows (``tr``: which operands are given transposed, see ``blocked_threads``).

    ``chunk_bytes``, ``budget``: a product of more than MC rows is one row block too when its
    packed block of A and ``chunk_bytes`` of B fit ``budget`` bytes (``L2_BUDGET``), the
    panel of B does not, and each of two tasks per thread gets ``ONE_BLOCK_TASK_COLUMNS``
    columns, or the product is at most ``ONE_REGION_PRODUCT`` multiply-adds with
    ``ONE_REGION_TASK_COLUMNS`` for each thread, one task each (see
    ``k02_blocked.one_row_block``). ``cb``: the bound parameters (``blocks``).
    """
    if (k == 0 or batch * m * n * k <= direct_max or splits_batch(batch, m, n, k, nthreads)
            or takes_rows(batch, m, n, k, nthreads, direct_max, tr, cb)
            or takes_few(batch, m, n, k, nthreads, direct_max, tr)):
        return 0, 0, 0, 0, 0, 0, 0, 0
    mc, kc_max, nc_max = cb[0], cb[1], cb[2]
    # Row blocks of at most MC rows, as many as a multiple of the thread count when there
    # are enough MR strips; when there are few, column groups of the B panel supply the
    # tasks. A product of at most MC rows with a strip of B for every thread is one row
    # block, split by columns only: each task then packs its own part of B (run_parallel);
    # so is a product of more rows whose block of A and a chunk of B fit the L2 budget while
    # its panel of B does not, given enough columns per task to pay for packing that block,
    # and a product of at most ONE_REGION_PRODUCT multiply-adds, whose time the start of
    # a second parallel region per K panel would take a large share of.
    strip_cap = (min(nc_max, n) + nr - 1) // nr
    msr = (m + mr - 1) // mr
    kcap = min(kc_max, k)
    nblk = (msr + mc // mr - 1) // (mc // mr)
    depth = kcap * ITEMSIZE
    fits_l2 = (strip_cap * nr >= ONE_BLOCK_TASK_COLUMNS * 2 * nthreads
               and msr * mr * depth + chunk_bytes <= budget < strip_cap * nr * depth)
    one_region = (m * n * k <= ONE_REGION_PRODUCT
                  and strip_cap * nr >= ONE_REGION_TASK_COLUMNS * nthreads)
    groups = 2 * nthreads  # column groups of one row block: two tasks per thread
    if nblk > 1 and fits_l2:
        nblk = 1
    elif nblk > 1 and one_region:
        nblk, groups = 1, nthreads  # one task per thread: each packs all of A
    elif nblk > 1 or strip_cap < nthreads:
        nblk = min(msr, (nblk + nthreads - 1) // nthreads * nthreads)
    ngroups_max = 1 if nblk >= nthreads else min(strip_cap, groups)
    rows_per_blk = (msr + nblk - 1) // nblk
    ap_at = (strip_cap * kcap * nr + ALIGN - 1) // ALIGN * ALIGN
    t_at = ap_at + (nblk * ngroups_max * rows_per_blk * kcap * mr + ALIGN - 1) // ALIGN * ALIGN
    size = t_at + nblk * ngroups_max * mr * nr
    return nblk, ngroups_max, strip_cap, kcap, rows_per_blk, ap_at, t_at, size


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, i8, i8, a1, i8, i8, i8, blocks), **FLAGS)
def blocked_threads(A, B, C, alpha, beta, nthreads, direct_max, W, tr, chunk_bytes, budget,
                    cb):
    """The rung on ``nthreads`` threads (an argument: reading Numba's thread count inside
    compiled code goes through a pointer, and code holding one cannot be cached); products
    of at most ``direct_max`` multiply-adds in all take the unpacked single-thread path.

    ``W``: the packed path's scratch, ``layout(...)[7]`` elements, 64-byte aligned for full
    speed (a smaller one is replaced by a new array). The caller owns it and reuses it
    between calls: allocated here, every call would take fresh pages from the operating
    system where the allocator returns freed memory at once, as in dask.distributed's
    workers (about 2000 page faults per float32 2048³ product; see ``_workspace``).

    ``tr``: bit 0, A is given as its transpose (batch|1, K, M); bit 1, B as its transpose
    (batch|1, N, K); only for products that take the packed path (the caller copies them
    for the others, see ``blocked``).

    ``chunk_bytes``: how much of B a task packs at a time in a product of one row block
    (``B_CHUNK_BYTES``; an argument, so tests can make chunks of one strip); ``budget``:
    see ``layout`` (``L2_BUDGET``). ``cb``: the parameters bound by ``bind`` (``blocks``).
    """
    kc_max, nc_max = cb[1], cb[2]
    batch, m, n = C.shape[0], C.shape[1], C.shape[2]
    k = A.shape[1] if tr & 1 else A.shape[2] if tr & 2 else B.shape[1]
    if k == 0:  # no products: C = beta*C, or zeros (C unread when beta == 0)
        for z in range(batch):
            for i in range(m):
                for j in range(n):
                    base = alpha * zero
                    C[z, i, j] = base if beta == zero else base + beta * C[z, i, j]
        return
    if batch * m * n * k <= direct_max:
        call_small(A, B, C, alpha, beta, 0, batch, tr, cb)
        return
    empty = np.empty((1, 1, 1, mr), dtype=C.dtype)
    if splits_batch(batch, m, n, k, nthreads):
        # runs of products, a few per thread (the scheduler balances them)
        call_run_parallel(2, min(batch, BATCH_TASKS * nthreads), A, B, C, 0, alpha, beta, 0,
                          0, 0, 0, 0, 1, empty[0], empty, empty[0], tr, 1, cb)
        return
    if takes_rows(batch, m, n, k, nthreads, direct_max, tr, cb):
        # each product's rows in runs of 8-row tiles, a few runs per thread, unpacked (B
        # plain: ``blocked`` copies a transposed B for this path)
        for z in range(batch):
            call_run_parallel(3, min((m + 7) // 8, BATCH_TASKS * nthreads), A, B, C, z,
                              alpha, beta, 0, 0, 0, 0, 0, 1, empty[0], empty, empty[0], tr, 1,
                              cb)
        return
    if takes_few(batch, m, n, k, nthreads, direct_max, tr):
        # each product's columns in ranges of whole tiles, one per thread, unpacked (A
        # plain: ``blocked`` copies a transposed A for this path); with B within FEW_KB
        # (``cb[4]``; for 8 rows or more, ``_small_tile.few_split_bytes``), on this thread
        # alone
        tasks = min((n + few_width(m, tr) - 1) // few_width(m, tr), nthreads)
        split = cb[4] if m < FEW_ROWS else FEW_SPLIT_BYTES_8 // (m // FEW_ROWS)
        for z in range(batch):
            if k * n * ITEMSIZE <= split:
                call_few_rows(A, B, C, alpha, beta, cb, z, 0, n, tr)
            else:
                call_run_parallel(4, tasks, A, B, C, z, alpha, beta, 0, 0, 0, 0, 0, 1,
                                  empty[0], empty, empty[0], tr, 1, cb)
        return
    # One product at a time, threads over (row block × strip group) tasks (see layout).
    nblk, ngroups_max, strip_cap, kcap, rows_per_blk, ap_at, t_at, size = layout(
        batch, m, n, k, nthreads, direct_max, chunk_bytes, budget, cb, tr)
    if W.shape[0] < size:
        W = np.empty(size, dtype=C.dtype)
    ntask = nblk * ngroups_max
    Bp = W[:strip_cap * kcap * nr].reshape((strip_cap, kcap, nr))
    Ap_all = W[ap_at:ap_at + ntask * rows_per_blk * kcap * mr].reshape(
        (ntask, rows_per_blk, kcap, mr))
    T_all = W[t_at:t_at + ntask * mr * nr].reshape((ntask, mr, nr))
    for z in range(batch):
        for jc in range(0, n, nc_max):
            nc = min(nc_max, n - jc)
            nstrips = (nc + nr - 1) // nr
            ngroups = min(ngroups_max, nstrips)
            if nblk == 1:  # each task runs all of K for its columns (see run_parallel)
                chunk = chunk_bytes // (kcap * nr * C.itemsize)
                call_run_parallel(1, ngroups, A, B, C, z, alpha, beta, jc, nc, 0, k, nblk,
                                  ngroups, Bp, Ap_all, T_all, tr, chunk, cb)
                continue
            for pc in range(0, k, kc_max):
                kc = min(kc_max, k - pc)
                call_run_parallel(0, min(nthreads, nstrips), A, B, C, z, alpha, beta, jc, nc,
                                  pc, kc, nblk, ngroups, Bp, Ap_all, T_all, tr, 0, cb)
                call_run_parallel(1, nblk * ngroups, A, B, C, z, alpha, beta, jc, nc, pc, kc,
                                  nblk, ngroups, Bp, Ap_all, T_all, tr, 0, cb)


def _stored(X, transposed, cols):
    """An operand given as its transpose, as the plain C-contiguous (read-only) array the
    paths without transposed packing read (a copy). ``cols``: the stored rows' own length
    (its rows may lie further apart, see ``problem.row_stride_view``: only that much of
    each is read)."""
    if not transposed:
        return X
    plain = np.ascontiguousarray(np.swapaxes(X[:, :, :cols], 1, 2))
    plain.flags.writeable = False
    return plain


def _vector_product_swapped(A, B, C, tr):
    """A vector times a matrix given as its transpose, as the other vector product on the
    matrix's storage, with no copy: ``x @ W.T`` (one row, B stored as W, (batch|1, N, K)) is
    ``W @ x``, a column of N dot products along W's rows, and ``X.T @ v`` (one column, A
    stored as X, (batch|1, K, M)) is ``v @ X``, one row. Returns (A, B, C, 0) for that
    product, C a view of the same memory (one row and one column hold the same elements in
    the same order), or None for any other product. Copying the transposed matrix instead
    took 100× NumPy's time (x @ W.T, W 4096×4096 float32: 111 ms against 0.9, AMD Zen 5)."""
    batch, m, n = C.shape[0], C.shape[1], C.shape[2]
    if m == 1 and tr & 2:  # x: (batch|1, 1, K) plain, or stored as (batch|1, K, 1)
        x = A if tr & 1 else A.reshape((A.shape[0], A.shape[2], 1))
        return B, x, C.reshape((batch, n, 1)), 0
    if n == 1 and tr & 1:  # v: (batch|1, K, 1) plain, or stored as (batch|1, 1, K)
        v = B if tr & 2 else B.reshape((B.shape[0], 1, B.shape[1]))
        return v, A, C.reshape((batch, 1, m)), 0
    return None


def copies_few_rows_a(m, n, tr):
    """Whether ``blocked`` copies A, given as its transpose (``tr`` bit 0), to the plain
    layout first: a product of 2-7 rows wider than ``NARROW_N``, which ``few_rows`` runs
    reading A plain (``_plain_unless_packed``)."""
    return tr & 1 and 2 <= m < FEW_ROWS and n > NARROW_N


def _plain_unless_packed(A, B, C, tr):
    """(A, B, C, tr) for the path the product takes: operands given transposed (``tr``, see
    ``blocked_threads``) are read in place by the packed path only (small products of
    matrices included: ``small`` packs them on the calling thread); for products with no
    K or with one row or one column they are copied to the plain layout here (a copy of a
    vector), except a vector times a transposed matrix, which becomes the other vector
    product (``_vector_product_swapped``). A small product whose transposed matrix was
    copied took 10× NumPy's time (4×1024×256 float32 with B as W.T: 564 µs against 63; the
    copy, strided, was nearly all of it)."""
    if tr == 0:
        return A, B, C, 0
    swapped = _vector_product_swapped(A, B, C, tr)
    if swapped is not None:
        return swapped
    m, n = C.shape[1], C.shape[2]
    k = A.shape[1] if tr & 1 else A.shape[2] if tr & 2 else B.shape[1]
    if k == 0 or m == 1 or n == 1:
        return _stored(A, tr & 1, m), _stored(B, tr & 2, k), C, 0
    if copies_few_rows_a(m, n, tr):  # few rows: a copy of A is cheap, and
        return _stored(A, 1, m), B, C, tr & 2  # few_rows reads A plain (B in either layout)
    return A, B, C, tr


def swaps_narrow(m, n, tr):
    """Whether ``blocked`` computes a product with A given as its transpose and B plainly
    (``tr`` == 1: ``X.T @ w``) as the transpose of the other product, ``C.T = w.T @ X``: a
    narrow one (2 to ``TRANSPOSE_COLUMNS`` columns) of more rows than that. Packed as it
    is, all of A is copied for a few multiply-adds per element, in tiles ``NR`` columns
    wide, many of them padding, and the threads split its rows. Its transpose has a few
    rows, with X's storage as its B, packed (or read) as it is, and w's as its A given
    transposed: a product of one row block whose threads split the columns, as a plainly
    given ``w.T @ X`` would run (see ``k02_blocked.TRANSPOSE_COLUMNS`` for the figures).
    Of 2-7 rows, w.T is copied for ``few_rows``, which sums K in panels of FEW_KC steps:
    where FEW_KC < KC the last bits differ from the plain operands'. With B given
    transposed too, the transpose would take the 9-15-row tiles, whose panels are shorter
    still (``REREAD_KC``): those stay packed."""
    return tr == 1 and 2 <= n <= TRANSPOSE_COLUMNS < m


def _transposed_product(A, B, C, alpha, beta, cb, vector_direct):
    """``C = alpha*A@B + beta*C``, A given transposed (``swaps_narrow``), computed as
    ``C.T = alpha*B.T@A.T + beta*C.T`` into a scratch array holding C's transpose, then
    copied into C (M×N elements, against M·N·K multiply-adds)."""
    Ct = np.empty((C.shape[0], C.shape[2], C.shape[1]), dtype=C.dtype)
    if beta != 0:
        Ct[...] = np.swapaxes(C, 1, 2)
    blocked(B, A, Ct, alpha, beta, 1, cb, vector_direct)
    C[...] = np.swapaxes(Ct, 1, 2)


# Counts the threaded vector products: each reads its matrix the other way round from the
# last (see gemv_threads).
_gemv_calls = itertools.count()


def blocked(A, B, C, alpha, beta, tr, cb, vector_direct):
    """``C = alpha*A@B + beta*C`` for (batch|1, M, K), (batch|1, K, N), (batch, M, N), with
    the parameters ``cb`` (see ``blocks``); what :func:`bind` gives Python. Products of one
    row or one column run on the calling thread up to ``vector_direct`` multiply-adds (and
    DIRECT_PRODUCT): their matrix within VECTOR_KB, or this CPU's L2 share where that is 0
    (see k02_blocked.VECTOR_L2_SHARE).

    ``tr`` (bits 0 and 1): A, B given as their transposes, (batch|1, K, M) and
    (batch|1, N, K) C-contiguous arrays, e.g. the storage of a Fortran-ordered operand;
    packed from that layout, with no transposing copy. Small products given plainly are
    sent to ``small`` before this, by the bound program (``bind``).

    Either operand may be wider than it is (``problem.row_stride_view``: a slice of
    columns, rows apart): its last dimension is then its row stride, read from its shape,
    and no code takes the operand's width from it. So K comes from B's rows, or A's when
    A is given transposed, and only when B alone is given transposed from A's width (A is
    then dense); M and N come from C.
    """
    A, B, C, tr = _plain_unless_packed(A, B, C, tr)
    k = A.shape[1] if tr & 1 else A.shape[2] if tr & 2 else B.shape[1]
    direct = (DIRECT_PRODUCT if C.shape[1] != 1 and C.shape[2] != 1
              else min(DIRECT_PRODUCT, vector_direct))
    if C.size * k <= direct:
        small(A, B, C, alpha, beta, 0, C.shape[0], tr, cb)  # small, given transposed
        return
    if swaps_narrow(C.shape[1], C.shape[2], tr):
        _transposed_product(A, B, C, alpha, beta, cb, vector_direct)
        return
    if takes_gemv(C.shape[0], C.shape[1], C.shape[2], k, direct):  # (tr is 0 here)
        vector_threads(A, B, C, alpha, beta, cb)
        return
    if parallel_unsafe():  # a forked child where a parallel region would be killed
        blocked_serial(A, B, C, alpha, beta, tr, cb)
        return
    nthreads = pool_threads()  # the first starts Numba's pool, where tilegemm sees it
    if tr and takes_rows(C.shape[0], C.shape[1], C.shape[2], k, nthreads, direct, tr, cb):
        # with an operand given transposed only narrow products take this path (mid-size
        # ones stay packed): it reads B, a few columns, plain (A is, see takes_rows)
        B, tr = _stored(B, tr & 2, k), 0
    if nthreads > 1:  # a parallel region runs
        place_workers()  # Numba's workers on CPUs of their own (see _threads)
    with InParallel():  # (and watches for the pool's threads until they are known)
        size = layout(C.shape[0], C.shape[1], C.shape[2], k, nthreads, direct,
                      B_CHUNK_BYTES, L2_BUDGET, cb, tr)[7]
        blocked_threads(A, B, C, alpha, beta, nthreads, direct,
                        workspace(size * _dt.itemsize).view(_dt), tr, B_CHUNK_BYTES,
                        L2_BUDGET, cb)


def vector_threads(A, B, C, alpha, beta, cb):
    """Products of one row or one column (given plainly), beyond the calling thread's share
    (``takes_gemv``), on the threads: ``gemv_threads``, each call the other way round from
    the last (see there); in a process where a parallel region would be killed, on the
    calling thread (``blocked_serial``)."""
    if parallel_unsafe():
        blocked_serial(A, B, C, alpha, beta, 0, cb)
        return
    nthreads = pool_threads()
    if nthreads > 1:
        place_workers()
    with InParallel():
        gemv_threads(A, B, C, alpha, beta, nthreads, cb[1], next(_gemv_calls) & 1 == 1)


def vector_matrix(A, B, cb):
    """A new ``A @ B`` of two C-ordered matrices, one of them a row or a column, that the
    threads compute (``vector_threads``): what a remembered plain call runs
    (``tilegemm.fastpath``), with none of ``blocked``'s decisions, which the case made once.
    Such a product streams a matrix larger than the L2, after which every line of Python
    runs from L3: ``np.empty``, three reshapes and the bound program's and ``blocked``'s
    checks took 4-16 µs of a 30-70 µs call (float32 768² and 1024² A @ x on an Intel Xeon
    family 6 model 167)."""
    m, n = A.shape[0], B.shape[1]
    C = np.empty((m, n), dtype=A.dtype)
    vector_threads(A.reshape((1, m, A.shape[1])), B.reshape((1, B.shape[0], n)),
                   C.reshape((1, m, n)), one, zero, cb)
    return C


def bind(params):
    """The rung for a parameter set (a mapping of the rung's parameter names; the tile,
    MR and NR, is this module's): :func:`blocked` with the others bound, the cache blocks
    MC, KC, NC and the path parameters FEW_KC, FEW_KB and UNPACKED_KB (the two last in
    KiB), as ``cb`` (see ``blocks``), and VECTOR_KB; called ``(A, B, C, alpha, beta, tr=0)``.

    They are arguments of the compiled code, not constants in it: they only bound loops,
    size the scratch (the micro-kernel's K loop already runs to a length known at run time)
    or choose between paths, and as constants every value a tuner, the database or a test
    asked for compiled the whole rung again (20–30 s on a 2-vCPU machine), where now each
    MR×NR tile compiles once.
    """
    cb = (int(params["MC"]), int(params["KC"]), int(params["NC"]), int(params["FEW_KC"]),
          int(params["FEW_KB"]) * 1024, int(params["UNPACKED_KB"]) * 1024)
    # multiply-adds of a product of one row or one column on the calling thread: VECTOR_KB
    # is decided in Python alone (no compiled code depends on it)
    vector_direct = vector_direct_bytes(int(params["VECTOR_KB"])) // ITEMSIZE

    def takes_small(m, n, k, batch=1):
        """Whether ``run`` computes a batch of products of these sizes given plainly on the
        calling thread (``small``)."""
        size = batch * m * n * k
        return size <= DIRECT_PRODUCT and (size <= vector_direct or m != 1 and n != 1)

    def small_transposed(m, n, k, tr):
        """Whether ``run`` hands a product of these sizes with operands given transposed
        (``tr`` != 0) straight to ``small``, as ``blocked`` would after its checks: one
        product of more than one row and column on the calling thread, not a few rows of
        A given transposed (``blocked`` copies that A first, ``_plain_unless_packed``)."""
        return m > 1 and n > 1 and takes_small(m, n, k) and not copies_few_rows_a(m, n, tr)

    def call_for(m, n, k, dense=True, tr=0):
        """The call ``(A, B, bound)`` giving a new ``A @ B`` of two C-ordered
        matrices of these sizes, as ``run`` computes it, for remembered calls
        (``tilegemm.fastpath``): ``small_matrix`` for a product on the calling thread,
        ``vector_matrix`` for a row or a column on the threads; None for the others.

        ``dense=False``: an operand is a slice of columns (its rows apart), which the
        caller copies to hand over C-ordered. Only a product on the calling thread is
        worth that: its copy (2 µs for 64x64) costs less than the wider view ``run`` reads
        in place (5 µs to make in NumPy, whose product is the same); None for the others.

        ``tr`` != 0: A and/or B given as their transposes (bit 0, bit 1), the call then
        ``(As, Bs, tr, bound)`` on their C-ordered storages (``small_matrix_transposed``),
        for products ``run`` sends straight to ``small``; None for the others."""
        if tr:
            return small_matrix_transposed if small_transposed(m, n, k, tr) else None
        if takes_small(m, n, k):
            return small_matrix
        if dense and k > 0 and (m == 1 or n == 1):  # takes_gemv, for one product
            return vector_matrix
        return None

    def run(A, B, C, alpha, beta, tr=0):
        # (B.shape[1] is K when tr == 0: A's rows may lie apart)
        if tr == 0 and takes_small(C.shape[1], C.shape[2], B.shape[1], C.shape[0]):
            # Small products straight to the calling thread's code: one compiled call, no
            # thread pool (the checks in blocked cost a tiny product about half its time).
            # Larger products of one row or one column go on, to the threads (see blocked).
            small(A, B, C, alpha, beta, 0, C.shape[0], 0, cb)
            return
        if tr and C.shape[0] == 1 and small_transposed(
                C.shape[1], C.shape[2], A.shape[1] if tr & 1 else A.shape[2], tr):
            small(A, B, C, alpha, beta, 0, 1, tr, cb)  # as blocked would, without its checks
            return
        blocked(A, B, C, alpha, beta, tr, cb, vector_direct)

    run.takes_transposed = True  # the CPU backend hands it transposed operands in place
    run.bound = cb  # what compiled code is passed as cb (see ``blocks``)
    run.vector_direct = vector_direct  # (see takes_small)
    # the fewest K steps a panel of a sum may hold (KC; FEW_KC and REREAD_KC for a few
    # rows): alpha scales each panel's sum as it is added into C (see CpuBackend.run)
    run.k_panel = min(cb[1], cb[3], REREAD_KC)
    run.call_for = call_for
    return run


def blocked_serial(A, B, C, alpha, beta, tr, cb):
    """``blocked`` on the calling thread only, with no call that reaches a parallel region
    (see ``_threads.parallel_unsafe``): products with no K or at most ``DIRECT_PRODUCT``
    multiply-adds take the unpacked path, which has none; larger ones run one product at a
    time through ``small``, the batch path's per-product code (the packed loop nest with
    scratch sized as there, the vector path for one row or column, the unpacked tiles for
    narrow products). The same arithmetic as the threaded path, element by element.
    """
    A, B, C, tr = _plain_unless_packed(A, B, C, tr)
    batch, m, n = C.shape[0], C.shape[1], C.shape[2]
    k = A.shape[1] if tr & 1 else A.shape[2] if tr & 2 else B.shape[1]
    if k == 0 or batch * m * n * k <= DIRECT_PRODUCT:
        blocked_threads(A, B, C, alpha, beta, 1, DIRECT_PRODUCT, np.empty(0, dtype=_dt), tr,
                        B_CHUNK_BYTES, L2_BUDGET, cb)
        return
    small(A, B, C, alpha, beta, 0, batch, tr, cb)


@when_called(numba.void(ro3, ro3, a3, nbt, nbt, i8, i8, flag), parallel=True, **FLAGS)
def gemv_threads(A, B, C, alpha, beta, nthreads, kc_max, backward):
    """Products with M == 1 or N == 1, one after another, each split into ``nthreads``
    chunks of columns (M == 1) or rows (N == 1) that run in parallel.

    ``backward``: each thread takes its rows of A (N == 1) or B's K panels (M == 1) last
    first. ``blocked`` flips it on every call, so a call starts with what the last one read
    last. A matrix a little larger than the threads' L2 caches was read each time in the
    order that least-recently-used replacement had just evicted, all of it from L3; read
    the other way round, the part still cached is read first. Every element's sum is the
    same either way.
    """
    for z in range(C.shape[0]):
        Az = A[z if A.shape[0] > 1 else 0]
        Bz = B[z if B.shape[0] > 1 else 0]
        Cz = C[z]
        for c in prange(nthreads):
            call_gemv_part(Az, Bz, Cz, alpha, beta, np.int64(c), nthreads, kc_max, backward)


@when_called(numba.boolean(i8, i8, i8, i8, i8), **FLAGS)
def takes_gemv(batch, m, n, k, direct_max):
    """Whether a call takes the vector-matrix path: one row or one column per product,
    above the unpacked small-product path, and not a batch of small products (those run
    one product per thread, as the packed path does)."""
    if k == 0 or batch * m * n * k <= direct_max or (m != 1 and n != 1):
        return False
    return batch == 1 or m * n * k > SMALL_PRODUCT


# Every compiled function, callees before callers (the order they compile in on a cold
# cache), and those that Python calls: a warm cache loads only these, the first at import
# and each of the others on its first call (see _lazy).
COMPILED = (ukernel, aligned3, pack_bt, pack_at, pack_b, pack_a, macro, gemm_serial, fold,
            few_rows, few_width, few_row_product, tiled_dots, direct, products_serial,
            gemv_part, unpacked_small, transpose_into, direct_transposed, small, small_matrix,
            small_matrix_transposed,
            run_parallel, splits_batch, takes_rows, takes_few, layout, blocked_threads,
            gemv_threads, takes_gemv)
CALLED_FROM_PYTHON = (takes_gemv, takes_rows, takes_few, layout, small, blocked_threads,
                      gemv_threads, small_matrix, small_matrix_transposed)
load_compiled(COMPILED, CALLED_FROM_PYTHON)
