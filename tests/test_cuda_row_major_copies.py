"""Rungs 6-9 (the CUDA-core rungs with 128-bit loads) on device operands their vector
loads cannot read: laid out the other way round (A M-major as in ``x.T @ y``, B K-major as
in ``x @ w.T``), or with rows off 16 bytes (K or N odd). In products large enough to repay
it, such operands are copied into the kernel's layout first (``_kmajor.RowMajorProgram``),
rows padded to 16 bytes, and the kernel reads the copies with its vector loads even where
K or N is not a whole number of vectors. Without the copy every k-tile goes element by
element.

On numba's simulator (``cudasim``), and on a GPU with ``TILEGEMM_GPU_TESTS=1``, where the
count of vector loads (a simulator hook) is skipped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from conftest import transposed_device_array
from tilegemm import registry, simulator
from tilegemm.kernels.cuda import _access

pytestmark = pytest.mark.cudasim

# (rung, parameters over its simulator tiles): each rung whose kernel has the vector
# checks, and pipelined's split-K program (the copies, then partial products and sum).
CASES = [("vectorized", {}), ("smem_layout", {}), ("warptile", {}), ("pipelined", {}),
         ("pipelined", {"SPLIT_K": 2})]
M, N = 40, 37
SENTINEL = 7.0


def _padded(rng: np.random.Generator, rows: int, cols: int, dtype: Any) -> tuple[Any, Any]:
    """(a (1, rows, cols) device view of a (1, rows, cols rounded up to 16 bytes) array,
    whose columns past ``cols`` hold SENTINEL; the whole array)."""
    from numba import cuda

    from tilegemm.backends.cuda_program import strided_view

    per = 16 // np.dtype(dtype).itemsize
    full = np.full((1, rows, -(-cols // per) * per), SENTINEL, dtype=dtype)
    full[:, :, :cols] = rng.standard_normal((1, rows, cols))
    base = cuda.to_device(full)
    return strided_view(base, (1, rows, cols), base.strides), base


@pytest.mark.parametrize(("dtype", "k"), [(np.float32, 13), (np.float64, 13),
                                          (np.float32, 16)])
@pytest.mark.parametrize(("name", "over"), CASES, ids=[
    name + ("-split" if over else "") for name, over in CASES])
def test_transposed_device_operands_are_copied_and_read_in_vectors(
        name: str, over: dict, dtype: Any, k: int, rng: np.random.Generator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A (40×K, M-major) and B (K×37, K-major), device arrays, with C a view whose rows
    are padded to 16 bytes (sentinels past column 37): the product is right; both
    operands were copied, the copies' padding (poisoned with NaN) never reached the
    result; the interior blocks read both copies with 16-byte loads though K = 13 and
    N = 37 are not whole vectors; C's padding is left as it was (a vector store at its
    last columns would overwrite it)."""
    spec = registry.get(name, "cuda")
    program = spec.program(spec.resolve(dict(spec.sim_params) | over), np.dtype(dtype))
    program = replace(program, min_reuse=0)  # copies even for a product this small
    from tilegemm.kernels.cuda._kmajor import kmajor_shape

    isz = np.dtype(dtype).itemsize
    program.workspaces._spaces.clear()
    for slot, shape in (("A", (1, k, M)), ("B", (1, N, k))):  # the transposed views' shapes
        work = program.workspaces.get(kmajor_shape(shape, isz), np.dtype(dtype), 0, slot)
        work.copy_to_device(np.full(work.shape, np.nan, dtype=dtype))
    a, a_host = transposed_device_array(rng, (1, M, k), dtype)
    b, b_host = transposed_device_array(rng, (1, k, N), dtype)
    c, c_base = _padded(rng, M, N, dtype)
    c_host = c_base.copy_to_host()[:, :, :N]
    alpha, beta = dtype(1.5), dtype(0.5)

    vector_reads = _vector_reads(monkeypatch)
    program.launch(a, b, c, alpha, beta)

    got = c_base.copy_to_host()
    want = alpha * np.matmul(a_host.astype(np.float64), b_host) + beta * c_host
    scale = alpha * np.matmul(np.abs(a_host).astype(np.float64), np.abs(b_host)) + beta
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(got[:, :, :N] - want) <= 4 * k * eps * scale), name
    assert (got[:, :, N:] == SENTINEL).all(), "C's padding was overwritten"
    assert {key[-1] for key in program.workspaces._spaces} >= {"A", "B"}
    if simulator.enabled():
        assert vector_reads.count((1, M, k)) > 0, "A's copy was not read in vectors"
        assert vector_reads.count((1, k, N)) > 0, "B's copy was not read in vectors"


def _vector_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of the arrays read by the interior path's vector loads from now on."""
    reads: list[tuple[int, ...]] = []
    vload = _access._py_vload  # what the interior path's vload_at reads through

    def counted(arr: Any, idx: tuple[int, ...]) -> tuple[Any, ...]:
        reads.append(tuple(arr.shape))
        return vload(arr, idx)

    monkeypatch.setattr(_access, "_py_vload", counted)
    return reads


@pytest.mark.parametrize("name", ["smem_layout", "pipelined"])
def test_rows_off_16_bytes_are_copied_padded(name: str, rng: np.random.Generator,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """C-ordered device operands with K = 13 and N = 37 (float32: rows of 52 and 148
    bytes): the vector loads cannot read them, so each is copied into rows padded to 16
    bytes (poisoned with NaN first, which must not reach the result) and the interior
    blocks read the copies in vectors."""
    from numba import cuda

    from tilegemm.kernels.cuda._kmajor import padded_shape

    spec = registry.get(name, "cuda")
    program = replace(spec.program(spec.resolve(dict(spec.sim_params)), np.dtype(np.float32)),
                      min_reuse=0)
    program.workspaces._spaces.clear()
    k = 13
    for slot, shape in (("A", (1, M, k)), ("B", (1, k, N))):
        work = program.workspaces.get(padded_shape(shape, 4), np.dtype(np.float32), 0, slot)
        work.copy_to_device(np.full(work.shape, np.nan, dtype=np.float32))
    a = rng.standard_normal((1, M, k)).astype(np.float32)
    b = rng.standard_normal((1, k, N)).astype(np.float32)
    c = cuda.to_device(np.full((1, M, N), np.nan, dtype=np.float32))
    reads = _vector_reads(monkeypatch)
    program.launch(cuda.to_device(a), cuda.to_device(b), c, np.float32(1), np.float32(0))
    np.testing.assert_allclose(c.copy_to_host(), a @ b, rtol=1e-5, atol=1e-5)
    assert {key[-1] for key in program.workspaces._spaces} >= {"A", "B"}
    if simulator.enabled():
        assert (1, M, k) in reads and (1, k, N) in reads


def test_what_is_copied_at_the_default_threshold() -> None:
    """Rungs 6-9 copy an operand only where the product does at least FFMA_MIN_REUSE
    multiply-adds per element copied (N per element of A, M per element of B, times the
    batch over which it is broadcast): in ``x.T @ y`` with y 8 columns wide, A's copy
    would cost more than the scalar path it saves. Where the reuse is there, a transposed
    operand or one with rows off 16 bytes is copied; one the kernel reads in vectors, or a
    strided view of neither layout, is not. Rung mma copies a transposed operand always."""
    from numba import cuda

    from tilegemm.backends.cuda_program import strided_view
    from tilegemm.kernels.cuda._kmajor import FFMA_MIN_REUSE

    spec = registry.get("pipelined", "cuda")
    program = spec.program(spec.resolve(dict(spec.sim_params)), np.dtype(np.float32))
    assert program.min_reuse == FFMA_MIN_REUSE and program.pad

    def device(shape: tuple[int, int, int], transposed: bool = False) -> Any:
        if not transposed:
            return cuda.device_array(shape, np.float32)
        base = cuda.device_array((shape[0], shape[2], shape[1]), np.float32)
        s0, s1, s2 = base.strides
        return strided_view(base, shape, (s0, s2, s1))

    def copied(a: Any, b: Any, batch: int, m: int, n: int) -> list[str]:
        return [slot for slot, *_ in program.copies_for(a, b, (batch, m, n))]

    r = FFMA_MIN_REUSE
    assert copied(device((1, 8, 16), True), device((1, 16, 8), True), 1, 8, 8) == []
    a_t, b_t = device((1, r, 16), True), device((1, 16, r), True)  # M-major A, K-major B
    assert copied(a_t, b_t, 1, r, r) == ["A", "B"]
    assert copied(a_t, device((1, 16, 8)), 1, r, 8) == []  # x.T @ y with y 8 wide
    # B broadcast over a batch of 4: each of its elements serves 4 products
    assert copied(device((4, r // 4, 16)), device((1, 16, 64), True), 4, r // 4, 64) == ["B"]
    # C-ordered: rows of 13 values copied padded; of 16 read as they are
    assert copied(device((1, r, 13)), device((1, 13, r + 1)), 1, r, r + 1) == ["A", "B"]
    assert copied(device((1, r, 16)), device((1, 16, r)), 1, r, r) == []
    # every other column of a wider array: neither layout, read as it is
    wide = cuda.device_array((1, r, 32), np.float32)
    every_other = strided_view(wide, (1, r, 16), (wide.strides[0], wide.strides[1], 8))
    assert copied(every_other, device((1, 16, r)), 1, r, r) == []
    mma = registry.get("mma", "cuda")
    tc = mma.program(mma.resolve(dict(mma.sim_params)), np.dtype(np.float16))
    small = tc.copies_for(device((1, 8, 16), True), device((1, 16, 8)), (1, 8, 8))
    assert [slot for slot, *_ in small] == ["A"]


@pytest.mark.parametrize("name", ["vectorized", "pipelined"])
def test_operands_in_the_kernels_layout_are_not_copied(name: str,
                                                       rng: np.random.Generator) -> None:
    """Row-major device operands go to the kernel as they are: no workspace is made."""
    from numba import cuda

    spec = registry.get(name, "cuda")
    program = spec.program(spec.resolve(dict(spec.sim_params)), np.dtype(np.float32))
    program.workspaces._spaces.clear()
    a = rng.standard_normal((1, 9, 8)).astype(np.float32)
    b = rng.standard_normal((1, 8, 12)).astype(np.float32)
    c = cuda.to_device(np.full((1, 9, 12), np.nan, dtype=np.float32))
    program.launch(cuda.to_device(a), cuda.to_device(b), c, np.float32(1), np.float32(0))
    np.testing.assert_allclose(c.copy_to_host(), a @ b, rtol=1e-5, atol=1e-5)
    assert len(program.workspaces) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("name", "over"), CASES, ids=[
    name + ("-split" if over else "") for name, over in CASES])
def test_small_products_read_transposed_operands_as_they_lie(
        name: str, over: dict, dtype: Any, rng: np.random.Generator) -> None:
    """Below the reuse threshold nothing is copied: A M-major and B K-major go to the
    kernel as they are, and its edge path reads them element by element, at offsets that
    step by their strides along k and n (rung 9 addresses those elements from its
    per-thread offsets; the simulator's stand-in checks each offset against its index)."""
    spec = registry.get(name, "cuda")
    program = spec.program(spec.resolve(dict(spec.sim_params) | over), np.dtype(dtype))
    program.workspaces._spaces.clear()
    k = 19
    a, a_host = transposed_device_array(rng, (2, M, k), dtype)
    b, b_host = transposed_device_array(rng, (2, k, N), dtype)
    from numba import cuda

    c = cuda.to_device(np.full((2, M, N), np.nan, dtype=dtype))
    program.launch(a, b, c, dtype(1), dtype(0))
    want = np.matmul(a_host.astype(np.float64), b_host)
    scale = np.matmul(np.abs(a_host).astype(np.float64), np.abs(b_host))
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(c.copy_to_host() - want) <= 4 * k * eps * scale)
    assert not {"A", "B"} & {key[-1] for key in program.workspaces._spaces}  # no copies


def test_a_copy_is_recorded_once_for_the_debug_log(rng: np.random.Generator,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A user who asks why a call made an extra launch finds it in the ``tilegemm``
    logger's DEBUG records: the first copy of each operand for each reason, once."""
    import logging

    spec = registry.get("pipelined", "cuda")
    program = replace(spec.program(spec.resolve(dict(spec.sim_params)), np.dtype(np.float32)),
                      min_reuse=0, _noted=set())
    from numba import cuda

    a, _ = transposed_device_array(rng, (1, 9, 8), np.float32)
    b = cuda.to_device(rng.standard_normal((1, 8, 12)).astype(np.float32))
    with caplog.at_level(logging.DEBUG, logger="tilegemm"):
        for _ in range(2):
            c = cuda.device_array((1, 9, 12), np.float32)
            program.launch(a, b, c, np.float32(1), np.float32(0))
    records = [r.getMessage() for r in caplog.records if "copied into" in r.getMessage()]
    assert len(records) == 1, records
    assert "pipelined: A (laid out transposed, shape (1, 9, 8))" in records[0]


class CudaAPIError(Exception):
    """numba's driver error, as the allocation of a workspace raises it on a GPU whose
    memory is taken (numba-cuda's class of that name: ``code`` the driver's CUresult)."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(code, msg)
        self.code = code


@pytest.mark.parametrize("over", [{}, {"SPLIT_K": 2}], ids=["plain", "split"])
def test_no_memory_for_a_copy_reads_the_operands_as_they_lie(
        over: dict, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A copy is only for speed: where its workspace does not fit the device (the
    caller's CuPy or PyTorch pool may hold the memory), the product reads the transposed
    operands as they lie, right, with one WARNING per program; any other error of the
    allocation is raised as it was."""
    import logging

    from numba import cuda

    from tilegemm.kernels.cuda._kmajor import out_of_memory

    spec = registry.get("pipelined", "cuda")
    program = replace(spec.program(spec.resolve(dict(spec.sim_params) | over),
                                   np.dtype(np.float32)), min_reuse=0, _noted=set())
    calls = []
    get = program.workspaces.get  # split-K's partial sums still get theirs

    def no_room(shape: Any, dtype: Any, stream: Any, slot: str = "", *args: Any) -> Any:
        if slot not in ("A", "B"):
            return get(shape, dtype, stream, slot, *args)
        calls.append(slot)
        raise CudaAPIError(2, "Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(program.workspaces, "get", no_room)
    k = 13
    for _ in range(2):
        a, a_host = transposed_device_array(rng, (1, M, k), np.float32)
        b, b_host = transposed_device_array(rng, (1, k, N), np.float32)
        c = cuda.to_device(np.full((1, M, N), np.nan, dtype=np.float32))
        with caplog.at_level(logging.WARNING, logger="tilegemm"):
            program.launch(a, b, c, np.float32(1), np.float32(0))
        np.testing.assert_allclose(c.copy_to_host(), a_host @ b_host, rtol=1e-5, atol=1e-5)
    assert calls, "no copy was attempted"
    warned = [r for r in caplog.records if "no device memory" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert out_of_memory(MemoryError()) and not out_of_memory(CudaAPIError(1, "invalid"))

    def broken(shape: Any, dtype: Any, stream: Any, slot: str = "", *args: Any) -> Any:
        if slot not in ("A", "B"):
            return get(shape, dtype, stream, slot, *args)
        raise CudaAPIError(1, "CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(program.workspaces, "get", broken)
    with pytest.raises(CudaAPIError, match="INVALID_VALUE"):
        program.launch(a, b, c, np.float32(1), np.float32(0))
    rounding = replace(program, round_tf32=True)  # copies the result needs: never skipped
    monkeypatch.setattr(rounding.workspaces, "get", no_room)
    with pytest.raises(CudaAPIError, match="OUT_OF_MEMORY"):
        rounding.launch(a, b, c, np.float32(1), np.float32(0))
