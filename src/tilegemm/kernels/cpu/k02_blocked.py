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
  loads one NR-vector of B, broadcasts MR values of A and issues MR×NR/width FMAs. The tile is
  generated as MR·NR named scalars and LLVM's SLP vectoriser packs them into vector registers
  (16×8: ``vfmadd231ps ymm, ymm, [mem]{1to8}`` for float32, zmm for float64): Numba allocates
  arrays on the heap, and LLVM will not keep heap memory in registers, so a local
  ``np.zeros((MR, NR))`` accumulator runs from L1 at 1/20 of the speed;
- **threads**: ``prange`` over balanced row-block tasks of each packed panel (plus column
  groups when there are few rows), or over the batch when each product is small.

Expected: compute-bound — one thread reaches about 93% of single-threaded OpenBLAS on
float32 and float64 at 1024³–2048³; two threads scale when both cores are free (see
docs/cpu.md for the measurements and the loop nest).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.registry import FLOATS, INTS, Constraint, KernelSpec, Param

# Below this many multiply-adds per product (and with a batch of at least two), the threads
# split the batch instead of one product: a parallel region per K panel costs more than it buys.
SMALL_PRODUCT = 96 * 96 * 96


def micro_kernel_source(mr: int, nr: int) -> str:
    """Python source of the MR×NR micro-kernel, fully unrolled into named scalars.

    ``ukernel(kc, Ap, r, Bp, s, T)`` computes the tile ``T = Ap[r, :kc].T @ Bp[s, :kc]`` from
    A strip r and B strip s of the packed panels (Ap[r] is (KC, MR), Bp[s] is (KC, NR); T is
    (MR, NR)). Strips are indexed here rather than passed as views: a view is a new array
    object whose reference counting, per tile, costs atomics on a panel both threads share.
    The K loop runs over an unsigned index so Numba emits no negative-index wraparound (which
    would turn the B loads into gathers).
    The alpha/beta update of C stays out of here, in an ordinary loop: unrolling it too
    would triple the generated source, and Numba's compile time grows with it.
    """
    lines = ["def ukernel(kc, Ap, r, Bp, s, T):"]
    for i in range(mr):
        lines.append("    " + " = ".join(f"c{i}_{j}" for j in range(nr)) + " = zero")
    lines.append("    for p in range(uint64(kc)):")
    lines.extend(f"        b{j} = Bp[s, p, {j}]" for j in range(nr))
    for i in range(mr):
        lines.append(f"        a = Ap[r, p, {i}]")
        lines.extend(f"        c{i}_{j} += a * b{j}" for j in range(nr))
    lines.extend(f"    T[{i}, {j}] = c{i}_{j}" for i in range(mr) for j in range(nr))
    return "\n".join(lines) + "\n"


def jit_flags(dtype: np.dtype) -> dict[str, Any]:
    """No bounds checks, NumPy error model; for floats, FMA contraction and nothing else
    (no reassociation, so NaN/Inf and rounding behave like the plain loop)."""
    flags: dict[str, Any] = {"error_model": "numpy", "boundscheck": False, "cache": False}
    if dtype.kind == "f":
        flags["fastmath"] = {"contract"}
    return flags


def micro_kernel(mr: int, nr: int, dtype: np.dtype) -> Any:
    """The compiled MR×NR micro-kernel ``ukernel(kc, Ap, r, Bp, s, T)`` for ``dtype``.

    Compiled eagerly with the SLP vectoriser switched on for it alone (see ``_slp``); the
    tests read its assembly to check that the tile really lives in vector registers.
    """
    import numba
    from numba import njit

    from tilegemm.kernels.cpu._slp import slp_enabled

    dtype = np.dtype(dtype)
    nbt = numba.from_dtype(dtype)
    ns: dict[str, Any] = {"zero": dtype.type(0), "uint64": numba.uint64}
    exec(micro_kernel_source(mr, nr), ns)  # noqa: S102 - our own generated source
    i8, a2, a3 = numba.int64, nbt[:, ::1], nbt[:, :, ::1]
    with slp_enabled():
        return njit(numba.void(i8, a3, i8, a3, i8, a2), **jit_flags(dtype))(ns["ukernel"])


def build(p: Mapping[str, int], dtype: np.dtype) -> Any:
    import numba
    from numba import njit, prange

    mr, nr, mc, kc_max, nc_max = p["MR"], p["NR"], p["MC"], p["KC"], p["NC"]
    nbt = numba.from_dtype(dtype)
    zero = dtype.type(0)
    flags = jit_flags(dtype)
    # Explicit signatures: every function compiles once, eagerly, here (no specialisation per
    # literal argument or per read-only flag); A and B are read-only so any input is accepted.
    i8, flag = numba.int64, numba.boolean
    ro2, ro3 = (numba.types.Array(nbt, nd, "C", readonly=True) for nd in (2, 3))
    a2, a3, a4 = nbt[:, ::1], nbt[:, :, ::1], nbt[:, :, :, ::1]
    ukernel = micro_kernel(mr, nr, dtype)
    nr_u = np.uint64(nr)

    @njit(numba.void(ro2, i8, i8, i8, i8, a3, i8, i8), **flags)
    def pack_b(B, pc, kc, jc, nc, Bp, s0, s1):
        """Bp[s, p, j] = B[pc + p, jc + s*NR + j], zero beyond column nc."""
        for s in range(s0, s1):
            j0 = s * nr
            width = min(nr, nc - j0)
            for q in range(kc):
                row = B[pc + q]
                for j in range(width):
                    Bp[s, q, j] = row[jc + j0 + j]
                for j in range(width, nr):
                    Bp[s, q, j] = zero

    @njit(numba.void(ro2, i8, i8, i8, i8, a3), **flags)
    def pack_a(A, ic, mc, pc, kc, Ap):
        """Ap[r, p, i] = A[ic + r*MR + i, pc + p], zero beyond row mc."""
        for r in range((mc + mr - 1) // mr):
            i0 = r * mr
            height = min(mr, mc - i0)
            for i in range(height):
                row = A[ic + i0 + i]
                for q in range(kc):
                    Ap[r, q, i] = row[pc + q]
            for i in range(height, mr):
                for q in range(kc):
                    Ap[r, q, i] = zero

    @njit(numba.void(a3, a3, a2, i8, i8, i8, i8, i8, i8, i8, nbt, nbt, flag, a2), **flags)
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
                ukernel(kc, Ap, r, Bp, s, T)
                if h == mr and w == nr:
                    # Whole tile: unsigned column indices (no wraparound selects) and a
                    # constant trip count, so each row updates with a few vector ops.
                    ju = np.uint64(j)
                    for ii in range(mr):
                        crow, trow = C[i + ii], T[ii]
                        if not first:
                            for jj in range(nr_u):
                                crow[ju + jj] += alpha * trow[jj]
                        elif beta == zero:
                            for jj in range(nr_u):
                                crow[ju + jj] = alpha * trow[jj]
                        else:
                            for jj in range(nr_u):
                                crow[ju + jj] = alpha * trow[jj] + beta * crow[ju + jj]
                else:
                    for ii in range(h):
                        for jj in range(w):
                            v = alpha * T[ii, jj]
                            if not first:
                                C[i + ii, j + jj] += v
                            elif beta == zero:
                                C[i + ii, j + jj] = v
                            else:
                                C[i + ii, j + jj] = v + beta * C[i + ii, j + jj]

    @njit(numba.void(ro2, ro2, a2, nbt, nbt, a3, a3, a2), **flags)
    def gemm_serial(A, B, C, alpha, beta, Ap, Bp, T):
        """One product on the calling thread (the batch-parallel path)."""
        m, n, k = C.shape[0], C.shape[1], A.shape[1]
        for jc in range(0, n, nc_max):
            nc = min(nc_max, n - jc)
            for pc in range(0, k, kc_max):
                kc = min(kc_max, k - pc)
                pack_b(B, pc, kc, jc, nc, Bp, 0, (nc + nr - 1) // nr)
                for ic in range(0, m, mc):
                    mcc = min(mc, m - ic)
                    pack_a(A, ic, mcc, pc, kc, Ap)
                    macro(Ap, Bp, C, ic, mcc, jc, nc, kc, 0, (nc + nr - 1) // nr,
                          alpha, beta, pc == 0, T)

    @njit(numba.void(i8, i8, ro3, ro3, a3, i8, nbt, nbt, i8, i8, i8, i8, i8, i8, a3, a4, a3),
          parallel=True, **flags)
    def run_parallel(phase, ntasks, A, B, C, z, alpha, beta, jc, nc, pc, kc, nblk, ngroups, Bp,
                     Ap_all, T_all):
        """The one parallel region, so Numba compiles one parfor, not one per phase.

        phase 0: task t packs the t-th of ``ntasks`` slices of the B panel of product z;
        phase 1: task t = (row block of ``nblk``, strip group of ``ngroups``) packs its A
        block and computes its tiles (blocks differ by at most one MR strip, so threads stay
        balanced); phase 2: task t is the whole product t of the batch (small products).
        """
        nstrips = (nc + nr - 1) // nr
        msr = (C.shape[1] + mr - 1) // mr
        za = z if A.shape[0] > 1 else 0
        zb = z if B.shape[0] > 1 else 0
        for tu in prange(ntasks):
            t = np.int64(tu)  # prange indices are unsigned; keep index arithmetic signed
            if phase == 0:
                pack_b(B[zb], pc, kc, jc, nc, Bp, t * nstrips // ntasks,
                       (t + 1) * nstrips // ntasks)
            elif phase == 1:
                blk, g = t // ngroups, t % ngroups
                ic = blk * msr // nblk * mr
                mcc = min((blk + 1) * msr // nblk * mr, C.shape[1]) - ic
                pack_a(A[za], ic, mcc, pc, kc, Ap_all[t])
                macro(Ap_all[t], Bp, C[z], ic, mcc, jc, nc, kc, g * nstrips // ngroups,
                      (g + 1) * nstrips // ngroups, alpha, beta, pc == 0, T_all[t])
            else:
                # scratch sized to the product, not the blocks: tiny products stay cheap
                kcap = min(kc_max, A.shape[2])
                Ap = np.empty((min(mc // mr, (C.shape[1] + mr - 1) // mr), kcap, mr),
                              dtype=C.dtype)
                Bpz = np.empty(((min(nc_max, C.shape[2]) + nr - 1) // nr, kcap, nr),
                               dtype=C.dtype)
                T = np.empty((mr, nr), dtype=C.dtype)
                gemm_serial(A[t if A.shape[0] > 1 else 0], B[t if B.shape[0] > 1 else 0],
                            C[t], alpha, beta, Ap, Bpz, T)

    @njit(numba.void(ro3, ro3, a3, nbt, nbt), **flags)
    def blocked(A, B, C, alpha, beta):
        batch, m, n = C.shape[0], C.shape[1], C.shape[2]
        k = A.shape[2]
        if k == 0:  # no products: C = beta*C, or zeros (C unread when beta == 0)
            for z in range(batch):
                for i in range(m):
                    for j in range(n):
                        base = alpha * zero
                        C[z, i, j] = base if beta == zero else base + beta * C[z, i, j]
            return
        nthreads = numba.get_num_threads()
        strip_cap = (min(nc_max, n) + nr - 1) // nr
        empty = np.empty((1, 1, 1, mr), dtype=C.dtype)
        if batch > 1 and m * n * k <= SMALL_PRODUCT:
            run_parallel(2, batch, A, B, C, 0, alpha, beta, 0, 0, 0, 0, 0, 1, empty[0],
                         empty, empty[0])
            return
        # One product at a time, threads over (row block × strip group) tasks: row blocks of
        # at most MC rows, as many as a multiple of the thread count when there are enough
        # MR strips; when there are few, column groups of the B panel supply the tasks.
        msr = (m + mr - 1) // mr
        nblk = (msr + mc // mr - 1) // (mc // mr)
        nblk = min(msr, (nblk + nthreads - 1) // nthreads * nthreads)
        kcap = min(kc_max, k)
        Bp = np.empty((strip_cap, kcap, nr), dtype=C.dtype)
        ngroups_max = 1 if nblk >= nthreads else min(strip_cap, 2 * nthreads)
        Ap_all = np.empty((nblk * ngroups_max, (msr + nblk - 1) // nblk, kcap, mr),
                          dtype=C.dtype)
        T_all = np.empty((nblk * ngroups_max, mr, nr), dtype=C.dtype)
        for z in range(batch):
            for jc in range(0, n, nc_max):
                nc = min(nc_max, n - jc)
                nstrips = (nc + nr - 1) // nr
                ngroups = min(ngroups_max, nstrips)
                for pc in range(0, k, kc_max):
                    kc = min(kc_max, k - pc)
                    run_parallel(0, min(nthreads, nstrips), A, B, C, z, alpha, beta, jc, nc,
                                 pc, kc, nblk, ngroups, Bp, Ap_all, T_all)
                    run_parallel(1, nblk * ngroups, A, B, C, z, alpha, beta, jc, nc, pc, kc,
                                 nblk, ngroups, Bp, Ap_all, T_all)

    return blocked


SPEC = KernelSpec(
    name="blocked",
    backend="cpu",
    rung=2,
    title="packed panels, MR×NR register tile, cache blocks, threads",
    build=build,
    params=(
        Param("MR", 16, (4, 6, 8, 12, 16), "rows of the register tile (broadcasts of A)"),
        Param("NR", 8, (8, 16, 32), "columns of the register tile (vector lanes of B)"),
        Param("MC", 96, (48, 96, 144, 192, 288, 384), "rows of the packed A block (L2)"),
        Param("KC", 512, (64, 128, 256, 384, 512, 768, 1024),
              "inner-dimension depth of a panel (L1/L2)"),
        Param("NC", 2048, (256, 512, 1024, 2048, 4096), "columns of the packed B panel (L3)"),
    ),
    constraints=(
        Constraint("MC is a multiple of MR", lambda q: q["MC"] % q["MR"] == 0),
        Constraint("NC is a multiple of NR", lambda q: q["NC"] % q["NR"] == 0),
        Constraint("MR*NR <= 256 (the tile must fit the vector registers)",
                   lambda q: q["MR"] * q["NR"] <= 256),
    ),
    dtypes=FLOATS + INTS,
    doc=__doc__,
)
