"""``matmul`` and ``gemm``: validate everything, choose a backend and a rung, dispatch.

Order matters: every check (shapes, dtypes, parameters, ``out``, device limits, backend
availability) runs before any data moves, so a bad call raises a clear error and leaves
the caller's arrays untouched.
"""

from __future__ import annotations

from numbers import Number
from typing import Any

import numpy as np

from tilegemm import fastpath, registry
from tilegemm.backends import ARRAY_KINDS, get_backend
from tilegemm.backends._probe import may_be_accelerated
from tilegemm.backends.base import Backend, Target
from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError
from tilegemm.precision import apply_precision
from tilegemm.problem import (
    HALF_DTYPES,
    GemmProblem,
    Operand,
    check_out,
    describe,
    make_problem,
    to_result,
)
from tilegemm.registry import BACKENDS, KernelSpec
from tilegemm.tune.select import auto_choice, tuned_precision_params, tuning_cache_path

AUTO = "auto"


def choose_backend(name: str, operands: list[Operand]) -> Backend:
    """The backend to run on: the operands' device if they live on one, else the request.

    Operands are matched to backends by array kind (``Backend.array_kind``), so a backend
    that owns a kind of device array is found without naming it here.
    """
    kinds = {op.kind for op in operands if op.kind != "host"}
    if len(kinds) > 1:
        raise InvalidValueError(f"operands live on different devices ({', '.join(sorted(kinds))})")
    data_kind = kinds.pop() if kinds else "host"
    owners = [n for n in BACKENDS if ARRAY_KINDS[n] == data_kind]  # host: the CPU
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
    elif name not in BACKENDS:
        raise InvalidValueError(f"unknown backend {name!r}; choices: auto, {', '.join(BACKENDS)}")
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
    return backend


def choose_kernel(
    kernel: str, backend: Backend, prob: GemmProblem, params: dict[str, Any],
    target: Target | None = None,
) -> tuple[KernelSpec, dict[str, int]]:
    """The rung and its full parameters, validated on ``target`` (default: the backend's
    default device), the device that will run them."""
    target = target or backend.target()
    if kernel == AUTO:
        if params:
            raise InvalidValueError(
                f"parameters {', '.join(params)} need an explicit kernel= (kernel='auto' "
                "chooses its own)"
            )
        return auto_choice(backend, target, prob)
    spec = registry.get(kernel, backend.name)
    if not spec.supports(prob.dtype):
        raise InvalidTypeError(
            f"kernel {spec.name!r} ({backend.name}) does not support dtype {prob.dtype.name}; "
            f"it supports {', '.join(spec.dtypes)}"
        )
    resolved = backend.resolve(spec, params, target)
    backend.check_limits(spec, resolved, prob.dtype, target)
    return spec, resolved


def _check_params_are_upper_case(params: dict[str, Any]) -> None:
    """Rung parameters are UPPER-CASE (TILE, BM...); any other keyword (out_dtype=, a typo like
    kernal=) is a mistake that must not be reported as a kernel parameter."""
    for key in params:
        if not key.isupper():
            raise InvalidTypeError(f"unexpected keyword argument {key!r} (rung parameters are "
                            "UPPER-CASE, e.g. TILE=16; see tilegemm.kernels())")


def _check_scalar(x: Any, name: str) -> None:
    if isinstance(x, bool) or not isinstance(x, (Number, np.number)):
        raise InvalidTypeError(f"{name} must be a real number, got {x!r}")
    if isinstance(x, (complex, np.complexfloating)):
        raise InvalidTypeError(f"{name} must be real, got {x!r}")


def gemm(
    a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
    trans_a: bool = False, trans_b: bool = False, out: Any = None,
    kernel: str = AUTO, backend: str = AUTO, device: int | None = None, stream: Any = None,
    precision: str | None = None, dtype: Any = None, **params: Any,
) -> Any:
    """``alpha * op(a) @ op(b) + beta * c`` with ``op(x)`` = x or its (last-two-axes) transpose.

    Returns a new array (of the operands' array type), or writes ``out`` and returns it;
    ``out=c`` updates ``c`` in place. ``c`` must broadcast to the result shape and is read
    only when ``beta != 0``. Other arguments are as for :func:`matmul`.
    """
    _check_params_are_upper_case(params)
    plain = (c is None and out is None and alpha == 1 and beta == 0 and not trans_a
             and not trans_b and kernel == AUTO and backend == AUTO and device is None
             and stream is None and precision is None and not params)
    _check_scalar(alpha, "alpha")
    _check_scalar(beta, "beta")
    ops = [describe(a, "a"), describe(b, "b")]
    dtype = _float32_out_on_request(dtype, out, ops)
    prob = make_problem(ops[0], ops[1], trans_a=trans_a, trans_b=trans_b, dtype=dtype)
    if beta != 0 and c is None:
        raise InvalidValueError("gemm: beta != 0 needs c")
    c_op = None
    if c is not None:  # checked whatever beta is, so a wrong c fails the same way always
        c_op = describe(c, "c")
        if not np.can_cast(c_op.dtype, prob.dtype, "same_kind"):
            raise InvalidTypeError(f"gemm: c: dtype {c_op.dtype.name} cannot be cast to the result "
                            f"dtype {prob.dtype.name} (NumPy's same_kind rule)")
        try:
            shape = np.broadcast_shapes(c_op.shape, prob.out_shape)
        except ValueError:
            shape = None
        if shape != prob.out_shape:
            raise InvalidValueError(
                f"gemm: c of shape {c_op.shape} does not broadcast to the result "
                f"shape {prob.out_shape}")
        if beta != 0:
            ops.append(c_op)
        else:
            c_op = None  # never read when beta == 0
    be = choose_backend(backend, ops)
    if device is not None and not be.accepts_device:
        choosers = [n for n in BACKENDS if get_backend(n).accepts_device]
        raise InvalidValueError(f"backend {be.name!r} has no device choice; device= works "
                                f"with backend={' or '.join(map(repr, choosers))}")
    if stream is not None:
        if not getattr(be, "accepts_stream", False):
            raise InvalidValueError(f"stream= chooses a CUDA stream; backend {be.name!r} has "
                                    "no streams (pass backend='cuda')")
        from tilegemm.backends.cuda_stream import describe_stream

        describe_stream(stream)  # a wrong type fails here, before anything runs
    # The device first: defaults, parameters and limits are those of the device that runs.
    target = be.target_for(ops, device)
    prob = _tensor_core_half(prob, be)
    asked_auto = kernel == AUTO and not params
    kernel, params = apply_precision(precision, kernel, be.name, prob.dtype, params)
    if asked_auto and kernel != AUTO:  # a tensor-core rung: its tuned parameters, if any
        tuned = tuned_precision_params(be, target, prob, kernel, precision or "ieee")
        params = params if tuned is None else tuned
    spec, resolved = choose_kernel(kernel, be, prob, params, target)
    data_kind = next((op.kind for op in ops if op.kind != "host"), "host")
    if data_kind != "host" and prob.result_dtype is not None:
        raise InvalidTypeError(
            f"matmul: the result dtype {prob.result_dtype.name} is computed as "
            f"{prob.dtype.name} and cast back on the host only; for device arrays, cast the "
            f"operands to {prob.dtype.name} first")
    direct = True if out is None else check_out(out, prob, data_kind)
    extra: dict[str, Any] = {} if stream is None else {"stream": stream}
    result = be.run(spec, resolved, prob, ops[0], ops[1], c_op, out if direct else None,
                    alpha, beta, target=target, **extra)
    if data_kind == "host":
        result = to_result(result, prob.out_dtype)
        if (plain and prob.result_dtype is None and be.array_kind == "host"
                and prob.dtype == getattr(a, "dtype", None)):
            fastpath.remember(a, b, spec.program(resolved, prob.dtype), tuning_cache_path())
    if out is not None and not direct:
        # Strided, cast, broadcast or overlapping out: the product went to a temporary.
        np.copyto(out, result, casting="same_kind")
        return out
    if out is not None:
        return out
    return _wrap_like_numpy(result, (a, b))


def _float32_out_on_request(dtype: Any, out: Any, ops: list[Operand]) -> Any:
    """A float32 ``out`` for float16/bfloat16 operands asks for float32 output (as
    ``dtype=np.float32`` does): tensor cores then write their float32 sums directly instead
    of rounding them to 16 bits and widening them again."""
    if dtype is not None or out is None:
        return dtype
    if all(op.dtype.name in HALF_DTYPES for op in ops):
        try:
            if describe(out, "out").dtype == np.float32:
                return np.float32
        except Exception:  # a bad out is reported by check_out, with its own message
            return None
    return None


def _tensor_core_half(prob: GemmProblem, be: Backend) -> GemmProblem:
    """float16/bfloat16 operands: computed in float32 and rounded back, as NumPy does,
    except on a backend with a tensor-core rung for that dtype, which takes the 16-bit
    operands directly and writes a 16-bit result, or a float32 one on request (dtype=)."""
    half = prob.operand_dtype if prob.operand_dtype is not None else prob.out_dtype
    if half.name not in HALF_DTYPES or prob.out_dtype.name not in (half.name, "float32"):
        return prob
    if not any(s.supports(half) for s in registry.specs_for(be.name)):
        return prob
    from dataclasses import replace

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
        return owner.__array_wrap__(result, (np.matmul, inputs, 0), False)
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
    - The result dtype is ``numpy.result_type(a, b)``. float32, float64, int32 and int64 are
      computed as they are; float16 (in float32), bool, and narrow or unsigned integers (in
      int32/int64, wrapping as NumPy's do) are computed in a kernel dtype and cast back, on
      host arrays (float16 runs on tensor cores where a backend has them). Complex, long
      double and object results are refused (``TypeError``).
    - ``out`` (also positional, as for ``np.matmul``): any strides, overlap with the inputs,
      a dtype the result casts to under NumPy's ``same_kind`` rule.
    - NumPy in, NumPy out (an ndarray subclass wraps the result through its
      ``__array_wrap__``, as with NumPy; ``np.matrix`` and masked arrays are refused); CUDA
      device arrays (numba, CuPy, PyTorch) or pyopencl arrays in, the same kind of array
      out, with no copy to the host.
    - ``kernel`` names a rung (see :func:`tilegemm.kernels`) or "auto"; ``backend`` is
      "auto", "cuda", "opencl" or "cpu"; ``params`` are the rung's parameters (``TILE=16``).
    - ``device`` (OpenCL and CUDA) is a device index as listed by ``tilegemm info``; by
      default, OpenCL's is the one PYOPENCL_CTX names, else the first GPU, else the first
      device, and CUDA's is GPU 0. CUDA device arrays run on the device they live on.
    - ``stream`` (CUDA only): the stream to run on. By default, the caller's current stream
      for their arrays' library (CuPy's current stream, PyTorch's current stream, a numba
      array's own stream, the ``stream`` of a ``__cuda_array_interface__``), so the result is
      ordered with the caller's other work without a device-wide wait; see
      ``tilegemm.backends.cuda_stream``. Host results are complete when the call returns.
    - ``precision`` (float32 only): "ieee" (default: IEEE float32 multiply-adds), "tf32" or
      "3xtf32" (tensor cores, CUDA on sm_80 or newer; see :mod:`tilegemm.precision`). A
      precision no kernel here can compute is an error, never a silent fallback. float16
      and bfloat16 (``ml_dtypes.bfloat16``; PyTorch ``torch.bfloat16`` on the device)
      operands run on CUDA tensor cores with float32 accumulation; on the CPU and OpenCL
      they are computed in float32 and rounded back, as NumPy computes float16.
    - ``dtype``: NumPy's ``matmul(..., dtype=)``, the result dtype (operands cast to it
      under ``same_kind``). ``dtype=np.float32`` (or a float32 ``out``) with float16 or
      bfloat16 operands gives the tensor cores' float32 sums unrounded. bfloat16 operands
      give a bfloat16 result (``numpy.result_type``; ``np.matmul`` itself returns float32
      for ``ml_dtypes`` arrays, having no bfloat16 loop).
    """
    if (out is None and kernel == AUTO and backend == AUTO and device is None
            and stream is None and precision is None and dtype is None and not params):
        result = fastpath.try_small(a, b)  # a small product an earlier call decided
        if result is not None:
            return result
    return gemm(a, b, out=out, kernel=kernel, backend=backend, device=device, stream=stream,
                precision=precision, dtype=dtype, **params)


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
