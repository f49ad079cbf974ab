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
