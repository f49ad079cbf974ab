"""``kernel="auto"``: the one place it is decided (:func:`auto_choice`).

Order: numba's CUDA simulator → the highest rung with ``sim_params`` (the simulator runs
one Python thread per CUDA thread, so the smallest valid tiles are the only sensible ones;
speed means nothing there); else a tuned entry in the cache for this exact device → one
for the same architecture; else the shipped database of measured parameters
(:mod:`tilegemm.tune.database`: this device → its ISA); else the registry's default rung
(the rung flagged ``auto=True``, else the highest one; see
:func:`tilegemm.registry.default_for`) at its defaults for the device.

:func:`auto_choice` runs on every call with ``kernel="auto"``, so it is cheap: the device
is the caller's :class:`~tilegemm.backends.base.Target` (already made), the cache file is
read once and re-read only when its modification time changes, and answers are memoised
per (device, dtype, shape bucket).
"""

from __future__ import annotations

import os
import platform
import threading
import warnings
from pathlib import Path
from typing import Any

from tilegemm import registry
from tilegemm.backends.base import Backend, Target
from tilegemm.errors import user_stacklevel
from tilegemm.problem import GemmProblem
from tilegemm.registry import KernelSpec
from tilegemm.tune import cache as tcache
from tilegemm.tune.cache import DeviceId, TuneCacheWarning

Choice = tuple[KernelSpec, dict[str, int]]

def device_id(target: Target | Backend) -> DeviceId | None:
    """The tuning cache's device key: the Target's backend, device name and architecture
    (a Backend means its default device; None if it cannot run here).

    For code compiled for the host CPU (the CPU backend, an OpenCL CPU device such as
    PoCL's) the name also carries the CPU's family and model and its vector ISA, and the
    architecture the ISA (``x86_64-avx512``). Virtual machines name CPUs of several
    generations alike ("AMD EPYC", "Intel(R) Xeon(R) Processor"), and a cache directory
    shared by several machines (a cluster's home directory) would otherwise hand an entry
    tuned on an AVX-512 machine, whose register tile fills 32 vector registers, to an AVX2
    one with 16, where it spills. A GPU keeps its own name and architecture."""
    if isinstance(target, Backend):
        status = target.status()
        if not status.usable or status.default_problem:  # no default device to key on
            return None
        target = target.target()
    key = (target.backend, target.name, target.arch, target.kind)
    dev = _device_ids.get(key)
    if dev is None:  # the ISA is read once per process (see database.host_isa), so is this
        dev = _device_ids[key] = DeviceId(target.backend, *_name_and_arch(target))
    return dev


_device_ids: dict[tuple[str, ...], DeviceId] = {}  # device_id's answers (2-3 µs each)


def _name_and_arch(target: Target) -> tuple[str, str]:
    """(name, architecture) of :func:`device_id`'s key."""
    from tilegemm.backends.cpu import cpu_family_model
    from tilegemm.tune import database

    isa = database.isa(target)
    if isa == target.arch:  # not the host CPU's code: a GPU's own architecture, or none
        return target.name, target.arch
    model = cpu_family_model()
    name = f"{target.name} [{model + ', ' if model else ''}{isa}]"
    # an OpenCL CPU device (PoCL's) names no architecture of its own: the host's machine
    # type, so that its entries have an architecture tier too (one tuned on another
    # AVX-512 CPU for this one), as the CPU backend's do
    return name, f"{target.arch or platform.machine() or 'cpu'}-{isa}"


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


_loaded: dict[str, Any] = {"path": None, "mtime": None, "entries": []}


_LOADING = threading.Lock()  # a re-read and the answers kept from what was read


def tuning_cache_now() -> tuple[str, int | None]:
    """The tuning cache file and its modification time now (None: no file), read before a
    decision by a caller that remembers it (``tilegemm.remembered``): a decision remembered
    under this state is stale once the file's time differs. Read before, not after: a
    file written while the call ran (by ``tilegemm tune``, or another thread's call that
    re-read it) would otherwise stamp the older decision with the newer time, for good."""
    path = tcache.cache_path()
    return str(path), _mtime(path)


def _entries() -> list[tcache.Entry]:
    """The cache's entries, re-read only when the file (or its location) changes."""
    path = tcache.cache_path()
    mtime = _mtime(path)
    if _loaded["path"] != path or _loaded["mtime"] != mtime:
        entries = tcache.load(path) if mtime else []
        with _LOADING:
            _loaded.update(path=path, mtime=mtime, entries=entries)
            _memo.clear()
    return _loaded["entries"]


_memo: dict[tuple[Any, ...], Any] = {}  # answers per device, dtype and shape bucket


def _kept(key: tuple[Any, ...], entries: list[tcache.Entry], answer: Any) -> Any:
    """``answer``, computed from ``entries``, kept in ``_memo`` unless the file was re-read
    since (a new list): another thread then cleared ``_memo`` after ``entries`` were read,
    and an answer stored after that clear would outlive it."""
    with _LOADING:
        if _loaded["entries"] is entries:
            _memo[key] = answer
    return answer


def auto_choice(backend: Backend, target: Target, prob: GemmProblem) -> Choice:
    """What ``kernel="auto"`` runs on ``target`` for ``prob``: (rung, full parameters).

    Raises (TypeError: no rung supports the dtype; ValueError: the default rung does not
    fit the device) only when nothing can run.
    """
    spec, resolved, _ = auto_plan(backend, target, prob)
    return spec, resolved


def auto_plan(backend: Backend, target: Target, prob: GemmProblem
              ) -> tuple[KernelSpec, dict[str, int], str]:
    """:func:`auto_choice` with why: "tuned", "simulator", "database (device)",
    "database (isa)" or "default" (see the module docstring for the order)."""
    choice = tuned_choice(backend, prob, target)
    if choice is not None:
        return (*choice, "simulator" if target.simulated else "tuned")
    db = _database(backend, target, prob.dtype.name, _shape(prob))
    if db is not None:
        return for_shape(backend, target, prob, *db)
    spec = registry.default_for(backend.name, prob.dtype)
    resolved = backend.resolve(spec, {}, target)
    backend.check_limits(spec, resolved, prob.dtype, target)
    return for_shape(backend, target, prob, spec, resolved, "default")


def named_plan(backend: Backend, target: Target, prob: GemmProblem, kernel: str
               ) -> tuple[KernelSpec, dict[str, int], str] | None:
    """What a rung named without parameters (``matmul(kernel="blocked")``) runs when this
    device has measured parameters for that rung: the tuning cache's entry for the rung and
    the shape's bucket ("tuned"), else the shipped database's entry for the device or its
    ISA when it is for the same rung; None: the rung's defaults.

    Why: the defaults are generic. The CPU rung's 16×8 tile spills on AVX2 machines, where
    the database's 6×16 runs about twice as fast, and a user naming the rung should not get
    half of what ``kernel="auto"`` gives. No shape adaptation: a named rung keeps its tiles.
    """
    if target.simulated:
        return None
    dtype = prob.dtype.name
    dev = device_id(target)
    entries = _entries()
    from tilegemm.tune import database

    # the cache's entries are per bucket, the database's per class of shapes: both decide
    key = ("named", dev, dtype, kernel, tuple(tcache.shape_bucket(prob.m, prob.n, prob.k)),
           database.shape_class(_shape(prob)))
    if key not in _memo:
        choice = _choose(backend, target, dev, dtype, prob, entries, kernel)
        db = _database(backend, target, dtype, _shape(prob))
        return _kept(key, entries, (*choice, "tuned") if choice is not None
                     else db if db is not None and db[0].name == kernel else None)
    return _memo[key]


def unbounded_database_plan(backend: Backend, target: Target, dtype: str, kernel: str,
                            other_than: dict[str, int]
                            ) -> list[tuple[KernelSpec, dict[str, int], str]]:
    """The database's entry for this device that serves every shape, as [(rung, params,
    why)] when it is for rung ``kernel`` and differs from ``other_than``, else []: the
    fall-back base for parameters given by hand that do not fit a shape-bounded entry."""
    found = _database(backend, target, dtype, None)
    if found is None or found[0].name != kernel or found[1] == other_than:
        return []
    return [found]


def for_shape(backend: Backend, target: Target, prob: GemmProblem, spec: KernelSpec,
               params: dict[str, int], source: str) -> tuple[KernelSpec, dict[str, int], str]:
    """The untuned choice adapted to this problem on this device by the rung's own
    ``shape_params`` (smaller tiles, split-K), when the product's tiles cannot fill the
    device; checked like any parameters, and kept as it was if the adaptation does not fit.
    A tuned entry never comes here: it was measured for the shape."""
    if spec.shape_params is None or target.simulated:
        return spec, params, source
    found = spec.shape_params(params, prob, target)
    if found is None:
        return spec, params, source
    shaped, why = found
    try:
        resolved = backend.resolve(spec, shaped, target)
        backend.check_limits(spec, resolved, prob.dtype, target)
    except (ValueError, TypeError):
        return spec, params, source
    return spec, resolved, f"{source}; {why}"


_db_memo: dict[tuple[Any, ...], tuple[KernelSpec, dict[str, int], str] | None] = {}


def _shape(prob: GemmProblem) -> tuple[int, int, int]:
    return prob.m, prob.n, prob.k


def _database(backend: Backend, target: Target, dtype: str,
              shape: tuple[int, int, int] | None
              ) -> tuple[KernelSpec, dict[str, int], str] | None:
    """:func:`_database_choice`, once per (device, dtype, class of shapes): the database
    does not change, and only the entries' "min_shape" bounds tell shapes apart (None: a
    product of unknown shape, served by the unbounded entries only)."""
    from tilegemm.tune import database

    key = ("database", target.key, dtype,
           None if shape is None else database.shape_class(shape))
    if key not in _db_memo:
        _db_memo[key] = _database_choice(backend, target, dtype, shape)
    return _db_memo[key]


def _database_choice(backend: Backend, target: Target, dtype: str,
                     shape: tuple[int, int, int] | None = None
                     ) -> tuple[KernelSpec, dict[str, int], str] | None:
    """The database's entry for the device, dtype and product shape (None: only entries
    for every shape), as (rung, resolved parameters, why), if it fits the device."""
    from tilegemm.tune import database

    found = database.lookup(target, dtype, shape=shape)
    if found is None:
        return None
    entry, tier = found
    choice = _usable(backend, target, entry["kernel"], entry["params"], dtype)
    if choice is None:
        return None
    bound = database.bound_text(entry)
    return (*choice, f"database ({tier}; {bound})" if bound else f"database ({tier})")


def tuned_choice(backend: Backend, prob: GemmProblem,
                 target: Target | None = None) -> Choice | None:
    """(rung, full parameters) from the simulator rule or the cache, or None for the
    registry default."""
    if target is None:
        status = backend.status()
        if not status.usable or status.default_problem:
            return None
        target = backend.target()
    dtype = prob.dtype.name
    if target.simulated:
        return _simulator_choice(backend, dtype)
    dev = device_id(target)
    entries = _entries()
    key = (dev, dtype, tuple(tcache.shape_bucket(prob.m, prob.n, prob.k)))
    if key not in _memo:
        return _kept(key, entries, _choose(backend, target, dev, dtype, prob, entries))
    return _memo[key]


def _choose(backend: Backend, target: Target, dev: DeviceId, dtype: str, prob: GemmProblem,
            entries: list[tcache.Entry], kernel: str | None = None) -> Choice | None:
    """The cache's best entry for the shape (``kernel``: that rung's) that still fits; an
    entry that no longer does is skipped with a warning, and the next one is tried."""
    for entry in tcache.ranked(entries, dev, dtype, prob.m, prob.n, prob.k, kernel=kernel):
        choice = _usable(backend, target, entry.kernel, entry.params, dtype)
        if choice is not None:
            return choice
        warnings.warn(f"tuning cache entry {entry.kernel} {entry.params} does not fit this "
                      "tilegemm/device any more; ignoring it", TuneCacheWarning,
                      stacklevel=user_stacklevel())
    return None


def untuned_choice(backend: Backend, dtype: str, target: Target | None = None,
                   prob: GemmProblem | None = None) -> Choice | None:
    """What ``kernel="auto"`` picks with an empty cache: the database's entry for the
    device, else the registry default at its (device-resolved) defaults; for ``prob``,
    adapted to its shape as ``kernel="auto"`` does (:func:`for_shape`). ``tilegemm tune``
    times it as the baseline, so a tuned entry replaces it only by being faster."""
    target = target or backend.target()
    db = _database_choice(backend, target, dtype, None if prob is None else _shape(prob))
    if db is not None:
        choice: Choice | None = (db[0], db[1])
    else:
        try:
            spec = registry.default_for(backend.name, dtype)
        except TypeError:
            return None
        choice = _usable(backend, target, spec.name, {}, dtype)
    if choice is None or prob is None:
        return choice
    spec, params, _ = for_shape(backend, target, prob, choice[0], choice[1], "")
    return spec, params


def _usable(backend: Backend, target: Target, kernel: str, params: dict[str, int],
            dtype: str) -> Choice | None:
    """The (spec, resolved params) if the rung exists, supports dtype and fits the device."""
    try:
        spec = registry.get(kernel, backend.name)
        if not spec.supports(dtype) or spec.precisions:
            return None  # reduced-precision rungs run only on request (precision=)
        resolved = backend.resolve(spec, params, target)
        backend.check_limits(spec, resolved, dtype, target)
    except (ValueError, TypeError):
        return None
    return spec, resolved


def _simulator_choice(backend: Backend, dtype: str) -> Choice | None:
    specs = [s for s in registry.specs_for(backend.name)
             if s.supports(dtype) and s.sim_params is not None and not s.precisions]
    if not specs:
        return None
    spec = max(specs, key=lambda s: s.rung)
    return spec, spec.resolve(spec.sim_params)


def tuned_precision_params(backend: Backend, target: Target, prob: GemmProblem, kernel: str,
                           precision: str) -> dict[str, int] | None:
    """Tuned parameters of tensor-core rung ``kernel`` computing ``precision`` (float32) or
    the 16-bit ``prob.dtype`` ("ieee": their one mode), from the cache entries ``tilegemm
    tune --precision``/``--dtype float16`` recorded for this device, else None (the rung's
    defaults). Entries are matched on precision, so TF32 parameters never serve 3xTF32."""
    if target.simulated:
        return None
    dev = device_id(target)
    entries = _entries()
    key = ("precision", dev, prob.dtype.name, precision, kernel,
           tuple(tcache.shape_bucket(prob.m, prob.n, prob.k)))
    if key not in _memo:
        choice = None
        for entry in tcache.ranked(entries, dev, prob.dtype.name, prob.m, prob.n, prob.k,
                                   kernel=kernel, precision=precision):
            try:
                spec = registry.get(kernel, backend.name)
                resolved = backend.resolve(spec, entry.params, target)
                backend.check_limits(spec, resolved, prob.dtype, target)
            except (ValueError, TypeError):
                warnings.warn(f"tuning cache entry {entry.kernel} {entry.params} does not fit "
                              "this tilegemm/device any more; ignoring it", TuneCacheWarning,
                              stacklevel=user_stacklevel())
                continue
            choice = (spec, resolved)
            break
        found = _kept(key, entries, choice)
    else:
        found = _memo[key]
    return None if found is None else dict(found[1])
