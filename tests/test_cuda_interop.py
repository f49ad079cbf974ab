"""CuPy and PyTorch arrays in, the same library's arrays out, on a real GPU.

These paths (each library's reshape/transpose/broadcast, ``cuda.as_cuda_array`` on its
arrays, ``cupy.asarray``/``torch.as_tensor`` on numba's result) exist only on hardware: the
simulator has no CuPy or PyTorch arrays. Run with TILEGEMM_GPU_TESTS=1 (docs/gpu-session.md,
step 1); skipped elsewhere, and per library when it is not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilegemm
from tilegemm.reference import assert_close, random_operands

pytestmark = [pytest.mark.gpu, pytest.mark.parametrize("lib", ["cupy", "torch"])]

M, N, K = 257, 129, 65  # partial tiles everywhere, odd K and N (scalar paths)


def _lib(lib: str):  # type: ignore[no-untyped-def]
    mod = pytest.importorskip(lib)
    if lib == "torch" and not mod.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return mod


def _to(lib: str, x: np.ndarray):  # type: ignore[no-untyped-def]
    mod = _lib(lib)
    return mod.asarray(x) if lib == "cupy" else mod.as_tensor(x, device="cuda")


def _host(lib: str, x) -> np.ndarray:  # type: ignore[no-untyped-def]
    return x.get() if lib == "cupy" else x.cpu().numpy()


def _same_kind(lib: str, x) -> bool:  # type: ignore[no-untyped-def]
    return type(x).__module__.split(".")[0] == lib


@pytest.mark.parametrize("kernel", [s.name for s in tilegemm.kernels("cuda")  # IEEE rungs:
                                    if not s.precisions])  # see test_cuda_mma
def test_every_rung_on_library_arrays(lib: str, kernel: str) -> None:
    for dtype, (m, n, k) in (("float32", (M, N, K)), ("float32", (M, 128, 64))):
        a, b = random_operands((m, k), (k, n), dtype)
        r = tilegemm.matmul(_to(lib, a), _to(lib, b), backend="cuda", kernel=kernel)
        assert _same_kind(lib, r) and tuple(r.shape) == (m, n)
        assert_close(_host(lib, r), a, b, what=f"{lib} {kernel} {m}x{n}x{k}")


def test_transposes_broadcasts_vectors(lib: str) -> None:
    at, b = random_operands((K, M), (2, 1, K, N), "float32")  # op(A) = at.T, B batched
    r = tilegemm.gemm(_to(lib, at), _to(lib, b), trans_a=True, backend="cuda")
    assert tuple(r.shape) == (2, 1, M, N)
    assert_close(_host(lib, r), at, b, trans_a=True)
    a3, b3 = random_operands((3, 1, M, K), (1, 2, K, N), "float64")  # partial broadcast
    r = tilegemm.matmul(_to(lib, a3), _to(lib, b3), backend="cuda")
    assert tuple(r.shape) == (3, 2, M, N)
    assert_close(_host(lib, r), a3, b3)
    v = random_operands((K,), (K,), "float32")[0]
    a = random_operands((M, K), (K,), "float32")[0]
    r = tilegemm.matmul(_to(lib, a), _to(lib, v), backend="cuda")
    assert tuple(r.shape) == (M,)
    assert_close(_host(lib, r), a, v)


def test_a_batch_times_one_matrix_is_stacked(lib: str) -> None:
    """(batch, M, K) @ (K, N) of the library's arrays runs as one product of the batch's
    rows (problem.stacked_rows, on the library's own reshape), the caller's shape back."""
    a, b = random_operands((4, 3, K), (K, N), "float32")
    da, db = _to(lib, a), _to(lib, b)
    assert tilegemm.plan(da, db, backend="cuda").shape == (1, 12, N, K)
    r = tilegemm.matmul(da, db, backend="cuda")
    assert _same_kind(lib, r) and tuple(r.shape) == (4, 3, N)
    assert_close(_host(lib, r), a, b)
    out = _to(lib, np.full((4, 3, N), np.nan, np.float32))
    assert tilegemm.matmul(da, db, out=out, backend="cuda") is out
    assert_close(_host(lib, out), a, b)


def test_out_and_device_c(lib: str) -> None:
    a, b = random_operands((M, K), (K, N), "float32")
    c = np.random.default_rng().uniform(0.5, 1.5, (M, N)).astype(np.float32)
    out = _to(lib, np.full((M, N), np.nan, np.float32))
    assert tilegemm.matmul(_to(lib, a), _to(lib, b), out=out, backend="cuda") is out
    assert_close(_host(lib, out), a, b)
    dc = _to(lib, c)
    r = tilegemm.gemm(_to(lib, a), _to(lib, b), dc, alpha=2.0, beta=-0.5, backend="cuda")
    assert _same_kind(lib, r)
    assert_close(_host(lib, r), a, b, alpha=2.0, beta=-0.5, c=c)
    assert tilegemm.gemm(_to(lib, a), _to(lib, b), dc, beta=1.0, out=dc, backend="cuda") is dc
    assert_close(_host(lib, dc), a, b, beta=1.0, c=c)
    sq = random_operands((M, M), (M, M), "float32")[0]
    x = _to(lib, sq)
    tilegemm.matmul(x, x, out=x, backend="cuda")  # out aliases both operands
    assert_close(_host(lib, x), sq, sq)


def _allocated(lib: str) -> int:
    """Bytes the library's own allocator has handed out and not had back."""
    mod = _lib(lib)
    if lib == "cupy":
        return int(mod.get_default_memory_pool().used_bytes())
    return int(mod.cuda.memory_allocated())


def test_results_come_from_the_library_allocator(lib: str) -> None:
    """A result for CuPy or PyTorch operands is memory of their library (its pool; numba's
    cuMemAlloc per call, and the device-wide waits of its batched frees, are avoided); a
    loop of products dropping their results reuses that memory correctly, stream order
    included, and a result made by a call with stream= still comes from numba."""
    a, b = random_operands((M, K), (K, N), "float32")
    da, db = _to(lib, a), _to(lib, b)
    tilegemm.matmul(da, db, backend="cuda")  # compiled, workspaces made
    before = _allocated(lib)
    kept = tilegemm.matmul(da, db, backend="cuda")
    assert _allocated(lib) - before >= M * N * 4
    for _ in range(25):
        r = tilegemm.matmul(da, db, backend="cuda")
    assert_close(_host(lib, r), a, b, what="the last of a loop of dropped results")
    assert_close(_host(lib, kept), a, b, what="a result kept through the loop")
    from numba import cuda

    s = cuda.stream()
    r = tilegemm.matmul(da, db, backend="cuda", stream=s)
    s.synchronize()
    assert _same_kind(lib, r)
    assert_close(_host(lib, r), a, b, what="stream=")


@pytest.mark.parametrize("case", ["float32", "batched", "vectors", "B K-major", "float16",
                                  "float16 B K-major", "own stream"])
def test_repeated_calls_are_launched_directly(lib: str, case: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The second and later plain calls of a case run on views of the arrays' memory
    (backends/cuda_direct): each on fresh data, NaN-poisoned first (TILEGEMM_POISON), on
    the library's current stream, and right."""
    from tilegemm import remembered
    from tilegemm.backends import cuda_direct

    mod = _lib(lib)
    remembered.forget()  # (another test's case of the same layout would be remembered)
    direct: list[bool] = []
    call = cuda_direct.DirectProgram.__call__

    def counted(self: Any, a: Any, b: Any, poison: bool = False) -> Any:
        r = call(self, a, b, poison)
        direct.append(r is not None)
        return r

    monkeypatch.setattr(cuda_direct.DirectProgram, "__call__", counted)
    dtype = "float16" if case.startswith("float16") else "float32"
    sa, sb = {"batched": ((3, M, K), (3, K, N)), "vectors": ((K,), (K, N))}.get(
        case, ((M, K), (K, N)))
    stream = None
    if case == "own stream":
        stream = mod.cuda.Stream() if lib == "torch" else mod.cuda.Stream(non_blocking=True)
    for i in range(4):
        a, b = random_operands(sa, sb, dtype)
        da = _to(lib, a)
        db = (_to(lib, np.ascontiguousarray(b.T)).T if case.endswith("K-major")
              else _to(lib, b))
        ctx = (mod.cuda.stream(stream) if lib == "torch" else stream) if stream else None
        if ctx is None:
            r = tilegemm.matmul(da, db)
        else:
            with ctx:
                r = tilegemm.matmul(da, db)
            stream.synchronize()
        assert _same_kind(lib, r) and tuple(r.shape) == (a @ b).shape
        assert_close(_host(lib, r), a, b, what=f"{lib} {case}, call {i + 1}")
    assert direct == [True] * 3
