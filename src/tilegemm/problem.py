"""A GEMM problem in normal form, and the checks that put user input into it.

Every backend runs the same shape of work: a batch of ``C[b] = alpha * A[b] @ B[b] + beta *
C[b]`` with ``A`` of shape (batch or 1, M, K), ``B`` (batch or 1, K, N) and ``C`` (batch, M,
N). All of NumPy's ``matmul`` rules (1-D promotion, broadcast leading dimensions, dtype
promotion) are applied here, once, before any backend is touched, so every error is raised
before a launch and the caller's arrays are never modified by a failed call.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy: np.dtype("bfloat16"))
import numpy as np

from tilegemm.errors import InvalidTypeError, InvalidValueError, user_stacklevel

# What the kernels compute in. float16 and bfloat16 run only on tensor cores
# (tilegemm.precision says where), with float32 accumulation; elsewhere such a product is
# computed in float32 and rounded back.
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "float64", "int32", "int64", "float16",
                                     "bfloat16")
# 16-bit float operands that tensor-core rungs take as they are (ml_dtypes.bfloat16 for
# bfloat16), accumulating in float32; a float32 result is theirs on request (dtype=).
HALF_DTYPES: tuple[str, ...] = ("float16", "bfloat16")

# Result dtypes NumPy's matmul can produce that tilegemm computes in a kernel dtype and casts
# back, bit for bit as NumPy's own loops: integers narrower than 32 bits and unsigned ones
# wrap modulo 2**bits, which the 32/64-bit sums already give (modular arithmetic is the
# same for signed and unsigned of one width); float16 is accumulated in float32 as NumPy
# does internally (bfloat16 likewise); bool is "any product true", i.e. a count of true
# products != 0.
COMPUTED_AS: dict[str, str] = {
    "float32": "float32", "float64": "float64", "int32": "int32", "int64": "int64",
    "float16": "float32", "bfloat16": "float32", "bool": "int32",
    "int8": "int32", "int16": "int32", "uint8": "int32", "uint16": "int32",
    "uint32": "int32", "uint64": "int64",
}
# NumPy result dtypes that are refused by design: no kernel computes them (complex, long
# double, object, strings, dates), and emulating them would hide a slow or inexact path.
RESULT_DTYPES: tuple[str, ...] = tuple(COMPUTED_AS)


@dataclass(frozen=True)
class Operand:
    """What we need to know about an input without touching its data."""

    obj: Any
    kind: str  # "host", "cuda" (has __cuda_array_interface__) or "opencl" (pyopencl Array)
    shape: tuple[int, ...]
    dtype: np.dtype
    # A device array's byte strides (C-ordered ones where the array says only "C-ordered"),
    # for the decisions remembered per layout (tilegemm.fastpath_device); None for host
    # operands.
    strides: tuple[int, ...] | None = None


def _torch_cuda_bfloat16(x: Any) -> bool:
    """A PyTorch CUDA tensor of bfloat16, which has no ``__cuda_array_interface__`` (the
    interface has no bfloat16 type string): described from its own attributes."""
    return (type(x).__module__.startswith("torch") and str(getattr(x, "dtype", "")) ==
            "torch.bfloat16" and bool(getattr(x, "is_cuda", False)))


def array_kind(x: Any) -> str:
    if _torch_cuda_bfloat16(x):
        return "cuda"
    # numba's device arrays (and the simulator's stand-ins, which lack the interface dict)
    # carry the __cuda_ndarray__ marker; CuPy and PyTorch expose the interface.
    if hasattr(x, "__cuda_array_interface__") or getattr(x, "__cuda_ndarray__", False):
        return "cuda"
    if is_pyopencl_array(x):
        return "opencl"
    return "host"


def is_pyopencl_array(x: Any) -> bool:
    """Whether ``x`` is a ``pyopencl.array.Array`` (a subclass included). A module
    PyOpenCL has not imported cannot have made ``x``, so this imports nothing."""
    module = sys.modules.get("pyopencl.array")
    return module is not None and isinstance(x, module.Array)


_NDARRAY_UFUNC = np.ndarray.__array_ufunc__


def _is_masked(x: Any) -> bool:
    """Whether ``x`` is a NumPy masked array. ``np.ma`` is imported on first use (about
    30 ms, a tenth of a first call's budget); a module not yet imported cannot have made
    ``x``, so this imports nothing."""
    module = sys.modules.get("numpy.ma")
    return module is not None and isinstance(x, module.MaskedArray)


def describe(x: Any, name: str) -> Operand:
    """Shape and dtype of ``x`` (NumPy, CUDA-array-interface or pyopencl array, or a list)."""
    kind = array_kind(x)
    if _torch_cuda_bfloat16(x):
        stride = getattr(x, "stride", None)  # elements, as PyTorch counts them
        return Operand(x, kind, tuple(int(s) for s in x.shape), np.dtype("bfloat16"),
                       tuple(2 * int(s) for s in stride()) if callable(stride) else None)
    if kind == "cuda" and not hasattr(x, "__cuda_array_interface__"):
        return Operand(x, kind, tuple(int(s) for s in x.shape), np.dtype(x.dtype),
                       tuple(int(s) for s in x.strides))
    if kind == "cuda":
        cai = x.__cuda_array_interface__
        dtype = np.dtype(cai["typestr"])
        if dtype.kind == "V":  # e.g. a bfloat16 array: the interface has no type for it
            raise InvalidTypeError(
                f"{name}: a CUDA array of untyped {dtype.itemsize}-byte elements (typestr "
                f"{cai['typestr']!r}); the CUDA array interface cannot say bfloat16, so "
                "bfloat16 device arrays are taken from PyTorch (torch.bfloat16) only; cast "
                "to float16/float32, or pass a torch tensor")
        shape = tuple(int(s) for s in cai["shape"])
        strides = cai.get("strides")
        return Operand(x, kind, shape, dtype, tuple(int(s) for s in strides)
                       if strides is not None else _c_strides(shape, dtype.itemsize))
    if kind == "opencl":
        dtype = np.dtype(x.dtype)
        if x.offset % dtype.itemsize:
            # the kernels address whole elements: the offset would be rounded down
            raise InvalidValueError(
                f"{name}: a pyopencl array at byte offset {x.offset}, which is not a "
                f"multiple of its {dtype.itemsize}-byte elements; tilegemm reads and writes "
                "whole elements from a buffer's start (copy it with x.copy())")
        return Operand(x, kind, tuple(int(s) for s in x.shape), dtype,
                       tuple(int(s) for s in x.strides))
    if type(x).__module__.startswith("pyopencl"):
        raise InvalidTypeError(
            f"{name}: a {type(x).__module__}.{type(x).__name__} is not an array; pass a "
            "pyopencl.array.Array (for a buffer: pyopencl.array.Array(queue, shape, dtype, "
            "data=buffer))")
    # Subclasses whose meaning a plain product would change are refused; any other
    # ndarray subclass is computed on its data and the result is a plain ndarray.
    if isinstance(x, np.matrix):
        raise InvalidTypeError(
            f"{name}: np.matrix is not supported (its operators and shapes differ "
            "from ndarray's); pass np.asarray(x)")
    if _is_masked(x):
        raise InvalidTypeError(
            f"{name}: masked arrays are not supported (the mask would be ignored); "
            "pass x.filled(0) or the unmasked data")
    if hasattr(x, "__dask_graph__") and hasattr(x, "chunks"):
        # np.asarray would compute the whole lazy array in memory, here, at once
        raise InvalidTypeError(
            f"{name}: a Dask array; use tilegemm.dask.matmul(a, b), which multiplies it "
            "block by block with tilegemm and stays lazy (or pass x.compute())")
    if getattr(type(x), "__array_ufunc__", _NDARRAY_UFUNC) is not _NDARRAY_UFUNC:
        # np.matmul hands such an object to its class (an ndarray subclass or a duck array:
        # an astropy Quantity multiplies its units; __array_ufunc__ = None refuses):
        # computed on the bare data, the result would silently lose what the class adds,
        # or exist where NumPy refuses it
        raise InvalidTypeError(
            f"{name}: {type(x).__name__} defines its own __array_ufunc__, so np.matmul "
            "follows its class's rules for it (units, for example), which tilegemm cannot "
            "apply; pass np.asarray(x) to multiply the plain numbers")
    if not isinstance(x, np.ndarray):
        # The object's own errors (from __array__, say) reach the caller unchanged, as
        # they do from np.matmul.
        x = np.asarray(x)
    return Operand(x, kind, x.shape, x.dtype)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-ordered array of ``shape``."""
    strides = []
    step = itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def check_dtype(dtype: np.dtype, what: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.name not in SUPPORTED_DTYPES:
        raise InvalidTypeError(
            f"{what}: unsupported dtype {dtype.name}; supported dtypes are "
            f"{', '.join(SUPPORTED_DTYPES)}"
        )
    return dtype


def compute_dtype(result: np.dtype, what: str = "matmul") -> np.dtype:
    """The kernel dtype that computes NumPy's result dtype ``result`` exactly (see
    :data:`COMPUTED_AS`), or a TypeError listing the result dtypes tilegemm computes."""
    result = np.dtype(result)
    if not result.isnative:
        raise InvalidTypeError(
            f"{what}: dtype {result.str!r} has a non-native byte order; as for np.matmul, "
            f"give the type alone ({result.name}) and convert the result afterwards if "
            "another byte order is needed")
    name = COMPUTED_AS.get(result.name)
    kinds = {"V": "structured or raw bytes", "S": "strings", "U": "strings",
             "M": "dates", "m": "time spans"}
    if name is None and result.kind in kinds:
        raise InvalidTypeError(
            f"{what}: dtype {result} ({kinds[result.kind]}) has no matrix product (np.matmul "
            "refuses it too); multiply a numeric field, or a view of the numbers")
    if name is None:
        raise InvalidTypeError(
            f"{what}: the result dtype would be {result.name}, which tilegemm does not "
            f"compute; supported result dtypes are {', '.join(RESULT_DTYPES)} (complex, long "
            "double and object arrays are left to NumPy)")
    return np.dtype(name)


def to_result(x: np.ndarray, result: np.dtype) -> np.ndarray:
    """A computed host array as NumPy's result dtype (wrapping casts, bool as != 0)."""
    result = np.dtype(result)
    if x.dtype == result:
        # Equal but possibly another C type of the same size (longlong vs long): a view
        # gives the exact type NumPy would return, without a copy.
        return x if x.dtype.char == result.char else x.view(result)
    if result.kind == "b":
        return x != 0
    return x.astype(result)


# Where tilegemm's own source files are: frames from these files are skipped when a warning
# names the line that called tilegemm.


def _warn_at_caller(err_type: str, flag: int) -> None:
    """``np.errstate``'s callback (see :func:`fp_warnings_at_caller`): NumPy's warning for
    a floating-point error in a conversion, issued at the first line outside tilegemm."""
    warnings.warn(f"{err_type} encountered in cast", RuntimeWarning,
                  stacklevel=user_stacklevel())


def fp_warnings_at_caller() -> contextlib.AbstractContextManager[Any]:
    """A context in which NumPy's floating-point warnings name the caller's line.

    The conversions a call makes on the host (a float32 sum rounded to a float16 result,
    a result copied into a narrower ``out``, operands or ``c`` converted to the type a rung
    computes in) can overflow. NumPy's own warnings name the line that called NumPy;
    inside this context the warning, with NumPy's text for a conversion ("overflow
    encountered in cast"), names the line that called tilegemm rather than a line inside
    tilegemm. Only the error kinds that ``np.errstate`` sets to "warn" are redirected:
    "ignore", "raise", "print" and the caller's own "call" or "log" handlers behave as
    NumPy makes them.
    """
    modes = np.geterr()
    redirected = {kind: "call" for kind, mode in modes.items() if mode == "warn"}
    if not redirected or any(mode in ("call", "log") for mode in modes.values()):
        return contextlib.nullcontext()
    return np.errstate(call=_warn_at_caller, **redirected)


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
    # NumPy's result dtype when it is not the dtype the kernel computes in (``dtype``):
    # float16, bool, narrow or unsigned integers; None when they are the same.
    result_dtype: np.dtype | None = None
    # The dtype the kernel writes C in when it is not ``dtype``: float32 from float16 or
    # bfloat16 operands on tensor cores (``dtype=np.float32``); None otherwise.
    c_dtype: np.dtype | None = None
    # NumPy's result type of the operands themselves, before ``dtype=`` overrides it (a
    # tensor-core backend takes float16/bfloat16 operands as they are); None: ``out_dtype``.
    operand_dtype: np.dtype | None = None

    @property
    def store_dtype(self) -> np.dtype:
        """The dtype of the array the kernel writes (``dtype`` unless ``c_dtype``)."""
        return self.dtype if self.c_dtype is None else np.dtype(self.c_dtype)

    @property
    def out_dtype(self) -> np.dtype:
        """The dtype of the array the caller gets (NumPy's result dtype, or ``dtype=``)."""
        return self.store_dtype if self.result_dtype is None else np.dtype(self.result_dtype)

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

    def operand_elements(self, which: str) -> int:
        """Elements of operand ``which`` ("a" or "b") as the kernels read it, (batch or 1,
        rows, cols): what a copy of it takes, a broadcast batch materialised."""
        rows, cols = (self.m, self.k) if which == "a" else (self.k, self.n)
        return (1 if self.batch_mode(which) == "single" else self.batch) * rows * cols

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


# NumPy numbers the dtypes it defines below this; dtypes other packages register (ml_dtypes'
# bfloat16 and float8 types) come at or after it, whatever kind letter they report.
_USER_DTYPES = 256


def numpy_matmul_dtype(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The dtype ``np.matmul`` returns for host operands of dtypes ``a`` and ``b``, for the
    dtypes where that is not ``np.result_type``'s answer: those that NumPy does not define
    itself (most report kind "V", float8_e5m2 kind "f"), such as ml_dtypes' bfloat16, whose
    matmul computes in float32 and returns float32 (``result_type`` says bfloat16). None for
    NumPy's own dtypes (the two agree) and where NumPy's matmul has no loop for the pair."""
    if a.num < _USER_DTYPES and b.num < _USER_DTYPES:
        return None
    try:
        return np.matmul(np.zeros((1, 1), a), np.zeros((1, 1), b)).dtype
    except TypeError:
        return None


def make_problem(
    a: Operand, b: Operand, *, trans_a: bool = False, trans_b: bool = False,
    dtype: Any = None,
) -> GemmProblem:
    """Apply NumPy's matmul rules to two operands (after optional transposes).

    ``dtype`` is NumPy's ``matmul(..., dtype=)``: the result dtype, the operands being cast
    to it under the ``same_kind`` rule (float16/bfloat16 operands with ``dtype=np.float32``
    keep running on tensor cores where a backend has them, writing float32 directly).
    """
    for flag, name in ((trans_a, "trans_a"), (trans_b, "trans_b")):
        if not isinstance(flag, (bool, np.bool_)):
            raise InvalidTypeError(f"gemm: {name} must be True or False, got {flag!r}")
    for op, name in ((a, "a"), (b, "b")):
        if len(op.shape) == 0:
            raise InvalidValueError(
                f"matmul: input operand {name} is 0-d (shape ()); matmul needs arrays of at "
                "least 1 dimension (use * for scalars)"
            )
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
    # Dtypes after shapes, as NumPy checks them: a shape error is a ValueError whatever the
    # dtypes. Any pair whose result dtype is computed is converted once on the way in.
    numpy_rule = (numpy_matmul_dtype(a.dtype, b.dtype)
                  if a.kind == "host" and b.kind == "host" else None)
    try:
        natural = result = np.result_type(a.dtype, b.dtype)
    except TypeError as e:  # e.g. bfloat16 with float16 or int32: no common dtype
        if numpy_rule is None:
            raise InvalidTypeError(
                f"matmul: operands of dtypes {a.dtype.name} and {b.dtype.name} have no common "
                f"dtype ({e}); cast one of them") from None
        natural = result = numpy_rule
    if dtype is None and numpy_rule is not None and numpy_rule != result:
        dtype = numpy_rule  # as if asked for: bfloat16 operands, a float32 result
    if dtype is not None:
        try:
            result = np.dtype(dtype)
        except TypeError as e:
            raise InvalidTypeError(f"matmul: dtype={dtype!r} is not a NumPy dtype") from e
        for op, i in ((a, 0), (b, 1)):
            if not np.can_cast(op.dtype, result, "same_kind"):
                raise InvalidTypeError(
                    f"Cannot cast ufunc 'matmul' input {i} from dtype('{op.dtype.name}') to "
                    f"dtype('{result.name}') with casting rule 'same_kind'")
    compute = compute_dtype(result)
    nd = len(batch_shape)
    pad = lambda s: (1,) * (nd - len(s)) + s  # noqa: E731
    return GemmProblem(
        m=m, n=n, k=ka, dtype=compute,
        result_dtype=None if result == compute and result.char == compute.char else result,
        operand_dtype=natural if natural != result else None,
        batch_shape=batch_shape,
        a_batch_shape=pad(a_lead), b_batch_shape=pad(b_lead),
        squeeze_m=squeeze_m, squeeze_n=squeeze_n, trans_a=trans_a, trans_b=trans_b,
    )


def _operand_view(x: np.ndarray, prob: GemmProblem, which: str) -> np.ndarray:
    """The operand as a (batch or 1, rows, cols) view of the caller's array, no copy:
    1-D promotion, gemm's transpose flags and the batch mode applied (a partial broadcast
    is a broadcast view)."""
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
        return x2.reshape(1, rows, cols)
    if mode == "full":
        return x2.reshape(prob.batch, rows, cols)
    return np.broadcast_to(x2, prob.batch_shape + (rows, cols)).reshape(prob.batch, rows, cols)


def rounded_to_result(x: Any, prob: GemmProblem) -> Any:
    """Host data as NumPy multiplies it for ``prob``: cast to the result dtype first.

    NumPy casts matmul's operands (and tilegemm's ``c``) to the result dtype before
    multiplying. Where that dtype is a float narrower than the one a kernel computes in
    (float16 or bfloat16, computed in float32), converting straight to float32 would keep
    digits NumPy rounds away (``matmul(float32, float32, dtype=float16)``), so the values
    are rounded through the result dtype here. Integer results need nothing: their
    wrapping casts commute with the products (modular arithmetic).
    """
    result = prob.result_dtype
    if (result is None or prob.dtype.kind != "f" or result.itemsize >= prob.dtype.itemsize
            or np.asarray(x).dtype == result):
        return x
    return np.asarray(x).astype(result)


def _read_only(x: np.ndarray) -> np.ndarray:
    view = x.view()
    view.flags.writeable = False
    return view


class StackedRows(NamedTuple):
    """A batch times one matrix as one product of the batch's rows (:func:`stacked_rows`)."""

    a: np.ndarray  # (batch·M, K): a view of the caller's A
    b: Any  # the caller's B, 2-D (or 1-D): a view of one given with leading 1s
    c: Any  # gemm's c as the stacked product reads it (a view, or the caller's), or None
    out: Any  # a (batch·M, N) view of the caller's out, or None
    shape: tuple[int, ...]  # the caller's result shape
    batch: int  # products in the batch


def stacked_rows(a: Any, b: Any, c: Any = None, out: Any = None, trans_a: Any = False,
                 trans_b: Any = False) -> StackedRows | None:
    """``a @ op(b)`` for a batch ``a`` of shape (..., M, K) and one matrix ``op(b)`` (2-D,
    with leading dimensions of 1, or a 1-D vector) as one product: A's rows stacked,
    (batch·M, K) @ op(b), a view of A when A is C-ordered. Each row of the result is the
    same dot products either way, and one tall product keeps B's tiles in cache across the
    batch and gives the threads whole tiles of rows, where a batch of short products streams
    B once per product: float32 (8, 32, 1024) @ (1024, 1024) took 3.1 ms as a batch and 2.0
    stacked, 64 vectors (64, 1, 1024) through the same matrix 4.8 and 0.63 (NumPy, which
    runs such a batch product by product, 3.6 and 4.3; Intel Xeon family 6 model 207, 2
    vCPUs). On a GPU a batch of products of a few rows fills a few rows of each tile of C;
    stacked, the tiles are full (not yet timed on a GPU).

    Taken for NumPy arrays (not subclasses, which keep the full path's wrapping), and CUDA
    arrays (numba, CuPy, PyTorch) with ``b`` of the same type, with A C-ordered and not
    transposed, every side non-zero, K matching, ``out`` None or a C-ordered array of the
    result's shape (written through a view) and gemm's ``c`` None, C-ordered with the
    result's shape, or (NumPy arrays) a row or scalar that broadcasts along every row (a
    bias); None for anything else, which the batched path computes (and checks: a mismatch
    is reported with the caller's shapes)."""
    host = type(a) is np.ndarray
    if type(b) is not type(a) or trans_a is not False or trans_b not in (False, True):
        return None
    if host:  # the checks every batched call of NumPy arrays makes first, cheaply
        if (b.ndim > 2 and b.size != b.shape[-1] * b.shape[-2]) or not a.flags.c_contiguous:
            return None
        a_shape, b_shape = a.shape, b.shape
    elif array_kind(a) == "cuda":
        a_shape, b_shape = tuple(int(x) for x in a.shape), tuple(int(x) for x in b.shape)
    else:
        return None
    if (len(a_shape) < 3 or (len(b_shape) == 1 and trans_b) or 0 in a_shape
            or 0 in b_shape or math.prod(b_shape[:-2]) != 1
            or (not host and not _c_ordered(a))):
        return None
    # B given with leading dimensions of 1, (1, K, N): the same matrix for every product,
    # whose extra leading dimensions the result takes (NumPy's broadcast)
    lead = (1,) * (len(b_shape) - len(a_shape))
    if len(b_shape) > 2:
        b_shape = b_shape[-2:]
        b = b.reshape(b_shape)
    k, n = (b_shape[::-1] if trans_b else b_shape) if len(b_shape) == 2 else (b_shape[0], None)
    if a_shape[-1] != k:
        return None
    shape = lead + a_shape[:-1] + (() if n is None else (n,))
    rows = (math.prod(a_shape[:-1]),) + (() if n is None else (n,))
    stacked_out = None
    if out is not None:
        if type(out) is not type(a) or tuple(out.shape) != shape or not _c_ordered(out):
            return None
        stacked_out = out.reshape(rows)
    if c is out and c is not None:
        c = stacked_out  # out=c: one view, written in place
    elif c is not None:
        if type(c) is not type(a):
            return None
        if tuple(c.shape) == shape and _c_ordered(c):
            c = c.reshape(rows)
        elif not (host and c.ndim <= 2 and math.prod(c.shape[:-1]) == 1
                  and (c.size == 1 or (n is not None and c.shape[-1] == n))):
            return None  # varies along the batch's rows (or does not fit): not a bias
    return StackedRows(a.reshape(rows[:1] + (k,)), b, c, stacked_out, shape,
                       math.prod(a_shape[:-2]))


def _c_ordered(x: Any) -> bool:
    """Whether a NumPy or CUDA array is C-ordered (a CUDA array's byte strides as
    :func:`describe` reads them)."""
    if type(x) is np.ndarray:
        return x.flags.c_contiguous
    op = describe(x, "a")
    return op.strides is not None and all(
        size == 1 or stride == c for size, stride, c in
        zip(op.shape, op.strides, _c_strides(op.shape, op.dtype.itemsize)))


def host_operand_3d(x: np.ndarray, prob: GemmProblem, which: str) -> np.ndarray:
    """A host operand as a C-contiguous (batch or 1, rows, cols) array of the problem dtype.

    Copies only when needed (a dtype change, a transpose, a partial broadcast or a
    non-contiguous layout); the caller's array is never written. The result is always a
    read-only view: kernels never write operands, and one array type (read-only, where a
    caller's read-only array would otherwise differ from a writeable copy) means a Numba
    rung compiles once per dtype, not once per mix of read-only and writeable inputs.
    """
    return _read_only(np.ascontiguousarray(
        _operand_view(rounded_to_result(x, prob), prob, which), dtype=prob.dtype))


def host_operand_stored(x: np.ndarray, prob: GemmProblem, which: str, *,
                        plain_rows_apart: bool = True) -> tuple[np.ndarray, bool]:
    """``(array, transposed)`` for a rung that packs transposed operands itself and reads
    each operand's row stride from its storage (the blocked CPU rung): an operand that is
    the transpose of a C-ordered array of the problem dtype in its last two axes (a
    Fortran-ordered matrix, ``x.T``) comes back as that C-ordered (batch or 1, cols, rows)
    storage, uncopied and read-only, with ``transposed`` True.

    An operand (or the transpose of one) whose rows lie evenly spaced and apart, each row's
    elements contiguous (a slice of columns, ``w[:, :n]``, which NumPy's BLAS reads in
    place with a leading dimension), comes back uncopied too, as :func:`row_stride_view`
    gives it; with ``plain_rows_apart`` False, only as the transpose of one (the rung
    takes K from the operands' stored widths when B is given transposed, so a plain A
    must then be dense). Copying it instead cost 3-10× NumPy's time for products of a few
    rows (12×4096×4096 float32 with B = ``big[:, :4096]``: 22 ms against NumPy's 6.7;
    Intel Xeon). Any other operand as :func:`host_operand_3d` gives it, with False."""
    x3 = _operand_view(rounded_to_result(x, prob), prob, which)
    stored, transposed = _in_place(x3, prob, plain_rows_apart)
    if stored is None:
        return _read_only(np.ascontiguousarray(x3, dtype=prob.dtype)), False
    return stored, transposed


def _in_place(x3: np.ndarray, prob: GemmProblem, plain_rows_apart: bool
              ) -> tuple[np.ndarray | None, bool]:
    """(read-only storage, transposed) of an operand the blocked rung reads where it lies,
    or (None, False) for one it gets a copy of (see :func:`host_operand_stored`)."""
    if x3.dtype != prob.dtype:
        return None, False
    if x3.flags.c_contiguous:
        return _read_only(x3), False
    stored = np.swapaxes(x3, 1, 2)
    if stored.flags.c_contiguous:  # the transpose of a C-ordered array
        return _read_only(stored), True
    wide = row_stride_view(x3) if plain_rows_apart else None
    if wide is not None:
        return wide, False
    wide = row_stride_view(stored)
    return (wide, True) if wide is not None else (None, False)


def row_stride_view(x3: np.ndarray) -> np.ndarray | None:
    """A (batch, rows, cols) array whose rows lie ``ld`` elements apart (``ld`` > cols),
    each row's elements contiguous, and whose matrices follow one another ``rows * ld``
    elements apart, as the read-only C-contiguous (batch, rows, ld) array over the same
    memory, or None for any other layout. The blocked rung reads row i of the operand at
    ``i * ld`` (``ld`` from this view's shape) and takes the operand's own width from the
    other operand or the result. A single column is None too: a copy of it costs little,
    and the vector paths read it as one contiguous vector.

    The view's last row reaches ``ld - cols`` elements past the operand's last element,
    possibly past the end of the caller's buffer: nothing may read that part (no copy or
    reduction of the whole view); the rung reads only the operand's own columns.
    """
    batch, rows, cols = x3.shape
    item = x3.itemsize
    sb, sr, sc = x3.strides
    if cols < 2 or rows < 2 or sc != item or sr % item or sr <= cols * item:
        return None
    if batch > 1 and sb != rows * sr:
        return None
    return np.lib.stride_tricks.as_strided(x3, shape=(batch, rows, sr // item),
                                           strides=(rows * sr, sr, item), writeable=False)


def stored_transposed(x: Any, prob: GemmProblem, which: str) -> bool:
    """Whether :func:`host_operand_stored` hands this host operand over as its transpose
    (the rung's path can depend on it; ``tilegemm.plan`` asks). Copies nothing, except a
    float operand rounded to a narrower result dtype, which is never handed over so."""
    if not isinstance(x, np.ndarray):
        return False
    return _in_place(_operand_view(rounded_to_result(x, prob), prob, which), prob, True)[1]


def check_out(out: Any, prob: GemmProblem, kind: str) -> bool:
    """Refuse an ``out`` array that cannot hold the result, before anything runs.

    Host ``out`` follows NumPy: any strides, a dtype the result casts to under
    ``same_kind``, extra leading dimensions the result broadcasts to. Returns True when the
    backend can write into ``out`` directly (C-contiguous, the computed dtype, the result's
    shape); otherwise the result is computed into a temporary and copied into ``out``.
    Device ``out`` arrays must be dense and match the result's shape and dtype exactly.
    """
    from tilegemm.errors import output_casting_error

    if kind == "host" and array_kind(out) == "host" and not isinstance(out, np.ndarray):
        raise InvalidTypeError(f"out: must be a numpy.ndarray, got {type(out).__name__}")
    op = describe(out, "out")
    if op.kind != kind:  # the kind of array is its type: a TypeError, as NumPy's for out
        raise InvalidTypeError(
            f"out: a {op.kind} array cannot receive a result computed on {kind} data")
    if kind != "host":
        if op.shape != prob.out_shape:
            raise InvalidValueError(
                f"out: has shape {op.shape}, the result has shape {prob.out_shape}")
        if op.dtype != prob.out_dtype:  # a TypeError, as NumPy's refusal of a cast to out
            raise InvalidTypeError(f"out: has dtype {op.dtype.name}, the result has dtype "
                                   f"{prob.out_dtype.name} (device out arrays are not cast)")
        return True
    core = prob.out_shape[len(prob.batch_shape):]
    if len(op.shape) < len(core) or tuple(op.shape[len(op.shape) - len(core):]) != core:
        raise InvalidValueError(
            f"matmul: Output operand 0 has a mismatch in its core dimensions: out has shape "
            f"{op.shape}, the result's last {len(core)} dimension(s) are {core}")
    lead = tuple(op.shape[:len(op.shape) - len(core)])
    try:
        fits = tuple(np.broadcast_shapes(prob.batch_shape, lead)) == lead
    except ValueError:
        fits = False
    if not fits:
        shown = lambda s: "(" + ",".join(map(str, s)) + ")"  # noqa: E731
        raise InvalidValueError(
            f"non-broadcastable output operand with shape {shown(op.shape)} doesn't match "
            f"the broadcast shape {shown(prob.out_shape)}")
    if not np.can_cast(prob.out_dtype, op.dtype, "same_kind"):
        raise output_casting_error(prob.out_dtype, op.dtype)
    if not out.flags.writeable:
        raise InvalidValueError("output array is read-only")
    return written_directly(out, prob)


def written_directly(out: Any, prob: GemmProblem) -> bool:
    """Whether a host ``out`` (checked by :func:`check_out`) receives the result as it is
    computed: C-contiguous, the dtype the kernel writes, the result's shape. Any other
    ``out`` gets the result through a temporary."""
    return (isinstance(out, np.ndarray) and out.shape == prob.out_shape
            and out.dtype == prob.store_dtype and prob.result_dtype is None
            and out.flags.c_contiguous)


def problem_for(m: int, n: int, k: int, dtype: np.dtype | str, batch: int = 0) -> GemmProblem:
    """An (M, N, K) product of ``dtype`` described without operands (tuner, benchmarks);
    ``batch`` > 0 makes it a batch of that many products."""
    return GemmProblem(m=m, n=n, k=k, dtype=np.dtype(dtype),
                       batch_shape=(batch,) if batch else (),
                       a_batch_shape=(batch,) if batch else (),
                       b_batch_shape=(batch,) if batch else ())
