"""What a cudac rung's ``build`` returns: how to launch its kernel on device arrays.

``cudac_spec`` declares a rung: the ``SPEC`` of a CUDA C kernel that runs a Numba rung's
algorithm. Kept free of GPU imports until a launch. The kernel is compiled (NVRTC) and loaded
(``cuda.core``) the first time it runs on a device, for that device's architecture.
Operands are any objects with ``__cuda_array_interface__`` (numba, CuPy, PyTorch arrays)
shaped (batch or 1, M, K), (batch or 1, K, N) and (batch, M, N); their data pointers and
strides go to the kernel as they are, so strided and transposed views need no copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilegemm.launch import Grid
from tilegemm.registry import KernelSpec

# The backend these rungs belong to: this package's name (tilegemm.kernels.<backend>).
BACKEND = __name__.split(".")[-2]

_KERNELS: dict[tuple[Any, ...], Any] = {}


@dataclass(frozen=True)
class CudacProgram:
    name: str  # the rung's name; the entry point is tilegemm_<name>
    params: tuple[tuple[str, int], ...]
    dtype: str
    block: tuple[int, int, int]
    grid: Grid  # (batch, M, N) -> blocks

    def kernel(self) -> Any:
        """The loaded ``cuda.core`` Kernel for the current device (compiled once per arch)."""
        from cuda.core import Device, ObjectCode

        from tilegemm.kernels.cudac._compile import compile_cubin

        dev = Device()
        dev.set_current()
        major, minor = dev.compute_capability
        arch = f"sm_{major}{minor}"
        key = (self.name, self.params, self.dtype, dev.device_id)
        if key not in _KERNELS:
            cubin = compile_cubin(self.name, dict(self.params), self.dtype, arch)
            code = ObjectCode.from_cubin(cubin.data)
            _KERNELS[key] = code.get_kernel(cubin.kernel)
        return _KERNELS[key]

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any, stream: Any = None) -> None:
        """One launch on ``stream``: a numba stream (what the CUDA backend passes), anything
        with ``__cuda_stream__``, an integer handle, or None for the default stream."""
        from cuda.core import LaunchConfig, launch

        batch, m, n = (int(x) for x in C.shape)
        k = int(A.shape[2])
        itemsize = np.dtype(self.dtype).itemsize
        pointers, strides = [], []
        for x in (A, B, C):
            ptr, s = _pointer_and_strides(x, itemsize)
            if int(x.shape[0]) == 1:
                s = (0,) + s[1:]  # one matrix for every product
            pointers.append(np.uint64(ptr))
            strides.extend(np.int64(v) for v in s)
        sizes = [np.int32(batch), np.int32(m), np.int32(n), np.int32(k)]
        t = np.dtype(self.dtype).type
        config = LaunchConfig(grid=self.grid(batch, m, n), block=self.block)
        launch(_core_stream(stream), config, self.kernel(), *pointers, *sizes, *strides,
               t(alpha), t(beta))


def cudac_spec(numba_rung: KernelSpec, doc: str, *, title: str,
               block: Callable[[Mapping[str, int]], tuple[int, int, int]],
               grid: Callable[[Mapping[str, int]], Grid], **fields: Any) -> KernelSpec:
    """The ``SPEC`` of a CUDA C rung that runs the algorithm of ``numba_rung``.

    It takes that rung's name and number (so ``tilegemm bench`` shows the two side by
    side) and its parameters, constraints, dtypes, threads and shared memory (so one
    parameter set compiles on both); ``fields`` replaces any of those (``params=``).
    ``block(params)`` is the thread block and ``grid(params)`` the launch grid for
    (batch, M, N); the kernel is ``kNN_<name>.cu`` beside the rung's module.
    """
    name = numba_rung.name

    def build(p: Mapping[str, int], dtype: np.dtype) -> CudacProgram:
        return CudacProgram(name, tuple(sorted(p.items())), dtype.name, block(p), grid(p))

    shared = {"params": numba_rung.params, "constraints": numba_rung.constraints,
              "dtypes": numba_rung.dtypes, "threads": numba_rung.threads,
              "smem": numba_rung.smem}
    return KernelSpec(name=name, backend=BACKEND, rung=numba_rung.rung, title=title,
                      build=build, doc=doc, **{**shared, **fields})


def _core_stream(stream: Any) -> Any:
    """The ``cuda.core`` stream for a numba stream, a ``__cuda_stream__`` object or a
    handle. Handles 0 and 1 are the legacy default stream (numba's default stream, on
    which its copies and events run), 2 the per-thread default stream."""
    from cuda.core import LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM, Stream

    if stream is None:
        handle = 0
    elif hasattr(stream, "__cuda_stream__"):
        handle = int(stream.__cuda_stream__()[1])
    else:
        handle = int(stream)
    if handle in (0, 1):
        return LEGACY_DEFAULT_STREAM
    if handle == 2:
        return PER_THREAD_DEFAULT_STREAM
    return Stream.from_handle(handle)


def _pointer_and_strides(x: Any, itemsize: int) -> tuple[int, tuple[int, ...]]:
    """Data pointer and element strides of a 3-D ``__cuda_array_interface__`` array."""
    iface = x.__cuda_array_interface__
    shape = tuple(int(s) for s in iface["shape"])
    if len(shape) != 3:
        raise ValueError(f"cudac kernels take 3-D operands, got shape {shape}")
    byte_strides = iface.get("strides")
    if byte_strides is None:  # C-contiguous
        byte_strides = (shape[1] * shape[2] * itemsize, shape[2] * itemsize, itemsize)
    if any(s % itemsize for s in byte_strides):
        raise ValueError(f"strides {byte_strides} are not whole elements of {itemsize} bytes")
    return int(iface["data"][0]), tuple(int(s) // itemsize for s in byte_strides)
