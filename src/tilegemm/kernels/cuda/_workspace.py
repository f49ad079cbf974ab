"""Device scratch arrays a program keeps between calls, one per CUDA stream and device.

Some programs run a second kernel around their GEMM: split-K sums partial products from a
workspace; rung wgmma can copy B into a K-major workspace first. Allocating the workspace
on every call (and freeing it, which synchronises the device) would cost more than the
extra kernel, so each program keeps one per stream and device and reuses it while the
shape and dtype stay the same. Work on one stream runs in order, so a call's kernels can
reuse the previous call's workspace on that stream; two streams never share one.

Private module: imports numba only when a workspace is made.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

from tilegemm.backends import cuda_launch
from tilegemm.backends.cuda_stream import PER_THREAD_DEFAULT, canonical_handle, stream_handle

KEPT_WORKSPACES = 4  # per program: a caller cycling through new streams keeps only these
# The largest workspace kept between calls. A larger one (rung wgmma's copies of operands
# of 8192 x 8192 float32 and up) is made for its call and dropped after it: holding it
# would keep that much device memory from the caller for as long as the program lives,
# and a product that large takes milliseconds, beside which the allocation costs little.
KEEP_BYTES = 256 * 1024 * 1024


class Workspaces:
    """One program's workspaces, by (device, stream). ``lock`` is held by the program
    while it enqueues the kernels of one call, so two host threads sharing a stream
    cannot interleave their use of its workspace. It is reentrant: a program that copies
    its operands first holds it across the copies and the product, whose own launches
    (split-K's partial sums) take it again."""

    def __init__(self) -> None:
        self._spaces: dict[tuple[int, Hashable, str], Any] = {}
        self.lock = threading.RLock()

    def get(self, shape: tuple[int, ...], dtype: np.dtype, stream: Any, slot: str = "",
            device: int | None = None) -> Any:
        """This stream's workspace ``slot`` (a program may keep several) of ``shape`` and
        ``dtype``, kept for the next call. ``device``: the current device's ``device_key()``
        if the caller has it already (finding it asks the driver)."""
        from numba import cuda

        key = (device_key() if device is None else device, stream_key(stream), slot)
        if math.prod(shape) * np.dtype(dtype).itemsize > KEEP_BYTES:
            self._spaces.pop(key, None)  # a smaller one kept for this key is no use now
            return cuda.device_array(shape, dtype=dtype, stream=stream)
        work = self._spaces.get(key)
        if work is None or tuple(work.shape) != tuple(shape) or np.dtype(work.dtype) != dtype:
            self._spaces.pop(key, None)
            while len(self._spaces) >= KEPT_WORKSPACES:  # the oldest goes first
                self._spaces.pop(next(iter(self._spaces)))
            work = cuda.device_array(shape, dtype=dtype, stream=stream)
            self._spaces[key] = work
        return work

    def __len__(self) -> int:
        return len(self._spaces)


# context handle -> numba's id of its device: numba's own query of the current device
# checks its context state on the way, tens of microseconds of a launch's host time
_DEVICE_OF_CONTEXT: dict[int, int] = {}


def device_key() -> int:
    """The current CUDA device's id (0 under the simulator, whose device has none), found
    once per context: afterwards by the current context's handle (``cuCtxGetCurrent``)."""
    drv = cuda_launch.driver()  # (through the module: a test or benchmark may swap it)
    context = drv.context() if drv is not None else 0
    known = _DEVICE_OF_CONTEXT.get(context) if context else None
    if known is not None:
        return known
    from numba import cuda

    try:
        found = int(cuda.get_current_device().id)
    except Exception:  # the simulator's device has no id
        return 0
    context = drv.context() if drv is not None else 0  # (numba may have made it current)
    if context:
        _DEVICE_OF_CONTEXT[context] = found
    return found


def stream_key(stream: Any) -> Hashable:
    """A stream's identity: its handle (0 for the default stream). Not the Python object:
    numba makes a new one for the same stream on every call (``cuda.default_stream()``,
    ``cuda.external_stream(h)``), and once one is freed its ``id`` can come back for
    another stream, which then shared a workspace with work still queued on the first.
    The per-thread default stream (handle 2, or 0 where numba is set to use it) is one
    stream per host thread under one handle: its key adds the thread, or two threads'
    kernels would share a workspace on two streams that do not wait for each other.
    The simulator's streams have no handle; it runs everything in order, so one key."""
    if stream is None or isinstance(stream, int):
        handle = stream or 0
    else:
        handle = stream_handle(stream)
        if handle is None:
            return 0
    if canonical_handle(handle) == PER_THREAD_DEFAULT:
        return (handle, threading.get_ident())
    return handle
