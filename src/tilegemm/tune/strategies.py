"""Search strategies: which candidates to try, and the loop that verifies and times them.

Every candidate is run once on a NaN-poisoned output and checked against the float64
reference *before* it is timed, then timed: ``bench.timing.measure_kernel``, the benchmarks'
own path (a fast wrong kernel must never win), with a fixed number of launches (``repeats``,
after one warm-up): device-side times, operands resident on the device, scored by the median.
A candidate that fails to build, to launch or to verify is recorded with the reason and
excluded; tuning goes on.

With a per-call limit (``max_call_s``), each candidate is first verified and timed on a
small problem of the same shape (about 256³), and its time per call at the full size is
predicted from the ratio of arithmetic. Small products use a device less well, and a fixed
cost per call (threads waking, buffers) weighs more in them, so a prediction over the
limit is checked again on a problem eight times larger (each dimension doubled), while
that costs little next to the limit, now from the growth between the two sizes (the fixed
cost then drops out); a candidate still predicted to exceed it is recorded as "slow" and
not run at full size. The limit thus skips the hopeless (a naive rung on a
CPU's OpenCL at 4096³, minutes per call) without guessing against a contender.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tilegemm.backends.base import Backend, Target
from tilegemm.bench.timing import OK, SKIPPED, WRONG, Measurement, fixed, measure_kernel
from tilegemm.errors import InvalidValueError, UsageError
from tilegemm.problem import GemmProblem, problem_for
from tilegemm.reference import random_operands
from tilegemm.registry import KernelSpec
from tilegemm.tune.space import Params, ResourceCheck

__all__ = ["STRATEGIES", "Trial", "TuneResult", "order", "problem_for", "tune"]

STRATEGIES = ("exhaustive", "random")
PROBE_FLOPS = 2 * 256**3  # the size a candidate is timed at to predict a larger product


@dataclass
class Trial:
    params: Params
    status: str  # "ok" | "wrong" | "rejected" | "error" | "slow" (over the per-call limit)
    seconds: float | None = None  # median of the timed launches
    times: list[float] = field(default_factory=list)
    detail: str = ""
    predicted: float | None = None  # seconds per call at full size, from the small problem


@dataclass
class TuneResult:
    spec: KernelSpec
    problem: GemmProblem
    trials: list[Trial]

    @property
    def best(self) -> Trial | None:
        ok = [t for t in self.trials if t.status == "ok" and t.seconds is not None]
        return min(ok, key=lambda t: t.seconds) if ok else None

    def gflops(self, trial: Trial) -> float:
        return self.problem.flops / trial.seconds / 1e9 if trial.seconds else 0.0


def order(candidates: Sequence[Params], strategy: str, seed: int = 0) -> list[Params]:
    """The order candidates are tried in: as given, or a seeded shuffle (reproducible)."""
    if strategy == "exhaustive":
        return list(candidates)
    if strategy == "random":
        shuffled = list(candidates)
        random.Random(seed).shuffle(shuffled)
        return shuffled
    raise InvalidValueError(f"unknown strategy {strategy!r}; choices: {', '.join(STRATEGIES)}")


def tune(
    backend: Backend, spec: KernelSpec, prob: GemmProblem, candidates: Sequence[Params], *,
    strategy: str = "exhaustive", budget: int | None = None, seed: int = 0, repeats: int = 5,
    resource_check: ResourceCheck | None = None,
    progress: Callable[[Trial], None] | None = None, target: Target | None = None,
    max_call_s: float | None = None,
) -> TuneResult:
    """Verify and time up to ``budget`` candidates (all if None) in ``strategy`` order.

    The budget counts candidates handed to the backend; those rejected beforehand (device
    limits, registers) cost nothing but are reported. ``progress`` is called after each.
    ``max_call_s``: skip a candidate predicted to take longer per call (see the module's
    docstring); None runs every candidate at full size whatever it costs.
    """
    if max_call_s is not None and max_call_s <= 0:
        raise InvalidValueError("max_call_s must be > 0")
    if repeats < 1:
        raise InvalidValueError("repeats must be >= 1")
    if budget is not None and budget < 1:
        raise InvalidValueError("budget must be >= 1")
    batch = prob.batch if prob.batch_shape else 1
    a3, b3 = random_operands((batch, prob.m, prob.k), (batch, prob.k, prob.n), prob.dtype,
                             seed=seed)
    target = target or backend.target()
    trials: list[Trial] = []
    spent = 0
    for params in order(candidates, strategy, seed):
        if budget is not None and spent >= budget:
            break
        trial = _try(backend, target, spec, prob, params, a3, b3, repeats, resource_check,
                     max_call_s)
        if trial.status != "rejected":
            spent += 1
        trials.append(trial)
        if progress is not None:
            progress(trial)
    return TuneResult(spec, prob, trials)


def _try(backend: Backend, target: Target, spec: KernelSpec, prob: GemmProblem,
         params: Params, a3: np.ndarray, b3: np.ndarray, repeats: int,
         resource_check: ResourceCheck | None,
         max_call_s: float | None = None) -> Trial:
    try:
        backend.check_limits(spec, params, prob.dtype, target)
    except (ValueError, UsageError) as exc:  # (wgmma off sm_90: UnavailableError)
        return Trial(dict(params), "rejected", detail=str(exc))
    if resource_check is not None:
        why = resource_check(spec, params, prob.dtype)
        if why:
            return Trial(dict(params), "rejected", detail=why)
    predicted = None
    if max_call_s is not None:
        found = _predict(backend, target, spec, params, prob, a3, b3, max_call_s)
        if isinstance(found, Trial):
            return found  # wrong, broken or too slow already on a small problem
        predicted = found
    # The benchmarks' own path: a poisoned output, one launch, the float64 check, then
    # exactly ``repeats`` launches on the backend's timer after one warm-up.
    meas = measure_kernel(backend, spec, params, prob, a3, b3, fixed(repeats), target=target)
    if meas.status == OK and meas.stats is not None:
        return Trial(dict(params), "ok", meas.stats.median, meas.samples, predicted=predicted)
    return _failed(params, meas)


def _failed(params: Params, meas: Measurement) -> Trial:
    """The trial of a measurement that did not end in a time."""
    if meas.status == SKIPPED:
        return Trial(dict(params), "rejected", detail=meas.reason)
    if meas.reason.startswith(WRONG):  # a fast wrong kernel must never win
        return Trial(dict(params), "wrong", detail=meas.reason.removeprefix(WRONG))
    return Trial(dict(params), "error", detail=meas.reason)  # cannot build or launch: it loses


def _predict(backend: Backend, target: Target, spec: KernelSpec, params: Params,
             prob: GemmProblem, a3: np.ndarray, b3: np.ndarray,
             max_call_s: float) -> float | None | Trial:
    """Seconds per call predicted for ``prob`` from small problems (None: ``prob`` is too
    small to need it), or the Trial that ends the candidate: wrong or broken on a small
    problem, or still predicted over ``max_call_s`` on the largest small one worth its cost
    (see the module's docstring)."""
    flops, trial, before = PROBE_FLOPS, None, None
    while flops * 8 <= prob.flops:
        small, pa, pb = _probe(prob, a3, b3, flops)
        meas = measure_kernel(backend, spec, params, small, pa, pb, fixed(3, warmup=0),
                              target=target)
        if meas.status != OK or meas.stats is None:
            return _failed(params, meas)
        seconds = meas.stats.median
        if before is None:  # one size: in proportion to the arithmetic
            predicted = seconds * prob.flops / small.flops
        else:  # two sizes: what a flop more costs (a fixed cost per call drops out)
            rate = max(0.0, (seconds - before[1]) / (small.flops - before[0]))
            predicted = seconds + rate * (prob.flops - small.flops)
        before = (small.flops, seconds)
        if predicted <= max_call_s:
            return predicted
        trial = Trial(dict(params), "slow", predicted=predicted,
                      detail=f"predicted ~{predicted:.3g} s per call (timed at "
                             f"{small.m}x{small.n}x{small.k}), over the {max_call_s:g} s limit")
        if 4 * 8 * seconds > max_call_s:  # four calls of the next size: more than a call
            break
        flops *= 8
    return trial


def _probe(prob: GemmProblem, a3: np.ndarray, b3: np.ndarray, flops: float
           ) -> tuple[GemmProblem, np.ndarray, np.ndarray]:
    """A problem of about ``flops`` with the leading blocks of the operands: every
    dimension divided by one factor, so the shape stays alike."""
    scale = (prob.flops / flops) ** (1 / 3)
    m, n, k = (max(1, round(d / scale)) for d in (prob.m, prob.n, prob.k))
    small = problem_for(m, n, k, prob.dtype, prob.batch if prob.batch_shape else 0)
    return (small, np.ascontiguousarray(a3[:, :m, :k]), np.ascontiguousarray(b3[:, :k, :n]))
