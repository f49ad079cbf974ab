"""The small interface every backend implements, and what they share.

A backend owns one kind of array ("host" NumPy, "cuda" device arrays, "opencl" arrays),
knows whether it can run here (and why not), checks a rung's resource needs against its
device before a launch, and runs a :class:`~tilegemm.problem.GemmProblem`.
"""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilegemm.errors import InvalidTypeError, InvalidValueError
from tilegemm.problem import GemmProblem, Operand
from tilegemm.registry import KernelSpec


@dataclass(frozen=True)
class BackendStatus:
    name: str
    usable: bool
    reason: str
    devices: tuple[str, ...] = ()
    simulated: bool = False  # e.g. numba's CUDA simulator: correct but very slow
    accelerated: bool = False  # a real GPU (or other accelerator): kernel="auto" prefers it


@dataclass(frozen=True)
class Prepared:
    """One product set up for repeated launches, operands already resident on the device.

    Benchmarks and the tuner time kernels, not transfers or Python dispatch: ``launch``
    enqueues one launch on data prepared once; ``elapsed(n)`` runs ``n`` launches and returns
    each one's device-measured time in seconds (CUDA events, OpenCL profiling events,
    ``perf_counter`` on the CPU); ``fetch`` copies the (batch, M, N) result to the host for
    verification.
    """

    launch: Callable[[], None]
    fetch: Callable[[], np.ndarray]
    elapsed: Callable[[int], list[float]]


def wall_clock_elapsed(launch: Callable[[], None], n: int) -> list[float]:
    """``Prepared.elapsed`` for synchronous launches (the CPU, NumPy, the CUDA simulator):
    each launch timed with ``perf_counter``."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        launch()
        times.append(time.perf_counter() - t0)
    return times


def poison_enabled() -> bool:
    """``TILEGEMM_POISON=1`` makes backends fill fresh outputs with NaN (ints: a sentinel)
    before a launch, so a kernel that skips an element is caught by the check."""
    return os.environ.get("TILEGEMM_POISON", "") not in ("", "0")


def poison_value(dtype: np.dtype) -> Any:
    dtype = np.dtype(dtype)
    return np.nan if dtype.kind == "f" else np.iinfo(dtype).min + 7


def resolve_scalars(prob: GemmProblem, alpha: Any, beta: Any) -> tuple[Any, Any]:
    """alpha and beta as scalars of the problem dtype (kernels do no wider math)."""
    t = prob.dtype.type
    if prob.dtype.kind in "iu":
        info = np.iinfo(prob.dtype)
        for name, x in (("alpha", alpha), ("beta", beta)):
            f = float(x)
            if not math.isfinite(f) or f != math.floor(f):
                raise InvalidTypeError(f"{name}={x!r} must be an integer for an {prob.dtype.name} "
                                "product")
            if not info.min <= int(x) <= info.max:
                raise InvalidValueError(f"{name}={x!r} does not fit in {prob.dtype.name}")
    return t(alpha), t(beta)


class Backend(ABC):
    name: str = ""
    array_kind: str = "host"

    @abstractmethod
    def status(self) -> BackendStatus:
        """Probe once (cached by the implementation); never raises."""

    def resolve(self, spec: KernelSpec, params: Mapping[str, Any]) -> dict[str, int]:
        """The rung's full parameters; a backend may start from defaults measured for its
        device (OpenCL: ``spec.extra["device_defaults"]``) instead of the rung's own."""
        return spec.resolve(params)

    def check_limits(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype) -> None:
        """Raise ValueError if the rung's threads or shared memory exceed the device."""

    @abstractmethod
    def run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
    ) -> Any:
        """Compute and return the result (``out`` if given), of the operands' array type."""

    def prepare(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a3: np.ndarray, b3: np.ndarray,
    ) -> Prepared:
        """Copy (batch|1, M, K) and (batch|1, K, N) host operands to the device once and
        return launch/fetch/elapsed closures over them (alpha=1, beta=0)."""
        raise NotImplementedError(f"backend {self.name} cannot prepare benchmarks yet")

    def synchronize(self) -> None:
        """Wait for queued work (timing uses this); host backends have nothing to wait for."""
