"""The blocked CPU rung's scratch memory, kept per thread between calls (``_workspace``).

A kept buffer holds whatever the last product left in it, so every test here poisons it
(all bits set: NaN in float32 and float64) before a product and checks the result against
the float64 reference; a rung that read scratch it had not written would fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tilegemm
from conftest import host_blocked_params, run_in_threads
from tilegemm.kernels.cpu import _workspace
from tilegemm.reference import assert_close, random_operands

SRC = Path(tilegemm.__file__).resolve().parent.parent


def blocked(a, b, **kw):
    return tilegemm.matmul(a, b, kernel="blocked", backend="cpu", **kw)


def packed(a: np.ndarray) -> np.ndarray:
    """``a`` as the transpose of a C-ordered array, handed to the rung in place: products
    of these sizes given plainly run unpacked on CPUs with the wide 8-row tile (no scratch,
    see ``takes_rows``); an A given transposed keeps them on the packed path, whose
    scratch this file tests."""
    return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)


def poison_kept() -> None:
    kept = _workspace.kept_bytes()
    if kept:
        _workspace.workspace(kept).fill(0xFF)


def test_poisoned_workspace_shared_by_shapes_and_dtypes():
    """One buffer serves products of other sizes and dtypes in turn, bigger and smaller
    than the last, with edge tiles and several K panels; stale contents never leak in."""
    _workspace.release()
    for shape_a, shape_b, dtype in [
        ((300, 170), (170, 210), "float32"), ((70, 90), (90, 33), "float64"),
        ((257, 1100), (1100, 65), "float32"), ((5, 600, 40), (5, 40, 50), "float64"),
        ((129, 64), (64, 700), "float32"),
    ]:
        a, b = random_operands(shape_a, shape_b, dtype)
        poison_kept()
        assert_close(blocked(packed(a), b), a, b, what=f"{dtype} {shape_a} @ {shape_b}")
        assert _workspace.kept_bytes() > 0


def test_workspace_reused_by_a_thread_and_not_shared_between_threads():
    a, b = random_operands((200, 300), (300, 150), "float32")
    a = packed(a)
    _workspace.release()
    blocked(a, b)
    kept = _workspace.kept_bytes()
    address = _workspace.workspace(1).ctypes.data
    assert kept > 0
    poison_kept()
    assert_close(blocked(a, b), a, b, what="second call")
    assert _workspace.kept_bytes() == kept
    assert _workspace.workspace(1).ctypes.data == address  # the same memory, not new pages

    seen: dict[str, object] = {}

    def other() -> None:
        seen["before"] = _workspace.kept_bytes()
        seen["result"] = blocked(a, b)
        seen["address"] = _workspace.workspace(1).ctypes.data

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] == 0  # a new thread starts without one
    assert seen["address"] != address
    assert_close(seen["result"], a, b, what="other thread")
    _workspace.release()
    assert _workspace.kept_bytes() == 0


def test_concurrent_threads_each_get_right_results():
    """Two threads multiplying at once (as Dask's threaded scheduler does) each use their
    own scratch."""
    pairs = [random_operands((260, 190), (190, 230), "float32", seed=s) for s in (1, 2)]
    results: list[object] = [None, None]

    def work(i: int) -> None:
        for _ in range(3):
            poison_kept()
            results[i] = blocked(*pairs[i])

    run_in_threads(work, 2)
    for i, (a, b) in enumerate(pairs):
        assert_close(results[i], a, b, what=f"thread {i}")


def test_large_requests_are_not_kept(monkeypatch):
    _workspace.release()
    monkeypatch.setattr(_workspace, "KEEP_BYTES", 4096)
    small = _workspace.workspace(1024)
    assert _workspace.kept_bytes() == 1024
    big = _workspace.workspace(10_000)
    assert big.size == 10_000 and big.ctypes.data % 64 == 0
    assert _workspace.kept_bytes() == 1024  # the small one stays
    assert _workspace.workspace(512).ctypes.data == small.ctypes.data
    assert _workspace.workspace(0).size == 0
    a, b = random_operands((300, 200), (200, 100), "float64")
    assert_close(blocked(a, b), a, b, what="scratch not kept")
    _workspace.release()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_too_small_workspace_is_replaced(dtype):
    """The compiled rung allocates its own scratch when handed too little."""
    spec = next(s for s in tilegemm.kernels("cpu") if s.name == "blocked")
    program = spec.program(host_blocked_params(dtype), dtype)
    g = program.__globals__
    a, b = random_operands((1, 150, 260), (1, 260, 90), dtype)
    c = np.full((1, 150, 90), np.nan, dtype=dtype)
    cb = program.bound  # the parameters compiled code takes as cb
    stored = np.ascontiguousarray(np.swapaxes(a, 1, 2))  # A given as its transpose: packed
    size = g["layout"](1, 150, 90, 260, 2, g["DIRECT_PRODUCT"],
                       g["B_CHUNK_BYTES"], g["L2_BUDGET"], cb, 1)[7]
    assert size > 0
    g["blocked_threads"](stored, b, c, c.dtype.type(1), c.dtype.type(0), 2,
                         g["DIRECT_PRODUCT"], np.empty(size // 2, dtype=dtype), 1,
                         g["B_CHUNK_BYTES"], g["L2_BUDGET"], cb)
    assert_close(c[0], a[0], b[0], what=f"{dtype} with half the scratch")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_no_fresh_pages_per_call_when_malloc_returns_memory():
    """With ``MALLOC_TRIM_THRESHOLD_`` set, as dask.distributed's workers have it, glibc
    maps every large allocation afresh; repeated products must not fault in new scratch
    pages each time (the output array still does: about M·N·4 bytes of it)."""
    code = """
import resource, numpy as np, tilegemm
a = np.ones((512, 1024), np.float32); b = np.ones((1024, 64), np.float32)
tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) // 10)
"""
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536", PYTHONPATH=str(SRC))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600, check=True)
    faults = int(out.stdout.split()[-1])
    # Scratch: A blocks of 512 rows x KC=512 plus a B panel, about 1.1 MiB = 270 pages of
    # 4 KiB; the 512x64 float32 output is 32 pages.
    assert faults < 150, faults
