"""A GEMM problem in normal form, and the checks that put user input into it.

Every backend runs the same shape of work: a batch of ``C[b] = alpha * A[b] @ B[b] + beta *
C[b]`` with ``A`` of shape (batch or 1, M, K), ``B`` (batch or 1, K, N) and ``C`` (batch, M,
N). All of NumPy's ``matmul`` rules (1-D promotion, broadcast leading dimensions, dtype
promotion) are applied here, once, before any backend is touched, so every error is raised
before a launch and the caller's arrays are never modified by a failed call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilegemm.errors import InvalidTypeError, InvalidValueError

# float16 runs only on tensor cores (tilegemm.precision says where): float32 accumulation.
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "float64", "int32", "int64", "float16")


@dataclass(frozen=True)
class Operand:
    """What we need to know about an input without touching its data."""

    obj: Any
    kind: str  # "host", "cuda" (has __cuda_array_interface__) or "opencl" (pyopencl Array)
    shape: tuple[int, ...]
    dtype: np.dtype


def array_kind(x: Any) -> str:
    # numba's device arrays (and the simulator's stand-ins, which lack the interface dict)
    # carry the __cuda_ndarray__ marker; CuPy and PyTorch expose the interface.
    if hasattr(x, "__cuda_array_interface__") or getattr(x, "__cuda_ndarray__", False):
        return "cuda"
    if type(x).__module__.startswith("pyopencl"):
        return "opencl"
    return "host"


def describe(x: Any, name: str) -> Operand:
    """Shape and dtype of ``x`` (NumPy, CUDA-array-interface or pyopencl array, or a list)."""
    kind = array_kind(x)
    if kind == "cuda" and not hasattr(x, "__cuda_array_interface__"):
        return Operand(x, kind, tuple(int(s) for s in x.shape), np.dtype(x.dtype))
    if kind == "cuda":
        cai = x.__cuda_array_interface__
        return Operand(x, kind, tuple(int(s) for s in cai["shape"]), np.dtype(cai["typestr"]))
    if kind == "opencl":
        return Operand(x, kind, tuple(int(s) for s in x.shape), np.dtype(x.dtype))
    # Subclasses whose meaning a plain product would change are refused; any other
    # ndarray subclass is computed on its data and the result is a plain ndarray.
    if isinstance(x, np.matrix):
        raise InvalidTypeError(
            f"{name}: np.matrix is not supported (its operators and shapes differ "
            "from ndarray's); pass np.asarray(x)")
    if isinstance(x, np.ma.MaskedArray):
        raise InvalidTypeError(
            f"{name}: masked arrays are not supported (the mask would be ignored); "
            "pass x.filled(0) or the unmasked data")
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # pragma: no cover - depends on the object
            raise InvalidTypeError(
                f"{name}: cannot convert {type(x).__name__} to an array") from exc
    return Operand(x, kind, x.shape, x.dtype)


def check_dtype(dtype: np.dtype, what: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.name not in SUPPORTED_DTYPES:
        raise InvalidTypeError(
            f"{what}: unsupported dtype {dtype.name}; supported dtypes are "
            f"{', '.join(SUPPORTED_DTYPES)}"
        )
    return dtype


@dataclass(frozen=True)
class GemmProblem:
    """Shapes and types of one (batched) product, after promotion and broadcasting."""

    m: int
    n: int
    k: int
    dtype: np.dtype
    batch_shape: tuple[int, ...] = ()
    a_batch_shape: tuple[int, ...] = ()  # A's own leading dims, left-padded with 1s
    b_batch_shape: tuple[int, ...] = ()
    squeeze_m: bool = False  # a was 1-D: drop the M axis from the result
    squeeze_n: bool = False  # b was 1-D: drop the N axis from the result
    trans_a: bool = False
    trans_b: bool = False

    @property
    def batch(self) -> int:
        return math.prod(self.batch_shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        tail = (() if self.squeeze_m else (self.m,)) + (() if self.squeeze_n else (self.n,))
        return self.batch_shape + tail

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def empty(self) -> bool:
        return self.batch == 0 or self.m == 0 or self.n == 0

    def batch_mode(self, which: str) -> str:
        """How operand ``which`` ("a" or "b") maps onto the batch.

        "single": all its leading dims are 1 (one matrix shared by every product);
        "full": its leading dims equal the broadcast shape (a reshape is enough);
        "broadcast": partially broadcast (must be materialised to (batch, rows, cols)).
        """
        own = self.a_batch_shape if which == "a" else self.b_batch_shape
        if math.prod(own) == 1 or not own:
            return "single"
        if own == self.batch_shape:
            return "full"
        return "broadcast"


def _shape_error(a: tuple[int, ...], b: tuple[int, ...], detail: str) -> InvalidValueError:
    return InvalidValueError(f"matmul: shapes {a} and {b} are not aligned: {detail}")


def make_problem(
    a: Operand, b: Operand, *, trans_a: bool = False, trans_b: bool = False
) -> GemmProblem:
    """Apply NumPy's matmul rules to two operands (after optional transposes)."""
    for op, name in ((a, "a"), (b, "b")):
        if len(op.shape) == 0:
            raise InvalidValueError(
                f"matmul: input operand {name} is 0-d (shape ()); matmul needs arrays of at "
                "least 1 dimension (use * for scalars)"
            )
    dtype = check_dtype(np.result_type(a.dtype, b.dtype), "matmul")
    check_dtype(a.dtype, "matmul: operand a")
    check_dtype(b.dtype, "matmul: operand b")

    a_shape, b_shape = a.shape, b.shape
    squeeze_m = len(a_shape) == 1
    squeeze_n = len(b_shape) == 1
    if (trans_a and squeeze_m) or (trans_b and squeeze_n):
        raise InvalidValueError("gemm: trans_a/trans_b need operands with at least 2 dimensions")
    a2 = (1,) + a_shape if squeeze_m else a_shape
    b2 = b_shape + (1,) if squeeze_n else b_shape
    if trans_a:
        a2 = a2[:-2] + (a2[-1], a2[-2])
    if trans_b:
        b2 = b2[:-2] + (b2[-1], b2[-2])
    m, ka = a2[-2], a2[-1]
    kb, n = b2[-2], b2[-1]
    if ka != kb:
        raise _shape_error(
            a.shape, b.shape, f"a has K={ka} (its last axis{' after transpose' if trans_a else ''})"
            f" but b has K={kb} (its {'first' if squeeze_n else 'second-to-last'} axis"
            f"{' after transpose' if trans_b else ''})"
        )
    a_lead, b_lead = a2[:-2], b2[:-2]
    try:
        batch_shape = tuple(np.broadcast_shapes(a_lead, b_lead))
    except ValueError:
        raise _shape_error(
            a.shape, b.shape, f"leading (batch) dimensions {a_lead} and {b_lead} do not broadcast"
        ) from None
    nd = len(batch_shape)
    pad = lambda s: (1,) * (nd - len(s)) + s  # noqa: E731
    return GemmProblem(
        m=m, n=n, k=ka, dtype=dtype, batch_shape=batch_shape,
        a_batch_shape=pad(a_lead), b_batch_shape=pad(b_lead),
        squeeze_m=squeeze_m, squeeze_n=squeeze_n, trans_a=trans_a, trans_b=trans_b,
    )


def host_operand_3d(x: np.ndarray, prob: GemmProblem, which: str) -> np.ndarray:
    """A host operand as a C-contiguous (batch or 1, rows, cols) array of the problem dtype.

    Copies only when needed (a dtype change, a transpose, a partial broadcast or a
    non-contiguous layout); the caller's array is never written. The result is always a
    read-only view: kernels never write operands, and one array type (read-only, where a
    caller's read-only array would otherwise differ from a writeable copy) means a Numba
    rung compiles once per dtype, not once per mix of read-only and writeable inputs.
    """
    if which == "a":
        x2 = x[None, :] if prob.squeeze_m else x
        if prob.trans_a:
            x2 = np.swapaxes(x2, -1, -2)
        rows, cols = prob.m, prob.k
    else:
        x2 = x[:, None] if prob.squeeze_n else x
        if prob.trans_b:
            x2 = np.swapaxes(x2, -1, -2)
        rows, cols = prob.k, prob.n
    mode = prob.batch_mode(which)
    if mode == "single":
        x3 = x2.reshape(1, rows, cols)
    elif mode == "full":
        x3 = x2.reshape(prob.batch, rows, cols)
    else:
        x3 = np.broadcast_to(x2, prob.batch_shape + (rows, cols)).reshape(prob.batch, rows, cols)
    view = np.ascontiguousarray(x3, dtype=prob.dtype).view()
    view.flags.writeable = False
    return view


def check_out(out: Any, prob: GemmProblem, kind: str) -> None:
    """Refuse an ``out`` array that cannot hold the result, before anything runs."""
    if kind == "host" and array_kind(out) == "host" and not isinstance(out, np.ndarray):
        raise InvalidValueError(f"out: must be a numpy.ndarray, got {type(out).__name__}")
    op = describe(out, "out")
    if op.kind != kind:
        raise InvalidValueError(
            f"out: a {op.kind} array cannot receive a result computed on {kind} data")
    if op.shape != prob.out_shape:
        raise InvalidValueError(f"out: has shape {op.shape}, the result has shape {prob.out_shape}")
    if op.dtype != prob.dtype:
        raise InvalidValueError(
            f"out: has dtype {op.dtype.name}, the result has dtype {prob.dtype.name}")
    if kind == "host":
        if not out.flags.c_contiguous:
            raise InvalidValueError("out: must be C-contiguous")
        if not out.flags.writeable:
            raise InvalidValueError("out: is read-only")
