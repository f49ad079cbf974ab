"""The copies rung wgmma makes before its kernel (``kernels/cuda/_kmajor.py``): B transposed
into a K-major workspace, or copied as it is, TF32-rounded on request; and which B is read
in place. Under the simulator (``cudasim``), and on a GPU with ``TILEGEMM_GPU_TESTS=1``."""

from __future__ import annotations

import numpy as np
import pytest

from tilegemm.kernels.cuda._tensorcore import tf32_round


def _run(x: np.ndarray, tf32: bool, transpose: bool, work_shape: tuple[int, ...]) -> np.ndarray:
    from numba import cuda

    from tilegemm.kernels.cuda._kmajor import ROWS, TILE, copy_kernel

    batch, rows, cols = x.shape
    w = cuda.to_device(np.full(work_shape, np.nan, dtype=x.dtype))
    grid = ((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE, batch)
    copy_kernel(x.dtype.name, tf32, transpose)[grid, (TILE, ROWS)](cuda.to_device(x), w)
    return w.copy_to_host()


@pytest.mark.cudasim
@pytest.mark.parametrize("tf32", [False, True])
def test_transpose_leaves_the_padding_and_rounds_on_request(tf32: bool,
                                                            rng: np.random.Generator) -> None:
    """Partial tiles on both edges and a batch of 2: every value lands transposed (rounded
    to TF32 when asked), and the columns past K (K = 37, rows padded to 40) stay as they
    were."""
    from tilegemm.kernels.cuda._kmajor import kmajor_shape

    x = rng.standard_normal((2, 37, 45)).astype(np.float32)
    shape = kmajor_shape(x.shape, 4)
    assert shape == (2, 45, 40)
    w = _run(x, tf32, True, shape)
    want = x.transpose(0, 2, 1)
    np.testing.assert_array_equal(w[:, :, :37], tf32_round(want) if tf32 else want)
    assert np.isnan(w[:, :, 37:]).all()


@pytest.mark.cudasim
@pytest.mark.simulator
def test_the_gpus_blocks_of_eight_rows_a_thread_copy_the_same(rng: np.random.Generator,
                                                              monkeypatch) -> None:
    """The simulator runs the copies in blocks of one warp, each thread taking every row
    of its column (``ROWS``: fewer Python threads); a GPU's blocks are (32, 8), a thread
    taking every eighth row. The same kernel with the GPU's blocks, simulated, transposes,
    plain-copies and rounds the same."""
    from tilegemm.kernels.cuda import _kmajor

    assert _kmajor.ROWS == 1
    monkeypatch.setattr(_kmajor, "ROWS", 8)  # read by the simulated kernel as it runs
    x = rng.standard_normal((2, 37, 45)).astype(np.float32)
    w = _run(x, True, True, _kmajor.kmajor_shape(x.shape, 4))
    np.testing.assert_array_equal(w[:, :, :37], tf32_round(x.transpose(0, 2, 1)))
    assert np.isnan(w[:, :, 37:]).all()
    np.testing.assert_array_equal(_run(x, False, False, x.shape), x)


@pytest.mark.cudasim
def test_plain_copy_rounds_and_16bit_transposes_exactly(rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 33, 70)).astype(np.float32)
    np.testing.assert_array_equal(_run(x, True, False, x.shape), tf32_round(x))
    h = rng.standard_normal((1, 33, 70)).astype(np.float16)
    w = _run(h, False, True, (1, 70, 40))
    np.testing.assert_array_equal(w[:, :, :33], h.transpose(0, 2, 1))


@pytest.mark.cudasim
@pytest.mark.simulator
def test_which_b_is_read_in_place() -> None:
    """A view for B with K contiguous and rows and start on 16 bytes; None otherwise."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    from tilegemm.kernels.cuda._kmajor import kmajor_view

    bt = np.zeros((1, 24, 16), np.float32)  # (batch, N, K), C-ordered
    view = kmajor_view(FakeCUDAArray(bt.transpose(0, 2, 1)))  # B = (batch, K, N)
    assert view is not None and tuple(view.shape) == (1, 24, 16)
    assert kmajor_view(FakeCUDAArray(np.zeros((1, 16, 24), np.float32))) is None  # N-major
    odd = np.zeros((1, 24, 13), np.float32)  # rows of 52 bytes
    assert kmajor_view(FakeCUDAArray(odd.transpose(0, 2, 1))) is None


def _run_pair(xs: tuple[np.ndarray, np.ndarray], transposes: tuple[bool, bool],
              tf32: bool) -> list[np.ndarray]:
    from numba import cuda

    from tilegemm.kernels.cuda._kmajor import ROWS, TILE, _grid, copy_pair_kernel, kmajor_shape

    shapes = [kmajor_shape(x.shape, x.dtype.itemsize) if t else x.shape
              for x, t in zip(xs, transposes, strict=True)]
    ws = [cuda.to_device(np.full(s, np.nan, dtype=x.dtype)) for x, s in zip(xs, shapes,
                                                                            strict=True)]
    kernel = copy_pair_kernel(xs[0].dtype.name, tf32, *transposes)
    kernel[_grid(xs[0].shape, xs[1].shape), (TILE, ROWS)](
        cuda.to_device(xs[0]), ws[0], cuda.to_device(xs[1]), ws[1])
    return [w.copy_to_host() for w in ws]


@pytest.mark.cudasim
@pytest.mark.parametrize("transposes", [(False, True), (True, False), (False, False)])
def test_two_copies_in_one_launch(transposes: tuple[bool, bool],
                                  rng: np.random.Generator) -> None:
    """One launch copies both operands of a TF32 product: the first operand's columns of
    blocks, then the second's. The two differ in every extent (batch 1 and 3, 37 and 70
    rows, 45 and 9 columns), so each side's grid is larger than its own copy needs in
    some direction: every value lands once (rounded, transposed where asked), and padding
    past K stays as it was."""
    x1 = rng.standard_normal((1, 37, 45)).astype(np.float32)
    x2 = rng.standard_normal((3, 70, 9)).astype(np.float32)
    for xs, ts in (((x1, x2), transposes), ((x2, x1), transposes[::-1])):
        works = _run_pair(xs, ts, True)
        for x, t, w in zip(xs, ts, works, strict=True):
            want = tf32_round(x.transpose(0, 2, 1) if t else x)
            np.testing.assert_array_equal(w[:, :, : want.shape[2]], want)
            assert np.isnan(w[:, :, want.shape[2]:]).all()


@pytest.mark.cudasim
@pytest.mark.parametrize(("kernel", "params"), [("mma", {"RCOPY": 1}), ("wgmma", {})])
def test_a_tf32_product_copies_both_operands_in_one_launch(
        kernel: str, params: dict[str, int], rng: np.random.Generator,
        count_calls) -> None:  # noqa: ANN001
    """Rung mma with RCOPY=1 and rung wgmma round A and B to TF32 by copies before the
    kernel: one launch makes both (each launch costs the host tens of microseconds), the
    driver is asked for the current device once for both workspaces, and the product is
    still right at partial tiles with a broadcast B."""
    import tilegemm
    from tilegemm import registry, simulator
    from tilegemm.kernels.cuda import _kmajor, _workspace

    if kernel == "wgmma" and not simulator.enabled():
        from numba import cuda

        if tuple(cuda.get_current_device().compute_capability) != (9, 0):
            pytest.skip("wgmma needs an sm_90 GPU (H100, H200, GH200)")
    spec = registry.get(kernel, "cuda")
    sim = {k: v for k, v in spec.sim_params.items() if k != "PASSES"} | params
    launches = count_calls(_kmajor, "launch_kernel")
    asks = count_calls(_kmajor, "device_key"), count_calls(_workspace, "device_key")
    a = rng.standard_normal((2, 20, 12)).astype(np.float32)
    b = rng.standard_normal((12, 9)).astype(np.float32)
    r = tilegemm.matmul(a, b, backend="cuda", kernel=kernel, precision="tf32", **sim)
    assert len(launches) == 1
    assert [len(n) for n in asks] == [1, 0]  # the device asked for once, for both copies
    want = np.matmul(tf32_round(a).astype(np.float64), tf32_round(b))
    assert np.max(np.abs(r - want)) <= 4 * 12 * 2.0**-24 * np.max(np.abs(want)) + 1e-6


@pytest.mark.ptx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_one_launch_costs_no_more_code_than_two(arch: str) -> None:
    """The pair's machine code is the two copies' side by side: no more instructions than
    the single copies together (a few for choosing the side), no local memory, and the
    single copies unchanged by sharing their body with it (376 and 392 instructions of
    TF32 transpose and plain copy on sm_90 with CUDA 13.5)."""
    from numba import cuda, types

    from tilegemm.analysis import sass
    from tilegemm.kernels.cuda._kmajor import copy_kernel, copy_pair_kernel

    try:
        sass.nvdisasm_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    strided, dense = types.Array(types.float32, 3, "A"), types.Array(types.float32, 3, "C")

    def ops(dispatcher: object, sig: tuple) -> list[str]:
        ptx, _ = cuda.compile_ptx(dispatcher.py_func, sig, cc=(int(arch[3]), int(arch[4])))
        return [i.op for i in sass.parse_sass(sass.disassemble(sass.link_cubin(ptx, arch)))]

    single = [ops(copy_kernel("float32", True, t), (strided, dense)) for t in (False, True)]
    pair = ops(copy_pair_kernel("float32", True, False, True),
               (strided, dense, strided, dense))
    assert len(pair) <= len(single[0]) + len(single[1]) + 16, (len(pair), len(single[0]),
                                                               len(single[1]))
    for code in (*single, pair):
        assert "LDL" not in code and "STL" not in code
    if sass.toolchain() == {"nvdisasm": "13.5.37", "nvvm": "13.5.37"} and arch == "sm_90":
        assert (len(single[0]), len(single[1])) == (392, 376)
