"""NumPy's BLAS threads during measurements on the host's cores (``bench.host_blas``): the
check's float64 products run on one BLAS thread when the kernel runs on the host CPU and
the product is small enough (on all of them otherwise, followed by a pause), the thread
count comes back afterwards, and a NumPy contender is followed by a pause for its threads
to stop spinning. Thread counts and calls are asserted, never times."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tilegemm.backends.base import Prepared
from tilegemm.bench import host_blas, vendors
from tilegemm.bench.timing import OK, Policy, time_prepared
from tilegemm.problem import GemmProblem
from tilegemm.reference import random_operands

needs_openblas = pytest.mark.skipif(host_blas.blas_threads() is None,
                                    reason="NumPy's BLAS here is not an OpenBLAS we can reach")


@pytest.fixture
def two_threads():
    """OpenBLAS on (at least) two threads, so 'one thread' cannot pass by accident on a
    one-core machine or under OPENBLAS_NUM_THREADS=1; restored after."""
    get, set_ = host_blas._thread_control()
    before = get()
    set_(max(2, before))
    yield get()
    set_(before)


def _one_launch_kernel() -> Prepared:
    out = np.zeros((1, 2, 2))
    return Prepared(lambda: None, lambda: out, lambda n: [1e-3] * n)


@needs_openblas
def test_one_blas_thread_inside_and_the_count_restored_after(two_threads):
    with host_blas.one_blas_thread():
        assert host_blas.blas_threads() == 1
        a = np.random.default_rng(0).standard_normal((300, 300))
        np.testing.assert_allclose(a @ a.T, (a @ a.T).T)  # BLAS calls work inside
    assert host_blas.blas_threads() == two_threads


@needs_openblas
def test_the_count_is_restored_when_the_block_raises(two_threads):
    with pytest.raises(ZeroDivisionError), host_blas.one_blas_thread():
        1 / 0  # noqa: B018
    assert host_blas.blas_threads() == two_threads


@needs_openblas
def test_overlapping_blocks_restore_the_count_when_the_last_ends(two_threads):
    """Two threads' blocks overlapping, the first to open closing first: the count stays
    at one until both are closed, then comes back (not stuck at one)."""
    a_open, b_open, a_closed = threading.Event(), threading.Event(), threading.Event()
    seen: list[int | None] = []

    def first() -> None:
        with host_blas.one_blas_thread():
            a_open.set()
            b_open.wait(10)
        a_closed.set()

    def second() -> None:
        a_open.wait(10)
        with host_blas.one_blas_thread():
            b_open.set()
            a_closed.wait(10)
            seen.append(host_blas.blas_threads())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == [1] and host_blas.blas_threads() == two_threads


def test_without_thread_control_the_block_ends_with_a_pause(monkeypatch):
    monkeypatch.setattr(host_blas, "_thread_control", lambda: None)
    slept: list[float] = []
    with host_blas.one_blas_thread(sleep=slept.append):
        assert slept == []
    assert slept == [host_blas.SETTLE_S]


@needs_openblas
def test_a_large_check_runs_threaded_then_pauses(two_threads):
    slept: list[float] = []
    with host_blas.quiet_check(host_blas.ONE_THREAD_MAX + 1, sleep=slept.append):
        assert host_blas.blas_threads() == two_threads and slept == []
    assert slept == [host_blas.SETTLE_S]
    with host_blas.quiet_check(host_blas.ONE_THREAD_MAX, sleep=slept.append):
        assert host_blas.blas_threads() == 1
    assert slept == [host_blas.SETTLE_S]  # no pause after a one-thread check


@needs_openblas
@pytest.mark.parametrize("host_work", [1000, 0])
def test_the_check_runs_on_one_blas_thread_only_for_kernels_on_the_host(two_threads,
                                                                        host_work):
    seen: list[int | None] = []
    first, samples = time_prepared(_one_launch_kernel,
                                   lambda _: seen.append(host_blas.blas_threads()),
                                   Policy(warmup=0, min_reps=2, max_reps=2),
                                   host_work=host_work)
    assert seen == [1 if host_work else two_threads]
    assert len(samples) == 2 and host_blas.blas_threads() == two_threads


def test_a_numpy_contender_waits_for_its_threads(monkeypatch):
    slept: list[str] = []
    monkeypatch.setattr(vendors, "settle", lambda: slept.append("settle"))
    prob = GemmProblem(m=8, n=8, k=8, dtype=np.dtype(np.float64), batch_shape=(1,),
                       a_batch_shape=(1,), b_batch_shape=(1,))
    a, b = random_operands((1, 8, 8), (1, 8, 8), np.float64)
    policy = Policy(warmup=0, min_reps=2, max_reps=2)
    meas = vendors.measure_vendor(vendors.numpy_vendor(), "cpu", prob, a, b, policy,
                                  host_work=512)
    assert meas.status == OK and slept == ["settle"]
    # a vendor that is not NumPy's BLAS (here the same routine, flagged otherwise) does not
    other = vendors.Vendor("other", "Other", "", vendors.numpy_vendor().prepare)
    assert vendors.measure_vendor(other, "cpu", prob, a, b, policy).status == OK
    assert slept == ["settle"]


@needs_openblas
@pytest.mark.parametrize("accelerated", [False, True])
def test_measure_kernel_checks_on_one_thread_on_a_cpu_device_only(monkeypatch, two_threads,
                                                                  accelerated):
    from test_bench_timing import FakeBackend, FakeClock, _problem, _spec
    from tilegemm.backends.base import BackendStatus
    from tilegemm.bench import timing

    class Device(FakeBackend):
        def status(self) -> BackendStatus:
            return BackendStatus("cpu", True, "fake", accelerated=accelerated)

    seen: list[int | None] = []
    real = timing.assert_close

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(host_blas.blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(timing, "assert_close", spy)
    prob, a3, b3 = _problem()
    clock = FakeClock()
    m = timing.measure_kernel(Device(clock, 1e-3), _spec(), {}, prob, a3, b3,
                              Policy(warmup=0, min_reps=2, max_reps=2), clock=clock)
    assert m.status == OK
    assert seen == [two_threads if accelerated else 1]
