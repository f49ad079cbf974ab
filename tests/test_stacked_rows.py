"""A batch times one matrix, ``(..., M, K) @ (K, N)``, runs as one product of the batch's
rows stacked (``problem.stacked_rows``): the same numbers as NumPy's, the caller's shapes,
``out`` and gemm's ``c`` honoured, and every other layout left to the batched path."""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from conftest import transposed_device_array
from tilegemm import fastpath, problem
from tilegemm.reference import assert_close

# (batch shape, M, K, N): primes, one row, K = 1, partial tiles, a two-level batch
SHAPES = [((3,), 5, 7, 11), ((4,), 1, 33, 17), ((2, 3), 9, 1, 13), ((5,), 17, 40, 65),
          ((1,), 6, 8, 9), ((7,), 8, 64, 3)]


def _operands(rng, lead, m, k, n, dtype):
    a = (rng.standard_normal(lead + (m, k)) * 4).astype(dtype)
    b = (rng.standard_normal((k, n)) * 4).astype(dtype)
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("lead, m, k, n", SHAPES)
def test_a_batch_times_one_matrix_is_numpys_product(rng, dtype, lead, m, k, n):
    a, b = _operands(rng, lead, m, k, n, dtype)
    before = a.copy(), b.copy()
    got = tilegemm.matmul(a, b)
    assert got.shape == lead + (m, n) and got.dtype == np.matmul(a, b).dtype
    assert_close(got, a, b)
    np.testing.assert_array_equal(tilegemm.matmul(a, b), got)  # the remembered call
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


@pytest.mark.parametrize("lead, m, k, n", SHAPES)
def test_the_batch_is_one_product_of_its_rows(rng, lead, m, k, n):
    """What runs is the 2-D product of the stacked rows: plan says so, the call is
    remembered as that product, and the result has its bits, B plain, given transposed
    (``x @ w.T``) or as a vector."""
    a, b = _operands(rng, lead, m, k, n, np.float32)
    rows = a.reshape(-1, k)
    fastpath.forget()
    tilegemm.matmul(a, b)
    # remembered as that product's case, read on views by a repeated call
    stacked = fastpath._table[fastpath._key(rows, b, "auto", "auto")]
    case = fastpath._table[fastpath._key(a, b, "auto", "auto")]
    assert case.program is stacked.program and case.a3 == stacked.a3 == (1, rows.shape[0], k)
    assert case.shape == lead + (m, n) and case.entry is None
    plan = tilegemm.plan(a, b)
    assert plan.shape == (1, rows.shape[0], n, k)
    assert f"a batch of {a.size // (m * k)} times one matrix" in plan.path
    w = np.ascontiguousarray(b.T)
    v = b[:, 0].copy()
    for right, want_shape in ((b, lead + (m, n)), (w.T, lead + (m, n)), (v, lead + (m,))):
        got = tilegemm.matmul(a, right)
        assert got.shape == want_shape
        np.testing.assert_array_equal(got, tilegemm.matmul(rows, right).reshape(want_shape))
        assert_close(got, a, right)


@pytest.mark.parametrize("b_lead", [(1,), (1, 1), (1, 1, 1, 1)])
def test_b_with_leading_ones_is_one_matrix(rng, b_lead):
    """B of shape (1, K, N) (or more leading 1s, which the result takes, as NumPy's
    broadcast gives them) is the same matrix for every product: stacked too."""
    a, b = _operands(rng, (2, 3), 5, 7, 11, np.float64)
    b = b.reshape(b_lead + b.shape)
    want_shape = np.broadcast_shapes(a.shape[:-2], b_lead) + (5, 11)
    assert tilegemm.plan(a, b).shape == (1, 30, 11, 7)
    got = tilegemm.matmul(a, b)
    assert got.shape == want_shape
    assert_close(got, a, b)
    w = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    assert_close(tilegemm.gemm(a, w, trans_b=True), a, w, trans_b=True)
    out = np.full(want_shape, np.nan)
    assert tilegemm.matmul(a, b, out=out) is out
    assert_close(out, a, b)


def test_out_is_written_in_place_or_through_the_batched_path(rng):
    a, b = _operands(rng, (3,), 5, 7, 11, np.float64)
    out = np.full((3, 5, 11), np.nan)
    assert tilegemm.matmul(a, b, out=out) is out
    assert_close(out, a, b)
    # an out the stacked product cannot write through a view: the batched path copies
    strided = np.full((3, 5, 22), np.nan)[..., ::2]
    assert tilegemm.matmul(a, b, out=strided) is strided
    assert_close(strided, a, b)
    wider = np.full((2, 3, 5, 11), np.nan)  # out with a leading dimension to broadcast to
    assert tilegemm.matmul(a, b, out=wider) is wider
    assert_close(wider[1], a, b)
    cast = np.full((3, 5, 11), np.nan, np.float32)  # float64 result cast into float32 out
    tilegemm.matmul(a, b, out=cast)
    np.testing.assert_allclose(cast, (a @ b).astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("c_shape", [(), (1,), (11,), (1, 11), (1, 1), (3, 5, 11), (5, 11),
                                     (3, 1, 11), (5, 1)])
def test_gemm_with_a_batch_and_a_bias_or_a_full_c(rng, c_shape):
    """A bias along the rows (scalar, a row) or a C-ordered c of the result's shape goes
    with the stacked rows; any other c (one per row of each product, one per product)
    takes the batched path. Both give alpha * a @ b + beta * c."""
    a, b = _operands(rng, (3,), 5, 7, 11, np.float64)
    c = rng.standard_normal(c_shape)
    c_before = c.copy()
    got = tilegemm.gemm(a, b, c, alpha=0.5, beta=2.0)
    assert_close(got, a, b, c=c, alpha=0.5, beta=2.0)
    np.testing.assert_array_equal(c, c_before)
    w = np.ascontiguousarray(b.T)
    assert_close(tilegemm.gemm(a, w, c, alpha=0.5, beta=2.0, trans_b=True), a, w, c=c,
                 alpha=0.5, beta=2.0, trans_b=True)


def test_repeated_calls_run_the_stacked_product_with_any_c(rng):
    """A repeated call of a stacked case (matmul, or gemm of the same product with a bias,
    with a c per row of each product that stacking itself would not take, with out)
    gives the first call's bits and NumPy's product."""
    a, b = _operands(rng, (4,), 3, 9, 6, np.float32)
    first = tilegemm.matmul(a, b)
    for _ in range(2):
        np.testing.assert_array_equal(tilegemm.matmul(a, b), first)
    for c in (rng.standard_normal(6).astype(np.float32),
              rng.standard_normal((3, 6)).astype(np.float32)):
        got = tilegemm.gemm(a, b, c, alpha=2.0, beta=0.5)
        assert_close(got, a, b, c=c, alpha=2.0, beta=0.5)
        np.testing.assert_array_equal(tilegemm.gemm(a, b, c, alpha=2.0, beta=0.5), got)
    out = np.full((4, 3, 6), np.nan, np.float32)
    assert tilegemm.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, first)


def test_gemm_out_c_updates_c_in_place(rng):
    a, b = _operands(rng, (2, 2), 5, 7, 11, np.float32)
    c = rng.standard_normal((2, 2, 5, 11)).astype(np.float32)
    want_c = c.copy()
    assert tilegemm.gemm(a, b, c, beta=1.0, out=c) is c
    assert_close(c, a, b, c=want_c, beta=1.0)


@pytest.mark.parametrize("case", ["transposed batch", "subclass", "batch of b",
                                  "b broadcast in part", "gemm trans_a",
                                  "strided rows", "empty", "k mismatch"])
def test_other_layouts_are_not_stacked(rng, case):
    """Only a C-ordered batch of A (not transposed, not a subclass) with a single B is
    stacked; the rest keeps the batched path, and a mismatch names the caller's shapes."""
    a, b = _operands(rng, (3,), 5, 7, 11, np.float64)
    kwargs = {}
    if case == "transposed batch":
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    elif case == "subclass":
        class Sub(np.ndarray):
            pass
        a = a.view(Sub)
    elif case == "batch of b":
        b = np.broadcast_to(b, (3,) + b.shape).copy()
    elif case == "b broadcast in part":
        b = np.broadcast_to(b, (2, 1) + b.shape).copy()
        a = a[None]
    elif case == "gemm trans_a":
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        kwargs = {"trans_a": True}
    elif case == "strided rows":
        a = np.concatenate([a, a], axis=-1)[..., :7]
    elif case == "empty":
        a = a[:0]
    elif case == "k mismatch":
        assert problem.stacked_rows(a, b[:6]) is None
        with pytest.raises(ValueError, match=r"\(3, 5, 7\) and \(6, 11\)"):
            tilegemm.matmul(a, b[:6])
        return
    assert problem.stacked_rows(a, b, **kwargs) is None
    if kwargs:
        got = tilegemm.gemm(a, b, **kwargs)
        assert_close(got, a, b, **kwargs)
    else:
        got = tilegemm.matmul(a, b)
        assert type(got) is type(a)
        assert_close(np.asarray(got), np.asarray(a), b)
        batch = np.broadcast_shapes(np.shape(a)[:-2], b.shape[:-2])
        assert tilegemm.plan(a, b).shape[0] == int(np.prod(batch))


@pytest.mark.cudasim
def test_cuda_device_arrays_are_stacked_too(rng):
    """numba device arrays (the simulator's here; CuPy and PyTorch in
    test_cuda_interop): a batch times one matrix is one product of its rows, ``out`` and a
    ``c`` of the result's shape written through views; a ``c`` to broadcast is not."""
    from numba import cuda

    a, b = _operands(rng, (3,), 5, 7, 4, np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    assert tilegemm.plan(da, db, backend="cuda").shape == (1, 15, 4, 7)
    r = tilegemm.matmul(da, db, backend="cuda")
    assert r.shape == (3, 5, 4)
    assert_close(r.copy_to_host(), a, b)
    out = cuda.to_device(np.full((3, 5, 4), np.nan, np.float32))
    assert tilegemm.matmul(da, db, out=out, backend="cuda") is out
    assert_close(out.copy_to_host(), a, b)
    c = rng.standard_normal((3, 5, 4)).astype(np.float32)
    dc = cuda.to_device(c)
    assert tilegemm.gemm(da, db, dc, beta=1.0, out=dc, backend="cuda") is dc
    assert_close(dc.copy_to_host(), a, b, c=c, beta=1.0)
    assert problem.stacked_rows(da, db, cuda.to_device(c[0, 0])) is None
    assert problem.stacked_rows(da, b) is None  # a device batch with a host matrix
    # a device batch given transposed in its last two axes is not C-ordered: not stacked,
    # and the batched path still gives the product
    dt, host = transposed_device_array(rng, (3, 5, 7), np.float32)
    assert problem.stacked_rows(dt, db) is None
    assert_close(tilegemm.matmul(dt, db, backend="cuda").copy_to_host(), host, b)
