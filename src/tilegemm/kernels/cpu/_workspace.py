"""Per-thread scratch memory for the CPU rungs' packed panels, kept between calls.

The blocked rung packs a panel of B and blocks of A into scratch arrays on every call
(about 8.5 MiB for a float32 2048³ product with the default blocks). Allocated afresh per
call, that memory comes back from the operating system as new pages whenever the
allocator hands large freed blocks straight back to it. That is what dask.distributed's
workers do: their nanny sets ``MALLOC_TRIM_THRESHOLD_=65536``, which also pins glibc's
threshold for serving allocations by ``mmap`` at 128 KiB, so every panel is mapped,
page-faulted in 4 KiB at a time (about 2000 faults for that product) and unmapped again.
Measured on an Intel Xeon (family 6 model 167, KVM), one thread, float32 2048³: 180 →
170 GFLOP/s with that setting, while NumPy/OpenBLAS, which keeps its own buffers, did not
move. OpenBLAS's answer is the same as this module's: keep the buffer.

Each thread keeps one buffer (the largest it has needed, up to :data:`KEEP_BYTES`) and
reuses it for every dtype and parameter set; a thread never runs two products at once, so
no lock is needed, and threads never share one. Larger requests get a new buffer each time
(their product is large enough that the pages cost little beside it).
"""

from __future__ import annotations

import threading

import numpy as np

# The largest buffer a thread keeps between calls (the default blocks need about
# 4·(2048·512 + M·512) bytes for an M-row product: 8.5 MiB at M = 2048, 64 MiB near
# M = 30000).
KEEP_BYTES = 64 * 1024 * 1024
ALIGN = 64

_local = threading.local()
_EMPTY = np.empty(0, dtype=np.uint8)


def _aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` bytes starting on a 64-byte boundary (a cache line, an AVX-512 vector)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + nbytes]


def workspace(nbytes: int) -> np.ndarray:
    """A 64-byte aligned uint8 array of exactly ``nbytes`` bytes, reused by this thread.

    Its contents are whatever the last user left: callers must write before they read.
    """
    if nbytes == 0:
        return _EMPTY
    buf = getattr(_local, "buf", None)
    if buf is not None and buf.size >= nbytes:
        return buf[:nbytes]
    buf = _aligned(nbytes)
    if nbytes <= KEEP_BYTES:
        _local.buf = buf
    return buf


def kept_bytes() -> int:
    """How many bytes this thread's kept buffer holds (0 when none)."""
    buf = getattr(_local, "buf", None)
    return 0 if buf is None else int(buf.size)


def release() -> None:
    """Drop this thread's kept buffer (the memory returns when nothing else holds it)."""
    _local.buf = None
