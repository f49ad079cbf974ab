"""Rungs 6-9 (the CUDA-core rungs with 128-bit loads) on device operands laid out the
other way round: A M-major as in ``x.T @ y``, B K-major as in ``x @ w.T``. Such operands
are copied into the kernel's layout first (``_kmajor.RowMajorProgram``), rows padded to
16 bytes, and the kernel reads the copies with its vector loads even where K or N is not
a whole number of vectors. Without the copy every k-tile went element by element,
uncoalesced along the operand's rows.

On numba's simulator (``cudasim``), and on a GPU with ``TILEGEMM_GPU_TESTS=1``, where the
count of vector loads (a simulator hook) is skipped."""

from __future__ import annotations

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

    vector_reads: list[tuple[int, ...]] = []
    vload = _access._py_vload  # what the interior path's vload_at reads through

    def counted(arr: Any, idx: tuple[int, ...]) -> tuple[Any, ...]:
        vector_reads.append(tuple(arr.shape))
        return vload(arr, idx)

    monkeypatch.setattr(_access, "_py_vload", counted)
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
