"""The host's time per CUDA call, beside the GPU's: what bounds products below about 4096³.

Usage (on a machine with an NVIDIA GPU, from the repository root)::

    PYTHONPATH=src python benchmarks/host_overhead.py
    PYTHONPATH=src python benchmarks/host_overhead.py --sizes 1024 2048 --modes tf32

A call that enqueues its kernels faster than the GPU runs them measures the GPU; one that
does not measures the host's Python (numba's launch, tilegemm's decision, the result's
allocation), however fast the kernel is. On an H200 machine (2026-11-26,
``benchmarks/results/logs-nvidia-h200-2026-11-26c``) a wgmma call took 0.2-0.3 ms of the
host to enqueue and ``matmul`` on device arrays 0.75-1.5 ms, while a 1024³ TF32 product
is about 7 µs of work at the rate wgmma reaches at 4096³ and took cuBLAS 20 µs. For each
size and mode, one line:

- host: the host's time to enqueue one call of the rung's program (its copies and its
  kernel), of the kernel alone, of one ``tilegemm.matmul`` on numba device arrays
  (not for bfloat16, which numba's arrays cannot hold) and of one on PyTorch tensors
  (``precision="tf32"`` for float32; a plain call for 16-bit data), in that order,
  separated by "/"; no synchronisation inside the timed loop;
- back to back: 20 calls between two events, per call, of the program and of
  ``matmul`` on PyTorch tensors: the larger of the host's time and the GPU's, what a
  loop of calls gets;
- each of those twice with tilegemm's launches ("direct": the driver's launch, and
  repeated calls on PyTorch/CuPy arrays launched on views of their memory,
  ``backends/cuda_launch`` and ``backends/cuda_direct``) and twice with numba's own
  ("numba"), alternating;
- GPU: the same calls enqueued behind a kernel that keeps the GPU busy until all are
  queued, per call: the GPU's own time (copies and kernel), free of the host;
- cuBLAS (PyTorch, same precision) back to back, when torch is there.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

MODES = ("tf32", "float16", "bfloat16")
REPS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["tf32", "bfloat16"])
    parser.add_argument("--kernel", choices=("wgmma", "mma"), default="wgmma",
                        help="the tensor-core rung (wgmma: compute capability 9.0)")
    args = parser.parse_args()

    from tilegemm.backends import get_backend

    backend = get_backend("cuda")
    status = backend.status()
    if not status.usable or status.simulated:
        print(f"needs a real GPU: {status.reason}")
        return 2
    from numba import cuda

    from tilegemm import registry

    spec = registry.get(args.kernel, "cuda")
    spin = _spin_kernel(cuda)
    try:
        import torch
    except ImportError:
        torch = None
    print(f"device: {status.devices[0]}; host CPU: {_cpu()}; rung {spec.name}; µs per call")
    for n in args.sizes:
        for mode in args.modes:
            print(_measure(cuda, torch, spin, backend, spec, n, mode), flush=True)
    return 0


def _measure(cuda: Any, torch: Any, spin: Any, backend: Any, spec: Any, n: int,
             mode: str) -> str:
    """One line: the host's, back-to-back and the GPU's time per call for n³ in ``mode``,
    with the parameters an untuned call runs (the defaults fitted to the shape)."""
    from functools import partial

    import tilegemm
    from tilegemm.backends.cuda_program import CudaProgram
    from tilegemm.problem import problem_for
    from tilegemm.tune.select import for_shape

    dtype = np.dtype(np.float32 if mode == "tf32" else mode)
    over = {spec.precision_param: spec.precisions[mode]} if mode in spec.precisions else {}
    params = for_shape(backend, backend.target(), problem_for(n, n, n, dtype), spec,
                       spec.resolve(over), "")[1]
    prog = spec.program(params, dtype)
    a, b = (_device(cuda, (1, n, n), dtype) for _ in range(2))
    c = cuda.device_array((1, n, n), np.float32)
    args = (a, b, c, np.float32(1), np.float32(0))
    call = partial(prog.launch, *args)
    kernel = partial(CudaProgram.launch, prog, *args)
    # matmul() on numba arrays: numba has no bfloat16 arrays (the program reads its bits)
    api = None if mode == "bfloat16" else partial(
        tilegemm.matmul, a.reshape(n, n), b.reshape(n, n),
        precision="tf32" if mode == "tf32" else None, dtype=np.float32)
    # matmul() on PyTorch tensors, as a PyTorch user calls it: a plain call for 16-bit
    # data (tensor cores are what such a call runs), precision= for float32 (not plain)
    on_torch = None
    if torch is not None:
        tdt = {"tf32": torch.float32, "float16": torch.float16,
               "bfloat16": torch.bfloat16}[mode]
        ta = torch.randn(n, n, device="cuda", dtype=tdt)
        tb = torch.randn(n, n, device="cuda", dtype=tdt)
        on_torch = partial(tilegemm.matmul, ta, tb,
                           **({"precision": "tf32"} if mode == "tf32" else {}))
    parts = []
    for direct in (True, False, True, False):  # alternating: a noisy host moves both
        with _launches(direct):
            host = "/".join("-" if fn is None else f"{_host(cuda, fn):.0f}"
                            for fn in (call, kernel, api, on_torch))
            b2b = "/".join("-" if fn is None else f"{_b2b(cuda, fn):.0f}"
                           for fn in (call, on_torch))
        parts.append(f"{'direct' if direct else 'numba'}: host {host}, back to back {b2b}")
    line = (f"{n}^3 {mode}: " + "; ".join(parts)
            + f"; GPU: call {_gpu(cuda, spin, call)}")
    if torch is not None:
        line += f"; cuBLAS back to back {_cublas(torch, n, mode):.0f}"
    return line


class _launches:  # noqa: N801 - used as a context manager
    """Launches as tilegemm makes them (``direct``: the driver's launch, views of CuPy
    and PyTorch arrays on repeated calls), or all through numba's own launch
    (the driver library is hidden from both for the block)."""

    def __init__(self, direct: bool) -> None:
        self.direct = direct

    def __enter__(self) -> None:
        from tilegemm import remembered
        from tilegemm.backends import cuda_direct, cuda_launch

        self.saved = cuda_launch.driver
        if not self.direct:
            cuda_launch.driver = cuda_direct.driver = lambda: None  # type: ignore[assignment]
        remembered.forget()  # decided again, with or without a direct program

    def __exit__(self, *exc: Any) -> None:
        from tilegemm.backends import cuda_direct, cuda_launch

        cuda_launch.driver = cuda_direct.driver = self.saved  # type: ignore[assignment]


def _cpu() -> str:
    from tilegemm.backends.cpu import cpu_family_model

    return cpu_family_model() or "unknown CPU"


def _device(cuda: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Random operands on the device (bfloat16 as its bits, as the backend passes it)."""
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return cuda.to_device(x.view(np.int16) if dtype.name == "bfloat16" else x)


def _host(cuda: Any, fn: Any) -> float:
    """The host's time to enqueue one call, µs (the GPU catches up after the loop)."""
    fn()
    cuda.synchronize()
    t = time.perf_counter()
    for _ in range(REPS):
        fn()
    host = (time.perf_counter() - t) / REPS * 1e6
    cuda.synchronize()
    return host


def _b2b(cuda: Any, fn: Any) -> float:
    """Calls back to back between two events, per call, µs."""
    fn()
    cuda.synchronize()
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(REPS):
        fn()
    end.record()
    end.synchronize()
    return cuda.event_elapsed_time(start, end) * 1e3 / REPS


def _gpu(cuda: Any, spin: Any, fn: Any) -> str:
    """The GPU's own time per call, µs: the calls are enqueued behind a kernel that sleeps
    until the host has enqueued them all, so the GPU runs them without gaps. If the GPU
    reached the first event before the host was done (the sleep was too short), again
    with a longer one; "?" if it never was long enough."""
    t = time.perf_counter()
    fn()
    cuda.synchronize()
    sleeps = int(max(time.perf_counter() - t, 1e-4) * REPS * 4e6)  # ~1 µs each, 4x margin
    for _ in range(3):
        start, end = cuda.event(), cuda.event()
        spin[1, 1](np.int64(sleeps))
        start.record()
        for _ in range(REPS):
            fn()
        end.record()
        late = start.query()  # the GPU got there before the last call was enqueued
        end.synchronize()
        if not late:
            return f"{cuda.event_elapsed_time(start, end) * 1e3 / REPS:.0f}"
        sleeps *= 4
    return "?"


def _spin_kernel(cuda: Any) -> Any:
    """One thread sleeping ``sleeps`` times about a microsecond (``nanosleep``, sm_70+)."""

    @cuda.jit
    def spin(sleeps):  # noqa: ANN001, ANN202
        for _ in range(sleeps):
            cuda.nanosleep(1000)

    return spin


def _cublas(torch: Any, n: int, mode: str) -> float:
    """cuBLAS through PyTorch at the same precision, back to back, µs per call."""
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    dtype = {"tf32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[mode]
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        torch.matmul(a, b, out=out)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / REPS


if __name__ == "__main__":
    sys.exit(main())
