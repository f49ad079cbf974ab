"""Cheap checks that let ``backend="auto"`` skip probing a backend that cannot offer a GPU.

A probe (``Backend.status``) imports the backend's GPU library and loads its drivers: tens
of milliseconds for PyOpenCL and PoCL, about half a second for numba-cuda. ``auto`` asks
every backend before a host product falls back to the CPU, so on a machine without a GPU
a fresh process's first call would pay all of that for nothing. These checks import no GPU
library; False means "certainly no accelerator", True means "probe to find out".
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

from tilegemm import simulator
from tilegemm.registry import REGISTERED

# Device nodes a Linux GPU driver, and so a GPU OpenCL device, needs: /dev/dri (Intel, AMD
# and Mesa), /dev/kfd (ROCm), /dev/dxg (WSL), /dev/nvidiactl (NVIDIA).
GPU_DEVICE_NODES = ("/dev/dri", "/dev/kfd", "/dev/dxg", "/dev/nvidiactl")


@cache  # asked on every auto call; a driver does not appear within a process
def driver_library_present() -> bool:
    """Whether the CUDA driver library can be loaded (what numba-cuda itself needs first);
    ``NUMBA_CUDA_DRIVER`` names a driver elsewhere, so then numba-cuda decides."""
    if os.environ.get("NUMBA_CUDA_DRIVER"):
        return True
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def opencl_gpu_possible() -> bool:
    """On Linux an OpenCL GPU device needs a GPU device node; without one only CPU devices
    (PoCL) exist. ``PYOPENCL_CTX`` (the user chose a device) or another OS: probe."""
    if not sys.platform.startswith("linux") or os.environ.get("PYOPENCL_CTX"):
        return True
    return _gpu_device_node()


@cache
def _gpu_device_node() -> bool:
    return any(Path(p).exists() for p in GPU_DEVICE_NODES) or any(
        Path("/dev").glob("nvidia[0-9]*"))


# The checks a registration line (``registry.BackendLine.gpu_hint``) may name.
HINTS: dict[str, Callable[[], bool]] = {
    "cuda_driver": lambda: simulator.enabled() or driver_library_present(),
    "gpu_device_node": lambda: opencl_gpu_possible(),
    "none": lambda: False,  # the host's own backend: never an accelerator
}


def may_be_accelerated(backend: str) -> bool:
    """False when ``backend``'s probe certainly finds no accelerator (see the module doc)."""
    line = next((b for b in REGISTERED if b.name == backend), None)
    return True if line is None else HINTS[line.gpu_hint]()
