"""Products of host arrays reuse their device buffers (tilegemm.backends.cuda_staging).

A reused buffer holds the previous call's data, so these tests alternate inputs and
shapes, check every result against float64 NumPy, and check what is kept: per thread,
only small products, at most ``KEPT`` sets, none after a failed call. Under the simulator
the device arrays are NumPy arrays, which shows the reuse itself; on a GPU
(TILEGEMM_GPU_TESTS=1) the same tests run on real buffers.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tilegemm
from tilegemm.backends import cuda_staging
from tilegemm.reference import assert_close

cudasim = pytest.mark.cudasim


@pytest.fixture(autouse=True)
def _fresh() -> None:
    cuda_staging.clear()
    yield
    cuda_staging.clear()


def _pair(rng: np.random.Generator, m: int, n: int, k: int, dtype: type = np.float32
          ) -> tuple[np.ndarray, np.ndarray]:
    return (rng.uniform(0.5, 1.5, (m, k)).astype(dtype),
            rng.uniform(-1.5, -0.5, (k, n)).astype(dtype))


def _check(a: np.ndarray, b: np.ndarray) -> None:
    assert_close(tilegemm.matmul(a, b, backend="cuda", kernel="naive", BLOCK=8), a, b)


@cudasim
def test_a_repeated_shape_reuses_its_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    from numba import cuda

    rng = np.random.default_rng(1)
    _check(*_pair(rng, 7, 13, 5))
    assert cuda_staging.kept() == 1
    made = []
    real = cuda.device_array
    monkeypatch.setattr(cuda, "device_array", lambda *a, **k: made.append(a) or real(*a, **k))
    for _ in range(3):  # fresh data each time: a stale operand or result would show
        _check(*_pair(rng, 7, 13, 5))
    assert made == []
    assert cuda_staging.kept() == 1


@cudasim
def test_shapes_alternate_and_the_oldest_set_goes() -> None:
    rng = np.random.default_rng(2)
    shapes = [(1, 9, 1), (5, 3, 1), (33, 17, 65), (1, 1, 9), (9, 17, 8)]
    for m, n, k in shapes + shapes[::-1]:
        _check(*_pair(rng, m, n, k))
    assert cuda_staging.kept() == cuda_staging.KEPT
    _check(*_pair(rng, 5, 3, 1, np.float64))  # another dtype is another set
    assert cuda_staging.kept() == cuda_staging.KEPT


@cudasim
def test_a_batch_and_a_broadcast_operand() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2):
        a = rng.uniform(0.5, 1.5, (3, 7, 5)).astype(np.float32)
        b = rng.uniform(-1.5, -0.5, (5, 11)).astype(np.float32)
        _check(a, b)
        _check(b.T.copy(), a.transpose(0, 2, 1))


@cudasim
def test_a_large_product_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_staging, "KEEP_BYTES", 7 * 5 * 4 + 5 * 13 * 4)  # A and B fit
    _check(*_pair(np.random.default_rng(4), 7, 13, 5))
    assert cuda_staging.kept() == 0
    monkeypatch.setattr(cuda_staging, "KEEP_BYTES", (7 * 5 + 5 * 13 + 7 * 13) * 4)
    _check(*_pair(np.random.default_rng(4), 7, 13, 5))
    assert cuda_staging.kept() == 1


@cudasim
def test_a_failed_call_drops_its_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm.backends import cuda as cuda_backend

    rng = np.random.default_rng(5)
    _check(*_pair(rng, 7, 13, 5))
    assert cuda_staging.kept() == 1

    def broken(*args, **kwargs):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(cuda_backend, "poison_enabled", broken)  # after the copies
    with pytest.raises(RuntimeError, match="launch failed"):
        tilegemm.matmul(*_pair(rng, 7, 13, 5), backend="cuda", kernel="naive",
                        BLOCK=8)
    assert cuda_staging.kept() == 0
    monkeypatch.undo()
    _check(*_pair(rng, 7, 13, 5))
    assert cuda_staging.kept() == 1


@cudasim
def test_out_and_beta_with_reused_buffers() -> None:
    rng = np.random.default_rng(6)
    for _ in range(2):
        a, b = _pair(rng, 9, 17, 8)
        c = rng.uniform(-1, 1, (9, 17)).astype(np.float32)
        out = np.full((9, 17), np.nan, np.float32)
        got = tilegemm.gemm(a, b, c, alpha=1.5, beta=-0.5, out=out, backend="cuda",
                            kernel="naive", BLOCK=8)
        assert got is out
        assert_close(out, a, b, alpha=1.5, beta=-0.5, c=c)


@cudasim
def test_each_thread_keeps_its_own() -> None:
    rng = np.random.default_rng(7)
    pairs = [_pair(rng, 7, 13, 5) for _ in range(2)]
    seen: list[int] = []
    failures: list[BaseException] = []

    def work(a: np.ndarray, b: np.ndarray) -> None:
        try:
            _check(a, b)
            seen.append(cuda_staging.kept())
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    for p in pairs:  # one after the other: the simulator runs one kernel at a time
        t = threading.Thread(target=work, args=p)
        t.start()
        t.join()
    assert failures == []
    assert seen == [1, 1]
    assert cuda_staging.kept() == 0  # the main thread made none


class _Buffer:
    """A stand-in for a device buffer from cuda_staging.take: what the copies read."""

    def __init__(self, shape: tuple[int, ...], dtype: type) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)


@pytest.fixture
def driver_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The GPU's path (not the simulator's), with numba's driver copies recorded."""
    from numba.cuda.cudadrv import driver

    from tilegemm import simulator

    if simulator.enabled():
        pytest.skip("the driver's copies are replaced here; the simulator has none")
    calls: list[tuple] = []
    monkeypatch.setattr(driver, "host_to_device",
                        lambda dst, src, size, stream=0: calls.append(("in", dst, src, size,
                                                                       stream)))
    monkeypatch.setattr(driver, "device_to_host",
                        lambda dst, src, size, stream=0: calls.append(("out", dst, src, size,
                                                                       stream)))
    return calls


def test_copies_call_the_driver_with_the_whole_buffer(driver_calls: list[tuple]) -> None:
    host = np.arange(2 * 3 * 5, dtype=np.float64).reshape(2, 3, 5)
    dev, stream = _Buffer((2, 3, 5), np.float64), object()
    cuda_staging.copy_in(dev, host, stream)
    cuda_staging.copy_out(host, dev, stream)
    assert driver_calls == [("in", dev, host, 240, stream), ("out", host, dev, 240, stream)]


def test_empty_copies_call_nothing(driver_calls: list[tuple]) -> None:
    empty = np.empty((1, 4, 0), np.float32)
    cuda_staging.copy_in(_Buffer((1, 4, 0), np.float32), empty, 0)
    cuda_staging.copy_out(empty, _Buffer((1, 4, 0), np.float32), 0)
    assert driver_calls == []


@pytest.mark.parametrize("host", [
    np.zeros((1, 3, 5), np.float32),  # another shape
    np.zeros((2, 3, 5), np.float64),  # another dtype
    np.zeros((2, 5, 3), np.float32).transpose(0, 2, 1),  # strided
])
def test_a_mismatched_copy_is_an_internal_error(driver_calls: list[tuple],
                                               host: np.ndarray) -> None:
    with pytest.raises(RuntimeError, match="internal error"):
        cuda_staging.copy_in(_Buffer((2, 3, 5), np.float32), host, 0)
    with pytest.raises(RuntimeError, match="internal error"):
        cuda_staging.copy_out(host, _Buffer((2, 3, 5), np.float32), 0)
    assert driver_calls == []
