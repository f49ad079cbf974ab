"""Rung pipelined's SHIFT_EDGES=1 on numba's simulator: tiles that would cross the bottom
or right edge of C start a whole tile back from it, overlap their neighbours and take the
interior path. The overlapped outputs are computed twice and written twice; every output
starts as NaN, so an element nobody writes, or one written with a different value by the
overlapping block, fails the comparison with float64 NumPy."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import tilegemm
from tilegemm import registry
from tilegemm.reference import assert_close, random_operands

pytestmark = [pytest.mark.cudasim, pytest.mark.simulator]


def _spec() -> tuple[registry.KernelSpec, dict[str, int]]:
    spec = registry.get("pipelined", "cuda")
    return spec, spec.resolve(spec.sim_params)


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the global loads of the next build of the rung: 128-bit vectors (interior
    path, and the edge path's vectors that lie inside) and single elements (edge path)."""
    module = importlib.import_module(registry.get("pipelined", "cuda").build.__module__)
    counts = {"vectors": 0, "elements": 0}

    def counting(kind: str, real):  # noqa: ANN001, ANN202
        def load(arr, idx, off):  # noqa: ANN001, ANN202
            counts[kind] += 1
            return real(arr, idx, off)
        return load

    vectors, elements = counting("vectors", module.vload_at()), counting(
        "elements", module.load_at())
    monkeypatch.setattr(module, "vload_at", lambda: vectors)
    monkeypatch.setattr(module, "load_at", lambda: elements)
    return counts


def _run(params: dict[str, int], a: np.ndarray, b: np.ndarray, beta: float = 0.0,
         c: np.ndarray | None = None) -> np.ndarray:
    from numba import cuda

    spec, _ = _spec()
    m, n = a.shape[-2], b.shape[-1]
    batch = max(a.shape[0], b.shape[0])
    out = np.full((batch, m, n), np.nan, a.dtype) if c is None else c.copy()
    d_out = cuda.to_device(out)
    spec.build(params, a.dtype).launch(cuda.to_device(a), cuda.to_device(b), d_out,
                                       a.dtype.type(1.5), a.dtype.type(beta))
    return d_out.copy_to_host()


@pytest.mark.parametrize("shift", [0, 1])
def test_shifted_edge_tiles_take_the_interior_path(shift: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Partial tiles in M and N (K whole k-tiles, N a multiple of 4): with the shift every
    block loads its whole tiles as vectors, none element by element; without it the edge
    blocks skip what lies outside (the control)."""
    spec, params = _spec()
    params = {**params, "SHIFT_EDGES": shift}
    bm, bn, bk, w = params["BM"], params["BN"], params["BK"], 4
    m, n, k, batch = 2 * bm + 5, 2 * bn + 4, 3 * bk, 2
    a, b = random_operands((batch, m, k), (1, k, n), np.float32)
    loads = _count_loads(monkeypatch)
    c = _run(params, a, b)
    assert_close(c, a, b, alpha=1.5, what=f"SHIFT_EDGES={shift}")
    whole = batch * 3 * 3 * (k // bk) * (bm * bk + bk * bn) // w  # 3 x 3 tiles a product
    assert loads["elements"] == 0
    assert (loads["vectors"] == whole) == bool(shift), (loads, whole)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "n", "k"), [
    (37, 20, 16),  # both edges shift
    (37, 18, 13),  # N not a multiple of 4 (float32): rows shift, columns keep their checks
    (9, 20, 8),    # M below one tile: no row shift
    (32, 16, 5),   # exactly one tile, K below one k-tile
    (70, 36, 24),  # several tiles each way and a partial one
])
def test_shifted_edges_are_correct(dtype: type, m: int, n: int, k: int) -> None:
    spec, params = _spec()
    a, b = random_operands((m, k), (k, n), dtype)
    c = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda",
                        **{**params, "SHIFT_EDGES": 1})
    assert_close(c, a, b, what=f"shifted {m}x{n}x{k} {np.dtype(dtype).name}")


def test_columns_shift_only_onto_a_vector_boundary() -> None:
    """N = 2 * BN + 2 with B's and C's rows padded to whole vectors: both take the vector
    path, and a right-edge tile started at N - BN would read and write vectors off their
    16-byte boundary (a fault on a GPU, an error of the simulator's vector stand-ins).
    Columns keep their checks; rows still shift."""
    from numba import cuda

    spec, params = _spec()
    m, n, k = params["BM"] + 7, 2 * params["BN"] + 2, 2 * params["BK"]
    padded = n + 2  # rows of 16-byte multiples in float32
    a, b_wide = random_operands((1, m, k), (1, k, padded), np.float32)
    b = b_wide[:, :, :n]
    d_c = cuda.to_device(np.full((1, m, padded), np.nan, np.float32))
    spec.build({**params, "SHIFT_EDGES": 1}, np.dtype(np.float32)).launch(
        cuda.to_device(a), cuda.to_device(b_wide)[:, :, :n], d_c[:, :, :n],
        np.float32(1), np.float32(0))
    c = d_c.copy_to_host()
    assert_close(c[:, :, :n], a, b, what="shifted rows, checked columns")
    assert np.isnan(c[:, :, n:]).all()  # the padding is not written


def test_beta_keeps_the_checked_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """beta != 0 reads C, which an overlapping neighbour may already have written: no
    shift then, the edge blocks skip what lies outside and the result is right."""
    spec, params = _spec()
    params = {**params, "SHIFT_EDGES": 1}
    m, n, k = params["BM"] + 5, params["BN"] + 4, 2 * params["BK"]
    a, b = random_operands((1, m, k), (1, k, n), np.float32)
    c0 = np.random.default_rng().uniform(-1, 1, (1, m, n)).astype(np.float32)
    loads = _count_loads(monkeypatch)
    out = _run(params, a, b, beta=-0.5, c=c0)
    assert_close(out, a, b, alpha=1.5, beta=-0.5, c=c0, what="beta with SHIFT_EDGES=1")
    whole = 2 * 2 * (k // params["BK"]) * (params["BM"] + params["BN"]) * params["BK"] // 4
    assert loads["vectors"] < whole, (loads, whole)


def test_split_k_with_shifted_edges() -> None:
    """Split-K writes its slices with beta = 0 into a workspace, so the shift applies
    there; the sum of the slices must still be every element's."""
    spec, params = _spec()
    m, n, k = 2 * params["BM"] + 3, params["BN"] + 8, 5 * params["BK"] + 3
    a, b = random_operands((2, m, k), (2, k, n), np.float32)
    c = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda",
                        **{**params, "SHIFT_EDGES": 1, "SPLIT_K": 2})
    assert_close(c, a, b, what="split-K, shifted edges")
