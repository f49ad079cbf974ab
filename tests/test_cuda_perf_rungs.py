"""The fast CUDA rungs (vectorized, smem_layout, warptile, pipelined) on numba's simulator.

Shapes are chosen for these rungs' two load paths: K and N multiples of 4 take the 128-bit
path (the simulator runs the same kernel with element accesses in place of the single
vector instruction), odd K or N take the scalar path; partial tiles on every edge, K
shorter than one tile and primes everywhere else. The generic ladder test
(tests/test_cuda_rungs.py) covers these rungs too once both branches are merged.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm import registry
from tilegemm.reference import assert_close, random_operands

pytestmark = pytest.mark.cudasim

RUNGS = ("vectorized", "smem_layout", "warptile", "pipelined")

# (M, N, K): vector path for A and B, scalar for both, mixed, K below one tile, 1×1×1.
SHAPES = [
    (1, 1, 1),
    (17, 20, 12),  # K % 4 == 0 and N % 4 == 0: 128-bit path, partial tiles in M and N
    (13, 7, 5),  # odd N and K: scalar path everywhere
    (9, 24, 7),  # scalar A (K odd), vector B and C (N % 4 == 0)
    (20, 9, 36),  # vector A, scalar B and C; several k-tiles
]


def _available(name: str) -> bool:
    return any(s.name == name for s in registry.specs_for("cuda"))


def _sim(name: str) -> tuple[registry.KernelSpec, dict[str, int]]:
    if not _available(name):
        pytest.skip(f"rung {name} not registered")
    spec = registry.get(name, "cuda")
    return spec, spec.resolve(spec.sim_params)


@pytest.mark.parametrize("name", RUNGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float32_shapes(name: str, shape: tuple[int, int, int]) -> None:
    spec, params = _sim(name)
    m, n, k = shape
    a, b = random_operands((m, k), (k, n), np.float32)
    c = tilegemm.matmul(a, b, kernel=name, backend="cuda", **params)
    assert_close(c, a, b, what=f"{name} {shape}")


@pytest.mark.parametrize("name", RUNGS)
def test_float64_batched_alpha_beta(name: str) -> None:
    """float64 (2-element vectors), A shared by the batch, beta != 0 reads C; interior
    blocks over several k-tiles (float64 stages tiles differently in pipelined) and edges."""
    spec, params = _sim(name)
    rng = np.random.default_rng()
    a, b = random_operands((1, 37, 26), (2, 26, 34), np.float64)
    c0 = rng.uniform(-1, 1, size=(2, 37, 34))
    out = tilegemm.gemm(a, b, c0, alpha=-1.5, beta=0.5, kernel=name, backend="cuda", **params)
    assert_close(out, a, b, alpha=-1.5, beta=0.5, c=c0, what=f"{name} float64 batched")


@pytest.mark.parametrize("name", RUNGS)
def test_vector_path_beta_and_strided_b(name: str) -> None:
    """beta != 0 on the vector path, and a transposed (strided) operand on the device."""
    spec, params = _sim(name)
    rng = np.random.default_rng()
    a, b = random_operands((2, 9, 8), (2, 8, 12), np.float32)
    c0 = rng.uniform(-1, 1, size=(2, 9, 12)).astype(np.float32)
    out = tilegemm.gemm(a, b, c0, alpha=2.0, beta=-1.0, kernel=name, backend="cuda", **params)
    assert_close(out, a, b, alpha=2.0, beta=-1.0, c=c0, what=f"{name} beta")
    bt = np.ascontiguousarray(b[0].T)  # (12, 8): trans_b makes a strided host view
    out = tilegemm.gemm(a[0], bt, trans_b=True, kernel=name, backend="cuda", **params)
    assert_close(out, a[0], bt, trans_b=True, what=f"{name} trans_b")


def _launch(program, a: np.ndarray, b: np.ndarray, m: int, n: int) -> np.ndarray:
    from numba import cuda

    batch = max(a.shape[0], b.shape[0])
    c = cuda.to_device(np.full((batch, m, n), np.nan, dtype=a.dtype))
    program.launch(cuda.to_device(a), cuda.to_device(b), c, a.dtype.type(1), a.dtype.type(0))
    return c.copy_to_host()


@pytest.mark.parametrize("name", RUNGS)
def test_one_block_strides_over_every_tile(name: str) -> None:
    """A grid of one block must still cover every tile and batch (grid-stride loops)."""
    import dataclasses

    spec, params = _sim(name)
    program = dataclasses.replace(spec.build(params, np.dtype(np.float32)),
                                  grid=lambda batch, m, n: (1, 1, 1))
    a, b = random_operands((2, 37, 12), (2, 12, 35), np.float32)
    assert_close(_launch(program, a, b, 37, 35), a, b, what=f"{name} one block")


def test_pipelined_grouped_order_covers_partial_groups() -> None:
    """3 tile rows in groups of GROUP_M=2 (one partial group) × 3 tile columns."""
    spec, params = _sim("pipelined")
    m, n, k = 3 * params["BM"] - 5, 3 * params["BN"] - 3, 3 * params["BK"] + 4
    a, b = random_operands((m, k), (k, n), np.float32)
    c = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda", **params)
    assert_close(c, a, b, what="pipelined grouped")


@pytest.mark.simulator  # counts calls of the Python stand-in for the vector load
@pytest.mark.parametrize("name", RUNGS)
@pytest.mark.parametrize(("k", "n", "vector_a", "vector_b"),
                         [(12, 20, True, True), (13, 20, False, True), (12, 19, True, False)])
def test_vector_path_taken_exactly_when_aligned(
    name: str, k: int, n: int, vector_a: bool, vector_b: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Count the simulator's stand-in vector loads per operand (by index, or at an offset as
    rung 9's stages load): the 128-bit path must run when K (for A) or N (for B) is a
    multiple of 4, and never otherwise."""
    import importlib

    from tilegemm.kernels.cuda import _access

    spec, params = _sim(name)
    module = importlib.import_module(spec.build.__module__)
    loads: list[int] = []
    real = _access.access_ops()

    def counting_vload(arr, idx):  # noqa: ANN001, ANN202
        loads.append(arr.shape[len(arr.shape) - 1])  # the simulator refuses shape[-1]
        return real.vload(arr, idx)

    monkeypatch.setattr(module, "access_ops", lambda: real._replace(vload=counting_vload))
    if hasattr(module, "vload_at"):
        real_at = _access.vload_at()

        def counting_vload_at(arr, idx, off):  # noqa: ANN001, ANN202
            loads.append(arr.shape[len(arr.shape) - 1])
            return real_at(arr, idx, off)

        monkeypatch.setattr(module, "vload_at", lambda: counting_vload_at)
    a, b = random_operands((1, 9, k), (1, k, n), np.float32)
    assert_close(_launch(spec.build(params, np.dtype(np.float32)), a, b, 9, n), a, b)
    assert (k in loads) == vector_a  # global A rows have length K
    assert (n in loads) == vector_b  # global B and C rows have length N


@pytest.mark.simulator  # counts calls of the Python stand-in for the interior-path load
@pytest.mark.parametrize("name", RUNGS)
def test_interior_path_offsets(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks wholly inside A, B and C take the interior path: global loads at an element
    offset kept per thread and bumped per k-tile. The simulator's stand-in checks every
    offset against the index it stands for, so a wrong stride or bump fails here: several
    tiles in M, N and K, a batch with B broadcast, A a strided view (row stride 2K)."""
    import importlib

    spec, params = _sim(name)
    module = importlib.import_module(spec.build.__module__)
    calls: list[int] = []
    if hasattr(module, "vload_at"):
        real = module.vload_at()

        def counting(arr, idx, off):  # noqa: ANN001, ANN202
            calls.append(1)
            return real(arr, idx, off)

        monkeypatch.setattr(module, "vload_at", lambda: counting)
    m, n, k = 2 * params["BM"], 2 * params["BN"], 3 * params["BK"]
    wide, b = random_operands((2, m, 2 * k), (1, k, n), np.float32)
    a = wide[:, :, :k]  # row stride 2K elements, still 16-byte multiples
    c, _ = random_operands((2, m, n), (1,), np.float32)
    from numba import cuda

    d_out = cuda.to_device(c)
    prog = spec.build(params, np.dtype(np.float32))
    prog.launch(cuda.to_device(wide)[:, :, :k], cuda.to_device(b), d_out, np.float32(1.5),
                np.float32(0.5))
    out = d_out.copy_to_host()
    assert_close(out, a, b, alpha=1.5, beta=0.5, c=c, what=f"{name} interior path")
    if hasattr(module, "vload_at"):
        assert calls, "the interior path never ran"
