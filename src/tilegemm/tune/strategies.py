"""Search strategies: which candidates to try, and the loop that verifies and times them.

Every candidate is run once on a NaN-poisoned output and checked against the float64
reference *before* it is timed, then timed: ``bench.timing.measure_kernel``, the benchmarks'
own path (a fast wrong kernel must never win), with a fixed number of launches (``repeats``,
after one warm-up): device-side times, operands resident on the device, scored by the median.
A candidate that fails to build, to launch or to verify is recorded with the reason and
excluded; tuning goes on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tilegemm.backends.base import Backend, Target
from tilegemm.bench.timing import OK, SKIPPED, WRONG, fixed, measure_kernel
from tilegemm.errors import InvalidValueError, UsageError
from tilegemm.problem import GemmProblem, problem_for
from tilegemm.reference import random_operands
from tilegemm.registry import KernelSpec
from tilegemm.tune.space import Params, ResourceCheck

__all__ = ["STRATEGIES", "Trial", "TuneResult", "order", "problem_for", "tune"]

STRATEGIES = ("exhaustive", "random")


@dataclass
class Trial:
    params: Params
    status: str  # "ok" | "wrong" | "rejected" | "error"
    seconds: float | None = None  # median of the timed launches
    times: list[float] = field(default_factory=list)
    detail: str = ""


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
) -> TuneResult:
    """Verify and time up to ``budget`` candidates (all if None) in ``strategy`` order.

    The budget counts candidates handed to the backend; those rejected beforehand (device
    limits, registers) cost nothing but are reported. ``progress`` is called after each.
    """
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
        trial = _try(backend, target, spec, prob, params, a3, b3, repeats, resource_check)
        if trial.status != "rejected":
            spent += 1
        trials.append(trial)
        if progress is not None:
            progress(trial)
    return TuneResult(spec, prob, trials)


def _try(backend: Backend, target: Target, spec: KernelSpec, prob: GemmProblem,
         params: Params, a3: np.ndarray, b3: np.ndarray, repeats: int,
         resource_check: ResourceCheck | None) -> Trial:
    try:
        backend.check_limits(spec, params, prob.dtype, target)
    except (ValueError, UsageError) as exc:  # (wgmma off sm_90: UnavailableError)
        return Trial(dict(params), "rejected", detail=str(exc))
    if resource_check is not None:
        why = resource_check(spec, params, prob.dtype)
        if why:
            return Trial(dict(params), "rejected", detail=why)
    # The benchmarks' own path: a poisoned output, one launch, the float64 check, then
    # exactly ``repeats`` launches on the backend's timer after one warm-up.
    meas = measure_kernel(backend, spec, params, prob, a3, b3, fixed(repeats), target=target)
    if meas.status == OK and meas.stats is not None:
        return Trial(dict(params), "ok", meas.stats.median, meas.samples)
    if meas.status == SKIPPED:
        return Trial(dict(params), "rejected", detail=meas.reason)
    if meas.reason.startswith(WRONG):  # a fast wrong kernel must never win
        return Trial(dict(params), "wrong", detail=meas.reason.removeprefix(WRONG))
    return Trial(dict(params), "error", detail=meas.reason)  # cannot build or launch: it loses
