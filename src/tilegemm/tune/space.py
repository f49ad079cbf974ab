"""The search space of one rung on one device: every valid parameter set that fits.

Pruning uses the same predicates the launcher uses (``KernelSpec.space()`` applies the
rung's constraints; :class:`Limits` mirrors ``Backend.check_limits``), so the tuner can
never pick a candidate the launcher would refuse. Register pressure is a third, optional
filter for CUDA: a candidate whose ptxas register count × threads exceeds the register
file cannot launch, and one that spills is never the fastest; it costs a compilation
(seconds), so it is applied lazily, per candidate, just before the candidate is timed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from tilegemm.registry import KernelSpec

Params = dict[str, int]


@dataclass(frozen=True)
class Limits:
    """What one block may use on the device (CUDA defaults; static shared memory)."""

    max_threads: int = 1024
    max_smem: int = 48 * 1024
    registers_per_sm: int = 65536
    max_registers: int = 255


CUDA_LIMITS = Limits()


def limits_for(backend: str) -> Limits:
    if backend == "cuda":
        return CUDA_LIMITS
    if backend == "opencl":
        return Limits(max_threads=256, max_smem=32 * 1024, registers_per_sm=0)
    return Limits(max_threads=1 << 30, max_smem=1 << 30, registers_per_sm=0)


def fits(spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype | str,
         limits: Limits) -> str | None:
    """Why ``params`` cannot run within ``limits`` (None if they can)."""
    itemsize = np.dtype(dtype).itemsize
    if spec.threads is not None and spec.threads(params) > limits.max_threads:
        return f"{spec.threads(params)} threads > {limits.max_threads}"
    if spec.smem is not None and spec.smem(params, itemsize) > limits.max_smem:
        return f"{spec.smem(params, itemsize)} B shared memory > {limits.max_smem}"
    return None


def candidates(spec: KernelSpec, dtype: np.dtype | str, limits: Limits) -> list[Params]:
    """Every parameter set the rung allows and the device limits admit, in space() order."""
    if not spec.supports(dtype):
        return []
    return [p for p in spec.space() if fits(spec, p, dtype, limits) is None]


ResourceCheck = Callable[[KernelSpec, Mapping[str, int], np.dtype], "str | None"]


def cuda_register_check(spec: KernelSpec, params: Mapping[str, int],
                        dtype: np.dtype) -> str | None:
    """Reject a CUDA candidate that spills or whose registers × threads overflow an SM.

    Compiles the candidate's PTX and links it with nvJitLink for sm_90 (no GPU needed);
    returns None when resources cannot be computed here (e.g. under the simulator), since
    then the timing run is the only judge.
    """
    from tilegemm.backends.cuda import simulator_enabled

    if spec.backend != "cuda" or simulator_enabled():
        return None
    from tilegemm.analysis.resources import cuda_resources

    try:
        res = cuda_resources(spec, dict(params), np.dtype(dtype).name, "sm_90")
    except Exception:  # no toolchain here: cannot judge, do not reject
        return None
    return register_verdict(res.registers, res.spills, spec.threads(params) if spec.threads
                            else 1, CUDA_LIMITS)


def register_verdict(registers: int, spills: int, threads: int, limits: Limits) -> str | None:
    """The pure rule behind :func:`cuda_register_check` (tested without compiling)."""
    if spills:
        return f"spills {spills} bytes to local memory"
    if registers > limits.max_registers:
        return f"{registers} registers > {limits.max_registers}"
    if limits.registers_per_sm and registers * threads > limits.registers_per_sm:
        return f"{registers} registers x {threads} threads > {limits.registers_per_sm}"
    return None
