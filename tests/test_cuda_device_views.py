"""How the CUDA backend views numba device operands, checked with real DeviceNDArray objects
and no GPU.

On a GPU these paths use numba-cuda's ``DeviceNDArray`` (reshape, transpose, strided views),
which behaves differently from the simulator's NumPy-backed stand-in, so simulator tests
cannot catch its mistakes. A ``DeviceNDArray`` can be built without a driver around a
``MemoryPointer`` to any address; here that address is a host NumPy buffer's, so the view
the backend hands the kernel (pointer, shape, byte strides) can be read back with NumPy and
compared with what the host path computes for the same operand.
"""

from __future__ import annotations

import numpy as np
import pytest

from tilegemm.backends.cuda import CudaBackend
from tilegemm.problem import describe, host_operand_3d, make_problem

pytestmark = pytest.mark.skipif(
    __import__("os").environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0"),
    reason="real DeviceNDArray objects; the simulator replaces them",
)


def _device(host: np.ndarray):  # type: ignore[no-untyped-def]
    """A DeviceNDArray whose 'device' pointer is ``host``'s buffer (never dereferenced)."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import MemoryPointer, binding

    ptr = MemoryPointer(None, binding.CUdeviceptr(host.ctypes.data), size=host.nbytes)
    return DeviceNDArray(host.shape, host.strides, host.dtype, gpu_data=ptr)


def _read_back(view, host: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The elements ``view`` addresses, read with NumPy from the buffer ``host`` lives in."""
    root = host
    while isinstance(root.base, np.ndarray):
        root = root.base
    flat = root.ravel(order="K")  # the whole buffer in memory order (a view: root owns it)
    assert np.shares_memory(flat, root)
    offset = int(view.device_ctypes_pointer.value) - flat.ctypes.data
    return np.ndarray(view.shape, host.dtype, buffer=flat, offset=offset, strides=view.strides)


def _operand_3d(a, b, which: str, **kw):  # type: ignore[no-untyped-def]
    prob = make_problem(describe(a, "a"), describe(b, "b"), **kw)
    op = describe(a if which == "a" else b, which)
    return CudaBackend()._device_operand(op, prob, which), prob


def test_transposed_2d_operand_is_a_view_not_a_transpose_kernel() -> None:
    """numba's DeviceNDArray.T launches a transpose kernel that it defines (so compiles)
    anew on every call; without a GPU that call raises, so this failed before the fix."""
    rng = np.random.default_rng()
    at = rng.uniform(-1, 1, (7, 5)).astype(np.float32)  # op(A) = at.T: M=5, K=7
    b = rng.uniform(-1, 1, (7, 3)).astype(np.float32)
    view, prob = _operand_3d(_device(at), b, "a", trans_a=True)
    assert view.shape == (1, 5, 7)
    np.testing.assert_array_equal(_read_back(view, at), host_operand_3d(at, prob, "a"))


@pytest.mark.parametrize("lead", [(1, 1), (2, 3)])
def test_fortran_ordered_batches_are_viewed_right_or_refused(lead: tuple[int, ...]) -> None:
    """numba's reshape gives an F-contiguous array C-order strides: a Fortran-ordered
    (2, 3, M, K) operand was read as the wrong elements on a GPU (the simulator copies)."""
    rng = np.random.default_rng()
    a = np.asfortranarray(rng.uniform(-1, 1, lead + (4, 5)))
    b = rng.uniform(-1, 1, lead + (5, 2))
    if lead == (1, 1):  # dropping unit axes needs no copy
        view, prob = _operand_3d(_device(a), b, "a")
        assert view.shape == (1, 4, 5)
        np.testing.assert_array_equal(_read_back(view, a), host_operand_3d(a, prob, "a"))
    else:
        with pytest.raises(ValueError, match="without a copy"):
            _operand_3d(_device(a), b, "a")


def test_c_contiguous_and_strided_operands_keep_their_elements() -> None:
    rng = np.random.default_rng()
    big = rng.uniform(-1, 1, (2, 3, 9, 8))
    b = rng.uniform(-1, 1, (2, 3, 8, 4))
    view, prob = _operand_3d(_device(big), b, "a")
    np.testing.assert_array_equal(_read_back(view, big), host_operand_3d(big, prob, "a"))
    strided = big[:, :, ::2, :]  # (2, 3, 5, 8): the batch axes still merge without a copy
    view, prob = _operand_3d(_device(strided), rng.uniform(-1, 1, (2, 3, 8, 4)), "a")
    assert view.shape == (6, 5, 8)
    np.testing.assert_array_equal(_read_back(view, strided),
                                  host_operand_3d(strided, prob, "a"))
    cols = big[0, 0, :, ::2]  # a 2-D strided view goes in as (1, rows, cols), stride 0 first
    view, prob = _operand_3d(_device(cols), rng.uniform(-1, 1, (4, 2)), "a")
    assert view.shape == (1, 9, 4) and view.strides[0] == 0
    np.testing.assert_array_equal(_read_back(view, cols), host_operand_3d(cols, prob, "a"))
