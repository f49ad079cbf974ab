"""Registers, spills and shared memory of a CUDA rung, compiled with no GPU present.

numba-cuda compiles the kernel's Python to PTX for a chosen architecture; nvJitLink (the
library the CUDA driver itself uses to link) turns the PTX into a cubin for that
architecture and, with ``-verbose``, reports what ptxas allocated. That is the same
information ``nvcc -Xptxas -v`` gives, and it needs neither a GPU nor a driver.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tilegemm.backends import get_backend
from tilegemm.backends.cuda import COMPILE_ARCHS
from tilegemm.errors import InvalidValueError, UnavailableError
from tilegemm.registry import KernelSpec

ARCHS = COMPILE_ARCHS  # the CUDA backend's: sm_80 and sm_90


def archs_for(spec: KernelSpec) -> tuple[str, ...]:
    """The architectures of :data:`ARCHS` that ``spec`` compiles for: all, or for a rung
    with architecture-specific instructions (``KernelSpec.only_cc``) its own (wgmma:
    sm_90, as sm_90a)."""
    if spec.only_cc:
        return tuple(a for a, cc in ARCHS.items() if cc == tuple(spec.only_cc))
    return tuple(ARCHS)


@dataclass(frozen=True)
class Compiled:
    """Which compilation a record describes: a rung for an architecture, a dtype and a
    parameter set."""

    kernel: str
    arch: str
    dtype: str
    params: dict[str, int]


@dataclass(frozen=True)
class Resources(Compiled):
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame (local memory)
    smem: int  # bytes of static shared memory per block
    cubin_bytes: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_PTXAS_SPILL = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def link(ptx: str, arch: str) -> tuple[str, bytes]:
    """Link PTX to a cubin for ``arch`` with nvJitLink (no GPU needed); return ptxas's
    info log and the cubin. The one linker call behind resource reports and SASS."""
    from cuda.bindings import nvjitlink

    if arch == "sm_90" and "\n.target sm_90a" in ptx:
        arch = "sm_90a"  # a rung with sm_90a instructions (wgmma; KernelSpec.only_cc)
    handle = nvjitlink.create(2, [f"-arch={arch}", "-verbose"])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        try:
            nvjitlink.complete(handle)
        except Exception as exc:
            size = nvjitlink.get_error_log_size(handle)
            log = bytearray(size)
            nvjitlink.get_error_log(handle, log)
            raise RuntimeError(f"nvJitLink failed for {arch}: {bytes(log).decode()}") from exc
        size = nvjitlink.get_info_log_size(handle)
        log = bytearray(size)
        nvjitlink.get_info_log(handle, log)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
    finally:
        nvjitlink.destroy(handle)
    return bytes(log).decode(errors="replace").rstrip("\x00"), bytes(cubin)


def link_ptx(ptx: str, arch: str) -> tuple[str, int]:
    """Link PTX to a cubin for ``arch`` with nvJitLink; return (info log, cubin size)."""
    log, cubin = link(ptx, arch)
    return log, len(cubin)


def parse_ptxas_log(log: str) -> dict[str, int]:
    """The ptxas figures for the (single) entry function in an nvJitLink info log."""
    spill = _PTXAS_SPILL.search(log)
    regs = _PTXAS_REGS.search(log)
    smem = [int(x) for x in _PTXAS_SMEM.findall(log)]
    if not (spill and regs):
        raise RuntimeError(f"could not read ptxas figures from the nvJitLink log:\n{log}")
    return {
        "stack": int(spill.group(1)), "spill_stores": int(spill.group(2)),
        "spill_loads": int(spill.group(3)), "registers": int(regs.group(1)),
        "smem": max(smem) if smem else 0,
    }


@cache
def ptx_key_common() -> dict[str, Any]:
    """What every cached PTX entry depends on, as it is now: the sources that make the
    PTX and numba-cuda's version (``tilegemm cache`` compares entries with it to tell the
    stale ones)."""
    from importlib.metadata import version

    from tilegemm import compile_cache

    sources = Path(__file__).parents[1]
    return {
        "sources": compile_cache.source_digest(
            [*(sources / "kernels" / "cuda").glob("*.py"), sources / "backends" /
             "cuda_program.py", Path(__file__)]),
        "versions": {"numba-cuda": version("numba-cuda")},
    }


@cache
def _ptx(spec: KernelSpec, params: tuple[tuple[str, int], ...], dtype: str, arch: str) -> str:
    """The PTX for ``arch``, from the on-disk kernel cache when another process (or an
    earlier run) compiled it; a miss compiles every architecture at once."""
    from tilegemm import compile_cache

    key = {
        "describe": {"kernel": spec.name, "backend": spec.backend, "dtype": dtype,
                     "params": dict(params), "output": "PTX " + " ".join(ARCHS)},
        **ptx_key_common(),
    }
    texts = compile_cache.cached_texts("cuda", f"{spec.name}-{dtype}", key,
                                       lambda: compile_ptx_all(spec, dict(params), dtype))
    if arch not in texts:
        raise InvalidValueError(f"{spec.name} compiles only for {', '.join(texts)} "
                                "(architecture-specific instructions)")
    return texts[arch]


def compile_ptx_all(spec: KernelSpec, params: dict[str, int], dtype: str) -> dict[str, str]:
    """PTX of a CUDA rung for every architecture in :data:`ARCHS`, lowered once.

    numba-cuda's lowering (Python → LLVM IR, most of a compile) does not depend on the
    architecture for our rungs; only NVVM's code generation does. So the kernel is lowered
    once, as ``numba.cuda.compile_ptx`` would for the oldest architecture, and NVVM then
    writes the PTX for each (tests compare this with ``compile_ptx`` per architecture).
    """
    program = spec.program(params, np.dtype(dtype))
    # architecture-specific instructions (KernelSpec.only_cc): that target only, as sm_90a
    suffix = ("a",) if spec.only_cc else ()
    ccs: dict[str, tuple] = {arch: (*ARCHS[arch], *suffix) for arch in archs_for(spec)}
    return kernel_ptx(program.kernel, program.signature(dtype), ccs)


def kernel_ptx(kernel: Any, signature: str, ccs: dict[str, tuple]) -> dict[str, str]:
    """PTX of one jitted CUDA kernel (a numba-cuda dispatcher) for each of ``ccs`` (arch
    name -> compute capability, with "a" for the architecture-specific target), lowered
    once: a rung's default kernel (:func:`compile_ptx_all`), or another a program picks
    per call (rung wgmma's operand layouts)."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.cuda.compiler import _compile_pyfunc_with_fixup

    from tilegemm.kernels.cuda._numba_compile import install as speed_up_lowering

    speed_up_lowering()
    # Compile as the dispatcher would: a rung's launch bounds change ptxas' register budget.
    bounds = getattr(kernel, "targetoptions", {}).get("launch_bounds")
    with global_compiler_lock:
        lib, _ = _compile_pyfunc_with_fixup(kernel.py_func, signature, device=False,
                                            cc=min(ccs.values()), abi="numba",
                                            launch_bounds=bounds)
        return {arch: lib.get_asm_str(cc=cc) for arch, cc in ccs.items()}


def ptx_for(spec: KernelSpec, params: dict[str, int], dtype: str = "float32",
            arch: str = "sm_90") -> str:
    """The PTX of a CUDA rung for ``arch`` (C-contiguous operands)."""
    if not get_backend(spec.backend).traceable:
        raise InvalidValueError(
            f"{spec.name} is a {spec.backend} kernel; PTX exists for CUDA rungs only")
    if arch not in ARCHS:
        raise InvalidValueError(f"unknown arch {arch!r}; choices: {', '.join(ARCHS)}")
    from tilegemm import simulator

    if simulator.enabled():
        raise UnavailableError("PTX cannot be compiled under the CUDA simulator; unset "
                           "NUMBA_ENABLE_CUDASIM")
    return _ptx(spec, tuple(sorted(params.items())), np.dtype(dtype).name, arch)


def cuda_resources(spec: KernelSpec, params: dict[str, int] | None = None,
                   dtype: str = "float32", arch: str = "sm_90") -> Resources:
    """Compile a CUDA rung for ``arch`` and report what ptxas allocated."""
    params = spec.resolve(params)
    ptx = ptx_for(spec, params, dtype, arch)
    log, cubin_bytes = link_ptx(ptx, arch)
    figures = parse_ptxas_log(log)
    return Resources(kernel=spec.name, arch=arch, dtype=np.dtype(dtype).name, params=params,
                     cubin_bytes=cubin_bytes, **figures)
