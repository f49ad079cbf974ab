"""The simulator's cuda.shared.array hands every thread of a block the same array.

numba's own FakeCUDAShared.array does check-then-create on a dict; a slow allocation (a
sleeping np.empty releases the GIL) makes the race certain, so this test fails without
tilegemm's locked replacement and passes with it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest


def _allocate_concurrently(shared, monkeypatch) -> set[int]:
    real_empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.002)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", slow_empty)
    got: list[np.ndarray] = []  # keep the arrays alive: ids of freed arrays get reused

    def worker() -> None:
        got.append(shared.array(8, np.float32))  # one source line for every thread

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {id(a) for a in got}


@pytest.mark.cudasim
@pytest.mark.simulator
def test_shared_array_allocation_is_atomic(monkeypatch):
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    from tilegemm.kernels.cuda._simulator import install

    install()
    assert len(_allocate_concurrently(FakeCUDAShared(0), monkeypatch)) == 1


# --- how a block runs: the barrier opens when every live thread waits at it ---------------

cuda = None  # numba.cuda, bound by _kernels(): the simulator swaps a kernel's global only


def _kernels():  # noqa: ANN202
    global cuda
    from numba import cuda

    @cuda.jit
    def tree_sum(x, out, early):
        """A block's sum by halving through shared memory, one barrier a step; threads
        below ``early`` leave at the start (on the GPU an exited thread counts as arrived).
        A barrier that opens before every live thread has written gives a wrong sum."""
        s = cuda.shared.array(64, np.float64)
        t = cuda.threadIdx.x
        s[t] = x[cuda.blockIdx.x, t]
        cuda.syncthreads()
        if t < early:
            return
        half = 32
        while half > 0:
            v = 0.0
            if t >= early and t < half:
                v = s[t] + s[t + half]
            cuda.syncthreads()
            if t >= early and t < half:
                s[t] = v
            cuda.syncthreads()
            half //= 2
        if t == early:
            out[cuda.blockIdx.x] = s[0] if early == 0 else -1.0
        counted = cuda.syncthreads_count(t % 3 == 0)
        if t == 63:
            out[cuda.gridDim.x + cuda.blockIdx.x] = counted

    @cuda.jit
    def fails(out):
        cuda.syncthreads()
        if cuda.threadIdx.x == 5:
            raise ValueError("thread five")
        cuda.syncthreads()
        out[cuda.threadIdx.x] = 1.0

    return tree_sum, fails


def _within(seconds: float, launch) -> None:  # noqa: ANN001
    """``launch()`` in a thread of its own: a runner whose barrier never opens fails the
    test after ``seconds`` instead of hanging it (the simulator's threads are daemons)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            launch()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the block did not finish within {seconds} s"
    if errors:
        raise errors[0]


@pytest.mark.cudasim
@pytest.mark.simulator
def test_a_block_runs_to_the_same_result_through_every_barrier() -> None:
    """Several blocks of 64 threads, five barriers and a counting barrier each: every sum
    exact. numba's runner polled the threads without pause; tilegemm's waits to be told."""
    from tilegemm.kernels.cuda._simulator import install

    install()
    tree_sum, _ = _kernels()
    x = np.random.default_rng().integers(-9, 9, (3, 64)).astype(np.float64)
    out = np.full(6, np.nan)
    _within(60, lambda: tree_sum[3, 64](x, out, 0))
    np.testing.assert_array_equal(out[:3], x.sum(axis=1))
    np.testing.assert_array_equal(out[3:], 22)  # 0, 3, ..., 63


@pytest.mark.cudasim
@pytest.mark.simulator
def test_threads_that_have_ended_count_as_arrived() -> None:
    """Threads 0-1 leave after the first barrier; the other 62 pass four more barriers and
    a counting one between themselves (a runner waiting for all 64 would never return)."""
    from tilegemm.kernels.cuda._simulator import install

    install()
    tree_sum, _ = _kernels()
    out = np.full(2, np.nan)
    _within(60, lambda: tree_sum[1, 64](np.ones((1, 64)), out, 2))
    assert out[0] == -1.0 and out[1] == 21  # 3, 6, ..., 63: thread 0 has left


@pytest.mark.cudasim
@pytest.mark.simulator
def test_an_exception_in_one_thread_ends_the_block_and_is_raised() -> None:
    from tilegemm.kernels.cuda._simulator import install

    install()
    _, fails = _kernels()
    with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\].*thread five"):
        _within(60, lambda: fails[1, 32](np.zeros(32)))


@pytest.mark.cudasim
@pytest.mark.simulator
def test_a_block_runs_with_a_long_switch_interval_and_restores_it() -> None:
    """A block's threads run each until it waits (Python's switch interval is long while a
    block runs: 5 ms preemptions among a hundred threads took a third of the tensor-core
    tests' time), and the caller's interval is back afterwards, also when a thread failed."""
    import sys

    from tilegemm.kernels.cuda import _simulator

    _simulator.install()
    _, fails = _kernels()  # binds the module's cuda, which the simulator swaps

    @cuda.jit
    def interval(out):
        out[cuda.threadIdx.x] = sys.getswitchinterval()

    before = sys.getswitchinterval()
    out = np.full(4, np.nan)
    interval[1, 4](out)
    # (Python keeps the interval in microseconds)
    np.testing.assert_allclose(out, _simulator._SWITCH_INTERVAL, rtol=1e-6)
    assert before < _simulator._SWITCH_INTERVAL
    assert sys.getswitchinterval() == before
    with pytest.raises(ValueError, match="thread five"):
        fails[1, 32](np.zeros(32))
    assert sys.getswitchinterval() == before
