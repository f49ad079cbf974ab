"""Kernel launches without most of numba-cuda's per-call Python.

``kernel[grid, block, stream, smem](*args)`` types every argument, looks up the compiled
overload for those types, builds a launch configuration and converts the stream, on every
call: 40-120 µs of Python per launch on an H200 machine's host (2026-11-26,
``benchmarks/results/logs-nvidia-h200-2026-11-26c``), against 20 µs for cuBLAS's whole
1024³ TF32 product. A rung is launched with arguments of the same types call after call,
so :func:`launch_kernel` keys the compiled overload by a cheap description of them (a device
array's dtype, dimensions and contiguity, which decide numba's array type; a scalar's
type), lets numba make the first launch of each key as usual, and afterwards calls the
overload's own ``launch`` (numba's argument marshalling, its driver call) directly.
Measured in that record: 11 % fewer Python function calls per wgmma TF32 launch (two
copies and the kernel), 21 % fewer per ``matmul`` on device arrays (the opt-in to more
shared memory no longer types the arguments either); numba's ``launch`` of the overload
is then most of what is left, about 50 µs a launch.

What numba's path does that this skips is checked once per key: a kernel compiled for its
launch configuration (``launch_config_sensitive``) always goes through numba. A numba-cuda
without what this reads (the overload's ``launch``, ``driver._to_core_stream``) makes
every launch go through numba, as does the simulator (its kernels are Python).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

# (dispatcher, arguments' key) -> numba's compiled overload, or False: numba's own path
_OVERLOADS: dict[tuple[Any, tuple[Any, ...]], Any] = {}
_LOCK = threading.Lock()


def arg_key(args: tuple[Any, ...], array_type: type) -> tuple[Any, ...] | None:
    """What decides the overload numba compiles for ``args``, or None where this cannot
    say cheaply (an argument that is neither a numba device array, ``array_type``, nor a
    Python or NumPy scalar: numba types it itself). numba's array type is the dtype, the
    dimensions and the layout, which follows from the two contiguity flags; a scalar's
    type is its Python or NumPy type (float: float64, np.float32: float32)."""
    key = []
    for a in args:
        if isinstance(a, array_type):
            flags = a.flags
            key.append((a.dtype, a.ndim, flags["C_CONTIGUOUS"], flags["F_CONTIGUOUS"]))
        elif isinstance(a, (int, float, np.generic)):
            key.append(type(a))
        else:
            return None
    return tuple(key)


def _array_type() -> type:
    """numba's device array class (what the backend passes every operand as)."""
    from numba.cuda.cudadrv import devicearray

    return devicearray.DeviceNDArray


def _dims(d: Any) -> tuple[int, ...]:
    """A grid or block as numba's launch normalises it: three integers."""
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def launch_kernel(dispatcher: Any, grid: Any, block: Any, stream: Any, smem: int,
                  args: tuple[Any, ...], prepare: Callable[[Any], None] | None = None,
                  ) -> None:
    """``dispatcher[grid, block, stream, smem](*args)``, through the compiled overload
    directly once numba has launched it for arguments of these types.

    ``prepare(kernel)``, if given, runs before every launch with the overload about to run
    (the opt-in to more dynamic shared memory, which is per device: see
    ``cuda_program.opt_in_dynamic_shared``). Under the simulator: numba's launch, and no
    ``prepare``."""
    from tilegemm import simulator

    if simulator.enabled():
        dispatcher[grid, block, stream, smem](*args)
        return
    from numba.cuda.cudadrv import driver

    key = arg_key(args, _array_type())
    kernel = None if key is None else _OVERLOADS.get((dispatcher, key))
    if not kernel:  # no key, a first launch, or a kernel numba must launch itself
        first = key is not None and (dispatcher, key) not in _OVERLOADS
        if prepare is not None or first:  # (else numba's launch alone types the arguments)
            kernel = dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in args))
        if prepare is not None:
            prepare(kernel)
        dispatcher[grid, block, stream, smem](*args)
        if first:
            direct = (callable(getattr(kernel, "launch", None))
                      and hasattr(driver, "_to_core_stream")
                      and not getattr(kernel, "launch_config_sensitive", False))
            with _LOCK:
                _OVERLOADS[(dispatcher, key)] = kernel if direct else False
        return
    if prepare is not None:
        prepare(kernel)
    kernel.launch(args, _dims(grid), _dims(block), driver._to_core_stream(stream), smem)
