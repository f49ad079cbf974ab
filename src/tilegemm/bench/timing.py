"""Timing kernels: the one home of every number ``tilegemm bench`` (and the tuner) reports.

The protocol, for one kernel on one problem:

1. **First call** — build (compile), upload operands and run one launch, timed on the host
   clock to the end of the launch. This is what a user waits for on a first ``matmul`` call
   (the "1st GPU time" of the Numba ROC example); it is reported apart and never mixed into steady
   figures.
2. **Verify** — the result of that first launch is fetched and compared with the float64
   reference (:func:`tilegemm.reference.assert_close`) with the output NaN-poisoned before
   the launch. A kernel that raises or computes a wrong result is reported as FAILED with
   the reason and is never timed: a fast wrong kernel has no speed.
3. **Warm-up** — a few more launches, not recorded (caches, clocks, lazy allocations).
4. **Steady** — repeats, each timed by the backend (CUDA events, OpenCL profiling, the host
   clock on the CPU) through :class:`~tilegemm.backends.base.Prepared`, until a wall-clock
   budget is spent (at least ``min_reps``, at most ``max_reps``). Optionally the L2 (or the
   CPU's last-level cache) is flushed between repeats so every launch starts cold.
   Reported: median, min, quartiles, max; GFLOP/s = 2·M·N·K·batch / median.

The clock and the :class:`Prepared` are injectable, so the statistics and the verification
logic are tested with a fake timer and fake kernels (``tests/test_bench_timing.py``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tilegemm.backends.base import Backend, Prepared, Target, poison_value
from tilegemm.bench.host_blas import quiet_check
from tilegemm.errors import InvalidValueError, UsageError
from tilegemm.problem import GemmProblem
from tilegemm.reference import assert_close
from tilegemm.registry import KernelSpec

Clock = Callable[[], float]

OK = "ok"
FAILED = "FAILED"
SKIPPED = "skipped"
WRONG = "wrong result: "  # how a FAILED reason starts when the kernel ran but was wrong
# Measurement.sources: the rung's own registry defaults for the device; kernel="auto"'s
# choice is recorded as AUTO_SOURCE + why.
PARAMS_DEFAULTS = "defaults"
AUTO_SOURCE = "auto: "


@dataclass(frozen=True)
class Policy:
    """How hard to measure one case.

    ``budget_s`` bounds the steady phase in wall-clock seconds; ``min_reps`` is honoured
    unless the steady phase passes ``hard_cap`` × budget (one very slow kernel must not stall
    a sweep). ``warmup`` launches follow the first call unless that call alone already took
    longer than the budget (it warmed everything up anyway).
    """

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 100
    budget_s: float = 0.5
    hard_cap: float = 4.0
    flush: bool = False

    def __post_init__(self) -> None:
        if self.min_reps < 0 or self.max_reps < self.min_reps:
            raise InvalidValueError(
                "need 0 <= min_reps <= max_reps (0: verify and first call only)")
        if not (math.isfinite(self.budget_s) and self.budget_s > 0) or self.warmup < 0:
            raise InvalidValueError("budget must be a finite number > 0 and warm-up >= 0")


@dataclass(frozen=True)
class Stats:
    """Order statistics of steady samples (seconds per launch)."""

    n: int
    median: float
    min: float
    q1: float
    q3: float
    max: float
    mean: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        if not samples:
            raise ValueError("no samples")
        x = np.asarray(samples, dtype=np.float64)
        q1, med, q3 = np.percentile(x, [25, 50, 75])
        return cls(len(x), float(med), float(x.min()), float(q1), float(q3), float(x.max()),
                   float(x.mean()))


@dataclass
class Measurement:
    """One kernel (or vendor routine) on one problem: outcome, first call, raw samples."""

    backend: str
    kernel: str
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "float32"
    params: dict[str, int] = field(default_factory=dict)
    rung: int | None = None
    vendor: bool = False
    status: str = OK
    reason: str = ""
    method: str = ""
    first_s: float | None = None
    samples: list[float] = field(default_factory=list)
    flushed: bool = False
    reports: list[str] = field(default_factory=list)
    # Where the parameters came from, once per way the run reached them: PARAMS_DEFAULTS
    # (the rung's registry defaults for the device) and/or "auto: <why>" (what
    # matmul(kernel="auto") runs for this product).
    sources: list[str] = field(default_factory=list)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def stats(self) -> Stats | None:
        return Stats.of(self.samples) if self.samples else None

    @property
    def gflops(self) -> float | None:
        """GFLOP/s at the median steady time (None unless the case ran and verified)."""
        s = self.stats
        if self.status != OK or s is None:
            return None
        if self.flops == 0:
            return 0.0  # an empty product: nothing to compute, whatever the timer says
        if s.median <= 0:
            return None
        return self.flops / s.median / 1e9

    @property
    def variant(self) -> str:
        """Kernel name and parameters, e.g. ``naive BLOCK=16``."""
        shown = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kernel} {shown}".strip()

    @property
    def size(self) -> str:
        if self.m == self.n == self.k:
            return f"{self.m}³" + (f"×{self.batch}" if self.batch != 1 else "")
        return f"{self.m}×{self.n}×{self.k}" + (f"×{self.batch}" if self.batch != 1 else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        s = self.stats
        d["stats"] = asdict(s) if s else None
        d["gflops"] = self.gflops
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measurement:
        """A measurement from its :meth:`to_dict` form (keys it does not know are ignored,
        so files written by a newer tilegemm still load).

        Raises ValueError naming the field when one is missing or of the wrong type: a
        results file is read from disk and may have been edited or cut short.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a measurement must be an object, not {type(d).__name__}")
        missing = [name for name in _REQUIRED if name not in d]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(map(repr, missing))}")
        nulls = [name for name in _REQUIRED if d[name] is None]
        if nulls:  # required fields are computed with (m * n * k): null is no value
            raise ValueError(f"field(s) {', '.join(map(repr, nulls))} are null")
        for name, kinds in _FIELD_TYPES.items():
            value = d.get(name)
            if name in d and value is not None and (
                    not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
                raise ValueError(f"field {name!r} is {value!r}, not of type {kinds[0].__name__}")
        for name in ("samples", "reports", "sources"):
            item_kind = (int, float) if name == "samples" else (str,)
            if any(not isinstance(x, item_kind) or isinstance(x, bool) for x in d.get(name, ())):
                raise ValueError(f"field {name!r} holds a value that is not a "
                                 f"{'number' if name == 'samples' else 'string'}")
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


_REQUIRED: tuple[str, ...] = ("backend", "kernel", "m", "n", "k")
# The type a results file must hold for each field that rendering computes with.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "backend": (str,), "kernel": (str,), "m": (int,), "n": (int,), "k": (int,),
    "batch": (int,), "dtype": (str,), "params": (dict,), "rung": (int,), "vendor": (bool,),
    "status": (str,), "reason": (str,), "method": (str,), "first_s": (float, int),
    "samples": (list,), "flushed": (bool,), "reports": (list,), "sources": (list,),
}


class KernelFailure(Exception):
    """The kernel raised or computed a wrong result; ``str(exc)`` is the reason shown."""


@contextmanager
def poisoned() -> Iterator[None]:
    """TILEGEMM_POISON=1 for the verified first launch only (steady launches skip the fill)."""
    old = os.environ.get("TILEGEMM_POISON")
    os.environ["TILEGEMM_POISON"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TILEGEMM_POISON"]
        else:
            os.environ["TILEGEMM_POISON"] = old


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"raised {type(exc).__name__}: {text}" if text else f"raised {type(exc).__name__}"


def time_prepared(
    prepare: Callable[[], Prepared],
    verify: Callable[[np.ndarray], None],
    policy: Policy,
    *,
    synchronize: Callable[[], None] = lambda: None,
    clock: Clock = time.perf_counter,
    flush: Callable[[], None] | None = None,
    host_work: int = 0,
) -> tuple[float, list[float]]:
    """Run the protocol above; return (first-call seconds, steady samples in seconds).

    ``host_work``: the product's multiply-adds when the kernel runs on the host's own cores
    (the CPU backend, an OpenCL CPU device; 0 otherwise): ``verify``'s NumPy products then
    leave no BLAS thread spinning on those cores while the kernel is timed
    (:func:`.host_blas.quiet_check`).

    Raises :class:`KernelFailure` if preparing, launching or fetching raises, or if
    ``verify`` raises AssertionError — in both cases before anything is timed.
    """
    t0 = clock()
    try:
        with poisoned():
            prepared = prepare()
            prepared.launch()
            synchronize()
        first = clock() - t0
        result = prepared.fetch()
    except UsageError:
        raise  # refused before anything ran (a size over the device's limit): not a failure
    except Exception as exc:
        raise KernelFailure(_reason(exc)) from exc
    try:
        with quiet_check(host_work):
            verify(np.asarray(result))
    except AssertionError as exc:
        raise KernelFailure(WRONG + " ".join(str(exc).split())) from exc

    try:
        samples = steady(prepared, policy, first=first, clock=clock, flush=flush)
    except Exception as exc:
        raise KernelFailure(_reason(exc)) from exc
    return first, samples


def steady(
    prepared: Prepared, policy: Policy, *, first: float = 0.0,
    clock: Clock = time.perf_counter, flush: Callable[[], None] | None = None,
) -> list[float]:
    """Warm-up, then the steady samples (seconds per launch) of an already verified
    ``prepared``: the one timing loop (benchmarks, the tuner, the scripts in benchmarks/).

    Launches are timed by ``prepared.elapsed`` (the backend's timer), in growing chunks
    until ``policy``'s budget is spent; with ``flush``, one at a time after a cache flush.
    ``first`` (the first call's seconds) skips the warm-up when it alone took the budget.
    """
    if policy.warmup and first < policy.budget_s:
        prepared.elapsed(policy.warmup)
    samples: list[float] = []
    start = clock()
    chunk = 1
    while len(samples) < policy.max_reps:
        wall = clock() - start
        if samples and wall >= policy.budget_s and len(samples) >= policy.min_reps:
            break
        if samples and wall >= policy.budget_s * policy.hard_cap:
            break
        if flush is not None:
            flush()
            count = 1  # each launch must start cold: one at a time
        else:
            count = min(chunk, policy.max_reps - len(samples))
            if samples:  # do not overshoot the budget by more than one launch
                per = max(wall / len(samples), 1e-9)
                count = max(1, min(count, int((policy.budget_s - wall) / per) + 1))
            chunk = min(chunk * 2, 32)
        got = list(prepared.elapsed(count))
        if len(got) != count or any(not np.isfinite(t) or t < 0 for t in got):
            raise RuntimeError(f"timer returned {got!r} for {count} launch(es)")
        samples.extend(float(t) for t in got)
    return samples


def fixed(repeats: int, warmup: int = 1) -> Policy:
    """Exactly ``repeats`` timed launches after ``warmup``, whatever they cost: the tuner's
    and the scripts' policy, where candidates are compared on the same number of launches."""
    return Policy(warmup=warmup, min_reps=repeats, max_reps=repeats, budget_s=_NO_BUDGET)


_NO_BUDGET = 1e9  # seconds: "no wall-clock budget" (finite, so the chunk arithmetic holds)


def alternating(
    contenders: Mapping[str, Callable[[], list[float]]], rounds: int, *,
    pause: float = 0.3, sleep: Callable[[float], None] = time.sleep,
) -> dict[str, list[float]]:
    """Blocks of launches of each contender in turn, ``pause`` seconds idle before each
    block, ``rounds`` times: a slow drift of the machine (clocks, another process) then
    touches every contender alike. Each contender is a callable returning one block's
    samples (e.g. ``lambda: prepared.elapsed(3)``); returns all samples per contender."""
    got: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, block in contenders.items():
            sleep(pause)
            got[name].extend(float(t) for t in block())
    return got


def calls_per_block(call: Callable[[], Any], seconds: float = 0.02, most: int = 200) -> int:
    """How many back-to-back ``call()`` fill a block of about ``seconds`` (1 to ``most``),
    from one timed call."""
    t = time.perf_counter()
    call()
    return max(1, min(most, int(seconds / max(time.perf_counter() - t, 1e-6))))


def call_block(call: Callable[[], Any], calls: int) -> Callable[[], list[float]]:
    """A contender for :func:`alternating`: one untimed ``call()`` (after an idle pause the
    first parallel region of a library waits for its sleeping threads), then ``calls``
    back to back; its one sample is their mean wall-clock time."""
    def run() -> list[float]:
        call()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        return [(time.perf_counter() - t0) / calls]
    return run


def mean_call_seconds(call: Callable[[], Any], seconds: float = 0.3, *,
                      clock: Clock = time.perf_counter) -> float:
    """Mean wall-clock seconds of one ``call()`` over about ``seconds`` of calls, after one
    untimed call: for calls too short to time one at a time (tiny products through the
    public API, validation and dispatch included)."""
    call()
    n, t0 = 0, clock()
    while n == 0 or clock() - t0 < seconds:
        call()
        n += 1
    return (clock() - t0) / n


def host_work(prob: GemmProblem, target: Target) -> int:
    """The multiply-adds of ``prob`` when ``target`` is the host's own CPU (the CPU backend,
    an OpenCL CPU device), else 0: what ``time_prepared``'s ``host_work`` takes."""
    return max(1, prob.batch * prob.m * prob.n * prob.k) if target.kind == "cpu" else 0


def prepare_verified(
    backend: Backend, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
    a3: np.ndarray, b3: np.ndarray, *, target: Target | None = None,
    first_call: list[float] | None = None,
) -> Prepared:
    """``backend.prepare`` with its output NaN-poisoned, one launch, and the result checked
    against float64 NumPy: the first step of every measurement (benchmarks, the tuner, the
    scripts in benchmarks/), so nothing is timed that skips an element or is wrong.
    ``first_call``, if given, receives the seconds of the first call as
    :func:`time_prepared` counts them: preparing (compiling) and the first launch, not the
    check (a float64 product, and the pause for NumPy's threads after it).

    Raises AssertionError (from :func:`~tilegemm.reference.assert_close`) for a wrong
    result; whatever preparing or launching raises passes through.
    """
    t0 = time.perf_counter()
    with poisoned():
        prepared = backend.prepare(spec, params, prob, a3, b3, target=target)
        prepared.launch()
        backend.synchronize()
    if first_call is not None:
        first_call.append(time.perf_counter() - t0)
    got = np.asarray(prepared.fetch()).reshape(-1, prob.m, prob.n)
    shown = " ".join(f"{k}={v}" for k, v in params.items())
    from tilegemm.precision import tolerance_eps  # TF32: checked at its own precision

    with quiet_check(host_work(prob, target or backend.target())):  # see time_prepared
        assert_close(got, a3, b3, what=f"{backend.name}:{spec.name} {shown}".strip(),
                     eps=tolerance_eps(spec, params, prob.dtype))
    return prepared


def host_prepared(
    backend: Backend, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
    a3: np.ndarray, b3: np.ndarray,
) -> Prepared:
    """The generic path for a backend without ``prepare``: ``tilegemm.matmul(out=...)``
    timed with ``perf_counter`` (includes dispatch and, for device backends, transfers)."""
    import tilegemm

    out = np.full((prob.batch, prob.m, prob.n), poison_value(prob.dtype), dtype=prob.dtype)

    def launch() -> None:
        tilegemm.matmul(a3, b3, out=out, kernel=spec.name, backend=backend.name, **params)

    def elapsed(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            launch()
            backend.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    return Prepared(launch=launch, fetch=lambda: out.copy(), elapsed=elapsed)


def measure_kernel(
    backend: Backend, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
    a3: np.ndarray, b3: np.ndarray, policy: Policy, *, clock: Clock = time.perf_counter,
    target: Target | None = None,
) -> Measurement:
    """Verify then time one rung with ``params`` (merged with its defaults) on ``prob``.

    ``a3``/``b3`` are the host operands as (batch or 1, M, K) and (batch or 1, K, N).
    Parameters the rung refuses, a dtype it lacks, or device limits give ``skipped``; a
    kernel that raises or is wrong gives ``FAILED``; otherwise ``ok`` with samples.
    """
    meas = Measurement(
        backend=backend.name, kernel=spec.name, m=prob.m, n=prob.n, k=prob.k, batch=prob.batch,
        dtype=prob.dtype.name, params={**spec.defaults(), **params}, rung=spec.rung,
    )
    if not spec.supports(prob.dtype):
        meas.status, meas.reason = SKIPPED, f"no {prob.dtype.name} support"
        return meas
    target = target or backend.target()
    try:
        resolved = backend.resolve(spec, params, target)  # device defaults apply (OpenCL)
        backend.check_limits(spec, resolved, prob.dtype, target)
    except (ValueError, UsageError) as exc:  # refused here (wgmma off sm_90: Unavailable)
        meas.status, meas.reason = SKIPPED, str(exc)
        return meas
    meas.params = dict(resolved)
    meas.method = target.timer + (" (simulator)" if target.simulated else "")

    def prepare() -> Prepared:
        try:
            return backend.prepare(spec, resolved, prob, a3, b3, target=target)
        except NotImplementedError:
            meas.method = "perf_counter around tilegemm.matmul (no Backend.prepare)"
            return host_prepared(backend, spec, resolved, prob, a3, b3)

    from tilegemm.precision import tolerance_eps  # TF32: checked at its own precision

    eps = tolerance_eps(spec, resolved, prob.dtype)

    def verify(result: np.ndarray) -> None:
        got = result.reshape(prob.batch, prob.m, prob.n)
        assert_close(got, a3, b3, what=f"{backend.name}:{meas.variant}", eps=eps)

    flush = backend.cache_flusher(target) if policy.flush else None
    meas.flushed = flush is not None
    try:
        meas.first_s, meas.samples = time_prepared(
            prepare, verify, policy, synchronize=backend.synchronize, clock=clock, flush=flush,
            host_work=host_work(prob, target))
    except KernelFailure as exc:
        meas.status, meas.reason = FAILED, str(exc)
    except UsageError as exc:
        meas.status, meas.reason = SKIPPED, str(exc)
    return meas
