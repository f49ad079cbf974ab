"""Operands whose rows lie apart on the CPU rung: read in place, with their row stride.

A slice of columns (``w[:, :n]``, ``x[:, 1:]``), whose rows are evenly spaced with each
row's elements contiguous, or the transpose of one, is handed to the blocked rung
uncopied, as a wider C-ordered view whose extra columns the rung never reads (NumPy's BLAS
reads it in place too, with a leading dimension). Every path must give exactly what the
same product of dense operands in the same orientation gives: only where rows start
changes, not the sums. A plain A with rows apart next to a B given transposed is copied
(the rung then takes K from the stored widths). The caller's arrays are never written,
and nothing past an operand's last element is read (a guard page after it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tilegemm
from tilegemm import fastpath, remembered
from tilegemm.problem import row_stride_view
from tilegemm.reference import assert_close, random_operands

DTYPES = ("float32", "float64", "int32", "int64")
SHAPES = [
    (97, 131, 113),    # packed, partial tiles everywhere (primes)
    (300, 257, 700),   # packed, two K panels
    (1, 300, 400),     # one row: the vector path
    (300, 400, 1),     # one column: the vector path
    (5, 6, 7),         # small: the unpacked path
    (200, 1, 200),     # K = 1
    (4, 300, 400),     # a few rows: one tile of all of them, or dot products with B.T
    (12, 300, 400),    # 9-15 rows: the wide tile and a second one (AVX-512)
    (64, 70, 8),       # narrow and small: packed on the calling thread
    (700, 300, 8),     # narrow: unpacked tiles, rows split between threads
]
PAD = 5  # extra columns of the parent array, beside the operand's


def poison(dtype: np.dtype) -> object:
    """What fills the parent around an operand: a read of it shows in the result."""
    return np.nan if dtype.kind == "f" else np.iinfo(dtype).max // 7


def rows_apart(x: np.ndarray, transposed: bool = False) -> np.ndarray:
    """``x``'s values in a matrix whose rows (of its stored form: its transpose's, when
    ``transposed``) lie ``PAD`` elements further apart than its width, at an offset."""
    stored = np.swapaxes(x, -1, -2) if transposed else x
    parent = np.full(stored.shape[:-1] + (stored.shape[-1] + PAD,), poison(x.dtype),
                     x.dtype)
    view = parent[..., 2:2 + stored.shape[-1]]
    view[...] = stored
    return np.swapaxes(view, -1, -2) if transposed else view


def dense_like(x: np.ndarray) -> np.ndarray:
    """A dense array of ``x``'s values in the orientation the rung reads it: C-ordered, or
    Fortran-ordered when ``x`` is the transpose of rows apart."""
    if x.ndim == 2 and x.strides[0] == x.itemsize:
        return np.asfortranarray(x)
    return np.ascontiguousarray(x)


def layouts(a: np.ndarray, b: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {"a rows apart": (rows_apart(a), b), "b rows apart": (a, rows_apart(b)),
            "both": (rows_apart(a), rows_apart(b)),
            "a.T rows apart": (rows_apart(a, True), b),
            "b.T rows apart": (a, rows_apart(b, True)),
            "a rows apart, b.T rows apart": (rows_apart(a), rows_apart(b, True)),
            "both transposed": (rows_apart(a, True), rows_apart(b, True))}


def matmul(a, b, **kw):
    return tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rows_apart_give_the_dense_result_exactly(dtype, shape):
    m, k, n = shape
    a, b = random_operands((m, k), (k, n), dtype)
    for name, (x, y) in layouts(a, b).items():
        before = (x.copy(), y.copy())
        got = matmul(x, y)
        again = matmul(x, y)  # remembered (the fast path) where it qualifies
        want = matmul(dense_like(x), dense_like(y))
        np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(again, want, err_msg=f"{name}, second call")
        np.testing.assert_array_equal(x, before[0])
        np.testing.assert_array_equal(y, before[1])
    assert_close(matmul(rows_apart(a), rows_apart(b)), a, b, what=f"rows apart {shape}")


@pytest.mark.parametrize("dtype", ("float32", "int64"))
@pytest.mark.parametrize(("sa", "sb"), [
    ((3, 70, 90), (3, 90, 110)),     # a batch, packed one product at a time
    ((40, 6, 4), (40, 4, 9)),        # a batch of small products (one run per task)
    ((2, 130, 150), (150, 120)),     # B shared by the batch
    ((3, 5, 300), (3, 300, 400)),    # a batch of few-row products
])
def test_batches(dtype, sa, sb):
    a, b = random_operands(sa, sb, dtype)
    want = matmul(a, b)
    for x, y in ((rows_apart(a), b), (a, rows_apart(b)), (rows_apart(a), rows_apart(b))):
        np.testing.assert_array_equal(matmul(x, y), want)
    # matrices of the batch not rows * ld apart (rows sliced too): copied, still right
    parent = np.full((sa[0], sa[1] + 3, sa[2] + PAD), poison(np.dtype(dtype)), dtype)
    x = parent[:, 1:1 + sa[1], :sa[2]]
    x[...] = a
    np.testing.assert_array_equal(matmul(x, b), want)


def test_rows_apart_reach_the_rung_uncopied(monkeypatch):
    """The rung gets the caller's memory with its row stride; a plain A with rows apart
    beside a transposed B is the one copied."""
    from tilegemm.backends import cpu

    a, b = random_operands((200, 300), (300, 250), "float32")
    handed = {}
    real = cpu.host_operand_stored

    def spy(x, prob, which, **kw):
        handed[which] = got = real(x, prob, which, **kw)
        return got

    monkeypatch.setattr(cpu, "host_operand_stored", spy)
    x, y = rows_apart(a), rows_apart(b, True)
    matmul(x, rows_apart(b))
    (a3, ta), (b3, tb) = handed["a"], handed["b"]
    assert not ta and not tb
    assert np.shares_memory(a3, x) and a3.shape == (1, 200, 300 + PAD)
    assert b3.shape == (1, 300, 250 + PAD) and not a3.flags.writeable
    matmul(rows_apart(a, True), y)
    (a3, ta), (b3, tb) = handed["a"], handed["b"]
    assert ta and tb and a3.shape == (1, 300, 200 + PAD) and b3.shape == (1, 250, 300 + PAD)
    matmul(x, y)
    (a3, ta), (b3, tb) = handed["a"], handed["b"]
    assert tb and not ta and not np.shares_memory(a3, x) and a3.shape == (1, 200, 300)


def test_row_stride_view_takes_only_even_rows_apart():
    base = np.zeros((6, 10), np.float32)
    view = row_stride_view(base[None, :, 2:7])
    assert view.shape == (1, 6, 10) and view.strides == (240, 40, 4)
    assert not view.flags.writeable and np.shares_memory(view, base)
    for other in (base[None, :, ::2],       # elements apart
                  base[None, ::-1, 2:7],    # rows in reverse
                  base[None, :, 3:4],       # one column: copied, cheap
                  np.zeros((2, 6, 10), np.float32)[:, :4, :5]):  # matrices not rows apart
        assert row_stride_view(other) is None


def test_the_fast_path_reads_each_calls_own_row_stride():
    """A remembered case is keyed by shape and layout, not by the row stride: a later call
    with rows further apart must be read with its own."""
    remembered.forget()
    a, b = random_operands((40, 70), (70, 90), "float64")
    want = matmul(a, b)
    for pad in (3, 11, 1):
        parent = np.full((70, 90 + pad), np.nan)
        y = parent[:, pad:]
        y[...] = b
        np.testing.assert_array_equal(matmul(a, y), want, err_msg=f"pad {pad}")
    assert any(case.wb and not case.wa for case in fastpath._table.values())


GUARDED = """
import ctypes, mmap, sys
import numpy as np, tilegemm

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def guarded(rows, cols, ld, dtype):
    '''A (rows, cols) matrix, rows ld apart, whose last element is the last before a page
    that may not be read.'''
    item = np.dtype(dtype).itemsize
    span = ((rows - 1) * ld + cols) * item
    pages = -(-span // PAGE) + 1
    buf = mmap.mmap(-1, (pages + 1) * PAGE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(start + pages * PAGE, PAGE, 0) == 0  # PROT_NONE
    flat = np.frombuffer(buf, dtype=dtype, count=pages * PAGE // item)
    tail = flat[flat.size - span // item:]
    x = np.lib.stride_tricks.as_strided(tail, shape=(rows, cols), strides=(ld * item, item))
    x[...] = np.random.default_rng(rows).uniform(0.5, 1.5, (rows, cols))
    return x


for dtype in ("float32", "float64"):
    for m, k, n in ((1, 300, 257), (300, 257, 1), (3, 300, 257), (12, 300, 257),
                    (5, 6, 7), (64, 70, 9), (97, 131, 113), (300, 257, 700)):
        a, b = guarded(m, k, k + 37, dtype), guarded(k, n, n + 29, dtype)
        at = guarded(k, m, m + 13, dtype).T
        bt = guarded(n, k, k + 19, dtype).T
        for x, y in ((a, b), (at, b), (a, bt), (at, bt)):
            got = tilegemm.matmul(x, y, kernel="blocked", backend="cpu")
            want = x.astype(np.float64) @ y.astype(np.float64)
            assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * k), (dtype, m, k, n)
print("ok")
"""


@pytest.mark.slow
def test_nothing_past_the_last_element_is_read():
    """Every path on operands (plain and transposed, rows apart) that end just before an
    unreadable page: a read past the last element kills the process."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(GUARDED)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode,
                                                                run.stderr[-2000:])


def test_out_beside_an_operand_in_the_same_parent():
    """``out`` the other half of the parent whose first half is B (rows interleaved with
    B's): the product is B's, not a mix with what is written, on the first call and on a
    remembered one."""
    a, b = random_operands((300, 200), (200, 256), "float32")
    want = matmul(a, b)
    parent = np.full((200, 512), np.nan, np.float32)
    parent[:, :256] = b
    out = parent[:, 256:]  # 200 × 256: the product of a's first 200 rows lands here
    x = a[:200]
    for _ in range(2):
        parent[:, 256:] = np.nan
        got = tilegemm.matmul(x, parent[:, :256], out=out, kernel="blocked", backend="cpu")
        assert got is out
        np.testing.assert_array_equal(out, want[:200])
        np.testing.assert_array_equal(parent[:, :256], b)
