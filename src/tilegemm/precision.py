"""``precision=``: how a float32 product is computed, chosen by the caller, never silently.

- ``"ieee"`` (the default): IEEE float32 multiply-adds (FFMA) with float32 accumulation,
  what every rung but the tensor-core ones computes.
- ``"tf32"``: tensor cores, each operand rounded to TF32 (10 mantissa bits) once; float32
  accumulation. Much faster on sm_80+ GPUs, with errors ~2**-11 relative per product term.
- ``"3xtf32"``: each operand split into a TF32 big part and a TF32 remainder, three tensor-
  core products per step (small·big + big·small + big·big): near-float32 accuracy.

A rung that computes at a reduced precision declares it: ``precisions`` maps each
precision it computes to the value of its parameter ``precision_param`` (rung
``mma``: PASSES=1 or 3). Such a rung never runs unless asked for by precision=, so
kernel="auto" at the default precision keeps today's FFMA rungs, and naming it without
precision= is refused rather than quietly giving TF32 results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilegemm import registry
from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError

IEEE = "ieee"
PRECISIONS: tuple[str, ...] = (IEEE, "tf32", "3xtf32")
# The epsilon the float64 checks (tilegemm.reference.bound) scale by for a float32 result
# computed at a reduced precision: TF32 operands carry 10 mantissa bits (each rounded to
# within 2**-11, a product to within ~2**-10); 3xTF32 drops the small·small term (~2**-22)
# on top of float32 accumulation.
TOLERANCE_EPS: dict[str, float] = {"tf32": 2.0**-10, "3xtf32": 2.0**-21}


def precision_of(spec: registry.KernelSpec, params: dict[str, Any] | Any,
                 dtype: np.dtype | str) -> str:
    """The precision= that ``params`` of ``spec`` compute for ``dtype`` operands."""
    if not spec.precisions or np.dtype(dtype) != np.float32:
        return IEEE
    value = params.get(spec.precision_param)
    return next((p for p, v in spec.precisions.items() if v == value), IEEE)


def tolerance_eps(spec: registry.KernelSpec, params: Any, dtype: np.dtype | str) -> float | None:
    """The ``eps`` for :func:`tilegemm.reference.assert_close` (None: the dtype's own)."""
    return TOLERANCE_EPS.get(precision_of(spec, params, dtype))


def reduced(spec: registry.KernelSpec) -> bool:
    """Whether the rung computes at a precision other than IEEE (it declares which)."""
    return bool(spec.precisions)


def apply_precision(precision: str | None, kernel: str, backend: str, dtype: np.dtype,
                    params: dict[str, Any], shown: np.dtype | None = None,
                    capability: tuple[int, ...] | None = None,
                    ) -> tuple[str, dict[str, Any]]:
    """The (kernel, params) that compute ``precision``; a clear error when nothing can.

    ``shown``: the caller's result dtype, named in errors when ``dtype`` (what the kernel
    computes) differs from it (an int8 product is computed in int32). ``capability``: the
    GPU's compute capability, where known, for kernel="auto"'s tensor-core rung
    (:func:`auto_tensor_spec`)."""
    p = IEEE if precision is None else precision
    if p not in PRECISIONS:
        raise InvalidValueError(f"unknown precision {precision!r}; choices: "
                                f"{', '.join(map(repr, PRECISIONS))}")
    if np.dtype(dtype).name in ("float16", "bfloat16"):
        return _half(precision, kernel, backend, np.dtype(dtype), params, capability)
    if p == IEEE:
        if kernel != "auto":
            spec = registry.get(kernel, backend)
            if reduced(spec) and np.dtype(dtype) != np.float32:
                raise InvalidTypeError(
                    f"kernel {kernel!r} computes float32 (precision= "
                    f"{', '.join(map(repr, spec.precisions))}), float16 and bfloat16 "
                    f"operands on tensor cores; not {np.dtype(dtype).name}")
            if reduced(spec):
                raise InvalidValueError(
                    f"kernel {kernel!r} computes with tensor cores, not IEEE float32: pass "
                    f"precision= one of {', '.join(map(repr, spec.precisions))}")
        return kernel, params
    if dtype != np.float32:
        name = np.dtype(shown if shown is not None else dtype).name
        raise InvalidTypeError(f"precision={p!r} applies to float32 operands; {name} "
                               f"products support only precision='ieee'")
    specs = [s for s in registry.specs_for(backend) if p in s.precisions]
    if not specs:
        have = sorted({b for b in registry.BACKENDS for s in registry.specs_for(b)
                       if p in s.precisions})
        raise UnavailableError(
            f"precision={p!r} needs tensor cores, and backend {backend!r} has no tensor-core "
            f"kernel (it computes in IEEE float32 only); backends with one: "
            f"{', '.join(have) or 'none'}")
    if kernel == "auto":
        spec, params = _auto_tensor_rung(specs, backend, params, capability)
    else:
        spec = registry.get(kernel, backend)
        if spec not in specs:
            raise InvalidValueError(
                f"kernel {kernel!r} cannot compute precision={p!r}; kernels that can: "
                f"{', '.join(s.name for s in specs)}")
    name, value = spec.precision_param, spec.precisions[p]
    if params.get(name, value) != value:
        raise InvalidValueError(f"{name}={params[name]} contradicts precision={p!r} "
                                f"({name}={value}); pass only precision=")
    return spec.name, {**params, name: value}


def _half(precision: str | None, kernel: str, backend: str, dtype: np.dtype,
          params: dict[str, Any], capability: tuple[int, ...] | None = None,
          ) -> tuple[str, dict[str, Any]]:
    """float16/bfloat16 operands on a backend that takes them as they are: tensor cores
    with float32 accumulation, the only way they run there."""
    name = dtype.name
    if precision is not None:
        raise InvalidValueError(
            f"precision={precision!r} applies to float32 operands; {name} products always "
            "use tensor cores with float32 accumulation (leave precision= unset; "
            "dtype=np.float32 gives a float32 result)")
    specs = [s for s in registry.specs_for(backend) if s.supports(name)]
    if not specs:
        have = sorted({b for b in registry.BACKENDS for s in registry.specs_for(b)
                       if s.supports(name)})
        raise UnavailableError(
            f"{name} products run on tensor cores, and backend {backend!r} has no kernel "
            f"for them; backends with one: {', '.join(have) or 'none'} (or cast to float32)")
    if kernel == "auto":
        spec, params = _auto_tensor_rung(specs, backend, params, capability)
        return spec.name, params
    return kernel, params  # choose_kernel refuses a kernel without float16


def auto_tensor_spec(specs: list[registry.KernelSpec],
                     capability: tuple[int, ...] | None) -> registry.KernelSpec:
    """The tensor-core rung kernel="auto" runs among ``specs``: the highest that runs on a
    GPU of ``capability``. A rung with one architecture's instructions (wgmma: sm_90a,
    ``KernelSpec.only_cc``) counts only where the capability is known to be that one: not
    under the simulator, which stands for any GPU. A rung that runs only when named
    (``KernelSpec.named_only``) is passed over.

    On an H100 and an H200 (2026-11-26, 4096³) wgmma ran TF32 at 106-110 TFLOP/s against
    mma's 101-103, 3×TF32 at 1.6× SGEMM with float32-like error against 1.06× with 12× its
    error, BF16 at 270 against 263, FP16 at 266 against 273."""
    have = tuple(capability[:2]) if capability else None
    runs = [s for s in specs if not s.named_only and (not s.only_cc or have == s.only_cc)]
    fallback = [s for s in specs if not s.only_cc] or specs
    return max(runs or fallback, key=lambda s: s.rung)


def _auto_tensor_rung(specs: list[registry.KernelSpec], backend: str, params: dict[str, Any],
                      capability: tuple[int, ...] | None = None,
                      ) -> tuple[registry.KernelSpec, dict[str, Any]]:
    """kernel="auto" among the tensor-core rungs ``specs`` (:func:`auto_tensor_spec`), at
    its defaults (the smallest tiles under the simulator, which runs a Python thread per
    GPU thread)."""
    if params:
        raise registry.ParametersNeedKernel(params)
    spec = auto_tensor_spec(specs, capability)
    if _simulated(backend):
        params = {k: v for k, v in (spec.sim_params or {}).items()
                  if k != spec.precision_param}
    return spec, params


def _simulated(backend: str) -> bool:
    from tilegemm.backends import get_backend

    return get_backend(backend).status().simulated
