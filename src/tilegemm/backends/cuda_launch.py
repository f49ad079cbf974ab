"""Kernel launches without most of numba-cuda's per-call Python.

``kernel[grid, block, stream, smem](*args)`` types every argument, looks up the compiled
overload for those types, builds a launch configuration and converts the stream, on every
call: 40-120 µs of Python per launch on an H200 machine's host (2026-11-26,
``benchmarks/results/logs-nvidia-h200-2026-11-26c``), against 20 µs for cuBLAS's whole
1024³ TF32 product. A rung is launched with arguments of the same types call after call,
so :func:`launch_kernel` keys the compiled overload by a cheap description of them (a device
array's dtype, dimensions and contiguity, which decide numba's array type; a scalar's
type), lets numba make the first launch of each key as usual, and afterwards launches the
overload itself.

Afterwards means: the arguments packed here as numba packs them (an array as two null
pointers, its element count, item size, data address, shape and byte strides; a scalar
as its C type), and the driver's ``cuLaunchKernel`` called through ``ctypes`` with the
overload's loaded kernel, in the context current on the calling thread. numba's own
``launch`` of the overload (its argument marshalling and ``cuda.core``'s launch) was about
50 µs a launch on that host; this is a few microseconds. The context is read on every
launch (``cuCtxGetCurrent``, well under a microsecond): a launch in a context this key has
not launched in yet (another thread's or device's) goes through numba, which loads the
kernel there. A driver error is raised as :class:`LaunchError`, never ignored.

What numba's path does that this skips is checked once per key: a kernel compiled for its
launch configuration (``launch_config_sensitive``), or one with an argument this does not
pack (anything but arrays, floats and integers), or one compiled with ``debug=True`` or
using grid-wide synchronisation (a cooperative launch), always goes through numba. So does every
launch where the driver library cannot be opened with ``ctypes``, or in a process started
with ``TILEGEMM_NUMBA_LAUNCH=1`` (a way back to numba's launches, should these ever
misbehave), and every launch under the simulator (its kernels are Python).

:class:`DeviceView` describes device memory (an address, shape, byte strides and dtype)
without numba's array object: the CUDA backend hands it for CuPy and PyTorch arrays on
calls it has seen before (``backends/cuda_direct``). numba itself never receives one: its
launches get a numba array over the same memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from tilegemm import simulator
from tilegemm.backends.cuda_stream import stream_handle

# (dispatcher, arguments' key) -> numba's compiled overload, or False: numba's own path
_OVERLOADS: dict[tuple[Any, tuple[Any, ...]], Any] = {}
# (overload, context handle) -> its _Direct launcher there
_DIRECT: dict[tuple[Any, int], _Direct] = {}
_LOCK = threading.Lock()


class LaunchError(RuntimeError):
    """The driver refused a kernel launch (an internal failure, not a usage error)."""


class DeviceView:
    """``shape``, byte ``strides`` and ``dtype`` of device memory at address ``ptr``: what a
    kernel launch reads of an array, and nothing that owns the memory (the caller's CuPy
    or PyTorch array does, for as long as the work queued on it needs)."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "flags", "size")

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 dtype: np.dtype, flags: dict[str, bool] | None = None) -> None:
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.size = 1
        for n in shape:
            self.size *= n
        self.flags = flags if flags is not None else contiguity(shape, strides,
                                                                dtype.itemsize)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_c_contiguous(self) -> bool:
        return self.flags["C_CONTIGUOUS"]

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "strides": self.strides, "typestr": self.dtype.str,
                "data": (self.ptr, False), "version": 3}


def contiguity(shape: tuple[int, ...], strides: tuple[int, ...],
               itemsize: int) -> dict[str, bool]:
    """numba's ``C_CONTIGUOUS`` and ``F_CONTIGUOUS`` flags for an array of this layout, by
    numba's own rule (NumPy's: axes of length 1 are skipped, an empty array is both, a
    zero stride elsewhere neither), which decides the layout a kernel is compiled for: a
    view must never be keyed as contiguous where numba would not call it so."""
    both = {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
    if not shape or 0 in shape:
        return both
    if 0 in strides:
        return {"C_CONTIGUOUS": False, "F_CONTIGUOUS": False}
    c = f = True
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1:
            c = c and s == expected
            expected *= n
    expected = itemsize
    for n, s in zip(shape, strides):
        if n != 1:
            f = f and s == expected
            expected *= n
    return {"C_CONTIGUOUS": c, "F_CONTIGUOUS": f}


def arg_key(args: tuple[Any, ...], array_type: type | tuple[type, ...]
            ) -> tuple[Any, ...] | None:
    """What decides the overload numba compiles for ``args``, or None where this cannot
    say cheaply (an argument that is neither a device array, ``array_type``, nor a
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


@cache
def _array_type() -> tuple[type, ...]:
    """The device arrays a launch packs: numba's device array class and :class:`DeviceView`."""
    from numba.cuda.cudadrv import devicearray

    return (devicearray.DeviceNDArray, DeviceView)


def _dims(d: Any) -> tuple[int, ...]:
    """A grid or block as numba's launch normalises it: three integers."""
    if type(d) is tuple and len(d) == 3:
        x, y, z = d
        return (int(x), int(y), int(z))
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


class _Driver:
    """The three driver entry points a direct launch calls, through ``ctypes``."""

    def __init__(self, lib: Any) -> None:
        vp, u = ctypes.c_void_p, ctypes.c_uint
        self.launch = lib.cuLaunchKernel
        self.launch.restype = ctypes.c_int
        self.launch.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        self.get_context = lib.cuCtxGetCurrent
        self.get_context.restype = ctypes.c_int
        self.get_context.argtypes = [ctypes.POINTER(vp)]
        self._error_name = lib.cuGetErrorName
        self._error_name.restype = ctypes.c_int
        self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def context(self) -> int:
        """The calling thread's current context handle (0: none)."""
        ctx = ctypes.c_void_p()
        return (ctx.value or 0) if self.get_context(ctypes.byref(ctx)) == 0 else 0

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self._error_name(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return f"error {code}"


@cache
def driver() -> _Driver | None:
    """The CUDA driver library as ``ctypes`` opens it (the one numba-cuda has loaded), or
    None where it cannot be opened, or where ``TILEGEMM_NUMBA_LAUNCH`` asks for numba's
    launches (read once per process): every launch then goes through numba, and every
    call on CuPy/PyTorch arrays takes the full path."""
    if os.environ.get("TILEGEMM_NUMBA_LAUNCH", "0").strip().lower() not in ("", "0", "no",
                                                                             "false", "off"):
        return None
    names = (["nvcuda.dll"] if sys.platform == "win32"
             else ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")])
    for name in names:
        if not name:
            continue
        try:
            return _Driver(ctypes.CDLL(name))
        except (OSError, AttributeError):
            continue
    return None


# struct formats of a launch's scalar arguments by numba type name, each padded to the
# 8-byte slot it is given
_SCALARS = {"float32": "f4x", "float64": "d", "int32": "i4x", "int64": "q",
            "uint32": "I4x", "uint64": "Q"}


class _Direct:
    """One overload's launch in one context: its loaded kernel and how its arguments pack.

    The parameter values are written into one buffer of 8-byte slots, which the driver
    copies during ``cuLaunchKernel``; a lock keeps two threads from filling it at once."""

    __slots__ = ("handle", "fmt", "arrays", "smem", "buffer", "params", "lock")

    def __init__(self, handle: int, fmt: str, count: int, arrays: tuple[bool, ...],
                 smem: int) -> None:
        self.handle = handle  # the kernel (a CUkernel, launched in the current context)
        self.fmt = fmt  # struct format of all parameter values, 8 bytes each
        self.arrays = arrays  # per argument: an array (else a scalar)
        self.smem = smem  # dynamic shared memory this context's kernel is opted in to
        self.buffer = ctypes.create_string_buffer(8 * count)
        base = ctypes.addressof(self.buffer)
        self.params = (ctypes.c_void_p * count)(*range(base, base + 8 * count, 8))
        self.lock = threading.Lock()

    def launch(self, args: tuple[Any, ...], grid: tuple[int, ...], block: tuple[int, ...],
               stream: int, smem: int, drv: _Driver) -> None:
        values: list[Any] = []
        for is_array, a in zip(self.arrays, args):
            if is_array:
                ptr = a.ptr if type(a) is DeviceView else (a.device_ctypes_pointer.value or 0)
                values += (0, 0, a.size, a.dtype.itemsize, ptr, *a.shape, *a.strides)
            else:
                values.append(a)
        with self.lock:
            struct.pack_into(self.fmt, self.buffer, 0, *values)
            code = drv.launch(self.handle, *grid, *block, smem, stream or None, self.params,
                              None)
        if code:
            raise LaunchError(f"cuLaunchKernel failed: {drv.error_name(code)} "
                              f"(grid {grid}, block {block}, {smem} bytes of shared memory)")


def _direct_for(kernel: Any, smem: int) -> _Direct | None:
    """A direct launcher of numba's overload ``kernel`` in the current context (which
    numba has just launched it in), or None where its arguments are not all arrays and
    scalars this packs, or where numba's launch does more than the driver's plain launch:
    a kernel compiled with ``debug=True`` (numba reads its exception flag after each
    launch) or a cooperative one (launched with ``cuLaunchCooperativeKernel``)."""
    if getattr(kernel, "debug", False) or getattr(kernel, "cooperative", False):
        return None
    try:
        from numba.cuda import types  # numba-cuda's own type classes
    except ImportError:  # an older numba-cuda: numba's
        from numba.core import types

    fmt, count, arrays = "=", 0, []
    for t in kernel.argument_types:
        if isinstance(t, types.Array):
            fmt += "q" * (5 + 2 * t.ndim)
            count += 5 + 2 * t.ndim
            arrays.append(True)
        elif str(t) in _SCALARS:
            fmt += _SCALARS[str(t)]
            count += 1
            arrays.append(False)
        else:
            return None
    handle = int(kernel._codelibrary.get_cufunc().handle)
    return _Direct(handle, fmt, count, tuple(arrays), smem)


def _for_numba(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each :class:`DeviceView` as a numba device array over its memory."""
    if not any(type(a) is DeviceView for a in args):
        return args
    from numba import cuda

    return tuple(cuda.as_cuda_array(a, sync=False) if type(a) is DeviceView else a
                 for a in args)


def stream_int(stream: Any) -> int:
    """A launch's stream as the driver takes it: 0 (numba's default), or a handle."""
    if not stream:
        return 0
    return stream_handle(stream) or 0


def launch_kernel(dispatcher: Any, grid: Any, block: Any, stream: Any, smem: int,
                  args: tuple[Any, ...], prepare: Callable[[Any], None] | None = None,
                  ) -> None:
    """``dispatcher[grid, block, stream, smem](*args)``, launched directly once numba has
    launched it for arguments of these types in this context.

    ``prepare(kernel)``, if given, runs before a launch with the overload about to run
    (the opt-in to more dynamic shared memory, which is per device: see
    ``cuda_program.opt_in_dynamic_shared``): before every launch numba makes, and before
    a direct one that needs more than its context was opted in to. Under the simulator:
    numba's launch, and no ``prepare``."""
    if simulator.enabled():
        dispatcher[grid, block, stream, smem](*args)
        return
    key = arg_key(args, _array_type())
    kernel = None if key is None else _OVERLOADS.get((dispatcher, key))
    drv = driver() if kernel else None
    if drv is not None:
        context = drv.context()
        direct = _DIRECT.get((kernel, context)) if context else None
        if direct is not None:
            if smem > direct.smem and prepare is not None:
                prepare(kernel)
                direct.smem = smem
            direct.launch(args, _dims(grid), _dims(block), stream_int(stream), smem, drv)
            return
    # numba's launch: a first launch of these types, or in this context, or one numba
    # must make itself
    numba_args = _for_numba(args)
    first = key is not None and (dispatcher, key) not in _OVERLOADS
    if not kernel and (prepare is not None or first):  # (else numba's launch types them)
        kernel = dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in numba_args))
    if prepare is not None:
        prepare(kernel)
    dispatcher[grid, block, stream, smem](*numba_args)
    if first:
        with _LOCK:
            _OVERLOADS[(dispatcher, key)] = (
                False if getattr(kernel, "launch_config_sensitive", False) else kernel)
    if kernel and _OVERLOADS.get((dispatcher, key)) and driver() is not None:
        context = driver().context()
        if context and (kernel, context) not in _DIRECT:
            made = _direct_for(kernel, smem)
            with _LOCK:
                if made is None:  # an argument this does not pack: numba's, always
                    _OVERLOADS[(dispatcher, key)] = False
                else:
                    _DIRECT[(kernel, context)] = made
