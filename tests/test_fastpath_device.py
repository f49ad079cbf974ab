"""Repeated calls on device arrays reuse the decision of the first (tilegemm.fastpath,
"Device operands"): the second call of a case is not decided again, gives the right
product on fresh data, and a case that differs in any part of the key is decided anew.
Decisions are counted (``api.decide`` is replaced by a spy), never timed."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tilegemm
from tilegemm import api, fastpath_device, remembered
from tilegemm.backends import get_backend
from tilegemm.reference import assert_close


@pytest.fixture
def decided(count_calls):
    """Counts the calls that were decided (took the full path's decision)."""
    remembered.forget()
    yield count_calls(api, "decide")
    remembered.forget()


@pytest.fixture(scope="module")
def queue():
    return get_backend("opencl").own_device().queue


def _cl_pair(queue, rng, sa, sb, dtype=np.float32):
    import pyopencl.array as cla

    a = rng.standard_normal(sa).astype(dtype)
    b = rng.standard_normal(sb).astype(dtype)
    return a, b, cla.to_device(queue, a), cla.to_device(queue, b)


@pytest.mark.opencl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((8, 8), (8, 8)), ((7, 13), (13, 5)), ((1, 17), (17, 1)),
                                    ((3, 20, 30), (3, 30, 10)), ((3, 20, 30), (30, 10)),
                                    ((20, 30), (30,)), ((13,), (13, 6)), ((65, 70), (70, 129))])
def test_opencl_device_operands_are_decided_once(decided, queue, rng, shapes, dtype):
    """matmul on pyopencl arrays was decided on every call (about 100 of a small call's
    270 µs on PoCL): the second and third calls of a case reuse the first's decision and
    still compute their own operands' product, into a fresh result each."""
    results = []
    for _ in range(3):
        a, b, da, db = _cl_pair(queue, rng, *shapes, dtype=dtype)
        results.append((tilegemm.matmul(da, db), a, b))
    assert len(decided) == 1, "a repeated call on device arrays was decided again"
    for got, a, b in results:
        assert got.shape == np.matmul(a, b).shape and got.dtype == dtype
        assert_close(got.get(), a, b)
    assert len({id(got.base_data) for got, _, _ in results}) == 3


@pytest.mark.opencl
def test_a_remembered_device_call_poisons_its_result(decided, queue, rng, monkeypatch):
    """A remembered call runs the backend's whole run: with TILEGEMM_POISON set its
    result is filled before the kernel, which a kernel that writes nothing shows."""
    from tilegemm.backends.opencl import OpenCLBackend

    monkeypatch.setenv("TILEGEMM_POISON", "1")
    _, _, da, db = _cl_pair(queue, rng, (9, 17), (17, 8))
    tilegemm.matmul(da, db)
    assert not np.isnan(tilegemm.matmul(da, db).get()).any()
    monkeypatch.setattr(OpenCLBackend, "_launch", staticmethod(lambda *args: None))
    got = tilegemm.matmul(da, db)
    assert len(decided) == 1 and np.isnan(got.get()).all()


@pytest.mark.opencl
def test_a_device_case_that_differs_in_any_part_is_decided_again(decided, queue, rng):
    import pyopencl.array as cla

    _, _, da, db = _cl_pair(queue, rng, (8, 8), (8, 8))
    tilegemm.matmul(da, db)
    a2, b2, da2, db2 = _cl_pair(queue, rng, (5, 8), (8, 8))  # another shape, same strides
    assert_close(tilegemm.matmul(da2, db2).get(), a2, b2)
    a3, b3, da3, db3 = _cl_pair(queue, rng, (8, 8), (8, 8), np.float64)  # another dtype
    assert_close(tilegemm.matmul(da3, db3).get(), a3, b3)
    assert len(decided) == 3
    # the same shapes with other strides: a transposed view of A
    a4 = rng.standard_normal((8, 8)).astype(np.float32)
    got = tilegemm.matmul(cla.to_device(queue, a4).T, db)
    assert len(decided) == 4
    assert_close(got.get(), a4.T, db.get())
    for route in ({"kernel": "naive"}, {"backend": "opencl"}, {"kernel": "shared", "TILE": 8}):
        before = len(decided)
        tilegemm.matmul(da, db, **route)
        tilegemm.matmul(da, db, **route)
        assert len(decided) == before + 1, route  # decided once for that route
    # what the auto route decided is still what plan() reports for it
    plan = tilegemm.plan(da, db)
    chosen = next(v for k, v in fastpath_device._decisions.items() if k[:3] == ("auto", "auto", ()))
    assert (plan.kernel, plan.params) == (chosen.spec.name, chosen.params)


@pytest.mark.opencl
def test_views_at_an_offset_reuse_the_decision_and_read_their_own_elements(decided, queue,
                                                                           rng):
    """The decision is kept per layout, not per buffer: a view at another offset into a
    larger array has the same key, and the call reads it where it starts."""
    import pyopencl.array as cla

    big = rng.standard_normal((20, 8)).astype(np.float32)
    dbig = cla.to_device(queue, big)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    db = cla.to_device(queue, b)
    for start in (0, 3, 12):
        assert_close(tilegemm.matmul(dbig[start:start + 8], db).get(), big[start:start + 8], b)
    assert len(decided) == 1


@pytest.mark.opencl
def test_per_call_checks_still_run_on_a_remembered_case(decided, queue, rng):
    """What depends on the array object, not its layout, is checked on every call: an
    offset inside an element, arrays of two contexts."""
    import pyopencl as cl
    import pyopencl.array as cla

    _, _, da, db = _cl_pair(queue, rng, (8, 8), (8, 8))
    tilegemm.matmul(da, db)
    odd = cla.Array(queue, (8, 8), np.float32, data=cl.Buffer(queue.context,
                                                              cl.mem_flags.READ_WRITE, 4096),
                    offset=2)
    with pytest.raises(ValueError, match="offset"):
        tilegemm.matmul(odd, db)
    other_ctx = cl.Context([queue.device])
    other = cla.to_device(cl.CommandQueue(other_ctx), db.get())
    with pytest.raises(ValueError, match="context"):
        tilegemm.matmul(da, other)
    assert_close(tilegemm.matmul(da, db).get(), da.get(), db.get())


@pytest.mark.opencl
def test_a_changed_tuning_cache_drops_device_decisions(decided, queue, rng, tmp_path,
                                                       monkeypatch):
    from tilegemm.tune import cache as tcache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    _, _, da, db = _cl_pair(queue, rng, (8, 8), (8, 8))
    tilegemm.matmul(da, db)
    tilegemm.matmul(da, db)
    assert len(decided) == 1
    tcache.save([], tcache.cache_path())  # another process's `tilegemm tune` writes it
    os.utime(tcache.cache_path(), ns=(1, 1))
    tilegemm.matmul(da, db)
    assert len(decided) == 2
    tilegemm.matmul(da, db)
    assert len(decided) == 2
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path / "moved"))
    tilegemm.matmul(da, db)
    assert len(decided) == 3


@pytest.mark.opencl
def test_dtype_is_decided_every_time(decided, queue, rng):
    a, b, da, db = _cl_pair(queue, rng, (8, 8), (8, 8))
    for _ in range(2):
        tilegemm.matmul(da, db, dtype=np.float32)
    assert len(decided) == 2 and not fastpath_device._decisions


@pytest.mark.opencl
def test_gemm_on_device_arrays_is_decided_once_per_case(decided, queue, rng):
    """gemm on pyopencl arrays: the decision (backend, rung, parameters) does not depend on
    alpha and beta, so it is made once per case (the layouts of the operands, ``c`` and
    ``out``, and the transpose flags); each call still checks its own scalars and runs
    with them and its own ``c``. Before, every such call was decided again."""
    import pyopencl.array as cla

    a, b, da, db = _cl_pair(queue, rng, (8, 8), (8, 8))
    c = rng.standard_normal((8, 8)).astype(np.float32)
    dc = cla.to_device(queue, c)
    for alpha, beta in ((2.0, 0.0), (0.5, 1.0), (-1.0, -2.0)):
        got = tilegemm.gemm(da, db, dc, alpha=alpha, beta=beta)
        assert_close(got.get(), a, b, alpha=alpha, beta=beta, c=c)
    assert len(decided) == 1
    for _ in range(2):  # the transpose flags are part of the case
        got = tilegemm.gemm(da, db, dc, alpha=0.5, beta=1.0, trans_b=True)
        assert_close(got.get(), a, b, alpha=0.5, beta=1.0, c=c, trans_b=True)
    assert len(decided) == 2
    want = c.astype(np.float64)
    for _ in range(2):  # out=c, in place: a case of its own
        assert tilegemm.gemm(da, db, dc, alpha=0.5, beta=1.0, out=dc) is dc
        want = 0.5 * (a.astype(np.float64) @ b) + want
    assert len(decided) == 3
    np.testing.assert_allclose(dc.get(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="too large"):  # each call's scalars are checked
        tilegemm.gemm(da, db, dc, alpha=10**400, beta=1.0)
    tilegemm.matmul(da, db)  # the case of no c and no out, remembered ...
    with pytest.raises(ValueError, match="beta != 0 needs c"):  # ... still refuses this
        tilegemm.gemm(da, db, alpha=2.0, beta=1.0)
    assert len(decided) == 4


def cla_empty(queue, shape, dtype=np.float32):
    import pyopencl.array as cla

    return cla.empty(queue, shape, dtype)


@pytest.mark.opencl
def test_a_device_out_is_remembered_with_its_layout(decided, queue, rng):
    """matmul(a, b, out=d) on pyopencl arrays: decided once per layout of out, written in
    place on each call; an out that is an operand (same layout as a fresh out) still gets
    the product of the operand as it was, since overlap is seen by the run on every call."""
    a, b, da, db = _cl_pair(queue, rng, (8, 8), (8, 8))
    tilegemm.matmul(da, db)  # no out: its own case
    for _ in range(2):
        out = cla_empty(queue, (8, 8))
        out.fill(np.nan)
        assert tilegemm.matmul(da, db, out=out) is out
        assert_close(out.get(), a, b)
    assert len(decided) == 2
    x, y, dx, dy = _cl_pair(queue, rng, (8, 8), (8, 8))
    assert tilegemm.matmul(dx, dy, out=dx) is dx and len(decided) == 2
    assert_close(dx.get(), x, y, what="out=a, remembered")
    big = cla_empty(queue, (8, 16))
    with pytest.raises(ValueError, match="contiguous"):  # another layout: decided, refused
        tilegemm.matmul(da, db, out=big[:, :8])
    with pytest.raises(TypeError, match="dtype"):
        tilegemm.matmul(da, db, out=cla_empty(queue, (8, 8), np.float64))
    with pytest.raises(TypeError, match="host"):
        tilegemm.matmul(da, db, out=np.empty((8, 8), np.float32))


@pytest.mark.cudasim
@pytest.mark.parametrize("shapes", [((8, 8), (8, 8)), ((7, 13), (13, 5)),
                                    ((2, 5, 6), (2, 6, 3)), ((20, 30), (30,))])
def test_cuda_device_operands_are_decided_once(decided, rng, shapes):
    """The same for CUDA device arrays (numba's here; CuPy's and PyTorch's on a GPU)."""
    from numba import cuda

    results = []
    for _ in range(3):
        a = rng.standard_normal(shapes[0]).astype(np.float32)
        b = rng.standard_normal(shapes[1]).astype(np.float32)
        results.append((tilegemm.matmul(cuda.to_device(a), cuda.to_device(b)), a, b))
    assert len(decided) == 1
    for got, a, b in results:
        assert got.shape == np.matmul(a, b).shape
        assert_close(got.copy_to_host(), a, b)


@pytest.mark.cudasim
def test_a_cuda_view_with_other_strides_is_decided_again(decided, rng):
    from numba import cuda

    a = rng.standard_normal((6, 6)).astype(np.float32)
    b = rng.standard_normal((6, 6)).astype(np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    tilegemm.matmul(da, db)
    tilegemm.matmul(da, db)
    assert len(decided) == 1
    # a's values through a transposed view (numba's own .T copies on a GPU: a strided view)
    from tilegemm.backends.cuda_program import strided_view

    d = cuda.to_device(np.ascontiguousarray(a.T))
    at = strided_view(d, d.shape[::-1], d.strides[::-1])
    assert at.strides != da.strides
    assert_close(tilegemm.matmul(at, db).copy_to_host(), a, b)
    assert len(decided) == 2


@pytest.mark.cudasim
def test_a_cuda_device_out_is_remembered(decided, rng):
    from numba import cuda

    for _ in range(2):
        a = rng.standard_normal((5, 7)).astype(np.float32)
        b = rng.standard_normal((7, 3)).astype(np.float32)
        out = cuda.to_device(np.full((5, 3), np.nan, np.float32))
        assert tilegemm.matmul(cuda.to_device(a), cuda.to_device(b), out=out) is out
        assert_close(out.copy_to_host(), a, b)
    assert len(decided) == 1
