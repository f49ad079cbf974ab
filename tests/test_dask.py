"""tilegemm.dask: Dask array products with tilegemm as the block kernel.

Every block runs the CPU ``triple_loop`` rung: it compiles in about a second per dtype,
where the ``blocked`` rung takes 5-25 s, and the point here is the graph (chunk alignment,
the reduction, batches, schedulers, retries), not the kernel. Results are checked against
the float64 reference with the K-scaled tolerance.

The 2-worker ``LocalCluster`` for the correctness tests runs its workers as threads of this
process (``processes=False``): on a 2-core CI machine, two spawned worker processes would
each need seconds to import NumPy, Numba and tilegemm and to compile the rung again, while
threads share the compiled rung; the tasks still go through the scheduler, the workers and
serialisation of results between them. Only the worker-kill test needs a process it can
kill, so it alone starts worker processes (with a nanny that restarts the killed one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import tilegemm  # noqa: E402
import tilegemm.dask as tgd  # noqa: E402
import tilegemm.errors  # noqa: E402
from tilegemm.reference import assert_close  # noqa: E402

KW = {"kernel": "triple_loop", "backend": "cpu"}

# (a shape, a chunks, b shape, b chunks): odd chunkings.
CASES = {
    "ragged": ((37, 23), ((10, 20, 7), (5, 9, 9)), (23, 19), ((5, 9, 9), (4, 15))),
    "uneven-k": ((17, 31), (6, (20, 3, 8)), (31, 13), ((13, 18), 5)),
    "single-chunk": ((9, 11), -1, (11, 7), -1),
    "k-one": ((8, 1), 3, (1, 6), 4),
    "batch": ((4, 1, 9, 11), (3, 1, 4, (5, 6)), (3, 11, 5), (2, (5, 6), 3)),
    "batch-same": ((3, 7, 10), (2, 7, 4), (3, 10, 6), (2, 4, 6)),
    "vector-left": ((11,), 4, (11, 6), (3, 4)),
    "vector-right": ((6, 11), (4, 3), (11,), 5),
}


def _operands(case: str, dtype=np.float32, seed: int = 0):
    sa, ca, sb, cb = CASES[case]
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(sa).astype(dtype)
    b = rng.standard_normal(sb).astype(dtype)
    return a, b, da.from_array(a, chunks=ca), da.from_array(b, chunks=cb)


def _spy_blocks(monkeypatch, record):
    """Wrap ``tilegemm.matmul`` (what every block calls) and return the list of
    ``record(kwargs)`` for each block, evaluated inside the block's task."""
    seen = []
    real = tilegemm.matmul

    def spy(x, y, **kw):
        seen.append(record(kw))
        return real(x, y, **kw)

    monkeypatch.setattr(tilegemm, "matmul", spy)
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_threaded_matches_numpy(case):
    a, b, da_a, da_b = _operands(case)
    c = tgd.matmul(da_a, da_b, **KW)
    expected_shape = np.matmul(a, b).shape
    assert c.shape == expected_shape and c.dtype == np.float32
    r = c.compute(scheduler="threads")
    assert type(r) is np.ndarray
    assert_close(r, a, b, what=case)


def test_mixed_dtypes_and_integers_exact():
    a, b, da_a, da_b = _operands("uneven-k")
    b64 = b.astype(np.float64)
    c = tgd.matmul(da_a, da.from_array(b64, chunks=(7, 5)), **KW)
    assert c.dtype == np.float64
    assert_close(c.compute(scheduler="threads"), a, b64)
    ai = np.random.default_rng(1).integers(-9, 9, (13, 21)).astype(np.int64)
    bi = np.random.default_rng(2).integers(-9, 9, (21, 5)).astype(np.int64)
    ci = tgd.matmul(da.from_array(ai, chunks=(5, 8)), da.from_array(bi, chunks=(8, 2)), **KW)
    np.testing.assert_array_equal(ci.compute(scheduler="threads"), ai @ bi)


def test_contraction_rechunked_to_the_coarser_side():
    a, b, da_a, da_b = _operands("ragged")
    da_b = da_b.rechunk(((2,) * 11 + (1,), 19))  # 12 K-chunks against a's 3
    c = tgd.matmul(da_a, da_b, **KW)
    # One partial product per K-chunk of a: the coarser chunking won.
    partial = next(v for k, v in c.dask.layers.items() if k.startswith("tilegemm-matmul-")
                   and "sum" not in k)
    assert len(partial) == len(da_a.chunks[0]) * 3 * len(c.chunks[1])
    assert_close(c.compute(scheduler="threads"), a, b)


def test_tree_reduction_and_forwarding(monkeypatch):
    a, b, da_a, da_b = _operands("uneven-k")
    da_a = da_a.rechunk((6, 4))
    da_b = da_b.rechunk((4, 5))  # 8 K-chunks; split_every=2 gives 3 levels of sums
    seen = _spy_blocks(monkeypatch, lambda kw: kw)
    c = tgd.matmul(da_a, da_b, split_every=2, **KW)
    # 8 partial products -> 4 -> 2 (two intermediate levels) -> 1 (the aggregate).
    assert sum(k.startswith("tilegemm-matmul-sum-partial") for k in c.dask.layers) == 2
    assert_close(c.compute(scheduler="threads"), a, b)
    assert len(seen) == 3 * 8 * 3 and all(kw == KW for kw in seen)


def _routed(x) -> bool:
    return any(k.startswith("tilegemm-matmul") for k in x.dask.layers)


def _block_kernels(monkeypatch):
    """The ``kernel=`` each block product of a computed graph asked for."""
    return _spy_blocks(monkeypatch, lambda kw: kw["kernel"])


def test_registered_blocks_nest_and_restore_what_was_before(monkeypatch):
    """Leaving an inner block gives ``a @ b`` back to the outer block, with the outer
    block's keywords; leaving the outer one gives it back to Dask."""
    a, b, da_a, da_b = _operands("single-chunk")
    kernels = _block_kernels(monkeypatch)
    with tgd.registered(**KW):
        with tgd.registered(kernel="blocked", backend="cpu", MR=8, NR=8):
            inner = da_a @ da_b
        outer = da_a @ da_b
        assert _routed(inner) and _routed(outer)
        outer.compute(scheduler="sync")
        assert kernels == ["triple_loop"]  # the outer block's keywords, not the inner's
    assert not _routed(da_a @ da_b)


def test_registered_inside_register_keeps_the_programs_routing(monkeypatch):
    """A library's ``with registered():`` inside a program that called ``register()``."""
    a, b, da_a, da_b = _operands("single-chunk")
    kernels = _block_kernels(monkeypatch)
    tgd.register(**KW)
    try:
        with tgd.registered(kernel="blocked", backend="cpu"):
            pass
        routed = da_a @ da_b
        assert _routed(routed)
        assert_close(routed.compute(scheduler="sync"), a, b)
        assert kernels == ["triple_loop"]
    finally:
        tgd.unregister()
    assert not _routed(da_a @ da_b)


def test_registered_routes_the_operator():
    a, b, da_a, da_b = _operands("ragged")
    plain = da_a @ da_b
    assert not any(k.startswith("tilegemm") for k in plain.dask.layers)
    with tgd.registered(**KW):
        routed = da_a @ da_b
        routed_r = a @ da_b  # NumPy on the left: Dask's __rmatmul__
    assert any(k.startswith("tilegemm-matmul") for k in routed.dask.layers)
    assert any(k.startswith("tilegemm-matmul") for k in routed_r.dask.layers)
    assert not any(k.startswith("tilegemm") for k in (da_a @ da_b).dask.layers)
    assert_close(routed.compute(scheduler="threads"), a, b)
    assert_close(routed_r.compute(scheduler="threads"), a, b)


def _explodes(shape, chunks, dtype=np.float32):
    """A Dask array whose every chunk raises if a task ever computes it."""

    def boom(x):
        raise AssertionError("a task ran")

    return da.zeros(shape, chunks=chunks, dtype=dtype).map_blocks(boom, dtype=dtype)


@pytest.mark.parametrize("a, b, kw, error, match", [
    (((5, 7), 3, np.float32), ((8, 4), 3, np.float32), {}, ValueError, "not aligned"),
    (((2, 5, 7), 3, np.float32), ((3, 7, 4), 3, np.float32), {}, ValueError, "broadcast"),
    (((5, 7), 3, np.float32), ((7, 4), 3, np.complex128), {}, TypeError, "complex128"),
    (((5, 7), 3, np.complex64), ((7, 4), 3, np.complex64), {}, TypeError, "complex64"),
    (((5, 7), (5, (3, 4)), np.float32), ((7, 4), ((4, 3), 4), np.float32), {"align": False},
     ValueError, "contraction axis is chunked"),
    (((3, 5, 7), (1, 5, 7), np.float32), ((3, 7, 4), (2, 7, 4), np.float32),
     {"align": False}, ValueError, "batch axis 0"),
    (((5, 7), 3, np.float32), ((7, 4), 3, np.float32), {"backend": "tpu"}, ValueError,
     "unknown backend"),
    (((5, 7), 3, np.float32), ((7, 4), 3, np.float32), {"backend": "cpu", "kernel": "nope"},
     Exception, "nope"),
    (((5, 7), 3, np.float32), ((7, 4), 3, np.float32), {"TILE": 8}, ValueError,
     "explicit kernel"),
    (((5, 7), 3, np.float32), ((7, 4), 3, np.float32), {"tile": 8}, TypeError, "UPPER-CASE"),
])
def test_bad_input_raises_before_any_task(a, b, kw, error, match):
    x, y = _explodes(*a), _explodes(*b)
    with pytest.raises(error, match=match) as err:
        tgd.matmul(x, y, **kw)
    # a refused call, as tilegemm.matmul reports one (not a failure inside a library)
    assert isinstance(err.value, tilegemm.errors.UsageError)


@pytest.mark.parametrize("kw", [{"backend": "gpu"}, {"TILE": 8},
                                {"backend": "cpu", "kernel": "shared"}])
def test_refusals_say_what_tilegemm_matmul_says(kw):
    """The backend and rung checks are the API's own: same type, same message."""
    a = np.ones((5, 7), np.float32)
    b = np.ones((7, 4), np.float32)
    with pytest.raises(tilegemm.errors.UsageError) as direct:
        tilegemm.matmul(a, b, **kw)
    with pytest.raises(tilegemm.errors.UsageError) as dask:
        tgd.matmul(_explodes((5, 7), 3), _explodes((7, 4), 3), **kw)
    assert type(dask.value) is type(direct.value)
    assert str(dask.value) == str(direct.value)


def test_unknown_chunk_sizes_and_non_arrays_raise():
    x = da.from_array(np.arange(12.0).reshape(3, 4), chunks=2)
    y = x[:, x[0, :] > 0]  # columns, a's contraction axis, unknown until computed
    with pytest.raises(tilegemm.errors.InvalidValueError, match="compute_chunk_sizes"):
        tgd.matmul(y, da.ones((4, 2), chunks=2))
    with pytest.raises(tilegemm.errors.InvalidValueError, match="compute_chunk_sizes"):
        tgd.matmul(da.ones((2, 4), chunks=2), y.T)  # b's contraction axis
    with pytest.raises(tilegemm.errors.InvalidTypeError, match="Dask array"):
        tgd.matmul([[1.0]], da.ones((1, 1)))
    with pytest.raises(ValueError, match="0-d"):
        tgd.matmul(da.ones(()), da.ones((1, 1)))


def test_lazy_until_computed():
    x = _explodes((5, 7), 3)
    c = tgd.matmul(x, da.ones((7, 4), chunks=3, dtype=np.float32), **KW)  # builds, runs nothing
    with pytest.raises(AssertionError, match="a task ran"):
        c.compute(scheduler="sync")


def test_import_tilegemm_does_not_import_dask():
    """... and ``tilegemm.dask`` then imports it on first use: a Dask operand's error says
    "use tilegemm.dask.matmul(a, b)", which failed after ``import tilegemm`` alone."""
    code = ("import sys, tilegemm; assert 'dask' not in sys.modules, 'dask imported'\n"
            "import dask.array as da\n"
            "try:\n    tilegemm.matmul(da.ones((8, 8), chunks=4), da.ones((8, 8), chunks=4))\n"
            "except TypeError as e:\n    assert 'tilegemm.dask.matmul(a, b)' in str(e), e\n"
            "c = tilegemm.dask.matmul(da.ones((8, 8), chunks=4), da.ones((8, 8), chunks=4),"
            " backend='cpu', kernel='triple_loop')\n"
            "assert float(c.compute(scheduler='sync')[0, 0]) == 8.0\n"
            "try:\n    tilegemm.nothing\nexcept AttributeError as e:\n"
            "    assert 'nothing' in str(e)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.fixture(scope="module")
def thread_cluster():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, timeout=30)
    yield client
    client.close(timeout=30)
    cluster.close(timeout=30)


@pytest.mark.parametrize("case", ["ragged", "uneven-k", "single-chunk", "batch"])
def test_local_cluster_matches_numpy(thread_cluster, case):
    a, b, da_a, da_b = _operands(case, seed=3)
    c = tgd.matmul(da_a, da_b, **KW)
    assert_close(thread_cluster.compute(c).result(timeout=60), a, b, what=case)
    assert len(thread_cluster.scheduler_info()["workers"]) == 2


@pytest.mark.slow
def test_worker_killed_mid_computation_still_right():
    a = np.random.default_rng(4).standard_normal((24, 30)).astype(np.float32)
    b = np.random.default_rng(5).standard_normal((30, 12)).astype(np.float32)

    def slow(x):  # defined here so that cloudpickle ships it by value to the workers
        import time

        time.sleep(0.4)
        return x

    da_a = da.from_array(a, chunks=(8, 10)).map_blocks(slow, dtype=a.dtype)  # 9 slow chunks
    da_b = da.from_array(b, chunks=(10, 6))
    c = tgd.matmul(da_a, da_b, **KW)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", death_timeout=60) as cluster, \
            distributed.Client(cluster, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)
        client.run(lambda: __import__("tilegemm").matmul(np.ones((2, 2), np.float32),
                                                       np.ones((2, 2), np.float32), **KW))
        future = client.compute(c)
        deadline = time.monotonic() + 30
        while not any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert not future.done(), "finished before the kill; make the blocks slower"
        victim = sorted(pids.values())[0]
        os.kill(victim, signal.SIGKILL)
        assert_close(future.result(timeout=120), a, b, what="after a worker was killed")
        assert victim not in client.run(os.getpid).values()


@pytest.mark.parametrize("threads", [1, None])
def test_block_kernel_thread_count(monkeypatch, threads):
    """Blocks run one per Dask worker thread, so by default each block's CPU kernel uses
    one thread (no oversubscription); threads=None leaves Numba's own count."""
    import numba

    a, b, da_a, da_b = _operands("uneven-k")
    seen = _spy_blocks(monkeypatch, lambda kw: numba.get_num_threads())
    c = tgd.matmul(da_a, da_b, threads=threads, **KW)
    assert_close(c.compute(scheduler="threads"), a, b)
    expected = 1 if threads == 1 else numba.config.NUMBA_NUM_THREADS
    assert seen and all(n == expected for n in seen)
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS  # restored


@pytest.mark.parametrize(("threads", "error"), [
    (0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)])
def test_bad_thread_count_raises_before_any_task(threads, error):
    _, _, da_a, da_b = _operands("uneven-k")
    with pytest.raises(error, match="threads"):
        tgd.matmul(da_a, da_b, threads=threads)
    with pytest.raises(error, match="split_every"):  # its own name, the same rules
        tgd.matmul(da_a, da_b, split_every=threads if threads != -1 else 1)


def test_a_numpy_integer_thread_count_is_an_int():
    a, b, da_a, da_b = _operands("uneven-k")
    assert_close(tgd.matmul(da_a, da_b, threads=np.int64(2), split_every=np.int32(2),
                            **KW).compute(scheduler="sync"), a, b)


def test_unknown_rows_and_columns_are_multiplied_as_they_come():
    """Rows of a and columns of b are not paired with anything: unknown chunk sizes there
    (a boolean selection) need no compute_chunk_sizes(), as with Dask's own @."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((30, 12)), rng.standard_normal((12, 20))
    da_a, da_b = da.from_array(a, chunks=(7, 5)), da.from_array(b, chunks=(5, 6))
    rows, cols = a[:, 0] > 0, b[0, :] > 0
    got = tgd.matmul(da_a[da_a[:, 0] > 0], da_b[:, da_b[0, :] > 0], **KW)
    assert_close(got.compute(scheduler="sync"), a[rows], b[:, cols])


def test_masked_chunks_are_refused_when_the_graph_is_built():
    x = da.ma.masked_greater(da.ones((4, 4), chunks=2), 0.5)
    with pytest.raises(tilegemm.errors.InvalidTypeError, match="masked chunks"):
        tgd.matmul(x, da.ones((4, 4), chunks=2))


def test_registered_leaves_what_tilegemm_does_not_multiply_to_dask():
    """Registering routes a @ b process-wide: complex, object and masked operands must
    keep Dask's own matmul, not start raising."""
    x = da.from_array(np.arange(16.0).reshape(4, 4), chunks=2)
    others = [(x.astype(np.complex64), x), (x.astype(object), x),
              (da.ma.masked_greater(x, 100), x)]
    with tgd.registered(**KW):
        for p, q in others:
            product = p @ q
            assert not any(k.startswith("tilegemm") for k in product.dask.layers)
        routed = x @ x
    assert any(k.startswith("tilegemm") for k in routed.dask.layers)
    np.testing.assert_allclose(others[0][0].__matmul__(x).compute(), (x @ x).compute())


def test_registered_rung_that_does_not_compute_a_dtype_leaves_it_to_dask():
    """Under registered(kernel=X) with X float-only, int32 a @ b raised InvalidTypeError
    from every @ in the process; Dask's own matmul now computes it. Floats still route."""
    pytest.importorskip("pyopencl")
    from tilegemm.backends import get_backend

    if not get_backend("opencl").status().usable:
        pytest.skip("no OpenCL device")
    ints = da.from_array(np.arange(16, dtype=np.int32).reshape(4, 4), chunks=2)
    with tgd.registered(backend="opencl", kernel="vectorized"):
        product = ints @ ints
        floats = ints.astype(np.float32) @ ints.astype(np.float32)
    assert not any(k.startswith("tilegemm") for k in product.dask.layers)
    assert any(k.startswith("tilegemm") for k in floats.dask.layers)
    np.testing.assert_array_equal(product.compute(), ints.compute() @ ints.compute())


@pytest.mark.parametrize(("kw", "error"), [({"kernel": "nope"}, ValueError),
                                           ({"threads": 0}, ValueError),
                                           ({"kernel": "blocked", "mr": 8}, TypeError)])
def test_register_refuses_its_keywords_at_once(kw, error):
    import dask.array.routines as routines

    before = routines.matmul
    with pytest.raises(error):
        tgd.register(**kw)
    assert routines.matmul is before  # nothing registered


def test_narrow_dtypes_match_numpy_and_add_partials_in_the_kernel_dtype(monkeypatch):
    """float16, bool and narrow or unsigned integers: NumPy's result dtype, with the partial
    products computed and added in the kernel's dtype (float32, int32) and cast once."""
    rng = np.random.default_rng(6)
    seen = _spy_blocks(monkeypatch, lambda kw: kw.get("dtype"))
    for dtype, kernel_dtype in [(np.int8, np.int32), (np.uint8, np.int32), (np.bool_, np.int32),
                                (np.uint32, np.int32), (np.int16, np.int32)]:
        a = rng.integers(-128, 128, (9, 40)).astype(dtype)  # int8 products wrap, as NumPy's
        b = rng.integers(-128, 128, (40, 7)).astype(dtype)
        seen.clear()
        c = tgd.matmul(da.from_array(a, chunks=(4, 6)), da.from_array(b, chunks=(6, 3)), **KW)
        assert c.dtype == (a @ b).dtype
        r = c.compute(scheduler="threads")
        assert r.dtype == (a @ b).dtype
        np.testing.assert_array_equal(r, a @ b, err_msg=np.dtype(dtype).name)
        assert seen and all(d == kernel_dtype for d in seen)

    # float16 over 16 contraction chunks: within one float16 rounding of the exact product,
    # which float16 partial sums (one rounding per addition) would exceed.
    a = rng.uniform(0.5, 1.0, (8, 64)).astype(np.float16)
    b = rng.uniform(0.5, 1.0, (64, 8)).astype(np.float16)
    seen.clear()
    c = tgd.matmul(da.from_array(a, chunks=(8, 4)), da.from_array(b, chunks=(4, 8)), **KW)
    r = c.compute(scheduler="threads")
    assert c.dtype == r.dtype == np.float16 and seen and all(d == np.float32 for d in seen)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(r - exact) <= np.spacing(exact.astype(np.float16)))


def test_vector_dot_and_empty_dimensions():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(11).astype(np.float32)
    y = rng.standard_normal(11).astype(np.float32)
    c = tgd.matmul(da.from_array(x, chunks=4), da.from_array(y, chunks=5), **KW)
    assert c.shape == () and c.dtype == np.float32
    assert_close(c.compute(scheduler="threads"), x, y)
    for sa, ca, sb, cb in [((5, 0), (2, 0), (0, 4), (0, 3)),   # K = 0: zeros
                           ((0, 7), (0, 3), (7, 4), 3), ((5, 7), 3, (7, 0), (3, 0))]:
        a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
        r = tgd.matmul(da.from_array(a, chunks=ca), da.from_array(b, chunks=cb), **KW)
        np.testing.assert_array_equal(r.compute(scheduler="threads"), a @ b)


def test_numpy_operand_is_one_chunk():
    a, b, da_a, da_b = _operands("ragged")
    c = tgd.matmul(a, da_b, **KW)
    assert c.chunks[0] == (a.shape[0],)
    assert_close(c.compute(scheduler="threads"), a, b)
    assert_close(tgd.matmul(da_a, b, **KW).compute(scheduler="threads"), a, b)


def test_rung_parameters_reach_every_block_and_are_checked_first(monkeypatch):
    """UPPER-CASE parameters are validated against the rung when the graph is built and
    passed to every block (the block kernel is faked here: no compile of ``blocked``)."""
    seen = []

    def fake(x, y, **kw):
        seen.append(kw)
        return np.matmul(x, y)

    monkeypatch.setattr(tilegemm, "matmul", fake)
    a, b, da_a, da_b = _operands("uneven-k")
    kw = {"kernel": "blocked", "backend": "cpu", "MR": 8, "NR": 32}
    c = tgd.matmul(da_a, da_b, **kw)
    assert not seen  # lazy
    assert_close(c.compute(scheduler="threads"), a, b)
    assert seen and all(s == kw for s in seen)
    for bad, match in [({"MR": 5}, "MR=5"), ({"MR": 16, "NR": 32}, "MR\\*NR"),
                       ({"TILE": 8}, "TILE")]:
        with pytest.raises(ValueError, match=match):
            tgd.matmul(_explodes((5, 7), 3), _explodes((7, 4), 3), kernel="blocked",
                       backend="cpu", **bad)


def test_backend_missing_here_still_checks_names_and_parameters(monkeypatch):
    """A client without the workers' GPU builds the graph for a CUDA rung, checking the
    rung's name, dtypes and parameters without the device."""

    class Missing:
        def status(self):
            return type("Status", (), {"usable": False})()

    monkeypatch.setattr(tgd, "get_backend", lambda name: Missing())
    x, y = _explodes((8, 8), 4), _explodes((8, 8), 4)
    c = tgd.matmul(x, y, backend="cuda", kernel="shared", TILE=16)
    assert c.shape == (8, 8)
    xi, yi = _explodes((8, 8), 4, np.int64), _explodes((8, 8), 4, np.int64)
    for a, b, kw, error, match in [
        (x, y, {"kernel": "nope"}, ValueError, "nope"),
        (x, y, {"kernel": "shared", "TILE": 7}, ValueError, "TILE=7"),
        (x, y, {"kernel": "shared", "BM": 64}, ValueError, "BM"),
        (xi, yi, {"kernel": "vectorized"}, TypeError, "int64"),
    ]:
        with pytest.raises(error, match=match):
            tgd.matmul(a, b, backend="cuda", **kw)


def test_chunks_of_another_dtype_than_the_metadata_fail_clearly():
    a, b, da_a, da_b = _operands("ragged")
    lying = da_a.map_blocks(lambda t: t.astype(np.float64), dtype=np.float32)
    c = tgd.matmul(lying, da_b, **KW)
    with pytest.raises(RuntimeError, match="graph expects float32"):
        c.compute(scheduler="sync")


def test_dtype_keyword_as_numpy(monkeypatch):
    """``dtype=`` is NumPy's matmul(dtype=): every block computes in it, partials included."""
    rng = np.random.default_rng(8)
    seen = _spy_blocks(monkeypatch, lambda kw: kw.get("dtype"))
    ai = rng.integers(-128, 128, (9, 40)).astype(np.int8)
    bi = rng.integers(-128, 128, (40, 7)).astype(np.int8)
    c = tgd.matmul(da.from_array(ai, chunks=(4, 6)), da.from_array(bi, chunks=(6, 3)),
                   dtype=np.int64, **KW)  # no wrapping: int64 sums
    assert c.dtype == np.int64
    np.testing.assert_array_equal(c.compute(scheduler="threads"),
                                  np.matmul(ai, bi, dtype=np.int64))
    assert seen and all(d == np.int64 for d in seen)

    a, b, da_a, da_b = _operands("uneven-k")
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    seen.clear()
    c = tgd.matmul(da_a.astype(np.float16), da_b.astype(np.float16), dtype=np.float32, **KW)
    r = c.compute(scheduler="threads")
    assert c.dtype == r.dtype == np.float32 and all(d == np.float32 for d in seen)
    assert_close(r, a16.astype(np.float32), b16.astype(np.float32))  # float32, not rounded
    c = tgd.matmul(da_a, da_b, dtype=np.float64, **KW)
    assert c.dtype == np.float64
    assert_close(c.compute(scheduler="threads"), a.astype(np.float64), b.astype(np.float64))
    with pytest.raises(TypeError):
        tgd.matmul(_explodes((5, 7), 3), _explodes((7, 4), 3), dtype=np.int32)  # not same_kind


def test_precision_forwarded_and_checked_before_any_task(monkeypatch):
    seen = _spy_blocks(monkeypatch, lambda kw: kw.get("precision"))
    a, b, da_a, da_b = _operands("ragged")
    c = tgd.matmul(da_a, da_b, precision="ieee", **KW)
    assert_close(c.compute(scheduler="threads"), a, b)
    assert seen and all(p == "ieee" for p in seen)
    x, y = _explodes((5, 7), 3), _explodes((7, 4), 3)
    with pytest.raises(RuntimeError, match="tensor cores"):  # no tensor-core rung on the CPU
        tgd.matmul(x, y, backend="cpu", precision="tf32")
    with pytest.raises(ValueError, match="unknown precision"):
        tgd.matmul(x, y, precision="bogus")
    with pytest.raises(TypeError, match="float32 operands"):
        tgd.matmul(_explodes((5, 7), 3, np.float64), _explodes((7, 4), 3, np.float64),
                   backend="cpu", precision="tf32")


def test_precision_checked_without_the_workers_gpu(monkeypatch):
    class Missing:
        def status(self):
            return type("Status", (), {"usable": False})()

    monkeypatch.setattr(tgd, "get_backend", lambda name: Missing())
    x, y = _explodes((8, 8), 4), _explodes((8, 8), 4)
    assert tgd.matmul(x, y, backend="cuda", precision="tf32").shape == (8, 8)
    assert tgd.matmul(x, y, backend="cuda", kernel="mma", precision="3xtf32").shape == (8, 8)
    with pytest.raises(ValueError, match="cannot compute precision"):
        tgd.matmul(x, y, backend="cuda", kernel="shared", precision="tf32")


def test_a_dask_array_given_to_matmul_is_refused_not_computed():
    """tilegemm.matmul on a Dask array would compute it whole, in memory: refused, naming
    tilegemm.dask.matmul, before anything is computed."""
    computed = []
    x = da.ones((4, 4), chunks=2).map_blocks(lambda b: computed.append(1) or b)
    computed.clear()  # Dask calls the function once on an empty block to learn its type
    for a, b in ((x, np.ones((4, 4))), (np.ones((4, 4)), x)):
        with pytest.raises(TypeError, match="tilegemm.dask.matmul"):
            tilegemm.matmul(a, b)
    assert computed == []
