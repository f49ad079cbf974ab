"""The small interface every backend implements, and what they share.

A backend owns one kind of array ("host" NumPy, "cuda" device arrays, "opencl" arrays),
knows whether it can run here (and why not), checks a rung's resource needs against its
device before a launch, and runs a :class:`~tilegemm.problem.GemmProblem`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    if prob.dtype.kind in "iu" and (float(alpha) != int(alpha) or float(beta) != int(beta)):
        raise TypeError("alpha and beta must be integers for an integer product")
    return t(alpha), t(beta)


class Backend(ABC):
    name: str = ""
    array_kind: str = "host"

    @abstractmethod
    def status(self) -> BackendStatus:
        """Probe once (cached by the implementation); never raises."""

    def check_limits(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype) -> None:
        """Raise ValueError if the rung's threads or shared memory exceed the device."""

    @abstractmethod
    def run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
    ) -> Any:
        """Compute and return the result (``out`` if given), of the operands' array type."""

    def synchronize(self) -> None:
        """Wait for queued work (timing uses this); host backends have nothing to wait for."""
