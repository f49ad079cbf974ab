"""NumPy bfloat16 arrays (ml_dtypes) follow ``np.matmul``: its result dtype, not
``np.result_type``'s. ml_dtypes' matmul computes in float32 and returns float32 for
bfloat16 @ bfloat16 (float64 with int32), where ``result_type`` says bfloat16 (or has no
answer at all)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tilegemm
from tilegemm.problem import numpy_matmul_dtype
from tilegemm.reference import assert_close

BF16 = np.dtype(ml_dtypes.bfloat16)
PAIRS = [(BF16, BF16), (BF16, np.float32), (np.float32, BF16), (BF16, np.float16),
         (BF16, np.int32), (BF16, np.float64), (np.int8, BF16)]
BACKENDS = [b.name for b in tilegemm.backends() if b.usable and b.name in ("cpu", "opencl")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("da", "db"), PAIRS, ids=lambda d: np.dtype(d).name)
def test_result_dtype_and_values_follow_np_matmul(backend, da, db, rng):
    a = (rng.random((5, 37)) + 0.5).astype(da)
    b = (rng.random((37, 3)) + 0.5).astype(db)
    want = np.matmul(a, b)
    got = tilegemm.matmul(a, b, backend=backend)
    assert got.dtype == want.dtype
    assert_close(got, a.astype(np.float64), b.astype(np.float64))


def test_the_rule_only_where_numpy_differs() -> None:
    assert numpy_matmul_dtype(BF16, BF16) == np.float32
    assert numpy_matmul_dtype(BF16, np.dtype(np.int32)) == np.float64
    assert numpy_matmul_dtype(np.dtype(np.float16), np.dtype(np.float16)) is None
    assert numpy_matmul_dtype(np.dtype(np.int8), np.dtype(np.int8)) is None


def test_a_bfloat16_out_and_dtype_are_still_honoured(rng):
    a = (rng.random((4, 9)) + 0.5).astype(BF16)
    out = np.empty((4, 4), BF16)
    assert tilegemm.matmul(a, a.T, out=out) is out
    np.testing.assert_array_equal(out, np.matmul(a, a.T, out=np.empty((4, 4), BF16)))
    assert tilegemm.matmul(a, a.T, dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize(("other", "dtype"), [(np.float16, np.float32), (np.int32, np.float64),
                                              (np.uint16, np.float32)])
def test_dtype_given_for_a_pair_without_a_common_type(other, dtype, rng):
    """bfloat16 with float16 or an integer has no np.result_type; without dtype= NumPy's
    matmul rule was used, but with it the pair was refused ('no common dtype'), where
    np.matmul(a, b, dtype=...) computes it."""
    a = (rng.random((3, 6)) + 0.5).astype(BF16)
    b = (rng.random((6, 2)) * 4 + 1).astype(other)
    want = np.matmul(a, b, dtype=dtype)
    got = tilegemm.matmul(a, b, dtype=dtype)
    assert got.dtype == want.dtype == dtype
    assert_close(got, a.astype(np.float64), b.astype(np.float64))
    assert tilegemm.plan(a, b, dtype=dtype).dtype == np.dtype(dtype).name  # computed in
