"""The blocked rung's unpacked tiles (``direct`` and ``few_rows``, from ``_small_tile``).

Products too small to repay packing, narrow ones (a few vectors of columns) at any size,
and products of 2-7 rows at any size, are computed from A and B where they lie, in tiles
of 8, 4, 2 or 1 rows of C by one vector of columns, or of all the rows of a few-row
product by several vectors, the last vector masked to the columns that exist. These
tests hold them to the packed path's sums bit for bit, to NumPy's integers exactly, and
to C's bounds; check that batches of tiny products, split between threads, narrow
products, their rows split between threads, and few-row products, their columns split,
reach them; and read the tiles' machine code.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from conftest import blocked_module, bound
from tilegemm.reference import assert_close, random_operands

DTYPES = ("float32", "float64", "int32", "int64")
# (batch of A, batch of B, M, N, K): rows 1..17 (every tile height and a remainder), columns
# below, at and past one vector (16 float32 lanes on AVX-512, 4 float64 on AVX2), B shared
SHAPES = [(1, 1, 1, 1, 1), (2, 2, 3, 5, 7), (3, 1, 7, 3, 2), (1, 1, 8, 16, 16),
          (2, 2, 9, 17, 33), (1, 1, 15, 40, 11), (4, 4, 17, 1, 9), (2, 1, 5, 33, 70),
          (2, 1, 3, 1100, 20), (1, 1, 7, 130, 12),  # few rows, wider than two vectors
          (1, 1, 20, 100, 30), (2, 2, 9, 50, 7)]  # the wide 8-row tile, then single vectors


SENTINEL = -1234  # exact in every dtype tested


def _c_in_sentinels(shape, dtype):
    """(buffer, C): a C-contiguous C of ``shape`` inside a larger buffer whose 32 elements
    before and after it hold ``SENTINEL`` (check them with :func:`_sentinels_kept`)."""
    size = int(np.prod(shape))
    buffer = np.full(size + 64, SENTINEL, dtype=dtype)
    return buffer, buffer[32:32 + size].reshape(shape)


def _sentinels_kept(buffer):
    return (buffer[:32] == SENTINEL).all() and (buffer[-32:] == SENTINEL).all()


def _gemm_matches(a, given, b, seed, **run):
    """gemm with alpha and beta on ``a`` and ``given`` (B, or B in another layout) against
    float64 NumPy on ``a @ b``, with a tolerance that grows with K."""
    dt = a.dtype
    c = np.random.default_rng(seed).standard_normal(np.matmul(a, b).shape).astype(dt)
    both = tilegemm.gemm(a, given, c, alpha=0.5, beta=-2.0, **run)
    want = 0.5 * np.matmul(a.astype(np.float64), b) - 2 * c
    tol = 1e-4 if dt.itemsize == 4 else 1e-11
    np.testing.assert_allclose(both, want, rtol=tol, atol=tol * np.sqrt(a.shape[-1]))


def _operands(shape, dtype, seed):
    za, zb, m, n, k = shape
    a, b = random_operands((za, m, k), (zb, k, n), dtype, seed=seed)
    return a, b, max(za, zb), m, n


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpacked_tiles_give_the_packed_paths_bits(dtype):
    """The same products through ``direct`` and through the packed loop nest
    (``products_serial``) on the calling thread: equal bit for bit, with K split into
    panels (KC = 5) so that later panels add into C, and alpha != 1; integers also equal
    to NumPy's wrapped sums."""
    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    cb = bound(mod, params, KC=5)
    alpha, zero = dt.type(3), dt.type(0)
    for seed, shape in enumerate(SHAPES):
        a, b, batch, m, n = _operands(shape, dtype, seed)
        unpacked = np.full((batch, m, n), np.nan if dt.kind == "f" else 7, dtype=dt)
        packed = unpacked.copy()
        mod.direct(a, b, unpacked, alpha, zero, cb, 0, batch, 0, m)
        mod.products_serial(a, b, packed, alpha, zero, 0, batch, 0, cb)
        np.testing.assert_array_equal(unpacked, packed, err_msg=f"{dtype} {shape}")
        if dt.kind == "i":
            np.testing.assert_array_equal(unpacked, alpha * np.matmul(a, b))
        else:
            assert_close(unpacked / alpha, a, b, what=f"{dtype} {shape}")


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_unpacked_tiles_write_c_and_nothing_around_it(dtype):
    """C inside a larger buffer whose elements before and after it are sentinels: with
    beta == 0 a NaN-poisoned C is overwritten and not read; with beta != 0 each element is
    ``alpha*A@B + beta*C``; either way the sentinels stay (a masked store that wrote past
    a row's last column would overwrite the next row's first ones, or past C's end)."""
    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    for seed, shape in enumerate(SHAPES):
        a, b, batch, m, n = _operands(shape, dtype, 100 + seed)
        buffer, c = _c_in_sentinels((batch, m, n), dt)
        c[...] = np.nan
        mod.direct(a, b, c, dt.type(1), dt.type(0), bound(mod, params), 0, batch, 0, m)
        assert_close(c, a, b, what=f"beta 0 {dtype} {shape}")
        c0 = np.random.default_rng(seed).standard_normal(c.shape).astype(dt)
        c[...] = c0
        mod.direct(a, b, c, dt.type(0.5), dt.type(-2), bound(mod, params), 0, batch, 0, m)
        want = 0.5 * np.matmul(a.astype(np.float64), b) - 2 * c0
        np.testing.assert_allclose(c, want, rtol=1e-4 if dt.itemsize == 4 else 1e-12,
                                   atol=1e-4 if dt.itemsize == 4 else 1e-12)
        assert _sentinels_kept(buffer)


def test_a_part_of_the_batch_only():
    """``direct`` computes products z0..z1 of the batch and leaves the others alone (the
    batch path's threads each run a share of the batch)."""
    params, mod = blocked_module({}, "float32")
    a, b = random_operands((6, 5, 9), (6, 9, 7), "float32")
    c = np.full((6, 5, 7), np.nan, dtype=np.float32)
    mod.direct(a, b, c, np.float32(1), np.float32(0), bound(mod, params), 2, 5, 0, 5)
    assert np.isnan(c[:2]).all() and np.isnan(c[5:]).all()
    assert_close(c[2:5], a[2:5], b[2:5])


@pytest.mark.parametrize("dtype", ("float32", "float64", "int64"))
@pytest.mark.parametrize("shape", [(30000, 4, 4, 4), (12000, 3, 5, 9), (400, 16, 16, 16),
                                   (120, 24, 24, 24), (500, 64, 1, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_batches_of_tiny_products_match_each_product_alone(dtype, shape):
    """Batches of tiny products with more multiply-adds in all than a product computed on
    the calling thread: the threads split the batch and each runs its products through the
    small-product path, so every product is the one computed alone, bit for bit."""
    from tilegemm.kernels.cpu import k02_blocked

    batch, m, n, k = shape
    assert batch * m * n * k > k02_blocked.DIRECT_PRODUCT
    a, b = random_operands((batch, m, k), (batch, k, n), dtype)
    got = tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
    assert_close(got, a, b)
    assert "batch split" in tilegemm.plan(a, b, kernel="blocked", backend="cpu").path
    for z in (0, batch // 2, batch - 1):
        alone = tilegemm.matmul(a[z], b[z], kernel="blocked", backend="cpu")
        np.testing.assert_array_equal(got[z], alone)


# (triple, CPU, features, vector bits, what a full-width register looks like in the FMAs)
TARGETS = [("x86_64-unknown-linux-gnu", "skylake-avx512", "", 512, "%zmm"),
           ("x86_64-unknown-linux-gnu", "haswell", "", 256, "%ymm"),
           ("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon", 128, ".4s")]


FMA = ("vfmadd231ps", "fmla")
STACK = r"\((?:%rsp|%rbp)\)|\[(?:sp|x29)\b"  # an x86 or AArch64 stack address


def _ops(block: str, names: tuple[str, ...]) -> list[str]:
    return [ln for ln in block.splitlines() if ln.split() and ln.split()[0] in names]


def _tile_loop(triple: str, cpu: str, features: str, bits: int, module_ir: str) -> str:
    """The K loop of a tile compiled alone for the CPU (``module_ir``: the IR of a module
    holding it): the block with the most FMAs, from its label to the branch back to it, as
    assembly text; skips where llvmlite has no back end for the triple."""
    import re

    from llvmlite import binding as llvm

    from tilegemm.kernels.cpu._slp import with_vector_width

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        pytest.skip(f"llvmlite has no back end for {triple}: {exc}")
    module = llvm.parse_assembly(with_vector_width(module_ir, bits))
    module.verify()
    asm = target.create_target_machine(cpu=cpu, features=features, opt=3).emit_assembly(module)
    block = max(re.split(r"\n(?=\.?[\w$.]+:)", asm), key=lambda b: len(_ops(b, FMA)))
    label = block.split(":")[0].strip()
    lines = block.splitlines()
    back = next((n for n, ln in enumerate(lines) if n and ln.split()
                 and ln.split()[-1] == label), len(lines) - 1)
    return "\n".join(lines[:back + 1])


@pytest.mark.parametrize(("triple", "cpu", "features", "bits", "register"), TARGETS,
                         ids=["avx512", "avx2", "neon"])
def test_the_eight_row_tile_keeps_its_sums_in_registers(triple, cpu, features, bits, register):
    """The 8-row float32 tiles compiled alone for an AVX-512, an AVX2 and a NEON CPU, one
    vector wide and as wide as the registers allow (``eight_row_vectors``: 3 vectors on
    AVX-512, 2 on NEON, where 3 spilled): their K loop is 8 multiply-adds per vector on
    full-width vectors (one per row of C) with no stack access, i.e. the sums stay in
    registers."""
    import re

    from tilegemm.kernels.cpu._small_tile import eight_row_vectors, module_ir, width

    assert eight_row_vectors(bits) == {512: 3, 256: 1, 128: 2}[bits]
    for vectors in sorted({1, eight_row_vectors(bits)}):
        loop = _tile_loop(triple, cpu, features, bits,
                          module_ir(8, width(4, bits), np.dtype("float32"), triple, vectors))
        fmas = _ops(loop, FMA)
        assert len(fmas) == 8 * vectors, (vectors, fmas)
        assert all(register in ln for ln in fmas), fmas
        assert not re.search(STACK, loop), loop


# (batch, M, N, K): narrow products above the calling thread's size, whose rows the threads
# split: masked columns (9, 17), rows not a multiple of 8, several K panels, a batch
NARROW = [(1, 2048, 16, 96), (1, 777, 9, 2000), (3, 900, 8, 900), (1, 1500, 2, 1100),
          (1, 203, 17, 1031)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_narrow_products_split_rows_and_give_the_packed_paths_bits(dtype):
    """Products a few columns wide (at most two vectors) run unpacked at any size, their
    rows split between the threads: the same bits as the packed loop nest on the same
    operands, through matmul (plain and transposed operands) and gemm (alpha, beta)."""
    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.kernels.cpu._small_tile import narrow_columns

    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    cb = bound(mod, params)
    width = narrow_columns(dt.itemsize, k02_blocked.vector_bits())
    for seed, (batch, m, n, k) in enumerate(NARROW):
        if n > width:
            continue  # wider than two vectors of this machine's code: packed
        a, b = random_operands((batch, m, k), (batch, k, n), dtype, seed=seed)
        assert batch * m * n * k > k02_blocked.DIRECT_PRODUCT
        assert "narrow product" in tilegemm.plan(a, b, kernel="blocked", **params).path
        got = tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **params)
        packed = np.empty_like(got)
        mod.products_serial(a, b, packed, dt.type(1), dt.type(0), 0, batch, 0, cb)
        np.testing.assert_array_equal(got, packed, err_msg=f"{dtype} {(batch, m, n, k)}")
        assert_close(got, a, b)
        # one A for every product of the batch (broadcast), the same bits as each alone
        if batch > 1:
            shared = tilegemm.matmul(a[0], b, kernel="blocked", backend="cpu", **params)
            for z in range(batch):
                np.testing.assert_array_equal(shared[z], tilegemm.matmul(
                    a[0], b[z], kernel="blocked", backend="cpu", **params))
        # operands given transposed (Fortran-ordered): copied for this path, the same bits
        at, bt = (np.asfortranarray(x[0]) for x in (a, b))
        flipped = tilegemm.matmul(at, bt, kernel="blocked", backend="cpu", **params)
        np.testing.assert_array_equal(flipped, got[0])
        if dt.kind == "f":
            _gemm_matches(a, b, b, seed, kernel="blocked", backend="cpu", **params)


# (batch, M, N, K): products above the calling thread's size, up to UNPACKED_PRODUCT,
# wider than narrow: rows a multiple of 8 and not, the wide tile's remainder columns, many
# K panels, a batch; and beyond UNPACKED_PRODUCT, columns that one pass of the wide tile
# covers (with AVX-512 code: float32 and int32 at 40, more than two vectors left, one
# masked pass), and not
UNPACKED = [(1, 160, 160, 160), (1, 64, 1000, 300), (2, 43, 300, 200), (1, 48, 96, 3000),
            (1, 1500, 40, 1100), (1, 900, 20, 3300), (1, 2000, 56, 600)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mid_size_products_run_unpacked_with_the_packed_paths_bits(dtype):
    """Where the CPU has the wide 8-row tile (AVX-512, NEON), products up to
    ``UNPACKED_PRODUCT`` multiply-adds given plainly, and at any size those whose columns
    one pass of that tile covers, run unpacked, their rows split over the threads (plan
    says so, as ``k02_blocked.unpacked_rows`` decides): the same bits as the packed loop
    nest, and as the same product with A given transposed (packed)."""
    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.kernels.cpu._small_tile import wide_columns
    from tilegemm.kernels.cpu._threads import planned_threads

    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    cb = bound(mod, params)
    threads, bits = planned_threads(), k02_blocked.vector_bits()
    taken = []
    for seed, (batch, m, n, k) in enumerate(UNPACKED):
        a, b = random_operands((batch, m, k), (batch, k, n), dtype, seed=seed)
        assert batch * m * n * k > k02_blocked.DIRECT_PRODUCT
        one_pass = n <= mod.DW8
        assert one_pass == (n <= wide_columns(dt.itemsize, bits))
        unpacked = (k02_blocked.unpacked_rows(m, m * n * k, threads, bits,
                                              k * n * dt.itemsize, params["UNPACKED_KB"],
                                              one_pass)
                    and not mod.splits_batch(batch, m, n, k, threads)
                    and n > mod.NARROW_N)
        assert bool(mod.takes_rows(batch, m, n, k, threads, k02_blocked.DIRECT_PRODUCT, 0,
                                   cb)) == (unpacked or n <= mod.NARROW_N)
        path = tilegemm.plan(a, b, kernel="blocked", **params).path
        assert ("unpacked" in path) == unpacked, path
        taken.append(unpacked)
        got = tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **params)
        packed = np.empty_like(got)
        mod.products_serial(a, b, packed, dt.type(1), dt.type(0), 0, batch, 0, cb)
        np.testing.assert_array_equal(got, packed, err_msg=f"{dtype} {(batch, m, n, k)}")
        flipped = _stored_transposed(a)
        np.testing.assert_array_equal(got, tilegemm.matmul(
            flipped, b, kernel="blocked", backend="cpu", **params))
        if dt.kind == "i":
            np.testing.assert_array_equal(got, np.matmul(a, b))
        else:
            assert_close(got, a, b)
    # the first shape (20 runs of 8 rows) takes it wherever the tile exists, and so does
    # one beyond UNPACKED_PRODUCT covered by one pass of it (40 columns, AVX-512 float32)
    assert taken[0] == (mod.DW8 > mod.SMALL_W and threads <= 10)
    assert taken[4] == (mod.NARROW_N < 40 <= mod.DW8)


def test_mid_size_products_with_b_beyond_unpacked_kb_are_packed():
    """UNPACKED_KB: a mid-size product whose B is within it runs unpacked, its rows split
    over the threads; beyond it, packed (every thread would read all of B per 8 of its
    rows). The compiled decision (``takes_rows``, the limit an argument of the compiled
    code) and plan's agree, and the bits are the same either way."""
    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.kernels.cpu._threads import planned_threads

    m, n, k = 64, 1000, 300  # B: 1.2 MB, 1172 KiB
    a, b = random_operands((m, k), (k, n), "float32")
    threads = planned_threads()
    paths, results = {}, {}
    for kb in (k02_blocked.UNPACKED_KB, 1024):  # B within the first, beyond the second
        params, mod = blocked_module({"UNPACKED_KB": kb}, "float32")
        compiled = bool(mod.takes_rows(1, m, n, k, threads, mod.DIRECT_PRODUCT, 0,
                                       bound(mod, params)))
        paths[kb] = tilegemm.plan(a, b, kernel="blocked", **params).path
        assert ("unpacked" in paths[kb]) == compiled, (kb, paths[kb])
        assert compiled == k02_blocked.unpacked_rows(m, m * n * k, threads,
                                                     k02_blocked.vector_bits(), k * n * 4, kb)
        results[kb] = tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **params)
    if mod.DW8 > mod.SMALL_W:  # the wide 8-row tile: the limit alone changes the path
        assert "unpacked" in paths[k02_blocked.UNPACKED_KB]
        assert "packed panels" in paths[1024], paths[1024]
    np.testing.assert_array_equal(results[1024], results[k02_blocked.UNPACKED_KB])
    assert_close(results[1024], a, b)


# (batch, M, N, K): products of 2-7 rows above the calling thread's size: B within
# FEW_KB's default (one thread) and beyond it (columns split over the threads: 1100 x 1000
# float32 is 4.4 MB), columns a tile's width and not, several K panels, a batch
FEW = [(1, 2, 4099, 300), (1, 3, 1100, 1000), (2, 5, 777, 400), (1, 7, 3001, 90),
       (1, 4, 40, 9000), (1, 6, 1400, 1200)]
# ... and of 8-15 rows, where the CPU has the wide 8-row tile (``FEW_MAX`` 16): every count
# of other rows (0-7), B within and beyond ``FEW_SPLIT_BYTES_8``, partial column tiles
FEW_WIDE = [(1, 8, 1100, 300), (1, 9, 777, 350), (1, 10, 1000, 600), (2, 11, 300, 400),
            (1, 12, 1501, 200), (1, 13, 99, 3000), (1, 14, 2000, 150), (1, 15, 555, 1000)]
# ... and of 16-39 rows (``TILED_ROWS``), B given plainly: several 8-row tiles, with and
# without other rows, B within and beyond their share of the calling thread
# (``few_split_bytes``), a batch
FEW_TILED = [(1, 16, 1100, 300), (1, 17, 300, 400), (1, 21, 600, 600), (2, 27, 520, 520),
             (1, 39, 997, 400)]
# (B beyond this many KiB, a product of 16 rows or more is not the unpacked rows path's,
# whatever UNPACKED_KB this machine's database entry sets)
ROWS_PATH_KB = 256


@pytest.mark.parametrize("dtype", DTYPES)
def test_few_row_products_split_columns_and_give_the_packed_paths_bits(dtype):
    """Products of 2-7 rows (8-39 with the wide 8-row tile) run unpacked at any size: the
    same bits as the packed loop nest on the same operands (for 9 rows or more, with K
    panels of at most REREAD_KC, as the few-row path sums them), through matmul (A
    Fortran-ordered: copied for this path, or packed for 8 rows or more, with the full KC)
    and gemm (alpha, beta), and the same for every product of a batch sharing A. (A small
    product of 9-15 rows with A Fortran-ordered runs on the calling thread as the plain
    product, with its bits.)"""
    from tilegemm.kernels.cpu import k02_blocked

    params, mod = blocked_module({"UNPACKED_KB": ROWS_PATH_KB}, dtype)
    dt = np.dtype(dtype)
    cb = bound(mod, params)
    run = {"kernel": "blocked", "backend": "cpu", **params}
    wide = FEW_WIDE + FEW_TILED if mod.FEW_MAX > 8 else []
    assert (mod.FEW_MAX > 8) == (mod.DW8 > mod.SMALL_W)
    for seed, (batch, m, n, k) in enumerate(FEW + wide):
        a, b = random_operands((batch, m, k), (batch, k, n), dtype, seed=seed)
        assert batch * m * n * k > k02_blocked.DIRECT_PRODUCT
        assert "few rows" in tilegemm.plan(a, b, kernel="blocked", **params).path
        got = tilegemm.matmul(a, b, **run)
        packed = np.empty_like(got)
        # 9 rows or more: the packed path's sums with K panels of at most REREAD_KC
        panels = bound(mod, params, KC=min(cb[1], mod.REREAD_KC)) if m > 8 else cb
        mod.products_serial(a, b, packed, dt.type(1), dt.type(0), 0, batch, 0, panels)
        np.testing.assert_array_equal(got, packed, err_msg=f"{dtype} {(batch, m, n, k)}")
        assert_close(got, a, b)
        if batch > 1:
            shared = tilegemm.matmul(a[0], b, **run)
            for z in range(batch):
                np.testing.assert_array_equal(shared[z], tilegemm.matmul(a[0], b[z], **run))
        at = np.asfortranarray(a[0])
        # A given transposed: 8 rows or more are packed in place, with the full KC, unless the
        # product is small enough for the calling thread, which computes it as the plain
        # product (direct_transposed)
        repacked = m > 8 and m * n * k > mod.DIRECT_PRODUCT
        if repacked:
            mod.products_serial(a, b, packed, dt.type(1), dt.type(0), 0, batch, 0, cb)
        np.testing.assert_array_equal(tilegemm.matmul(at, b[0], **run),
                                      packed[0] if repacked else got[0])
        if dt.kind == "f":
            _gemm_matches(a, b, b, seed, **run)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_products_of_16_rows_or_more_take_the_few_row_path_while_b_is_within_tiled_bytes(
        dtype):
    """With the wide 8-row tile, a product of 16-39 rows reads B in place (few rows) while
    B is at most ``TILED_BYTES``, and is packed beyond it, or from 40 rows on (``TILED_ROWS``);
    8-15 rows take the few-row path whatever B's size. With B given transposed, 16-39 rows
    take dot products while A is at most ``DOT_TILED_A_BYTES``. The compiled decision
    (``takes_few``) and plan's agree. Without the wide tile, 8 (B transposed: 16) rows or
    more are never few rows. Nothing is computed: the products are up to 0.3 GB."""
    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.kernels.cpu._small_tile import TILED_BYTES, TILED_ROWS
    from tilegemm.kernels.cpu._threads import planned_threads

    params, mod = blocked_module({"UNPACKED_KB": ROWS_PATH_KB}, dtype)
    item = np.dtype(dtype).itemsize
    threads = planned_threads()
    wide = mod.DW8 > mod.SMALL_W
    n = 2048
    within = TILED_BYTES // (n * item)  # K of a B of exactly TILED_BYTES
    for m, k, few in [(16, within, wide), (16, within + 1, False), (39, within, wide),
                      (39, within + 1, False), (TILED_ROWS, 1000, False), (24, 1000, wide),
                      (15, within + 1, wide), (8, 4 * within, wide)]:
        compiled = bool(mod.takes_few(1, m, n, k, threads, mod.DIRECT_PRODUCT, 0))
        assert compiled == few, (dtype, m, k)
        path = k02_blocked.path(1, m, n, k, threads, params, itemsize=item)
        assert ("few rows" in path) == few, (dtype, m, k, path)
        if few and m >= 16:
            assert "8-row tiles, then" in path, path
    # B given transposed (x @ w.T): dot products from 16 rows on while A is within
    # DOT_TILED_A_BYTES, to DOT_TILED - 1 rows
    from tilegemm.kernels.cpu._dot_tile import DOT_TILED_A_BYTES, DOT_TILED_ROWS

    for m in (16, 27, DOT_TILED_ROWS - 1, DOT_TILED_ROWS):
        within = DOT_TILED_A_BYTES // (m * item)  # K of an A of at most DOT_TILED_A_BYTES
        for k, dots in ((within, wide and m < DOT_TILED_ROWS), (within + 1, False)):
            compiled = bool(mod.takes_few(1, m, n, k, threads, mod.DIRECT_PRODUCT, 2))
            assert compiled == dots == bool(mod.tiled_dots(m, k)), (dtype, m, k)
            path = k02_blocked.path(1, m, n, k, threads, params, itemsize=item,
                                    b_transposed=True)
            assert ("dot products" in path) == dots, (dtype, m, k, path)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_few_rows_writes_its_columns_and_nothing_else(dtype):
    """``few_rows`` on a range of columns (what one thread gets) writes those columns of
    that product, all rows, and nothing else: not the neighbouring columns (a masked
    vector past the range), not the other product, not past C (the sentinels). With the
    wide 8-row tile, also products of 8 rows and more: one or several 8-row tiles, with
    and without a tile of other rows."""
    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    for m in [*range(2, 8), *([8, 9, 16, 23] if mod.DW8 > mod.SMALL_W else [])]:
        width = int(mod.few_width(m, 0))
        a, b = random_operands((2, m, 70), (2, 70, 3 * width + 5), dtype, seed=m)
        n = b.shape[2]
        buffer, c = _c_in_sentinels((2, m, n), dt)
        c[...] = np.nan
        j0, j1 = width, n - 3  # a whole tile in, a ragged end short of the last columns
        mod.few_rows(a, b, c, dt.type(1), dt.type(0), bound(mod, params, KC=16), 1, j0, j1,
                     0)
        assert_close(c[1][:, j0:j1], a[1], b[1][:, j0:j1], what=f"{dtype} m={m}")
        assert np.isnan(c[0]).all() and np.isnan(c[1][:, :j0]).all()
        assert np.isnan(c[1][:, j1:]).all(), f"{dtype} m={m}: wrote past column {j1}"
        assert _sentinels_kept(buffer)


@pytest.mark.parametrize(("triple", "cpu", "features", "bits", "register"), TARGETS,
                         ids=["avx512", "avx2", "neon"])
def test_the_few_row_tiles_keep_their_sums_in_registers(triple, cpu, features, bits,
                                                        register):
    """Each few-row float32 tile (2-7 rows, ``few_vectors`` wide; with the wide 8-row tile,
    also 8 rows and the tiles of the other 1-7 rows of 8-15-row products,
    ``eight_row_vectors`` wide) compiled alone for an AVX-512, an AVX2 and a NEON CPU: its
    K loop is rows × vectors multiply-adds on full-width vectors with no stack access (the
    sums stay in registers), and one prefetch per cache line of the next tile's columns
    where it prefetches."""
    import re

    from tilegemm.kernels.cpu._small_tile import eight_row_vectors, few_vectors, module_ir, width

    wide = eight_row_vectors(bits)
    for rows in range(1, 9):
        if rows in (1, 8) and wide == 1:
            continue  # no wide tile on AVX2
        vectors = wide if rows in (1, 8) else few_vectors(rows, bits)
        loop = _tile_loop(triple, cpu, features, bits, module_ir(
            rows, width(4, bits), np.dtype("float32"), triple, vectors, prefetch=rows == 8))
        fmas = _ops(loop, FMA)
        assert len(fmas) == rows * vectors, (rows, vectors, fmas)
        assert all(register in ln for ln in fmas), fmas
        assert not re.search(STACK, loop), loop
        if rows == 8:
            assert len(_ops(loop, ("prefetcht0", "prfm"))) == -(-vectors * width(4, bits) * 4 // 64)
        if wide > 1 and 2 <= rows < 8:  # the tiles of the other rows, as wide as the 8-row one
            loop = _tile_loop(triple, cpu, features, bits, module_ir(
                rows, width(4, bits), np.dtype("float32"), triple, wide))
            assert len(_ops(loop, FMA)) == rows * wide and not re.search(STACK, loop), loop
    for rows in range(2, 8):
        vectors = few_vectors(rows, bits)
        loop = _tile_loop(triple, cpu, features, bits, module_ir(
            rows, width(4, bits), np.dtype("float32"), triple, vectors, prefetch=True))
        fmas = _ops(loop, FMA)
        assert len(fmas) == rows * vectors, (rows, vectors, fmas)
        assert all(register in ln for ln in fmas), fmas
        assert not re.search(STACK, loop), loop
        lines = -(-vectors * width(4, bits) * 4 // 64)
        assert len(_ops(loop, ("prefetcht0", "prfm"))) == lines, (rows, loop)


def test_the_wide_tiles_last_pass_masks_only_its_last_vector():
    """The pass over the columns left after the wide 8-row tile's full passes (``rtile8``,
    more than two vectors' worth with AVX-512 code) loads and stores its first vectors
    whole and masks only the last: with every vector masked by a run-time width, a pass
    over 40 float32 columns took 1.4× one over 48. Per K step one masked load of B, not
    three; a third of the masked loads and stores of C."""
    import re

    from tilegemm.kernels.cpu._small_tile import module_ir

    def masked(ir: str, op: str) -> int:
        return len(re.findall(rf'call .*@"?llvm\.masked\.{op}\.', ir))

    for dtype, lanes in (("float32", 16), ("float64", 8)):
        every = module_ir(8, lanes, np.dtype(dtype), "", 3)
        last = module_ir(8, lanes, np.dtype(dtype), "", 3, whole=2)
        assert (masked(every, "load"), masked(every, "store")) == (3 + 24, 48), dtype
        assert (masked(last, "load"), masked(last, "store")) == (1 + 8, 16), dtype


def _stored_transposed(x):
    """``x`` (a batch of matrices) as the transpose of C-ordered storage, product by
    product: what the rung receives, uncopied, as an operand given transposed."""
    return np.ascontiguousarray(x.swapaxes(1, 2)).swapaxes(1, 2)


def _copies(mod, monkeypatch) -> list[tuple[int, ...]]:
    """Shapes of the operands the rung copies to the plain layout (``_stored``) from now on."""
    copied: list[tuple[int, ...]] = []
    original = mod._stored

    def spy(x, transposed, cols):  # noqa: ANN001, ANN202
        if transposed:
            copied.append(x.shape)
        return original(x, transposed, cols)

    monkeypatch.setattr(mod, "_stored", spy)
    return copied


# (A's shape, B's shape, layout): products with a matrix given transposed ("at", "bt") or
# both operands Fortran-ordered ("f"), small (the calling thread) and narrow
IN_PLACE = [((48, 1024), (1024, 256), "bt"), ((8, 512), (512, 256), "at"),
            ((100, 100), (100, 100), "f"), ((3, 20, 30), (3, 30, 40), "f"),
            ((2048, 700), (700, 16), "at"), ((900, 800), (800, 9), "f")]


@pytest.mark.parametrize("dtype", ("float32", "float64", "int64"))
def test_transposed_matrices_are_packed_in_place_not_copied(dtype, monkeypatch):
    """A small or narrow product whose matrix is given as its transpose packs it where it
    lies (the packed path's bits, as the plain operands give) instead of copying it to the
    plain layout first: the strided copy took 10-25× NumPy's time (4×1024×256 float32 with
    B as W.T: 564 µs against 63; X.T @ w, X 2048×2048, w 16 wide: 25 ms against 0.95).
    Only a narrow product's B, a few columns, may still be copied."""
    from tilegemm.kernels.cpu import k02_blocked

    params, mod = blocked_module({}, dtype)
    run = {"kernel": "blocked", "backend": "cpu", **params}
    for seed, (sa, sb, layout) in enumerate(IN_PLACE):
        a, b = random_operands(sa, sb, dtype, seed=seed)
        plain = tilegemm.matmul(a, b, **run)
        ta = np.asfortranarray(a) if layout in ("at", "f") else a
        tb = np.asfortranarray(b) if layout in ("bt", "f") else b
        if a.ndim == 3 and layout == "f":  # the transpose of C-ordered storage per product
            ta, tb = _stored_transposed(a), _stored_transposed(b)
        copied = _copies(mod, monkeypatch)
        got = tilegemm.matmul(ta, tb, **run)
        np.testing.assert_array_equal(got, plain, err_msg=f"{dtype} {sa} @ {sb} {layout}")
        narrow = sb[-1] <= 32
        assert all(shape[-2] <= 32 and narrow for shape in copied), (sa, sb, layout, copied)
        if narrow and a.shape[-2] * a.shape[-1] * sb[-1] > k02_blocked.DIRECT_PRODUCT:
            assert "packed" in tilegemm.plan(ta, tb, kernel="blocked", **params).path


@pytest.mark.parametrize("dtype", ("float32", "float64", "int64"))
def test_narrow_products_with_a_transposed_run_as_their_transpose(dtype, monkeypatch):
    """``X.T @ w``, w of 2 to TRANSPOSE_COLUMNS columns (a weight's gradient), runs as its
    transpose ``w.T @ X``, a product of a few rows that reads X's storage in place: no
    matrix copied (w.T, 2-7 rows, may be), the plain operands' bits (with the registry's
    FEW_KC, not below KC), NumPy's integers, plan() naming it exactly when it runs, in
    batches, and gemm's beta reading C. One column more, or as few rows as columns, or B
    given transposed too: not swapped (the packed path)."""
    from tilegemm.kernels.cpu import k02_blocked

    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    run = {"kernel": "blocked", "backend": "cpu", **params}
    wide = mod.TRANSPOSE_COLUMNS
    assert wide == k02_blocked.TRANSPOSE_COLUMNS  # the generated module's, and path()'s
    swapped: list[tuple[int, ...]] = []
    original = mod._transposed_product

    def spy(A, B, C, *rest):  # noqa: ANN001, ANN202
        swapped.append(C.shape)
        return original(A, B, C, *rest)

    monkeypatch.setattr(mod, "_transposed_product", spy)
    # (batch of A, batch of B, M, N, K)
    for seed, (za, zb, m, n, k) in enumerate([
            (1, 1, 700, wide, 300), (1, 1, 1500, 5, 700), (1, 1, 900, 9, 500),
            (3, 3, 400, 12, 300), (1, 2, 1200, 2, 900), (2, 1, 900, 7, 400),
            (1, 1, 1000, 20, 600), (1, 1, 700, wide + 1, 300), (1, 1, wide, wide, 4000)]):
        a, b = random_operands((za, m, k), (zb, k, n), dtype, seed=seed)
        at = _stored_transposed(a)  # X.T, X C-ordered
        expect = 2 <= n <= wide < m
        del swapped[:]
        copied = _copies(mod, monkeypatch)
        got = tilegemm.matmul(at, b, **run)
        what = f"{dtype} {(za, zb, m, n, k)}"
        assert swapped == ([(max(za, zb), m, n)] if expect else []), what
        assert all(shape[-1] < 8 for shape in copied), (what, copied)  # w.T, a few rows
        planned = tilegemm.plan(at, b, kernel="blocked", **params).path
        assert planned.startswith("as its transpose") == expect, (what, planned)
        np.testing.assert_array_equal(got, tilegemm.matmul(a, b, **run), err_msg=what)
        if dt.kind == "i":
            np.testing.assert_array_equal(got, np.matmul(a, b), err_msg=what)
        else:
            assert_close(got, a, b, what=what)
        both = tilegemm.matmul(at, _stored_transposed(b), **run)
        assert len(swapped) == expect, what  # not for B transposed too
        if dt.kind == "i":
            np.testing.assert_array_equal(both, got, err_msg=what)
        else:
            assert_close(both, a, b, what=what)
        if dt.kind == "f":
            _gemm_matches(at, b, b, seed, **run)  # beta: C's transpose read first
            assert len(swapped) == 2 * expect, what


@pytest.mark.parametrize("dtype", DTYPES)
def test_few_row_products_with_b_transposed_take_dot_products(dtype, monkeypatch):
    """``x @ W.T`` with 2-15 rows of x (a linear layer's weights, W stored (N, K); 16-39
    with the wide 8-row tile): dot products of x's rows and W's rows along K, W read in
    place (no copy), at any size (small, one thread, columns split), in batches, with A
    transposed too (copied, a few rows: the same bits; 8 rows or more: packed); integers
    exactly NumPy's, floats within
    rounding; the calling-thread path of a forked worker gives the same bits as the
    threads; gemm's alpha and beta."""
    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    run = {"kernel": "blocked", "backend": "cpu", **params}
    # 8-15 rows (DOT_MAX, every ISA): at every size, a small product included; with the
    # wide 8-row tile 16-39 rows too, A within DOT_TILED_A_BYTES (tiled_dots)
    wide = [*FEW_WIDE, (1, 12, 100, 64)]
    assert mod.DOT_MAX == 16
    if mod.DOT_TILED > mod.DOT_MAX:
        wide += FEW_TILED
        assert all(mod.tiled_dots(m, k) for _, m, _, k in FEW_TILED)
    for seed, (batch, m, n, k) in enumerate([*FEW, (1, 3, 100, 64), (1, 7, 37, 300), *wide]):
        a, b = random_operands((batch, m, k), (batch, k, n), dtype, seed=seed)
        w = np.ascontiguousarray(b.swapaxes(1, 2))  # (batch, N, K), as a layer stores it
        bt = w.swapaxes(1, 2)
        copied = _copies(mod, monkeypatch)
        got = tilegemm.matmul(a, bt, **run)
        assert all(shape[-1] < 8 for shape in copied), copied  # A alone, a few rows
        if dt.kind == "i":
            np.testing.assert_array_equal(got, np.matmul(a, b))
        else:
            assert_close(got, a, b, what=f"{dtype} {(batch, m, n, k)}")
        if m * n * k * batch > mod.DIRECT_PRODUCT:
            assert "dot products" in tilegemm.plan(a, bt, kernel="blocked", **params).path
        at = _stored_transposed(a)
        if m < 8 or dt.kind == "i":
            np.testing.assert_array_equal(tilegemm.matmul(at, bt, **run), got)
        else:  # 8 rows or more with A given transposed too: packed, in place
            assert_close(tilegemm.matmul(at, bt, **run), a, b)
        monkeypatch.setattr(mod, "parallel_unsafe", lambda: True)
        np.testing.assert_array_equal(tilegemm.matmul(a, bt, **run), got)
        monkeypatch.undo()
        if dt.kind == "f":
            _gemm_matches(a, bt, b, seed, **run)


@pytest.mark.parametrize("dtype", ("float32", "int64"))
def test_dot_products_write_their_columns_and_nothing_else(dtype):
    """``few_rows`` with B given transposed, on a range of columns: those columns of that
    product, all rows, and nothing else (the tiles' last columns masked: W's rows past the
    range are not stored); K of every remainder against the vector width."""
    from tilegemm.kernels.cpu._dot_tile import DOT_GROUP

    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    for m in range(2, 16):
        for k in (1, 7, 16, 37):
            n = 3 * DOT_GROUP + 5
            a, b = random_operands((2, m, k), (2, k, n), dtype, seed=m * k)
            w = np.ascontiguousarray(b.swapaxes(1, 2))
            buffer, c = _c_in_sentinels((2, m, n), dt)
            c[...] = -99
            j0, j1 = DOT_GROUP, n - 3
            mod.few_rows(a, w, c, dt.type(1), dt.type(0), bound(mod, params, KC=16), 1, j0,
                         j1, 2)
            want = np.matmul(a[1].astype(np.float64), b[1])[:, j0:j1]
            np.testing.assert_allclose(c[1][:, j0:j1], want, rtol=1e-5, atol=1e-4 * k)
            assert (c[0] == -99).all() and (c[1][:, :j0] == -99).all()
            assert (c[1][:, j1:] == -99).all(), f"{dtype} m={m} k={k}: past column {j1}"
            assert _sentinels_kept(buffer)


@pytest.mark.parametrize(("triple", "cpu", "features", "bits", "register"), TARGETS,
                         ids=["avx512", "avx2", "neon"])
def test_the_dot_product_tiles_keep_their_sums_in_registers(triple, cpu, features, bits,
                                                            register):
    """Each dot-product tile (4, 2, 1 rows × ``dot_columns``) compiled alone for an
    AVX-512, an AVX2 and a NEON CPU: its K loop is rows × columns full-width multiply-adds
    with no stack access."""
    import re

    from tilegemm.kernels.cpu._dot_tile import dot_columns, module_ir
    from tilegemm.kernels.cpu._small_tile import width

    for rows in (4, 2, 1):
        cols = dot_columns(rows, bits)
        loop = _tile_loop(triple, cpu, features, bits, module_ir(
            rows, cols, width(4, bits), np.dtype("float32"), triple))
        fmas = _ops(loop, FMA)
        assert len(fmas) == rows * cols, (rows, cols, fmas)
        assert all(register in ln for ln in fmas), fmas
        assert not re.search(STACK, loop), loop


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_few_row_panels_follow_few_kc(dtype):
    """FEW_KC: a product of 2-7 rows sums K in panels of at most that many steps, the
    packed path's sums with KC that short, bit for bit (and not those with the full KC);
    threaded (columns split) and on the calling thread alike."""
    params, mod = blocked_module({"FEW_KC": 64}, dtype)
    assert params["FEW_KC"] == 64 and params["KC"] > 64
    dt = np.dtype(dtype)
    one, zero = dt.type(1), dt.type(0)
    for seed, (batch, m, n, k) in enumerate([(1, 3, 1100, 1000), (1, 5, 300, 300),
                                             (2, 2, 777, 400)]):
        a, b = random_operands((batch, m, k), (batch, k, n), dtype, seed=seed)
        got = tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **params)
        short, full = np.empty_like(got), np.empty_like(got)
        mod.products_serial(a, b, short, one, zero, 0, batch, 0, bound(mod, params, KC=64))
        mod.products_serial(a, b, full, one, zero, 0, batch, 0, bound(mod, params))
        np.testing.assert_array_equal(got, short, err_msg=f"{(batch, m, n, k)}")
        assert not np.array_equal(got, full)  # the panels did change
        assert_close(got, a, b)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_few_row_panels_are_short_where_b_rows_alias(dtype):
    """B's rows a multiple of ALIASED_STRIDE bytes apart (here a slice of the columns of a
    wider matrix): a product of 2-7 rows sums K in panels of ALIASED_KC steps, whatever
    FEW_KC allows, bit for bit the packed path's sums with KC that short; the same columns
    held densely keep the full panels (the control)."""
    from tilegemm.kernels.cpu import _small_tile

    params, mod = blocked_module({}, dtype)
    dt = np.dtype(dtype)
    one, zero = dt.type(1), dt.type(0)
    assert min(params["KC"], params["FEW_KC"]) > _small_tile.ALIASED_KC
    wide = _small_tile.ALIASED_STRIDE // dt.itemsize  # elements in one aliased row
    m, n, k = 5, 1100, 500  # above the small-product path
    a, b_all = random_operands((1, m, k), (1, k, wide), dtype)
    b = b_all[:, :, :n]  # rows ALIASED_STRIDE bytes apart
    short, full = (np.empty((1, m, n), dt) for _ in range(2))
    mod.products_serial(a, np.ascontiguousarray(b), short, one, zero, 0, 1, 0,
                        bound(mod, params, KC=_small_tile.ALIASED_KC))
    mod.products_serial(a, np.ascontiguousarray(b), full, one, zero, 0, 1, 0,
                        bound(mod, params))
    assert not np.array_equal(short, full)
    run = {"kernel": "blocked", "backend": "cpu", **params}
    assert "few rows" in tilegemm.plan(a, b, **run).path
    got = tilegemm.matmul(a, b, **run)
    np.testing.assert_array_equal(got, short)
    assert_close(got, a, b)
    dense = tilegemm.matmul(a, np.ascontiguousarray(b), **run)
    np.testing.assert_array_equal(dense, full)

