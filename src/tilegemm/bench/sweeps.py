"""Benchmark plans: the cases of the selected reports, built from the registry, and the loop
that runs them.

Each report (``compile``, ``sizes``, ``rsweep``, ``ladder``...) is one module of
:mod:`tilegemm.bench.reports` declaring its cases (a rung or the vendor library,
parameters, size) and its tables. Nothing here lists kernels: which rungs exist, their
parameters and which values are valid all come from :mod:`tilegemm.registry`, so a new
rung shows up in every table.
Identical cases in several reports are measured once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.backends.base import Backend
from tilegemm.bench.reports import PlanContext, all_reports
from tilegemm.bench.reports import names as report_names
from tilegemm.bench.results import Results
from tilegemm.bench.timing import (
    AUTO_SOURCE,
    OK,
    PARAMS_DEFAULTS,
    SKIPPED,
    Clock,
    Measurement,
    Policy,
    host_work,
    measure_kernel,
)
from tilegemm.bench.vendors import (
    Vendor,
    find_rival,
    find_vendor,
    measure_vendor,
    rivals_for,
    vendor_math,
)
from tilegemm.errors import UnavailableError
from tilegemm.problem import GemmProblem
from tilegemm.reference import random_operands
from tilegemm.registry import KernelSpec

REPORTS: tuple[str, ...] = report_names()  # the --reports choices, in table order
SEED_SIZES: tuple[int, ...] = tuple(2**i for i in range(3, 13))  # 8 … 4096


@dataclass(frozen=True)
class Settings:
    """What to run. ``quick()`` is ``make demo``; ``full()`` is the optimisation note's sizes."""

    dtype: str = "float32"
    # "ieee": the FFMA rungs against the dtype's own GEMM; "tf32"/"3xtf32" (float32), or a
    # 16-bit dtype: the tensor-core rungs, against cuBLAS at that precision (vendor_math).
    precision: str = "ieee"
    reports: tuple[str, ...] = REPORTS
    sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    blocks: tuple[int, ...] = (8, 16, 32)
    ladder_sizes: tuple[int, ...] = (256,)
    r_size: int = 256
    r_values: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    compile_size: int = 256
    policy: Policy = field(default_factory=lambda: Policy(budget_s=0.2, max_reps=50))
    max_call_s: float = 5.0  # skip a case whose expected time per call exceeds this (0: never)
    profile: str = "quick"
    # time other Python-authored GEMMs (Triton's) beside the vendor library, where present;
    # off when a run has a hard time limit and must not pay their compiles and autotuning
    rivals: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        return replace(cls(), **overrides)

    @classmethod
    def full(cls, **overrides: Any) -> Settings:
        base = cls(sizes=SEED_SIZES, ladder_sizes=(1024, 4096), r_size=1024, compile_size=256,
                   policy=Policy(budget_s=1.0, max_reps=200), max_call_s=30.0, profile="full")
        return replace(base, **overrides)

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "policy"}
        d["policy"] = {k: getattr(self.policy, k) for k in self.policy.__dataclass_fields__}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True)
class Case:
    """One thing to measure: a rung with parameters, or (``spec=None``) the vendor library,
    or the rival named by ``rival`` (:data:`tilegemm.bench.vendors.RIVALS`)."""

    report: str
    backend: str
    m: int
    n: int
    k: int
    spec: KernelSpec | None = None
    params: tuple[tuple[str, int], ...] = ()
    rival: str = ""
    # Where params came from (Measurement.sources): PARAMS_DEFAULTS, "auto: <why>", or ""
    # for a report's own choice (a block size swept). Not part of the key: the same kernel
    # reached two ways is measured once and records both.
    source: str = ""

    @property
    def key(self) -> tuple[Any, ...]:
        who = self.spec.key if self.spec else self.rival or "vendor"
        return (self.backend, who, self.params, self.m, self.n, self.k)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def label(self) -> str:
        who = self.spec.name if self.spec else self.rival or "vendor"
        shown = " ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.backend}:{who} {shown} {self.m}×{self.n}×{self.k}".replace("  ", " ")


def _case(report: str, backend: str, n: int, spec: KernelSpec | None = None,
          overrides: dict[str, int] | None = None, rival: str = "") -> Case:
    """A case with the rung's full parameter set (defaults filled in, declaration order),
    so the same kernel at the same size is one key in every report."""
    if spec is None:
        return Case(report, backend, n, n, n, rival=rival)
    try:  # through the backend, as matmul does: per-device defaults apply (OpenCL)
        from tilegemm.backends import get_backend

        merged = get_backend(backend).resolve(spec, overrides or {})
    except (ValueError, UnavailableError):  # refused parameters, or no device to ask:
        merged = {**spec.defaults(), **(overrides or {})}  # measure_kernel reports it
    params = tuple((p.name, merged[p.name]) for p in spec.params)
    return Case(report, backend, n, n, n, spec, params)


def rungs_for(backend: str, dtype: np.dtype | str, precision: str = "ieee",
              specs_for: Callable[[str], Iterable[KernelSpec]] | None = None,
              ) -> dict[KernelSpec, tuple[str, int] | None]:
    """The rungs of ``backend`` a benchmark of ``dtype`` at ``precision`` runs, each with
    the parameter it must hold fixed: the IEEE rungs for "ieee"; the tensor-core rungs,
    precision parameter pinned, for "tf32", "3xtf32" and 16-bit dtypes (compared with the
    vendor at that precision, never with SGEMM for TF32). Empty when the backend has none."""
    from tilegemm.tune.space import precision_pin

    specs_for = specs_for or registry.specs_for
    dtype = np.dtype(dtype)
    pins = {s: precision_pin(s, dtype, precision) for s in specs_for(backend)
            if s.supports(dtype)}
    return {s: pin for s, pin in pins.items() if pin is not False}


def auto_pick(backend: str, n: int, dtype: np.dtype | str, precision: str = "ieee",
              ) -> tuple[KernelSpec, dict[str, int], str] | None:
    """(rung, parameters, why) that ``matmul(a, b, backend=backend, precision=...)`` runs
    for n×n×n operands of ``dtype`` on the backend's default device: the same decision
    (:func:`tilegemm.plan`: tuning cache, shipped database, defaults, shape adaptation),
    made on zero-stride stand-ins so nothing is allocated. None when auto cannot run it."""
    from tilegemm.errors import UsageError
    from tilegemm.plan import plan as plan_call

    stand_in = np.broadcast_to(np.zeros((), dtype=np.dtype(dtype)), (n, n))
    try:
        chosen = plan_call(stand_in, stand_in, backend=backend,
                           precision=None if precision == "ieee" else precision)
        return registry.get(chosen.kernel, backend), dict(chosen.params), chosen.source
    except (UsageError, ValueError, TypeError):
        return None


def plan(
    backends: Sequence[str], settings: Settings,
    specs_for: Callable[[str], Iterable[KernelSpec]] | None = None,
) -> list[Case]:
    """Every case of the selected reports: the cold reports' cases first (compile: so their
    first call is the cold one), then the rest in ascending size (so slow rungs are skipped at sizes
    their smaller runs predict to be too slow). ``specs_for`` defaults to the registry."""
    pins = {be: rungs_for(be, settings.dtype, settings.precision, specs_for) for be in backends}

    def case(report: str, backend: str, n: int, spec: KernelSpec | None = None,
             overrides: dict[str, int] | None = None, rival: str = "") -> Case:
        if spec is None:
            return _case(report, backend, n, rival=rival)
        pin = pins[backend].get(spec)
        fixed = {pin[0]: pin[1]} if pin else {}
        source = "" if overrides else PARAMS_DEFAULTS
        return replace(_case(report, backend, n, spec, {**(overrides or {}), **fixed}),
                       source=source)

    def auto_case(report: str, backend: str, n: int) -> Case | None:
        found = auto_pick(backend, n, settings.dtype, settings.precision)
        if found is None or found[0] not in pins[backend]:
            return None  # nothing auto runs here, or a rung this benchmark leaves out
        spec, params, why = found
        return replace(_case(report, backend, n, spec, params), source=AUTO_SOURCE + why)

    ctx = PlanContext(tuple(backends), settings, {be: list(pins[be]) for be in backends},
                      case, auto_case,
                      rivals={be: _rivals(be) if settings.rivals else () for be in backends})
    first: list[Case] = []
    rest: list[Case] = []
    for name, report in all_reports().items():
        if name in settings.reports:
            (first if report.cold else rest).extend(report.cases(ctx))
    rest.sort(key=lambda c: c.flops)  # stable: report order kept within a size
    return first + rest


def _rivals(backend: str) -> tuple[str, ...]:
    """The rivals timed beside the vendor library on the backend's default device."""
    try:
        return rivals_for(get_backend(backend).target())
    except Exception:  # no device to ask: nothing to time it on
        return ()


@dataclass
class RunState:
    """What a sweep remembers between cases: results by key, vendors, history for skips."""

    measurements: list[Measurement] = field(default_factory=list)
    by_key: dict[tuple[Any, ...], Measurement] = field(default_factory=dict)
    vendors: dict[str, Vendor | None] = field(default_factory=dict)
    vendor_notes: dict[str, str] = field(default_factory=dict)
    rivals: dict[tuple[str, str], Vendor | None] = field(default_factory=dict)
    rival_notes: dict[str, dict[str, str]] = field(default_factory=dict)  # backend -> name -> line
    # (backend, kernel key, params) -> (flops, seconds per call) of the largest case so far
    history: dict[tuple[Any, ...], tuple[int, float]] = field(default_factory=dict)
    # (backend, kernel key, params) that have run a case (compiled) in this sweep
    built: set[tuple[Any, ...]] = field(default_factory=set)
    operands: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def _operands(state: RunState, case: Case, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Fresh random non-zero operands per size (kept while that size is being run)."""
    key = (case.m, case.n, case.k, dtype.name)
    if key not in state.operands:
        state.operands.clear()  # one size at a time: large sizes are large
        a, b = random_operands((1, case.m, case.k), (1, case.k, case.n), dtype)
        state.operands[key] = (a, b)
    return state.operands[key]


def _vendor(state: RunState, backend: Backend, math: str = "native") -> Vendor | None:
    if backend.name not in state.vendors:
        vendor, note = find_vendor(backend, math=math)
        state.vendors[backend.name] = vendor
        state.vendor_notes[backend.name] = vendor.note if vendor else note
    return state.vendors[backend.name]


def _rival(state: RunState, backend: Backend, name: str, dtype: np.dtype,
           math: str) -> Vendor | None:
    if (backend.name, name) not in state.rivals:
        vendor, note = find_rival(name, backend.target(), dtype, math)
        state.rivals[backend.name, name] = vendor
        state.rival_notes.setdefault(backend.name, {})[name] = note
    return state.rivals[backend.name, name]


def _too_slow(state: RunState, case: Case, settings: Settings) -> str | None:
    hist_key = case.key[:3]
    prev = state.history.get(hist_key)
    if prev is None:
        return None
    flops, seconds = prev
    expected = seconds * case.flops / flops
    state.history[hist_key] = (case.flops, expected)  # chain the estimate to larger sizes
    if not settings.max_call_s or expected <= settings.max_call_s:  # 0: no limit
        return None
    return (f"expected ~{expected:.3g} s per call (scaled from a smaller size), over the "
            f"{settings.max_call_s:g} s limit (--max-call-seconds)")


def run_case(
    case: Case, settings: Settings, state: RunState, *, clock: Clock = time.perf_counter,
    backend_of: Callable[[str], Backend] = get_backend,
) -> Measurement | None:
    """Measure one case (or reuse an identical one); None if it has no vendor to run."""
    existing = state.by_key.get(case.key)
    if existing is not None:
        if case.report not in existing.reports:
            existing.reports.append(case.report)
        if case.source and case.source not in existing.sources:
            existing.sources.append(case.source)
        return existing
    dtype = np.dtype(settings.dtype)
    backend = backend_of(case.backend)
    prob = GemmProblem(m=case.m, n=case.n, k=case.k, dtype=dtype, batch_shape=(1,),
                       a_batch_shape=(1,), b_batch_shape=(1,))
    vendor = None
    if case.spec is None:
        math = vendor_math(dtype, settings.precision)
        vendor = (_rival(state, backend, case.rival, dtype, math) if case.rival
                  else _vendor(state, backend, math))
        if vendor is None:
            return None
    slow = _too_slow(state, case, settings)
    if slow is not None:
        meas = Measurement(backend=case.backend, kernel=case.spec.name if case.spec else
                           vendor.name, m=case.m, n=case.n, k=case.k, dtype=dtype.name,
                           params=dict(case.params), rung=case.spec.rung if case.spec else None,
                           vendor=case.spec is None, status=SKIPPED, reason=slow)
    else:
        a3, b3 = _operands(state, case, dtype)
        if case.spec is None:
            target = backend.target()
            flush = backend.cache_flusher(target) if settings.policy.flush else None
            meas = measure_vendor(vendor, case.backend, prob, a3, b3, settings.policy,
                                  clock=clock, host_work=host_work(prob, target), flush=flush)
        else:
            meas = measure_kernel(backend, case.spec, dict(case.params), prob, a3, b3,
                                  settings.policy, clock=clock)
        seconds = meas.stats.median if meas.status == OK and meas.stats else None
        if seconds is None and case.key[:3] in state.built:
            # no steady samples (--max-reps 0, or a failure): the first call then stands
            # for a call, but only once an earlier size compiled the rung in this run: a
            # first call that compiled (seconds, against microseconds for a small product)
            # predicted every larger size "too slow"
            seconds = meas.first_s
        if seconds is not None:
            state.history[case.key[:3]] = (case.flops, seconds)
        state.built.add(case.key[:3])
    meas.reports.append(case.report)
    if case.source:
        meas.sources.append(case.source)
    state.by_key[case.key] = meas
    state.measurements.append(meas)
    return meas


def run_plan(
    cases: Sequence[Case], settings: Settings, *, clock: Clock = time.perf_counter,
    progress: Callable[[int, int, Case], None] | None = None,
    backend_of: Callable[[str], Backend] = get_backend,
    state: RunState | None = None,
) -> RunState:
    """Run every case in order; ``progress(done, total, case)`` is called before each."""
    state = state or RunState()
    for i, case in enumerate(cases):
        if progress is not None:
            progress(i, len(cases), case)
        run_case(case, settings, state, clock=clock, backend_of=backend_of)
    if progress is not None and cases:
        progress(len(cases), len(cases), cases[-1])
    state.operands.clear()
    return state


def default_backends(include_simulated: bool = False) -> list[str]:
    """Usable backends (the simulator only when asked: it is correct but far too slow)."""
    out = []
    for name in registry.BACKENDS:
        status = get_backend(name).status()
        if status.usable and (include_simulated or not status.simulated):
            out.append(name)
    return out


def run_bench(
    backends: Sequence[str], settings: Settings, *,
    progress: Callable[[int, int, Case], None] | None = None,
    specs_for: Callable[[str], Iterable[KernelSpec]] | None = None,
    clock: Clock = time.perf_counter,
) -> Results:
    """Plan, run and package a whole benchmark with the metadata a results file needs."""
    from tilegemm.bench.environment import backend_info, git_commit, host_info, versions
    from tilegemm.bench.results import now_iso

    created = now_iso()
    cases = plan(backends, settings, specs_for)
    state = run_plan(cases, settings, progress=progress, clock=clock)
    involved = list(dict.fromkeys([*backends, *(m.backend for m in state.measurements)]))
    import tilegemm

    meta = {
        "created": created,
        "tilegemm_version": tilegemm.__version__,
        "git_commit": git_commit(),
        "host": host_info(),
        "versions": versions(),
        "settings": settings.as_dict(),
        "backends": {b: backend_info(get_backend(b)) for b in involved},
        "vendors": dict(state.vendor_notes),
        "vendor_names": {b: v.name for b, v in state.vendors.items() if v is not None},
        "rivals": {b: dict(notes) for b, notes in state.rival_notes.items()},
    }
    return Results(meta, state.measurements)
