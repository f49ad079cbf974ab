"""The search space of one rung on one device: every valid parameter set that fits.

Pruning uses the same predicates the launcher uses (``KernelSpec.space()`` applies the
rung's constraints; :func:`fits` reads the device's own :class:`Limits` from its
:class:`~tilegemm.backends.base.Target`, as ``Backend.check_limits`` does), so the tuner
can never pick a candidate the launcher would refuse, nor skip one the device could run.
Register pressure is a third filter, in two parts. Before anything compiles, a candidate
whose accumulators alone (:meth:`KernelSpec.outputs_per_thread`) exceed the registers one
thread may have is dropped: it must spill, and on a GPU its fully unrolled code took
minutes to compile (the first tuning run on an H100 timed one candidate in 110 s). Where
the backend can report registers (``Backend.resources``), a candidate whose register count
× threads exceeds the register file, or that spills, is rejected too; that costs a
compilation (seconds), so it is applied lazily, per candidate, just before it is timed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from tilegemm.backends.base import Backend, Limits, Target, shared_limit
from tilegemm.registry import KernelSpec

__all__ = ["Limits", "Params", "ResourceCheck", "accumulator_verdict", "candidates", "fits",
           "precision_pin", "register_check", "register_verdict"]

Params = dict[str, int]


def fits(spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype | str,
         limits: Limits) -> str | None:
    """Why ``params`` cannot run within ``limits`` (None if they can; 0 means no limit)."""
    itemsize = np.dtype(dtype).itemsize
    if spec.threads is not None and limits.threads_per_block and (
            spec.threads(params) > limits.threads_per_block):
        return f"{spec.threads(params)} threads > {limits.threads_per_block}"
    smem_limit, _ = shared_limit(spec, limits)
    if spec.smem is not None and smem_limit and spec.smem(params, itemsize) > smem_limit:
        return f"{spec.smem(params, itemsize)} B shared memory > {smem_limit}"
    return None


def accumulator_verdict(spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype | str,
                        limits: Limits) -> str | None:
    """Why ``params`` must spill before compiling (None when they may fit): each thread's
    accumulators, in 32-bit registers (two per float64; 16-bit products accumulate in
    float32), already exceed ``limits.registers_per_thread``."""
    outputs = spec.outputs_per_thread(params)
    if not limits.registers_per_thread or outputs is None:
        return None
    words = outputs * max(1, np.dtype(dtype).itemsize // 4)
    if words >= limits.registers_per_thread:
        return (f"{outputs} accumulators per thread need {words} registers; a thread has "
                f"{limits.registers_per_thread}")
    return None


def candidates(spec: KernelSpec, dtype: np.dtype | str, limits: Limits,
               precision: str = "ieee", held: Mapping[str, int] | None = None,
               kind: str = "") -> list[Params]:
    """Every parameter set the rung allows and the device limits admit, in space() order,
    computing ``precision`` (see :func:`precision_pin`), and on a device of ``kind``
    (``Target.kind``) only those the rung finds worth timing there
    (``KernelSpec.device_space``). Parameters declared ``searched=False`` keep their value
    in ``held`` (what kernel="auto" runs for the shape), else their default."""
    if not spec.supports(dtype):
        return []
    pin = precision_pin(spec, dtype, precision)
    if pin is False:
        return []
    dtype = np.dtype(dtype)
    fixed = {x.name: (held or {}).get(x.name, x.default) for x in spec.params
             if not x.searched}
    worth = spec.device_space.get(kind, lambda p: True)
    return [p for p in spec.space(fixed)
            if worth(p)
            and (pin is None or p[pin[0]] == pin[1]) and fits(spec, p, dtype, limits) is None
            and not (spec.dtype_check and spec.dtype_check(p, dtype))
            and accumulator_verdict(spec, p, dtype, limits) is None]


def precision_pin(spec: KernelSpec, dtype: np.dtype | str,
                  precision: str = "ieee") -> tuple[str, int] | None | bool:
    """The (parameter, value) a tuning run of ``spec`` must hold fixed to compute
    ``precision``; None when the rung has no precision parameter; False when the rung
    cannot compute it (a tensor-core rung is never tuned for IEEE float32).

    For float32 operands a tensor-core rung's precision parameter *is* the precision
    (mma: PASSES=1 for "tf32", 3 for "3xtf32"), so it is pinned, never searched. 16-bit
    operands have one tensor-core mode and ignore it: pinned to its first value, so no
    candidate is timed twice.
    """
    if not spec.precisions:
        return None if precision == "ieee" else False
    name = spec.precision_param
    if np.dtype(dtype).itemsize == 2:
        return (name, min(spec.precisions.values())) if precision == "ieee" else False
    if precision not in spec.precisions:
        return False
    return name, spec.precisions[precision]


ResourceCheck = Callable[[KernelSpec, Mapping[str, int], np.dtype], "str | None"]


def register_check(backend: Backend, target: Target) -> ResourceCheck | None:
    """A check that rejects a candidate that spills or whose registers × threads overflow
    the register file, where the backend can report registers for ``target`` (else None).

    Compiles the candidate (no GPU needed for CUDA: PTX linked by nvJitLink); a candidate
    whose resources cannot be computed here is not rejected, since then the timing run is
    the only judge.
    """
    if target.simulated or not target.limits.registers_per_block:
        return None

    def check(spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype) -> str | None:
        try:
            found = backend.resources(spec, params, dtype, target)
        except Exception:  # no toolchain here: cannot judge, do not reject
            return None
        if found is None:
            return None
        registers, spills = found
        threads = spec.threads(params) if spec.threads else 1
        return register_verdict(registers, spills, threads, target.limits)

    return check


def register_verdict(registers: int, spills: int, threads: int, limits: Limits) -> str | None:
    """The pure rule behind :func:`register_check` (tested without compiling)."""
    if spills:
        return f"spills {spills} bytes to local memory"
    if limits.registers_per_thread and registers > limits.registers_per_thread:
        return f"{registers} registers > {limits.registers_per_thread}"
    if limits.registers_per_block and registers * threads > limits.registers_per_block:
        return f"{registers} registers x {threads} threads > {limits.registers_per_block}"
    return None
