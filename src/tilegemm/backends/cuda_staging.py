"""Device buffers that products of host (NumPy) arrays reuse from one call to the next.

A product of NumPy arrays on the GPU copies A and B to the device, runs, copies the result
back and waits for it before returning. On an H100's host (2026-11-26) a call at 8×8×8
cost 740 µs for 25 µs of GPU time; ``cuda.to_device`` of an 8×8 array took 113 µs,
``cuda.device_array`` 25 µs, and a call made three device arrays. Reusing the buffers
alone changed nothing measurable (740 → 730 µs): the allocations were cheap, and most of a
copy's time was numba's Python around the driver's copy, which :func:`copy_in` and
:func:`copy_out` skip: on an H100's host that saved 150–520 µs a call at 8³–256³ (8³
float32: 1071 → 628 µs, median of seven rounds). Such a call is finished with its buffers
when it returns, so the next call of the same shapes can copy into them:

- **Per host thread.** Two threads never share a buffer, whatever streams they use.
- **Per CUDA context.** A buffer is only reused in the context it was made in.
- **Taken while in use.** A call takes its buffers out and puts them back only after
  its result has arrived; a call that fails drops them, so a buffer a failed launch may
  still be using is never handed out again.
- **Small products only.** Buffers of products over ``KEEP_BYTES`` are made for their
  call and freed: such a product spends its time computing, and holding its buffers would
  keep that much GPU memory from the caller.
- **A few recent shapes.** The ``KEPT`` most recently used sets per thread; older ones
  are freed.

Private module: imports numba only when a buffer is made.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np

KEPT = 4  # buffer sets kept per host thread (one per shape and dtype combination)
KEEP_BYTES = 16 * 1024 * 1024  # the largest set kept: A, B and the result together

Layout = tuple[tuple[tuple[int, ...], np.dtype], ...]  # (shape, dtype) per buffer


class _Kept(threading.local):
    """This thread's buffer sets, least recently used first."""

    def __init__(self) -> None:
        self.sets: OrderedDict[Hashable, tuple[Any, ...]] = OrderedDict()


_kept = _Kept()


def take(layout: Layout, stream: Any) -> tuple[Hashable | None, tuple[Any, ...]]:
    """``(key, buffers)``: device arrays of ``layout``'s shapes and dtypes, this thread's
    kept ones where it has them (their contents are whatever the last call left), else
    new ones made on ``stream``. Hand them back with :func:`put_back` and ``key`` once
    the device is done with them; ``key`` is None for a set too large to keep."""
    from numba import cuda

    nbytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in layout)
    key = None if nbytes > KEEP_BYTES else (_context_key(), layout)
    found = _kept.sets.pop(key, None) if key is not None else None
    if found is not None:
        return key, found
    return key, tuple(cuda.device_array(shape, dtype=dtype, stream=stream)
                      for shape, dtype in layout)


def _context_key() -> int:
    """The current CUDA context's identity. numba keeps one context object per device
    until ``cuda.close()``, after which it makes new ones (and a kept buffer holds its own
    context object alive, so its ``id`` cannot pass to a new one). The simulator has one
    device and makes a new context object on every request: 0 there."""
    from numba import cuda

    from tilegemm import simulator

    return 0 if simulator.enabled() else id(cuda.current_context())


def put_back(key: Hashable | None, buffers: tuple[Any, ...]) -> None:
    """Keep ``buffers`` for this thread's next call of the same layout (the least
    recently used set goes when more than ``KEPT`` are kept). The context's identity in
    ``key`` cannot pass to a new context while the set is kept: the buffers hold their
    context alive."""
    if key is None:
        return
    _kept.sets[key] = buffers
    while len(_kept.sets) > KEPT:
        _kept.sets.popitem(last=False)


def copy_in(dev: Any, host: np.ndarray, stream: Any) -> None:
    """Copy the C-contiguous host array ``host`` into ``dev``, a buffer from :func:`take`
    of the same shape and dtype, on ``stream``.

    The driver's copy is called directly: numba's ``copy_to_device`` re-slices both
    arrays, checks their layouts and enters its context manager on every call, host time
    that took several times the copy's own in a profile of 8×8 products on an H100
    (2026-11-26). A buffer from :func:`take` needs none of that: it is dense, made for this
    shape and dtype, and its context is current (the call that made it made it so). The
    simulator's arrays take numba's method."""
    _copy(dev, host, stream, to_device=True)


def copy_out(host: np.ndarray, dev: Any, stream: Any) -> None:
    """Copy ``dev`` (a buffer from :func:`take`) into the C-contiguous, writeable host
    array ``host`` of the same shape and dtype, on ``stream``: as :func:`copy_in`, the
    driver's copy directly. The caller waits for ``stream`` before reading ``host``."""
    _copy(dev, host, stream, to_device=False)


def _copy(dev: Any, host: np.ndarray, stream: Any, to_device: bool) -> None:
    if not host.size:  # K = 0 (and NumPy's strides for an empty array may not match)
        return
    _check_pair(dev, host)
    from tilegemm import simulator

    if simulator.enabled():
        (dev.copy_to_device if to_device else dev.copy_to_host)(host, stream=stream)
        return
    from numba.cuda.cudadrv import driver

    if to_device:
        driver.host_to_device(dev, host, host.nbytes, stream=stream)
    else:
        driver.device_to_host(host, dev, host.nbytes, stream=stream)


def _check_pair(dev: Any, host: np.ndarray) -> None:
    """A raw copy between arrays of different sizes or a strided host array would read or
    write the wrong bytes: refused as the internal error it would be."""
    if (tuple(dev.shape) != host.shape or np.dtype(dev.dtype) != host.dtype
            or not host.flags.c_contiguous):
        raise RuntimeError(
            f"internal error: staging copy between a {tuple(dev.shape)} {dev.dtype} device "
            f"buffer and a {host.shape} {host.dtype} host array "
            f"({'' if host.flags.c_contiguous else 'not '}C-contiguous)")


def clear() -> None:
    """Free this thread's kept buffers."""
    _kept.sets.clear()


def kept() -> int:
    """How many buffer sets this thread keeps."""
    return len(_kept.sets)
