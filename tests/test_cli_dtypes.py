"""``tilegemm run --dtype``: every element type that ``tilegemm.matmul`` computes, drawn by
``random_operands``, run in the type the chosen backend computes it in."""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm.cli import main
from tilegemm.problem import RESULT_DTYPES
from tilegemm.reference import random_operands


@pytest.mark.parametrize("dtype", RESULT_DTYPES)
def test_random_operands_draws_every_dtype_matmul_computes(dtype):
    a, b = random_operands((2, 5, 7), (7, 3), dtype, seed=1)
    assert a.dtype == np.dtype(dtype) and b.dtype == np.dtype(dtype)
    assert a.shape == (2, 5, 7) and b.shape == (7, 3)
    if np.dtype(dtype).kind == "b":
        assert a.any() and not a.all()  # both values occur in 70 draws
    else:
        assert np.all(a.astype(np.float64) != 0)
    expected = np.matmul(a, b)
    got = tilegemm.matmul(a, b, backend="cpu", kernel="triple_loop")
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                               rtol=1e-2)


def test_random_operands_unsigned_values_are_small():
    """A sign flip of an unsigned integer wraps to a huge value; unsigned draws have none."""
    a, _ = random_operands((50,), (50,), np.uint8, seed=0)
    assert a.min() >= 1 and a.max() <= 9


def test_run_help_lists_every_dtype_matmul_computes(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in RESULT_DTYPES:
        assert name in out


@pytest.mark.parametrize("dtype, computed", [
    ("float16", "float32"), ("bfloat16", "float32"), ("bool", "int32"), ("int8", "int32"),
    ("uint64", "int64"),
])
def test_run_takes_dtypes_computed_in_another_type(dtype, computed, capsys):
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop", "--dtype", dtype,
                 "--m", "9", "--n", "7", "--k", "5", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert f" {dtype} M=9 N=7 K=5" in out
    result = np.matmul(np.zeros((1, 1), dtype), np.zeros((1, 1), dtype)).dtype.name
    assert f"{dtype} operands, computed in {computed}, {result} result" in out
    assert "verified: yes" in out


def test_run_says_nothing_about_types_when_the_rung_computes_the_dtype_itself(capsys):
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop", "--dtype", "int64",
                 "--m", "4", "--n", "4", "--k", "4", "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "verified: yes" in out and "computed in" not in out


def test_run_refuses_a_dtype_matmul_does_not_compute_naming_those_it_does(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--backend", "cpu", "--dtype", "complex64", "--m", "4"])
    assert exc.value.code == 2  # refused, as every other bad option
    err = capsys.readouterr().err
    assert "complex64" in err and all(name in err for name in RESULT_DTYPES)


@pytest.mark.cudasim
@pytest.mark.simulator
def test_run_float16_on_cuda_runs_the_tensor_core_rung_in_float16(capsys):
    """As matmul does: float16 operands go to the tensor cores as they are, not widened."""
    assert main(["run", "--backend", "cuda", "--dtype", "float16", "--m", "16", "--n", "16",
                 "--k", "16", "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "cuda:mma" in out and "verified: yes" in out and "computed in" not in out
