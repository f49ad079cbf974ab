"""Repeated host products without re-deciding what an earlier call decided.

A call such as ``matmul(a, b)`` on NumPy matrices spends 50–70 µs in Python before any
arithmetic: describing the operands, NumPy's dtype rules, choosing the backend and the
rung, looking up tuned parameters, checking ``out``. For an 8×8×8 product the kernel takes
1 µs of that; at 256³ (about 0.1 ms of arithmetic on two cores) it is still a third of
the call, and it is paid again on every call of a loop that multiplies the same shapes.

So the full path (:func:`tilegemm.api.gemm`) remembers what it decided for a plain call —
NumPy arrays (not subclasses) of native dtypes NumPy's matmul takes (those of
``problem.COMPUTED_AS``: floats, bfloat16, integers, bool; the same or two different
ones), computed in the dtype the full path computes in: an operand of another dtype is
converted into a C-ordered copy of it on every call, and the result rounded to NumPy's
result dtype where that is another (float16 from float32 sums, int8 from int32, bool
from counts, copied into an ``out`` of that dtype), as the full path converts them — with
default arguments or only ``kernel=``, ``backend=``, rung parameters (integers, ``MR=6``)
and ``dtype=`` named (``dtype=np.int32`` for int8 operands, ``np.float32`` for float16 ones;
not one that rounds float operands, float64 ones to ``np.float32``, which the full path
converts with NumPy's overflow warnings),
on a backend that gives a direct path for host operands (``Backend.host_program``: the CPU,
and OpenCL) — keyed by (the ``kernel`` and ``backend`` strings, the parameters given,
dtype, shape of ``a``, shape of ``b``, storage order of each, ``dtype=`` as given). The next
call with the same key skips straight to the compiled program the full path ran, with the
same output allocation (and NaN poisoning when ``TILEGEMM_POISON`` is set). On OpenCL that program
still copies the operands to the device and the result back on every call, with the
device, kernel and checks of the first call. What qualifies:

- 2-D operands, each C-ordered, or Fortran-ordered (``x.T`` of a C-ordered array), or a
  slice of columns of one (rows evenly apart, ``w[:, :n]``) or its transpose, read in
  place when the rung packs transposed operands itself and reads rows apart, as the full
  path hands them to it (except such a slice as A with B transposed, which the full path
  copies), else (OpenCL) copied C-ordered first, as the full path copies them;
- N-D operands, C-ordered or, where the rung reads them in place, the transpose in their
  last two axes of a C-ordered batch (``np.swapaxes(k, -1, -2)``, ``k.mT``), with the same
  leading (batch) dimensions, or one of them 2-D or a batch of one (every leading
  dimension 1: the same matrix for every product of the other's batch, as the full path
  hands it to the rung);
- one 1-D operand (a vector: ``A @ x``, ``x @ B``), taken as NumPy takes it, a
  row (1, K) on the left or a column (K, 1) on the right whose unit dimension the result
  drops. On the full path a 4096 × 4096 float32 ``A @ x`` took 0.2–0.3 ms longer than the
  same product with x as a (K, 1) matrix, which was remembered (1.6–1.7 ms against 1.4);
- ``out=`` a C-ordered array of exactly the result's shape and dtype that shares no
  memory with ``a`` or ``b`` (written in place, as the full path does); any other ``out``
  takes the full path, which handles strides, casting and overlap.

Anything else (another shape, dtype or layout, any other keyword, an ndarray subclass, a
device array, batches broadcast against each other, (2, 1) with (1, 3)) takes the full
path, which validates everything as before.

``gemm`` calls on NumPy arrays share the table: ``gemm(a, b, c, alpha=, beta=, trans_a=,
trans_b=, out=)`` is the case of ``op(a) @ op(b)``, the transposes taken as views
(:func:`gemm_views`), so ``gemm(x, w, trans_b=True)`` and ``x @ w.T`` are one case. Where
the backend's program applies alpha and beta itself (``Backend.host_alpha_limit``: the
CPU's and OpenCL's), a remembered gemm call runs it with them, its result (new, or ``out``, which
may be ``c``) starting as a copy of ``c``; see :func:`try_remembered_gemm` for what it
takes.
A call naming ``backend="cpu"`` is remembered apart from one that leaves it to ``auto``
(on a machine with a GPU the two decide differently); before, naming it cost the full path
on every call (about 75 µs against 4.5 µs for an 8×8×8 float32 product on the Xeon family
6 model 167). So is a call naming a rung's parameters (``kernel="blocked", MR=6, NR=64``,
as a hand-tuned loop or a tile benchmark does), which took the full path, about 0.2 ms per
call, before.

A batch times one matrix, which the full path runs as one product of the batch's rows
(``problem.stacked_rows``), is remembered as that product's case (:func:`remember_stacked`):
a repeated call runs its program on views of the batch, without stacking again.

A decision is made again when the tuning results it read change (:mod:`tilegemm.remembered`:
when, and how that is noticed); device arrays have their own table
(:mod:`tilegemm.fastpath_device`).

Everything a remembered call needs that does not depend on the operands' data (the result
shape, the 3-D shapes the rung reads, alpha and beta in the dtype) is worked out once, when
the case is remembered: a remembered 8×8×8 call is then a table look-up, a clock read (a
``stat`` now and then), two reads of the environment, an allocation and the compiled call.
Where the program offers one for a product of two C-ordered matrices, or of such a
matrix and a 1-D vector (the CPU rung's ``call_for``: its small products on the calling
thread, and its products of a row or a column on the threads), or for a vector times a
Fortran-ordered matrix (``x @ W.T``, computed as ``W @ x`` on W's storage, as the full path
hands it to the rung), the allocation and the call are one call taking the caller's arrays
as they are (about 1 µs less per small call, one
compiled call; 4-16 µs less per threaded vector product, whose Python runs from L3 after
streaming the matrix).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tilegemm.backends.base import poison_value
from tilegemm.problem import COMPUTED_AS, StackedRows, fp_warnings_at_caller, to_result
from tilegemm.remembered import (
    LIMIT,
    POISON_OFF,
    current,
    enter,
    forget,
    given,
    poison,
    stale,
    table,
)

_KINDS = "fiu"  # what a rung computes in: floats and integers
_NDARRAY = np.ndarray
_dense = np.ascontiguousarray
# The operands' dtypes a remembered call takes, the same or two different ones: native
# floats (bfloat16 included), integers and bool, as NumPy's matmul takes them. The full
# path hands the rung C-ordered copies of those not of the dtype it computes in, and rounds
# the result to NumPy's result dtype where that differs; a remembered call does the same.
# Through the full path such calls took 110-135 µs at 8³, against 2.8 remembered for two
# float64 operands (NumPy: float16 3.7, bfloat16 1.9, int32 with int64 1.5; Intel Xeon
# family 6 model 207).
_OPERANDS = frozenset(np.dtype(name) for name in COMPUTED_AS)
# What a remembered call's ``dtype=`` may be: a scalar type (np.float32), a name or a dtype
# (each a key of its own; anything else takes the full path, which judges it)
_ASKED = (type, str, np.dtype)
_as_strided = np.lib.stride_tricks.as_strided


class _Case(NamedTuple):
    """A remembered decision, with everything the call derives from the case alone."""

    program: Any  # the compiled rung the full path ran
    shape: tuple[int, ...]  # the result's
    a3: tuple[int, ...]  # (batch or 1, rows, cols) of the storage the rung reads
    b3: tuple[int, ...]
    c3: tuple[int, ...]
    ta: bool  # a given as a Fortran-ordered matrix: the rung reads its transpose
    tb: bool
    wa: bool  # a's rows (or its transpose's) lie apart: the rung reads a wider view
    wb: bool
    tr: int  # the rung's transposed-operand flags (0: the plain call)
    # the rung reads C-ordered operands only: those given otherwise are copied first (as
    # the full path copies them for it); then ta, tb, wa, wb and tr are all false
    dense: bool
    dtype: np.dtype  # what the rung computes in
    # operands of another dtype (bit 0: a, bit 1: b), converted into C-ordered copies of
    # ``dtype`` first, as the full path converts them; their layout flags are then false
    cast: int
    narrow: np.dtype | None  # the result's where it is not ``dtype`` (float16, int8, bool)
    one: Any  # alpha and beta in the dtype
    zero: Any
    fill: Any  # what TILEGEMM_POISON fills a fresh result with
    # the program's own call for this product of two C-ordered matrices (or a matrix and a
    # vector) into a new result, ``entry(a, b, blocks)`` (the CPU rung's ``call_for``), or
    # None
    entry: Any
    blocks: Any  # the program's bound parameters, entry's last argument (read once, here)
    # the largest |alpha| the program applies itself, with any finite beta and the result's
    # old values it then reads (gemm's ``c``), as the backend's run does for host operands;
    # 0.0 where it takes only alpha one and beta zero (see Backend.host_alpha_limit)
    scales: float
    largest: float  # the dtype's largest finite number (an int for an integer dtype)


_table: dict[tuple[Any, ...], _Case] = table({})
_refused: set[tuple[Any, ...]] = table(set())  # cases whose backend gave no program to remember


def _layout(x: np.ndarray) -> int:
    """0: C-ordered; 1: the transpose in its last two axes of a C-ordered array (a 2-D
    Fortran-ordered matrix, ``x.T``; ``np.swapaxes(x, -1, -2)`` or ``x.mT`` of a batch);
    2: a 2-D matrix whose rows lie apart, each contiguous (a slice of columns, ``w[:, :n]``);
    3: the transpose of such a matrix; -1: anything else."""
    flags = x.flags
    if flags.c_contiguous:
        return 0
    if x.ndim != 2:
        # a batch given transposed: the CPU rung reads it in place, as a matrix; through
        # the full path each call took about 120 µs (float32 256 × 32³ ``a @ b.mT``: 300 µs
        # against 98 for C-ordered operands, Intel Xeon family 6 model 207)
        return 1 if x.ndim > 2 and x.swapaxes(-1, -2).flags.c_contiguous else -1
    if flags.f_contiguous:
        return 1
    (rows, cols), (s0, s1), item = x.shape, x.strides, x.itemsize
    if s1 == item and cols >= 2 and s0 > cols * item and s0 % item == 0:
        return 2
    if s0 == item and rows >= 2 and s1 > rows * item and s1 % item == 0:
        return 3
    return -1


def _rows_apart(x: np.ndarray) -> np.ndarray:
    """The (1, rows, ld) view the rung reads of a 2-D matrix whose rows lie ``ld`` elements
    apart (``problem.row_stride_view``, without its checks: the layout was checked)."""
    rows, step = x.shape[0], x.strides[0]
    return _as_strided(x, (1, rows, step // x.itemsize), (rows * step, step, x.itemsize),
                       writeable=False)


def _key(a: Any, b: Any, kernel: Any, backend: Any, params: dict[str, Any] | None = None,
         asked: Any = None) -> tuple[Any, ...] | None:
    """The table key of ``a @ b`` with these ``kernel=`` and ``backend=`` arguments, rung
    parameters and ``dtype=`` argument (``asked``: None, or a dtype as given: a type, its
    name or a NumPy dtype), or None when the case can never be remembered."""
    if type(a) is not _NDARRAY or type(b) is not _NDARRAY or not a.ndim or not b.ndim:
        return None
    if type(kernel) is not str or type(backend) is not str:
        return None
    dtype = a.dtype
    if b.dtype is not dtype:
        if dtype not in _OPERANDS or b.dtype not in _OPERANDS:
            return None
        dtype = (dtype, b.dtype)  # two dtypes (see _computed_as)
    named = given(params)
    if named is None or (asked is not None and not isinstance(asked, _ASKED)):
        return None
    return kernel, backend, named, dtype, a.shape, b.shape, _layout(a), _layout(b), asked


def _stored_shape(shape: tuple[int, ...], layout: int) -> tuple[int, ...]:
    """The (batch or 1, rows, cols) shape of the C-ordered storage the rung reads for an
    operand of ``shape``: its own, or for one given transposed (a Fortran-ordered matrix, a
    batch transposed in its last two axes) its storage's (unused for matrices whose rows
    lie apart, layouts 2 and 3: the rung reads a wider view)."""
    batch = 1
    for n in shape[:-2]:
        batch *= n
    if layout & 1:
        return (batch, shape[-1], shape[-2])
    return (batch,) + shape[-2:]


def try_remembered(a: Any, b: Any, out: Any, kernel: Any, backend: Any,
                   params: dict[str, Any] | None = None, asked: Any = None) -> Any:
    """The product ``a @ b`` (written into ``out`` unless None) if an earlier call with the
    same ``kernel=``, ``backend=``, parameters and ``dtype=`` (``asked``) decided this
    case, else None (and nothing written)."""
    key = _key(a, b, kernel, backend, params, asked)
    if key is None:
        return None
    case = _table.get(key)
    if case is None:
        return None
    if stale():
        forget()  # tuning results changed, or moved: decide again
        return None
    return _product(case, a, b, out)


def _product(case: _Case, a: np.ndarray, b: np.ndarray, out: Any) -> Any:
    """``a @ b`` by ``case``'s program: its own call into a new result where it has one
    (and the result is not to be poisoned), else :func:`_run` with alpha one, beta zero."""
    if out is None and case.entry is not None and poison() in POISON_OFF:
        return case.entry(a, b, case.blocks)
    return _run(case, a, b, None, out, case.one, case.zero)


# alpha and beta a remembered gemm call converts itself (anything else: the full path)
_REALS = (float, int, np.float64, np.float32)


def try_remembered_gemm(a: Any, b: Any, c: Any, out: Any, alpha: Any, beta: Any,
                        trans_a: Any, trans_b: Any, kernel: Any, backend: Any,
                        params: dict[str, Any] | None = None, asked: Any = None) -> Any:
    """``alpha * op(a) @ op(b) + beta * c`` (``tilegemm.gemm``; written into ``out`` unless
    None) if an earlier call decided the product ``op(a) @ op(b)`` with the same
    ``kernel=``, ``backend=`` and parameters, and the remembered program computes this
    call as the full path would, else None (nothing written).

    ``op(x)`` is ``x`` or its transpose in the last two axes, a view: the case is
    ``matmul``'s for those views, and the program, alpha and beta, and ``c`` copied into
    the result first (``c`` is read when ``beta != 0``) are what the backend's ``run``
    hands the rung. Taken here: ``c`` None, or an array of the result's dtype whose shape
    broadcasts to the result's (a row of biases, as in ``x @ w + b``);
    alpha and beta Python or NumPy float32/float64 numbers or ints, other than one and
    zero only where the program applies them itself (``scales``), alpha no larger in size
    than it applies directly and beta finite in the dtype (for an integer product: Python
    ints that fit its dtype); anything else (a ``c`` to cast, ``beta != 0`` without ``c``)
    takes the full path, which checks it. Through the full path an 8×8×8 float32 ``gemm``
    took 105-140 µs a call against 2.8 for ``matmul`` (Intel Xeon family 6 model 207)."""
    views = gemm_views(a, b, trans_a, trans_b)
    if views is None or type(alpha) not in _REALS or type(beta) not in _REALS:
        return None
    a, b = views
    key = _key(a, b, kernel, backend, params, asked)
    case = None if key is None else _table.get(key)
    if case is None:
        return None
    if c is not None and (type(c) is not _NDARRAY or c.dtype is not case.dtype or (
            c.shape != case.shape and not _broadcasts(c.shape, case.shape))):
        return None
    plain = alpha == 1 and beta == 0
    if not plain and ((c is None and beta != 0) or not case.scales
                      or (case.dtype.kind != "f" and (type(alpha) is not int
                                                      or type(beta) is not int))
                      or not _within(alpha, case.scales) or not _within(beta, case.largest)):
        return None
    if stale():
        forget()
        return None
    if plain:
        return _product(case, a, b, out)
    t = case.dtype.type
    return _run(case, a, b, c if beta != 0 else None, out, t(alpha), t(beta))


def _broadcasts(given: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether an array of shape ``given`` broadcasts to ``shape`` unchanged (NumPy's rule,
    as ``np.broadcast_shapes(given, shape) == shape``, in a third of its time): gemm's
    ``c`` as a row of biases, say."""
    return len(given) <= len(shape) and all(
        x in (y, 1) for x, y in zip(reversed(given), reversed(shape)))


def _within(x: Any, limit: float) -> bool:
    """``|x| <= limit`` for a number of a type in ``_REALS``, compared exactly (NumPy
    compares a float32 with a Python float in float32, where a large limit overflows)."""
    if type(x) is not int:
        x = float(x)
    return -limit <= x <= limit


def gemm_views(a: Any, b: Any, trans_a: Any, trans_b: Any) -> tuple[Any, Any] | None:
    """``(op(a), op(b))``: NumPy arrays, each as it is or (``trans_a``/``trans_b`` True)
    its transpose in the last two axes, a view; None when the flags are not booleans or
    an operand to transpose is no NumPy array of two or more dimensions."""
    if trans_a is False and trans_b is False:
        return a, b
    views = []
    for x, flag in ((a, trans_a), (b, trans_b)):
        if flag is True:
            if not isinstance(x, _NDARRAY) or x.ndim < 2:
                return None
            x = x.swapaxes(-1, -2)
        elif flag is not False:
            return None
        views.append(x)
    return views[0], views[1]


def _run(case: _Case, a: np.ndarray, b: np.ndarray, c: np.ndarray | None, out: Any,
         alpha: Any, beta: Any) -> Any:
    """Run ``case``'s program for ``a @ b`` into ``out``, or a new result when ``out`` is
    None: the result starts as a copy of ``c`` (broadcast) when given (``out`` may be
    ``c``; read with beta), else is poisoned under TILEGEMM_POISON. A result of another
    dtype than the one computed in (``narrow``) is computed into a new array and converted
    into ``out``, as the full path copies it. None when ``out`` is not one this can write
    (a C-ordered array of the result's shape and dtype, sharing no memory with ``a`` or
    ``b``; the full path handles any other), nothing written then."""
    if out is None:
        dest = np.empty(case.shape, case.dtype)
    elif (type(out) is _NDARRAY
          and out.dtype is (case.dtype if case.narrow is None else case.narrow)
          and out.shape == case.shape and out.flags.c_contiguous and out.flags.writeable
          and not np.may_share_memory(out, a) and not np.may_share_memory(out, b)):
        dest = out if case.narrow is None else np.empty(case.shape, case.dtype)
    else:
        return None
    if c is not None:
        if c is not dest:
            np.copyto(dest, c)
    elif poison() not in POISON_OFF:
        dest.fill(case.fill)
    if case.cast:
        a, b = _converted(a, b, case.cast, case.dtype)
    if case.dense:
        a3, b3 = _dense(a).reshape(case.a3), _dense(b).reshape(case.b3)
    else:
        a3 = (a.swapaxes(-1, -2) if case.ta else a)
        a3 = _rows_apart(a3) if case.wa else a3.reshape(case.a3)
        b3 = (b.swapaxes(-1, -2) if case.tb else b)
        b3 = _rows_apart(b3) if case.wb else b3.reshape(case.b3)
    if case.tr:
        case.program(a3, b3, dest.reshape(case.c3), alpha, beta, case.tr)
    else:
        case.program(a3, b3, dest.reshape(case.c3), alpha, beta)
    if case.narrow is None:
        return dest
    if out is None:
        return _narrowed(dest, case.narrow)
    np.copyto(out, _narrowed(dest, case.narrow))  # (float16 from float32 sums, int8, bool)
    return out


def remember(a: Any, b: Any, make_program: Callable[[], Any], tuning_cache: str | None,
             tuning_mtime: int | None, *, kernel: Any, backend: Any,
             params: dict[str, Any] | None = None,
             alpha_limit: Callable[[Any], float] | None = None,
             computed: np.dtype | None = None, result: np.dtype | None = None,
             asked: Any = None) -> None:
    """Record the program ``make_program()`` gives (the backend's ``host_program``: what
    the full path just ran on host operands in the operands' own dtype) for calls like
    ``matmul(a, b, kernel=kernel, backend=backend, **params)``, and gemm's of the same
    product (``a`` and ``b`` then as :func:`gemm_views` gives them), if this case
    qualifies and the backend has one; ``alpha_limit(program)``: the backend's
    ``host_alpha_limit`` for it (see :class:`_Case`'s ``scales``; None: 0.0);
    ``computed`` and ``result``: the dtype the full path computed in and the result's
    (None: NumPy's result dtype of the operands, for both; see :func:`_computed_as`), for
    the call's ``dtype=`` argument ``asked`` (part of the key). It
    is made only then: a call that can never be remembered pays nothing for it. ``tuning_cache``
    and ``tuning_mtime``: the tuning cache file and its modification time (None: no file)
    as they were before the decision. Decisions remembered under another state of the file
    are dropped: a shape decided before a tuning run must not keep its old program because
    another shape was decided after it."""
    key = _key(a, b, kernel, backend, params, asked)
    if key is None:
        return
    _, _, _, dtype, sa, sb, la, lb, _ = key
    converted = _computed_as(dtype, computed, result)
    if converted is None:
        return
    dtype, cast, narrow = converted
    if cast:  # the converted operands are handed over C-ordered
        la, lb = (0 if cast & 1 else la), (0 if cast & 2 else lb)
    # a vector is a row (1, K) on the left, a column (K, 1) on the right (NumPy's rule);
    # the result loses that dimension
    row, col = len(sa) == 1, len(sb) == 1
    if row and col:
        return  # vector · vector: NumPy returns a scalar, which the full path makes
    sa, sb = (1,) * row + sa, sb + (1,) * col
    if (la < 0 or lb < 0 or sa[-1] != sb[-2] or 0 in sa or 0 in sb
            # batches of other lengths, unless one is a single product (every dimension 1)
            or (sa[:-2] != sb[:-2] and math.prod(sa[:-2]) != 1 and math.prod(sb[:-2]) != 1)
            or (la == 2 and lb & 1)):  # the full path copies that A (host_operand_stored)
        return
    if current(tuning_cache, tuning_mtime) and (key in _table or key in _refused):
        return  # decided under this state already (a call the fast path passed over: gemm)
    enter(tuning_cache, tuning_mtime, _table, _refused)
    program = make_program()
    if program is None:
        # no direct path on this backend: noted, so that later calls do not ask again
        _refused.add(key)
        return
    # a rung the full path hands C-ordered copies of operands given otherwise (OpenCL's)
    dense = bool(la or lb) and not getattr(program, "takes_transposed", False)
    if dense:
        la = lb = 0
    shape = np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1])
    one = dtype.type(1)
    result = shape[:len(shape) - 2] + shape[len(shape) - 2 + row:len(shape) - col]
    ta, tb = bool(la & 1), bool(lb & 1)
    call_for = getattr(program, "call_for", None)
    entry = (None if call_for is None or len(shape) != 2 or dense
             else _entry(call_for, sa, sb, la, lb, row, col, result))
    if entry is not None and (cast or narrow is not None):
        entry = _cast_entry(entry, cast, dtype, narrow)
    _table[key] = _Case(program, result, _stored_shape(sa, la), _stored_shape(sb, lb),
                        _stored_shape(shape, 0), ta, tb, la >= 2, lb >= 2, ta | tb << 1,
                        dense, dtype, cast, narrow, one, one - one, poison_value(dtype),
                        entry, getattr(program, "bound", None),
                        0.0 if alpha_limit is None or narrow else alpha_limit(program),
                        float(np.finfo(dtype).max) if dtype.kind == "f"
                        else int(np.iinfo(dtype).max))


def remember_stacked(a: Any, b: Any, stacked: StackedRows, kernel: Any, backend: Any,
                     params: dict[str, Any] | None = None, asked: Any = None,
                     trans_b: bool = False) -> None:
    """Remember ``a @ op(b)`` (``trans_b``: gemm's), a batch times one matrix that the full
    path ran as the product of its rows (``stacked``, as ``problem.stacked_rows`` gave it),
    as that product's case, if it was remembered: its program reads the same storage (A's
    rows as one (1, batch·M, K) matrix, B as it lies), so a later call of this case runs it
    on views without stacking again; its own call for 2-D operands (``entry``) is not taken.
    Stacking in Python each time cost about 1.6 µs (float64 (3, 8, 8) @ (8, 8): 4.4 µs a
    call remembered as a batch, 6.0-6.4 stacked; Intel Xeon family 6 model 207)."""
    views = gemm_views(a, b, False, trans_b)
    rows = gemm_views(stacked.a, stacked.b, False, trans_b)
    if views is None or rows is None:
        return
    outer = _key(*views, kernel, backend, params, asked)
    inner = _key(*rows, kernel, backend, params, asked)
    case = None if inner is None else _table.get(inner)
    if (case is None or outer is None or outer in _table or len(_table) >= LIMIT
            or outer[6] != 0 or outer[7] != inner[7]):
        return  # not remembered, or another layout of B (a view the case would not read)
    _table[outer] = case._replace(shape=stacked.shape, entry=None)


def _computed_as(dtype: Any, computed: np.dtype | None, result: np.dtype | None
                 ) -> tuple[np.dtype, int, np.dtype | None] | None:
    """(the dtype the rung computes in, the operands converted to it as in :class:`_Case`'s
    ``cast``, the result's dtype where it is another: ``narrow``) for a key's dtype entry
    (one dtype, or the pair of two), the dtype the full path computed in (``computed``)
    and NumPy's result dtype (``result``; None for either: NumPy's result dtype of the
    operands); None when such a case is not remembered (a dtype not in ``_OPERANDS``, a
    byte order not the machine's among them, a computed dtype no rung has, a float
    operand rounded to a narrower computed dtype, ``dtype=np.float32`` with float64
    operands, which the full path converts with NumPy's overflow warnings, or operands
    the full path rounds through a narrower result dtype, float32 ones with
    ``dtype=np.float16``)."""
    da, db = dtype if type(dtype) is tuple else (dtype, dtype)
    if da not in _OPERANDS or db not in _OPERANDS:
        return None
    if computed is None:
        computed = np.result_type(da, db)
    if result is None:
        result = computed
    if computed.kind not in _KINDS or not computed.isnative or any(
            x.kind == "f" and x.itemsize > computed.itemsize for x in (da, db)):
        return None
    if (computed.kind == "f" and result.itemsize < computed.itemsize
            and (da != result or db != result)):
        return None  # rounded through the result dtype first (problem.rounded_to_result)
    # an operand of the computed dtype keeps its own type object (int64 is one of two C
    # types, long and long long: NumPy's result is of the operands')
    computed = da if da == computed else db if db == computed else computed
    narrow = None if result == computed and result.char == computed.char else result
    return computed, (da != computed) | (db != computed) << 1, narrow


def _entry(call_for: Callable[..., Any], sa: tuple[int, ...], sb: tuple[int, ...], la: int,
           lb: int, row: bool, col: bool, result: tuple[int, ...]) -> Callable[..., Any] | None:
    """The program's own call (``call_for``, see :class:`_Case`'s ``entry``) for a product of
    matrices of shapes ``sa`` @ ``sb`` (a 1-D operand already a row or a column: ``row``,
    ``col``) in layouts ``la``, ``lb`` (see :func:`_layout`), or None.

    A row times a Fortran-ordered matrix, ``x @ W.T`` (a linear layer's weights W stored
    (outputs, inputs)), is the rung's column product ``W @ x`` on W's own storage, the
    product the full path hands the rung for it (``_vector_product_swapped`` in the CPU
    rung), so the bits are the same; and ``X.T @ v`` is ``v @ X``. Through the full path's
    Python such a call took 5-6 µs longer than the same product given C-ordered (float32,
    W 256×256: 16.9 µs against 11.3 for ``W @ x``, AMD EPYC Zen 3).
    """
    m, k, n = sa[0], sa[1], sb[1]
    if la in (0, 2) and lb in (0, 2):
        # (a slice of columns is copied for the calls that are worth it, see call_for)
        entry = call_for(m, n, k, dense=not (la or lb))
        if entry is not None and (la or lb):
            entry = _dense_entry(entry)
        if entry is not None and (row or col):
            entry = _vector_entry(entry, row, sa if row else sb, result)
        return entry
    if m == 1 and la == 0 and lb == 1:  # x @ W.T: W @ x
        entry = call_for(n, 1, k)
        return None if entry is None else _swapped_entry(entry, True, k, result)
    if n == 1 and la == 1 and lb == 0:  # X.T @ v: v @ X
        entry = call_for(1, m, k)
        return None if entry is None else _swapped_entry(entry, False, k, result)
    if la in (0, 1) and lb in (0, 1) and not (row or col):
        # Fortran-ordered matrices (or x.T): the call on their storages, where it has one
        tr = la | lb << 1
        entry = call_for(m, n, k, tr=tr)
        return None if entry is None else _transposed_entry(entry, tr)
    return None


def _transposed_entry(call: Callable[..., Any], tr: int) -> Callable[..., Any]:
    """``call`` (the program's call on the C-ordered storages of operands given as their
    transposes, ``tr`` as in :class:`_Case`) for a product of two matrices, one or both of
    them Fortran-ordered: such a matrix is the transpose of its C-ordered storage, ``.T``.
    Through the bound program's Python such a call took 2-3 µs longer than the same product
    given C-ordered (float32 8³, 5.2 µs against 2.8; Intel Xeon family 6 model 207)."""
    if tr == 1:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(a.T, b, 1, blocks)
    elif tr == 2:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(a, b.T, 2, blocks)
    else:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(a.T, b.T, 3, blocks)
    return entry


def _swapped_entry(call: Callable[..., Any], row: bool, k: int,
                   result: tuple[int, ...]) -> Callable[..., Any]:
    """``call`` (the program's call for two C-ordered matrices) for a vector times a
    Fortran-ordered matrix as the other vector product on the matrix's storage: ``a @ b``
    with ``a`` a row (1, K) or 1-D (``row``) and ``b`` = W.T is ``W @ a`` with ``a`` as a
    column; with ``b`` a column (K, 1) or 1-D and ``a`` = X.T it is ``b @ X`` with ``b`` as
    a row. One row and one column hold the same elements in the same order, so the result
    is a reshape (to ``result``, NumPy's shape) of the memory the call returns."""
    if row:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(b.T, a.reshape((k, 1)), blocks).reshape(result)
    else:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(b.reshape((1, k)), a.T, blocks).reshape(result)
    return entry


def _cast_entry(call: Callable[..., Any], cast: int, dtype: np.dtype,
                narrow: np.dtype | None) -> Callable[..., Any]:
    """``call`` (the program's call for operands of ``dtype``) for operands of another
    dtype (``cast`` as in :class:`_Case`, possibly none: int32 operands with
    ``dtype="int8"``), converted first (:func:`_converted`), and the result rounded to
    ``narrow`` where given (see :func:`_narrowed`)."""
    def entry(a: np.ndarray, b: np.ndarray, blocks: Any) -> Any:
        return _narrowed(call(*_converted(a, b, cast, dtype), blocks), narrow)

    return entry


def _converted(a: np.ndarray, b: np.ndarray, cast: int, dtype: np.dtype
               ) -> tuple[np.ndarray, np.ndarray]:
    """``a`` and ``b``, each converted into a C-ordered copy of ``dtype`` where ``cast``
    says (bit 0: a, bit 1: b), as the full path converts them."""
    return (_dense(a, dtype) if cast & 1 else a), (_dense(b, dtype) if cast & 2 else b)


def _narrowed(result: np.ndarray, narrow: np.dtype | None) -> np.ndarray:
    """``result`` as NumPy's result dtype ``narrow`` (None: as it is), rounded or wrapped
    as the full path converts it (``problem.to_result``; bool as != 0), NumPy's overflow
    warning naming the caller's line."""
    if narrow is None:
        return result
    if narrow.kind != "f":  # integers wrap and bool compares: no floating-point error
        return to_result(result, narrow)  # (the context costs 3 µs, as much as an 8³ call)
    with fp_warnings_at_caller():
        return to_result(result, narrow)


def _dense_entry(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (the program's call for two C-ordered matrices) for operands that may be
    slices of columns: those are copied first."""
    def entry(a: np.ndarray, b: np.ndarray, blocks: Any) -> Any:
        return call(_dense(a), _dense(b), blocks)

    return entry


def _vector_entry(call: Callable[..., Any], row: bool, shape: tuple[int, ...],
                  result: tuple[int, ...]) -> Callable[..., Any]:
    """``call`` (the program's call for two C-ordered matrices) for a product with one 1-D
    operand: the vector viewed as the matrix of ``shape`` (a row on the left, a column on
    the right), the result as NumPy shapes it (``result``, that dimension dropped)."""
    if row:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(a.reshape(shape), b, blocks).reshape(result)
    else:
        def entry(a: Any, b: Any, blocks: Any) -> Any:
            return call(a, b.reshape(shape), blocks).reshape(result)
    return entry
