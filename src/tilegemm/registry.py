"""The one registry of kernels ("rungs") that the API, CLI, tests, tuner and benchmark read.

Why a registry: in kernel ladders the list of kernels tends to live in several places (a
switch, a range check, a plot script, a shell loop) that drift apart. Here each rung is one
module under ``tilegemm.kernels.<backend>`` that defines a module-level ``SPEC``; discovery
imports those modules (they import only NumPy and this module at top level; GPU libraries
are imported inside ``build``), so listing kernels never touches a GPU.

Parameters and constraints are data: the launcher validates with them, the tuner prunes
with the same predicates, and error messages quote the constraint text.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from itertools import product
from typing import Any

import numpy as np

from tilegemm.errors import InvalidTypeError, InvalidValueError


@dataclass(frozen=True)
class BackendLine:
    """A backend as registered: its name (``tilegemm.backends.<name>`` defines ``BACKEND``)
    and what must be known without importing it, so that a host product's first call
    imports and probes no GPU library it cannot use."""

    name: str
    array_kind: str  # its Backend.array_kind: the arrays it owns ("host", "cuda", "opencl")
    gpu_hint: str  # the cheap check (tilegemm.backends._probe.HINTS) before probing for a GPU


# One registration line per backend, in backend="auto"'s order of preference.
REGISTERED: tuple[BackendLine, ...] = (
    BackendLine("cuda", "cuda", "cuda_driver"),
    BackendLine("opencl", "opencl", "gpu_device_node"),
    BackendLine("cpu", "host", "none"),
    BackendLine("cudac", "cuda", "cuda_driver"),
)
BACKENDS: tuple[str, ...] = tuple(b.name for b in REGISTERED)
FLOATS: tuple[str, ...] = ("float32", "float64")
INTS: tuple[str, ...] = ("int32", "int64")


@dataclass(frozen=True)
class Param:
    """One integer compile-time parameter of a rung (a tile size, a thread count...)."""

    name: str
    default: int
    choices: tuple[int, ...]
    help: str = ""
    # False: not searched by the tuner, which holds it at the value kernel="auto" uses for
    # the shape being tuned: a launch strategy chosen per shape (pipelined's SPLIT_K) would
    # otherwise multiply the candidates, most of them pointless for that shape.
    searched: bool = True


def changed(params: tuple[Param, ...], name: str, **changes: Any) -> tuple[Param, ...]:
    """``params`` with the one called ``name`` changed (``default=``, ``choices=``...): for
    a rung that keeps the previous rung's parameters but one."""
    if name not in {q.name for q in params}:
        raise KeyError(f"no parameter {name!r} to change")
    return tuple(replace(q, **changes) if q.name == name else q for q in params)


@dataclass(frozen=True)
class Constraint:
    """A predicate over a full parameter set; ``text`` is what the user sees when it fails."""

    text: str
    check: Callable[[Mapping[str, int]], bool]


@dataclass(frozen=True, eq=False)  # hashed by identity: one object per rung
class KernelSpec:
    """Everything known about one rung, declared once.

    ``build(params, dtype)`` returns the backend's compiled program (imports GPU libraries
    lazily). ``threads(params)`` is threads (work-items) per block and ``smem(params,
    itemsize)`` the static shared (local) memory in bytes; backends check both against the
    device limits before a launch, and the analysis and tuner use them too.
    """

    name: str
    backend: str
    rung: int
    title: str
    build: Callable[[Mapping[str, int], np.dtype], Any]
    params: tuple[Param, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    dtypes: tuple[str, ...] = FLOATS
    threads: Callable[[Mapping[str, int]], int] | None = None
    smem: Callable[[Mapping[str, int], int], int] | None = None
    doc: str = ""
    # Parameters for numba's CUDA simulator, which runs one Python thread per GPU thread:
    # the smallest valid tiles. kernel="auto" uses them there (speed means nothing).
    sim_params: Mapping[str, int] | None = None
    # Measured defaults per kind of device ("cpu", "gpu"...) replacing the rung's own,
    # when they fit the caller's overrides (OpenCL rungs tuned for PoCL on a CPU).
    device_defaults: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # The parameter sets worth timing on a kind of device ("cpu", "gpu"...), where most of
    # the valid ones are known to be slow there: the tuner searches only those (OpenCL
    # `vectorized` on a CPU device: one work-item per work-group).
    device_space: Mapping[str, Callable[[Mapping[str, int]], bool]] = field(
        default_factory=dict)
    # kernel="auto" picks this rung (at its defaults) before anything is tuned; a backend
    # without a flagged rung gets its highest rung. See :func:`default_for`.
    auto: bool = False
    # A rung that computes at a reduced precision (tensor cores) maps each precision= it
    # computes to the value of its parameter ``precision_param``; it runs only on request.
    precisions: Mapping[str, int] = field(default_factory=dict)
    precision_param: str = ""
    # The oldest CUDA compute capability whose instructions the rung uses, e.g. (8, 0).
    min_cc: tuple[int, int] | None = None
    # Why ``params`` cannot compute ``dtype`` (None when they can), for parameters valid for
    # one dtype and not another (rung mma: BK a multiple of 16 for 16-bit operands). The
    # limit checks refuse such a call before anything runs; the tuner prunes it.
    dtype_check: Callable[[Mapping[str, int], np.dtype], str | None] | None = None
    # kernel="auto" without a tuned entry: ``shape_params(params, problem, target)`` may
    # adapt the default (or database) parameters to one problem on one device, e.g. smaller
    # tiles or split-K when the tiles of C cannot fill the GPU. Returns (parameters, why),
    # or None to keep them. Reads only facts the Target holds (its SM count...).
    shape_params: Callable[[Mapping[str, int], Any, Any], tuple[dict[str, int], str] | None
                           ] | None = None
    # The rung's shared memory is dynamic (sized by each launch): it may use up to the
    # device's opt-in maximum per block (Limits.shared_optin_per_block), not only the 48 KB
    # a kernel may declare statically. Rung mma's cp.async ring.
    dynamic_smem: bool = False
    # The one compute capability whose architecture-specific instructions the rung uses
    # (rung wgmma: (9, 0), the sm_90a target): compiled for that target only, and refused
    # on any other GPU (a newer one lacks them too).
    only_cc: tuple[int, int] | None = None
    # Runs only when named: kernel="auto" and the tuner's untuned baseline pass it over.
    # For a rung not yet verified on hardware (rung wgmma was, until it ran on an H100).
    named_only: bool = False

    def __repr__(self) -> str:
        """One short line (``tilegemm.kernels()`` at the prompt lists dozens of rungs):
        which rung, and its parameters at their defaults."""
        params = "".join(f" {p.name}={p.default}" for p in self.params)
        return f"<KernelSpec {self.key} (rung {self.rung}){params}>"

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.name}"

    @property
    def summary(self) -> str:
        """First paragraph of the rung module's docstring: what changed and why."""
        text = (self.doc or "").strip().split("\n\n")[0]
        return " ".join(text.split())

    def defaults(self) -> dict[str, int]:
        return {p.name: p.default for p in self.params}

    def resolve(self, overrides: Mapping[str, Any] | None = None) -> dict[str, int]:
        """Fill defaults and validate; raise ``ValueError`` naming what failed."""
        overrides = dict(overrides or {})
        params, failed = self._filled(overrides)
        if failed:
            raise InvalidValueError(self._constraint_message(failed, params, set(overrides)))
        return params

    def _filled(self, overrides: Mapping[str, Any]) -> tuple[dict[str, int], list[Constraint]]:
        """The defaults with ``overrides`` in, and the constraints they fail; raises
        ``ValueError`` for an unknown parameter, a non-integer or a value not offered."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            allowed = ", ".join(known) or "none"
            raise InvalidValueError(
                f"kernel {self.name!r} ({self.backend}) has no parameter(s) {', '.join(unknown)}; "
                f"its parameters are: {allowed}"
            )
        params = self.defaults()
        for name, value in overrides.items():
            p = known[name]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidValueError(
                    f"{self.name}: parameter {name} must be an integer, got {value!r}")
            if int(value) not in p.choices:
                raise InvalidValueError(
                    f"{self.name}: {name}={value} is not allowed; choose one of "
                    f"{', '.join(map(str, p.choices))}"
                )
            params[name] = int(value)
        return params, [c for c in self.constraints if not c.check(params)]

    def _constraint_message(self, failed: list[Constraint], params: Mapping[str, int],
                            given: set[str]) -> str:
        """Every failed constraint with the values it read, those the caller gave first and
        defaults marked as such: a default the caller never set (TN=4) is otherwise easily
        taken for the cause when two given values (BK=4, VW=8) conflict."""
        def names(c: Constraint) -> list[str]:
            words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", c.text)
            return list(dict.fromkeys(w for w in words if w in params))

        failed = sorted(failed, key=lambda c: not set(names(c)) <= given)
        parts = [f"'{c.text}' fails" + (" for " + ", ".join(
            f"{n}={params[n]}" + ("" if n in given else " (default)") for n in names(c))
            if names(c) else "") for c in failed]
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        hint = ("; values marked (default) can be set too"
                if any("(default)" in part for part in parts) else "")
        return f"{self.name}: constraint {'; '.join(parts)} (all parameters: {shown}){hint}"

    def is_valid(self, params: Mapping[str, int]) -> bool:
        """Same predicates as :meth:`resolve`, without raising (for pruning a search) or
        writing the message a refusal would carry: a search space has up to hundreds of
        thousands of combinations, and writing those messages was most of the time to list
        the CUDA rung pipelined's space (288,000 combinations, 55,125 valid: 15.6 s on a
        Xeon VM, 1.0 s since :meth:`space` checks the constraints alone)."""
        try:
            return not self._filled(params)[1]
        except ValueError:
            return False

    def outputs_per_thread(self, params: Mapping[str, int]) -> int | None:
        """Results each thread holds in registers for the whole k loop (None: unknown).

        A block computes a BM×BN (or TILE×TILE, BLOCK×BLOCK) tile of C with
        ``threads(params)`` threads, so each thread owns tile/threads accumulators, live
        from the first k step to the store. That count is a floor under the registers the
        kernel needs, known without compiling: the tuner uses it to skip parameter sets
        that must spill (and whose fully unrolled code takes minutes to compile).
        """
        if self.threads is None:
            return None
        if "BM" in params and "BN" in params:
            tile = params["BM"] * params["BN"]
        elif "TILE" in params:
            tile = params["TILE"] ** 2
        elif "BLOCK" in params:
            tile = params["BLOCK"] ** 2
        else:
            return None
        return max(1, tile // self.threads(params))

    def space(self, fixed: Mapping[str, int] | None = None) -> Iterable[dict[str, int]]:
        """Every valid parameter combination (the tuner's search space before device limits),
        or, with ``fixed``, those that hold each of its parameters at its value (none where a
        value is not offered). The product runs over the free parameters only: the CPU
        rung's full grid is about 10 million combinations, of which the tuner, holding its
        four path parameters, wants a few hundred (filtering the full grid took about a
        minute on a 2-vCPU machine)."""
        fixed = fixed or {}
        names = [p.name for p in self.params]
        choices = [tuple(v for v in p.choices if v == fixed[p.name]) if p.name in fixed
                   else p.choices for p in self.params]
        for values in product(*choices):
            candidate = dict(zip(names, values))  # every parameter, each an offered value
            if all(c.check(candidate) for c in self.constraints):
                yield candidate

    def supports(self, dtype: np.dtype | str) -> bool:
        return np.dtype(dtype).name in self.dtypes

    def program(self, params: Mapping[str, int], dtype: np.dtype | str) -> Any:
        """The compiled program for (params, dtype), built once per process and kept."""
        return _build(self, tuple(sorted(params.items())), np.dtype(dtype).name)


class _BuiltOnce:
    """``functools.cache`` for compiled programs, built once per key even when several
    threads ask for one at the same time (a thread pool's first products): the others
    wait for that build instead of each building (compiling, or loading from the disk
    cache) its own copy. ``__wrapped__`` builds afresh; ``cache_clear`` forgets."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.__wrapped__ = func
        self._done: dict[tuple[Any, ...], Any] = {}
        self._locks: dict[tuple[Any, ...], threading.RLock] = {}
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # A build another thread of the parent was running never ends here; its lock would
        # hang the child's first call for the same program. Fresh locks; what was built
        # stays built.
        self._lock = threading.Lock()
        self._locks = {}

    def __call__(self, *key: Any) -> Any:
        try:
            return self._done[key]
        except KeyError:
            pass
        with self._lock:
            lock = self._locks.setdefault(key, threading.RLock())
        with lock:
            if key not in self._done:  # a failed build is not kept: the next call retries
                self._done[key] = self.__wrapped__(*key)
            return self._done[key]

    def cache_clear(self) -> None:
        with self._lock:
            self._done.clear()
            self._locks.clear()


@_BuiltOnce
def _build(spec: KernelSpec, params: tuple[tuple[str, int], ...], dtype: str) -> Any:
    from tilegemm.compile_cache import describing  # how `tilegemm cache` lists what it keeps

    with describing({"kernel": spec.name, "backend": spec.backend, "params": dict(params),
                     "dtype": dtype}):
        return spec.build(dict(params), np.dtype(dtype))


def _discover_backend(backend: str) -> list[KernelSpec]:
    pkg = importlib.import_module(f"tilegemm.kernels.{backend}")
    specs = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue  # private helpers may import GPU libraries; never at discovery
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if isinstance(spec, KernelSpec):
            specs.append(spec)
    return specs


@cache
def _specs_of(backend: str) -> tuple[KernelSpec, ...]:
    """One backend's rungs, ordered by rung number. Discovered per backend, so a CPU call
    never imports the CUDA rung modules (a fresh process's first call pays for what it uses)."""
    specs = _discover_backend(backend)
    seen: set[str] = set()
    for s in specs:
        if s.key in seen:
            raise RuntimeError(f"kernel {s.key} is registered twice")
        seen.add(s.key)
    return tuple(sorted(specs, key=lambda s: (s.rung, s.name)))


def all_specs() -> tuple[KernelSpec, ...]:
    """Every registered rung, ordered by backend then rung number."""
    return tuple(s for backend in BACKENDS for s in _specs_of(backend))


def specs_for(backend: str) -> tuple[KernelSpec, ...]:
    return _specs_of(backend) if backend in BACKENDS else ()


def get(name: str, backend: str) -> KernelSpec:
    """Look a rung up by name on a backend; the error lists the choices."""
    for s in specs_for(backend):
        if s.name == name:
            return s
    choices = ", ".join(s.name for s in specs_for(backend)) or "none"
    elsewhere = [b for b in BACKENDS if b != backend and any(s.name == name
                                                             for s in specs_for(b))]
    raise InvalidValueError(
        f"unknown kernel {name!r} for backend {backend!r}{_elsewhere_hint(name, elsewhere)}; "
        f"choices: {choices}")


def backends_phrase(names: list[str]) -> str:
    """"backend 'cuda'" or "backends 'cuda', 'opencl' and 'cudac'", for messages."""
    quoted = [repr(n) for n in names]
    if len(quoted) == 1:
        return f"backend {quoted[0]}"
    return f"backends {', '.join(quoted[:-1])} and {quoted[-1]}"


def _elsewhere_hint(name: str, elsewhere: list[str]) -> str:
    """Which other backends have a rung called ``name``, the usable ones first, and the one
    to pass: a hint that names a backend this machine cannot run would only lead to the
    next error."""
    if not elsewhere:
        return ""
    from tilegemm.backends import get_backend  # only on this error path: probes backends

    usable = [b for b in elsewhere if get_backend(b).status().usable]
    others = [b for b in elsewhere if b not in usable]
    not_here = "not usable here" if len(others) == 1 else "none of them usable here"
    if not usable:
        return f" (kernel {name!r} is a rung of {backends_phrase(others)}, {not_here})"
    text = f" (kernel {name!r} is a rung of {backends_phrase(usable)}: pass " \
        f"backend={usable[0]!r}"
    if others:  # after the advice, so "not usable" cannot be read as said of the usable one
        text += f"; also of {backends_phrase(others)}, {not_here}"
    return text + ")"


class ParametersNeedKernel(InvalidValueError):
    """Rung parameters (``TILE=16``) given with ``kernel="auto"``, which chooses its own.

    Raised by the Python API in its own words; ``params`` and :meth:`wording` let the
    command line say the same in terms of its options (``--kernel``).
    """

    def __init__(self, params: Iterable[str]) -> None:
        self.params = tuple(params)
        super().__init__(self.wording())

    def wording(self, option: str = "kernel=", auto: str = "kernel='auto'") -> str:
        """The message with ``option`` for how a kernel is named and ``auto`` for the
        automatic choice (the command line: ``"--kernel"``, ``"--kernel auto"``)."""
        return (f"parameters {', '.join(self.params)} need an explicit {option} ({auto} "
                "chooses its own)")


def default_for(backend: str, dtype: np.dtype | str) -> KernelSpec:
    """The built-in rung for ``kernel="auto"``: the rung flagged ``auto=True`` that supports
    ``dtype``, else the highest rung that does.

    The tuner's cache, when it has an entry for the device and shape, takes precedence (see
    :func:`tilegemm.tune.select.auto_choice`, the one place "auto" is decided); this is the
    fallback and needs no measurement.
    """
    # Rungs that compute at a reduced precision (tensor cores) run only on request.
    candidates = [s for s in specs_for(backend)
                  if s.supports(dtype) and not s.precisions]
    if not candidates:
        raise InvalidTypeError(f"no {backend} kernel supports dtype {np.dtype(dtype).name}")
    flagged = [s for s in candidates if s.auto]
    return max(flagged or candidates, key=lambda s: s.rung)
