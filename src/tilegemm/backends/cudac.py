"""cudac backend: the CUDA C rungs (``tilegemm.kernels.cudac``), compiled at run time with
NVRTC and launched with NVIDIA's ``cuda-core``.

Everything but the launch is the CUDA backend's: the same checks, the same handling of
host and device operands (numba, CuPy, PyTorch arrays used in place; broadcast batches;
``out=`` and a device ``c``), the same (batch or 1, M, K) / (batch or 1, K, N) /
(batch, M, N) device views and the same limits. A cudac program's ``launch`` reads those
views' ``__cuda_array_interface__`` and passes data pointers and element strides straight
to the compiled kernel, on the stream the CUDA backend chose for the copies (the caller's:
see ``backends/cuda_stream``), so copies, launch and timing stay in order.

Compiling needs no GPU (``tilegemm.kernels.cudac.compile_cubin``); running does, and
numba's simulator cannot run CUDA C.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np

from tilegemm import simulator
from tilegemm.backends.base import BackendStatus
from tilegemm.backends.cuda import CudaBackend, _driver_library_present
from tilegemm.registry import KernelSpec


class CudacBackend(CudaBackend):
    name = "cudac"
    array_kind = "cuda"
    traceable = False  # CUDA C: numba's simulator cannot run it
    kernel_source = "CUDA C"
    # A cudac program loads its module on the device current when first launched, so it
    # runs on the default GPU only (numba's kernels load per device: the cuda backend can).
    accepts_device = False

    def cubin(self, spec: KernelSpec, params: dict[str, int], dtype: str, arch: str) -> bytes:
        from tilegemm.kernels.cudac import compile_cubin

        return compile_cubin(spec, params, dtype, arch).data

    @cache  # noqa: B019 - one backend object per process
    def status(self) -> BackendStatus:
        if not simulator.enabled() and not _driver_library_present():
            return BackendStatus("cudac", False, "no CUDA GPU or driver found (no libcuda)")
        try:
            import cuda.core  # noqa: F401
            from cuda.bindings import nvrtc  # noqa: F401
        except Exception as exc:
            return BackendStatus("cudac", False, f"cuda-core or NVRTC cannot be imported: {exc}")
        cuda = CudaBackend.status(self)  # the same probe, and the same one-line reason
        if cuda.simulated:
            return BackendStatus("cudac", False, "CUDA C needs a GPU; numba's CUDA simulator "
                                 "(NUMBA_ENABLE_CUDASIM=1) runs only the Numba rungs")
        if not cuda.usable:
            return BackendStatus("cudac", False, cuda.reason)
        return BackendStatus("cudac", True, "CUDA C (NVRTC, cuda-core)", cuda.devices,
                             accelerated=True)

    def resource_report(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                        arch: str) -> Any:
        """ptxas's report from NVRTC's compilation of the rung's CUDA C for ``arch``; also
        what the tuner's spill check reads (``resources``, inherited)."""
        from tilegemm.kernels.cudac import cudac_resources

        return cudac_resources(spec, dict(params), np.dtype(dtype).name, arch)


BACKEND = CudacBackend()
