"""The blocked rung's packing (kernels/cpu/_packing.py and the pack_* loops that use it):
the packed strips are exactly the element-by-element definition, for every path (C-ordered
and transposed operands, whole and partial strips, K not a multiple of the vector width),
and the transposing copy compiles to vector shuffles, not one scalar move per element."""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from conftest import blocked_module
from tilegemm.kernels.cpu import k02_blocked

DTYPES = ["float32", "float64", "int32", "int64"]


def _program(dtype):
    """The rung with the parameters ``auto`` runs on this machine (compiled for the other
    tests too, so this file adds little compile time); returns it and its MR, NR."""
    x = np.ones((2, 2), dtype)
    params = tilegemm.plan(x, x, backend="cpu", kernel="blocked").params
    return k02_blocked.SPEC.program(params, np.dtype(dtype)), params["MR"], params["NR"]


def _random(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    x.flags.writeable = False
    return x


def _sentinel(shape, dtype):
    dtype = np.dtype(dtype)
    return np.full(shape, np.nan if dtype.kind == "f" else np.iinfo(dtype).min + 7, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mkn", [(97, 77, 131), (64, 256, 96), (33, 515, 70)],
                         ids=lambda s: "x".join(map(str, s)))
def test_packed_panels_are_the_definition(rng, dtype, mkn):
    program, mr, nr = _program(dtype)
    g = program.__globals__
    m, k, n = mkn
    a, b = _random(rng, (m, k), dtype), _random(rng, (k, n), dtype)
    at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
    at.flags.writeable = bt.flags.writeable = False
    pc, kc, jc, nc, ic, mc = 3, k - 5, 1, n - 2, 2, m - 4  # panels off every edge

    strips = (nc + nr - 1) // nr
    want_b = np.zeros((strips * nr, kc), dtype)
    want_b[:nc] = b[pc:pc + kc, jc:jc + nc].T
    want_b = want_b.reshape(strips, nr, kc).transpose(0, 2, 1)
    for src, transposed in ((b, False), (bt, True)):
        got = _sentinel((strips, kc, nr), dtype)
        g["pack_b"](src, pc, kc, jc, nc, got, 0, strips, transposed)
        np.testing.assert_array_equal(got, want_b, err_msg=f"B transposed={transposed}")

    strips = (mc + mr - 1) // mr
    want_a = np.zeros((strips * mr, kc), dtype)
    want_a[:mc] = a[ic:ic + mc, pc:pc + kc]
    want_a = want_a.reshape(strips, mr, kc).transpose(0, 2, 1)
    for src, transposed in ((a, False), (at, True)):
        got = _sentinel((strips, kc, mr), dtype)
        g["pack_a"](src, ic, mc, pc, kc, got, transposed)
        np.testing.assert_array_equal(got, want_a, err_msg=f"A transposed={transposed}")


def test_transposing_copy_is_vector_shuffles():
    """8 rows × 16 float32 columns into a strip: vector loads, permutes and stores. Element
    by element it was 128 scalar loads and 128 scalar stores."""
    import re

    import numba
    from llvmlite import binding as llvm
    from numba import njit

    from tilegemm.kernels.cpu._packing import transposer

    if llvm.get_process_triple().split("-")[0] not in ("x86_64", "amd64"):
        pytest.skip("reads x86 machine code")
    pack = transposer(8, 16)
    f32 = numba.float32

    @njit(numba.void(f32[:, :, ::1], f32[:, ::1], numba.int64, numba.int64))
    def strip(ap, a, i, p):
        pack(ap, (0, 0, 0), a, (i, p))

    a = np.arange(20 * 40, dtype=np.float32).reshape(20, 40)
    ap = np.full((1, 16, 8), np.nan, np.float32)
    strip(ap, a, 3, 5)
    np.testing.assert_array_equal(ap[0], a[3:11, 5:21].T)
    asm = strip.inspect_asm(strip.signatures[0])
    scalar = len(re.findall(r"\bv?movss\b", asm))
    shuffles = len(re.findall(r"\bv(perm|shuf|unpck|insert|blend)\w*", asm))
    assert shuffles >= 4 and scalar < 16, (shuffles, scalar)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposing_copy_into_a_matrix_is_the_definition(rng, dtype):
    """``transpose_into`` (the copy of an operand given transposed for the unpacked path):
    ``D[:cols, :rows] = S[:rows, :cols].T`` for whole blocks and every kind of edge, from a
    source wider than it is (rows apart), and nothing else of D written."""
    _, mod = blocked_module({}, dtype)
    w = mod.TRANSPOSE_W
    for rows, cols in ((w, w), (3 * w, 2 * w), (w + 3, 2 * w + 5), (5, 7), (1, 2 * w + 1),
                       (2 * w + 1, 1), (100, 64)):
        s = _random(rng, (rows, cols + 3), dtype)  # 3 columns more than it is
        d = _sentinel((cols + 2, rows + 2), dtype)
        mod.transpose_into(d, s, rows, cols)
        np.testing.assert_array_equal(d[:cols, :rows], s[:, :cols].T, err_msg=str((rows, cols)))
        untouched = np.ones(d.shape, bool)
        untouched[:cols, :rows] = False
        np.testing.assert_array_equal(d[untouched], _sentinel(d.shape, dtype)[untouched])


def test_transposing_block_is_vector_shuffles():
    """The block of ``transpose_into`` moves its 8×8 elements through vector registers, not
    one scalar load and store per element."""
    import re

    import numba
    from llvmlite import binding as llvm
    from numba import njit

    from tilegemm.kernels.cpu._packing import block_transposer

    if llvm.get_process_triple().split("-")[0] not in ("x86_64", "amd64"):
        pytest.skip("reads x86 machine code")
    block = block_transposer(8)
    f32 = numba.float32

    @njit(numba.void(f32[:, ::1], f32[:, ::1], numba.int64, numba.int64))
    def one(d, s, i, j):
        block(d, (j, i), s, (i, j))

    s = np.arange(20 * 40, dtype=np.float32).reshape(20, 40)
    d = np.full((40, 20), np.nan, np.float32)
    one(d, s, 3, 5)
    np.testing.assert_array_equal(d[5:13, 3:11], s[3:11, 5:13].T)
    assert np.isnan(d).sum() == d.size - 64
    asm = one.inspect_asm(one.signatures[0])
    scalar = len(re.findall(r"\bv?movss\b", asm))
    shuffles = len(re.findall(r"\bv(perm|shuf|unpck|insert|blend)\w*", asm))
    assert shuffles >= 4 and scalar < 16, (shuffles, scalar)
