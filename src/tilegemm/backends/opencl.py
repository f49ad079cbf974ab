"""OpenCL backend (placeholder until the OpenCL ladder lands)."""

from __future__ import annotations

from typing import Any

from tilegemm.backends.base import Backend, BackendStatus


class OpenCLBackend(Backend):
    name = "opencl"
    array_kind = "opencl"

    def status(self) -> BackendStatus:
        return BackendStatus("opencl", False, "the OpenCL backend is not implemented yet")

    def run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise RuntimeError("the OpenCL backend is not implemented yet")


BACKEND = OpenCLBackend()
