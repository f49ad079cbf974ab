"""``matmul`` and ``gemm``: validate everything, choose a backend and a rung, dispatch.

Order matters: every check (shapes, dtypes, parameters, ``out``, device limits, backend
availability) runs before any data moves, so a bad call raises a clear error and leaves
the caller's arrays untouched.
"""

from __future__ import annotations

import contextlib
import decimal
import logging
import threading
import time
import warnings
from dataclasses import dataclass, replace
from functools import partial
from numbers import Number
from typing import Any

import ml_dtypes
import numpy as np

from tilegemm import fastpath, fastpath_device, registry
from tilegemm.backends import ARRAY_KINDS, get_backend
from tilegemm.backends._probe import may_be_accelerated
from tilegemm.backends.base import Backend, Target, check_scalars
from tilegemm.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnavailableError,
    UsageError,
    user_stacklevel,
)
from tilegemm.precision import apply_precision
from tilegemm.problem import (
    HALF_DTYPES,
    GemmProblem,
    Operand,
    array_kind,
    check_out,
    describe,
    fp_warnings_at_caller,
    make_problem,
    stacked_rows,
    to_result,
)
from tilegemm.registry import BACKENDS, KernelSpec, ParametersNeedKernel
from tilegemm.tune.select import (
    auto_choice,
    auto_plan,
    for_shape,
    named_plan,
    tuned_precision_params,
    tuning_cache_now,
    unbounded_database_plan,
)

AUTO = "auto"

# First calls compile (5-40 s for a Numba rung, less once the on-disk kernel cache has it).
# Nothing is printed: records go to the "tilegemm" logger, which Python shows only when the
# program turns logging on (README, "The first call compiles"). _USED holds the kernels
# this process has run; _SLOW_PENDING the first calls in progress, timed to explain a slow
# one. A later call pays one set lookup; the small-product fast path not even that.
log = logging.getLogger(__name__)
_USED: set[tuple[Any, ...]] = set()
_SLOW_PENDING: dict[tuple[Any, ...], str] = {}
_LOCK = threading.Lock()  # calls from several threads: each kernel's first use once
SLOW_FIRST_CALL_S = 2.0  # a first call longer than this gets an INFO record saying why
# a remembered device call with alpha 1 and beta 0 converts no scalar that could warn:
# no floating-point context, whose set-up costs a few µs
_QUIET = contextlib.nullcontext()

# Products of host arrays of at most this many multiply-adds (the batch included) run on
# the CPU where backend="auto" would send them to a GPU. Such a call copies A and B to the
# GPU and the result back and waits for it, whatever its size: on an H100's host
# (2026-11-26; benchmarks/results/logs-nvidia-h100-2026-11-26d) an 8x8x8 float32 product
# took 741 us through CUDA and 4.2 us on the CPU backend, 256^3 1291 us against 154 (float64
# 1548 against 211). A two-core Xeon (family 6 model 207) takes 241 us at 256^3 in float32
# and 482 in float64: still less than the GPU's call.
SMALL_HOST_PRODUCT = 256**3


def check_backend_name(name: str) -> None:
    """Refuse a backend name that is neither "auto" nor registered (the one wording of it)."""
    if name != AUTO and name not in BACKENDS:
        raise InvalidValueError(f"unknown backend {name!r}; choices: auto, {', '.join(BACKENDS)}")


def choose_backend(name: str, operands: list[Operand], device: int | None = None,
                   kernel: str = AUTO, prob: GemmProblem | None = None,
                   precision: str | None = None) -> Backend:
    """The backend to run on: the operands' device if they live on one, else the request.

    Operands are matched to backends by array kind (``Backend.array_kind``), so a backend
    that owns a kind of device array is found without naming it here.

    ``backend="auto"`` on host operands prefers a GPU, else the CPU. A ``device`` index or a
    named ``kernel`` steers that choice: when the backend ``auto`` would pick has no device
    choice, or no rung of that name, the first usable backend in ``auto``'s order that has
    both runs the call instead (a GPU first, a simulator last). So ``matmul(a, b,
    kernel="shared")`` on a machine without a GPU runs OpenCL's ``shared`` rung, and
    ``device=0`` there means OpenCL's device 0. Given the problem ``prob``, a small float32
    or float64 product of host arrays runs on the CPU instead of a GPU
    (:data:`SMALL_HOST_PRODUCT`), unless ``kernel``, ``device`` or a ``precision`` other
    than "ieee" asks for more than the CPU does.
    """
    kinds = {op.kind for op in operands if op.kind != "host"}
    if len(kinds) > 1:
        raise InvalidValueError(f"operands live on different devices ({', '.join(sorted(kinds))})")
    data_kind = kinds.pop() if kinds else "host"
    owners = [n for n in BACKENDS if ARRAY_KINDS[n] == data_kind]  # host: the CPU
    check_backend_name(name)
    requested = name
    if name == AUTO:
        if data_kind != "host":
            name = owners[0]
        else:
            # A GPU first; backends that certainly have none are not probed (see _probe).
            name = next(
                (n for n in BACKENDS
                 if may_be_accelerated(n) and get_backend(n).status().usable
                 and get_backend(n).status().accelerated),
                owners[0],
            )
            if device is not None or kernel != AUTO:
                name = _steered(name, device, kernel)
            elif name != owners[0] and _small_for_a_gpu(operands, prob, precision, owners[0]):
                name = owners[0]
    elif data_kind != "host" and get_backend(name).array_kind != data_kind:
        raise InvalidValueError(
            f"operands are {data_kind} arrays but backend={name!r} was requested; use "
            f"backend={owners[0]!r} (or 'auto'), or copy them to the host first"
        )
    backend = get_backend(name)
    status = backend.status()
    if not status.usable:
        usable = [s for s in map(lambda n: get_backend(n).status(), BACKENDS) if s.usable]
        raise UnavailableError(
            f"backend {name!r} is not usable here: {status.reason}. Usable backends: "
            + ", ".join(f"{s.name} ({s.reason})" for s in usable)
        )
    if device is not None and not backend.accepts_device:
        raise _no_device_choice(backend.name, requested == AUTO, kernel)
    return backend


def _small_for_a_gpu(operands: list[Operand], prob: GemmProblem | None,
                     precision: str | None, cpu: str) -> bool:
    """Whether a product of host arrays that ``auto`` would send to a GPU runs on the CPU
    instead: at most :data:`SMALL_HOST_PRODUCT` multiply-adds, float32 or float64 operands
    computed in their own type (16-bit operands would lose the GPU's tensor cores, and
    integers keep the backend they had), no tensor-core precision asked for, and the CPU
    backend (``cpu``, the backend of host arrays) usable."""
    return (prob is not None and precision in (None, "ieee")
            and all(op.dtype.name in ("float32", "float64") for op in operands)
            and prob.dtype.name in ("float32", "float64") and prob.out_dtype == prob.dtype
            and prob.batch * prob.m * prob.n * prob.k <= SMALL_HOST_PRODUCT
            and get_backend(cpu).status().usable)


def _fits(name: str, device: int | None, kernel: str) -> bool:
    """Whether backend ``name`` has what a call names: a device choice, a rung."""
    if device is not None and not get_backend(name).accepts_device:
        return False
    return kernel == AUTO or any(s.name == kernel for s in registry.specs_for(name))


def _steered(name: str, device: int | None, kernel: str) -> str:
    """``auto``'s pick ``name`` if it has the device choice and the rung a call names, else
    the first usable backend that has both, real hardware before a simulator (numba's
    CUDA simulator is correct but thousands of times slower); ``name`` again when none has
    (the checks that follow then say what is missing)."""
    if _fits(name, device, kernel):
        return name
    fitting = [get_backend(n).status() for n in BACKENDS if _fits(n, device, kernel)]
    usable = [s for s in fitting if s.usable]
    usable.sort(key=lambda s: (not s.accelerated, bool(getattr(s, "simulated", False))))
    return usable[0].name if usable else name


def _no_device_choice(chosen: str, auto: bool, kernel: str = AUTO) -> InvalidValueError:
    """``device=`` given for a backend that has one device: say which backends have a
    choice, and, when ``backend="auto"`` chose, why none of those could take the call (not
    usable here, or no rung of the name the call gives)."""
    choosers = [n for n in BACKENDS if get_backend(n).accepts_device]
    if not auto:
        return InvalidValueError(f"backend {chosen!r} has no device choice; device= works "
                                 f"with {' or '.join(f'backend={n!r}' for n in choosers)}")
    usable = [n for n in choosers if get_backend(n).status().usable]
    if kernel != AUTO and usable:
        registry.get(kernel, chosen)  # a rung of no backend: that error first
        return InvalidValueError(
            f"device= chooses a device of backend {' or '.join(map(repr, usable))}, which "
            f"has no rung {kernel!r}; {kernel!r} runs on backend {chosen!r}, which has no "
            "device choice: leave device= out")
    why = "; ".join(f"{n}: {get_backend(n).status().reason}" for n in choosers)
    return InvalidValueError(
        f"device= chooses a device of backend {' or '.join(map(repr, choosers))}, and none of "
        f"them is usable here ({why}); backend='auto' chose {chosen!r}, which has no device "
        "choice: leave device= out")


def choose_kernel(
    kernel: str, backend: Backend, prob: GemmProblem, params: dict[str, Any],
    target: Target | None = None,
) -> tuple[KernelSpec, dict[str, int]]:
    """The rung and its full parameters, validated on ``target`` (default: the backend's
    default device), the device that will run them."""
    target = target or backend.target()
    if kernel == AUTO:
        if params:
            raise ParametersNeedKernel(params)
        return auto_choice(backend, target, prob)
    spec = registry.get(kernel, backend.name)
    check_dtype_supported(spec, prob.dtype, prob.out_dtype)
    resolved = backend.resolve(spec, params, target)
    backend.check_limits(spec, resolved, prob.dtype, target)
    return spec, resolved


@dataclass(frozen=True)
class Decision:
    """What a call runs, decided before any data moves (:func:`decide`)."""

    backend: Backend
    target: Target  # the device that runs it
    prob: GemmProblem  # the problem as that backend computes it (16-bit on tensor cores)
    spec: KernelSpec
    params: dict[str, int]
    source: str  # why these parameters: "requested", "tuned", "database (device)"...


def decide(
    ops: list[Operand], prob: GemmProblem, *, kernel: str = AUTO, backend: str = AUTO,
    device: int | None = None, precision: str | None = None,
    params: dict[str, Any] | None = None, stream: Any = None, float32_out: bool = False,
    out: Any = None,
) -> Decision:
    """The backend, device, rung and parameters for ``prob``, with every check a call makes
    on them. :func:`gemm` runs what this returns and :func:`tilegemm.plan` reports it, so
    the two cannot disagree about a choice or about what they refuse.

    ``float32_out``: the caller passed a float32 ``out`` for float16/bfloat16 operands; a
    backend with tensor-core rungs for them then writes the float32 sums directly.
    ``out``: the caller's output array, if any (a result written into it needs no memory).
    """
    chosen = _decide(ops, prob, kernel=kernel, backend=backend, device=device,
                     precision=precision, params=params, stream=stream,
                     float32_out=float32_out)
    _check_device_data(ops, chosen.prob)
    chosen.backend.check_problem(ops, chosen.prob, chosen.target, out)  # memory, sizes
    return chosen


def describe_c(c: Any, prob: GemmProblem) -> Operand:
    """gemm's ``c``, described and checked against the result: a dtype NumPy would cast
    to it (same_kind) and a shape that broadcasts to it."""
    c_op = describe(c, "c")
    # the dtype the caller gets, not the one the kernel computes in: a bool or int8 result
    # is computed in int32, which would take an int32 c that NumPy refuses for it
    result = prob.out_dtype
    if not np.can_cast(c_op.dtype, result, "same_kind"):
        shown = "" if result == prob.dtype else f", computed in {prob.dtype.name}"
        raise InvalidTypeError(f"gemm: c: dtype {c_op.dtype.name} cannot be cast to the result "
                               f"dtype {result.name}{shown} (NumPy's same_kind rule)")
    try:
        shape = np.broadcast_shapes(c_op.shape, prob.out_shape)
    except ValueError:
        shape = None
    if shape != prob.out_shape:
        raise InvalidValueError(f"gemm: c of shape {c_op.shape} does not broadcast to the "
                                f"result shape {prob.out_shape}")
    return c_op


def _check_rung_for_device_data(kernel: str, be: Backend, ops: list[Operand]) -> None:
    """A rung of another backend named for device arrays, which only ``be`` takes: the
    registry's advice (pass that backend) led to the next refusal, of the arrays."""
    kinds = sorted({op.kind for op in ops if op.kind != "host"})
    if not kinds or _fits(be.name, None, kernel):  # (auto fits every backend)
        return
    owners = [n for n in BACKENDS if _fits(n, None, kernel)]
    if owners:
        here = ", ".join(s.name for s in registry.specs_for(be.name))
        raise InvalidValueError(
            f"kernel {kernel!r} is a rung of {registry.backends_phrase(owners)}, but the "
            f"{kinds[0]} arrays given run on backend {be.name!r}: copy them to the host "
            f"(NumPy arrays) to run {kernel!r}, or name a rung of {be.name!r}: {here}")


def _check_device_data(ops: list[Operand], prob: GemmProblem) -> None:
    """What device arrays cannot do, whichever backend runs them: be converted (a device c
    of another dtype than the result's), or give a result computed in another dtype and
    cast back, which only the host path does. ``ops``: a, b and gemm's c, if any."""
    c_op = ops[2] if len(ops) > 2 else None
    if c_op is not None and c_op.kind != "host" and c_op.dtype != prob.store_dtype:
        raise InvalidTypeError(
            f"gemm: device c has dtype {c_op.dtype.name}, the result is "
            f"{prob.store_dtype.name}; cast it on the device first")
    # (a result type equal to the computed one but another C type, np.longlong for int64
    # on Linux, is no conversion: the device result is the same numbers)
    if (prob.result_dtype is not None and prob.result_dtype != prob.dtype
            and any(op.kind != "host" for op in ops)):
        raise InvalidTypeError(
            f"matmul: the result dtype {prob.result_dtype.name} is computed as "
            f"{prob.dtype.name} and cast back on the host only; for device arrays, cast the "
            f"operands to {prob.dtype.name} first")


def _decide(
    ops: list[Operand], prob: GemmProblem, *, kernel: str = AUTO, backend: str = AUTO,
    device: int | None = None, precision: str | None = None,
    params: dict[str, Any] | None = None, stream: Any = None, float32_out: bool = False,
) -> Decision:
    """:func:`decide` without the backend's last check on the problem's size."""
    params = dict(params or {})
    be = choose_backend(backend, ops, device, kernel, prob, precision)  # small: the CPU
    _check_rung_for_device_data(kernel, be, ops)
    if stream is not None:
        if not getattr(be, "accepts_stream", False):
            raise InvalidValueError(f"stream= chooses a CUDA stream; backend {be.name!r} has "
                                    "no streams (pass backend='cuda')")
        from tilegemm.backends.cuda_stream import describe_stream

        describe_stream(stream)  # a wrong type fails here, before anything runs
    # The device first: defaults, parameters and limits are those of the device that runs.
    target = be.target_for(ops, device)
    # 16-bit operands go to tensor cores where a rung for them runs on this device; a
    # tensor-core rung named on a device without them keeps them, to say why it cannot run
    tc_target = None if _names_tensor_core_rung(kernel, be) else target
    if (float32_out and prob.operand_dtype is None
            and _tensor_core_dtype(prob, be, tc_target) is not None):
        # as make_problem(..., dtype=np.float32) describes it: float32 out, 16-bit operands
        # (NumPy bfloat16 arrays are described so already: np.matmul's float32 result)
        prob = replace(prob, result_dtype=None, operand_dtype=prob.result_dtype)
    prob = _tensor_core_half(prob, be, tc_target)
    asked_auto = kernel == AUTO and not params
    capability = None if target is None else target.known_capability  # auto's tensor rung
    kernel, params = apply_precision(precision, kernel, be.name, prob.dtype, params,
                                     prob.out_dtype, capability)
    source = "requested"
    if asked_auto and kernel != AUTO:  # a tensor-core rung: its tuned parameters, if any
        tuned = tuned_precision_params(be, target, prob, kernel, precision or "ieee")
        source = "default" if tuned is None else "tuned"
        params = params if tuned is None else tuned
    if kernel == AUTO and not params:
        return Decision(be, target, prob, *auto_plan(be, target, prob))
    if source == "requested" and params and kernel != AUTO:
        # some parameters given: the others from what the rung named alone runs here
        spec, resolved, source = _with_measured_others(be, target, prob, kernel, params)
        return Decision(be, target, prob, spec, resolved, source)
    spec, resolved = choose_kernel(kernel, be, prob, params, target)
    if source == "default":  # an untuned tensor-core rung: its defaults fitted to the shape
        spec, resolved, source = for_shape(be, target, prob, spec, resolved, source)
    if not params and source == "requested":
        # a rung named without parameters: this device's measured ones for it, if any
        spec, resolved, source = (named_plan(be, target, prob, kernel)
                                  or (spec, resolved, "default"))
    return Decision(be, target, prob, spec, resolved, source)


def _with_measured_others(be: Backend, target: Target, prob: GemmProblem, kernel: str,
                          given: dict[str, Any]) -> tuple[KernelSpec, dict[str, int], str]:
    """A named rung with parameters given by hand: the given ones on top of what the rung
    named alone would run here (tuned or shipped), so that changing one knob changes only
    that knob, when that combination satisfies the rung's constraints and the device's
    limits; else on top of the rung's defaults (the source says which)."""
    spec = registry.get(kernel, be.name)
    measured = (named_plan(be, target, prob, kernel)
                if spec.supports(prob.dtype) and set(given) < {p.name for p in spec.params}
                else None)
    bases = []
    if measured is not None:
        # then the device's entry for every shape, where the measured one is bounded to
        # large products: MR=8 on a 1024^3 product over 6x64 breaks MR*NR <= 384, and the
        # 8x32 measured for other shapes is nearer than the rung's defaults
        bases = [measured, *unbounded_database_plan(be, target, prob.dtype.name, kernel,
                                                    measured[1])]
    for _, base, where in bases:
        try:
            merged = be.resolve(spec, {**base, **given}, target)
            be.check_limits(spec, merged, prob.dtype, target)
            return spec, merged, f"requested; the others from {where}"
        except (ValueError, TypeError):
            pass
    spec, resolved = choose_kernel(kernel, be, prob, given, target)
    return spec, resolved, ("requested" if measured is None else
                            f"requested; the others are the defaults ({measured[2]} ones do "
                            "not fit)")


def check_dtype_supported(spec: KernelSpec, dtype: np.dtype,
                          result: np.dtype | None = None) -> None:
    """Refuse a rung that does not compute ``dtype`` (the one wording of it); ``result``:
    the caller's result dtype when it is computed as ``dtype`` (int8 as int32), named
    first, since that is the dtype the caller knows."""
    if not spec.supports(dtype):
        dtype = np.dtype(dtype)
        what = dtype.name if result is None or np.dtype(result) == dtype else (
            f"{np.dtype(result).name} (computed as {dtype.name})")
        if dtype.name in HALF_DTYPES:  # 16-bit operands, whatever the result: tensor cores
            what = f"{dtype.name} operands"
            if result is not None and np.dtype(result) != dtype:
                what += f" (a {np.dtype(result).name} result)"
            takes = [s.name for s in registry.specs_for(spec.backend) if s.supports(dtype)]
            if takes:
                what += f", which run on {', '.join(takes)}"
        raise InvalidTypeError(
            f"kernel {spec.name!r} ({spec.backend}) does not support dtype "
            f"{what}; it supports {', '.join(spec.dtypes)}")


def _check_params_are_upper_case(params: dict[str, Any]) -> None:
    """Rung parameters are UPPER-CASE (TILE, BM...); any other keyword (out_dtype=, a typo like
    kernal=) is a mistake that must not be reported as a kernel parameter."""
    for key in params:
        if not key.isupper():
            raise InvalidTypeError(f"unexpected keyword argument {key!r} (rung parameters are "
                            "UPPER-CASE, e.g. TILE=16; see tilegemm.kernels())")


# ml_dtypes' floating scalar types of at most 16 bits (every value exact in float32)
_FLOAT_SCALARS = tuple(getattr(ml_dtypes, n) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
                       if hasattr(ml_dtypes, n))


def _scalar(x: Any, name: str) -> Any:
    """``alpha``/``beta`` checked: a real number (a 0-d NumPy array counts, as its element:
    what NumPy's reductions and ``np.asarray(2.0)`` give)."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x[()]
    if isinstance(x, np.generic) and type(x) in _FLOAT_SCALARS:
        x = np.float32(x)  # ml_dtypes' scalars (bfloat16...) are no np.number; exact in float32
    if (isinstance(x, (bool, np.bool_, np.timedelta64))  # a timedelta64 is a np.number
            or not isinstance(x, (Number, np.number))):
        raise InvalidTypeError(f"{name} must be a real number, got {x!r}")
    if isinstance(x, (complex, np.complexfloating)):
        raise InvalidTypeError(f"{name} must be real, got {x!r}")
    if isinstance(x, decimal.Decimal) and x.is_snan():  # any comparison of it raises
        raise InvalidValueError(f"{name}={x!r} is a signalling NaN, which the decimal module "
                                "refuses to compare or convert; pass float('nan')")
    return x


def gemm(
    a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
    trans_a: bool = False, trans_b: bool = False, out: Any = None,
    kernel: str = AUTO, backend: str = AUTO, device: int | None = None, stream: Any = None,
    precision: str | None = None, dtype: Any = None, **params: Any,
) -> Any:
    """``alpha * op(a) @ op(b) + beta * c`` with ``op(x)`` = x or its (last-two-axes) transpose.

    Returns a new array (of the operands' array type), or writes ``out`` and returns it;
    ``out=c`` updates ``c`` in place. The result dtype is :func:`matmul`'s for ``a`` and
    ``b``; ``c`` must broadcast to the result shape, is cast to the result dtype under
    NumPy's ``same_kind`` rule (a float64 ``c`` with float32 operands is rounded to
    float32), and is read only when ``beta != 0``; a device ``c`` decides where the call
    runs, as device operands do, whatever ``beta`` is (a device ``c``, CUDA or OpenCL, must
    have the result's dtype: it is not converted on the device; a CUDA one read with
    ``beta != 0`` must also have the result's shape, C-contiguous). ``alpha`` and ``beta``
    are real numbers, integers for an integer result (for a bool result they scale the
    bool product: ``(alpha * (a @ b) + beta * c).astype(bool)``, as NumPy evaluates it);
    for a float16 or bfloat16 result they are rounded to it first, on every backend, as
    NumPy rounds a Python number that multiplies a float16 array (``alpha=1e5`` is inf
    there).
    ``alpha = 0`` still computes ``a @ b`` (a NaN or Inf in ``a`` or ``b`` gives NaN, as in
    NumPy, not BLAS's shortcut). Most rungs add ``alpha`` times their sum to ``beta * c``
    in one fused multiply-add, as BLAS does, so ``alpha * (a @ b)`` is not rounded on its
    own: where it alone would overflow (NumPy's ``alpha * (a @ b) + beta * c`` then gives
    ±inf or NaN), such a rung can give the finite or infinite value of the fused sum.
    ``trans_a``/``trans_b`` are booleans. Other arguments, and what is raised, are as for
    :func:`matmul`. A call like an earlier one (the same shapes, layouts, dtype and
    keywords, host arrays) reuses that call's decision, as :func:`matmul` does (see
    :mod:`tilegemm.fastpath`).
    """
    out = _one_out(out)
    routed = device is None and stream is None and precision is None
    if routed:
        # a product an earlier call with the same kernel=, backend=, parameters and dtype=
        # decided
        result = fastpath.try_remembered_gemm(a, b, c, out, alpha, beta, trans_a, trans_b,
                                              kernel, backend, params, dtype)
        if result is not None:
            return result
    if getattr(a, "ndim", 0) > 2:
        # a batch times one matrix: one product of the batch's rows (see stacked_rows)
        stacked = stacked_rows(a, b, c, out, trans_a, trans_b)
        if stacked is not None:
            result = gemm(stacked.a, stacked.b, stacked.c, alpha=alpha, beta=beta, trans_b=trans_b,
                          out=stacked.out, kernel=kernel, backend=backend, device=device,
                          stream=stream, precision=precision, dtype=dtype, **params)
            if routed:
                fastpath.remember_stacked(a, b, stacked, kernel, backend, params, dtype,
                                          trans_b)
            return out if out is not None else result.reshape(stacked.shape)
    return _full_gemm(a, b, c, alpha, beta, trans_a, trans_b, out, kernel, backend, device,
                      stream, precision, dtype, params)


def _full_gemm(a: Any, b: Any, c: Any, alpha: Any, beta: Any, trans_a: Any, trans_b: Any,
               out: Any, kernel: Any, backend: Any, device: Any, stream: Any, precision: Any,
               dtype: Any, params: dict[str, Any]) -> Any:
    """:func:`gemm` (and :func:`matmul`) decided in full: every check, the backend, the
    rung and its parameters; the decision is remembered for later calls where it can be."""
    _check_params_are_upper_case(params)
    if isinstance(stream, np.integer) and not isinstance(stream, np.bool_):
        stream = int(stream)  # a handle held in a NumPy integer, as device= takes one
    alpha, beta = _scalar(alpha, "alpha"), _scalar(beta, "beta")
    # a call whose decision can be remembered (see fastpath: host operands, dtype= in the
    # case; fastpath_device: device arrays, without dtype=), and one of a @ b alone
    routed = device is None and stream is None and precision is None
    rememberable = routed and dtype is None
    plain = (rememberable and c is None and alpha == 1 and beta == 0 and not trans_a
             and not trans_b)
    if plain and out is None:
        # device operands: launched directly, as an earlier call of this case let them be
        result = fastpath_device.try_remembered_device(a, b, kernel, backend, params)
        if result is not None:
            return result
    ops = [describe(a, "a"), describe(b, "b")]
    # device operands: the decision an earlier call of this case made (see fastpath_device)
    key = (_device_case(ops, c, out, trans_a, trans_b, kernel, backend, params)
           if rememberable and ops[0].kind != "host" else None)
    remembered = fastpath_device.remembered_decision(key)
    if remembered is not None:
        _check_beta_needs_c(beta, c)
        # c's shape and dtype are in the key: describe_c's checks passed for them; run
        # checks and converts this call's alpha and beta (resolve_scalars) before anything
        c_op = None if c is None else describe(c, "c")
        with _QUIET if plain else fp_warnings_at_caller():
            result = remembered.backend.run(remembered.spec, remembered.params,
                                            remembered.prob, ops[0], ops[1], c_op, out,
                                            alpha, beta, target=remembered.target)
        return result if out is None else out
    float32_out = _float32_out_on_request(dtype, out, ops)
    prob = make_problem(ops[0], ops[1], trans_a=trans_a, trans_b=trans_b, dtype=dtype)
    _check_beta_needs_c(beta, c)
    c_op = None
    if c is not None:  # checked whatever beta is, so a wrong c fails the same way always
        c_op = describe_c(c, prob)
        ops.append(c_op)  # a device c chooses where the call runs, whatever beta is
    # the tuning cache as it is before deciding, for a decision the fast path remembers
    hosted = routed and all(op.kind == "host" for op in ops)
    tuning = tuning_cache_now() if key is not None or hosted else None
    chosen = decide(ops, prob, kernel=kernel, backend=backend, device=device,
                    precision=precision, params=params, stream=stream,
                    float32_out=float32_out, out=out)
    be, target, prob, spec, resolved = (chosen.backend, chosen.target, chosen.prob,
                                        chosen.spec, chosen.params)
    data_kind = next((op.kind for op in ops if op.kind != "host"), "host")
    direct = True if out is None else check_out(out, prob, data_kind)
    extra: dict[str, Any] = {} if stream is None else {"stream": stream}
    used = (spec, target.key, prob.dtype.char, *resolved.values())
    if used not in _USED:  # the first call of this kernel in this process: it compiles
        _first_use(spec, resolved, prob.dtype, used)
    started = time.perf_counter() if _SLOW_PENDING else 0.0
    # The conversions below (operands and c to the rung's type, the result to NumPy's
    # result type or into out) may overflow: NumPy's warning then names the caller's line.
    with fp_warnings_at_caller():
        check_scalars(prob, alpha, beta)  # one the result cannot hold: refused before the run
        # A bool result is computed as int32 counts of true products: alpha and beta scale
        # the bool product (a @ b, then != 0), not the counts, so they are applied after
        scaled_bool = prob.out_dtype.kind == "b" and not (alpha == 1 and beta == 0)
        try:
            result = be.run(spec, resolved, prob, ops[0], ops[1],
                            None if scaled_bool else c_op, out if direct else None,
                            *((1, 0) if scaled_bool else (alpha, beta)), target=target,
                            **extra)
        finally:
            if _SLOW_PENDING:
                _log_if_slow(used, time.perf_counter() - started)
        if data_kind == "host":
            result = to_result(result, prob.out_dtype)
            if scaled_bool:
                result = _scaled_bool(result, alpha, beta, c)
            views = fastpath.gemm_views(a, b, trans_a, trans_b) if hosted else None
            if views is not None:
                # any ``out``, alpha, beta and c qualify: the decision does not depend on
                # them (see fastpath)
                fastpath.remember(*views, lambda: be.host_program(spec, resolved, prob, target),
                                  *tuning, kernel=kernel, backend=backend, params=params,
                                  alpha_limit=partial(be.host_alpha_limit, prob=prob),
                                  computed=prob.dtype, result=prob.out_dtype, asked=dtype)
        if key is not None and tuning is not None:
            fastpath_device.remember_decision(key, chosen, *tuning)
            if plain and out is None:  # a program for a @ b itself, taking a and b alone
                fastpath_device.remember_device(
                    a, b, lambda: be.device_program(spec, resolved, prob, target, ops[:2]),
                    *tuning, kernel=kernel, backend=backend, params=params)
        if out is not None and not direct:
            # Strided, cast, broadcast or overlapping out: the product went to a temporary.
            np.copyto(out, result, casting="same_kind")
            return out
    if out is not None:
        return out
    return _wrap_like_numpy(result, (a, b))


def _device_case(ops: list[Operand], c: Any, out: Any, trans_a: Any, trans_b: Any,
                 kernel: Any, backend: Any, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """The key (``fastpath_device.device_key``) of a call on device operands ``ops`` (a and
    b), with gemm's ``c`` and ``out`` when each is an array of their kind (its shape, dtype and
    strides are what the full path checks of it) and the transpose flags; None for any
    other ``c`` or ``out``, or flags that are not booleans, which the full path judges.
    alpha and beta are not in it: the decision does not depend on them, and each call
    checks its own."""
    if type(trans_a) is not bool or type(trans_b) is not bool:
        return None
    extra = []
    for x, name in ((c, "c"), (out, "out")):
        if x is None:
            continue
        if array_kind(x) != ops[0].kind:
            return None
        try:
            extra.append(describe(x, name))
        except UsageError:
            return None  # refused by the full path, after what it checks first
    key = fastpath_device.device_key([*ops, *extra], kernel, backend, params)
    return None if key is None else (*key, trans_a, trans_b, c is not None, out is not None)


def _check_beta_needs_c(beta: Any, c: Any) -> None:
    """gemm reads ``c`` only when ``beta != 0``, so that call needs one."""
    if beta != 0 and c is None:
        raise InvalidValueError("gemm: beta != 0 needs c")


def _scaled_bool(product: np.ndarray, alpha: Any, beta: Any, c: Any) -> np.ndarray:
    """``alpha * product + beta * c != 0`` for a bool ``product`` (a @ b) and bool ``c``,
    in int64, as NumPy evaluates ``(alpha * (a @ b) + beta * c).astype(bool)``. Scaling
    the int32 counts instead wrapped (alpha = 2**30 times 4 true products is 0) and
    subtracted c from a count (2 - 1 is true where True - True is false). ``c`` is read
    only when ``beta != 0``."""
    total = np.int64(int(alpha)) * product
    if beta != 0:
        total = total + np.int64(int(beta)) * np.asarray(c, dtype=np.bool_)
    return total != 0


def _first_use(spec: KernelSpec, params: dict[str, int], dtype: np.dtype,
               used: tuple[Any, ...]) -> None:
    """Record the first call of a kernel in this process: a DEBUG record now (it is about
    to be compiled, or loaded from the kernel cache), and an INFO one after the call if
    that took long (:func:`_log_if_slow`). Later calls skip this with one set lookup."""
    with _LOCK:
        if used in _USED:
            return
        _USED.add(used)
        what = f"{spec.key}" + "".join(f" {k}={v}" for k, v in params.items())
        _SLOW_PENDING[used] = f"{what} for {dtype.name}"
    log.debug("first use of %s for %s in this process: compiling it (or loading it from "
              "the on-disk kernel cache)", what, dtype.name)


def _log_if_slow(used: tuple[Any, ...], seconds: float) -> None:
    """After a kernel's first call: an INFO record when it took longer than
    ``SLOW_FIRST_CALL_S``, saying that compiling is part of it and whether the on-disk
    kernel cache spares later processes that (the call itself may be big, too)."""
    with _LOCK:
        what = _SLOW_PENDING.pop(used, None)
    if what is None or seconds <= SLOW_FIRST_CALL_S:
        return
    from tilegemm.compile_cache import cache_root, unusable_folders

    root = cache_root()
    cached = ("the kernel cache is off (TILEGEMM_KERNEL_CACHE), so each new process compiles "
              "it again" if root is None else
              f"the kernel cache ({root}) could not be used here (see the warning), so each "
              "new process compiles it again" if unusable_folders() else
              f"what the on-disk kernel cache keeps ({root}; `tilegemm cache` lists it) loads "
              "in well under a second in later processes")
    log.info("%s: the first call took %.1f s, which includes compiling the kernel (once "
             "per process); %s", what, seconds, cached)


def _float32_out_on_request(dtype: Any, out: Any, ops: list[Operand]) -> bool:
    """Whether a float32 ``out`` for float16/bfloat16 operands asks for float32 output (as
    ``dtype=np.float32`` does). Only tensor cores take that request (:func:`decide`): they
    then write their float32 sums directly instead of rounding them to 16 bits and widening
    them again. Everywhere else the call follows NumPy: the 16-bit result, cast into out."""
    if dtype is not None or out is None:
        return False
    if all(op.dtype.name in HALF_DTYPES for op in ops):
        try:
            return bool(describe(out, "out").dtype == np.float32)
        except Exception:  # a bad out is reported by check_out, with its own message
            return False
    return False


def _tensor_core_dtype(prob: GemmProblem, be: Backend,
                       target: Target | None = None) -> np.dtype | None:
    """The 16-bit operand dtype that ``be`` computes on tensor cores for ``prob``, or None
    (not 16-bit operands, or no rung of ``be`` takes them, or none runs on ``target``: a
    GPU older than sm_80 then computes them in float32 and rounds back, as the other
    backends do, where it refused every float16 product)."""
    half = prob.operand_dtype if prob.operand_dtype is not None else prob.out_dtype
    if half.name not in HALF_DTYPES:
        return None
    if not any(s.supports(half) and _runs_on(s, target) for s in registry.specs_for(be.name)):
        return None
    return half


def _names_tensor_core_rung(kernel: str, be: Backend) -> bool:
    if kernel == AUTO:
        return False
    try:
        return bool(registry.get(kernel, be.name).precisions)
    except UsageError:  # an unknown rung: refused, with its own message, further on
        return False


def _runs_on(spec: KernelSpec, target: Target | None) -> bool:
    """Whether ``target``'s compute capability has the instructions ``spec`` needs (True
    when unknown: no target, or the simulator)."""
    have = None if target is None else target.capability
    if not have:
        return True
    have = tuple(have[:2])
    return ((not spec.min_cc or have >= tuple(spec.min_cc))
            and (not spec.only_cc or have == tuple(spec.only_cc)))


def _tensor_core_half(prob: GemmProblem, be: Backend,
                      target: Target | None = None) -> GemmProblem:
    """float16/bfloat16 operands: computed in float32 and rounded back, as NumPy does,
    except on a backend with a tensor-core rung for that dtype, which takes the 16-bit
    operands directly and writes a 16-bit result, or a float32 one on request (dtype=)."""
    half = _tensor_core_dtype(prob, be, target)
    if half is None or prob.out_dtype.name not in (half.name, "float32"):
        return prob
    c_dtype = np.dtype(np.float32) if prob.out_dtype == np.float32 else None
    return replace(prob, dtype=half, result_dtype=None, c_dtype=c_dtype)


def _wrap_like_numpy(result: Any, inputs: tuple[Any, Any]) -> Any:
    """A host result as NumPy's matmul returns it: the highest-priority ndarray subclass
    among the inputs wraps it (``__array_wrap__``); a plain 0-d result is a NumPy scalar."""
    if type(result) is not np.ndarray:
        return result  # a device array: the operands' own library type
    subclasses = [x for x in inputs if isinstance(x, np.ndarray) and type(x) is not np.ndarray]
    if subclasses:
        owner = max(subclasses, key=lambda x: getattr(x, "__array_priority__", 0.0))
        # return_scalar as NumPy passes it: a 0-d result (vector · vector) may become a
        # scalar, as np.memmap's does
        context = (np.matmul, inputs, 0)
        try:
            return owner.__array_wrap__(result, context, result.ndim == 0)
        except TypeError:
            # An __array_wrap__ written before NumPy 2 takes no return_scalar: NumPy
            # calls it again without, with this warning, and so does tilegemm
            warnings.warn("__array_wrap__ must accept context and return_scalar arguments "
                          "(positionally) in the future. (Deprecated NumPy 2.0)",
                          DeprecationWarning, stacklevel=user_stacklevel())
            return owner.__array_wrap__(result, context)
    if result.ndim == 0:
        return result[()]  # vector · vector: a NumPy scalar, as np.matmul returns
    return result


def matmul(
    a: Any, b: Any, out: Any = None, *, kernel: str = AUTO, backend: str = AUTO,
    device: int | None = None, stream: Any = None, precision: str | None = None,
    dtype: Any = None, **params: Any,
) -> Any:
    """Matrix product with NumPy's ``matmul`` semantics, computed by a tilegemm rung.

    - 1-D operands are promoted (a row for ``a``, a column for ``b``) and the added axis is
      removed; leading dimensions broadcast and the batch runs on the device in one launch.
    - The result dtype is ``np.matmul``'s: ``numpy.result_type(a, b)`` for NumPy's own
      dtypes, float32 for ml_dtypes' bfloat16 (see ``dtype`` below). float32, float64,
      int32 and int64 are computed as they are; float16 (in float32), bool, and narrow or
      unsigned integers (in int32/int64, wrapping as NumPy's do) are computed in a kernel
      dtype and cast back, on host arrays (float16 runs on tensor cores where a backend has
      them). Integer and bool
      results are NumPy's exactly; a float16 result is rounded once from a float32 sum, as
      NumPy's is, but the sum's order differs, so it may differ from NumPy's by one float16
      unit in the last place. Complex, long double and object results are refused
      (``TypeError``).
    - ``out`` (also positional, as for ``np.matmul``): any strides, overlap with the inputs,
      a dtype the result casts to under NumPy's ``same_kind`` rule. float16/bfloat16
      operands with a float32 ``out`` get the 16-bit result cast into it, as from NumPy,
      except on CUDA tensor cores (below).
    - NumPy in, NumPy out (an ndarray subclass wraps the result through its
      ``__array_wrap__``, as with NumPy; ``np.matrix``, masked arrays, and subclasses or
      other array-likes with an ``__array_ufunc__`` of their own, such as unit-carrying
      arrays, are refused; a Dask array goes to :func:`tilegemm.dask.matmul`); CUDA
      device arrays (numba, CuPy, PyTorch) or pyopencl arrays in, the same kind of array
      out, with no copy to the host.
    - ``kernel`` names a rung (see :func:`tilegemm.kernels`) or "auto"; ``backend`` is
      "auto" or one that :func:`tilegemm.backends` lists ("cuda", "opencl", "cpu", and the
      CUDA C rungs' backend); ``params`` are the rung's parameters (``TILE=16``).
      ``backend="auto"`` prefers a GPU, else the CPU, but runs small float32 and float64
      products of host arrays (:data:`SMALL_HOST_PRODUCT` multiply-adds at most, without
      a ``kernel``, ``device`` or tensor-core ``precision``) on the CPU, where they
      take microseconds instead of the GPU's copies and wait; with a named ``kernel`` that
      backend lacks, it takes the first usable backend that has the rung (``kernel="shared"`` on a
      machine without a GPU runs OpenCL's).
    - ``device`` (OpenCL and CUDA) is a device index as listed by ``tilegemm info``; by
      default, OpenCL's is the one PYOPENCL_CTX names, else the first GPU, else the first
      device, and CUDA's is GPU 0. CUDA device arrays run on the device they live on. With
      ``backend="auto"``, ``device`` steers the choice to a usable backend that has
      devices to choose from (the GPU ``auto`` prefers, else OpenCL, whose device 0 may be
      the CPU); where none is usable, the error says so.
    - ``stream`` (CUDA only): the stream to run on. By default, the caller's current stream
      for their arrays' library (CuPy's current stream, PyTorch's current stream, a numba
      array's own stream, the ``stream`` of a ``__cuda_array_interface__``), so the result is
      ordered with the caller's other work without a device-wide wait; see
      ``tilegemm.backends.cuda_stream``. Host results are complete when the call returns.
    - ``precision`` (float32 only): "ieee" (default: IEEE float32 multiply-adds), "tf32" or
      "3xtf32" (tensor cores, CUDA on sm_80 or newer; see :mod:`tilegemm.precision`;
      3xtf32 turns infinities into NaN, see docs/tensor-cores.md). A precision no kernel
      here can compute is an error, never a silent fallback. float16 and bfloat16
      (``ml_dtypes.bfloat16``; PyTorch ``torch.bfloat16`` on the device) operands run on
      CUDA tensor cores with float32 accumulation (sm_80 or newer); on older GPUs, the CPU
      and OpenCL they are computed in float32 (float16 then rounded back, as NumPy does).
    - The first call of each rung, parameters and dtype in a process compiles it (seconds;
      less when the on-disk kernel cache has it). Nothing is printed: the ``tilegemm``
      logger records the first use (DEBUG) and a first call over 2 s (INFO).
    - ``dtype``: NumPy's ``matmul(..., dtype=)``, the result dtype (operands cast to it
      under ``same_kind``). ``dtype=np.float32`` with float16 or bfloat16 operands gives
      the float32 sums unrounded (on tensor cores a float32 ``out`` asks for the same).
      NumPy bfloat16 arrays give what ``np.matmul`` gives for them: float32 (ml_dtypes
      computes them in float32); PyTorch bfloat16 tensors give bfloat16, as
      ``torch.matmul``.
    - Floating-point exceptions inside a kernel (an overflow, Inf × 0) are neither warned
      about nor raised, whatever ``np.errstate`` says; it applies to tilegemm's own dtype
      conversions only.

    Returns the product (an array of the operands' kind, or ``out``; a NumPy scalar for two
    1-D operands). Raises, before any work and leaving the operands and ``out`` untouched,
    the subclasses of ``tilegemm.errors.UsageError``: ``ValueError`` for shapes, parameters,
    kernels and backends (``InvalidValueError``), ``TypeError`` for dtypes and array kinds
    (``InvalidTypeError``, NumPy's ``UFuncTypeError`` for an ``out`` cast), and
    ``UnavailableError`` (a ``RuntimeError``) for a backend or device this machine lacks.
    """
    out = _one_out(out)
    routed = device is None and stream is None and precision is None
    if routed:
        # a case an earlier call with the same kernel=, backend=, parameters and dtype=
        # decided
        result = fastpath.try_remembered(a, b, out, kernel, backend, params, dtype)
        if result is not None:
            return result
    if getattr(a, "ndim", 0) > 2:
        # a batch times one matrix: one product of the batch's rows (see stacked_rows)
        stacked = stacked_rows(a, b, None, out)
        if stacked is not None:
            result = matmul(stacked.a, stacked.b, stacked.out, kernel=kernel, backend=backend,
                            device=device, stream=stream, precision=precision, dtype=dtype,
                            **params)
            if routed:
                fastpath.remember_stacked(a, b, stacked, kernel, backend, params, dtype)
            return out if out is not None else result.reshape(stacked.shape)
    return _full_gemm(a, b, None, 1.0, 0.0, False, False, out, kernel, backend, device, stream,
                      precision, dtype, params)


def _one_out(out: Any) -> Any:
    """``out``, or the array of NumPy's ufunc form ``out=(array,)``."""
    if isinstance(out, tuple):
        if len(out) != 1:
            raise InvalidValueError(f"the 'out' tuple must have exactly one entry (one "
                                    f"result), got {len(out)}")
        return out[0]
    return out


def kernels(backend: str | None = None) -> list[KernelSpec]:
    """The registered rungs (all backends, or one)."""
    if backend is None:
        return list(registry.all_specs())
    if backend not in BACKENDS:
        raise InvalidValueError(f"unknown backend {backend!r}; choices: {', '.join(BACKENDS)}")
    return list(registry.specs_for(backend))


def backends() -> list[Any]:
    """Every backend with whether it is usable here, and why not."""
    from tilegemm.backends import statuses

    return statuses()
