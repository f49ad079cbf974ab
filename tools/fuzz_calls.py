"""A random search for calls where tilegemm disagrees with NumPy, or where a repeated call
(the remembered decision, ``tilegemm.fastpath``) disagrees with the first.

Usage (from the repository root)::

    PYTHONPATH=src python tools/fuzz_calls.py                   # 300 matmul and gemm calls
    PYTHONPATH=src python tools/fuzz_calls.py --seed 2 --cases 1500   # about 2 s
    PYTHONPATH=src python tools/fuzz_calls.py --seed 7 --cases 2000 --backend opencl

Each case draws operands (shapes with 0, 1, primes and partial tiles; batches, broadcast
or not; C-ordered, Fortran-ordered, transposed batches, slices of columns, reversed rows,
read-only), their dtypes (one or two of the dtypes NumPy's matmul takes, bfloat16
included), a ``dtype=`` argument, an ``out`` and, for ``gemm``, alpha, beta, ``c`` and the
transpose flags. The remembered decisions are dropped, then the call is made three times:
the first (the full path) is compared with NumPy (integers and bool exactly, floats
within a tolerance that grows with K), and the two repeats must give its dtype and its
bits. Where NumPy raises, tilegemm must raise too (a ``ValueError`` or ``TypeError``);
where only tilegemm raises, the case is reported unless it is a refusal by design
(complex and object dtypes). Every report names the seed and case number, and the
failures' count is the exit status (0: none).

A search like this found two wrong remembered calls (2026-11-29: a float32 product with
``dtype=np.float16`` that skipped NumPy's rounding of the operands, and an int32 product
with ``dtype="int8"`` whose result was not converted) before they landed;
``tests/test_fastpath.py`` now checks those classes of call exhaustively.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np

import tilegemm
from tilegemm import remembered

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32",
          "int64", "uint64", "bool", "complex64"]
ASKED = [None, None, None, "float32", "float64", "int32", "int64", "float16", "int8"]
SIDES = [0, 1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 33, 64, 65, 100, 130, 257, 300]
LAYOUTS = ["C", "C", "F", "T", "wide", "rows", "reversed", "read-only"]
REFUSED = ("complex", "object")  # dtypes tilegemm refuses by design


def operand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str,
            layout: str) -> np.ndarray:
    """Random, mostly non-zero data of ``dtype`` in ``layout`` (see :data:`LAYOUTS`)."""
    if dtype == "bool":
        x = rng.random(shape) < 0.5
    elif np.dtype(dtype).kind in "iu":
        x = rng.integers(0 if np.dtype(dtype).kind == "u" else -4, 5, shape).astype(dtype)
    elif dtype.startswith("complex"):
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    if x.ndim < 2 or layout == "C":
        return x
    if layout == "F":
        return np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2) if x.ndim > 2 \
            else np.asfortranarray(x)
    if layout == "T":  # the transpose in the last two axes of a C-ordered array
        return np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)
    if layout == "wide":  # a slice of columns: rows apart
        wide = np.zeros(x.shape[:-1] + (x.shape[-1] + 3,), x.dtype)
        wide[..., :x.shape[-1]] = x
        return wide[..., :x.shape[-1]]
    if layout == "rows":  # every other row of a taller array
        tall = np.zeros(x.shape[:-2] + (2 * x.shape[-2], x.shape[-1]), x.dtype)
        tall[..., ::2, :] = x
        return tall[..., ::2, :]
    if layout == "reversed":
        return x[..., ::-1, :].copy()[..., ::-1, :]
    x.flags.writeable = False  # read-only
    return x


def expected(a: np.ndarray, b: np.ndarray, asked: Any, gemm: dict[str, Any] | None) -> Any:
    """NumPy's answer (bfloat16 operands as ml_dtypes gives them, computed in float32)."""
    kw = {} if asked is None else {"dtype": asked}
    if gemm is None:
        return np.matmul(a, b, **kw)
    aa = np.swapaxes(a, -1, -2) if gemm["trans_a"] else a
    bb = np.swapaxes(b, -1, -2) if gemm["trans_b"] else b
    product = np.matmul(aa, bb, **kw)
    value = gemm["alpha"] * product.astype(np.float64)
    if gemm["c"] is not None and gemm["beta"] != 0:
        value = value + gemm["beta"] * np.asarray(gemm["c"], np.float64)
    if product.dtype.kind == "b":  # (tilegemm scales the bool product: != 0 after)
        return value != 0
    return value.astype(product.dtype) if product.dtype.kind in "iu" else value


def agrees(got: np.ndarray, want: Any, k: int) -> bool:
    """Exactly for integers and bool; within a K-scaled tolerance for floats."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype.kind in "iub" and got.dtype.kind in "iub":
        return bool(np.array_equal(got, want))
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    eps = 1e-2 if got.dtype.itemsize <= 2 else 1e-5 if got.dtype.itemsize == 4 else 1e-12
    scale = max(1.0, float(np.nanmax(np.abs(w[np.isfinite(w)]), initial=0.0)))
    close = np.abs(g - w) <= eps * max(k, 1) * 4 * scale
    return bool(np.all(close | (np.isnan(w) & np.isnan(g)) | (np.isinf(w) & (g == w))))


def one_case(rng: np.random.Generator, backend: str, gemm_share: float) -> tuple[str, str]:
    """(description, failure or "") of one random case."""
    m, k, n = (int(rng.choice(SIDES)) for _ in range(3))
    batch = [(), (), (2,), (3, 2), (1,)][rng.integers(5)]
    batch_b = batch if rng.random() < 0.7 else [(), (1,), (1, 1), batch][rng.integers(4)]
    da = DTYPES[rng.integers(len(DTYPES))]
    db = da if rng.random() < 0.6 else DTYPES[rng.integers(len(DTYPES))]
    is_gemm = rng.random() < gemm_share
    gemm = None
    sa, sb = batch + (m, k), batch_b + (k, n)
    if is_gemm:
        ta, tb = bool(rng.integers(2)), bool(rng.integers(2))
        sa = batch + ((k, m) if ta else (m, k))
        sb = batch_b + ((n, k) if tb else (k, n))
    elif rng.random() < 0.2:
        sa = (k,)
    elif rng.random() < 0.2:
        sb = (k,)
    a = operand(rng, sa, da, LAYOUTS[rng.integers(len(LAYOUTS))])
    b = operand(rng, sb, db, LAYOUTS[rng.integers(len(LAYOUTS))])
    asked = ASKED[rng.integers(len(ASKED))]
    kw: dict[str, Any] = {} if asked is None else {"dtype": asked}
    if backend != "auto":
        kw["backend"] = backend
    if is_gemm:
        whole = any(np.dtype(d).kind in "iub" for d in (da, db))
        alpha = [1, 2, -1, 0][rng.integers(4)] if whole else [1.0, 0.5, -2.0, 3][rng.integers(4)]
        beta = [0, 1, -2][rng.integers(3)] if whole else [0.0, 1.0, -0.5][rng.integers(3)]
        if any(np.dtype(d).kind == "u" for d in (da, db)):
            alpha, beta = abs(alpha), abs(beta)  # (an unsigned result's scalars fit it)
        shape = batch + (m, n) if batch_b == batch else None
        c = None
        if shape is not None and rng.random() < 0.6:
            c = operand(rng, [shape, (n,), (m, 1)][rng.integers(3)], da, "C")
        if c is None:
            beta = 0  # (beta != 0 needs c: an error by design)
        gemm = {"alpha": alpha, "beta": beta, "c": c, "trans_a": ta, "trans_b": tb}
    desc = (f"{'gemm' if is_gemm else 'matmul'} a{a.shape} {a.dtype} {a.strides} "
            f"b{b.shape} {b.dtype} {b.strides} {kw}")
    if gemm is not None:
        scalars = {x: v for x, v in gemm.items() if x != "c"}
        desc += f" {scalars} c {None if gemm['c'] is None else gemm['c'].shape}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = expected(a, b, asked, gemm)
        except Exception as exc:  # noqa: BLE001 - NumPy refuses: tilegemm must refuse too
            want = exc

        def call() -> Any:
            if gemm is None:
                return tilegemm.matmul(a, b, **kw)
            cc = None if gemm["c"] is None else gemm["c"].copy()
            return tilegemm.gemm(a, b, cc, alpha=gemm["alpha"], beta=gemm["beta"],
                                 trans_a=gemm["trans_a"], trans_b=gemm["trans_b"], **kw)

        remembered.forget()
        results = []
        for _ in range(3):
            try:
                results.append(call())
            except (ValueError, TypeError) as exc:
                results.append(exc)
    first = results[0]
    if isinstance(want, Exception) or isinstance(first, Exception):
        if isinstance(want, Exception) and isinstance(first, Exception):
            return desc, ""
        if isinstance(first, Exception) and any(r in str(first) for r in REFUSED):
            return desc, ""
        return desc, f"NumPy {type(want).__name__}, tilegemm {type(first).__name__}: " \
                     f"{str(first if isinstance(first, Exception) else want)[:160]}"
    if np.ndim(first) and not agrees(np.asarray(first), want, k):
        return desc, "the first call disagrees with NumPy"
    for again in results[1:]:
        if isinstance(again, Exception):
            return desc, f"a repeated call raised {type(again).__name__}: {again}"
        same = (np.asarray(again).dtype == np.asarray(first).dtype
                and np.array_equal(again, first, equal_nan=np.asarray(first).dtype.kind == "f"))
        if not same:
            return desc, "a repeated call's bits or dtype differ from the first call's"
    return desc, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "opencl"])
    ap.add_argument("--gemm-share", type=float, default=0.4,
                    help="the share of cases that call gemm rather than matmul")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    failures = 0
    for i in range(args.cases):
        desc, failure = one_case(rng, args.backend, args.gemm_share)
        if failure:
            failures += 1
            print(f"seed {args.seed} case {i}: {failure}\n    {desc}", flush=True)
    print(f"{args.cases} cases, {failures} failures (seed {args.seed}, backend {args.backend})")
    return min(failures, 125)


if __name__ == "__main__":
    sys.exit(main())
