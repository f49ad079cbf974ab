"""Backends, imported lazily: listing them or importing tilegemm touches no GPU library."""

from __future__ import annotations

import importlib
from functools import cache

from tilegemm.backends.base import Backend, BackendStatus
from tilegemm.errors import InvalidValueError
from tilegemm.registry import BACKENDS, REGISTERED

__all__ = ["ARRAY_KINDS", "Backend", "BackendStatus", "get_backend", "host_backend", "statuses",
           "BACKENDS"]


# Each backend's Backend.array_kind from its registration line, known without importing it
# (a test checks they agree): a host product's first call imports only the backends it may use.
ARRAY_KINDS: dict[str, str] = {b.name: b.array_kind for b in REGISTERED}


@cache
def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise InvalidValueError(f"unknown backend {name!r}; choices: {', '.join(BACKENDS)}")
    module = importlib.import_module(f"tilegemm.backends.{name}")
    return module.BACKEND


def host_backend() -> str:
    """The backend whose arrays are the host's NumPy arrays (the CPU): the fallback of
    ``backend="auto"`` and the home of the NumPy reference in benchmarks."""
    return next(n for n in BACKENDS if ARRAY_KINDS[n] == "host")


def statuses() -> list[BackendStatus]:
    return [get_backend(n).status() for n in BACKENDS]
