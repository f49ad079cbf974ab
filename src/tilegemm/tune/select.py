"""``kernel="auto"``: the tuned choice for this device and shape, else a built-in default.

:func:`tuned_choice` is called by :func:`tilegemm.api.choose_kernel` on every call with
``kernel="auto"``, so it is cheap: the device identity comes from the backend's status
(already probed by then, so nothing new is initialised), the cache file is read once and
re-read only when its modification time changes, and answers are memoised per (backend,
device, dtype, shape bucket).

Order: a cached entry for this exact device → one for the same architecture → the
built-in default for the backend and dtype below → None (the API then uses
``registry.default_for``, the highest rung with its defaults). Under numba's CUDA
simulator the choice is the highest rung with its ``sim_params``: the simulator runs one
Python thread per CUDA thread, so the smallest valid tiles are the only sensible ones
(speed means nothing there).
"""

from __future__ import annotations

import os
import platform
import re
import warnings
from pathlib import Path
from typing import Any

from tilegemm import registry
from tilegemm.backends.base import Backend
from tilegemm.bench.environment import cpu_name
from tilegemm.problem import GemmProblem
from tilegemm.registry import KernelSpec
from tilegemm.tune import cache as tcache
from tilegemm.tune.cache import DeviceId, TuneCacheWarning

Choice = tuple[KernelSpec, dict[str, int]]

# Built-in choices before any tuning: (backend, dtype) -> {arch or "*": (rung, overrides)}.
# float32 on CUDA: the top rung at its defaults (CUTLASS's 128×128×8 SIMT tile, see
# docs/performance.md). float64: the same rung; at the defaults it needs 255 registers
# (no spills), so one 256-thread block per SM; measured choices come from 'tilegemm tune'.
BUILTIN: dict[tuple[str, str], dict[str, tuple[str, dict[str, int]]]] = {
    ("cuda", "float32"): {"*": ("pipelined", {})},
    ("cuda", "float64"): {"*": ("pipelined", {})},
}

_CUDA_DEVICE = re.compile(r"^(?P<name>.*) \((?P<arch>sm_\d+)\)$")


def device_id(backend: Backend) -> DeviceId | None:
    """Who this backend runs on, from its (cached) status; None if it is not usable."""
    status = backend.status()
    if not status.usable:
        return None
    if backend.name == "cuda":
        if status.simulated:
            return DeviceId("cuda", "simulator", "")
        match = _CUDA_DEVICE.match(status.devices[0]) if status.devices else None
        if match:
            return DeviceId("cuda", match["name"], match["arch"])
        return DeviceId("cuda", status.devices[0] if status.devices else "cuda", "")
    if backend.name == "cpu":
        return DeviceId("cpu", cpu_name(), platform.machine())
    return DeviceId(backend.name, status.devices[0] if status.devices else backend.name, "")



def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


_loaded: dict[str, Any] = {"path": None, "mtime": None, "entries": []}


def _entries() -> list[tcache.Entry]:
    """The cache's entries, re-read only when the file (or its location) changes."""
    path = tcache.cache_path()
    mtime = _mtime(path)
    if _loaded["path"] != path or _loaded["mtime"] != mtime:
        _loaded.update(path=path, mtime=mtime, entries=tcache.load(path) if mtime else [])
        _memo.clear()
    return _loaded["entries"]


_memo: dict[tuple[Any, ...], Choice | None] = {}


def tuned_choice(backend: Backend, prob: GemmProblem) -> Choice | None:
    """(rung, full parameters) for ``kernel="auto"``, or None for the registry default."""
    dev = device_id(backend)
    if dev is None:
        return None
    dtype = prob.dtype.name
    if dev.name == "simulator" and not dev.arch:
        return _simulator_choice(dtype)
    entries = _entries()
    key = (dev, dtype, tuple(tcache.shape_bucket(prob.m, prob.n, prob.k)))
    if key not in _memo:
        _memo[key] = _choose(backend, dev, dtype, prob, entries)
    return _memo[key]


def _choose(backend: Backend, dev: DeviceId, dtype: str, prob: GemmProblem,
            entries: list[tcache.Entry]) -> Choice | None:
    entry = tcache.lookup(entries, dev, dtype, prob.m, prob.n, prob.k)
    if entry is not None:
        choice = _usable(backend, entry.kernel, entry.params, dtype)
        if choice is not None:
            return choice
        warnings.warn(f"tuning cache entry {entry.kernel} {entry.params} does not fit this "
                      "tilegemm/device any more; ignoring it", TuneCacheWarning, stacklevel=3)
    return builtin_choice(backend, dev, dtype)


def untuned_choice(backend: Backend, dtype: str) -> Choice | None:
    """What ``kernel="auto"`` picks with an empty cache: the built-in choice, else the
    registry default at its (device-resolved) defaults. ``tilegemm tune`` times it as the
    baseline, so a tuned entry replaces it only by being faster."""
    dev = device_id(backend)
    choice = builtin_choice(backend, dev, dtype) if dev is not None else None
    if choice is not None:
        return choice
    try:
        spec = registry.default_for(backend.name, dtype)
    except TypeError:
        return None
    return _usable(backend, spec.name, {}, dtype)


def builtin_choice(backend: Backend, dev: DeviceId, dtype: str) -> Choice | None:
    table = BUILTIN.get((backend.name, dtype))
    if not table:
        return None
    kernel, overrides = table.get(dev.arch, table.get("*", (None, {})))
    return _usable(backend, kernel, overrides, dtype) if kernel else None


def _usable(backend: Backend, kernel: str, params: dict[str, int], dtype: str) -> Choice | None:
    """The (spec, resolved params) if the rung exists, supports dtype and fits the device."""
    try:
        spec = registry.get(kernel, backend.name)
        if not spec.supports(dtype) or spec.extra.get("precisions"):
            return None  # reduced-precision rungs run only on request (precision=)
        resolved = backend.resolve(spec, params)
        backend.check_limits(spec, resolved, dtype)
    except (ValueError, TypeError):
        return None
    return spec, resolved


def _simulator_choice(dtype: str) -> Choice | None:
    specs = [s for s in registry.specs_for("cuda")
             if s.supports(dtype) and "sim_params" in s.extra
             and not s.extra.get("precisions")]
    if not specs:
        return None
    spec = max(specs, key=lambda s: s.rung)
    return spec, spec.resolve(spec.extra["sim_params"])
