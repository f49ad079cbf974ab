"""The GPU's time per launch with the queue filled first (bench.queued), with a stand-in
for numba.cuda: the protocol (hold, events, the launches between them, the check that the
queue did not run dry, a longer hold when it did); and the holding kernel compiled for
sm_90 without a GPU."""

from __future__ import annotations

import pytest

from tilegemm.bench import queued


class _Event:
    def __init__(self, gpu: _Gpu) -> None:
        self.gpu, self.at = gpu, None

    def record(self) -> None:
        self.gpu.log.append(("record", self))
        self.at = len(self.gpu.log)

    def query(self) -> bool:
        return self.gpu.dry.pop(0)

    def synchronize(self) -> None:
        self.gpu.log.append(("synchronize", self))


class _Gpu:
    """numba.cuda's part that the protocol uses: ``jit``, ``event``, the launch syntax and
    ``event_elapsed_time`` (milliseconds: 3 per launch between the two events)."""

    def __init__(self, dry: list[bool]) -> None:
        self.dry, self.log, self.holds = list(dry), [], []

    def jit(self, fn):  # noqa: ANN001, ANN201
        gpu = self

        class Kernel:
            def __getitem__(self, config):  # noqa: ANN001, ANN204
                return lambda count: gpu.holds.append((config, count))

        return Kernel()

    def event(self) -> _Event:
        return _Event(self)

    def event_elapsed_time(self, start: _Event, end: _Event) -> float:
        launches = sum(1 for what, _ in self.log[start.at:end.at] if what == "launch")
        return 3.0 * launches


def _run(dry: list[bool], **kw) -> tuple[tuple[float, bool], _Gpu]:  # noqa: ANN003
    queued._hold_kernel.cache_clear()
    gpu = _Gpu(dry)
    got = queued.gpu_seconds_per_launch(lambda: gpu.log.append(("launch", None)), 5,
                                        cuda=gpu, **kw)
    queued._hold_kernel.cache_clear()
    return got, gpu


def test_the_launches_run_between_the_events_behind_the_hold() -> None:
    (seconds, dry), gpu = _run([False])
    assert seconds == pytest.approx(3e-3) and not dry
    assert gpu.holds == [((1, 1), queued.HOLD_US)]
    kinds = [what for what, _ in gpu.log]
    assert kinds == ["record"] + ["launch"] * 5 + ["record", "synchronize"]


def test_a_queue_that_ran_dry_is_measured_again_with_a_longer_hold() -> None:
    (seconds, dry), gpu = _run([True, True, False])
    assert not dry and seconds == pytest.approx(3e-3)
    assert [count for _, count in gpu.holds] == [queued.HOLD_US, 4 * queued.HOLD_US,
                                                 16 * queued.HOLD_US]


def test_the_longest_hold_is_the_last_and_says_the_queue_ran_dry() -> None:
    (_, dry), gpu = _run([True] * 10, hold_us=100, max_hold_us=1000)
    assert dry
    assert [count for _, count in gpu.holds] == [100, 400, 1000]


def test_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        queued.gpu_seconds_per_launch(lambda: None, 0, cuda=_Gpu([]))


def test_the_holding_kernel_compiles_for_sm_90(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline (no GPU): numba-cuda's PTX for the kernel sleeps (nanosleep is sm_70+)."""
    pytest.importorskip("numba.cuda")
    from numba import cuda, types

    from tilegemm import simulator

    if simulator.enabled():
        pytest.skip("the simulator compiles nothing")
    monkeypatch.setattr(queued, "cuda", cuda)
    ptx, _ = cuda.compile_ptx(queued.hold, (types.int64,), cc=(9, 0))
    assert "nanosleep" in ptx
