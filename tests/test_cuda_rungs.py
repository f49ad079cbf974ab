"""Every CUDA rung in the registry, run on numba's CUDA simulator, against float64 NumPy.

The rungs come from ``tilegemm.kernels("cuda")``, so a rung added later is tested here
with no edit. The CUDA C rungs (``tilegemm.kernels("cudac")``) go through the same cases
on a real GPU only (``gpu`` marker: the simulator cannot run CUDA C), with the same small
parameters where they share the Numba rung's, else their defaults.

Each Numba rung runs with its ``sim_params`` (the smallest valid tiles): the
simulator runs one Python thread per CUDA thread, so shapes stay tiny but still break
tiling (partial tiles on every edge, primes, K=1, 1×K). Outputs are NaN-poisoned before
each launch (conftest), so an element a kernel skips fails the check.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilegemm
from conftest import HOSTILE_SHAPES
from tilegemm import launch
from tilegemm.reference import assert_close, random_operands
from tilegemm.registry import KernelSpec

pytestmark = pytest.mark.cudasim

# Tensor-core rungs compute at a reduced precision, only on request (precision=), and have
# their own tests with error bounds for it: tests/test_cuda_mma.py.
SPECS = [s for s in tilegemm.kernels("cuda") if not s.precisions]
CUDAC = tilegemm.kernels("cudac")
# Every rung these tests run: Numba rungs everywhere, CUDA C rungs only on a GPU.
RUNGS = [pytest.param(s, id=s.name) for s in SPECS] + [
    pytest.param(s, id=f"cudac-{s.name}", marks=pytest.mark.gpu) for s in CUDAC]
BIG = (33, 17, 65)  # the slowest hostile shape on the simulator: float32 only


def _sim(spec: KernelSpec) -> dict[str, int]:
    if spec.backend == "cudac":  # the Numba rung's small parameters, where it has them
        numba = {s.name: s for s in SPECS}.get(spec.name)
        small = dict(numba.sim_params or {}) if numba else {}
        return small if small and spec.is_valid(small) else {}
    return dict(spec.sim_params or {})


def _mm(spec: KernelSpec, a: Any, b: Any, **params: Any) -> Any:
    return tilegemm.matmul(a, b, backend=spec.backend, kernel=spec.name,
                           **(params or _sim(spec)))


def _cases() -> list[Any]:
    cases = []
    for spec in SPECS + CUDAC:
        prefix, marks = ("cudac-", pytest.mark.gpu) if spec.backend == "cudac" else ("", ())
        for shape in HOSTILE_SHAPES:
            for dtype in ("float32", "float64", "int32"):
                if not spec.supports(dtype) or (shape == BIG and dtype != "float32"):
                    continue
                cases.append(pytest.param(
                    spec, shape, dtype, marks=marks,
                    id=f"{prefix}{spec.name}-{dtype}-{'x'.join(map(str, shape))}"))
    return cases


def test_every_rung_has_sim_params() -> None:
    for spec in SPECS:
        params = spec.resolve(_sim(spec))  # valid, and small enough for the simulator
        assert spec.threads is not None and spec.threads(params) <= 64, spec.name


@pytest.mark.parametrize(("spec", "shape", "dtype"), _cases())
def test_hostile_shapes(spec: KernelSpec, shape: tuple[int, int, int], dtype: str) -> None:
    m, n, k = shape
    a, b = random_operands((m, k), (k, n), dtype)
    r = _mm(spec, a, b)
    assert r.dtype == np.dtype(dtype)
    assert_close(r, a, b, what=f"{spec.name} {dtype} {shape}")


def _written_out_fmas(spec: KernelSpec, params: dict[str, int]) -> int:
    """FMAs one thread has per k-tile (its BM·BN share times BK): what the rungs that write
    their k steps out at build time (6-9) turn into straight-line code, so what their
    compile time grows with. 0 for rungs without a BM×BN×BK block tile."""
    if not {"BM", "BN", "BK"} <= params.keys() or not spec.threads:
        return 0
    return params["BM"] * params["BN"] // spec.threads(params) * params["BK"]


def _other_params(spec: KernelSpec) -> list[dict[str, int]]:
    """Two more valid parameter sets that the simulator can afford (<= 64 threads): the
    one with the fewest threads and the last by name, so rectangular tiles, R = TILE,
    several loads per thread... get exercised without a hand-kept list.

    Only sets whose written-out code is no larger than the defaults' are candidates: the
    last by name among all of them is a 64-thread tile with 256-512 outputs per thread and
    BK=32, 8,192-16,384 FMA statements per k-tile, which took more than a minute per rung
    to compile on a GPU machine (the simulator compiles nothing, so only a GPU run pays)."""
    budget = _written_out_fmas(spec, spec.resolve({}))
    small = [p for p in spec.space() if spec.threads(p) <= 64 and p != spec.resolve(_sim(spec))
             and _written_out_fmas(spec, p) <= budget]
    small.sort(key=lambda p: (spec.threads(p), sorted(p.items())))
    return [small[0], small[-1]] if len(small) > 1 else small


@pytest.mark.parametrize("spec", RUNGS)
def test_other_parameters(spec: KernelSpec) -> None:
    a, b = random_operands((2, 19, 11), (11, 23), "float32")
    for params in _other_params(spec):
        assert_close(_mm(spec, a, b, **params), a, b, what=f"{spec.name} {params}")


@pytest.mark.parametrize("spec", RUNGS)
def test_batched_and_broadcast(spec: KernelSpec) -> None:
    a, b = random_operands((3, 7, 5), (5, 6), "float32")
    assert_close(_mm(spec, a, b), a, b, what="batch @ matrix")
    a, b = random_operands((2, 1, 7, 5), (3, 5, 4), "float64")
    r = _mm(spec, a, b)
    assert r.shape == (2, 3, 7, 4)
    assert_close(r, a, b, what="broadcast batch")


@pytest.mark.parametrize("spec", RUNGS)
def test_vectors(spec: KernelSpec) -> None:
    v, m = random_operands((9,), (9, 5), "float32")
    assert_close(_mm(spec, v, m), v, m, what="vector @ matrix")
    m, v = random_operands((6, 9), (9,), "float32")
    assert_close(_mm(spec, m, v), m, v, what="matrix @ vector")
    u, v = random_operands((9,), (9,), "float32")
    r = _mm(spec, u, v)
    assert np.ndim(r) == 0
    assert_close(r, u, v, what="vector @ vector")


@pytest.mark.parametrize("spec", RUNGS)
def test_gemm_alpha_beta(spec: KernelSpec) -> None:
    a, b = random_operands((9, 5), (5, 10), "float32")
    c, _ = random_operands((9, 10), (1,), "float32")
    r = tilegemm.gemm(a, b, c, alpha=1.5, beta=-0.5, backend=spec.backend, kernel=spec.name,
                      **_sim(spec))
    assert_close(r, a, b, alpha=1.5, beta=-0.5, c=c, what="alpha*A@B + beta*C")
    row = c[:1]  # c broadcasts to the result
    r = tilegemm.gemm(a, b, row, alpha=-2.0, beta=3.0, backend=spec.backend, kernel=spec.name,
                      **_sim(spec))
    assert_close(r, a, b, alpha=-2.0, beta=3.0, c=row, what="broadcast c")
    # beta == 0: c is not read, so NaN in it must not reach the result
    nan_c = np.full((9, 10), np.nan, np.float32)
    r = tilegemm.gemm(a, b, nan_c, alpha=2.0, beta=0.0, backend=spec.backend, kernel=spec.name,
                      **_sim(spec))
    assert np.all(np.isfinite(r))
    assert_close(r, a, b, alpha=2.0, what="beta=0 ignores c")


@pytest.mark.parametrize("spec", RUNGS)
def test_integer_gemm_exact(spec: KernelSpec) -> None:
    if not spec.supports("int32"):
        pytest.skip(f"{spec.name} has no integer support")
    a, b = random_operands((7, 6), (6, 9), "int32")
    c, _ = random_operands((7, 9), (1,), "int32")
    r = tilegemm.gemm(a, b, c, alpha=3, beta=-2, backend=spec.backend, kernel=spec.name,
                      **_sim(spec))
    assert r.dtype == np.int32
    assert_close(r, a, b, alpha=3, beta=-2, c=c, what="int32 gemm")


@pytest.mark.parametrize("spec", RUNGS)
def test_fortran_and_strided_inputs(spec: KernelSpec) -> None:
    a, b = random_operands((9, 11), (11, 10), "float32")
    fa, fb = np.asfortranarray(a), np.asfortranarray(b)
    assert_close(_mm(spec, fa, fb), a, b, what="Fortran-ordered")
    big_a, big_b = random_operands((20, 33), (23, 30), "float64")
    sa, sb = big_a[::2, ::3], big_b[1::2, ::3]  # (10, 11) @ (11, 10), non-unit strides
    assert_close(_mm(spec, sa, sb), sa, sb, what="strided views")
    assert_close(_mm(spec, sb.T, sa.T), sb.T, sa.T, what="transposed views")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0
@pytest.mark.parametrize("spec", RUNGS)
def test_nan_inf_propagate_like_numpy(spec: KernelSpec) -> None:
    a, b = random_operands((9, 7), (7, 10), "float32")
    a[1, 2] = np.nan
    b[0, 3] = np.inf
    a[4, 0] = -np.inf
    r = _mm(spec, a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.array_equal(np.isnan(r), np.isnan(ref))
    assert np.array_equal(np.isposinf(r), np.isposinf(ref))
    assert np.array_equal(np.isneginf(r), np.isneginf(ref))
    assert_close(r, a, b, what="NaN/Inf")


@pytest.mark.parametrize("spec", RUNGS)
def test_empty_dimensions(spec: KernelSpec) -> None:
    for (m, n, k) in [(0, 5, 3), (4, 0, 3), (4, 5, 0)]:
        a, b = random_operands((m, k), (k, n), "float32")
        r = _mm(spec, a, b)
        assert r.shape == (m, n)
        assert np.array_equal(r, np.zeros((m, n), np.float32))
    a, b = random_operands((4, 0), (0, 5), "float32")
    c, _ = random_operands((4, 5), (1,), "float32")
    r = tilegemm.gemm(a, b, c, alpha=2.0, beta=0.5, backend=spec.backend, kernel=spec.name,
                      **_sim(spec))
    assert_close(r, a, b, alpha=2.0, beta=0.5, c=c, what="K=0 gives beta*C")


@pytest.mark.parametrize("spec", RUNGS)
def test_grid_stride_loops(spec: KernelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """With at most 2 blocks per grid dimension, every block must stride over several
    tiles (and batches) in x, y and z; the result must not change."""
    a, b = random_operands((3, 33, 3), (3, 3, 33), "float32")
    program = spec.program(spec.resolve(_sim(spec)), np.dtype("float32"))
    full = program.grid(3, 33, 33)
    # Some rungs use fewer grid dimensions (pipelined: one over all tiles, grouped) or
    # tiles too large for 3 blocks in y at this size: stride wherever the grid spans >= 3.
    assert full[0] >= 3 and full[2] >= 3, f"shape too small to need striding: grid {full}"
    monkeypatch.setattr(launch, "MAX_GRID_X", 2)
    monkeypatch.setattr(launch, "MAX_GRID_YZ", 2)
    assert program.grid(3, 33, 33) == tuple(min(g, 2) for g in full)
    assert_close(_mm(spec, a, b), a, b, what="grid-stride")
