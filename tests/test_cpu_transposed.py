"""Transposed and Fortran-ordered operands on the CPU rung: read in place.

The blocked rung's packed path reads an operand that is the transpose of a C-ordered array
(``x.T``, a Fortran-ordered matrix, ``np.swapaxes`` of a C-ordered batch) in place; so does
the small-product path (it packs such a matrix on the calling thread), and no path copies
a transposed matrix. Every path must give exactly what the same product of C-ordered
operands gives (the same sums in the same order), except where B's transpose is read
along K as dot products: a vector times a transposed matrix (``x @ W.T``, ``X.T @ v``: the
other vector product on the matrix's storage) and products of a few rows with B given
transposed. Those sum K in vector lanes: exact for integers, within rounding for floats.
The caller's arrays are never written.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm.reference import assert_close, random_operands

DTYPES = ("float32", "float64", "int32", "int64")
SHAPES = [
    (97, 131, 113),    # packed, partial tiles everywhere (primes)
    (300, 257, 700),   # packed, two K panels
    (1, 300, 400),     # one row: the vector path
    (300, 1, 400),     # one column: the vector path
    (5, 6, 7),         # small: the unpacked path
    (200, 200, 1),     # K = 1
    (4, 300, 400),     # a few rows: the unpacked tiles, or dot products with B transposed
]


def along_k(name: str, m: int, n: int) -> bool:
    """Whether the layout ``name`` makes the rung read B's transpose as dot products along
    K (see the module): B transposed with 1-7 rows (1-15, B alone transposed), or A
    transposed with one column."""
    from tilegemm.kernels.cpu._dot_tile import DOT_MAX

    rows = DOT_MAX if name == "b.T" else 8
    return (name in ("b.T", "both") and m < rows) or (name in ("a.T", "both") and n == 1)


def layouts(a: np.ndarray, b: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The same operands in the layouts users pass."""
    at = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    return {"a.T": (np.swapaxes(at, -1, -2), b), "b.T": (a, np.swapaxes(bt, -1, -2)),
            "both": (np.swapaxes(at, -1, -2), np.swapaxes(bt, -1, -2))}


def matmul(a, b, **kw):
    return tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_layout_gives_the_contiguous_result_exactly(dtype, shape):
    m, n, k = shape
    a, b = random_operands((m, k), (k, n), dtype)
    want = matmul(a, b)
    for name, (x, y) in layouts(a, b).items():
        before = (x.copy(), y.copy())
        got = matmul(x, y)
        if along_k(name, m, n) and np.dtype(dtype).kind == "f":
            assert_close(got, a, b, what=f"{name} {shape}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(x, before[0])
        np.testing.assert_array_equal(y, before[1])
    if dtype == "float64":
        np.testing.assert_allclose(want, a @ b, rtol=1e-10, atol=1e-10 * k)


@pytest.mark.parametrize("dtype", ("float32", "int64"))
@pytest.mark.parametrize(("sa", "sb"), [
    ((3, 70, 90), (3, 90, 110)),     # a batch, packed one product at a time
    ((40, 6, 4), (40, 4, 9)),        # a batch of small products (one run per task)
    ((2, 130, 150), (150, 120)),     # B shared by the batch
    ((40, 6, 4), (4, 9)),            # small products, B shared
    ((7, 12), (40, 12, 9)),          # small products, A shared (copied once per run)
    ((300, 16, 16), (300, 16, 16)),  # small products, the batch split over the threads
])
def test_batches(dtype, sa, sb):
    a, b = random_operands(sa, sb, dtype)
    want = matmul(a, b)
    for name, (x, y) in layouts(a, b).items():
        np.testing.assert_array_equal(matmul(x, y), want, err_msg=name)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("shape", [(150, 170, 130), (24, 30, 20)])  # packed; unpacked
def test_gemm_alpha_beta_with_transposed_operands(dtype, shape, rng):
    m, k, n = shape
    a, b = random_operands((m, k), (k, n), dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    want = tilegemm.gemm(a, b, c=c.copy(), alpha=1.5, beta=-0.5, kernel="blocked",
                         backend="cpu")
    for name, (x, y) in layouts(a, b).items():
        got = tilegemm.gemm(x, y, c=c.copy(), alpha=1.5, beta=-0.5, kernel="blocked",
                            backend="cpu")
        np.testing.assert_array_equal(got, want, err_msg=name)
    # gemm's own transpose flags on C-ordered operands are the same layouts
    got = tilegemm.gemm(np.ascontiguousarray(a.T), b, c=c.copy(), alpha=1.5, beta=-0.5,
                        trans_a=True, kernel="blocked", backend="cpu")
    np.testing.assert_array_equal(got, want)


def test_transposed_operands_reach_the_rung_uncopied(monkeypatch):
    """The packed path gets the caller's memory (no transposing copy), flagged."""
    from tilegemm.backends import cpu

    a, b = random_operands((200, 300), (300, 250), "float32")
    f_a, f_b = np.asfortranarray(a), np.asfortranarray(b)
    handed = {}
    real = cpu.host_operand_stored

    def spy(x, prob, which, **kw):
        handed[which] = got = real(x, prob, which, **kw)
        return got

    monkeypatch.setattr(cpu, "host_operand_stored", spy)
    got = tilegemm.matmul(f_a, f_b, kernel="blocked", backend="cpu")
    (a3, ta), (b3, tb) = handed["a"], handed["b"]
    assert ta and tb and np.shares_memory(a3, f_a) and np.shares_memory(b3, f_b)
    np.testing.assert_array_equal(got, matmul(a, b))


def test_other_layouts_are_copied_and_correct():
    """Slices with steps and reversed axes are neither C- nor F-ordered: copied."""
    a, b = random_operands((301, 203), (203, 199), "float64")
    x, y = a[::-2, 1::2], b[1::2, ::-1]
    np.testing.assert_allclose(matmul(x, y), x @ y, rtol=1e-12, atol=1e-12 * x.shape[1])
