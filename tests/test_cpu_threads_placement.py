"""Numba's worker threads are placed on CPUs of their own before a threaded CPU product.

Without it, a worker woken after an idle pause was often queued on the caller's busy CPU
for a scheduler tick (about 4 ms), so short products ran on one thread (see
``tilegemm.kernels.cpu._threads``). Checked here by what can be read back: each worker's
CPU affinity. No timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilegemm
from tilegemm.kernels.cpu import _threads

SRC = Path(tilegemm.__file__).resolve().parent.parent

SCRIPT = """
import json, os
import numba, numpy as np
import tilegemm
from tilegemm.kernels.cpu import _threads

a = np.random.default_rng(0).standard_normal((160, 160))
c = tilegemm.matmul(a, a, kernel="blocked", backend="cpu")
tilegemm.matmul(a, a, kernel="blocked", backend="cpu")
workers = _threads._pool_tids.get(os.getpid(), [])
print(json.dumps({
    "error": float(np.abs(c - a @ a).max()),
    "threads": numba.get_num_threads(),
    # the caller's CPU when the workers were last placed (it may have moved since)
    "caller_cpu": _threads._placement.get(os.getpid(), (-1,))[0],
    "allowed": sorted(os.sched_getaffinity(0)),
    "workers": {str(t): sorted(os.sched_getaffinity(t)) for t in workers},
}))
"""


def _run(**env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(SRC), "NUMBA_NUM_THREADS": "2", **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


needs_two_cpus = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="thread placement needs Linux and two CPUs this process may use")


def test_a_python_thread_started_meanwhile_is_not_taken_for_a_worker(monkeypatch) -> None:
    """A thread the application starts while the rung's code loads (or its first products
    run) must never be pinned: only threads that run no Python code can be Numba's."""
    import threading

    monkeypatch.setattr(_threads, "_pool_tids", {})
    monkeypatch.setattr(_threads, "_watches", {})
    started, stop = threading.Event(), threading.Event()

    def user_work() -> None:
        started.set()
        stop.wait(30)

    with _threads.PoolWatch():
        user = threading.Thread(target=user_work, daemon=True)
        user.start()
        started.wait(30)
    try:
        assert user.native_id not in _threads._pool_tids.get(os.getpid(), [])
    finally:
        stop.set()
        user.join(30)


def test_worker_cpus_spread_over_the_other_cpus() -> None:
    assert _threads.worker_cpus(1, {0, 1}, 0) == [1]
    assert _threads.worker_cpus(1, {0, 1}, 1) == [0]
    assert _threads.worker_cpus(3, {0, 1, 2, 3}, 2) == [0, 1, 3]
    # more threads than other CPUs: round again; caller outside the set: every CPU is "other"
    assert _threads.worker_cpus(3, {4, 5}, 4) == [5, 5, 5]
    assert _threads.worker_cpus(2, {4, 5}, 0) == [4, 5]


@pytest.mark.slow
@needs_two_cpus
def test_workers_pinned_one_cpu_each_not_the_callers() -> None:
    got = _run()
    assert got["error"] < 1e-9
    assert got["threads"] == 2
    assert got["workers"], "the threads Numba's pool started were not found"
    for cpus in got["workers"].values():
        assert len(cpus) == 1 and cpus[0] in got["allowed"]
        if got["caller_cpu"] >= 0:
            assert cpus != [got["caller_cpu"]]


@pytest.mark.slow
@needs_two_cpus
def test_pinning_can_be_turned_off() -> None:
    got = _run(TILEGEMM_PIN_THREADS="0")
    assert got["error"] < 1e-9
    assert got["workers"], "the threads Numba's pool started were not found"
    for cpus in got["workers"].values():
        assert cpus == got["allowed"]


CONCURRENT = """
import json, os, threading
import numpy as np
import tilegemm
from tilegemm.kernels.cpu import _threads

a = np.random.default_rng(1).standard_normal((200, 200))
tilegemm.matmul(a[:4, :4], a[:4, :4], kernel="blocked", backend="cpu")  # loads, no pool
barrier = threading.Barrier(8)
errors = []

def first_threaded_product():
    barrier.wait()
    c = tilegemm.matmul(a, a, kernel="blocked", backend="cpu")
    errors.append(float(np.abs(c - a @ a).max()))

threads = [threading.Thread(target=first_threaded_product) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"error": max(errors), "workers": _threads._pool_tids.get(os.getpid(), [])}))
"""


@pytest.mark.slow
@needs_two_cpus
def test_workers_found_when_many_threads_make_their_first_product_at_once() -> None:
    """Eight threads' first threaded products at once: their watches used up the budget
    before one of them started Numba's pool, which was then never found (nor placed)."""
    out = subprocess.run(
        [sys.executable, "-c", CONCURRENT], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(SRC), "NUMBA_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["error"] < 1e-9
    assert got["workers"], "the threads Numba's pool started were not found"


def test_the_call_that_starts_the_pool_is_watched_even_past_the_budget(monkeypatch) -> None:
    """Concurrent first products (a thread pool's) can use up ``WATCHES`` before any of
    them starts Numba's pool; the one that starts it (pool_threads) still watches."""
    monkeypatch.setattr(_threads, "_pool_tids", {})
    monkeypatch.setattr(_threads, "_watches", {os.getpid(): _threads.PoolWatch.WATCHES})
    assert _threads.PoolWatch().before is None
    assert _threads.PoolWatch(always=True).before is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="placement is Linux-only")
def test_placement_reads_the_allowed_cpus_when_the_caller_moves_or_when_due(
        monkeypatch) -> None:
    """The check before every threaded product: the caller's CPU each time, the CPUs it
    may use (a system call) only when the caller moved or ``AFFINITY_INTERVAL_NS`` passed;
    the workers are pinned again whenever either changed."""
    pid = os.getpid()
    now, cpu, allowed = [10**12], [0], [{0, 1}]
    reads, pins = [], []
    monkeypatch.delenv(_threads.PIN_ENV, raising=False)
    monkeypatch.setattr(_threads, "_pool_tids", {pid: [4242]})
    monkeypatch.setattr(_threads, "_placement", {})
    monkeypatch.setattr(_threads, "_affinity_read", [0])
    monkeypatch.setattr(_threads, "_pid", [pid])
    monkeypatch.setattr(_threads, "current_cpu", lambda: cpu[0])
    monkeypatch.setattr(_threads.time, "monotonic_ns", lambda: now[0])
    monkeypatch.setattr(_threads.os, "sched_getaffinity",
                        lambda _: reads.append(1) or set(allowed[0]))
    monkeypatch.setattr(_threads.os, "sched_setaffinity",
                        lambda tid, cpus: pins.append((tid, sorted(cpus))))

    _threads.place_workers()
    assert (len(reads), pins) == (1, [(4242, [1])])
    now[0] += _threads.AFFINITY_INTERVAL_NS // 2
    _threads.place_workers()  # nothing changed, nothing due: no system call
    assert (len(reads), len(pins)) == (1, 1)
    allowed[0] = {0, 1, 2}  # changed, and seen once due
    _threads.place_workers()
    assert (len(reads), len(pins)) == (1, 1)
    now[0] += _threads.AFFINITY_INTERVAL_NS
    _threads.place_workers()
    assert len(reads) == 2 and pins[-1] == (4242, [1]) and len(pins) == 2
    _threads.place_workers()  # read just now and current
    assert (len(reads), len(pins)) == (2, 2)
    cpu[0] = 1  # the caller moved: read at once, and the worker moved off its CPU
    _threads.place_workers()
    assert len(reads) == 3 and pins[-1] == (4242, [0])
    monkeypatch.setenv(_threads.PIN_ENV, "0")  # turned off: nothing read or pinned
    cpu[0] = 2
    _threads.place_workers()
    assert (len(reads), len(pins)) == (3, 3)


def test_pinning_setting_follows_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(_threads.PIN_ENV, "0")
    assert not _threads.pinning_enabled()
    monkeypatch.setenv(_threads.PIN_ENV, "1")
    assert _threads.pinning_enabled() == sys.platform.startswith("linux")
    monkeypatch.delenv(_threads.PIN_ENV)
    assert _threads.pinning_enabled() == sys.platform.startswith("linux")


def test_thread_count_follows_numba_set_num_threads() -> None:
    """Once the pool runs, pool_threads reads Numba's count without Numba's start-up locks;
    it is still the calling thread's own setting."""
    import numba

    a = np.random.default_rng(2).standard_normal((200, 200))
    tilegemm.matmul(a, a, kernel="blocked", backend="cpu")  # the pool runs
    assert _threads._numba_layer_started()
    full = numba.get_num_threads()
    assert _threads.pool_threads() == full
    numba.set_num_threads(1)
    try:
        assert _threads.pool_threads() == 1
    finally:
        numba.set_num_threads(full)
    assert _threads.pool_threads() == full


def test_a_region_watches_for_the_pool_only_until_it_is_known(monkeypatch) -> None:
    monkeypatch.setattr(_threads, "_pool_tids", {})
    monkeypatch.setattr(_threads, "_watches", {})
    with _threads.InParallel() as region:
        assert region.watch is not None and _threads.regions_running() >= 1
    monkeypatch.setattr(_threads, "_pool_tids", {os.getpid(): [4242]})
    with _threads.InParallel() as region:
        assert region.watch is None
    assert _threads.regions_running() == 0
