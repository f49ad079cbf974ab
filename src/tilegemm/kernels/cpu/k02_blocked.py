"""Rung 2 (CPU) — cache- and register-blocked, packed, multi-threaded GEMM (the BLIS loop nest).

The triple loop is bound by memory: its inner loop walks B down a column, one cache line per
multiply-add, and keeps one accumulator. This rung reorganises the same arithmetic the way
GotoBLAS/BLIS do, so that almost every operand comes from a register or L1:

- five loops ``jc`` (NC columns of B) → ``pc`` (KC of the inner dimension) → ``ic`` (MC rows
  of A) → ``jr`` (NR columns) → ``ir`` (MR rows) around a micro-kernel;
- **packing**: the KC×NC panel of B is copied once into NR-wide strips ``Bp[s, p, 0:NR]`` and
  each MC×KC block of A into MR-tall strips ``Ap[r, p, 0:MR]``, zero-padded at the edges, so
  the micro-kernel reads both with unit stride and never tests a bound (padding rows and
  columns produce results nobody stores);
- **micro-kernel**: an MR×NR tile of C held in registers for the whole KC loop; per step it
  loads one NR-vector of B, broadcasts MR values of A and issues MR×NR/width FMAs (integer
  multiplies and adds for int32/int64). The K loop is explicit vector code
  (``_vector_tile``: LLVM IR built by a Numba intrinsic, row by row, so each broadcast is
  used as soon as it is loaded and BLIS's 15-of-16-register AVX2 tiles do not spill), its
  accumulators LLVM values that live in registers. Not an array: Numba allocates arrays on
  the heap, and LLVM will not keep heap memory in registers, so a local
  ``np.zeros((MR, NR))`` accumulator runs from L1 at 1/20 of the speed;
- **threads**: ``prange`` over balanced row-block tasks of each packed panel (plus column
  groups when there are few rows), or over the batch when each product is small;
- **one row or one column** (vector-matrix and matrix-vector products): no packing, the
  matrix streamed once and split over the threads (``gemv_threads``; see docs/cpu.md).

Expected: compute-bound — one thread reaches about 93% of single-threaded OpenBLAS on
float32 and float64 at 1024³–2048³; two threads scale when both cores are free (see
docs/cpu.md for the measurements and the loop nest).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tilegemm.registry import FLOATS, INTS, Constraint, KernelSpec, Param

# Below this many multiply-adds per product (and with a batch of at least two), the threads
# split the batch instead of one product: a parallel region per K panel costs more than it buys.
SMALL_PRODUCT = 96 * 96 * 96
# At most this many multiply-adds in all (batch included), the product runs on the calling
# thread (packed above 48³ per product, see ``small``): waking the thread pool costs more than
# the second core buys (measured crossover on a 2-vCPU AMD Zen 5: 128³-160³ float32,
# 112³-128³ float64; see docs/cpu.md).
DIRECT_PRODUCT = 112 * 112 * 112
# Products of one row or one column (matrix-vector, vector-matrix) are bound by reading the
# matrix, not by arithmetic: one core does so fast while the matrix fits in its L2, and from
# further out two cores read faster, which pays for waking the pool well below
# DIRECT_PRODUCT. They run on the calling thread only while the matrix takes at most this
# share of this CPU's L2 (``vector_direct_bytes``). µs per A @ x on one thread / two, a
# 2-vCPU AMD Zen 5 (1 MiB of L2): float32 384² (576 KiB) 4.3 / 5.8, 512² (1 MiB) 9.8 / 6.9,
# 1024² 49 / 27; float64 256² (512 KiB) 3.7 / 5.5, 384² (1.1 MiB) 11.1 / 7.4.
VECTOR_L2_SHARE = 0.75
# ... unless the parameter VECTOR_KB (set per device in the database) names the size in KiB
# instead; this default, 0, keeps the L2 rule. Where starting the threads costs more, the
# calling thread reads further out as fast: on a 2-vCPU AMD EPYC Zen 3 guest (512 KiB of L2,
# TBB's second thread arriving 10-20 µs into a region) whole calls of A @ x took, calling
# thread / threads, µs: float32 512 KiB 26 / 50, 1 MiB 39 / 55, 2 MiB 63 / 69, 3 MiB 95 /
# 95, 5 MiB 148 / 144; float64 512 KiB 25 / 42, 1 MiB 39 / 55, 2 MiB 61 / 77, 3 MiB 82 /
# 85, 5 MiB 131 / 114 (benchmarks/vector_threads.py): its entries set 2048, where the
# calling thread won in every run.
VECTOR_KB = 0
# On CPUs with 32 vector registers (AVX-512, NEON) the unpacked tiles have an 8-row tile
# several vectors wide (``_small_tile.eight_row_vectors``), and products up to this many
# multiply-adds run unpacked (``direct``: on the calling thread, or with their rows split
# over the threads), not packed: packing costs more than it buys below it. One thread,
# AMD Zen 5, µs unpacked / packed: float32 100³ 9.7 / 14.4, 128³ 18.1 / 19.3, 256³ 129 /
# 140; float64 100³ 16.9 / 22.6, 256³ 268 / 296. Two threads, whole calls, unpacked against
# packed: 1.08-1.52× faster from 128³ to 384³ and on 16×4096×256, 4096×64×64, 64×64×4096
# (float32 32×2048×256 0.94×); 512³ 0.79-0.91× (B beyond the L2: each run of rows reads
# all of it), hence 384³.
UNPACKED_PRODUCT = 384 * 384 * 384
# ... and only while B takes at most this many KiB: the default of the parameter
# UNPACKED_KB, set per device in the database (an argument of the compiled code, as all
# parameters but the tile are). Each thread
# reads all of B once per 8 of its rows, so a B beyond the L2 comes from L3 again and again.
# The default never binds (a product within UNPACKED_PRODUCT with the 16 rows it needs has
# a B of at most 27 MiB): on the AMD Zen 5 where the unpacked path was measured its L3
# served it fast enough up to 384³ (float64 B 1.1 MiB, twice its L2). On an Intel Xeon
# (family 6 model 167, 2 MiB of L2, a slower L3) the packed path was ahead from 2 MiB of B:
# float64 128×512×512 0.51-0.55 → 0.78-0.80× NumPy, 32×1024×1024 0.58-0.63 → 0.84-0.88×
# (float32 48×1024×1024 0.57-0.58 → 0.87-0.93×), and behind at 1 MiB and below (float32
# 384³ 1.17-1.19 → 0.93-0.96×, 128×512×512 0.91-0.98 → 0.81-0.85×): its entries set 1024.
UNPACKED_KB = 32768
# Products of 2-7 rows (``_small_tile.FEW_ROWS``) run on the calling thread while B is at
# most this many KiB, else their columns are split over the threads: the default of the
# parameter FEW_KB, set per device in the database. Such a product waits on reading B, and
# with B in L3 one thread of an AMD Zen 5 read it as fast as two or faster (the parallel
# region's start cost the rest); 2 threads / 1, µs: float32 6×512×512 (1 MiB) 68 / 39,
# 4×1024×1024 (4 MiB) 185 / 124; float64 3×256×2048 (4 MiB) 110 / 130, 4×1024×1024 (8 MiB)
# 203 / 249, float32 4×4096×4096 (64 MiB, from memory) 1810 / 2767. One core of an Intel
# Xeon (family 6 model 167) reads L3 more slowly, and there two threads paid from 1 MiB
# (FEW_KB = 1024 in its database entries; docs/cpu.md).
FEW_KB = 4096
# ... and sum K in panels of at most this many steps (and at most KC): the default of the
# parameter FEW_KC, set per device in the database. The tile walks a panel's rows of B a
# few vectors at a time, and on an Intel Xeon (family 6 model 167) a walk over 512 rows ran
# 25-30 % slower than over 128 (float64 2×1024² 348 → 255 µs, float32 241 → 171; 7 rows
# alike); the AMD Zen 5, where the walk was tuned, is not measured yet, so its default
# stays the whole of KC.
FEW_KC = 1024
# Products up to this size also run one per thread when the batch has at least
# BATCH_SPLIT_MIN products per thread: no synchronisation per product (float32 on a 2-vCPU
# AMD Zen 5: 32 × 128³ 0.83 → 3.0× NumPy's time, 16 × 192³ 0.81 → 2.0×, 4 × 256³ 0.95 →
# 1.04×; with 3 products on 2 threads the uneven split lost: 1.04 → 0.81×).
BATCH_PRODUCT = 256 * 256 * 256
BATCH_SPLIT_MIN = 2
# Steps of the micro-kernel's K loop per trip (see ``_vector_tile``): LLVM does not unroll a
# loop body this large itself, and with one step per trip the loop counter, the two pointer
# increments and the branch take issue slots from 16 FMAs (four steps: 10-20 % faster).
K_UNROLL = 4


def micro_kernel_source() -> str:
    """Python source of the micro-kernel, the same for every tile shape and dtype.

    ``ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, bb, mode)`` computes the tile
    ``Ap[r, :kc].T @ Bp[s, :kc]`` from A strip r and B strip s of the packed panels (Ap[r]
    is (KC, MR), Bp[s] is (KC, NR)) into the scratch tile T (MR×NR, in L1) with ``kloop``,
    the explicit vector K loop of ``_vector_tile`` (built for the module's MR, NR and
    dtype), then writes it: mode 0 not at all (edge tiles, whose caller stores the part that
    exists); mode 1 ``C[i:i+MR, j:j+NR] = alpha*tile`` (C not read) with ``tstore``; mode 2
    ``= alpha*tile + bb*C`` (bb = beta on the first K panel, 1 after) with ``tstore_c``
    (``_vector_tile.tile_store``: all loads before the first store to C, which might alias
    T as far as LLVM knows). Going through T costs MR·NR stores and loads per tile, against
    MR·NR·KC multiply-adds: well under 1 %.

    Strips are indexed here rather than passed as views: a view is a new array object
    whose reference counting, per tile, costs atomics on a panel both threads share.

    Before the vector loop, the tile was MR·NR named scalars (``c{i}_{j} += a * b{j}``)
    left to LLVM's SLP vectoriser: see docs/cpu.md for why that spilled AVX2's tiles, and
    why integer tiles written so ran at a third of the speed and took 16 s to compile.
    """
    return (
        "def ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, bb, mode):\n"
        "    kloop(kc, Ap, r * Ap.shape[1] * Ap.shape[2], Bp,"
        " s * Bp.shape[1] * Bp.shape[2], T)\n"
        "    if mode == 1:\n"
        "        tstore(T, C, i, j, alpha)\n"
        "    elif mode == 2:\n"
        "        tstore_c(T, C, i, j, alpha, bb)\n"
    )


def jit_flags(dtype: np.dtype) -> dict[str, Any]:
    """No bounds checks, NumPy error model; for floats, FMA contraction and nothing else
    (no reassociation, so NaN/Inf and rounding behave like the plain loop)."""
    flags: dict[str, Any] = {"error_model": "numpy", "boundscheck": False, "cache": False}
    if dtype.kind == "f":
        flags["fastmath"] = {"contract"}
    return flags


def micro_kernel(mr: int, nr: int, dtype: np.dtype) -> Any:
    """The compiled MR×NR micro-kernel ``ukernel(kc, Ap, r, Bp, s, T)`` for ``dtype``.

    Compiled eagerly under the settings the rung declares for it (the SLP vectoriser on,
    the vector width; see ``_slp``), so it is the same machine code as the rung's; the
    tests read its assembly to check that the tile really lives in vector registers.
    """
    import numba
    from numba import njit

    from tilegemm.kernels.cpu._slp import slp_enabled

    dtype = np.dtype(dtype)
    nbt = numba.from_dtype(dtype)
    from tilegemm.kernels.cpu._slp import vector_width
    from tilegemm.kernels.cpu._vector_tile import tile_loop, tile_store

    ns: dict[str, Any] = {
        "kloop": tile_loop(mr, nr, dtype, vector_bits(), K_UNROLL),
        "tstore": tile_store(mr, nr, dtype, vector_bits(), scale_c=False),
        "tstore_c": tile_store(mr, nr, dtype, vector_bits(), scale_c=True),
    }
    exec(micro_kernel_source(), ns)  # noqa: S102 - our own source
    i8, a2, a3 = numba.int64, nbt[:, ::1], nbt[:, :, ::1]

    sig = numba.void(i8, a3, i8, a3, i8, a2, a2, i8, i8, nbt, nbt, i8)
    with slp_enabled(), vector_width(vector_bits()):
        return njit(sig, **jit_flags(dtype))(ns["ukernel"])


# The generated modules this process has imported, by (source, cache folder): parameter
# sets that differ only in the parameters bound as arguments (all but the tile) share one,
# instead of each importing the cache entry again and loading its code (or, with the cache
# off, compiling it again).
_TILE_MODULES: dict[tuple[str, str], Any] = {}


def build(p: Mapping[str, int], dtype: np.dtype, template_dir: str | Path | None = None
          ) -> Any:
    """The compiled rung for one parameter set: ``_blocked_source`` with the tile (MR, NR)
    as constants, loaded through the persistent compile cache (compiled once per machine),
    and the other parameters, the cache blocks (MC, KC, NC) and the path parameters
    (FEW_KC, FEW_KB, UNPACKED_KB), bound as arguments (``bind``; VECTOR_KB is read by its
    Python alone), so parameter sets with one tile share one compiled module, imported
    once per process.

    ``template_dir``: a folder holding another ``_blocked_source.py`` to build instead,
    e.g. an earlier commit's, which ``benchmarks/cpu_ab.py`` times against this one in the
    same process (with this tree's helper modules and micro-kernel)."""
    from tilegemm._compat import import_numba
    from tilegemm.compile_cache import cache_root, fill_template, load_module
    from tilegemm.kernels.cpu._compile_workers import compile_jobs
    from tilegemm.kernels.cpu._slp import vector_width
    from tilegemm.kernels.cpu._threads import PoolWatch, make_tbb_loadable

    import_numba()  # one thread at a time (see there)
    make_tbb_loadable()  # before Numba picks its threading layer (see _threads)
    compile_jobs()  # a bad TILEGEMM_COMPILE_JOBS is refused here, not inside the cache's import
    dtype = np.dtype(dtype)
    header = {"MR": p["MR"], "NR": p["NR"]}
    bits = vector_bits()
    folder = Path(__file__).parent if template_dir is None else Path(template_dir)
    template = (folder / "_blocked_source.py").read_text()
    source = fill_template(
        template,
        {"MR, NR": (p["MR"], p["NR"]), "DTYPE": dtype.name, "CACHE": False,
         "SMALL_PRODUCT": SMALL_PRODUCT, "DIRECT_PRODUCT": DIRECT_PRODUCT,
         "UNPACKED_PRODUCT": UNPACKED_PRODUCT,
         "BATCH_PRODUCT": BATCH_PRODUCT, "BATCH_SPLIT_MIN": BATCH_SPLIT_MIN,
         "VECTOR_BITS": bits, "K_UNROLL": K_UNROLL,
         "ONE_BLOCK_TASK_COLUMNS": ONE_BLOCK_TASK_COLUMNS,
         "ONE_REGION_PRODUCT": ONE_REGION_PRODUCT,
         "ONE_REGION_TASK_COLUMNS": ONE_REGION_TASK_COLUMNS,
         "TRANSPOSE_COLUMNS": TRANSPOSE_COLUMNS},
        {"ukernel": micro_kernel_source()},
    )
    # compiled (or loaded from the cache) with full-width vectors; loading may start
    # Numba's thread pool, whose threads are then placed before each product (_threads)
    key = (source, str(cache_root()))
    module = _TILE_MODULES.get(key)
    if module is None:
        with vector_width(bits), PoolWatch():
            module = load_module(f"blocked-{dtype.name}", source,
                                 {"kernel": "blocked", "params": header, "dtype": dtype.name})
        _TILE_MODULES[key] = module
    program = module.bind(p)
    program.module = module  # for tests and benchmarks that set its globals (L2_BUDGET)
    return program


# Products of one row block pack B a chunk of strips at a time, each chunk just before its
# tiles are computed, into at most this many bytes, and at most half of a CPU's L2
# (``b_chunk_bytes``; see ``run_parallel`` in the generated module): the chunk stays in L2
# beside an MC x KC block of A, and the larger it is, the longer the piece of each row of
# B that packing reads in one go (1 KiB per row at KC = 512). 512 KiB measured best on an
# Intel Xeon with 2 MiB of L2 (docs/cpu.md); it is half of AMD Zen 4/5's 1 MiB.
B_CHUNK_MAX = 512 * 1024
# A product of more than MC rows runs as one row block too while the packed block of all
# its rows and a chunk of B take at most this share of a CPU's L2 and the panel of B that
# row blocks would share does not (``l2_budget``, ``one_row_block``). Measured on an Intel
# Xeon with 2 MiB of L2 per core (family 6 model 167, 2 threads): 128-256 rows x 2048-4096
# columns at K >= 2048 went from 0.72-1.04x NumPy to 0.87-1.21x as one block; a block
# filling all of L2 (384 rows, float64) lost, and so did 2048 x 2048 x 32 (1.37x to 1.06x:
# its whole panel of B fits in L2, so sharing it costs nothing). 5/8 is the largest share
# that leaves CPUs with 1 MiB of L2 (AMD Zen 4/5), where this was not measured, as they
# were for K >= KC.
ONE_BLOCK_L2_SHARE = 5 / 8
# ... and only with at least this many columns of B for each of two tasks per thread: every
# task packs the whole block of A, which pays for itself only over enough columns (at 256,
# each packed element of A serves 256 multiply-adds). The measurements
# above had 512 (2 threads, 2048 columns per panel); on many cores a panel's columns are
# spread too thin, and products of more than MC rows are split as before. Written into the
# generated module's header, as the product sizes above are.
ONE_BLOCK_TASK_COLUMNS = 256
# Products of more than MC rows up to this many multiply-adds are one row block as well
# (given ONE_REGION_TASK_COLUMNS columns of B for each thread, one task per thread): one
# parallel region per product, where row blocks need two per K panel (the B panel packed
# by all threads, then the row blocks), and each region costs its start. With Numba's TBB
# layer a region of two tasks took 15-20 µs more than one task's work on a 2-vCPU AMD EPYC
# (family 25 model 1, KVM; 2-3 µs with GNU OpenMP): the start of a task arena and the
# wake-up of its idle worker. Each task then packs the whole block of A, not its row
# block's share, hence one task per thread (two per thread measured the same there) and at
# least 64 columns each: on many cores few products this small qualify. Two threads there,
# float32 µs, row blocks / one: 128³ 105 / 82, 192³ 236 / 185, 256³ 397 / 357, 384³
# 1051 / 935, 512³ 2321 / 2211; float64 128³ 167 / 132, 320³ 1217 / 1140, 384³
# 1862 / 1846, 512³ 4219 / 5254 (A no longer in L2), hence 384³.
ONE_REGION_PRODUCT = 384 * 384 * 384
ONE_REGION_TASK_COLUMNS = 64
# A product with A given as its transpose (``X.T @ w``, a weight's gradient) and at most this
# many columns, of more rows than that, is computed as its transpose, ``w.T @ X``: a product
# of a few rows, one row block whose threads split the columns, X's storage as its B (see
# ``swaps_narrow`` in the generated module). Packed as it was, all of A was copied for a
# few multiply-adds per element, in tiles NR columns wide, many of them padding. Intel Xeon
# family 6 model 207 (2 vCPUs), 2048 × N × 2048, time against NumPy, packed / transposed
# (two runs in alternating processes; N > 32 in one process, alternating blocks): float32
# N = 2 0.73 / 2.02, 7 0.90 / 2.85, 16 0.70 / 1.29, 32 0.90 / 1.29, 48 0.75 / 1.03,
# 64 0.88 / 0.96, 96 0.90 / 0.93; float64 2 0.66 / 1.88, 16 0.65 / 1.26, 24 0.76 / 1.42,
# 48 0.80 / 1.28, 64 1.04 / 1.35.
TRANSPOSE_COLUMNS = 64


def b_chunk_bytes() -> int:
    """How much of B a task of one row block packs at a time: ``B_CHUNK_MAX``, or half of
    this CPU's L2 where that is less (256 KiB on AMD Zen 3, with 512 KiB of L2)."""
    from tilegemm.backends.cpu import l2_cache_bytes

    l2 = l2_cache_bytes()
    return B_CHUNK_MAX if l2 is None else min(B_CHUNK_MAX, l2 // 2)


def unpacked_rows(m: int, size: int, threads: int, bits: int | None, b_bytes: int,
                  unpacked_kb: int, one_pass: bool = False) -> bool:
    """Whether a product of ``m`` rows and ``size`` multiply-adds, not narrow, given plainly
    and not taken by an earlier path, runs unpacked with its rows split over ``threads``
    threads (the generated module's ``takes_rows``): where the CPU has the wide 8-row tile
    (``bits``: the vector width, see ``vector_bits``), with as many rows as the few-row
    path's limit or more; at any size where its columns take one pass of that tile
    (``one_pass``: 48 float32 or 24 float64 columns with AVX-512 code, whose packed
    strips of 32 columns were half padding at 33: float32 2048×40×2048 0.57-0.68× NumPy
    packed, 1.00× unpacked, Intel Xeon family 6 model 207); else at most
    ``UNPACKED_PRODUCT``, its B (``b_bytes``) at most ``unpacked_kb`` KiB (the parameter
    UNPACKED_KB), and runs of 8 rows that share evenly between the threads: at least two
    runs per thread, or the same whole runs for each (10 rows on two threads gave one 8
    rows and the other 2)."""
    from tilegemm.kernels.cpu._small_tile import eight_row_vectors, few_rows_limit

    if eight_row_vectors(bits) <= 1 or m < few_rows_limit(bits):
        return False
    units = (m + 7) // 8
    return one_pass or (size <= UNPACKED_PRODUCT and b_bytes <= unpacked_kb * 1024
                        and (units >= 2 * threads or m % (8 * threads) == 0))


def vector_direct_bytes(vector_kb: int = VECTOR_KB) -> int:
    """The largest matrix (in bytes) a product of one row or one column reads on the calling
    thread: ``vector_kb`` KiB (the parameter VECTOR_KB), or where that is 0
    ``VECTOR_L2_SHARE`` of this CPU's L2, or of 1 MiB where the size is unknown."""
    from tilegemm.backends.cpu import l2_cache_bytes

    if vector_kb:
        return vector_kb * 1024
    return int((l2_cache_bytes() or 1024 * 1024) * VECTOR_L2_SHARE)


def direct_limit(m: int, n: int, itemsize: int, vector_kb: int = VECTOR_KB) -> int:
    """Multiply-adds up to which a product of ``m`` × ``n`` runs on the calling thread:
    ``DIRECT_PRODUCT``, less for products of one row or one column (see
    ``VECTOR_L2_SHARE``, and the parameter VECTOR_KB, ``vector_kb``). The bound program
    decides the same way (its ``vector_direct``)."""
    if m != 1 and n != 1:
        return DIRECT_PRODUCT
    return min(DIRECT_PRODUCT, vector_direct_bytes(vector_kb) // itemsize)


def l2_budget() -> int:
    """``ONE_BLOCK_L2_SHARE`` of this CPU's L2 in bytes (``backends.cpu.l2_cache_bytes``;
    0 where the size is unknown, so only products of at most MC rows are one row block)."""
    from tilegemm.backends.cpu import l2_cache_bytes

    l2 = l2_cache_bytes()
    return 0 if l2 is None else int(l2 * ONE_BLOCK_L2_SHARE)


def one_row_block(m: int, n: int, k: int, threads: int, params: Mapping[str, int],
                  itemsize: int, budget: int | None = None,
                  chunk_bytes: int | None = None) -> bool:
    """Whether the packed path runs a product as one row block (see
    :func:`one_row_block_why`)."""
    return one_row_block_why(m, n, k, threads, params, itemsize, budget,
                             chunk_bytes) is not None


def one_row_block_why(m: int, n: int, k: int, threads: int, params: Mapping[str, int],
                      itemsize: int, budget: int | None = None,
                      chunk_bytes: int | None = None) -> str | None:
    """Why the packed path runs a product as one row block ("rows": at most MC rows;
    "l2": their block of A fits in L2; "small": a small product), or None when it does not.

    One row block is split by columns only, each thread packing its own strips of B as it
    goes (``layout`` and ``run_parallel`` in the generated module); this is the same
    arithmetic as ``layout``'s row blocks. That needs either
    at most MC rows and a strip of NR columns for every thread (or one MR strip of rows, or
    one thread), or more rows whose packed block of A (MR-padded rows x min(KC, K), of
    ``itemsize`` bytes) with ``chunk_bytes`` of B (``b_chunk_bytes()`` when None) fits
    ``budget`` bytes (``l2_budget()`` when None) while the packed panel of B (min(NC, N)
    NR-padded columns x min(KC, K)) does not, with ``ONE_BLOCK_TASK_COLUMNS`` columns of
    the panel for each of two tasks per thread, or a product of at most
    ``ONE_REGION_PRODUCT`` multiply-adds with ``ONE_REGION_TASK_COLUMNS`` columns for each
    thread (then one task per thread). In one row block, each thread multiplies the
    whole block of A by the strips of B it packs, a chunk at a time: both stay in L2.
    Shared by several row blocks, a panel of B that L2 cannot hold is read back from L3 (or
    memory) by each of them. One row block also runs all K panels in one parallel region."""
    mr, nr = params["MR"], params["NR"]
    budget = l2_budget() if budget is None else budget
    chunk_bytes = b_chunk_bytes() if chunk_bytes is None else chunk_bytes
    strips = (min(params["NC"], n) + nr - 1) // nr
    row_strips = (m + mr - 1) // mr
    depth = min(params["KC"], k) * itemsize
    blocks = (row_strips + params["MC"] // mr - 1) // (params["MC"] // mr)
    if (blocks > 1 and strips * nr >= ONE_BLOCK_TASK_COLUMNS * 2 * threads
            and row_strips * mr * depth + chunk_bytes <= budget < strips * nr * depth):
        return "l2"
    if (blocks > 1 and m * n * k <= ONE_REGION_PRODUCT
            and strips * nr >= ONE_REGION_TASK_COLUMNS * threads):
        return "small"
    if blocks > 1 or strips < threads:
        blocks = min(row_strips, (blocks + threads - 1) // threads * threads)
    return "rows" if blocks == 1 else None


def path(batch: int, m: int, n: int, k: int, threads: int,
         params: Mapping[str, int] | None = None, *, itemsize: int | None = None,
         budget: int | None = None, a_transposed: bool = False,
         b_transposed: bool = False) -> str:
    """Which of the rung's paths a product of ``batch`` (m, k) @ (k, n) products takes on
    ``threads`` threads, in words (``tilegemm.plan`` names it): the same tests, in the same
    order, as the generated module's ``blocked``, ``takes_gemv``, ``swaps_narrow`` (the
    path of the product's transpose then), ``splits_batch``, (given the dtype's
    ``itemsize``) ``takes_rows`` and ``takes_few`` (``a_transposed``, ``b_transposed``:
    that operand is handed over as its transpose, e.g. Fortran-ordered) and (given the
    parameters and the L2 ``budget`` too, see :func:`one_row_block`) ``layout``."""
    from tilegemm.kernels.cpu._small_tile import (
        FEW_ROWS,
        few_split_bytes,
        narrow_columns,
        wide_columns,
    )

    if params is not None and itemsize is None:
        raise TypeError("path: the parameters need the dtype's itemsize beside them")
    size = m * n * k
    if k == 0:
        return "no K: beta·C (or zeros), on the calling thread"
    vector_kb = VECTOR_KB if params is None else params.get("VECTOR_KB", VECTOR_KB)
    direct = DIRECT_PRODUCT if itemsize is None else direct_limit(m, n, itemsize, vector_kb)
    if batch * size <= direct:
        return "small product: on the calling thread, no thread pool"
    if (m == 1 or n == 1) and (batch == 1 or size > SMALL_PRODUCT):
        return f"one row or column: the matrix streamed once, split over {threads} thread(s)"
    if a_transposed and not b_transposed and 2 <= n <= TRANSPOSE_COLUMNS < m:  # swaps_narrow
        other = path(batch, n, m, k, threads, params, itemsize=itemsize, budget=budget,
                     a_transposed=True)
        return f"as its transpose, B.T @ A.T (A given transposed, few columns): {other}"
    if batch >= 2 and (size <= SMALL_PRODUCT
                       or (size <= BATCH_PRODUCT and batch >= BATCH_SPLIT_MIN * threads)):
        return f"batch split: whole products on each of {threads} thread(s)"
    if itemsize is not None and n <= narrow_columns(itemsize, vector_bits()) and not a_transposed:
        return (f"narrow product: rows split over {threads} thread(s), A and B read in "
                "place, no packing")
    unpacked_kb = UNPACKED_KB if params is None else params.get("UNPACKED_KB", UNPACKED_KB)
    if (itemsize is not None
            and unpacked_rows(m, size, threads, vector_bits(), k * n * itemsize, unpacked_kb,
                              n <= wide_columns(itemsize, vector_bits()))
            and not a_transposed and not b_transposed):
        return (f"unpacked: rows split over {threads} thread(s), 8 rows × several vectors "
                "at a time, A and B read in place, no packing")
    if itemsize is not None and 2 <= m < _few_limit(m, n, k, itemsize, a_transposed,
                                                    b_transposed):
        few_kb = FEW_KB if params is None else params.get("FEW_KB", FEW_KB)
        where = ("on the calling thread" if k * n * itemsize <= few_split_bytes(m, few_kb)
                 else f"columns split over {threads} thread(s)")
        how = ("dot products of A's rows and B's columns (B given transposed) along K"
               if b_transposed else "one tile of all the rows per few vectors of columns"
               if m < FEW_ROWS else "an 8-row tile, then one of the other rows, per few "
               "vectors of columns" if m < 2 * FEW_ROWS else "8-row tiles, then one of the "
               "other rows, per few vectors of columns")
        return f"few rows: {where}, {how}, A and B read in place, no packing"
    why = (None if params is None
           else one_row_block_why(m, n, k, threads, params, itemsize, budget))
    if why is not None:
        why = {"rows": "",
               "l2": f" (more than MC={params['MC']} rows, but their block of A fits in L2 "
                     "beside a chunk of B)",
               "small": f" (more than MC={params['MC']} rows, but a product this small "
                        "runs in one parallel region)"}[why]
        return (f"packed panels, one row block{why}: columns split over {threads} "
                "thread(s), each packing its own part of B as it goes")
    return f"packed panels, each product split over {threads} thread(s)"


def _few_limit(m: int, n: int, k: int, itemsize: int, a_transposed: bool,
               b_transposed: bool) -> int:
    """Products of fewer rows than this take the few-row path (given the other tests of the
    generated module's ``takes_few``): 2-7 rows with A given transposed; with B given
    transposed 2-15 (``DOT_MAX``), and with the wide 8-row tile to ``DOT_TILED_ROWS`` - 1
    while A is within ``DOT_TILED_A_BYTES`` (its ``tiled_dots``); given plainly 2-7 (2-15
    with the wide tile), and with it to ``TILED_ROWS`` - 1 while B is within
    ``TILED_BYTES``."""
    from tilegemm.kernels.cpu._dot_tile import DOT_MAX, DOT_TILED_A_BYTES, dot_limit
    from tilegemm.kernels.cpu._small_tile import (
        FEW_ROWS,
        TILED_BYTES,
        few_rows_limit,
        few_tiled_limit,
    )

    bits = vector_bits()
    if a_transposed:
        return FEW_ROWS
    if b_transposed:
        if m < DOT_MAX or m * k * itemsize <= DOT_TILED_A_BYTES:
            return dot_limit(bits)
        return DOT_MAX
    if m < few_rows_limit(bits) or k * n * itemsize <= TILED_BYTES:
        return few_tiled_limit(bits)
    return few_rows_limit(bits)


# The vector width the rung's code is built for, per ISA (see ``vector_bits``).
ISA_VECTOR_BITS = {"avx512": 512, "neon": 128}


def vector_bits() -> int | None:
    """The vector width the code is built for (``ISA_VECTOR_BITS``): 512 on AVX-512 CPUs,
    whatever LLVM's tuning prefers (see ``_slp.vector_width``: it would use half-width
    vectors on Intel's server cores); 128 on 64-bit ARM, NEON's width (also on CPUs with
    SVE, whose wider registers LLVM does not use for fixed-width vectors), so each vector
    of the K loop is one register; None (LLVM's choice, 256-bit vectors in the K loop)
    elsewhere."""
    from tilegemm.tune.database import host_isa

    return ISA_VECTOR_BITS.get(host_isa())


def _dtype_check(p: Mapping[str, int], dtype: np.dtype) -> str | None:
    """The register tile in bytes: MR*NR <= 384 is 24 AVX-512 registers of float32; of an
    8-byte type the same count needs twice the registers and spills (MR=12 NR=32 in int64,
    written as scalars then, took LLVM about 2 minutes to compile, against 13 s)."""
    cap = 384 * 4 // np.dtype(dtype).itemsize
    if p["MR"] * p["NR"] > cap:
        return (f"MR*NR = {p['MR'] * p['NR']} does not fit the vector registers in "
                f"{np.dtype(dtype).name} (at most {cap} for {np.dtype(dtype).name}'s "
                f"{np.dtype(dtype).itemsize}-byte elements: the 1,536 bytes of 24 AVX-512 "
                "registers)")
    return None


SPEC = KernelSpec(
    name="blocked",
    backend="cpu",
    rung=2,
    title="packed panels, MR×NR register tile, cache blocks, threads",
    build=build,
    params=(
        Param("MR", 16, (4, 6, 8, 12, 16), "rows of the register tile (broadcasts of A)"),
        Param("NR", 8, (8, 16, 32, 64), "columns of the register tile (vector lanes of B)"),
        Param("MC", 96, (48, 96, 144, 192, 288, 384), "rows of the packed A block (L2)"),
        Param("KC", 512, (64, 128, 256, 384, 512, 768, 1024),
              "inner-dimension depth of a panel (L1/L2)"),
        Param("NC", 2048, (256, 512, 1024, 2048, 4096), "columns of the packed B panel (L3)"),
        Param("FEW_KB", FEW_KB, (256, 512, 1024, 2048, 4096, 8192, 16384),
              "KiB of B up to which a product of 2-7 rows runs on one thread (a path "
              "threshold, set per device in the database; not searched)", searched=False),
        Param("FEW_KC", FEW_KC, (64, 128, 256, 512, 1024),
              "K steps per panel, at most (and at most KC), of a product of 2-7 rows (set per "
              "device in the database; not searched)", searched=False),
        Param("UNPACKED_KB", UNPACKED_KB, (256, 512, 1024, 2048, 4096, 8192, 32768),
              "KiB of B up to which a mid-size product runs unpacked, its rows split over "
              "the threads (a path threshold, set per device in the database; not "
              "searched)", searched=False),
        Param("VECTOR_KB", VECTOR_KB, (0, 256, 512, 1024, 2048, 3072, 4096, 8192),
              "KiB of the matrix up to which a product of one row or one column runs on the "
              "calling thread; 0: three quarters of this CPU's L2 (a path threshold, set per "
              "device in the database; not searched)", searched=False),
    ),
    constraints=(
        Constraint("MC is a multiple of MR", lambda q: q["MC"] % q["MR"] == 0),
        Constraint("NC is a multiple of NR", lambda q: q["NC"] % q["NR"] == 0),
        Constraint("MR*NR <= 384 (the tile must fit the vector registers: 24 of AVX-512's "
                   "32 in float32)", lambda q: q["MR"] * q["NR"] <= 384),
    ),
    dtypes=FLOATS + INTS,
    dtype_check=_dtype_check,
    doc=__doc__,
    auto=True,  # kernel="auto" on the CPU (a rung added above it is run only by name)
)
