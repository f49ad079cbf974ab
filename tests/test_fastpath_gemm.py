"""Repeated ``tilegemm.gemm`` calls on host arrays reuse the full path's decision
(tilegemm.fastpath): alpha, beta, ``c``, transpose flags and ``out=c`` run the remembered
program with the full path's bits, and anything the remembered call does not take
(a ``c`` to broadcast or cast, an alpha the rung does not apply itself, bad input) goes
through the full path and its checks. Full-path calls are counted, never timed."""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm import api, fastpath, remembered
from tilegemm.errors import InvalidValueError
from tilegemm.reference import assert_close


@pytest.fixture
def spy(count_calls):
    """Counts the calls that take the full path."""
    remembered.forget()
    yield count_calls(api, "_full_gemm")
    remembered.forget()


def _data(rng, m, k, n, dtype, trans_a=False, trans_b=False, batch=()):
    a = rng.standard_normal(batch + ((k, m) if trans_a else (m, k))).astype(dtype)
    b = rng.standard_normal(batch + ((n, k) if trans_b else (k, n))).astype(dtype)
    c = rng.standard_normal(batch + (m, n)).astype(dtype)
    return a, b, c


def _full(a, b, c, **kwargs):
    """The same call through the full path (nothing remembered before or after)."""
    remembered.forget()
    try:
        return tilegemm.gemm(a, b, c, **kwargs)
    finally:
        remembered.forget()


FORMS = {
    "plain": {},
    "alpha": {"alpha": 0.5},
    "beta": {"alpha": -0.75, "beta": 1.5, "c": True},
    "c, beta 0": {"beta": 0.0, "c": True},
    "trans_a": {"trans_a": True, "alpha": 0.25, "beta": -1.0, "c": True},
    "trans_b": {"trans_b": True},
    "both": {"trans_a": True, "trans_b": True, "beta": 2, "c": True},
    "numpy scalars": {"alpha": np.float32(0.5), "beta": np.float64(-2.0), "c": True},
    "int scalars": {"alpha": 1, "beta": -2, "c": True},
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(8, 8, 8), (7, 13, 5), (1, 40, 30), (33, 17, 64),
                                   (3, 200, 70), (130, 300, 70)])
@pytest.mark.parametrize("form", FORMS)
def test_a_repeated_gemm_skips_the_full_path_with_its_bits(spy, rng, shape, dtype, form):
    kwargs = dict(FORMS[form])
    with_c = kwargs.pop("c", False)
    ta, tb = kwargs.get("trans_a", False), kwargs.get("trans_b", False)
    m, k, n = shape
    a, b, c = _data(rng, m, k, n, dtype, ta, tb)
    tilegemm.gemm(a, b, c if with_c else None, **kwargs)
    assert len(spy) == 1
    a, b, c = _data(rng, m, k, n, dtype, ta, tb)  # fresh data, same case
    c_before = c.copy()
    got = tilegemm.gemm(a, b, c if with_c else None, **kwargs)
    assert len(spy) == 1, "the second call took the full path"
    assert got.shape == (m, n) and got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(c, c_before)  # c read, not written
    np.testing.assert_array_equal(got, _full(a, b, c if with_c else None, **kwargs))
    alpha, beta = kwargs.get("alpha", 1.0), kwargs.get("beta", 0.0)
    assert_close(got, a, b, alpha=float(alpha), beta=float(beta), c=c if with_c else None,
                 trans_a=ta, trans_b=tb)


def test_gemm_and_matmul_share_a_case(spy, rng):
    """gemm(a, b, trans_b=True) is matmul(a, b.T): one decision serves both."""
    a, _, _ = _data(rng, 9, 11, 7, np.float32)
    w = rng.standard_normal((7, 11)).astype(np.float32)
    first = tilegemm.matmul(a, w.T)
    assert len(spy) == 1
    np.testing.assert_array_equal(tilegemm.gemm(a, w, trans_b=True), first)
    c = rng.standard_normal((9, 7)).astype(np.float32)
    got = tilegemm.gemm(a, w, c, alpha=0.5, beta=1.0, trans_b=True)
    assert len(spy) == 1
    assert_close(got, a, w, alpha=0.5, beta=1.0, c=c, trans_b=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_out_c_accumulates_in_place(spy, rng, dtype):
    """``gemm(a, b, c, beta=1, out=c)``, the update of a running sum, writes c itself on
    every remembered call."""
    m, k, n = 12, 20, 9
    c = np.zeros((m, n), dtype)
    want = np.zeros((m, n))
    for _ in range(4):
        a, b, _ = _data(rng, m, k, n, dtype)
        assert tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0, out=c) is c
        want = 0.5 * (a.astype(np.float64) @ b) + want
    assert len(spy) == 1
    np.testing.assert_allclose(c, want, rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-4 if dtype == np.float32 else 1e-12)


def test_out_apart_from_c_gets_c_first(spy, rng):
    a, b, c = _data(rng, 10, 6, 5, np.float64)
    tilegemm.gemm(a, b, c, beta=-1.0)
    out = np.full((10, 5), np.nan)
    assert tilegemm.gemm(a, b, c, beta=-1.0, out=out) is out and len(spy) == 1
    assert_close(out, a, b, beta=-1.0, c=c)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c_shape", [(5,), (1, 5), (7, 1), (), (1,)])
def test_a_c_that_broadcasts_is_remembered(spy, rng, c_shape, dtype):
    """``gemm(x, w, b, beta=1.0)`` with ``b`` a row of biases (``x @ w + b``), a column, or
    one value: the remembered call starts from ``c`` broadcast, as the full path does."""
    a, b, _ = _data(rng, 7, 13, 5, dtype)
    c = rng.standard_normal(c_shape).astype(dtype)
    tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0)
    a, b, _ = _data(rng, 7, 13, 5, dtype)
    c = rng.standard_normal(c_shape).astype(dtype)
    got = tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0)
    assert len(spy) == 1 and got.shape == (7, 5)
    np.testing.assert_array_equal(got, _full(a, b, c, alpha=0.5, beta=1.0))
    assert_close(got, a, b, alpha=0.5, beta=1.0, c=np.broadcast_to(c, (7, 5)))


@pytest.mark.parametrize("case", ["c other dtype", "c subclass", "alpha nan",
                                  "beta inf", "0-d alpha", "alpha float16", "flag np.bool_",
                                  "out overlaps a", "out strided", "large alpha over panels",
                                  "integers scaled by floats", "integer alpha too large"])
def test_what_the_remembered_call_does_not_take_goes_the_full_path(spy, rng, case):
    m, k, n = 6, 70, 5
    dtype = np.int64 if case.startswith("integer") else np.float32
    a, b, c = _data(rng, m, k, n, dtype) if dtype != np.int64 else (
        rng.integers(-9, 9, (m, k)), rng.integers(-9, 9, (k, n)), rng.integers(-9, 9, (m, n)))
    tilegemm.gemm(a, b, c, alpha=0.5 if dtype != np.int64 else 2, beta=1.0)  # remembered
    kwargs = {"alpha": 0.5, "beta": 1.0}
    if case == "c other dtype":
        c = c.astype(np.float64)
    elif case == "c subclass":
        c = c.view(type("Sub", (np.ndarray,), {}))
    elif case == "alpha nan":
        kwargs["alpha"] = float("nan")
    elif case == "beta inf":
        kwargs["beta"] = float("inf")
    elif case == "0-d alpha":
        kwargs["alpha"] = np.asarray(0.5)
    elif case == "alpha float16":
        kwargs["alpha"] = np.float16(0.5)
    elif case == "flag np.bool_":
        kwargs["trans_a"] = np.False_
    elif case == "out overlaps a":
        a = np.ones((m, m), dtype)
        b = rng.standard_normal((m, m)).astype(dtype)
        c = rng.standard_normal((m, m)).astype(dtype)
        tilegemm.gemm(a, b, c, **kwargs)  # the case of a square a, remembered
        kwargs["out"] = a
    elif case == "out strided":
        kwargs["out"] = np.full((m, 2 * n), np.nan, dtype)[:, ::2]
    elif case == "large alpha over panels":
        kwargs["alpha"] = 2.0 ** 100  # K = 70 spans panels of 64 steps for a few rows
    elif case == "integers scaled by floats":  # whole: the full path takes them
        kwargs = {"alpha": 3.0, "beta": -2.0}
    else:
        kwargs = {"alpha": 2**63, "beta": 1}  # beyond int64: the full path refuses it
        with pytest.raises(tilegemm.errors.InvalidValueError, match="does not fit"):
            tilegemm.gemm(a, b, c, **kwargs)
        assert len(spy) == 2
        return
    calls = len(spy)
    expected = np.matmul(a.astype(np.float64), b)
    expected = kwargs["alpha"] * expected + kwargs["beta"] * np.asarray(c, np.float64)
    with np.errstate(invalid="ignore"):
        got = tilegemm.gemm(a, b, c, **kwargs)
    assert len(spy) == calls + 1
    if "out" in kwargs:
        assert got is kwargs["out"]
    if case == "integers scaled by floats":
        np.testing.assert_array_equal(got, expected.astype(np.int64))
    elif case in ("alpha nan", "beta inf"):
        assert not np.isfinite(got).any()
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-4,
                                   atol=1e-4 * float(np.max(np.abs(expected))))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("form", ["scaled", "out=c", "bias row", "alpha -1", "largest alpha"])
def test_integer_gemm_with_int_scalars_is_remembered(spy, rng, dtype, form):
    """Integer products hand alpha and beta to the rung as they are (checked to fit the
    dtype, which the remembered call checks too): a repeated integer gemm with Python int
    scalars is remembered with the full path's bits (wrapping where it overflows, as
    NumPy's integers do), where before every such call took the full path."""
    m, k, n = 7, 40, 5
    a, b = rng.integers(-9, 9, (m, k)).astype(dtype), rng.integers(-9, 9, (k, n)).astype(dtype)
    tilegemm.matmul(a, b)  # the case, decided
    c = rng.integers(-9, 9, (n,) if form == "bias row" else (m, n)).astype(dtype)
    alpha, beta = {"alpha -1": (-1, 0), "largest alpha": (int(np.iinfo(dtype).max), 1)}.get(
        form, (3, -2))
    want = _full(a, b, c.copy(), alpha=alpha, beta=beta)
    remembered.forget()
    tilegemm.matmul(a, b)
    calls = len(spy)
    for _ in range(2):
        cc = c.copy()
        if form == "out=c":
            got = tilegemm.gemm(a, b, cc, alpha=alpha, beta=beta, out=cc)
            assert got is cc
        else:
            got = tilegemm.gemm(a, b, cc, alpha=alpha, beta=beta)
            np.testing.assert_array_equal(cc, c)  # c untouched
        np.testing.assert_array_equal(got, want)
    assert len(spy) == calls and got.dtype == dtype
    expected = (alpha * (a.astype(object) @ b.astype(object)) + beta * c.astype(object))
    bits = np.iinfo(dtype).bits
    wrapped = ((expected + 2**(bits - 1)) % 2**bits - 2**(bits - 1)).astype(dtype)
    np.testing.assert_array_equal(got, np.broadcast_to(wrapped, (m, n)))


def test_a_large_alpha_within_one_panel_is_remembered(spy, rng):
    """The rung applies any finite alpha itself when K fits one panel (K ≤ 64 here)."""
    a, b, c = _data(rng, 6, 40, 5, np.float64)
    tilegemm.gemm(a, b, c, alpha=2.0 ** 100, beta=1.0)
    a, b, c = _data(rng, 6, 40, 5, np.float64)
    got = tilegemm.gemm(a, b, c, alpha=2.0 ** 100, beta=1.0)
    assert len(spy) == 1
    assert_close(got, a, b, alpha=2.0 ** 100, beta=1.0, c=c)


def test_bad_input_still_raises_after_a_remembered_call(spy, rng):
    a, b, c = _data(rng, 8, 8, 8, np.float32)
    tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0)
    with pytest.raises(InvalidValueError, match="beta != 0 needs c"):
        tilegemm.gemm(a, b, alpha=0.5, beta=1.0)
    with pytest.raises(ValueError, match="broadcast"):
        tilegemm.gemm(a, b, np.ones((8, 9), np.float32), beta=0.0)  # checked whatever beta
    with pytest.raises(ValueError, match="broadcast"):
        tilegemm.gemm(a, b, np.stack([c, c]), beta=1.0)  # a batch of c for one product
    with pytest.raises(ValueError, match="broadcast"):
        tilegemm.gemm(a, b, c[:, :3], beta=1.0)
    with pytest.raises(TypeError, match="alpha"):
        tilegemm.gemm(a, b, c, alpha="2", beta=1.0)
    with pytest.raises(TypeError, match="trans_a"):
        tilegemm.gemm(a, b, c, trans_a=1, beta=1.0)
    with pytest.raises(TypeError, match="UPPER-CASE"):
        tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0, tile=16)  # lower-case parameter
    assert len(spy) == 8


def test_poison_fills_a_result_c_does_not_start(spy, rng, monkeypatch):
    """Under TILEGEMM_POISON a remembered call fills its result (a new one or ``out``)
    before the rung runs, unless it starts as ``c``: a rung that writes nothing shows
    what the call filled."""
    a, b, c = _data(rng, 8, 8, 8, np.float64)
    monkeypatch.setenv("TILEGEMM_POISON", "1")
    tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0)
    key = fastpath._key(a, b, "auto", "auto")
    fastpath._table[key] = fastpath._table[key]._replace(program=lambda *args: None,
                                                         fill=42.0)
    assert (tilegemm.gemm(a, b, c, alpha=0.5) == 42.0).all()
    out = np.zeros((8, 8))
    tilegemm.gemm(a, b, c, alpha=0.5, out=out)
    assert (out == 42.0).all()
    tilegemm.matmul(a, b, out=out.fill(0) or out)  # matmul's remembered out alike
    assert (out == 42.0).all()
    np.testing.assert_array_equal(tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0), c)
    assert len(spy) == 1


def _opencl_usable() -> bool:
    from tilegemm.backends import get_backend

    return get_backend("opencl").status().usable


@pytest.mark.skipif(not _opencl_usable(), reason="no usable OpenCL device")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_opencl_remembers_gemm_with_c(spy, rng, dtype):
    """OpenCL's program for host arrays copies ``c`` to the device with the operands when
    beta is not zero, and the kernels scale each sum once: a repeated gemm with alpha, beta
    and ``c`` (or ``out=c``) runs it, with the full path's bits."""
    tilegemm.gemm(*_data(rng, 9, 17, 8, dtype), alpha=0.5, beta=-1.0, backend="opencl")
    a, b, c = _data(rng, 9, 17, 8, dtype)
    c0 = c.copy()
    got = tilegemm.gemm(a, b, c, alpha=0.5, beta=-1.0, backend="opencl")
    assert tilegemm.gemm(a, b, c, alpha=0.5, beta=-1.0, out=c, backend="opencl") is c
    assert len(spy) == 1
    assert_close(got, a, b, alpha=0.5, beta=-1.0, c=c0)
    np.testing.assert_array_equal(c, got)  # out=c: the same product, written into c
    np.testing.assert_array_equal(got, _full(a, b, c0, alpha=0.5, beta=-1.0,
                                             backend="opencl"))
