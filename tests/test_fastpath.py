"""Repeated host products reuse the full path's decision (tilegemm.fastpath): the second
call of a case skips straight to the compiled rung, gives the same result, and anything
that differs from the remembered case takes the full path with all its checks. Calls are
counted (the full path is replaced by a spy), never timed."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tilegemm
from tilegemm import api, fastpath, remembered
from tilegemm._environ import environ_reader
from tilegemm.reference import assert_close


@pytest.fixture
def spy(count_calls):
    """Counts the calls that take the full path."""
    remembered.forget()
    yield count_calls(api, "_full_gemm")
    remembered.forget()


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


def test_poison_follows_the_environment_on_remembered_calls(spy, rng, monkeypatch):
    """The remembered call reads TILEGEMM_POISON as base.poison_enabled() does: unset, ""
    and "0" are off. A rung that writes nothing shows what the call filled."""
    a, b = _operands(rng, 8, 8, 8, np.float64)
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    tilegemm.matmul(a, b)
    key = fastpath._key(a, b, "auto", "auto")
    fastpath._table[key] = fastpath._table[key]._replace(program=lambda *args: None,
                                                         fill=42.0)
    # (the unfilled cases first: a fresh result may reuse a filled one's memory)
    for value, filled in ((None, False), ("", False), ("0", False), ("1", True),
                          ("yes", True)):
        if value is None:
            monkeypatch.delenv("TILEGEMM_POISON", raising=False)
        else:
            monkeypatch.setenv("TILEGEMM_POISON", value)
        assert (tilegemm.matmul(a, b) == 42.0).all() == filled, value
    assert len(spy) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("shape", [(8, 8, 8), (3, 5, 7), (1, 100, 100), (100, 100, 1),
                                   (64, 64, 64)])
def test_small_plain_matrix_products_take_the_rungs_own_call(spy, rng, shape, dtype,
                                                             monkeypatch):
    """A remembered small product of two C-ordered matrices runs the CPU rung's
    ``small_matrix`` (one compiled call that allocates the result), with the full path's
    bits, into a fresh writable C-ordered array each call (without TILEGEMM_POISON: see
    below)."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    m, k, n = shape
    a = (rng.standard_normal((m, k)) * 8).astype(dtype)
    b = (rng.standard_normal((k, n)) * 8).astype(dtype)
    first = tilegemm.matmul(a, b)
    case = fastpath._table[fastpath._key(a, b, "auto", "auto")]
    mod = sys.modules[case.program.__module__]
    assert case.entry is mod.small_matrix and case.blocks == case.program.bound
    seen = []
    real = case.entry
    fastpath._table[fastpath._key(a, b, "auto", "auto")] = case._replace(
        entry=lambda *args: seen.append(1) or real(*args))
    second, third = tilegemm.matmul(a, b), tilegemm.matmul(a, b)
    assert len(spy) == 1 and len(seen) == 2
    np.testing.assert_array_equal(second, first)
    assert second.shape == (m, n) and second.dtype == dtype and not np.shares_memory(second,
                                                                                    third)
    assert second.flags.c_contiguous and second.flags.writeable
    if dtype == np.int64:
        np.testing.assert_array_equal(second, a @ b)
    else:
        assert_close(second, a, b)


@pytest.mark.parametrize("shapes", [((8,), (8, 5)), ((5, 8), (8,)), ((300,), (300, 200))])
def test_small_products_with_a_vector_take_the_rungs_own_call(spy, rng, shapes, monkeypatch):
    """A 1-D operand is viewed as a row (or a column) for the rung's own call, and the
    result has NumPy's shape (that dimension dropped), with the full path's bits."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    sa, sb = shapes
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    first = tilegemm.matmul(a, b)
    case = fastpath._table[fastpath._key(a, b, "auto", "auto")]
    assert case.entry is not None
    seen = []
    real = case.entry
    fastpath._table[fastpath._key(a, b, "auto", "auto")] = case._replace(
        entry=lambda *args: seen.append(1) or real(*args))
    second = tilegemm.matmul(a, b)
    assert len(spy) == 1 and len(seen) == 1
    assert second.shape == np.matmul(a, b).shape == first.shape
    np.testing.assert_array_equal(second, first)
    assert_close(second, a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize(("sa", "sb", "which"), [
    ((64, 64), (64, 64), "b"), ((37, 29), (29, 41), "a"), ((7, 50), (50, 9), "ab"),
    ((50,), (50, 30), "b"), ((30, 50), (50,), "a")])
def test_small_products_of_slices_take_the_rungs_own_call_on_copies(spy, rng, sa, sb,
                                                                     which, dtype,
                                                                     monkeypatch):
    """A small remembered product of a slice of columns (``w[:, :n]``, rows apart) copies
    it and runs the rung's own call, with the bits of the full path, which reads the slice
    in place; the caller's arrays are left as they were."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)

    def operand(shape: tuple[int, ...], sliced: bool) -> np.ndarray:
        wide = (rng.standard_normal(shape[:-1] + (shape[-1] + 5,)) * 8).astype(dtype)
        if sliced and len(shape) == 2:
            return wide[:, 3:3 + shape[-1]]
        return wide[..., :shape[-1]].copy()

    a, b = operand(sa, "a" in which), operand(sb, "b" in which)
    before = (a.copy(), b.copy())
    first = tilegemm.matmul(a, b)
    case = fastpath._table[fastpath._key(a, b, "auto", "auto")]
    assert case.entry is not None
    copied = []
    real_copy = np.ascontiguousarray
    monkeypatch.setattr(fastpath, "_dense", lambda x: copied.append(x.flags.c_contiguous)
                        or real_copy(x))
    remembered.forget()
    tilegemm.matmul(a, b)  # remembered again, with the counting copy
    second = tilegemm.matmul(a, b)
    assert len(spy) == 2 and False in copied, copied
    np.testing.assert_array_equal(second, first)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])
    if dtype == np.int64:
        np.testing.assert_array_equal(second, np.matmul(a, b))
    else:
        assert_close(second, a, b)


def test_large_products_of_slices_are_read_in_place(spy, rng, monkeypatch):
    """Beyond the calling thread's size a slice is not copied (a 2000x1000 matrix to copy
    for a product of a row): the bound program reads it in place."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    w = rng.standard_normal((2000, 1600)).astype(np.float32)
    for a, b in ((rng.standard_normal((1, 2000)).astype(np.float32), w[:, :1000]),
                 (w[:1000, :1500], rng.standard_normal((1500, 1)).astype(np.float32))):
        tilegemm.matmul(a, b)
        assert fastpath._table[fastpath._key(a, b, "auto", "auto")].entry is None


@pytest.mark.parametrize("shapes", [
    ((2, 8, 8), (2, 8, 8)),         # a batch
    ((8,), (2, 8, 8)),              # a vector times a batch
    ((200, 200), (200, 200)),       # beyond the calling thread's size: the threads
])
def test_other_remembered_products_keep_the_bound_program(spy, rng, shapes):
    sa, sb = shapes
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    tilegemm.matmul(a, b)
    assert fastpath._table[fastpath._key(a, b, "auto", "auto")].entry is None
    f = np.asfortranarray(rng.standard_normal((200, 200)))  # transposed, on the threads
    tilegemm.matmul(f, f)
    assert fastpath._table[fastpath._key(f, f, "auto", "auto")].entry is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("shape", [(8, 8, 8), (3, 5, 7), (64, 64, 64), (17, 40, 9),
                                   (5, 30, 60)])
@pytest.mark.parametrize("layout", ["at", "bt", "f"])
def test_small_products_of_transposed_matrices_take_the_rungs_own_call(spy, rng, shape,
                                                                       dtype, layout,
                                                                       monkeypatch):
    """A remembered small product with an operand given as its transpose (``x.T``, a
    Fortran-ordered matrix) runs the CPU rung's ``small_matrix_transposed`` on the
    operands' storages, with the full path's bits and NumPy's integers; a few rows of A
    given transposed (copied first by the full path) keep the bound program."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    m, k, n = shape
    a = (rng.standard_normal((m, k)) * 8).astype(dtype)
    b = (rng.standard_normal((k, n)) * 8).astype(dtype)
    if layout in ("at", "f"):
        a = np.ascontiguousarray(a.T).T
    if layout in ("bt", "f"):
        b = np.ascontiguousarray(b.T).T
    full = tilegemm.matmul(a, b)  # the full path, which remembers the case
    first = tilegemm.matmul(a, b)
    case = fastpath._table[fastpath._key(a, b, "auto", "auto")]
    mod = sys.modules[case.program.__module__]
    few = layout != "bt" and 2 <= m < mod.FEW_ROWS and n > mod.NARROW_N
    if few:
        assert case.entry is None
        return
    assert case.entry is not None
    seen = []
    real = mod.small_matrix_transposed
    monkeypatch.setattr(mod, "small_matrix_transposed", lambda *args: seen.append(args[2])
                        or real(*args))
    remembered.forget()
    tilegemm.matmul(a, b)  # remembered again, with the counting call
    second = tilegemm.matmul(a, b)
    assert len(spy) == 2 and seen == [{"at": 1, "bt": 2, "f": 3}[layout]]
    for got in (first, second):
        np.testing.assert_array_equal(got, full)
        assert got.shape == (m, n) and got.dtype == dtype and got.flags.c_contiguous
    # the plain operands' sums, but for a few rows times B given transposed: dot products
    # (few_rows), whose lanes are added in a tree
    if not (layout == "bt" and 2 <= m < mod.DOT_MAX and n > mod.NARROW_N):
        plain_a, plain_b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        np.testing.assert_array_equal(second, tilegemm.matmul(plain_a, plain_b))
        c = (rng.standard_normal((m, n)) * 8).astype(dtype)
        alpha, beta = (3, 2) if dtype == np.int64 else (1.5, -0.5)
        np.testing.assert_array_equal(tilegemm.gemm(a, b, c, alpha=alpha, beta=beta),
                                      tilegemm.gemm(plain_a, plain_b, c, alpha=alpha, beta=beta))
    if dtype == np.int64:
        np.testing.assert_array_equal(second, np.matmul(a, b))
    else:
        assert_close(second, a, b)


@pytest.mark.parametrize("shapes", [((1, 1500), (1500, 1000)), ((1000, 1500), (1500, 1)),
                                    ((1500,), (1500, 1000)), ((1000, 1500), (1500,))])
def test_threaded_vector_products_take_the_rungs_own_call(spy, rng, shapes, monkeypatch):
    """A remembered product of a row or a column beyond the calling thread's share runs
    the CPU rung's ``vector_matrix`` (the threads' vector path with none of the full
    path's decisions): the full path's bits, the direction still flipped on every call."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    sa, sb = shapes
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    first = tilegemm.matmul(a, b)
    case = fastpath._table[fastpath._key(a, b, "auto", "auto")]
    mod = sys.modules[case.program.__module__]
    assert case.entry is not None
    called = []
    real_call = mod.vector_matrix
    monkeypatch.setattr(mod, "vector_matrix", lambda *args: called.append(1) or real_call(*args))
    remembered.forget()
    first = tilegemm.matmul(a, b)  # remembered again, with the counting vector_matrix
    flags = []
    real = mod.gemv_threads
    monkeypatch.setattr(mod, "gemv_threads", lambda *args: (flags.append(args[-1]),
                                                            real(*args)))
    got = [tilegemm.matmul(a, b) for _ in range(3)]
    assert len(spy) == 2 and len(called) == 3, (len(spy), called)
    assert len(flags) == 3 and flags[0] != flags[1] != flags[2], flags
    for g in got:
        np.testing.assert_array_equal(g, first)
        assert g.shape == first.shape and g.flags.c_contiguous and g.flags.writeable
    assert not np.shares_memory(got[0], got[1])
    assert_close(first, a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("sa", "sb", "transposed"), [
    ((1, 37), (41, 37), "b"), ((37,), (41, 37), "b"),          # x @ W.T, on the calling thread
    ((41, 37), (41,), "a"), ((41, 37), (41, 1), "a"),          # X.T @ v
    ((1, 1500), (1000, 1500), "b"), ((1500,), (1000, 1500), "b"),  # on the threads
    ((1500, 1000), (1500, 1), "a")])
def test_a_vector_times_a_transposed_matrix_takes_the_rungs_own_call(spy, rng, sa, sb,
                                                                    transposed, dtype,
                                                                    monkeypatch):
    """``x @ W.T`` (a linear layer's weights W stored (outputs, inputs)) and ``X.T @ v``
    run as the other vector product on the matrix's own storage, as the full path hands
    them to the rung: remembered as the rung's own call, with the full path's bits, NumPy's
    shape, and the caller's arrays untouched (W is never copied)."""
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    a = rng.standard_normal(sa).astype(dtype)
    b = rng.standard_normal(sb).astype(dtype)
    a, b = (a.T, b) if transposed == "a" else (a, b.T)
    assert not (a if transposed == "a" else b).flags.c_contiguous
    before = (a.copy(), b.copy())
    first = tilegemm.matmul(a, b)
    key = fastpath._key(a, b, "auto", "auto")
    case = fastpath._table[key]
    assert case.entry is not None, "the remembered case has no call of its own"
    seen = []
    real = case.entry
    fastpath._table[key] = case._replace(entry=lambda *args: seen.append(1) or real(*args))
    copies = []
    real_copy = np.ascontiguousarray
    monkeypatch.setattr(np, "ascontiguousarray", lambda x, *args, **kw: copies.append(x.shape)
                        or real_copy(x, *args, **kw))
    second = tilegemm.matmul(a, b)
    assert len(spy) == 1 and len(seen) == 1 and not copies, (len(spy), seen, copies)
    assert second.shape == np.matmul(a, b).shape == first.shape
    assert second.flags.c_contiguous and second.flags.writeable
    assert not np.shares_memory(second, first)
    np.testing.assert_array_equal(second, first)
    assert_close(second, a, b)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


def test_poison_takes_the_bound_program_not_the_small_call(spy, rng, monkeypatch):
    """Under TILEGEMM_POISON the result is allocated and filled in Python, so the small
    call, which allocates its own, is passed over."""
    a, b = _operands(rng, 8, 8, 8, np.float32)
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    tilegemm.matmul(a, b)
    key = fastpath._key(a, b, "auto", "auto")

    def refuse(*args):
        raise AssertionError("the small call ran")

    fastpath._table[key] = fastpath._table[key]._replace(entry=refuse)
    monkeypatch.setenv("TILEGEMM_POISON", "1")
    assert_close(tilegemm.matmul(a, b), a, b)
    monkeypatch.delenv("TILEGEMM_POISON")
    with pytest.raises(AssertionError, match="the small call ran"):
        tilegemm.matmul(a, b)
    assert len(spy) == 1


def test_environment_reads_see_every_change_through_os_environ(monkeypatch):
    name = "TILEGEMM_TEST_FASTPATH_READER"
    read, encode = environ_reader(name)
    monkeypatch.delenv(name, raising=False)
    assert read() is None
    monkeypatch.setenv(name, "one")
    assert read() == encode("one")
    os.environ[name] = "two"
    assert read() == encode("two") != encode("one")
    del os.environ[name]
    assert read() is None


@pytest.mark.parametrize("layout", ["C", "F a", "F b", "F both"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (65, 64, 64), (131, 97, 67), (1, 300, 70)])
def test_any_size_and_transposed_storage_are_remembered(spy, rng, shape, layout):
    """Above the old 64³ limit too, and Fortran-ordered operands (read in place by the
    CPU rung): one full-path call per case, then the rung directly, same results."""
    m, k, n = shape

    def operands():
        a, b = _operands(rng, m, k, n, np.float32)
        if "a" in layout or "both" in layout:
            a = np.asfortranarray(a)
        if "b" in layout or "both" in layout:
            b = np.asfortranarray(b)
        return a, b

    for got, a, b in _three_calls(spy, operands):
        assert got.flags.c_contiguous and got.shape == (m, n)
        assert_close(got, a, b)


@pytest.mark.parametrize("shapes", [((3, 20, 30), (3, 30, 10)), ((3, 20, 30), (30, 10)),
                                    ((20, 30), (2, 3, 30, 10)), ((1, 32, 32), (1, 32, 32)),
                                    ((256, 16, 16), (256, 16, 16)), ((30,), (4, 30, 10)),
                                    ((2, 200, 150), (2, 150, 170))])
@pytest.mark.parametrize("layout", ["a", "b", "both"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_batches_given_transposed_are_remembered(spy, rng, shapes, layout, dtype):
    """A batch given as the transpose of a C-ordered one in its last two axes
    (``np.swapaxes``, ``.mT``: attention's ``q @ k.mT``) is read in place by the CPU rung;
    its repeated calls skip the full path and give its bits."""
    sa, sb = shapes

    def operand(shape, transposed):
        x = (rng.standard_normal(shape) * 8).astype(dtype)
        if transposed and len(shape) > 1:
            x = np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)
        return x

    results = []
    for _ in range(3):
        a = operand(sa, layout in ("a", "both"))
        b = operand(sb, layout in ("b", "both"))
        results.append((tilegemm.matmul(a, b), tilegemm.gemm(a, b), a, b))
    assert len(spy) == 1, "a repeated call took the full path"
    for got, full, a, b in results:
        assert got.flags.c_contiguous and got.shape == np.matmul(a, b).shape
        np.testing.assert_array_equal(got, full)
        if dtype == np.int64:
            np.testing.assert_array_equal(got, np.matmul(a, b))
        else:
            assert_close(got, a, b)


@pytest.mark.parametrize("shapes", [((3, 20, 30), (3, 30, 10)), ((3, 20, 30), (30, 10)),
                                    ((20, 30), (2, 3, 30, 10)), ((2, 3, 1, 30), (2, 3, 30, 7)),
                                    ((30,), (30, 10)), ((20, 30), (30,)), ((1, 30), (30,)),
                                    ((30,), (2, 3, 30, 10)), ((3, 20, 30), (30,)),
                                    ((300,), (300, 1000)), ((1000, 300), (300,))])
@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_batches_and_integers_are_remembered(spy, rng, shapes, dtype):
    """Batches, one matrix for all products, and vectors (NumPy's 1-D rules: the result
    drops the vector's unit dimension), small products and the vector path's sizes."""
    sa, sb = shapes
    for _ in range(3):
        a = rng.integers(-9, 9, sa).astype(dtype) if dtype == np.int32 else rng.standard_normal(sa)
        b = rng.integers(-9, 9, sb).astype(dtype) if dtype == np.int32 else rng.standard_normal(sb)
        got = tilegemm.matmul(a, b)
        assert got.shape == np.matmul(a, b).shape and got.dtype == dtype
        if dtype == np.int32:
            np.testing.assert_array_equal(got, np.matmul(a, b))
            assert got.dtype == np.int32
        else:
            assert_close(got, a, b)
    assert len(spy) == 1


def _set_poison(monkeypatch, poison):
    """TILEGEMM_POISON set to ``poison``, or unset for None (small products then take the
    rung's own call, ``entry``, else the bound program, ``_run``)."""
    if poison is None:
        monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    else:
        monkeypatch.setenv("TILEGEMM_POISON", poison)


def _three_calls(spy, operands, **kwargs):
    """``matmul(a, b, **kwargs)`` on three fresh ``operands()``, of which only the first
    takes the full path; [(result, a, b)] of each."""
    results = []
    for _ in range(3):
        a, b = operands()
        results.append((tilegemm.matmul(a, b, **kwargs), a, b))
    assert len(spy) == 1, "a repeated call took the full path"
    return results


def _repeated_with_the_full_paths_bits(spy, operands, result_dtype, poison, monkeypatch,
                                       **kwargs):
    """Three calls (:func:`_three_calls`, ``kwargs`` given to each) with TILEGEMM_POISON
    set to ``poison`` (:func:`_set_poison`): each result is right and of ``result_dtype``,
    and the last one's bits are the full path's. Returns the last (result, a, b)."""
    _set_poison(monkeypatch, poison)
    results = _three_calls(spy, operands, **kwargs)
    for got, a, b in results:
        assert got.dtype == result_dtype and got.shape == np.matmul(a, b).shape
        assert_close(got, a, b)
    remembered.forget()
    got, a, b = results[-1]
    np.testing.assert_array_equal(tilegemm.matmul(a, b, **kwargs), got)  # the full path
    return results[-1]


@pytest.mark.parametrize(("sa", "sb"), [((8, 8), (8, 8)), ((7, 13), (13, 5)),
                                      ((1, 300), (300, 40)), ((30,), (30, 7)), ((40, 30), (30,)),
                                      ((130, 70), (70, 129)), ((3, 20, 30), (3, 30, 10))])
@pytest.mark.parametrize("narrow", ["a", "b"])
@pytest.mark.parametrize("layout", ["C", "a.T", "b.T"])
@pytest.mark.parametrize("poison", [None, "1"])
def test_float32_with_float64_is_remembered_with_the_full_paths_bits(spy, rng, sa, sb,
                                                                      narrow, layout, poison,
                                                                      monkeypatch):
    """NumPy computes float32 with float64 in float64; the full path hands the rung a
    C-ordered float64 copy of the float32 operand, and so does a remembered call, which
    took the full path every time before (115 µs for 8³ against 2.8 for two float64
    operands). The other operand keeps its layout."""
    def operands():
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        if layout == "a.T" and a.ndim == 2:
            a = np.ascontiguousarray(a.T).T
        if layout == "b.T" and b.ndim == 2:
            b = np.ascontiguousarray(b.T).T
        return (a.astype(np.float32), b) if narrow == "a" else (a, b.astype(np.float32))

    got, a, b = _repeated_with_the_full_paths_bits(spy, operands, np.float64, poison,
                                                   monkeypatch)
    c = rng.standard_normal(got.shape)
    scaled = tilegemm.gemm(a, b, c, alpha=0.5, beta=-1.0)  # remembered (float64 c)
    assert len(spy) == 2
    remembered.forget()
    np.testing.assert_array_equal(scaled, tilegemm.gemm(a, b, c, alpha=0.5, beta=-1.0))


@pytest.mark.parametrize(("sa", "sb"), [((3, 8, 8), (1, 8, 8)), ((1, 8, 8), (3, 8, 8)),
                                      ((1, 1, 9, 7), (4, 7, 5)), ((2, 3, 9, 7), (1, 1, 7, 5)),
                                      ((5, 9, 7), (1, 1, 7, 5)), ((4, 9, 7), (1, 1, 1, 7, 5))])
@pytest.mark.parametrize("layout", ["C", "a.mT", "b.mT"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("poison", [None, "1"])
def test_a_batch_of_one_is_remembered_with_the_full_paths_bits(spy, rng, sa, sb, layout,
                                                               dtype, poison, monkeypatch):
    """One operand a batch of a single product (every leading dimension 1), the other a
    batch: the same matrix for every product, as a 2-D operand is, handed to the rung as
    such; the result has NumPy's broadcast shape ((1, 1) with (4,) is (1, 4))."""
    def operands():
        a, b = rng.integers(-5, 6, sa).astype(dtype), rng.integers(-5, 6, sb).astype(dtype)
        if dtype == np.float32:
            a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
        if layout == "a.mT":
            a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
        if layout == "b.mT":
            b = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)
        return a, b

    _repeated_with_the_full_paths_bits(spy, operands, dtype, poison, monkeypatch)


@pytest.mark.parametrize(("sa", "sb"), [((8, 8), (8, 8)), ((7, 13), (13, 5)),
                                      ((1, 300), (300, 40)), ((30,), (30, 7)),
                                      ((130, 70), (70, 129)), ((3, 20, 30), (3, 30, 10))])
@pytest.mark.parametrize("layout", ["C", "a.T"])
@pytest.mark.parametrize("poison", [None, "1"])
def test_float16_is_remembered_with_the_full_paths_bits(spy, rng, sa, sb, layout, poison,
                                                        monkeypatch):
    """float16 operands are computed in float32 and the result rounded to float16: a
    remembered call converts both operands and rounds the result as the full path does,
    which it took every time before (136 µs for 8³, NumPy 3.7)."""
    def operands():
        a = rng.standard_normal(sa).astype(np.float16)
        if layout == "a.T" and a.ndim == 2:
            a = np.ascontiguousarray(a.T).T
        return a, rng.standard_normal(sb).astype(np.float16)

    _repeated_with_the_full_paths_bits(spy, operands, np.float16, poison, monkeypatch)


_PAIRS = [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float32"),
          ("float16", "float64"), ("int32", "int64"), ("int8", "int8"), ("uint8", "int16"),
          ("bool", "bool"), ("float32", "int32"), ("uint64", "uint64"), ("int64", "uint64")]


@pytest.mark.parametrize(("sa", "sb"), [((8, 8), (8, 8)), ((7, 13), (13, 5)),
                                      ((30,), (30, 7)), ((130, 70), (70, 129)),
                                      ((3, 20, 30), (3, 30, 10))])
@pytest.mark.parametrize("pair", _PAIRS, ids="@".join)
@pytest.mark.parametrize("poison", [None, "1"])
def test_other_dtypes_are_remembered_with_the_full_paths_bits(spy, rng, sa, sb, pair, poison,
                                                              monkeypatch):
    """Operands of any dtypes NumPy's matmul takes, the same or two: converted to the dtype
    the full path computes in, and the result to NumPy's result dtype (bfloat16 gives
    float32, int8 wraps in int8, bool is any product true, int64 with uint64 is float64),
    as the full path converts them. Each such call took the full path before (125-130 µs
    at 8³ against NumPy's 1-2)."""
    da, db = (np.dtype(name) for name in pair)

    def operands():
        a, b = rng.integers(-3, 4, sa), rng.integers(-3, 4, sb)
        if da.kind == "f" or da.name == "bfloat16":
            a = rng.standard_normal(sa)
        if db.kind == "f" or db.name == "bfloat16":
            b = rng.standard_normal(sb)
        if da.kind == "u":
            a = np.abs(a)
        if db.kind == "u":
            b = np.abs(b)
        return a.astype(da), b.astype(db)

    a, b = operands()
    _repeated_with_the_full_paths_bits(spy, operands, np.matmul(a, b).dtype, poison,
                                       monkeypatch)


@pytest.mark.parametrize("dtype", ["int8", "float16", "bool"])
@pytest.mark.parametrize("poison", [None, "1"])
def test_a_narrowed_result_is_copied_into_out(spy, rng, dtype, poison, monkeypatch):
    """A result the full path converts (int8 from int32 sums, float16 from float32, bool
    from counts) is computed into a new array and converted into ``out`` on a remembered
    call, as the full path copies it; an ``out`` of the computed dtype, or one sharing
    memory with an operand, takes the full path."""
    _set_poison(monkeypatch, poison)
    a, b = rng.integers(-3, 4, (9, 8)), rng.integers(-3, 4, (8, 7))
    if dtype == "float16":
        a, b = rng.standard_normal((9, 8)), rng.standard_normal((8, 7))
    a, b = a.astype(dtype), b.astype(dtype)
    out = np.zeros((9, 7), dtype)
    for _ in range(3):
        b = b[::-1].copy()  # fresh data, the same case
        assert tilegemm.matmul(a, b, out=out) is out
        np.testing.assert_array_equal(out, tilegemm.matmul(a, b))  # (new result, remembered)
    assert len(spy) == 1
    remembered.forget()
    want = tilegemm.matmul(a, b)
    np.testing.assert_array_equal(out, want)  # the full path's bits
    assert_close(out, a, b)
    wide = np.zeros((9, 7), np.float64 if dtype == "float16" else np.int32)
    tilegemm.matmul(a, b, out=wide)  # the computed dtype's own out: the full path
    shared = np.concatenate([b.ravel()[:7], b.ravel()])  # b's values, a row in front
    b2, out2 = shared[7:].reshape(8, 7), shared[:63].reshape(9, 7)
    want = tilegemm.matmul(a, b2.copy())
    tilegemm.matmul(a, b2, out=out2)  # out shares memory with b: the full path
    np.testing.assert_array_equal(out2, want)
    assert len(spy) == 4


@pytest.mark.parametrize(("pair", "asked"), [
    (("int8", "int8"), np.int32), (("float16", "float16"), np.float32),
    (("bfloat16", "bfloat16"), "float32"), (("bool", "bool"), np.dtype(np.int32)),
    (("float32", "float32"), np.float64), (("int8", "int8"), "int8"),
    (("float16", "float16"), np.float16), (("int32", "int32"), "int8")], ids=str)
@pytest.mark.parametrize("poison", [None, "1"])
def test_a_dtype_argument_is_part_of_the_case(spy, rng, pair, asked, poison, monkeypatch):
    """``dtype=`` (int8 summed in int32, float16 or bfloat16 kept in float32: the usual
    way to keep the sums of narrow operands) is remembered with the case it names, and
    computed as the full path computes it (int32 operands with ``dtype="int8"``: converted
    nothing, the result wrapped); the same operands without it are a case of their
    own."""
    da, db = (np.dtype(name) for name in pair)
    sa, sb = (9, 30), (30, 7)

    def operand(shape, dtype):
        if dtype.kind in "iub":
            return rng.integers(0 if dtype.kind == "b" else -3, 2 if dtype.kind == "b" else 4,
                                shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)

    _, a, b = _repeated_with_the_full_paths_bits(
        spy, lambda: (operand(sa, da), operand(sb, db)), np.dtype(asked), poison,
        monkeypatch, dtype=asked)  # (then decided again, by the full path)
    plain = tilegemm.matmul(a, b)
    assert len(spy) == 3 and plain.dtype == np.matmul(a, b).dtype  # a case of its own


def test_a_dtype_argument_that_rounds_the_operands_is_decided_every_time(spy, rng):
    """``dtype=np.float32`` with float64 operands rounds them on the way in, which the full
    path does with NumPy's overflow warnings (at the caller's line), and
    ``dtype=np.float16`` with float32 ones rounds them through float16 before computing in
    float32 (NumPy's digits): never remembered."""
    a, b = _operands(rng, 8, 8, 8, np.float32)
    for _ in range(3):
        got = tilegemm.matmul(a, b, dtype=np.float16)
    assert len(spy) == 3 and got.dtype == np.float16
    np.testing.assert_array_equal(got, np.matmul(a, b, dtype=np.float16))
    a, b = _operands(rng, 8, 8, 8, np.float64)
    for _ in range(3):
        got = tilegemm.matmul(a, b, dtype=np.float32)
    assert len(spy) == 6 and got.dtype == np.float32
    a[0, 0] = 1e300
    with pytest.warns(RuntimeWarning, match="overflow encountered in cast"):
        tilegemm.matmul(a, b, dtype=np.float32)


_ANY = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool"]


@pytest.mark.parametrize("asked", [None, np.float32, np.float16, np.int32, "int8"], ids=str)
@pytest.mark.parametrize("poison", [None, "1"])
def test_remembered_calls_give_the_full_paths_bits_for_any_dtypes(rng, asked, poison,
                                                                  monkeypatch):
    """Every pair of operand dtypes, with and without ``dtype=``: a repeated call, taken by
    the fast path where the case qualifies (by the rung's own call without poisoning),
    gives the full path's bits and dtype (and any error the full path gives). A random
    search over such calls found a remembered ``dtype=np.float16`` product of float32
    operands that skipped NumPy's rounding of the operands through float16, and one of
    int32 operands with ``dtype="int8"`` whose own call left the result unconverted; this
    keeps every pair."""
    _set_poison(monkeypatch, poison)
    remembered_cases = 0
    for da in _ANY:
        for db in _ANY:
            def operand(shape, dtype, transposed):
                x = rng.integers(0, 2 if dtype == "bool" else 4, shape).astype(dtype)
                if dtype[0] in "fb" and dtype != "bool":
                    x = rng.standard_normal(shape).astype(dtype)
                return np.ascontiguousarray(x.T).T if transposed else x

            a = operand((9, 30), da, bool(rng.integers(2)))
            b = operand((30, 7), db, bool(rng.integers(2)))
            kw = {} if asked is None else {"dtype": asked}
            remembered.forget()
            try:
                full = tilegemm.matmul(a, b, **kw)
            except (TypeError, ValueError):
                with pytest.raises((TypeError, ValueError)):
                    tilegemm.matmul(a, b, **kw)
                continue
            again = tilegemm.matmul(a, b, **kw)
            remembered_cases += len(fastpath._table)
            assert again.dtype == full.dtype, (da, db, asked)
            np.testing.assert_array_equal(again, full, err_msg=f"{da} @ {db}, dtype={asked}")
    assert remembered_cases >= (40 if asked is None else 1)  # (so the fast path was taken)


def test_bfloat16_gives_float32_written_into_out_and_scaled(spy, rng):
    """bfloat16 operands give float32 sums, which a remembered call writes into a float32
    ``out`` and applies gemm's alpha and beta to, as the full path does."""
    x, w = (rng.standard_normal(s).astype("bfloat16") for s in ((9, 8), (7, 8)))
    out, c = np.zeros((9, 7), np.float32), rng.standard_normal(7).astype(np.float32)
    for _ in range(2):
        assert tilegemm.matmul(x, w.T, out=out) is out
        got = tilegemm.gemm(x, w, c, alpha=0.5, beta=2.0, trans_b=True)
    assert len(spy) == 1  # the first matmul only: gemm's x @ w.T is the same case
    assert_close(out, x, w.T)
    remembered.forget()
    np.testing.assert_array_equal(got, tilegemm.gemm(x, w, c, alpha=0.5, beta=2.0,
                                                     trans_b=True))


def test_float16_overflow_warns_at_the_callers_line_and_scaled_gemm_is_decided(spy):
    """The rounding to float16 overflows as NumPy's does: inf, with NumPy's warning naming
    the line that called tilegemm, on a remembered call too, into ``out`` as well. A scaled
    gemm (its scalars rounded to float16 first) is not remembered."""
    a = np.full((8, 8), 100, np.float16)
    with pytest.warns(RuntimeWarning, match="overflow encountered in cast") as first:
        tilegemm.matmul(a, a)
    with pytest.warns(RuntimeWarning, match="overflow encountered in cast") as second:
        got = tilegemm.matmul(a, a)
    out = np.zeros((8, 8), np.float16)
    with pytest.warns(RuntimeWarning, match="overflow encountered in cast") as third:
        tilegemm.matmul(a, a, out=out)
    assert len(spy) == 1 and np.isinf(got).all() and np.isinf(out).all()
    assert second[0].filename == third[0].filename == __file__  # (not the spy's wrapper)
    assert first[0].message.args == second[0].message.args == third[0].message.args
    for _ in range(2):
        tilegemm.matmul(a / 100, a / 100, out=out)
        tilegemm.gemm(a / 100, a / 100, alpha=0.5)
    assert len(spy) == 3
    np.testing.assert_array_equal(out, np.full((8, 8), 8, np.float16))


def test_vector_dot_vector_stays_a_scalar(spy, rng):
    """x @ y is a NumPy scalar, which the full path makes: never remembered."""
    for _ in range(2):
        x, y = rng.standard_normal(50), rng.standard_normal(50)
        got = tilegemm.matmul(x, y)
        assert type(got) is np.float64 and np.isclose(got, x @ y)
    assert len(spy) == 2


def test_a_remembered_vector_product_writes_out_of_the_result_shape(spy, rng):
    a, x = rng.standard_normal((40, 30)), rng.standard_normal(30)
    tilegemm.matmul(a, x)
    out = np.full(40, np.nan)
    a2, x2 = rng.standard_normal((40, 30)), rng.standard_normal(30)
    assert tilegemm.matmul(a2, x2, out=out) is out and len(spy) == 1
    assert_close(out, a2, x2)
    wrong = np.full((40, 1), np.nan)  # NumPy refuses it: the full path says so
    with pytest.raises(ValueError):
        tilegemm.matmul(a2, x2, out=wrong)
    assert len(spy) == 2 and np.isnan(wrong).all()


def test_out_is_written_in_place_on_a_remembered_call(spy, rng):
    a, b = _operands(rng, 70, 90, 110, np.float64)
    tilegemm.matmul(a, b)
    out = np.full((70, 110), np.nan)
    a2, b2 = _operands(rng, 70, 90, 110, np.float64)
    got = tilegemm.matmul(a2, b2, out=out)
    assert len(spy) == 1 and got is out
    assert_close(out, a2, b2)
    got = tilegemm.matmul(a, b, out=(out,))  # NumPy's 1-tuple form
    assert len(spy) == 1 and got is out
    assert_close(out, a, b)


@pytest.mark.parametrize("case", ["strided", "other dtype", "overlaps a", "overlaps b",
                                  "subclass", "read-only", "wrong shape"])
def test_an_out_the_rung_cannot_write_directly_takes_the_full_path(spy, rng, case):
    a, b = _operands(rng, 16, 16, 16, np.float32)
    tilegemm.matmul(a, b)
    a, b = _operands(rng, 16, 16, 16, np.float32)
    expected = np.matmul(a.astype(np.float64), b)
    if case == "strided":
        out = np.full((16, 32), np.nan, np.float32)[:, ::2]
    elif case == "other dtype":
        out = np.full((16, 16), np.nan)
    elif case == "overlaps a":
        out = a  # NumPy allows out=a: the product of the old values
    elif case == "overlaps b":
        out = b
    elif case == "subclass":
        out = np.full((16, 16), np.nan, np.float32).view(type("Sub", (np.ndarray,), {}))
    elif case == "read-only":
        out = np.full((16, 16), np.nan, np.float32)
        out.flags.writeable = False
    else:
        out = np.full((16, 17), np.nan, np.float32)
    if case in ("read-only", "wrong shape"):
        with pytest.raises(ValueError):
            tilegemm.matmul(a, b, out=out)
        assert len(spy) == 2
        return
    got = tilegemm.matmul(a, b, out=out)
    assert len(spy) == 2 and got is out
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["strided view", "other shape", "other dtype",
                                  "mixed dtypes", "subclass", "keyword", "float16",
                                  "byte order", "dtype", "broadcast batch"])
def test_anything_else_takes_the_full_path(spy, rng, case):
    a, b = _operands(rng, 8, 8, 8, np.float32)
    tilegemm.matmul(a, b)
    assert len(spy) == 1
    kwargs = {}
    if case == "strided view":
        a = np.repeat(a, 2, axis=1)[:, ::2]  # same values, neither C- nor F-ordered
    elif case == "other shape":
        a, b = _operands(rng, 8, 9, 8, np.float32)
    elif case == "other dtype":
        a, b = a.astype(np.float64), b.astype(np.float64)
    elif case == "mixed dtypes":
        b = b.astype(">i4")  # (of the machine's byte order, two dtypes are remembered)
    elif case == "subclass":
        a = a.view(type("Sub", (np.ndarray,), {}))
    elif case == "keyword":
        kwargs = {"backend": "cpu"}
    elif case == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
    elif case == "broadcast batch":
        a, b = a[None, None].repeat(2, axis=0), b[None, None].repeat(3, axis=1)  # (2, 1) (1, 3)
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


def test_another_process_tuning_is_seen_within_the_stat_interval(spy, rng, tmp_path,
                                                                 monkeypatch):
    """One ``stat`` of the tuning file per remembered call was a third of an 8×8×8 call;
    now remembered calls read its time at most once per ``STAT_INTERVAL_NS``. A change by
    another process (the file rewritten, not through this process's ``tune.cache``) is
    seen once the interval has passed; within it the remembered decision runs on."""
    from tilegemm.tune import cache as tcache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    clock = [10**12]
    monkeypatch.setattr(remembered.time, "monotonic_ns", lambda: clock[0])
    stats = []
    real_mtime = remembered.mtime
    monkeypatch.setattr(remembered, "mtime", lambda p: stats.append(p) or real_mtime(p))
    a, b = _operands(rng, 8, 8, 8, np.float64)
    for _ in range(20):
        assert_close(tilegemm.matmul(a, b), a, b)
    assert len(spy) == 1 and len(stats) == 1  # the first remembered call confirms the state
    path = tcache.cache_path()
    path.write_text(f'{{"format": {tcache.FORMAT}, "entries": []}}')  # another process
    os.utime(path, ns=(7, 7))
    tilegemm.matmul(a, b)
    assert len(spy) == 1  # within the interval: not looked at
    clock[0] += remembered.STAT_INTERVAL_NS
    tilegemm.matmul(a, b)
    assert len(spy) == 2 and len(stats) == 2  # looked at, changed: decided again
    tilegemm.matmul(a, b)
    assert len(spy) == 2


def test_this_process_tuning_is_seen_at_once(spy, rng, tmp_path, monkeypatch):
    """A tuning result recorded, or the file cleared, by this process drops the remembered
    decisions at once, whatever the clock says."""
    from tilegemm.tune import cache as tcache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(remembered.time, "monotonic_ns", lambda: 10**12)
    a, b = _operands(rng, 8, 8, 8, np.float64)
    tilegemm.matmul(a, b)
    tilegemm.matmul(a, b)
    assert len(spy) == 1
    tcache.save([], tcache.cache_path())
    tilegemm.matmul(a, b)
    tilegemm.matmul(a, b)
    assert len(spy) == 2
    assert tcache.clear()
    tilegemm.matmul(a, b)
    assert len(spy) == 3


def test_a_tuning_run_between_two_shapes_is_seen_by_the_first(spy, rng, tmp_path,
                                                                monkeypatch):
    """Shape 1 decided, the tuning cache written, shape 2 decided (reading the new file):
    shape 1 kept its old program for good, since the table's watch was moved to the new
    file's time without dropping what had been decided under the old one."""
    from tilegemm.tune import cache as tcache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    a, b = _operands(rng, 8, 8, 8, np.float64)
    x, y = _operands(rng, 5, 6, 7, np.float64)
    tilegemm.matmul(a, b)
    tcache.save([], tcache.cache_path())  # another process's `tilegemm tune`
    tilegemm.matmul(x, y)  # a new shape: the full path, which reads the new file
    assert len(spy) == 2
    tilegemm.matmul(a, b)  # decided under the old file: decided again
    assert len(spy) == 3
    tilegemm.matmul(a, b)
    assert len(spy) == 3


def test_a_moved_tuning_cache_is_decided_again(spy, rng, tmp_path, monkeypatch):
    """TILEGEMM_CACHE_DIR changed after a shape was remembered: matmul kept the program
    decided under the old directory while plan() and gemm() read the new one."""
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path / "one"))
    a, b = _operands(rng, 8, 8, 8, np.float32)
    tilegemm.matmul(a, b)
    tilegemm.matmul(a, b)
    assert len(spy) == 1
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path / "two"))
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
    key = ("auto", "auto", (), a.dtype, (16, 16), (16, 16), 0, 0, None)
    assert fastpath._table[key].program is spec.program(plan.params, a.dtype)


@pytest.mark.parametrize("route", [{"backend": "cpu"}, {"kernel": "blocked"},
                                   {"kernel": "triple_loop", "backend": "cpu"},
                                   {"kernel": "triple_loop"}])
def test_a_named_kernel_or_backend_is_remembered_for_that_route(spy, rng, route):
    """matmul(a, b, backend="cpu") took the full path on every call (about 75 us against
    4.5 for an 8x8x8 product): it is remembered too, apart from the auto decision and
    from other routes, and runs the program that its own full-path call chose."""
    from tilegemm import registry

    a, b = _operands(rng, 9, 13, 11, np.float32)
    tilegemm.matmul(a, b)  # the auto decision, first
    assert len(spy) == 1
    for i in range(3):
        a2, b2 = _operands(rng, 9, 13, 11, np.float32)
        assert_close(tilegemm.matmul(a2, b2, **route), a2, b2)
        assert len(spy) == 2, f"call {i + 1} with {route} took the full path again"
    plan = tilegemm.plan(a, b, **route)
    key = fastpath._key(a, b, route.get("kernel", "auto"), route.get("backend", "auto"))
    assert fastpath._table[key].program is registry.get(plan.kernel, plan.backend).program(
        plan.params, a.dtype)
    tilegemm.matmul(a, b, backend="cpu", kernel="auto" if route.get("kernel") else "blocked")
    assert len(spy) == 3  # another route: decided by the full path


def test_named_parameters_are_remembered_apart(spy, rng):
    """matmul(a, b, kernel="blocked", MR=4) took the full path on every call (about 0.2 ms
    for a 64x64x64 product): it is remembered under its parameters, whatever their order,
    runs the program of exactly those parameters, and other parameters or a value that is
    not a plain int are decided by the full path. The parameters named are this machine's
    own tile (its program is compiled once for many tests; another tile costs a compile of
    10-20 s), so "other parameters" name the same tile differently."""
    from tilegemm import registry

    a, b = _operands(rng, 9, 13, 11, np.float32)
    route = {"kernel": "blocked", "backend": "cpu"}
    mr, nr = (tilegemm.plan(a, b, **route).params[p] for p in ("MR", "NR"))
    assert len(spy) == 0
    for _ in range(3):
        a2, b2 = _operands(rng, 9, 13, 11, np.float32)
        assert_close(tilegemm.matmul(a2, b2, **route, MR=mr, NR=nr), a2, b2)
    assert len(spy) == 1
    assert_close(tilegemm.matmul(a, b, **route, NR=nr, MR=mr), a, b)  # another order
    assert len(spy) == 1
    plan = tilegemm.plan(a, b, **route, MR=mr, NR=nr)
    assert (plan.params["MR"], plan.params["NR"]) == (mr, nr)
    key = fastpath._key(a, b, "blocked", "cpu", {"MR": mr, "NR": nr})
    assert fastpath._table[key].program is registry.get("blocked", "cpu").program(
        plan.params, a.dtype)
    assert_close(tilegemm.matmul(a, b, **route, MR=mr), a, b)  # other parameters
    assert len(spy) == 2
    for _ in range(2):  # a NumPy integer is not remembered: the full path judges it
        tilegemm.matmul(a, b, **route, MR=np.int64(mr), NR=nr)
    assert len(spy) == 4
    with pytest.raises(ValueError, match="MR=5"):  # refused, then never remembered
        tilegemm.matmul(a, b, **route, MR=5, NR=16)
    assert len(spy) == 5


def test_a_route_the_full_path_refuses_is_never_remembered(spy, rng):
    a, b = _operands(rng, 8, 8, 8, np.float32)
    for _ in range(2):
        with pytest.raises(ValueError, match="backend"):
            tilegemm.matmul(a, b, backend="no-such-backend")
    assert len(spy) == 2 and not fastpath._table


def _opencl_usable() -> bool:
    from tilegemm.backends import get_backend

    return get_backend("opencl").status().usable


needs_opencl = pytest.mark.skipif(not _opencl_usable(), reason="no usable OpenCL device")


@needs_opencl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((8, 8), (8, 8)), ((7, 13), (13, 5)), ((1, 17), (17, 1)),
                                    ((33, 1), (1, 65)), ((3, 20, 30), (3, 30, 10)),
                                    ((3, 20, 30), (30, 10)), ((20, 30), (30,)),
                                    ((130, 70), (70, 129))])
def test_opencl_calls_on_host_arrays_are_remembered(spy, rng, shapes, dtype):
    """A repeated matmul(a, b, backend="opencl") on NumPy arrays took the full path every
    time (about 0.2 ms of a 0.25 ms 8³ product on PoCL): its second call runs the program
    the backend made for the case, on fresh data, into a fresh result or out."""
    sa, sb = shapes
    results = []
    for _ in range(3):
        a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
        results.append((tilegemm.matmul(a, b, backend="opencl"), a, b))
    assert len(spy) == 1, "a repeated OpenCL call took the full path"
    for got, a, b in results:
        assert got.shape == np.matmul(a, b).shape and got.dtype == dtype
        assert_close(got, a, b)
    a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
    out = np.full(np.matmul(a, b).shape, np.nan, dtype)
    assert tilegemm.matmul(a, b, backend="opencl", out=out) is out and len(spy) == 1
    assert_close(out, a, b)


@needs_opencl
@pytest.mark.parametrize("layout", ["a.T", "b.T", "both", "slice", "batch b.mT", "float64 b"])
def test_opencl_calls_on_other_layouts_copy_them_and_are_remembered(spy, rng, layout):
    """OpenCL's kernels read C-ordered operands: the full path copies an operand given
    otherwise (``x.T``, a slice of columns, a batch transposed in its last two axes), and
    so does a remembered call of that case, which took the full path every time before
    (about 250 µs a call for 8³ on PoCL, against 95 remembered)."""
    def operands():
        a = rng.standard_normal((2, 9, 13) if layout == "batch b.mT" else (9, 13))
        b = rng.standard_normal((2, 13, 6) if layout == "batch b.mT" else (13, 6))
        a, b = a.astype(np.float32), b.astype(np.float32)
        if layout in ("a.T", "both"):
            a = np.ascontiguousarray(a.T).T
        if layout in ("b.T", "both"):
            b = np.ascontiguousarray(b.T).T
        if layout == "slice":
            b = np.pad(b, ((0, 0), (0, 5)))[:, :6]
        if layout == "batch b.mT":
            b = np.ascontiguousarray(b.swapaxes(-1, -2)).swapaxes(-1, -2)
        if layout == "float64 b":  # float32 with float64: a converted, as the full path does
            b = np.ascontiguousarray(b.T.astype(np.float64)).T
        return a, b

    a, b = operands()
    first = tilegemm.matmul(a, b, backend="opencl")
    for _ in range(2):
        a2, b2 = operands()
        got = tilegemm.matmul(a2, b2, backend="opencl")
        assert len(spy) == 1, "a repeated OpenCL call took the full path"
        assert_close(got, a2, b2)
    np.testing.assert_array_equal(tilegemm.matmul(a, b, backend="opencl"), first)
    assert fastpath._table[fastpath._key(a, b, "auto", "opencl")].dense


@needs_opencl
def test_a_remembered_opencl_call_poisons_its_result(spy, rng, monkeypatch):
    """With TILEGEMM_POISON set, the remembered OpenCL program fills the device result
    before the kernel runs, as the full path does: a kernel that writes nothing shows it."""
    from tilegemm.backends.opencl import OpenCLBackend

    monkeypatch.setenv("TILEGEMM_POISON", "1")
    a, b = _operands(rng, 9, 17, 8, np.float32)
    tilegemm.matmul(a, b, backend="opencl")
    out = tilegemm.matmul(*_operands(rng, 9, 17, 8, np.float32), backend="opencl")
    assert len(spy) == 1 and not np.isnan(out).any()
    monkeypatch.setattr(OpenCLBackend, "_launch", staticmethod(lambda *args: None))
    out = np.zeros((9, 8), np.float32)
    tilegemm.matmul(a, b, backend="opencl", out=out)
    assert len(spy) == 1 and np.isnan(out).all()


def test_a_backend_without_a_direct_path_is_not_remembered(rng):
    """Backend.host_program gives None (CUDA, whose host calls copy through the GPU): the
    case is not remembered. A case that cannot be remembered never asks for a program."""
    remembered.forget()
    a, b = _operands(rng, 8, 8, 8, np.float32)
    fastpath.remember(a, b, lambda: None, None, None, kernel="auto", backend="cuda")
    assert not fastpath._table
    asked = []
    empty = np.ones((0, 8), np.float32)
    fastpath.remember(empty, b, lambda: asked.append(1), None, None, kernel="auto",
                      backend="cpu")
    assert not asked and not fastpath._table
    from tilegemm.backends import get_backend
    from tilegemm.backends.base import Backend

    assert type(get_backend("cuda")).host_program is Backend.host_program  # None


def _record_triple_loop(m: int) -> None:
    """A `tilegemm tune` result for float32 m³ on this CPU: rung triple_loop."""
    from tilegemm.backends.cpu import CpuBackend
    from tilegemm.tune import cache as tcache
    from tilegemm.tune.select import device_id

    dev = device_id(CpuBackend().target())
    tcache.record(tcache.Entry("cpu", dev.name, dev.arch, "float32", [m, m, m], "triple_loop",
                               {}, 1e-6, 1e3))


def test_a_tuning_run_during_a_call_is_seen_by_that_shape(rng, tmp_path, monkeypatch):
    """Thread A decides 64³, a tuning result for 64³ is written while A's product runs and
    another call reads it, then A remembers its decision: stamped with the file's time
    after the run, it was never decided again (plan said triple_loop, matmul ran blocked
    for good). Stamped with the time before deciding, it is decided again."""
    import threading

    from tilegemm import registry
    from tilegemm.backends.cpu import CpuBackend

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    remembered.forget()
    s = np.ones((64, 64), np.float32)
    inside, go = threading.Event(), threading.Event()
    real = CpuBackend.run

    def held(self, *args, **kwargs):
        if threading.current_thread().name == "held":
            inside.set()
            go.wait(30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CpuBackend, "run", held)
    a = threading.Thread(target=lambda: tilegemm.matmul(s, s, backend="cpu"), name="held")
    a.start()
    assert inside.wait(30)
    _record_triple_loop(64)
    x = rng.standard_normal((5, 5)).astype(np.float32)
    tilegemm.matmul(x, x, backend="cpu")  # another call reads the new file
    go.set()
    a.join(30)
    assert tilegemm.plan(s, s, backend="cpu").kernel == "triple_loop"
    a2, b2 = _operands(rng, 64, 64, 64, np.float32)
    assert_close(tilegemm.matmul(a2, b2, backend="cpu"), a2, b2)
    key = fastpath._key(s, s, "auto", "cpu")
    spec = registry.get("triple_loop", "cpu")
    assert fastpath._table[key].program is spec.program(spec.resolve({}), s.dtype)
    remembered.forget()


def test_an_answer_from_an_older_tuning_file_is_not_kept(tmp_path, monkeypatch):
    """A lookup read the tuning file's entries, another thread re-read the changed file
    (clearing the answers kept), then the first stored its answer from the old entries:
    it outlived the clear, and plan() kept saying blocked [database] with a tuned entry in
    the file."""
    import threading

    from tilegemm.tune import select

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    s = np.ones((64, 64), np.float32)
    x = np.ones((5, 5), np.float32)
    tilegemm.plan(x, x, backend="cpu")
    inside, go = threading.Event(), threading.Event()
    real = select._choose

    def held(*args, **kwargs):
        if threading.current_thread().name == "held":
            inside.set()
            go.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(select, "_choose", held)
    a = threading.Thread(target=lambda: tilegemm.plan(s, s, backend="cpu"), name="held")
    a.start()
    assert inside.wait(30)
    _record_triple_loop(64)
    tilegemm.plan(x, x, backend="cpu")  # re-reads the file, clears the answers
    go.set()
    a.join(30)
    assert tilegemm.plan(s, s, backend="cpu").kernel == "triple_loop"


def test_a_program_is_made_once_per_case_and_state(rng, tmp_path):
    """The full path offers every plain host call to remember(): a gemm() of a remembered
    case, a Fortran-ordered operand on a rung handed C-ordered copies (remembered, the
    copies made by the remembered call), a backend without a direct path. The backend's
    program (on OpenCL, a device check and a kernel look-up) was made again for each; now
    once per case until the tuning file changes."""
    remembered.forget()
    made = []

    def maker(program):
        def make():
            made.append(1)
            return program
        return make

    a, b = _operands(rng, 8, 8, 8, np.float32)
    plain = lambda *args: None  # noqa: E731 - takes C-ordered operands only
    state = (str(tmp_path / "tuning.json"), None)
    for _ in range(3):
        fastpath.remember(a, b, maker(plain), *state, kernel="auto", backend="opencl")
    assert len(made) == 1 and len(fastpath._table) == 1
    fa = np.asfortranarray(a)
    for _ in range(3):
        fastpath.remember(fa, b, maker(plain), *state, kernel="auto", backend="opencl")
        fastpath.remember(a, b, maker(None), *state, kernel="auto", backend="cuda")
    assert len(made) == 3 and len(fastpath._table) == 2
    later = (state[0], 12345)  # the tuning file changed: decided again, made again
    fastpath.remember(a, b, maker(plain), *later, kernel="auto", backend="opencl")
    fastpath.remember(fa, b, maker(plain), *later, kernel="auto", backend="opencl")
    assert len(made) == 5
    remembered.forget()
