"""A float16 (or other narrowing) overflow in a conversion tilegemm makes warns as NumPy's
own does: at the line that called tilegemm, with NumPy's text, under ``np.errstate``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tilegemm

BIG16 = np.full((4, 4), 200, np.float16)  # each sum 4 * 200 * 200 = 160000 > 65504
BIG32 = np.full((4, 4), 1e5, np.float32)
ONES32 = np.ones((4, 4), np.float32)


def _overflow_warnings(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if "overflow encountered" in str(w.message)]


def _check_at_this_line(record: list[warnings.WarningMessage], line: int) -> None:
    found = _overflow_warnings(record)
    assert found, [str(w.message) for w in record]
    for w in found:
        assert w.category is RuntimeWarning
        assert str(w.message) == "overflow encountered in cast"
        assert (w.filename, w.lineno) == (__file__, line)


def _line_of(text: str) -> int:
    """The line of this file that holds ``text`` (once)."""
    with open(__file__) as f:
        lines = [i for i, s in enumerate(f, 1) if text in s and "_line_of" not in s]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("backend", ["cpu", pytest.param("opencl", marks=pytest.mark.opencl)])
def test_float16_result_overflow_warns_at_the_callers_line(backend):
    with pytest.warns(RuntimeWarning) as record:
        r = tilegemm.matmul(BIG16, BIG16, backend=backend)  # float16 result overflows
    assert np.isinf(r).all() and r.dtype == np.float16
    _check_at_this_line(record, _line_of("# float16 result overflows"))


def test_dtype_float16_overflow_warns_at_the_callers_line():
    with pytest.warns(RuntimeWarning) as record:
        tilegemm.matmul(BIG32, ONES32, backend="cpu", dtype=np.float16)  # dtype= overflows
    _check_at_this_line(record, _line_of("# dtype= overflows"))


def test_float16_out_overflow_warns_at_the_callers_line():
    out = np.empty((4, 4), np.float16)
    with pytest.warns(RuntimeWarning) as record:
        tilegemm.matmul(BIG32, ONES32, out=out, backend="cpu")  # out= overflows
    assert np.isinf(out).all()
    _check_at_this_line(record, _line_of("# out= overflows"))


def test_gemm_c_conversion_overflow_warns_at_the_callers_line():
    c = np.full((4, 4), 1e300)
    with pytest.warns(RuntimeWarning) as record:
        tilegemm.gemm(ONES32, ONES32, c, beta=1.0, backend="cpu")  # c overflows float32
    _check_at_this_line(record, _line_of("# c overflows float32"))


def test_errstate_ignore_and_raise_are_honoured():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with np.errstate(over="ignore"):
            r = tilegemm.matmul(BIG16, BIG16, backend="cpu")
    assert np.isinf(r).all() and not _overflow_warnings(record)
    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow"):
        tilegemm.matmul(BIG16, BIG16, backend="cpu")


def test_warnings_as_errors_raise_from_the_call():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning, match="overflow encountered in cast"):
            tilegemm.matmul(BIG16, BIG16, backend="cpu")


def test_the_callers_own_errstate_callback_is_kept():
    seen = []
    with np.errstate(over="call", call=lambda kind, flag: seen.append(kind)):
        tilegemm.matmul(BIG16, BIG16, backend="cpu")
    assert seen == ["overflow"]


def test_no_warning_without_overflow():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = tilegemm.matmul(np.ones((4, 4), np.float16), np.ones((4, 4), np.float16),
                            backend="cpu")
    assert (r == 4).all() and not _overflow_warnings(record)
