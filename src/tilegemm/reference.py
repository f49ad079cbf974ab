"""The float64 reference and the one tolerance every check uses.

Why one place: a tolerance chosen per test drifts, and a loose one hides bugs. The bound
is the standard forward-error bound of a length-K dot product,
``|C - C_ref| <= gamma * K * eps(dtype) * (|alpha| |A| |B| + |beta| |C0|)`` elementwise, with
a safety factor ``gamma``; integer products must match exactly. NaN and Inf must appear
exactly where NumPy puts them.

Called, this module is its function :func:`reference`: ``tilegemm.reference(a, b)``.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from tilegemm._callable import make_callable

SAFETY = 4.0


def reference(
    a: np.ndarray, b: np.ndarray, *, alpha: float = 1.0, beta: float = 0.0,
    c: np.ndarray | None = None, trans_a: bool = False, trans_b: bool = False,
) -> np.ndarray:
    """alpha * op(a) @ op(b) + beta * c, computed in float64 (int64 for integer inputs).

    Wide on purpose: a narrower integer or bool result is this cast to its dtype (wrapped,
    or nonzero for bool), which :func:`assert_close` does."""
    try:
        kind = np.result_type(a, b).kind
    except TypeError:  # no promotion between them (bfloat16 and float16): floats
        kind = "f"
    wide = np.int64 if kind in "iu" else np.float64
    a64 = np.asarray(a, dtype=wide)
    b64 = np.asarray(b, dtype=wide)
    if trans_a:
        a64 = np.swapaxes(a64, -1, -2)
    if trans_b:
        b64 = np.swapaxes(b64, -1, -2)
    with np.errstate(all="ignore"):
        r = np.matmul(a64, b64)
        if alpha != 1:
            r = alpha * r
        if beta != 0 and c is not None:
            r = r + beta * np.asarray(c, dtype=wide)
    return r


def bound(
    a: np.ndarray, b: np.ndarray, k: int, dtype: np.dtype, *, alpha: float = 1.0,
    beta: float = 0.0, c: np.ndarray | None = None, trans_a: bool = False, trans_b: bool = False,
    eps: float | None = None,
) -> np.ndarray | float:
    """Elementwise absolute error allowed for a result of ``dtype`` with inner size ``k``.

    ``eps`` replaces the dtype's machine epsilon where the arithmetic is coarser than the
    result's dtype: float32 results of TF32 tensor-core products (see
    :data:`tilegemm.precision.TOLERANCE_EPS`).
    """
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return 0.0
    info = ml_dtypes.finfo(dtype)  # NumPy's finfo, and bfloat16's
    eps = float(info.eps) if eps is None else float(eps)
    # |a| and |b| in float64: in its own dtype the most negative integer is its own absolute
    # value (np.abs(int8(-128)) == -128), and the terms of the magnitude would cancel
    mag = np.abs(reference(_magnitude(a), _magnitude(b), alpha=abs(alpha), trans_a=trans_a,
                           trans_b=trans_b))
    if beta != 0 and c is not None:
        mag = mag + abs(beta) * np.abs(np.asarray(c, dtype=np.float64))
    # + 1 keeps K=0/1 meaningful; tiny floor for all-zero rows.
    return SAFETY * (max(k, 1) + 1) * eps * mag + float(info.tiny)


def _magnitude(x: Any) -> np.ndarray:
    return np.abs(np.asarray(x, dtype=np.float64))


def assert_close(
    result: Any, a: np.ndarray, b: np.ndarray, *, alpha: float = 1.0, beta: float = 0.0,
    c: np.ndarray | None = None, trans_a: bool = False, trans_b: bool = False,
    what: str = "result", eps: float | None = None,
) -> None:
    """Raise AssertionError naming the first bad index and the worst errors (``eps``: see
    :func:`bound`)."""
    result = np.asarray(result)
    ref = reference(a, b, alpha=alpha, beta=beta, c=c, trans_a=trans_a, trans_b=trans_b)
    if result.shape != ref.shape:
        raise AssertionError(f"{what}: shape {result.shape}, expected {ref.shape}")
    if result.dtype.kind in "biu":
        # exact, as NumPy gives it in the result's dtype: bool, whether any term is true;
        # integers wrapped to their width (the wide sum modulo 2**bits, as NumPy's wraps)
        with np.errstate(all="ignore"):
            want = ref != 0 if result.dtype.kind == "b" else ref.astype(result.dtype)
        bad = result != want
        if np.any(bad):
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(
                f"{what}: {int(np.count_nonzero(bad))} of {want.size} elements wrong; first at "
                f"{idx}: got {result[idx]!r}, expected {want[idx]!r} ({result.dtype.name} "
                "results must match exactly)")
        return
    k = np.shape(a)[-1] if not trans_a else np.shape(a)[-2]
    if np.ndim(a) == 1:
        k = np.shape(a)[0]
    tol = bound(a, b, k, result.dtype, alpha=alpha, beta=beta, c=c,
                trans_a=trans_a, trans_b=trans_b, eps=eps)
    r64 = result.astype(ref.dtype, copy=False)
    finite = np.isfinite(ref)
    with np.errstate(invalid="ignore"):
        err = np.abs(r64 - ref)
        bad = np.where(finite, ~(err <= tol), ~((r64 == ref) | (np.isnan(ref) & np.isnan(r64))))
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        nbad = int(np.count_nonzero(bad))
        with np.errstate(invalid="ignore"):
            max_abs = float(np.nanmax(np.where(finite, err, 0.0))) if ref.size else 0.0
            rel = np.where(finite & (np.abs(ref) > 0), err / np.maximum(np.abs(ref), 1e-300), 0)
            max_rel = float(np.nanmax(rel)) if ref.size else 0.0
        raise AssertionError(
            f"{what}: {nbad} of {ref.size} elements wrong; first at {idx}: got {result[idx]!r}, "
            f"expected {ref[idx]!r} (allowed error {np.broadcast_to(tol, ref.shape)[idx]:.3g}); "
            f"max abs error {max_abs:.3g}, max rel error {max_rel:.3g}"
        )


def random_operands(
    shape_a: tuple[int, ...], shape_b: tuple[int, ...], dtype: Any = np.float32,
    *, seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fresh random inputs: uniform in [0.5, 1.5) with random signs (integers: 1..9 with
    random signs, unsigned ones without; bool: True or False at random)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        # Drawn directly in the requested dtype, so a size that does not fit fails naming
        # that dtype, and no float64 copy twice the size is ever made.
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape, dtype=np.int8).view(np.bool_)
        if dtype.kind in "iu":
            x = rng.integers(1, 10, size=shape, dtype=dtype)
            if dtype.kind == "u":
                return x
        elif dtype not in (np.float32, np.float64):  # float16, bfloat16: no direct draw
            x = (rng.random(size=shape, dtype=np.float32) + np.float32(0.5)).astype(dtype)
        else:
            x = rng.random(size=shape, dtype=dtype)
            x += dtype.type(0.5)
        np.negative(x, out=x, where=rng.integers(0, 2, size=shape, dtype=np.int8) == 1)
        return x

    return draw(shape_a), draw(shape_b)


make_callable(__name__, f"{__name__}:reference")  # tilegemm.reference(a, b)
