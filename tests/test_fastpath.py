"""Small host products reuse the full path's decision (tilegemm.fastpath): the second call
of a shape skips straight to the compiled rung, gives the same result, and anything that
differs from the remembered case takes the full path with all its checks. Calls are
counted (the full path is replaced by a spy), never timed."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tilegemm
from tilegemm import api, fastpath
from tilegemm.reference import assert_close


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls that take the full path."""
    fastpath.forget()
    calls = []
    real = api.gemm

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "gemm", counting)
    yield calls
    fastpath.forget()


def _operands(rng, m, k, n, dtype):
    return (rng.standard_normal((m, k)).astype(dtype),
            rng.standard_normal((k, n)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (8, 8, 8), (33, 17, 64)])
def test_second_call_skips_the_full_path_and_agrees(spy, rng, shape, dtype):
    m, k, n = shape
    a, b = _operands(rng, m, k, n, dtype)
    first = tilegemm.matmul(a, b)
    assert len(spy) == 1
    a2, b2 = _operands(rng, m, k, n, dtype)  # fresh data, same case
    second = tilegemm.matmul(a2, b2)
    assert len(spy) == 1, "the second call took the full path"
    assert second is not first and second.dtype == dtype and second.shape == (m, n)
    assert_close(second, a2, b2)
    assert_close(first, a, b)  # the first result was not overwritten


def test_poisoned_output_is_fully_written(spy, rng, monkeypatch):
    monkeypatch.setenv("TILEGEMM_POISON", "1")
    a, b = _operands(rng, 9, 17, 8, np.float32)
    tilegemm.matmul(a, b)
    out = tilegemm.matmul(*_operands(rng, 9, 17, 8, np.float32))
    assert len(spy) == 1 and not np.isnan(out).any()


@pytest.mark.parametrize("case", ["transposed view", "other shape", "other dtype",
                                  "mixed dtypes", "subclass", "keyword", "out", "float16",
                                  "big", "byte order", "dtype"])
def test_anything_else_takes_the_full_path(spy, rng, case):
    a, b = _operands(rng, 8, 8, 8, np.float32)
    tilegemm.matmul(a, b)
    assert len(spy) == 1
    kwargs = {}
    if case == "transposed view":
        a = np.asfortranarray(a).T.copy().T  # same values, not C-contiguous
    elif case == "other shape":
        a, b = _operands(rng, 8, 9, 8, np.float32)
    elif case == "other dtype":
        a, b = a.astype(np.float64), b.astype(np.float64)
    elif case == "mixed dtypes":
        b = b.astype(np.float64)
    elif case == "subclass":
        a = a.view(type("Sub", (np.ndarray,), {}))
    elif case == "keyword":
        kwargs = {"backend": "cpu"}
    elif case == "out":
        kwargs = {"out": np.empty((8, 8), np.float32)}
    elif case == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
    elif case == "big":
        a, b = _operands(rng, 65, 64, 64, np.float32)
    elif case == "byte order":
        a, b = a.astype(">f4"), b.astype(">f4")
    elif case == "dtype":
        kwargs = {"dtype": np.float64}
    result = tilegemm.matmul(a, b, **kwargs)
    assert len(spy) == 2
    if case == "dtype":  # NumPy's dtype=, not the first call's float32
        assert result.dtype == np.float64
    assert_close(result, a, b)


def test_bad_shapes_still_raise_after_a_remembered_call(spy, rng):
    a, b = _operands(rng, 8, 8, 8, np.float32)
    tilegemm.matmul(a, b)
    with pytest.raises(ValueError, match="mismatch|match|shape"):
        tilegemm.matmul(a, np.ones((9, 8), np.float32))


def test_a_changed_tuning_cache_is_decided_again(spy, rng, tmp_path, monkeypatch):
    from tilegemm.tune import cache as tcache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    a, b = _operands(rng, 8, 8, 8, np.float64)
    tilegemm.matmul(a, b)
    tilegemm.matmul(a, b)
    assert len(spy) == 1
    tcache.save([], tcache.cache_path())  # another process's `tilegemm tune` writes it
    os.utime(tcache.cache_path(), ns=(1, 1))
    tilegemm.matmul(a, b)
    assert len(spy) == 2
    tilegemm.matmul(a, b)
    assert len(spy) == 2


def test_remembered_program_is_what_plan_reports(spy, rng):
    from tilegemm import registry

    a, b = _operands(rng, 16, 16, 16, np.float32)
    tilegemm.matmul(a, b)
    plan = tilegemm.plan(a, b)
    spec = registry.get(plan.kernel, plan.backend)
    assert fastpath._table[(a.dtype, 16, 16, 16)] is spec.program(plan.params, a.dtype)
