"""Kernel launches through numba's compiled overload (tilegemm.backends.cuda_launch), with
stand-ins for numba's dispatcher, its overload and its device arrays: no GPU is needed.
What they show on a GPU (the host's time per launch) is measured by the GPU records."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tilegemm.backends import cuda_launch


class _Array:
    """A stand-in for numba's device array: what arg_key and the packing read."""

    def __init__(self, dtype: Any = np.float32, ndim: int = 3, c: bool = True,
                 f: bool = False) -> None:
        self.dtype, self.ndim = np.dtype(dtype), ndim
        self.flags = {"C_CONTIGUOUS": c, "F_CONTIGUOUS": f}
        self.shape = (2,) * ndim
        self.strides = (4,) * ndim
        self.size = 2 ** ndim
        self.device_ctypes_pointer = SimpleNamespace(value=0x1000)


class _Overload:
    def __init__(self, sensitive: bool = False, types: tuple = ()) -> None:
        self.launch_config_sensitive = sensitive
        self.argument_types = types or _types()
        self._codelibrary = SimpleNamespace(
            get_cufunc=lambda: SimpleNamespace(handle=0xC0DE))


def _signature(sig: tuple) -> tuple:
    """numba's argument types for a signature of typeof_pyval's stand-in values."""
    from numba.cuda import types
    from numba.cuda.np.numpy_support import from_dtype

    return tuple(types.Array(from_dtype(np.dtype(t[0])), t[1], "C" if t[2] else "A")
                 if isinstance(t, tuple) else getattr(types, t, types.pyobject) for t in sig)


def _types() -> tuple:
    from numba.cuda import types

    arr = types.Array(types.float32, 3, "C")
    return (arr, arr, arr, types.float32, types.float32)


class _Dispatcher:
    """numba's dispatcher: compile(types) -> the overload; [config](*args) launches."""

    def __init__(self, sensitive: bool = False, types: tuple = ()) -> None:
        self.sensitive, self.types = sensitive, types
        self.overloads: dict[tuple, _Overload] = {}  # one per signature, as numba's
        self.compiled: list[tuple] = []
        self.launches: list[tuple] = []

    @property
    def overload(self) -> _Overload:
        return next(iter(self.overloads.values()))

    def typeof_pyval(self, value: Any) -> Any:
        if isinstance(value, _Array):
            return (value.dtype.name, value.ndim, value.flags["C_CONTIGUOUS"])
        return type(value).__name__

    def compile(self, sig: tuple) -> Any:
        self.compiled.append(sig)
        return self.overloads.setdefault(sig, _Overload(self.sensitive,
                                                        self.types or _signature(sig)))

    def __getitem__(self, config: tuple) -> Any:
        return lambda *args: self.launches.append((config, args))


class _Driver:
    """The driver's launch and context query: records each direct launch."""

    def __init__(self) -> None:
        self.current = 0xC7  # the calling thread's context
        self.launches: list[tuple] = []
        self.code = 0

    def context(self) -> int:
        return self.current

    def launch(self, handle: int, *rest: Any) -> int:
        params = rest[-2]
        self.launches.append((handle, rest[:-2], params))
        return self.code

    def error_name(self, code: int) -> str:
        return f"CUDA_ERROR_{code}"


@pytest.fixture
def fake_numba(monkeypatch: pytest.MonkeyPatch) -> _Driver:
    """A GPU's path (not the simulator's), with the stand-in array class and driver."""
    from tilegemm import simulator

    if simulator.enabled():
        pytest.skip("numba's driver module is the simulator's here")
    monkeypatch.setattr(simulator, "enabled", lambda: False)
    monkeypatch.setattr(cuda_launch, "_array_type", lambda: (_Array, cuda_launch.DeviceView))
    drv = _Driver()
    monkeypatch.setattr(cuda_launch, "driver", lambda: drv)
    monkeypatch.setattr(cuda_launch, "_OVERLOADS", {})
    monkeypatch.setattr(cuda_launch, "_DIRECT", {})
    return drv


def _args(**array: Any) -> tuple:
    return (_Array(**array), _Array(**array), _Array(**array), np.float32(1), np.float32(0))


def test_the_first_launch_is_numbas_the_next_go_to_the_driver(fake_numba: _Driver) -> None:
    disp, seen = _Dispatcher(), []
    for _ in range(3):
        cuda_launch.launch_kernel(disp, (4, 2, 1), (256,), 0, 1024, _args(), seen.append)
    assert len(disp.launches) == 1 and disp.launches[0][0] == ((4, 2, 1), (256,), 0, 1024)
    assert len(disp.compiled) == 1  # the overload numba launched, looked up once
    # the overload's kernel, numba's normalised dimensions, the default stream (0)
    assert [launch[:2] for launch in fake_numba.launches] == [
        (0xC0DE, (4, 2, 1, 256, 1, 1, 1024, None))] * 2
    assert seen == [disp.overload]  # prepared once: the opt-in holds for the context


def test_a_direct_launch_in_a_new_context_is_numbas_first(fake_numba: _Driver) -> None:
    """Another thread's or device's context: numba loads the kernel there first."""
    disp = _Dispatcher()
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    fake_numba.current = 0xC8
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    fake_numba.current = 0  # no context at all: numba makes one
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    assert len(disp.launches) == 3 and len(fake_numba.launches) == 1
    assert len(disp.compiled) == 1


def test_more_shared_memory_than_opted_in_is_prepared_again(fake_numba: _Driver) -> None:
    disp, seen = _Dispatcher(), []
    cuda_launch.launch_kernel(disp, 1, 32, 0, 64 * 1024, _args(), seen.append)
    cuda_launch.launch_kernel(disp, 1, 32, 0, 64 * 1024, _args(), seen.append)
    cuda_launch.launch_kernel(disp, 1, 32, 0, 96 * 1024, _args(), seen.append)
    cuda_launch.launch_kernel(disp, 1, 32, 0, 96 * 1024, _args(), seen.append)
    assert len(seen) == 2 and len(fake_numba.launches) == 3


def test_a_refused_launch_raises_with_the_drivers_error(fake_numba: _Driver) -> None:
    disp = _Dispatcher()
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    fake_numba.code = 701
    with pytest.raises(cuda_launch.LaunchError, match="CUDA_ERROR_701"):
        cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    assert not isinstance(cuda_launch.LaunchError("x"), ValueError)  # not a usage error


@pytest.mark.parametrize("other", [dict(dtype=np.float16), dict(c=False), dict(c=False, f=True),
                                   dict(ndim=2)])
def test_arguments_of_other_types_get_their_own_overload(fake_numba: _Driver,
                                                         other: dict[str, Any]) -> None:
    disp = _Dispatcher()
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args(**other))  # numba's path again
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args(**other))
    assert len(disp.launches) == 2 and len(fake_numba.launches) == 2
    assert len(disp.compiled) == 2


def test_scalars_are_keyed_by_type() -> None:
    a = _Array()
    assert cuda_launch.arg_key((a, 1.0), _Array) != cuda_launch.arg_key((a, np.float32(1)),
                                                                       _Array)
    assert cuda_launch.arg_key((a, np.float32(2)), _Array) == cuda_launch.arg_key(
        (a, np.float32(1)), _Array)
    assert cuda_launch.arg_key((a, "text"), _Array) is None
    assert cuda_launch.arg_key((np.zeros(3),), _Array) is None  # a host array: numba's


@pytest.mark.parametrize("case", ["sensitive", "unknown argument", "no driver library",
                                  "argument not packed", "debug", "cooperative"])
def test_numba_launches_what_the_direct_call_cannot(fake_numba: _Driver, case: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel compiled for its launch configuration, an argument numba must type itself,
    a driver library ctypes cannot open, a kernel argument type the direct launch does not
    pack: every launch is numba's own."""
    from numba.cuda import types

    disp = _Dispatcher(sensitive=case == "sensitive",
                       types=(types.complex64,) if case == "argument not packed" else ())
    args = _args() if case != "unknown argument" else (*_args()[:4], SimpleNamespace())
    if case == "no driver library":
        monkeypatch.setattr(cuda_launch, "driver", lambda: None)
    if case in ("debug", "cooperative"):  # numba's launch does more for these
        monkeypatch.setattr(_Overload, case, True, raising=False)
    seen: list[Any] = []
    for _ in range(3):
        cuda_launch.launch_kernel(disp, 1, 32, 0, 0, args, seen.append)
    assert len(disp.launches) == 3 and not fake_numba.launches
    assert len(seen) == 3 and all(k is disp.overload for k in seen)
    compiled = len(disp.compiled)
    for _ in range(2):  # nothing to prepare: numba's launch alone types the arguments
        cuda_launch.launch_kernel(disp, 1, 32, 0, 0, args)
    assert len(disp.launches) == 5 and len(disp.compiled) == compiled


def test_the_simulator_launches_through_numba_without_prepare(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm import simulator

    monkeypatch.setattr(simulator, "enabled", lambda: True)
    disp, seen = _Dispatcher(), []
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args(), seen.append)
    assert len(disp.launches) == 1 and not disp.compiled and not seen


def _numba_array(shape: tuple, strides: tuple, dtype: Any, address: int) -> Any:
    """A numba device array over a made-up address (nothing is allocated or read)."""
    import ctypes

    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    memory = SimpleNamespace(device_ctypes_pointer=ctypes.c_void_p(address))
    return DeviceNDArray(shape=shape, strides=strides, dtype=np.dtype(dtype),
                         gpu_data=memory)


LAYOUTS = [((2, 3, 4), (48, 16, 4)), ((1, 5, 3), (60, 4, 20)), ((3, 1, 7), (28, 0, 4)),
           ((4, 6), (4, 16)), ((1, 1, 9), (0, 36, 4)),
           ((5,), (8,)), ((2, 3, 4), (4, 8, 24)), ((3, 2), (8, 0))]


@pytest.mark.parametrize("shape,strides", LAYOUTS)
def test_contiguity_is_numbas(shape: tuple, strides: tuple) -> None:
    """The flags a view is keyed by are numba's for the same layout (a view keyed as
    contiguous where numba is not would run a kernel compiled for the wrong layout)."""
    if simulator_on():
        pytest.skip("numba's device arrays are the simulator's here")
    numba_flags = _numba_array(shape, strides, np.float32, 0x1000).flags
    ours = cuda_launch.contiguity(shape, strides, 4)
    assert ours == {k: numba_flags[k] for k in ("C_CONTIGUOUS", "F_CONTIGUOUS")}
    view = cuda_launch.DeviceView(0x1000, shape, strides, np.dtype(np.float32))
    assert view.flags == ours and view.size == int(np.prod(shape))


def test_an_empty_array_is_contiguous_both_ways_as_in_numba() -> None:
    both = {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
    assert cuda_launch.contiguity((2, 0, 3), (0, 12, 4), 4) == both
    assert cuda_launch.contiguity((), (), 4) == both


def simulator_on() -> bool:
    from tilegemm import simulator

    return simulator.enabled()


def test_arguments_pack_as_numba_packs_them() -> None:
    """The direct launch's parameter values are those numba's own launch passes, for numba
    arrays and views alike: the same slots, in the same order."""
    import ctypes
    import struct

    if simulator_on():
        pytest.skip("numba's device arrays are the simulator's here")
    from numba.cuda import types
    from numba.cuda.dispatcher import _Kernel

    arr3 = types.Array(types.float32, 3, "A")
    arr2 = types.Array(types.int16, 2, "C")
    sig = (arr3, arr2, types.float32, types.float64, types.int64)
    args = (_numba_array((2, 3, 4), (4, 8, 24), np.float32, 0x7000),
            cuda_launch.DeviceView(0x9000, (5, 6), (12, 2), np.dtype(np.int16)),
            np.float32(1.5), -2.25, 7)
    # numba is given arrays only; a view packs as numba packs an array over its memory
    numba_args = (args[0], _numba_array((5, 6), (12, 2), np.int16, 0x9000), *args[2:])
    numba_values: list[Any] = []
    for t, v in zip(sig, numba_args):
        _Kernel._prepare_args(SimpleNamespace(extensions=[]), t, v, 0, [], numba_values)
    numba_values = [v.value if hasattr(v, "value") else v for v in numba_values]

    direct = cuda_launch._direct_for(_Overload(types=sig), 0)
    calls: list[tuple] = []

    class Recorder(_Driver):
        def launch(self, handle: int, *rest: Any) -> int:
            params = rest[-2]
            # each parameter's bytes, read through its pointer as the driver does
            sizes = [8] * (len(numba_values) - 3) + [4, 8, 8]
            calls.append(tuple(ctypes.string_at(params[i], n) for i, n in enumerate(sizes)))
            return 0

    direct.launch(args, (1, 1, 1), (32, 1, 1), 0, 0, Recorder())
    (got,) = calls
    expected = [struct.pack("=q", v) for v in numba_values[:-3]] + [
        struct.pack("=f", numba_values[-3]), struct.pack("=d", numba_values[-2]),
        struct.pack("=q", numba_values[-1])]
    assert list(got) == expected


def test_a_view_reaches_numba_as_an_array_over_its_memory() -> None:
    view = cuda_launch.DeviceView(0x4000, (2, 3), (12, 4), np.dtype(np.float32))
    cai = view.__cuda_array_interface__
    assert cai["data"] == (0x4000, False) and cai["typestr"] == "<f4"
    assert cai["shape"] == (2, 3) and cai["strides"] == (12, 4) and cai["version"] == 3


@pytest.mark.parametrize("value,opened", [("1", False), ("yes", False), ("0", True),
                                          ("", True)])
def test_tilegemm_numba_launch_keeps_every_launch_numbas(
        monkeypatch: pytest.MonkeyPatch, value: str, opened: bool) -> None:
    """The way back to numba's launches: the driver is not opened for direct launches."""
    import ctypes

    monkeypatch.setenv("TILEGEMM_NUMBA_LAUNCH", value)
    tried: list[str] = []

    def cdll(name: str) -> Any:
        tried.append(name)
        raise OSError("no driver here")

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    cuda_launch.driver.cache_clear()
    try:
        assert cuda_launch.driver() is None
        assert bool(tried) == opened
    finally:
        cuda_launch.driver.cache_clear()
