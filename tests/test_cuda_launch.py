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
    """A stand-in for numba's device array: what arg_key reads."""

    def __init__(self, dtype: Any = np.float32, ndim: int = 3, c: bool = True,
                 f: bool = False) -> None:
        self.dtype, self.ndim = np.dtype(dtype), ndim
        self.flags = {"C_CONTIGUOUS": c, "F_CONTIGUOUS": f}


class _Overload:
    def __init__(self, sensitive: bool = False) -> None:
        self.launch_config_sensitive = sensitive
        self.launches: list[tuple] = []

    def launch(self, args: tuple, grid: tuple, block: tuple, stream: Any, smem: int) -> None:
        self.launches.append((args, grid, block, stream, smem))


class _Dispatcher:
    """numba's dispatcher: compile(types) -> the overload; [config](*args) launches."""

    def __init__(self, sensitive: bool = False) -> None:
        self.overload = _Overload(sensitive)
        self.compiled: list[tuple] = []
        self.launches: list[tuple] = []

    def typeof_pyval(self, value: Any) -> Any:
        if isinstance(value, _Array):
            return (value.dtype.name, value.ndim, value.flags["C_CONTIGUOUS"])
        return type(value).__name__

    def compile(self, sig: tuple) -> Any:
        self.compiled.append(sig)
        return self.overload

    def __getitem__(self, config: tuple) -> Any:
        return lambda *args: self.launches.append((config, args))


@pytest.fixture
def fake_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's path (not the simulator's), with the stand-in array class and stream."""
    from tilegemm import simulator

    if simulator.enabled():
        pytest.skip("numba's driver module is the simulator's here")
    from numba.cuda.cudadrv import driver

    monkeypatch.setattr(simulator, "enabled", lambda: False)
    monkeypatch.setattr(cuda_launch, "_array_type", lambda: _Array)
    monkeypatch.setattr(driver, "_to_core_stream", lambda s: ("core", s), raising=False)
    monkeypatch.setattr(cuda_launch, "_OVERLOADS", {})


def _args(**array: Any) -> tuple:
    return (_Array(**array), _Array(**array), _Array(**array), np.float32(1), np.float32(0))


def test_the_first_launch_is_numbas_the_next_go_to_the_overload(fake_numba: None) -> None:
    disp, seen = _Dispatcher(), []
    for _ in range(3):
        cuda_launch.launch_kernel(disp, (4, 2, 1), (256,), "s", 1024, _args(), seen.append)
    assert len(disp.launches) == 1 and disp.launches[0][0] == ((4, 2, 1), (256,), "s", 1024)
    assert len(disp.compiled) == 1  # the overload numba launched, looked up once
    # numba's normalised dimensions and its cuda.core stream, as its own launch passes them
    assert [launch[1:] for launch in disp.overload.launches] == [
        ((4, 2, 1), (256, 1, 1), ("core", "s"), 1024)] * 2
    assert seen == [disp.overload] * 3  # prepared before every launch


@pytest.mark.parametrize("other", [dict(dtype=np.float16), dict(c=False), dict(c=False, f=True),
                                   dict(ndim=2)])
def test_arguments_of_other_types_get_their_own_overload(fake_numba: None,
                                                         other: dict[str, Any]) -> None:
    disp = _Dispatcher()
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args(**other))  # numba's path again
    cuda_launch.launch_kernel(disp, 1, 32, 0, 0, _args())
    assert len(disp.launches) == 2 and len(disp.overload.launches) == 1
    assert len(disp.compiled) == 2


def test_scalars_are_keyed_by_type() -> None:
    a = _Array()
    assert cuda_launch.arg_key((a, 1.0), _Array) != cuda_launch.arg_key((a, np.float32(1)),
                                                                       _Array)
    assert cuda_launch.arg_key((a, np.float32(2)), _Array) == cuda_launch.arg_key(
        (a, np.float32(1)), _Array)
    assert cuda_launch.arg_key((a, "text"), _Array) is None
    assert cuda_launch.arg_key((np.zeros(3),), _Array) is None  # a host array: numba's


@pytest.mark.parametrize("case", ["sensitive", "unknown argument", "no stream converter"])
def test_numba_launches_what_the_direct_call_cannot(fake_numba: None, case: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel compiled for its launch configuration, an argument numba must type itself,
    and a numba-cuda without the stream conversion: every launch is numba's own."""
    from numba.cuda.cudadrv import driver

    disp = _Dispatcher(sensitive=case == "sensitive")
    args = _args() if case != "unknown argument" else (*_args()[:4], SimpleNamespace())
    if case == "no stream converter":
        monkeypatch.delattr(driver, "_to_core_stream")
    seen: list[Any] = []
    for _ in range(3):
        cuda_launch.launch_kernel(disp, 1, 32, 0, 0, args, seen.append)
    assert len(disp.launches) == 3 and not disp.overload.launches
    assert seen == [disp.overload] * 3
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
