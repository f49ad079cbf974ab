"""OpenCL `vectorized` with one work-item per work-group reads A and B packed in panels
(``OpenCLProgram.packs``, ``pack_panels`` in ``_layout.cl``) once several work-groups read
each panel and B's rows are unaligned for vectors or 4 KiB apart. Checked against float64
NumPy on shapes that leave partial panels in every dimension, batches of every kind,
device operands (offsets, transposed views gathered first), alpha/beta, both dtypes; every
test also asserts which path ran, so none can pass on the unpacked path alone. Outputs are
NaN-poisoned (conftest).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import tilegemm
from tilegemm import registry
from tilegemm.backends import get_backend, opencl_program
from tilegemm.backends.opencl import OpenCLBackend
from tilegemm.reference import assert_close, random_operands

pytestmark = pytest.mark.opencl

SPEC = registry.get("vectorized", "opencl")
# the CPU default tile (8 x 16 in float8) and a 512-bit one (8 x 32 in float16)
TILES = [{"BM": 8, "BN": 16, "BK": 8, "TM": 8, "TN": 16, "VW": 8},
         {"BM": 8, "BN": 32, "BK": 16, "TM": 8, "TN": 32, "VW": 16}]
IDS = ["8x16", "8x32"]


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per launch that could pack: True where A and B were packed."""
    seen: list[bool] = []
    real = OpenCLBackend._panels

    def spy(self, target, program, kernel, prob, a_args, b_args):  # type: ignore[no-untyped-def]
        result = real(self, target, program, kernel, prob, a_args, b_args)
        seen.append(result[4] is not None)
        return result

    monkeypatch.setattr(OpenCLBackend, "_panels", spy)
    return seen


def _mm(a, b, params, **kw):  # type: ignore[no-untyped-def]
    return tilegemm.matmul(a, b, backend="opencl", kernel="vectorized", **params, **kw)


@pytest.mark.parametrize("params", TILES, ids=IDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_partial_panels_in_every_dimension(params, dtype, packed) -> None:  # type: ignore[no-untyped-def]
    tm, tn = params["TM"], params["TN"]
    # packed where B's rows are not whole vectors (every shape here but the last) or are
    # 4 KiB apart (the last: N = 1024 or 512 elements, K = 512)
    shapes = [(4 * tm, 4 * tn + 1, 1),             # whole panels of A, K = 1
              (4 * tm + 3, 4 * tn + 5, 37),        # a partial last panel of A and of B
              (97, 4 * tn + 1, 131),               # primes
              (5 * tm - 1, 7 * tn - 3, 2 * tn),
              (4 * tm + 1, 4096 // np.dtype(dtype).itemsize, 512)]
    for m, n, k in shapes:
        a, b = random_operands((m, k), (k, n), dtype)
        assert_close(_mm(a, b, params), a, b, what=f"{params} {dtype} {m}x{n}x{k}")
    assert packed == [True] * len(shapes)


@pytest.mark.parametrize("params", TILES, ids=IDS)
def test_batches_shared_and_broadcast(params, packed) -> None:  # type: ignore[no-untyped-def]
    m, k, n = 4 * params["TM"] + 1, 23, 4 * params["TN"] + 2
    cases = [((3, m, k), (3, k, n)),          # both batched: packed per matrix
             ((3, m, k), (k, n)),             # one B for the batch: packed once
             ((m, k), (3, k, n)),             # one A for the batch
             ((2, 1, m, k), (1, 3, k, n))]    # partial broadcast (copied out first)
    for sa, sb in cases:
        a, b = random_operands(sa, sb, "float32")
        assert_close(_mm(a, b, params), a, b, what=f"{params} {sa} @ {sb}")
    assert packed == [True] * len(cases)


def test_alpha_beta_and_transposed_operands(packed) -> None:  # type: ignore[no-untyped-def]
    params = TILES[0]
    m, k, n = 41, 19, 70
    at, bt = random_operands((k, m), (n, k), "float64")
    c0 = random_operands((m, n), (1,), "float64")[0]
    got = tilegemm.gemm(at, bt, c0, alpha=1.5, beta=-2.0, trans_a=True, trans_b=True,
                        backend="opencl", kernel="vectorized", **params)
    assert_close(got, at, bt, alpha=1.5, beta=-2.0, c=c0, trans_a=True, trans_b=True,
                 what="transposed, beta")
    assert packed == [True]


def test_device_operands_with_offsets_and_views(packed) -> None:  # type: ignore[no-untyped-def]
    """pyopencl operands: a view at an offset into a larger array (a non-zero a_off/b_off
    for the packing to honour), and a transposed view (gathered dense, then packed)."""
    import pyopencl.array as cla

    queue = get_backend("opencl").own_device().queue
    params = TILES[1]
    m, k, n = 35, 29, 133
    a, b = random_operands((m + 3, k), (k + 2, n), "float32")
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    got = _mm(da[3:], db[2:], params)
    assert_close(got.get(), a[3:], b[2:], what="offset views")
    bt = np.ascontiguousarray(b[2:].T)
    got = _mm(da[3:], cla.to_device(queue, bt).T, params)
    assert_close(got.get(), a[3:], bt.T, what="transposed view of B")
    assert packed == [True, True]


def test_small_products_read_in_place(packed) -> None:  # type: ignore[no-untyped-def]
    """Fewer than PANEL_MIN_READS row (column) blocks, or B's rows aligned and not 4 KiB
    apart (or too few to matter): packing would not pay, A and B are read where they are,
    and the result is the same."""
    params = TILES[0]
    reads = opencl_program.PANEL_MIN_READS
    tm, tn = params["TM"], params["TN"]
    shapes = [(reads * tm - 1, 4 * tn + 1, 9), (4 * tm, reads * tn - 1, 9), (1, 300, 40),
              (300, 1, 40),
              (4 * tm, 4 * tn, 9),      # aligned rows, nothing to gain
              (4 * tm, 1024, 64)]       # rows 4 KiB apart, but a strip the caches hold
    for m, n, k in shapes:
        a, b = random_operands((m, k), (k, n), "float32")
        assert_close(_mm(a, b, params), a, b, what=f"{m}x{n}x{k}")
    assert packed == [False] * len(shapes)


def test_staged_tiles_never_pack() -> None:
    program = SPEC.program({"BM": 16, "BN": 32, "BK": 8, "TM": 2, "TN": 8, "VW": 4},
                           np.dtype(np.float32))
    assert program.panels == (0, 0) and not program.packs(10_000, 10_001, 1024, 4)
    direct = SPEC.program(TILES[0], np.dtype(np.float32))
    assert direct.panels == (8, 16) and direct.vector_width == 8
    assert direct.packs(32, 65, 9, 4) and not direct.packs(31, 65, 9, 4)  # reads of A's panel
    assert not direct.packs(32, 63, 9, 4)  # reads of B's panel (4 x 16 columns needed)
    assert not direct.packs(32, 64, 9, 4)  # aligned rows, not 4 KiB apart
    assert direct.packs(32, 64, 9, 4, (0, 12))  # a batch stride that is not whole vectors
    assert direct.packs(32, 1024, 512, 4) and not direct.packs(32, 1024, 511, 4)
    assert direct.packs(32, 512, 512, 8) and not direct.packs(32, 512, 512, 4)
    assert ("TG_PANELS", "1") in direct.with_panels.defines
    assert ("TG_PANELS", "1") not in direct.defines


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_pack_kernel_layout(dtype: str) -> None:
    """pack_panels against the layout it promises, built with NumPy: A's rows and B's
    columns, W at a time, K-major, zero past the edge, at an offset and per batch."""
    import pyopencl.array as cla

    from tilegemm.backends.opencl import BITS

    backend = get_backend("opencl")
    own = backend.own_device()
    pack = backend._layout_function(own, "pack_panels", BITS[np.dtype(dtype).itemsize])
    batch, rows, k, width, off = 2, 13, 7, 4, 5
    src = random_operands((off + batch * rows * k,), (1,), dtype)[0]
    panels = -(-rows // width)
    x = src[off:].reshape(batch, rows, k)
    for name, (ks, js) in {"A": (1, k), "B": (rows, 1)}.items():
        # B: the same numbers read as (batch, k, rows) matrices, columns as panels
        mats = x if name == "A" else x.reshape(batch, k, rows).transpose(0, 2, 1)
        want = np.zeros((batch, panels * width, k), dtype)
        want[:, :rows] = mats
        want = want.reshape(batch, panels, width, k).transpose(0, 1, 3, 2)
        dst = cla.empty(own.queue, (batch, panels, k, width), np.dtype(dtype))
        dst.fill(np.dtype(dtype).type(-7))
        pack(own.queue, (k, panels, batch), None, cla.to_device(own.queue, src).base_data,
             np.int64(off), np.int64(rows * k), np.int64(ks), np.int64(js), np.int32(k),
             np.int32(rows), np.int32(width), dst.base_data)
        np.testing.assert_array_equal(dst.get(), want, err_msg=name)


def test_panels_that_do_not_fit_are_skipped() -> None:
    """Packing is an optimisation: where the panels would not fit in the device's memory
    beside A, B and C, the product reads A and B in place (no error)."""
    from tilegemm.problem import describe, make_problem

    backend = get_backend("opencl")
    own = backend.own_device()
    program = SPEC.program(TILES[0], np.dtype(np.float32))
    a, b = random_operands((64, 32), (32, 128), "float32")
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    args = (object(), 0, 0)
    for device in (SimpleNamespace(max_mem_alloc_size=4 * 32 * 128 - 1,  # B packed: 16 KiB
                                   global_mem_size=1 << 40),
                   SimpleNamespace(max_mem_alloc_size=1 << 40,
                                   global_mem_size=4 * (64 * 32 + 32 * 128 + 64 * 128) + 10)):
        place = SimpleNamespace(context=own.context, device=device, queue=own.queue)
        got = backend._panels(place, program, "kernel", prob, args, args)
        assert got == (program, "kernel", args, args, None)
