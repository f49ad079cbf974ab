"""Products with one row or one column on the CPU rung: vector-matrix and matrix-vector.

They take an unpacked path (``gemv_threads`` in the rung's module: the matrix streamed
once, split over the threads) instead of packing the whole matrix for one pass. Checked
against float64 NumPy (integers exactly), with NaN-poisoned outputs (conftest sets
TILEGEMM_POISON=1), and that this path is the one that runs.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tilegemm
from tilegemm import registry
from tilegemm.kernels.cpu import k02_blocked
from tilegemm.reference import assert_close, random_operands

DTYPES = ("float32", "float64", "int32", "int64")
# above DIRECT_PRODUCT multiply-adds, so not the small unpacked path
K_BIG = 2 * k02_blocked.DIRECT_PRODUCT // 64 + 13


def program(dtype: str, **params: int):
    """The bound rung kernel='blocked' runs for ``dtype`` on this machine (with ``params``)."""
    a = np.ones((4, 4), dtype)
    chosen = tilegemm.plan(a, a, kernel="blocked", backend="cpu", **params).params
    return registry.get("blocked", "cpu").program(chosen, np.dtype(dtype))


def module(dtype: str):
    """The compiled rung module kernel='blocked' runs for ``dtype`` on this machine."""
    return sys.modules[program(dtype).__module__]


def matmul(a, b, **kw):
    return tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **kw)


SHAPES = [
    ((1, K_BIG), (K_BIG, 64)),        # row vector @ matrix
    ((64, K_BIG), (K_BIG, 1)),        # matrix @ column vector
    ((1, K_BIG), (K_BIG, 1)),         # one dot product
    ((K_BIG,), (K_BIG, 61)),          # 1-D @ 2-D
    ((67, K_BIG), (K_BIG,)),          # 2-D @ 1-D
    ((3, 1, 1009), (3, 1009, 211)),   # a batch of vector-matrix products
    ((2, 97, 1013), (1013, 1)),       # a batch, the vector shared
    ((1, 3), (3, 100_003)),           # short K, long row
    ((100_003, 3), (3, 1)),           # short K, long column
    ((1, 1), (1, 300_000)),           # K = 1
    ((1, 300), (300, 70)),            # small: the vector path on the calling thread
    ((70, 300), (300, 1)),
    ((3, 1, 200), (3, 200, 50)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("sa", "sb"), SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_vector_products_match_numpy(dtype, sa, sb):
    a, b = random_operands(sa, sb, dtype)
    got = matmul(a, b)
    assert got.shape == np.matmul(a, b).shape
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(got, np.matmul(a, b))
    else:
        assert_close(got, a, b, what=f"{dtype} {sa} @ {sb}")


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize(("m", "n"), [(1, 300), (300, 1)])
def test_alpha_beta_and_c(dtype, m, n, rng):
    k = K_BIG
    a, b = random_operands((m, k), (k, n), dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    got = tilegemm.gemm(a, b, c=c.copy(), alpha=1.5, beta=-0.5, kernel="blocked",
                        backend="cpu")
    assert_close(got, a, b, alpha=1.5, beta=-0.5, c=c)
    got0 = tilegemm.gemm(a, b, c=np.full((m, n), np.nan, dtype), alpha=2.0, beta=0.0,
                         kernel="blocked", backend="cpu")  # C not read when beta == 0
    assert_close(got0, a, b, alpha=2.0)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_nan_and_inf_propagate(dtype):
    a, b = random_operands((1, K_BIG), (K_BIG, 40), dtype)
    b[7, 3] = np.nan
    got = matmul(a, b)
    assert np.isnan(got[0, 3]) and np.isfinite(np.delete(got, 3, axis=1)).all()
    a2, x = random_operands((40, K_BIG), (K_BIG, 1), dtype)
    a2[11, 9] = np.inf
    got2 = matmul(a2, x)
    assert np.isinf(got2[11, 0]) and np.isfinite(np.delete(got2, 11, axis=0)).all()


@pytest.mark.parametrize("dtype", ("float32", "int64"))
@pytest.mark.parametrize(("sa", "sb", "takes"), [
    ((1, K_BIG), (K_BIG, 64), True),
    ((64, K_BIG), (K_BIG, 1), True),
    ((2, K_BIG), (K_BIG, 64), False),       # two rows: the packed path
    ((1, 8), (8, 8), False),                # tiny: the small unpacked path
    ((64, 1, 64), (64, 64, 64), False),     # a batch of small products: one per thread
])
def test_the_vector_path_is_what_runs(dtype, sa, sb, takes, monkeypatch):
    mod = module(dtype)
    calls = []
    original = mod.gemv_threads
    monkeypatch.setattr(mod, "gemv_threads", lambda *a: (calls.append(1), original(*a)))
    a, b = random_operands(sa, sb, dtype)
    got = matmul(a, b)
    assert bool(calls) is takes
    if dtype == "int64":
        np.testing.assert_array_equal(got, np.matmul(a, b))


@pytest.mark.parametrize("dtype", ("float64", "int32"))
def test_forked_child_path_computes_the_same(dtype, monkeypatch):
    """In a process where a parallel region would be killed (a child forked under GNU
    OpenMP) the vector path runs on the calling thread: the same results."""
    mod = module(dtype)
    monkeypatch.setattr(mod, "parallel_unsafe", lambda: True)
    monkeypatch.setattr(mod, "gemv_threads", None)  # would fail if called
    for sa, sb in (((1, K_BIG), (K_BIG, 33)), ((2, 31, K_BIG), (K_BIG, 1))):
        a, b = random_operands(sa, sb, dtype)
        got = matmul(a, b)
        if dtype == "int32":
            np.testing.assert_array_equal(got, np.matmul(a, b))
        else:
            assert_close(got, a, b)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_matrix_vector_rows_are_the_rows_of_a_few_rows_times_the_matrix(dtype):
    """``W @ x``, ``x @ W.T`` (one row) and row 0 of ``X @ W.T`` (a few rows, X[0] = x) take
    the same dot-product tile along K: the same bits, whatever the K tail (1001 is no
    multiple of a vector) and the number of rows of W (not a multiple of the tile's)."""
    rng = np.random.default_rng(11)
    n, k = 77, 1001
    w = rng.standard_normal((n, k)).astype(dtype)
    xs = rng.standard_normal((3, k)).astype(dtype)
    one = matmul(xs[:1], w.T)
    np.testing.assert_array_equal(one[0], matmul(xs[:3], w.T)[0])
    np.testing.assert_array_equal(one[0], matmul(w, xs[0]))
    assert_close(one, xs[:1], w.T)


@pytest.mark.parametrize("dtype", ("float32", "int64"))
def test_matrix_vector_chunks_give_the_same_bits(dtype):
    """The threads split A @ x into ranges of rows (``gemv_part``'s chunks), at rows that
    are no multiple of the tile's, and take their rows in either order (``backward``):
    each row comes out the same as on one thread, front to back."""
    mod = module(dtype)
    a, x = random_operands((203, 517), (517, 1), dtype)
    one, zero = np.dtype(dtype).type(1), np.dtype(dtype).type(0)
    whole = np.full((203, 1), -7, dtype)
    mod.gemv_part(a, x, whole, one, zero, 0, 1, 512, False)
    for chunks in (1, 2, 3, 7):
        for backward in (False, True):
            parts = np.full((203, 1), -7, dtype)
            for c in range(chunks):
                mod.gemv_part(a, x, parts, one, zero, c, chunks, 512, backward)
            np.testing.assert_array_equal(parts, whole, err_msg=f"{chunks} {backward}")
    if dtype == "int64":
        np.testing.assert_array_equal(whole, a @ x)
    else:
        assert_close(whole, a, x)


@pytest.mark.parametrize("dtype", ("float32", "int64"))
def test_vector_matrix_panels_in_either_order_give_the_same_bits(dtype):
    """``x @ B`` in chunks of columns, its K panels (9 of them: K = 517 in panels of 64)
    taken first to last or last to first (``backward``): each column's panels are summed
    from their first row and added into y in K order either way, beta·C included, so every
    element has the same bits."""
    mod = module(dtype)
    x, b = random_operands((1, 517), (517, 203), dtype)
    c0 = random_operands((1, 203), (1, 1), dtype)[0]
    dt = np.dtype(dtype)
    alpha, beta = dt.type(3), dt.type(2)
    whole = c0.copy()
    mod.gemv_part(x, b, whole, alpha, beta, 0, 1, 64, False)
    for chunks in (1, 2, 3):
        for backward in (False, True):
            parts = c0.copy()
            for c in range(chunks):
                mod.gemv_part(x, b, parts, alpha, beta, c, chunks, 64, backward)
            np.testing.assert_array_equal(parts, whole, err_msg=f"{chunks} {backward}")
    want = 3 * (x.astype(np.float64) @ b) + 2 * c0
    if dtype == "int64":
        np.testing.assert_array_equal(whole, want.astype(np.int64))
    else:
        np.testing.assert_allclose(whole, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_threaded_matrix_vector_products_alternate_their_direction(monkeypatch):
    """Each threaded vector product, A @ x and x @ B, reads its matrix the other way round
    from the last (``gemv_threads``' ``backward``, flipped by ``blocked`` on every call),
    with the same bits either way."""
    mod = module("float32")
    flags = []
    original = mod.gemv_threads
    monkeypatch.setattr(mod, "gemv_threads",
                        lambda *a: (flags.append(a[-1]), original(*a)))
    for sa, sb in (((64, K_BIG), (K_BIG, 1)), ((1, K_BIG), (K_BIG, 64))):
        flags.clear()
        a, b = random_operands(sa, sb, "float32")
        got = [matmul(a, b) for _ in range(3)]
        assert len(flags) == 3 and flags[0] != flags[1] != flags[2], flags
        np.testing.assert_array_equal(got[0], got[1])
        np.testing.assert_array_equal(got[0], got[2])
        assert_close(got[0], a, b)


@pytest.mark.parametrize("vector_kb", (None, 0, 512, 2048))
@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_a_vector_product_beyond_the_cache_share_takes_the_threads(dtype, vector_kb,
                                                                     monkeypatch):
    """A product of one row or one column leaves the calling thread once its matrix passes
    the program's ``vector_direct`` multiply-adds: VECTOR_KB KiB (a database entry may set
    it), or where that is 0 a share of this CPU's L2; well below the limit for other
    products. Below it, it stays there (no thread pool); ``plan`` says the same."""
    given = {} if vector_kb is None else {"VECTOR_KB": vector_kb}
    bound = program(dtype, **given)
    mod = sys.modules[bound.__module__]
    limit = bound.vector_direct
    assert limit < mod.DIRECT_PRODUCT
    itemsize = np.dtype(dtype).itemsize
    if vector_kb:
        assert limit == vector_kb * 1024 // itemsize
    elif vector_kb == 0:
        assert limit == k02_blocked.vector_direct_bytes(0) // itemsize
    calls = []
    original = mod.gemv_threads
    monkeypatch.setattr(mod, "gemv_threads", lambda *a: (calls.append(1), original(*a)))
    k = 301
    for n, takes in ((limit // k + 1, True), (limit // k, False)):
        for sa, sb in (((1, k), (k, n)), ((n, k), (k, 1))):
            calls.clear()
            a, b = random_operands(sa, sb, dtype)
            assert_close(matmul(a, b, **given), a, b)
            assert bool(calls) is takes, (sa, sb)
            planned = tilegemm.plan(a, b, kernel="blocked", backend="cpu", **given).path
            assert ("one row or column" in planned) is takes, planned


def test_long_vector_products_sum_k_in_panels_as_the_packed_path_does():
    """The vector path (x @ B, x @ y) and the unpacked small path kept one running sum over
    all of K: float32 x @ y at K = 10^6 was 1.6e-4 off (NumPy 4e-7), and a row came out with
    other bits than the same row of a larger product. They now sum K in panels, as the
    packed path does: the same bits as the packed path's row, and the packed path's error."""
    rng = np.random.default_rng(7)
    k = 300_000  # a single running sum: ~1e-5 relative error in float32
    x, y = rng.random(k, dtype=np.float32), rng.random(k, dtype=np.float32)
    want = float(x.astype(np.float64) @ y)
    assert abs(float(matmul(x, y)) - want) / want < 2e-6
    a = rng.random((16, 5000), dtype=np.float32)  # above the small path: threads, packed
    b = rng.random((5000, 3), dtype=np.float32)
    np.testing.assert_array_equal(matmul(a[:1], b), matmul(a, b)[:1])  # the vector path
    # a 2 × 2 result below DIRECT_PRODUCT (the unpacked small path), against the packed rows
    np.testing.assert_array_equal(matmul(a[:2], b[:, :2]), matmul(a, b[:, :2])[:2])


def _transposed(x: np.ndarray) -> np.ndarray:
    """``x`` as the transpose of a C-ordered array in its last two axes (what ``W.T`` or a
    Fortran-ordered matrix is): the rung gets its storage, flagged transposed."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)


# (A's shape, B's shape, which operand is given transposed): a vector times a transposed
# matrix, x @ W.T and X.T @ v, above and below the calling thread's size, in batches (the
# matrix shared or not), the vector transposed too
SWAPPED = [((1, K_BIG), (K_BIG, 70), "b"), ((1, 300), (300, 70), "b"),
           ((70, K_BIG), (K_BIG, 1), "a"), ((70, 300), (300, 1), "a"),
           ((3, 1, 500), (500, 41), "b"), ((3, 1, 500), (3, 500, 41), "b"),
           ((2, 41, 500), (2, 500, 1), "a"), ((1, 700), (700, 90), "ab"),
           ((90, 700), (700, 1), "ab")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("sa", "sb", "flip"), SWAPPED,
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else s)
def test_a_vector_times_a_transposed_matrix_reads_it_in_place(dtype, sa, sb, flip,
                                                                 monkeypatch):
    """``x @ W.T`` is computed as ``W @ x`` on W's storage, and ``X.T @ v`` as ``v @ X``: no
    copy of the matrix (copying W.T, 4096×4096 float32, took 100× NumPy's time), the
    vector path where the product is large enough for it, and NumPy's result (gemm with
    alpha and beta too)."""
    mod = module(dtype)
    monkeypatch.setattr(mod, "_stored", None)  # would fail if an operand were copied
    calls = []
    original = mod.gemv_threads
    monkeypatch.setattr(mod, "gemv_threads", lambda *a: (calls.append(1), original(*a)))
    a, b = random_operands(sa, sb, dtype)
    ta = _transposed(a) if "a" in flip else a
    tb = _transposed(b) if "b" in flip else b
    got = matmul(ta, tb)
    # above the calling thread's share, whose limit for a row or a column depends on the L2
    # (with 512 KiB of it, 1x700x90 float64 goes to the threads), and not a batch of small
    # products (those run one product per thread)
    batch = int(np.prod(got.shape[:-2]))
    product = got.shape[-2] * got.shape[-1] * a.shape[-1]
    big = (batch * product > k02_blocked.direct_limit(
        got.shape[-2], got.shape[-1], got.itemsize,
        tilegemm.plan(ta, tb, kernel="blocked", backend="cpu").params["VECTOR_KB"])
           and (batch == 1 or product > k02_blocked.SMALL_PRODUCT))
    assert bool(calls) == big, (sa, sb)
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(got, np.matmul(a, b))
        return
    assert_close(got, a, b, what=f"{dtype} {sa} @ {sb}")
    c = np.random.default_rng(1).standard_normal(got.shape).astype(dtype)
    both = tilegemm.gemm(ta, tb, c=c.copy(), alpha=1.5, beta=-0.5, kernel="blocked",
                         backend="cpu")
    assert_close(both, a, b, alpha=1.5, beta=-0.5, c=c)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_small_matrix_vector_products_take_the_dot_tile(dtype):
    """Matrix-vector products of a batch, each small (40×1×40: fewer multiply-adds than
    the vector path's limit for one row), take the dot-product tile per product, as a tall
    product with the same rows does: the same bits row for row (the unpacked tiles,
    one lane of each vector busy, were 2-3× slower from 32×1×32 up, and sum in another
    order)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((50, 40, 40)).astype(dtype)
    x = rng.standard_normal((40, 1)).astype(dtype)
    got = matmul(a, x)
    tall = matmul(a.reshape(2000, 40), x)
    np.testing.assert_array_equal(got.reshape(2000, 1), tall)
    assert_close(got, a, x)
