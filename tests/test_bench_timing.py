"""The timing protocol with a fake clock and fake kernels: statistics, budgets, warm-up
excluded, verification before timing, failures reported with reasons (no speed asserted)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tilegemm.backends.base import Backend, BackendStatus, Prepared
from tilegemm.bench.timing import (
    FAILED,
    OK,
    SKIPPED,
    KernelFailure,
    Measurement,
    Policy,
    Stats,
    alternating,
    fixed,
    mean_call_seconds,
    measure_kernel,
    steady,
    time_prepared,
)
from tilegemm.problem import GemmProblem
from tilegemm.reference import random_operands
from tilegemm.registry import Constraint, KernelSpec, Param


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeKernel:
    """A 'device' whose launches take ``per_launch`` fake seconds; the first launch also
    pays ``compile_s``; warm-up launches report ``warm_value`` so a leak would show."""

    def __init__(self, clock: FakeClock, per_launch: float, *, compile_s: float = 0.0,
                 result: np.ndarray | None = None, warmup: int = 0, warm_value: float = 99.0,
                 fail_launch: bool = False, bad_timer: bool = False) -> None:
        self.clock, self.per, self.compile_s = clock, per_launch, compile_s
        self.result = result
        self.launches = 0
        self.elapsed_calls: list[int] = []
        self.warmup, self.warm_value = warmup, warm_value
        self.fail_launch, self.bad_timer = fail_launch, bad_timer

    def launch(self) -> None:
        if self.fail_launch:
            raise RuntimeError("boom: illegal address")
        self.clock.now += self.per + (self.compile_s if self.launches == 0 else 0.0)
        self.launches += 1

    def elapsed(self, n: int) -> list[float]:
        self.elapsed_calls.append(n)
        out = []
        for _ in range(n):
            warm = self.launches <= self.warmup  # launches 1..warmup follow the first call
            self.launch()
            out.append(self.warm_value if warm else self.per)
        if self.bad_timer:
            out[-1] = float("nan")
        return out

    def prepared(self) -> Prepared:
        return Prepared(self.launch, lambda: self.result, self.elapsed)


def _accept(_: np.ndarray) -> None:
    pass


def test_stats_order_statistics() -> None:
    s = Stats.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.min, s.max, s.mean) == (5, 3.0, 1.0, 5.0, 3.0)
    assert (s.q1, s.q3) == (2.0, 4.0)
    with pytest.raises(ValueError):
        Stats.of([])


def test_first_call_and_warmup_are_not_steady_samples() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 0.1, compile_s=0.3, result=np.zeros(1), warmup=2)
    first, samples = time_prepared(k.prepared, _accept, Policy(warmup=2, budget_s=1.0,
                                                                min_reps=3), clock=clock)
    assert first == pytest.approx(0.4)  # compilation + the first launch
    assert k.elapsed_calls[0] == 2  # the warm-up
    assert 99.0 not in samples and all(t == pytest.approx(0.1) for t in samples)
    # The steady phase stops once the 1 s budget is spent, overshooting by <= one launch.
    assert 10 <= len(samples) <= 11
    assert sum(samples) <= 1.0 + 0.1 + 1e-9


def test_slow_kernel_stops_at_the_hard_cap_and_skips_warmup() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 2.0, result=np.zeros(1))
    first, samples = time_prepared(
        k.prepared, _accept, Policy(warmup=3, budget_s=1.0, min_reps=5, hard_cap=4.0),
        clock=clock)
    assert first == pytest.approx(2.0)
    assert k.elapsed_calls == [1, 1]  # no warm-up: the first call took longer than the budget
    assert samples == [2.0, 2.0]  # min_reps=5 yields once 4 × budget is spent


def test_max_reps_bounds_a_fast_kernel() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 1e-6, result=np.zeros(1))
    _, samples = time_prepared(k.prepared, _accept,
                               Policy(warmup=0, budget_s=10.0, min_reps=1, max_reps=37),
                               clock=clock)
    assert len(samples) == 37


def test_fixed_policy_times_exactly_the_repeats_after_the_warmup() -> None:
    """The tuner's and the scripts' policy: the same number of launches for every
    candidate, however slow (no budget cuts a slow one short)."""
    clock = FakeClock()
    k = FakeKernel(clock, 30.0, result=np.zeros(1), warmup=2)
    k.launches = 1  # as after the verified first launch
    samples = steady(k.prepared(), fixed(7, warmup=2), clock=clock)
    assert samples == [30.0] * 7  # warm-up (99.0) excluded
    assert k.elapsed_calls[0] == 2 and sum(k.elapsed_calls) == 9


def test_alternating_blocks_pause_before_each_contender() -> None:
    events: list[str] = []
    got = alternating({"ours": lambda: events.append("ours") or [1.0, 2.0],
                       "ref": lambda: events.append("ref") or [3.0]},
                      3, pause=0.5, sleep=lambda s: events.append(f"sleep {s}"))
    assert got == {"ours": [1.0, 2.0] * 3, "ref": [3.0] * 3}
    assert events == ["sleep 0.5", "ours", "sleep 0.5", "ref"] * 3


def test_mean_call_seconds_averages_many_short_calls() -> None:
    clock = FakeClock()
    calls = []

    def call() -> None:
        calls.append(1)
        clock.now += 0.01

    assert mean_call_seconds(call, 0.1, clock=clock) == pytest.approx(0.01)
    assert len(calls) == 11  # one untimed call, then ten within 0.1 s


def test_zero_reps_verifies_and_times_the_first_call_only() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 0.25, result=np.zeros(1))
    first, samples = time_prepared(k.prepared, _accept,
                                   Policy(warmup=0, min_reps=0, max_reps=0), clock=clock)
    assert first == pytest.approx(0.25)
    assert samples == []
    assert k.elapsed_calls == []


def test_flush_runs_before_every_repeat_one_launch_at_a_time() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 0.1, result=np.zeros(1))
    flushes: list[int] = []
    _, samples = time_prepared(k.prepared, _accept,
                               Policy(warmup=0, budget_s=0.5, min_reps=2), clock=clock,
                               flush=lambda: flushes.append(k.launches))
    assert len(flushes) == len(samples) and set(k.elapsed_calls) == {1}


def test_wrong_result_fails_before_anything_is_timed() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 0.1, result=np.ones(3))

    def verify(r: np.ndarray) -> None:
        np.testing.assert_array_equal(r, np.zeros(3))

    with pytest.raises(KernelFailure, match="^wrong result"):
        time_prepared(k.prepared, verify, Policy(), clock=clock)
    assert k.elapsed_calls == []


def test_raising_kernel_fails_with_the_reason() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 0.1, fail_launch=True)
    with pytest.raises(KernelFailure, match="raised RuntimeError: boom: illegal address"):
        time_prepared(k.prepared, _accept, Policy(), clock=clock)
    assert k.elapsed_calls == []


def test_a_broken_timer_is_a_failure_not_a_number() -> None:
    clock = FakeClock()
    k = FakeKernel(clock, 0.1, result=np.zeros(1), bad_timer=True)
    with pytest.raises(KernelFailure, match="timer returned"):
        time_prepared(k.prepared, _accept, Policy(warmup=0), clock=clock)


@pytest.mark.parametrize("before", [None, "0"])
def test_first_launch_is_poisoned(monkeypatch: pytest.MonkeyPatch, before: str | None) -> None:
    """The verified first launch runs with TILEGEMM_POISON=1 whatever the caller's setting
    (the test session sets it for every test, so it is unset or "0" here first), and the
    setting is the caller's again afterwards."""
    import os

    if before is None:
        monkeypatch.delenv("TILEGEMM_POISON", raising=False)
    else:
        monkeypatch.setenv("TILEGEMM_POISON", before)
    seen = []

    def prepare() -> Prepared:
        seen.append(os.environ.get("TILEGEMM_POISON"))
        return FakeKernel(FakeClock(), 0.1, result=np.zeros(1)).prepared()

    time_prepared(prepare, _accept, Policy(warmup=0, budget_s=0.01, min_reps=1))
    assert seen == ["1"]
    assert os.environ.get("TILEGEMM_POISON") == before


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Policy(min_reps=-1)
    with pytest.raises(ValueError):
        Policy(min_reps=10, max_reps=5)
    with pytest.raises(ValueError):
        Policy(budget_s=0)


# --- measure_kernel with a fake backend and fake rungs ------------------------------------

class FakeBackend(Backend):
    """Prepares a numpy product, optionally corrupted; timings come from a fake kernel."""

    name = "cpu"

    def __init__(self, clock: FakeClock, per_launch: float, corrupt: bool = False) -> None:
        self.clock, self.per, self.corrupt = clock, per_launch, corrupt

    def status(self) -> BackendStatus:
        return BackendStatus("cpu", True, "fake")

    def check_limits(self, spec, params, dtype, target=None) -> None:  # type: ignore[no-untyped-def]
        if params.get("TILE", 0) > 16:
            raise ValueError("TILE=32 needs more shared memory than this fake device has")

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise AssertionError("the harness must not call run() when prepare() exists")

    def prepare(self, spec, params, prob, a3, b3, target=None) -> Prepared:  # type: ignore[no-untyped-def]
        result = np.matmul(a3, b3).astype(prob.dtype)
        if self.corrupt:
            result[0, -1, -1] = np.nan  # one element never written
        return FakeKernel(self.clock, self.per, result=result).prepared()


def _spec(name: str = "fake", **kw) -> KernelSpec:  # type: ignore[no-untyped-def]
    return KernelSpec(name=name, backend="cpu", rung=9, title="fake", build=lambda p, d: None,
                      params=(Param("TILE", 16, (8, 16, 32)),), **kw)


def _problem(m: int = 7, n: int = 5, k: int = 3) -> tuple[GemmProblem, np.ndarray, np.ndarray]:
    prob = GemmProblem(m=m, n=n, k=k, dtype=np.dtype(np.float32), batch_shape=(1,))
    a3, b3 = random_operands((1, m, k), (1, k, n), np.float32)
    return prob, a3, b3


def test_measure_kernel_reports_gflops_from_the_median() -> None:
    clock = FakeClock()
    prob, a3, b3 = _problem()
    m = measure_kernel(FakeBackend(clock, 1e-3), _spec(), {"TILE": 8}, prob, a3, b3,
                       Policy(warmup=1, budget_s=0.05, min_reps=3), clock=clock)
    assert m.status == OK and m.reason == "" and m.params == {"TILE": 8}
    assert m.gflops == pytest.approx(2 * 7 * 5 * 3 / 1e-3 / 1e9)
    assert m.first_s == pytest.approx(1e-3) and len(m.samples) >= 3


def test_measure_kernel_wrong_result_is_failed_without_speed() -> None:
    clock = FakeClock()
    prob, a3, b3 = _problem()
    m = measure_kernel(FakeBackend(clock, 1e-3, corrupt=True), _spec(), {}, prob, a3, b3,
                       Policy(), clock=clock)
    assert m.status == FAILED and m.gflops is None and m.samples == []
    assert "wrong result" in m.reason and "(0, 6, 4)" in m.reason  # first bad index named


def test_measure_kernel_skips_what_cannot_run() -> None:
    clock = FakeClock()
    prob, a3, b3 = _problem()
    be = FakeBackend(clock, 1e-3)
    limits = measure_kernel(be, _spec(), {"TILE": 32}, prob, a3, b3, Policy(), clock=clock)
    assert limits.status == SKIPPED and "shared memory" in limits.reason
    constrained = _spec(constraints=(Constraint("TILE divides 8", lambda p: 8 % p["TILE"] == 0),))
    bad = measure_kernel(be, constrained, {"TILE": 16}, prob, a3, b3, Policy(), clock=clock)
    assert bad.status == SKIPPED and "TILE divides 8" in bad.reason
    ints = measure_kernel(be, _spec(dtypes=("int32",)), {}, prob, a3, b3, Policy(), clock=clock)
    assert ints.status == SKIPPED and "float32" in ints.reason


def test_measurement_round_trips_through_a_dict() -> None:
    m = Measurement(backend="cpu", kernel="k", m=4, n=4, k=4, params={"TILE": 8},
                    samples=[1e-3, 2e-3, 3e-3], reports=["sizes"])
    d = m.to_dict()
    assert d["gflops"] == pytest.approx(128 / 2e-3 / 1e9) and d["stats"]["median"] == 2e-3
    again = Measurement.from_dict(d)
    assert again == m


def test_call_block_runs_one_untimed_call_then_the_block() -> None:
    from tilegemm.bench.timing import call_block, calls_per_block

    calls: list[int] = []
    run = call_block(lambda: calls.append(1), 5)
    samples = run()
    assert len(calls) == 6 and len(samples) == 1 and samples[0] >= 0
    assert calls_per_block(lambda: None, 0.02, most=7) == 7  # a fast call: capped
    assert calls_per_block(lambda: time.sleep(0.03), 0.02) == 1  # a slow one: at least one


def test_prepare_verified_times_the_first_call_without_the_check(monkeypatch) -> None:
    """benchmarks/cpu_blocked.py timed the whole prepare_verified as the "first call": the
    float64 check and the pause for NumPy's threads after it were 0.48 of 0.5 s at 640³."""
    from tilegemm.bench import timing

    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    real_check = timing.assert_close

    def slow_check(*args, **kwargs):  # type: ignore[no-untyped-def]
        clock.now += 5.0
        return real_check(*args, **kwargs)

    monkeypatch.setattr(timing, "assert_close", slow_check)
    prob, a3, b3 = _problem()
    first: list[float] = []
    timing.prepare_verified(FakeBackend(clock, 0.25), _spec(), {"TILE": 8}, prob, a3, b3,
                            first_call=first)
    assert first == [0.25]
