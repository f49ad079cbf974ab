"""NumPy's BLAS threads, kept off the cores while a kernel on the host CPU is timed.

Every measurement checks its first result against a float64 NumPy product, and on the
CPU the NumPy contender is itself a BLAS call. OpenBLAS's worker threads do not sleep
when a call returns: they spin, about 0.1 s, waiting for the next one. On the host's own
cores that steals a core from whatever is timed next, the CPU rung's threads or PoCL's:
on a 2-core machine a kernel timed right after its check ran at half speed for its first
0.1 s (the quick ladder at 256³: medians up to 1.8× too slow, CLBlast's 1.5×, and nearly
every row flagged as noisy). Two remedies:

- :func:`one_blas_thread` runs the check's BLAS calls on the calling thread only (OpenBLAS
  reached through ``ctypes``, as ``threadpoolctl`` does), so no worker wakes up;
- :func:`settle` waits out the spinning after a BLAS call that used its threads (the
  NumPy contender, a check too large to run on one thread, or one where the BLAS cannot
  be told to use one thread).

:func:`quiet_check` picks between them by the size of the product: one thread costs a
check of 512³ about 20 ms, but one of 4096³ seconds on a many-core host, where a 0.3 s
pause after a threaded check is cheaper.

Measurements on a GPU keep the threaded check: the host's threads do not slow a GPU, and
a one-thread float64 reference at 4096³ would cost seconds per rung. The thread count is
the process's: NumPy calls that other threads make during a check run on one thread too.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# How long OpenBLAS's threads spin after a call (its THREAD_TIMEOUT, 2^28 cycles of the
# time-stamp counter: 0.07-0.13 s at 2-4 GHz; measured 0.1 s on a 2-vCPU AMD EPYC, 0.1-0.3 s
# seen on other machines), with a margin.
SETTLE_S = 0.3
# Largest check (multiply-adds) run on one BLAS thread; larger ones run threaded, then settle
ONE_THREAD_MAX = 512**3

# (get, set) pairs of OpenBLAS's thread-count functions, as each kind of build names them
_THREAD_SYMBOLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)


def openblas_library() -> ctypes.CDLL | None:
    """The OpenBLAS that NumPy's wheel ships (in ``numpy.libs``), loaded through ctypes
    (the same copy NumPy already uses); None for another BLAS or a NumPy built otherwise."""
    import numpy as np

    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(glob.glob(str(libs / "*openblas*"))):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@functools.cache
def _thread_control() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    lib = openblas_library()
    if lib is None:
        return None
    for get_name, set_name in _THREAD_SYMBOLS:
        get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
        if get is not None and set_ is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            return get, set_
    return None


def blas_threads() -> int | None:
    """How many threads NumPy's OpenBLAS uses now (None: not an OpenBLAS we can reach)."""
    control = _thread_control()
    return None if control is None else control[0]()


_LOCK = threading.Lock()
_DEPTH = [0, 0]  # blocks open now (any thread), and the thread count before the first


@contextmanager
def one_blas_thread(sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """NumPy's BLAS calls inside the block run on the calling thread alone; the thread
    count is restored when the last open block ends (blocks may overlap across threads).
    Where the BLAS cannot be told so, the block ends with :func:`settle` instead."""
    control = _thread_control()
    if control is None:
        try:
            yield
        finally:
            settle(sleep)
        return
    get, set_ = control
    with _LOCK:
        if _DEPTH[0] == 0:
            _DEPTH[1] = get()
            set_(1)
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                set_(_DEPTH[1])


@contextmanager
def quiet_check(multiply_adds: int, sleep: Callable[[float], None] = time.sleep
                ) -> Iterator[None]:
    """Around the float64 check of a product of ``multiply_adds`` computed on the host's
    cores: on one BLAS thread up to :data:`ONE_THREAD_MAX`, else threaded and then
    :func:`settle`. Either way no BLAS thread spins when the kernel is timed next.
    0: the product did not run on the host's cores, and nothing is done."""
    if multiply_adds <= 0:
        yield
        return
    if multiply_adds <= ONE_THREAD_MAX:
        with one_blas_thread(sleep):
            yield
        return
    try:
        yield
    finally:
        settle(sleep)


def settle(sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until BLAS threads woken by a call just made have stopped spinning."""
    sleep(SETTLE_S)
