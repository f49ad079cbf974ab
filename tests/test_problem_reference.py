"""Problem normalisation and the reference/tolerance used by every check."""

from __future__ import annotations

import numpy as np
import pytest

from tilegemm.problem import describe, host_operand_3d, make_problem
from tilegemm.reference import assert_close, bound, random_operands


def _prob(sa, sb, **kw):
    a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
    return make_problem(describe(a, "a"), describe(b, "b"), **kw), a, b


def test_problem_shapes_and_batch_modes():
    p, a, b = _prob((2, 1, 7, 5), (3, 5, 4))
    assert (p.m, p.n, p.k, p.batch_shape, p.out_shape) == (7, 4, 5, (2, 3), (2, 3, 7, 4))
    assert p.batch_mode("a") == "broadcast" and p.batch_mode("b") == "broadcast"
    assert host_operand_3d(a, p, "a").shape == (6, 7, 5)
    p, a, b = _prob((7, 5), (3, 5, 4))
    assert p.batch_mode("a") == "single" and p.batch_mode("b") == "full"
    assert host_operand_3d(a, p, "a").shape == (1, 7, 5)
    assert p.flops == 2 * 3 * 7 * 4 * 5


def test_transposes_and_vectors():
    p, a, b = _prob((5, 7), (4, 5), trans_a=True, trans_b=True)
    assert (p.m, p.n, p.k) == (7, 4, 5)
    a3 = host_operand_3d(np.arange(35.0).reshape(5, 7), p, "a")
    np.testing.assert_array_equal(a3[0], np.arange(35.0).reshape(5, 7).T)
    p, _, _ = _prob((5,), (5,))
    assert p.out_shape == ()


def test_host_operands_cannot_write_the_input():
    """Operands reach kernels as read-only views (no copy when none is needed)."""
    p, a, _ = _prob((3, 4), (4, 2))
    a3 = host_operand_3d(a, p, "a")
    assert np.shares_memory(a, a3) and not a3.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a3[...] = 5
    assert (a == 1).all() and a.flags.writeable


def test_bound_scales_with_k():
    a, b = random_operands((4, 8), (8, 4), "float32")
    a2, b2 = random_operands((4, 512), (512, 4), "float32")
    assert np.median(bound(a2, b2, 512, np.float32)) > np.median(bound(a, b, 8, np.float32))


@pytest.mark.parametrize("int_dtype", ["int8", "int16", "int64"])
def test_bound_of_an_integer_minimum_is_its_magnitude(int_dtype):
    """np.abs(int8(-128)) is -128: the magnitude's terms cancelled (about 1 for a sum near
    531), and a correctly rounded float16 result of int8 @ float16 was rejected."""
    lo, hi = np.iinfo(int_dtype).min, np.iinfo(int_dtype).max
    a = np.array([[lo, lo, hi, hi]], int_dtype)
    b = np.array([[-1.029296875], [1.03515625], [1.056640625], [1.04296875]], np.float16)
    mag = abs(float(lo)) * (1.029296875 + 1.03515625) + float(hi) * (1.056640625 + 1.04296875)
    allowed = float(bound(a, b, 4, np.float16)[0, 0])
    eps = float(np.finfo(np.float16).eps)
    tiny = float(np.finfo(np.float16).tiny)
    assert allowed == pytest.approx(4 * 5 * eps * mag + tiny, rel=1e-6)
    if int_dtype == "int8":  # the case found: NumPy's own float16 result, 266.0
        assert_close(np.matmul(a, b), a, b)


def test_assert_close_catches_errors_and_reports_index():
    a, b = random_operands((6, 5), (5, 4), "float32")
    c = (a.astype(np.float64) @ b).astype(np.float32)
    assert_close(c, a, b)
    c[2, 3] += 1e-2
    with pytest.raises(AssertionError, match=r"first at \(2, 3\)"):
        assert_close(c, a, b)
    c[2, 3] = np.nan  # an unwritten (poisoned) element
    with pytest.raises(AssertionError, match="1 of 24 elements wrong"):
        assert_close(c, a, b)
    with pytest.raises(AssertionError, match="shape"):
        assert_close(c[:2], a, b)


def test_assert_close_float64_tolerance_is_tight():
    a, b = random_operands((3, 50), (50, 3), "float64")
    c = a @ b
    assert_close(c, a, b)
    with pytest.raises(AssertionError):
        assert_close(c * (1 + 1e-9), a, b)


def test_assert_close_integers_exact():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(6, dtype=np.int32).reshape(3, 2)
    c = a @ b
    assert_close(c, a, b)
    c[0, 0] += 1
    with pytest.raises(AssertionError):
        assert_close(c, a, b)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint64, np.bool_])
def test_assert_close_takes_narrow_integer_and_bool_results_as_numpy_gives_them(dtype):
    """NumPy's own int8 result (wrapped) was called wrong ('got 32, expected 20000'), and a
    bool result raised ValueError: the dtypes matmul documents were not checkable."""
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    a = (rng.integers(0, 2, (5, 7)).astype(bool) if info is None
         else rng.integers(info.min, info.max, (5, 7), dtype=dtype, endpoint=True))
    b = a.T.copy()
    right = np.matmul(a, b)
    assert_close(right, a, b)
    wrong = right.copy()
    wrong[2, 3] = ~wrong[2, 3] if dtype is np.bool_ else wrong[2, 3] + dtype(1)
    with pytest.raises(AssertionError, match=r"1 of 25 elements wrong; first at \(2, 3\)"):
        assert_close(wrong, a, b)


def test_random_operands_are_nonzero_and_fresh():
    a1, _ = random_operands((50, 50), (1, 1), "float32")
    a2, _ = random_operands((50, 50), (1, 1), "float32")
    assert np.all(a1 != 0) and not np.array_equal(a1, a2)
    i, _ = random_operands((50, 50), (1, 1), "int32")
    assert np.all(i != 0)


def test_assert_close_takes_operands_numpy_cannot_promote_together():
    """bfloat16 @ float16 is a float32 product in np.matmul and tilegemm, but the reference
    asked np.result_type, which has no promotion between them, and raised."""
    import ml_dtypes

    a = np.linspace(-1, 1, 12).reshape(3, 4).astype(ml_dtypes.bfloat16)
    b = np.linspace(1, 2, 8).reshape(4, 2).astype(np.float16)
    r = np.matmul(a, b)
    assert_close(r, a, b)
    with pytest.raises(AssertionError):
        assert_close(r + np.float32(0.5), a, b)
