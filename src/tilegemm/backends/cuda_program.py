"""What a CUDA rung's ``build`` returns: the jitted kernel and how to launch it.

Kept free of numba imports so rung modules can import it at top level. Every CUDA rung has
the same kernel signature ``kernel(A, B, C, alpha, beta)`` with ``A`` (batch or 1, M, K),
``B`` (batch or 1, K, N), ``C`` (batch, M, N); one signature is what lets the backend,
the resource report and the analysis treat all rungs alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilegemm.backends.cuda_launch import DeviceView, launch_kernel

# Bytes of shared memory a block may declare statically, and use dynamically without
# opting in, on every CUDA GPU.
STATIC_SMEM_LIMIT = 48 * 1024
# Dynamic shared memory a block may use after opting in, on every GPU of compute capability
# 8.0 or newer (the tensor-core rung's minimum): 99 KB on sm_86/sm_89/sm_120, more on
# sm_80 (163 KB) and sm_90 (227 KB). A real GPU's Target reports its own maximum; this is
# the figure without one (the simulator, compile-only checks, the rung's constraint).
MIN_OPTIN_SMEM_SM80 = 99 * 1024


@dataclass(frozen=True)
class CudaProgram:
    kernel: Any  # numba.cuda Dispatcher
    block: tuple[int, int, int]
    grid: Callable[[int, int, int], tuple[int, int, int]]  # (batch, M, N) -> blocks
    # numba types of (operands and C, alpha and beta) for ahead-of-time PTX, where they
    # are not the dtype's own: bfloat16 arrays are passed as their bit patterns (int16)
    # (numba has no bfloat16 array type) with float32 scalars.
    arg_types: tuple[str, str] | None = None
    # Bytes of dynamic shared memory (``cuda.shared.array(0, ...)``) each launch gives a
    # block: the fourth value of numba's launch configuration. Above 48 KB the kernel
    # must first be opted in (see opt_in_dynamic_shared).
    dynamic_smem: int = 0

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any, stream: Any = 0) -> None:
        self.launch_with(self.kernel, A, B, C, alpha, beta, stream)

    def launch_with(self, kernel: Any, A: Any, B: Any, C: Any, alpha: Any, beta: Any,
                    stream: Any = 0) -> None:
        """Launch ``kernel`` (this program's, or another of the same signature, block and
        shared memory that a program chooses per call) on these operands."""
        batch, m, n = C.shape
        smem = self.dynamic_smem
        # above 48 KB, the kernel about to run is opted in first (the simulator has no such
        # limit to lift, and launch_kernel() calls no prepare there)
        prepare = (lambda kernel: opt_in_dynamic_shared(kernel, smem)
                   ) if smem > STATIC_SMEM_LIMIT else None
        launch_kernel(kernel, self.grid(batch, m, n), self.block, stream, smem,
                      (A, B, C, alpha, beta), prepare)

    def kernel_operands(self, A: Any, B: Any) -> tuple[Any, Any]:
        """The (A, B) the kernel itself reads for host (NumPy) operands laid out as the
        signature says: these same arrays, unless the program prepares an operand before
        its kernel runs (rung wgmma's K-major copy of B). Used where the kernel is run
        directly, without :meth:`launch` (the memory trace)."""
        return A, B

    def signature(self, dtype: str) -> str:
        """The C-contiguous signature used for ahead-of-time PTX (resource reports)."""
        elem, scalar = self.arg_types or (dtype, dtype)
        arr = f"{elem}[:, :, ::1]"
        return f"void({arr}, {arr}, {arr}, {scalar}, {scalar})"


def strided_view(d: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """A view of device array ``d``'s memory with ``shape`` and byte ``strides`` from its
    element 0 (numba's own ``transpose`` and ``reshape`` copy or refuse such views), of
    the same kind (a numba array, the simulator's, or a ``DeviceView``)."""
    from tilegemm import simulator

    if type(d) is DeviceView:
        return DeviceView(d.ptr, tuple(shape), tuple(strides), d.dtype)
    if simulator.enabled():
        import numpy as np
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        x = np.asarray(d._ary)
        return FakeCUDAArray(np.lib.stride_tricks.as_strided(x, shape, strides))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray(shape=shape, strides=strides, dtype=d.dtype, gpu_data=d.gpu_data,
                         stream=d.stream)


# (device id, kernel handle) -> the largest size opted in: the attribute belongs to the
# loaded kernel and is a maximum (smaller launches stay allowed), so it is only ever raised,
# once per kernel, device and larger size; a launch then costs one dict lookup.
_OPTED_IN: dict[tuple[int, int], int] = {}
_OPT_IN_LOCK = threading.Lock()


def opt_in_dynamic_shared(kernel: Any, nbytes: int,
                          set_attribute: Callable[[Any, int, Any, int], Any] | None = None,
                          ) -> None:
    """Let ``kernel`` (numba's compiled overload, about to be launched on the current
    device) use ``nbytes`` of dynamic shared memory: CUDA refuses a launch with more than
    48 KB unless the kernel's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` was
    raised first.

    numba-cuda has no API for this attribute (numba-cuda issue #94); it loads kernels as
    ``CUkernel``s, whose attributes are set per device with ``cuKernelSetAttribute``, as
    numba's own ``set_shared_memory_carveout`` does; the overload's loaded function for
    the current device says which. ``set_attribute(attribute, value, kernel handle,
    device id)`` defaults to numba's checked driver binding; tests pass a stand-in, having
    no GPU. The backend checks ``nbytes`` against the device's opt-in maximum before any
    launch, so a driver error here means a kernel that also declares static shared
    memory, which numba's rungs avoid."""
    cufunc = kernel._codelibrary.get_cufunc()  # the loaded kernel, cached by numba
    device = int(cufunc.device.id)
    key = (device, int(cufunc.handle))
    if _OPTED_IN.get(key, 0) >= nbytes:
        return
    from cuda.bindings.driver import CUfunction_attribute  # numba-cuda's own binding

    if set_attribute is None:
        from numba.cuda.cudadrv.driver import driver  # raises CudaAPIError on failure

        set_attribute = driver.cuKernelSetAttribute
    attribute = CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    with _OPT_IN_LOCK:
        if _OPTED_IN.get(key, 0) < nbytes:  # never lowered: a larger launch may follow
            set_attribute(attribute, int(nbytes), cufunc.handle, device)
            _OPTED_IN[key] = int(nbytes)
