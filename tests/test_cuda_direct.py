"""Remembered products on device arrays, launched on views of their memory
(tilegemm.backends.cuda_direct, tilegemm.fastpath), with stand-ins for CuPy, the driver and
a program: no GPU is needed. On a GPU, tests/test_cuda_interop.py runs the same calls on
CuPy and PyTorch arrays and checks their results."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from tilegemm import fastpath_device, remembered
from tilegemm.backends import cuda_direct, cuda_launch
from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.problem import describe, make_problem


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeArray:
    """A CuPy array's stand-in: what describe() and the direct path read of one."""

    def __init__(self, host: np.ndarray, ptr: int = 0x10000) -> None:
        self.host = host
        self.shape, self.strides, self.dtype = host.shape, host.strides, host.dtype
        self.data = _Pointer(ptr)
        self.device = types.SimpleNamespace(id=0)
        self.filled: list[Any] = []

    def fill(self, value: Any) -> None:
        self.filled.append(value)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "strides": self.strides, "typestr": self.dtype.str,
                "data": (self.data.ptr, False), "version": 3}


FakeArray.__module__ = "cupy._core.core"  # what the backend's library checks read


class _Program(CudaProgram):
    """A program that records its launches."""

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any,  # noqa: N803
               stream: Any = 0) -> None:
        self.launches.append((A, B, C, alpha, beta, stream))


def _program() -> _Program:
    p = _Program(kernel=None, block=(1, 1, 1), grid=lambda b, m, n: (1, 1, 1))
    object.__setattr__(p, "launches", [])
    return p


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A GPU's path: a driver whose current context can change, a CuPy whose current
    stream and allocations are recorded."""
    from tilegemm import simulator

    monkeypatch.setattr(simulator, "enabled", lambda: False)
    state = types.SimpleNamespace(context=0xC7, stream=0x5A, allocated=[])
    drv = types.SimpleNamespace(context=lambda: state.context)
    monkeypatch.setattr(cuda_direct, "driver", lambda: drv)

    def empty(shape: tuple[int, ...], dtype: Any) -> FakeArray:
        a = FakeArray(np.empty(shape, dtype), ptr=0x90000 + 0x1000 * len(state.allocated))
        state.allocated.append(a)
        return a

    cupy = types.ModuleType("cupy")
    cupy.empty = empty  # type: ignore[attr-defined]
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_current_stream=lambda: types.SimpleNamespace(ptr=state.stream))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(cuda_direct.DirectProgram, "_numba_stream",
                        lambda self, handle: ("stream", handle))
    return state


def _direct(a: FakeArray, b: FakeArray, program: Any = None, **kw: Any) -> Any:
    ops = (describe(a, "a"), describe(b, "b"))
    prob = make_problem(*ops, **kw)
    return cuda_direct.device_program(program or _program(), prob, ops, np.float32(1),
                                      np.float32(0))


def _numpy_view(x: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...]:
    return np.reshape(x, shape, copy=False).strides


@pytest.mark.parametrize("sa,sb,layout", [
    ((5, 3), (3, 7), "C"), ((2, 5, 3), (2, 3, 7), "C"), ((2, 5, 3), (3, 7), "C"),
    ((3,), (3, 7), "C"), ((5, 3), (3,), "C"), ((5, 3), (3, 7), "B K-major")])
def test_views_are_the_layouts_the_full_path_gives_the_rung(
        gpu: types.SimpleNamespace, sa: tuple, sb: tuple, layout: str) -> None:
    a = np.ones(sa, np.float32)
    b = np.ones(sb, np.float32) if layout == "C" else np.ones(sb[::-1], np.float32).T
    program = _program()
    direct = _direct(FakeArray(a, 0x1000), FakeArray(b, 0x2000), program)
    assert direct is not None
    result = direct(FakeArray(a, 0x3000), FakeArray(b, 0x4000))
    ((A, B, C, alpha, beta, stream),) = program.launches
    assert (A.ptr, B.ptr, C.ptr) == (0x3000, 0x4000, result.data.ptr)
    expect = (a @ b).shape
    assert result.shape == expect and result.dtype == np.float32
    batch = int(np.prod(expect[:-2])) if len(expect) > 2 else 1
    m = 1 if len(sa) == 1 else sa[-2]
    n = 1 if len(sb) == 1 else sb[-1]
    assert C.shape == (batch, m, n) and C.flags["C_CONTIGUOUS"]
    a2 = a.reshape(1, 3) if a.ndim == 1 else a
    b2 = b.reshape(3, 1) if b.ndim == 1 else b
    assert A.shape[1:] == a2.shape[-2:] and B.shape[1:] == b2.shape[-2:]
    assert A.strides[1:] == _numpy_view(a2, A.shape)[1:]
    assert B.strides[1:] == _numpy_view(b2, B.shape)[1:]
    assert B.flags == cuda_launch.contiguity(B.shape, B.strides, 4)
    assert (alpha, beta, stream) == (1, 0, ("stream", 0x5A))


@pytest.mark.parametrize("case", ["trans", "dtype", "broadcast", "numpy program", "simulated"])
def test_cases_the_direct_path_leaves_to_the_full_path(
        gpu: types.SimpleNamespace, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = np.ones((5, 3), np.float32), np.ones((3, 7), np.float32)
    kw: dict[str, Any] = {}
    program: Any = None
    if case == "trans":
        kw = {"trans_b": True}
        b = np.ones((7, 3), np.float32)
    elif case == "dtype":
        b = b.astype(np.float64)  # converted by the library on the full path
    elif case == "broadcast":
        a, b = np.ones((2, 1, 5, 3), np.float32), np.ones((1, 4, 3, 7), np.float32)
    elif case == "numpy program":
        program = types.SimpleNamespace(launch=None)  # not a numba-kernel program
    else:
        from tilegemm import simulator

        monkeypatch.setattr(simulator, "enabled", lambda: True)
    assert _direct(FakeArray(a), FakeArray(b), program, **kw) is None


def test_another_context_takes_the_full_path(gpu: types.SimpleNamespace) -> None:
    a, b = np.ones((5, 3), np.float32), np.ones((3, 7), np.float32)
    program = _program()
    direct = _direct(FakeArray(a), FakeArray(b), program)
    gpu.context = 0xC8  # another device's, or another thread's
    assert direct(FakeArray(a), FakeArray(b)) is None
    gpu.context = 0
    assert direct(FakeArray(a), FakeArray(b)) is None
    assert not program.launches and not gpu.allocated
    gpu.context = 0xC7
    assert direct(FakeArray(a), FakeArray(b)) is not None and len(program.launches) == 1


def test_each_call_runs_on_the_librarys_current_stream(gpu: types.SimpleNamespace) -> None:
    a, b = np.ones((5, 3), np.float32), np.ones((3, 7), np.float32)
    program = _program()
    direct = _direct(FakeArray(a), FakeArray(b), program)
    for handle in (0x5A, 0x5B, 0x5A):
        gpu.stream = handle
        direct(FakeArray(a), FakeArray(b))
    assert [launch[-1] for launch in program.launches] == [
        ("stream", 0x5A), ("stream", 0x5B), ("stream", 0x5A)]


def test_fastpath_remembers_keys_and_forgets(gpu: types.SimpleNamespace,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    remembered.forget()
    monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    a, b = FakeArray(np.ones((5, 3), np.float32)), FakeArray(np.ones((3, 7), np.float32))
    program = _program()
    direct = _direct(a, b, program)
    kw = dict(kernel="auto", backend="auto", params={})
    assert fastpath_device.try_remembered_device(a, b, **kw) is None  # nothing remembered yet
    fastpath_device.remember_device(a, b, lambda: direct, None, None, **kw)
    try:
        assert fastpath_device.try_remembered_device(a, b, **kw) is not None
        assert len(program.launches) == 1
        # another shape, dtype, stride, kernel= or parameter: not this case
        other = FakeArray(np.ones((5, 4), np.float32))
        assert fastpath_device.try_remembered_device(other, b, **kw) is None
        wide = FakeArray(np.ones((5, 3), np.float64))
        assert fastpath_device.try_remembered_device(wide, b, **kw) is None
        bt = FakeArray(np.ones((7, 3), np.float32).T)
        assert fastpath_device.try_remembered_device(a, bt, **kw) is None
        assert fastpath_device.try_remembered_device(a, b, kernel="wgmma", backend="auto",
                                              params={}) is None
        assert fastpath_device.try_remembered_device(a, b, kernel="auto", backend="auto",
                                              params={"BM": 64}) is None
        assert len(program.launches) == 1
        monkeypatch.setenv("TILEGEMM_POISON", "1")  # NaN first, as the full path does
        poisoned = fastpath_device.try_remembered_device(a, b, **kw)
        assert len(poisoned.filled) == 1 and np.isnan(poisoned.filled[0])
        assert len(program.launches) == 2
        monkeypatch.delenv("TILEGEMM_POISON")
        assert not fastpath_device.try_remembered_device(a, b, **kw).filled
        remembered.forget()
        assert fastpath_device.try_remembered_device(a, b, **kw) is None
    finally:
        remembered.forget()


def test_the_device_id_is_found_once_per_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace's device is the current context's, asked of numba once per context
    (numba's query costs tens of microseconds a launch)."""
    from numba import cuda

    from tilegemm.kernels.cuda import _workspace

    state = types.SimpleNamespace(context=0xC7, asked=0)
    drv = types.SimpleNamespace(context=lambda: state.context)
    monkeypatch.setattr(cuda_launch, "driver", lambda: drv)
    monkeypatch.setattr(_workspace, "_DEVICE_OF_CONTEXT", {})

    def current() -> Any:
        state.asked += 1
        return types.SimpleNamespace(id=3 if state.context == 0xC7 else 5)

    monkeypatch.setattr(cuda, "get_current_device", current)
    assert [_workspace.device_key() for _ in range(3)] == [3, 3, 3] and state.asked == 1
    state.context = 0xC8
    assert [_workspace.device_key() for _ in range(2)] == [5, 5] and state.asked == 2
    state.context = 0  # no context: numba's answer each time, nothing kept
    _workspace.device_key()
    _workspace.device_key()
    assert state.asked == 4
