"""NVRTC: a cudac rung's CUDA C source to a cubin for one architecture, with no GPU.

Each rung ``kNN_<name>.py`` has its source beside it in ``kNN_<name>.cu``, whose one entry
point is ``extern "C" tilegemm_<name>`` (unmangled, so the name in the cubin and in SASS is
the name in the source). The element type and the rung's parameters are compile-time
constants, written as a few lines in front of the source (``typedef float T;``, ``#define
TILE 16``; not ``-D`` options, which would also rewrite NVRTC's built-in headers), so
every (parameters, dtype, arch) is one compilation, kept for the life of the process.

NVRTC ships as a pip wheel (``nvidia-cuda-nvrtc``, pulled in by numba-cuda) and compiles
straight to a cubin for a real architecture; with ``--ptxas-options=-v`` its log carries
ptxas' report (registers, spills, stack, shared memory), the same figures ``nvcc -Xptxas
-v`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tilegemm.errors import InvalidTypeError, InvalidValueError
from tilegemm.kernels.cudac._program import BACKEND
from tilegemm.registry import KernelSpec, get

SOURCES = Path(__file__).resolve().parent
ARCHS: tuple[str, ...] = ("sm_80", "sm_90")
# The C type each NumPy dtype compiles as (``typedef ... T;``).
C_TYPES: dict[str, str] = {"float32": "float", "float64": "double", "int32": "int",
                           "int64": "long long"}
# nvcc's defaults for device code; -lineinfo maps SASS back to source lines without
# changing the generated code; ptxas -v writes the resource report into the log.
OPTIONS: tuple[str, ...] = ("-std=c++17", "-lineinfo", "--ptxas-options=-v")


@dataclass(frozen=True)
class Cubin:
    """One compiled cudac kernel: the cubin (an ELF file) and what went into it."""

    data: bytes  # the cubin, ready for cuModuleLoadData or nvdisasm
    kernel: str  # the entry point's (unmangled) name in the cubin
    arch: str  # "sm_90"
    dtype: str
    params: dict[str, int] = field(default_factory=dict)
    source: str = ""  # the .cu file, relative to this package
    log: str = ""  # NVRTC's log: warnings and ptxas' resource report
    ptx: str = ""  # the PTX NVRTC generated on the way (what ptxas turned into the cubin)


def source_file(spec: KernelSpec) -> Path:
    """The CUDA C source of a cudac rung: ``kNN_<name>.cu`` beside its module."""
    return SOURCES / f"k{spec.rung:02d}_{spec.name}.cu"


def entry_point(spec: KernelSpec) -> str:
    return f"tilegemm_{spec.name}"


def compile_cubin(rung: KernelSpec | str, params: dict[str, int] | None = None,
                  dtype: str | np.dtype = "float32", arch: str = "sm_90") -> Cubin:
    """Compile a cudac rung with NVRTC for ``arch`` (``"sm_80"``, ``"sm_90"``, or any
    ``sm_XY`` NVRTC knows) and return its cubin and entry-point name. Needs no GPU.

    ``rung`` is a cudac KernelSpec or its name (``"warptile"``); ``params`` override the
    rung's defaults and are validated against its constraints.
    """
    spec = get(rung, BACKEND) if isinstance(rung, str) else rung
    if spec.backend != BACKEND:
        raise InvalidValueError(f"{spec.name} is a {spec.backend} kernel; compile_cubin compiles "
                         "cudac (CUDA C) rungs")
    resolved = spec.resolve(params)
    dt = np.dtype(dtype).name
    if not spec.supports(dt):
        raise InvalidTypeError(f"{spec.name} (cudac) supports {', '.join(spec.dtypes)}, not {dt}")
    if not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit()):
        raise InvalidValueError(f"arch must look like 'sm_90', got {arch!r}")
    from tilegemm.backends.cuda import check_for_any_gpu

    check_for_any_gpu(spec, resolved, dt)  # (a float64 tile over 48 KB: not ptxas's log)
    return _compile(spec.rung, spec.name, tuple(sorted(resolved.items())), dt, arch)


def source_text(path: Path, params: tuple[tuple[str, int], ...], dtype: str) -> str:
    """What the compiler sees: the element type and the parameters, then the .cu file."""
    defines = [f"typedef {C_TYPES[dtype]} T;"] + [f"#define {k} {v}" for k, v in params]
    # #line keeps compiler messages pointing at the lines of the .cu file itself.
    return "\n".join([*defines, f'#line 1 "{path.name}"', path.read_text()])


@cache
def _compile(rung: int, name: str, params: tuple[tuple[str, int], ...], dtype: str,
             arch: str) -> Cubin:
    from cuda.bindings import nvrtc

    path = SOURCES / f"k{rung:02d}_{name}.cu"
    source = source_text(path, params, dtype)
    options = [f"-arch={arch}", f"-I{SOURCES}", *OPTIONS]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), path.name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        log = _log(nvrtc, prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC could not compile {path.name} for {arch} with "
                               f"{dict(params)} ({dtype}):\n{log}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        data = bytearray(size)
        (err,) = nvrtc.nvrtcGetCUBIN(prog, data)
        _check(nvrtc, err, "nvrtcGetCUBIN")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _check(nvrtc, err, "nvrtcGetPTXSize")
        ptx = bytearray(size)
        (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
        _check(nvrtc, err, "nvrtcGetPTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return Cubin(data=bytes(data), kernel=f"tilegemm_{name}", arch=arch, dtype=dtype,
                 params=dict(params), source=path.name, log=log,
                 ptx=bytes(ptx).decode(errors="replace").rstrip("\x00"))


def _log(nvrtc: Any, prog: Any) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(nvrtc, err, "nvrtcGetProgramLogSize")
    buf = bytearray(size)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).decode(errors="replace").rstrip("\x00").strip()


def _check(nvrtc: Any, err: Any, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def cudac_resources(rung: KernelSpec | str, params: dict[str, int] | None = None,
                    dtype: str = "float32", arch: str = "sm_90") -> Any:
    """What ptxas allocated for a cudac rung (registers, spills, stack, shared memory), as
    the same ``Resources`` record the Numba rungs get from nvJitLink."""
    from tilegemm.analysis.resources import Resources, parse_ptxas_log

    spec = get(rung, BACKEND) if isinstance(rung, str) else rung
    cubin = compile_cubin(spec, params, dtype, arch)
    return Resources(kernel=spec.name, arch=arch, dtype=cubin.dtype, params=cubin.params,
                     cubin_bytes=len(cubin.data), **parse_ptxas_log(cubin.log))
