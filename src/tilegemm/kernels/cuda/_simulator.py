"""A fix for a race in numba's CUDA simulator, installed before any rung runs on it.

The simulator runs a block's threads as Python threads, and ``cuda.shared.array`` finds a
block's array by a check-then-create on a dict keyed by the calling source line. Two
threads can both miss and each create its own array, so some threads of a block then
write to a private "shared" array: rarely, a correct tiled kernel computes a wrong result,
and the traced analysis sees phantom bank conflicts. This module replaces the method with
the same logic under a lock. The original keys allocations by its caller's frame, so the
replacement reimplements it (a wrapper would change the caller) rather than wrapping it.

It also replaces how the simulator runs a block (``BlockManager.run``). numba's version
polls: the main thread loops over the block's threads asking each whether it waits at the
barrier or has ended, without pause, competing for the interpreter with the threads doing
the work. Here each thread says so itself, under a condition the main thread sleeps on,
and the block's barrier opens when every live thread waits at it, as before. A rung
ran 2.3 times faster this way (rung mma, 64x64 tiles, 128 threads a block); the results
are the same. Two more changes here: only the last thread to reach the barrier (or one
that ends) wakes the main thread, which had looked over the whole block at every arrival;
and while a block runs, Python's switch interval is long, so each thread runs until it
waits instead of being preempted every 5 ms in favour of one of a hundred others. With
one barrier per warp-wide instruction in the tensor-core emulations (three before), they
took a 3xTF32 product of rung wgmma (70 x 45 x 200, four blocks of 128 threads) from 16.6
to 7.0 s on a 2-vCPU Zen 3, and the simulator's half of the test suite from 343 to 220 s.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from typing import Any

_LOCK = threading.Lock()
# Seconds a simulated GPU thread runs before Python may hand the interpreter to another
# (5 ms by default) while a block runs: each thread then runs until it waits at a barrier,
# instead of being interrupted mid-way by one of a hundred others waiting for their turn.
_SWITCH_INTERVAL = 0.2
_installed = False


def _locked_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
    import numpy as np
    from numba.core import types
    from numba.np import numpy_support

    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:  # dynamic shared memory: one buffer, as in the simulator
        # np.dtype(): a scalar type such as np.float32 has no itemsize of its own (numba's
        # version fails on it; compiled kernels accept it)
        count = self._dynshared_size // np.dtype(dtype).itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _LOCK:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = np.empty(shape, dtype)
    return res


def _run_block(self: Any, grid_point: Any, *args: Any) -> None:
    """``BlockManager.run``: one block's threads, each a Python thread, to their end; the
    barrier opens when every thread still running waits at it (a thread that has ended
    counts as arrived, as on the GPU). The first exception in a thread aborts the others
    and is raised here, as numba's version does. A thread's floating-point overflow or
    invalid operation is as silent as on the GPU (NumPy warned once per thread, naming the
    kernel's line), unless the simulator runs in its debug mode."""
    import numpy as np

    def quiet() -> None:  # the arithmetic of a GPU thread raises and warns of nothing
        with np.errstate(all="ignore"):
            self._f(*args)

    target = (lambda: self._f(*args)) if self._debug else quiet  # debug: numba's own
    thread_class = _block_thread_class()
    block = _Block(math.prod(self._block_dim))
    threads = [thread_class(target, self, grid_point, point, self._debug, block)
               for point in np.ndindex(*self._block_dim)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL)
    try:
        for t in threads:
            t.start()
        block.run(threads)
    finally:
        sys.setswitchinterval(switch)
    for t in threads:
        t.join()


class _Block:
    """What a block's threads tell its manager, under ``cond``: how many still run
    (``live``), which wait at the barrier (``blocked``), and whether one failed. A thread
    wakes the manager only when it is the last to arrive at the barrier, or ends: with
    every arrival waking it, the manager looked over all the block's threads once per
    thread and barrier."""

    def __init__(self, threads: int) -> None:
        self.cond = threading.Condition()
        self.blocked: list[Any] = []
        self.live = threads
        self.failed = False

    def arrive(self, thread: Any) -> None:
        """``thread`` waits at the barrier (called under ``cond``)."""
        self.blocked.append(thread)
        if len(self.blocked) == self.live:
            self.cond.notify()

    def end(self, thread: Any) -> None:
        """``thread`` has ended, with ``thread.exception`` if it failed (under ``cond``)."""
        self.live -= 1
        self.failed = self.failed or thread.exception is not None
        self.cond.notify()

    def run(self, threads: list[Any]) -> None:
        """Open the barrier whenever every live thread waits at it, until all have ended."""
        with self.cond:
            while True:
                if self.failed:
                    failed = next(t for t in threads if t.exception)
                    for t in threads:  # each waiting thread wakes, sees abort and ends
                        t.abort = True
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
                    raise failed.exception[0].with_traceback(failed.exception[1])
                if self.live == 0:
                    return
                if self.blocked and len(self.blocked) == self.live:
                    for t in self.blocked:
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
                    self.blocked.clear()
                    continue
                self.cond.wait()


@functools.cache
def _block_thread_class() -> type:
    """numba's ``BlockThread`` that tells its :class:`_Block` when it waits at the barrier
    and when it has ended."""
    from numba.cuda.simulator.kernel import BlockThread

    class SignallingBlockThread(BlockThread):
        def __init__(self, f: Any, manager: Any, block_idx: Any, thread_idx: Any,
                     debug: bool, block: _Block) -> None:
            super().__init__(f, manager, block_idx, thread_idx, debug)
            self._block = block

        def run(self) -> None:
            try:
                super().run()  # records an exception in self.exception
            finally:
                with self._block.cond:
                    self._block.end(self)

        def syncthreads(self) -> None:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            with self._block.cond:
                self.syncthreads_blocked = True
                self._block.arrive(self)
            self.syncthreads_event.wait()
            self.syncthreads_event.clear()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    return SignallingBlockThread


def install() -> None:
    """Replace ``FakeCUDAShared.array`` with the locked version and ``BlockManager.run``
    with the signalling one (idempotent)."""
    global _installed
    if _installed:
        return
    from numba.cuda.simulator.kernel import BlockManager
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    FakeCUDAShared.array = _locked_array
    BlockManager.run = _run_block
    _installed = True
