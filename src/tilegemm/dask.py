"""Matrix products of Dask arrays, with a tilegemm rung computing every block.

``tilegemm.dask.matmul(a, b)`` builds the same task graph as ``dask.array.matmul``: one
task per (output block, contraction block) pair that multiplies two chunks, then a tree
reduction (``split_every`` blocks at a time) that adds the partial products along the
contraction axis. Only the block kernel differs: tilegemm instead of NumPy/CuPy. Dask
schedules the tasks; this module adds no scheduler of its own, so the threaded scheduler,
``dask.distributed`` (``LocalCluster``, dask-jobqueue, dask-kubernetes) and dask-cuda's
``LocalCUDACluster`` (one worker per GPU, CuPy chunks) all run it unchanged.

Everything that can be checked from the arrays' metadata is checked when the graph is
built, before any task runs: shapes and dtypes (NumPy's matmul rules), known chunk sizes,
the backend, the rung and its parameters. A mismatched chunking of the contraction axis is
rechunked (the coarser side's chunks win, so partial products stay few), unless
``align=False`` asks for an error instead.

This module needs ``dask[array]`` (and ``distributed`` for clusters): ``pip install -e
".[dask]"`` from a clone of tilegemm. ``import tilegemm`` does not import it.

Every refused call raises a :class:`tilegemm.errors.UsageError` (also the ``ValueError`` or
``TypeError`` NumPy would raise), as :func:`tilegemm.matmul` does, with the same messages:
the backend and rung checks are the API's own.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from functools import partial, reduce
from types import SimpleNamespace
from typing import Any

import dask.array as da
import numpy as np
from dask.array.routines import matmul as _dask_matmul
from dask.array.utils import meta_from_array

from tilegemm.api import (
    AUTO,
    _check_params_are_upper_case,
    _tensor_core_half,
    check_backend_name,
    check_dtype_supported,
    choose_backend,
    choose_kernel,
)
from tilegemm.backends import get_backend
from tilegemm.errors import InvalidTypeError, InvalidValueError
from tilegemm.precision import apply_precision
from tilegemm.problem import Operand, array_kind, make_problem
from tilegemm.registry import ParametersNeedKernel

__all__ = ["matmul", "register", "unregister", "registered"]

# How many distinct block shapes are fully validated (rung limits) before the graph is built.
# Regular chunkings have at most 2 sizes per axis (8 shapes); a ragged one can have many,
# and they only differ in size, which the rungs' limits do not depend on beyond the first.
_MAX_SHAPES_CHECKED = 64


def matmul(
    a: Any, b: Any, *, kernel: str = AUTO, backend: str = AUTO, precision: str | None = None,
    dtype: Any = None, align: bool = True, split_every: int | None = None,
    threads: int | None = 1, **params: Any,
) -> da.Array:
    """``a @ b`` for Dask arrays (NumPy ``matmul`` semantics), each block by tilegemm.

    - ``a``, ``b``: Dask arrays with NumPy or CuPy chunks (a NumPy array is wrapped as a
      single-chunk Dask array). 1-D operands are promoted as in NumPy and leading (batch)
      dimensions broadcast.
    - ``kernel``, ``backend``, ``precision`` and the UPPER-CASE rung ``params`` (``TILE=16``)
      are passed to :func:`tilegemm.matmul` for every block, on whichever worker runs it.
    - ``dtype``: NumPy's ``matmul(..., dtype=)``, the result dtype (``np.float32`` for
      float16 operands keeps the tensor cores' float32 sums).
    - ``align``: when the chunks of ``a``'s last axis and ``b``'s contraction axis differ,
      rechunk the side with more chunks to the other's (True, the default) or raise
      :class:`~tilegemm.errors.InvalidValueError` (False).
    - ``split_every``: how many partial products each reduction task adds (Dask's default
      when None).
    - ``threads``: how many threads a CPU block kernel may use (1 by default; None: Numba's
      thread count). Dask already runs one block per worker thread, so a block kernel that
      also spreads over every core oversubscribes the machine (each core then juggles several
      spinning threads); dask.distributed sets ``OMP_NUM_THREADS=1`` in its workers for the
      same reason. Raise it when there are fewer blocks in flight than cores, e.g. one worker
      with one thread on a many-core machine.

    Returns a lazy Dask array; nothing runs until it is computed. Raises before building
    any task when shapes, dtypes, chunk sizes, the backend, the rung or its parameters are
    wrong.
    """
    _check_params_are_upper_case(params)
    _check_count(threads, "threads", 1)
    _check_count(split_every, "split_every", 2)
    a = _as_dask(a, "a")
    b = _as_dask(b, "b")
    # The contraction axis must be known to pair blocks; rows of a and columns of b need
    # not be (a boolean-mask selection, say): their blocks are multiplied as they come.
    _check_known_chunks(a, "a", _paired_axes(a, "a"))
    _check_known_chunks(b, "b", _paired_axes(b, "b"))
    # NumPy's rules on the whole shapes: 0-d, K mismatch, batch broadcast, dtypes.
    prob = make_problem(Operand(None, array_kind(a._meta), a.shape, a.dtype),
                        Operand(None, array_kind(b._meta), b.shape, b.dtype), dtype=dtype)
    # Partial products are kept and added in the dtype the kernel computes in (float32 for
    # float16/bfloat16, int32/int64 for bool and narrow or unsigned integers) and cast to
    # NumPy's result dtype once at the end: float16 partial sums would round at every
    # addition, where NumPy rounds the float32 sum once. Integers wrap the same either way.
    acc_dtype, out_dtype = prob.dtype, prob.out_dtype
    block_dtype = None if acc_dtype == out_dtype and dtype is None else acc_dtype

    a_is_1d, b_is_1d = a.ndim == 1, b.ndim == 1
    if a_is_1d:
        a = a[np.newaxis, :]
    if b_is_1d:
        b = b[:, np.newaxis]
    if a.ndim < b.ndim:
        a = a[(b.ndim - a.ndim) * (np.newaxis,)]
    elif a.ndim > b.ndim:
        b = b[(a.ndim - b.ndim) * (np.newaxis,)]
    a, b = _align(a, b, align)
    _check_blocks(a, b, block_dtype, kernel, backend, precision, params)

    nd = a.ndim
    out_ind = tuple(range(nd + 1))
    lhs_ind = tuple(range(nd))
    rhs_ind = tuple(range(nd - 2)) + (lhs_ind[-1], nd)
    block = partial(_block_product, kernel=kernel, backend=backend, dtype=acc_dtype.str,
                    block_dtype=block_dtype, precision=precision, params=params,
                    threads=threads)
    out = da.blockwise(
        block, out_ind, a, lhs_ind, b, rhs_ind,
        adjust_chunks={lhs_ind[-1]: 1}, dtype=acc_dtype, concatenate=False,
        name="tilegemm-matmul-" + da.core.tokenize(a, b, kernel, backend, precision, acc_dtype,
                                                   params, threads),
        meta=meta_from_array(a._meta, ndim=nd + 1, dtype=acc_dtype),
    )
    # Tree reduction over the contraction axis (kept as an axis of 1-wide blocks above).
    if out.shape[-2] == 1:
        out = out.squeeze(-2)
    else:
        out = da.reduction(out, _add_partials, _add_partials, axis=-2, dtype=acc_dtype,
                           concatenate=False, split_every=split_every,
                           name="tilegemm-matmul-sum")
    if out_dtype != acc_dtype:
        out = out.astype(out_dtype)
    if a_is_1d:
        out = out.squeeze(-2)
    if b_is_1d:
        out = out.squeeze(-1)
    return out


def _check_count(value: Any, name: str, least: int) -> None:
    """``value`` is None or an int (NumPy's too) of at least ``least``."""
    if value is None:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"tilegemm.dask.matmul: {name} must be an int or None, got "
                               f"{value!r}")
    if value < least:
        raise InvalidValueError(f"tilegemm.dask.matmul: {name} must be at least {least} or "
                                f"None, got {value!r}")


def _as_dask(x: Any, name: str) -> da.Array:
    if isinstance(x, da.Array):
        if isinstance(x._meta, np.ma.MaskedArray):  # refused now, not when computed
            raise InvalidTypeError(
                f"tilegemm.dask.matmul: {name} has masked chunks (the mask would be "
                "ignored); use Dask's own a @ b, or x.map_blocks(np.ma.filled, 0)")
        return x
    if isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__"):
        return da.from_array(x, chunks=x.shape or ())
    raise InvalidTypeError(f"tilegemm.dask.matmul: {name} must be a Dask array (or a "
                           f"NumPy/CuPy array, taken as one chunk), got {type(x).__name__}")


def _paired_axes(x: da.Array, side: str) -> list[int]:
    """The axes of operand ``side`` ("a" or "b") whose blocks are paired with the other
    operand's: the batch axes and the contraction axis (not a's rows or b's columns)."""
    if x.ndim <= 1:
        return list(range(x.ndim))  # 0-d: none (refused as 0-d later)
    batch = list(range(x.ndim - 2))
    return batch + [x.ndim - 1 if side == "a" else x.ndim - 2]


def _check_known_chunks(x: da.Array, name: str, axes: Any) -> None:
    """Refuse unknown chunk sizes (NaN) on ``axes`` of ``x``: the contraction and batch
    axes, whose blocks must be paired."""
    if any(np.isnan(c) for i in axes for c in x.chunks[i]):
        raise InvalidValueError(f"tilegemm.dask.matmul: {name} has unknown chunk sizes "
                                f"on its contraction or batch axes (shape {x.shape}); call "
                                f"{name}.compute_chunk_sizes() first")


def _align(a: da.Array, b: da.Array, align: bool) -> tuple[da.Array, da.Array]:
    """Give the contraction axis and the batch axes the same chunks on both sides."""
    nd = a.ndim
    a_chunks = {i: a.chunks[i] for i in range(nd - 2)}
    b_chunks = {i: b.chunks[i] for i in range(nd - 2)}
    a_new: dict[int, tuple[int, ...]] = {}
    b_new: dict[int, tuple[int, ...]] = {}
    # Batch axes: an axis of length 1 on one side broadcasts (any chunking); else they match.
    for i in range(nd - 2):
        if a.shape[i] == 1 or b.shape[i] == 1 or a_chunks[i] == b_chunks[i]:
            continue
        if not align:
            raise InvalidValueError(
                f"tilegemm.dask.matmul: batch axis {i} is chunked {a_chunks[i]} in a but "
                f"{b_chunks[i]} in b (pass align=True to rechunk)")
        if len(a_chunks[i]) <= len(b_chunks[i]):
            b_new[i] = a_chunks[i]
        else:
            a_new[i] = b_chunks[i]
    ka, kb = a.chunks[-1], b.chunks[-2]
    if ka != kb:
        if not align:
            raise InvalidValueError(
                f"tilegemm.dask.matmul: the contraction axis is chunked {ka} in a but {kb} "
                "in b; rechunk one to match, or pass align=True")
        if len(ka) <= len(kb):
            b_new[nd - 2] = ka
        else:
            a_new[nd - 1] = kb
    if a_new:
        a = a.rechunk(a_new)
    if b_new:
        b = b.rechunk(b_new)
    return a, b


def _check_blocks(a: da.Array, b: da.Array, block_dtype: np.dtype | None, kernel: str,
                  backend: str, precision: str | None, params: dict[str, Any]) -> None:
    """Validate every distinct block product before any task exists, as
    :func:`tilegemm.matmul` would on a worker.

    Shapes and dtypes of each chunk pair go through tilegemm's own rules; the backend,
    precision, rung and parameters are resolved too when the backend is usable in this
    process (a client without the workers' GPU still checks the names, the precision and the
    parameters' spelling and values).
    """
    check_backend_name(backend)
    if kernel == AUTO and params:
        raise ParametersNeedKernel(params)
    kind = array_kind(a._meta)
    nd = a.ndim
    sizes = [sorted(set(a.chunks[i]) | set(b.chunks[i])) for i in range(nd - 2)]

    def known(chunks: tuple[float, ...]) -> list[int]:  # unknown rows/columns: checked as 1
        return sorted({1 if np.isnan(c) else int(c) for c in chunks})

    shapes = itertools.product(*sizes, known(a.chunks[-2]), sorted(set(a.chunks[-1])),
                               known(b.chunks[-1]))
    local = backend == AUTO or get_backend(backend).status().usable
    for shape in itertools.islice(shapes, _MAX_SHAPES_CHECKED):
        *batch, m, k, n = shape
        a_shape = tuple(1 if a.shape[i] == 1 else s for i, s in enumerate(batch)) + (m, k)
        b_shape = tuple(1 if b.shape[i] == 1 else s for i, s in enumerate(batch)) + (k, n)
        ops = [Operand(None, kind, a_shape, a.dtype), Operand(None, kind, b_shape, b.dtype)]
        prob = make_problem(ops[0], ops[1], dtype=block_dtype)
        be: Any = (choose_backend(backend, ops, kernel=kernel,  # as matmul chooses
                                  prob=prob, precision=precision)
                   if local else SimpleNamespace(name=backend))
        prob = _tensor_core_half(prob, be)  # as matmul decides: 16-bit on tensor cores
        rung, rung_params = apply_precision(
            precision, kernel, be.name, prob.dtype, params,
            capability=be.target().known_capability if local else None)
        if local:
            choose_kernel(rung, be, prob, rung_params)
        else:
            from tilegemm import registry

            if rung != AUTO:
                spec = registry.get(rung, backend)
                check_dtype_supported(spec, prob.dtype)
                spec.resolve(rung_params)
            break


def _block_product(a: Any, b: Any, *, kernel: str, backend: str, dtype: str,
                   params: dict[str, Any], threads: int | None = None,
                   block_dtype: np.dtype | None = None, precision: str | None = None) -> Any:
    """One task: a chunk of ``a`` times a chunk of ``b`` by tilegemm, with the contraction
    axis put back as a length-1 axis (blockwise expects it; the reduction removes it).
    ``block_dtype``: the kernel's dtype, asked for when it is not NumPy's result dtype."""
    import tilegemm

    if a.shape[-1] != b.shape[-2]:  # the graph was built for matching chunks
        raise RuntimeError(f"tilegemm.dask: chunks of shapes {a.shape} and {b.shape} do not "
                           "match the array metadata the graph was built from")
    with _cpu_threads(threads):
        extra: dict[str, Any] = {} if block_dtype is None else {"dtype": block_dtype}
        if precision is not None:
            extra["precision"] = precision
        c = tilegemm.matmul(a, b, kernel=kernel, backend=backend, **extra, **params)
    if c.dtype != np.dtype(dtype):
        raise RuntimeError(f"tilegemm.dask: a chunk product has dtype {c.dtype}, the graph "
                           f"expects {np.dtype(dtype).name} (chunks of another dtype than "
                           "their array's metadata says)")
    return c[..., np.newaxis, :]


@contextlib.contextmanager
def _cpu_threads(threads: int | None) -> Iterator[None]:
    """Numba's parallel regions started from this thread use at most ``threads`` threads
    (Numba's setting is per calling thread, so other workers' threads are unaffected)."""
    if threads is None:
        yield
        return
    import numba

    from tilegemm.kernels.cpu._threads import make_tbb_loadable

    make_tbb_loadable()  # before numba's first threading call fixes the layer for the process
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _add_partials(x: Any, axis: Any = None, keepdims: bool = False, **_: Any) -> Any:
    """Add partial products (a list of same-shape blocks, or one block) elementwise."""
    out = reduce(lambda p, q: p + q, x) if isinstance(x, list) else x
    return out if keepdims else out.squeeze(axis[0])


# --- opt-in routing of ``a @ b`` --------------------------------------------------------------

_registered: dict[str, Any] | None = None


def register(**kw: Any) -> None:
    """Route ``a @ b`` on Dask arrays through :func:`matmul` (with ``kw``), process-wide.

    Dask's ``Array.__matmul__`` looks up ``dask.array.routines.matmul`` on every call; this
    replaces that function. ``dask.array.matmul`` itself is left alone. Undo with
    :func:`unregister`; :func:`registered` does both around a ``with`` block.
    """
    global _registered
    import dask.array.routines as routines

    _check_keywords(kw)
    _registered = dict(kw)
    routines.matmul = _routed


def unregister() -> None:
    """Give ``a @ b`` back to Dask's own matmul."""
    global _registered
    import dask.array.routines as routines

    routines.matmul = _dask_matmul
    _registered = None


@contextlib.contextmanager
def registered(**kw: Any) -> Iterator[None]:
    """``with registered(kernel="blocked"):`` — ``a @ b`` uses tilegemm inside the block.

    On leaving the block, ``a @ b`` goes back to what it was before it: Dask's own matmul,
    or tilegemm with the keywords of an enclosing ``registered(...)`` block or of an
    earlier :func:`register` call. So blocks nest, and a library may use one inside a
    program that registered tilegemm for itself.
    """
    global _registered
    import dask.array.routines as routines

    before = routines.matmul, _registered
    register(**kw)
    try:
        yield
    finally:
        routines.matmul, _registered = before


def _check_keywords(kw: dict[str, Any]) -> None:
    """Refuse :func:`register`'s keywords now (a misspelt rung, a bad ``threads``), not at
    every later ``a @ b``: a product of two 1×1 arrays of ``dtype`` (float32 if none) is
    built with them, and nothing is computed."""
    probe = da.ones((1, 1), dtype=np.dtype(kw.get("dtype") or np.float32), chunks=1)
    matmul(probe, probe, **kw)


def _routed(a: Any, b: Any) -> da.Array:
    """``a @ b`` through :func:`matmul`, or Dask's own matmul for operands tilegemm does
    not multiply (complex or object dtypes, masked chunks, unknown chunk sizes on the
    contraction axis): registering must not change what ``@`` does for them, process-wide
    (Dask then computes them, or raises its own error)."""
    if not _takes(a, b):
        return _dask_matmul(a, b)
    return matmul(a, b, **(_registered or {}))


def _takes(a: Any, b: Any) -> bool:
    """Whether :func:`matmul` can multiply these operands (their dtypes, chunk types and
    chunk sizes; the registered keywords were checked by :func:`register`)."""
    from tilegemm.errors import UsageError

    try:
        a, b = _as_dask(a, "a"), _as_dask(b, "b")
        _check_known_chunks(a, "a", _paired_axes(a, "a"))
        _check_known_chunks(b, "b", _paired_axes(b, "b"))
        prob = make_problem(Operand(None, array_kind(a._meta), a.shape, a.dtype),
                            Operand(None, array_kind(b._meta), b.shape, b.dtype),
                            dtype=(_registered or {}).get("dtype"))
    except UsageError:
        return False
    return _registered_rung_computes(prob.dtype)


def _registered_rung_computes(dtype: np.dtype) -> bool:
    """Whether the rung registered by name (if any) computes ``dtype``: int32 operands
    under ``registered(kernel="vectorized")``, a float-only rung, go to Dask's own matmul
    rather than raising from every ``a @ b`` in the process."""
    from tilegemm import registry

    kw = _registered or {}
    kernel, backend = kw.get("kernel", "auto"), kw.get("backend", "auto")
    if kernel == "auto":
        return True
    specs = [s for name in registry.BACKENDS if backend in ("auto", name)
             for s in registry.specs_for(name) if s.name == kernel]
    return not specs or any(s.supports(dtype) for s in specs)
