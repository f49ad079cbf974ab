"""The GPU's own time per launch, apart from the host's.

The steady figures of :mod:`tilegemm.bench.timing` bracket each launch with a pair of CUDA
events. When the host takes longer to issue a launch than the GPU takes to run it (one
launch from Python costs tens of microseconds, a 1024³ FP32 product about 60), the GPU
waits for the host between the two events, and that wait is in the figure: it is then
what a caller pays per call, not what the kernel takes.

Here the queue is filled first. A small kernel holds the GPU (one thread sleeping in a
loop), the launches are issued behind it, and the events bracket all of them: when the
holding kernel ends, the GPU runs them back to back, and the time between the events over
their number is the GPU's time per launch. Whether the host finished issuing before the
GPU caught up is known, not assumed: if the first event has already been reached when the
last launch is issued, the queue ran dry and the measurement is repeated with the GPU held
four times as long.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

HOLD_US = 20_000  # how long the GPU is first held (µs): 20 launches of up to 1 ms each
MAX_HOLD_US = 1_280_000


cuda: Any = None  # numba.cuda (or a test's stand-in), bound by _hold_kernel


def hold(count):  # noqa: ANN001, ANN201 - a kernel's source
    """One thread sleeping ``count`` times about a microsecond (``nanosleep``, sm_70+: the
    GPU is held without occupying its SMs)."""
    for _ in range(count):
        cuda.nanosleep(1000)


@cache
def _hold_kernel(module: Any) -> Any:
    global cuda
    cuda = module
    return module.jit(hold)


def gpu_seconds_per_launch(launch: Callable[[], None], count: int = 20, *,
                           cuda: Any = None, hold_us: int = HOLD_US,
                           max_hold_us: int = MAX_HOLD_US) -> tuple[float, bool]:
    """Seconds per ``launch()`` on the GPU alone, ``count`` launches issued on the default
    stream behind a kernel that holds the GPU; and whether the queue still ran dry at the
    longest hold (``max_hold_us``), when the figure holds some of the host's time.

    ``launch`` must enqueue its work on the default stream (a prepared rung's or the
    vendor library's ``Prepared.launch``) and be warm: compiled and run once before.
    ``cuda``: ``numba.cuda`` unless given (tests give a stand-in).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if cuda is None:
        from numba import cuda
    kernel = _hold_kernel(cuda)
    held_us = hold_us
    while True:
        start, end = cuda.event(), cuda.event()
        kernel[1, 1](held_us)
        start.record()  # reached when the holding kernel ends
        for _ in range(count):
            launch()
        end.record()
        dry = start.query()  # the GPU got there before the last launch was issued
        end.synchronize()
        seconds = cuda.event_elapsed_time(start, end) / 1e3 / count
        if not dry or held_us >= max_hold_us:
            return seconds, dry
        held_us = min(4 * held_us, max_hold_us)
