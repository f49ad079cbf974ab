"""CUDA C rungs ("cudac"): the tutorials' own CUDA C kernels, compiled at run time with NVRTC.

One rung is two files: ``kNN_<name>.cu``, the kernel in CUDA C with comments that say why,
and ``kNN_<name>.py``, its ``SPEC`` (parameters, constraints, threads, shared memory,
launch grid). Rungs that run the same algorithm as a Numba rung have its name and number,
so ``tilegemm bench`` on a GPU shows Numba and CUDA C of one rung side by side.
``_gemm.cuh`` holds what every kernel shares: the element type ``T``, the one signature
(``GEMM_ARGS``: pointers, sizes, element strides, alpha, beta) and the epilogue;
``_warptile.cuh`` what the warp-tiled rungs 8 and 9 share: their parameters and tiling.

Compiling needs no GPU:

- ``compile_cubin(rung, params=None, dtype="float32", arch="sm_90") -> Cubin`` compiles
  a rung (a cudac ``KernelSpec`` or its name) with NVRTC for one architecture and returns
  ``Cubin(data, kernel, arch, dtype, params, source, log)``: ``data`` is the cubin (ELF)
  bytes, for ``nvdisasm`` or ``cuModuleLoadData``, and ``kernel`` the entry point's name
  in it (``tilegemm_<rung name>``, unmangled). Compilations are kept per process.
- ``cudac_resources(rung, params=None, dtype="float32", arch="sm_90")`` returns ptxas'
  registers, spills, stack and shared memory for it (``tilegemm.analysis.resources.Resources``).

A rung's module declares ``SPEC = cudac_spec(<Numba rung's SPEC>, __doc__, title=...,
block=..., grid=...)``: the Numba rung's name, number, parameters and limits, this kernel's
thread block and launch grid.

Running needs a GPU and ``cuda-core``: see ``tilegemm.backends.cudac``.
"""

from tilegemm.kernels.cudac._compile import ARCHS, Cubin, compile_cubin, cudac_resources
from tilegemm.kernels.cudac._program import cudac_spec

__all__ = ["ARCHS", "Cubin", "compile_cubin", "cudac_resources", "cudac_spec"]
