"""Numba's threading layer for the blocked rung: thread-safe and safe in forked workers.

The blocked rung runs ``prange`` loops, so Numba starts a threading layer on its first
product. Numba tries TBB, then OpenMP, then its own work queue, and tilegemm needs one that
is safe on both counts users rely on:

- **several threads at once**: ``tilegemm.dask`` on the threaded scheduler, or a user's own
  thread pool, runs products concurrently. The work queue aborts the process when two
  threads enter a parallel region together, so it is never an answer here.
- **forked workers**: ``multiprocessing`` forks by default on Linux (before Python 3.14).
  GNU OpenMP, Numba's choice on Linux when TBB is missing, cannot run in a child forked
  from a process that already used it: Numba kills such a child with "Terminating: fork()
  called from a process already using GNU OpenMP", and a ``multiprocessing.Pool`` then
  waits forever for its workers.

TBB is safe on both counts, so tilegemm depends on the ``tbb`` package where PyPI has
wheels for it (Linux on x86-64). pip puts ``libtbb.so.12`` in the environment's ``lib``
folder, which the dynamic loader does not search in a virtual environment, so Numba would
not find it and would fall back to OpenMP: :func:`make_tbb_loadable` loads it by its full
path first, and Numba's own search then finds the library already loaded.

Where TBB cannot be loaded (no wheel for the platform, or Numba had already chosen OpenMP
before tilegemm was used), a child forked from a process whose OpenMP threads are running
has :func:`parallel_unsafe` true, and the blocked rung runs its products there on the
calling thread, without a parallel region: slower, but the worker lives. A choice the user
made (``NUMBA_THREADING_LAYER`` or ``numba.config.THREADING_LAYER``) is left alone: making
TBB loadable only adds a candidate, and Numba still takes the layer it was told to take.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

from tilegemm._compat import import_numba
from tilegemm._environ import environ_reader

# The name Numba asks the dynamic loader for (TBB's binary interface since oneTBB 2021).
TBB_LIBRARY = "libtbb.so.12"

_tbb_handle: ctypes.CDLL | None = None
_tbb_tried = False
# True in a forked child whose parent had Numba's OpenMP layer running, or a parallel region
# running in another thread (see parallel_unsafe).
_forked_unsafe = False


def tbb_library_path() -> Path | None:
    """Where the ``tbb`` package put ``libtbb.so.12`` (None where it is not installed):
    the environment's ``lib`` folder, or wherever the package's file list says (a user
    install, a Conda environment)."""
    candidate = Path(sys.prefix) / "lib" / TBB_LIBRARY
    if candidate.is_file():
        return candidate
    from importlib import metadata

    try:
        files = metadata.files("tbb") or []
        dist = metadata.distribution("tbb")
    except metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == TBB_LIBRARY:
            path = Path(dist.locate_file(entry)).resolve()
            if path.is_file():
                return path
    return None


def _numba_layer_started() -> bool:
    """Whether Numba has already chosen and started its threading layer in this process."""
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    return bool(parallel is not None and getattr(parallel, "_is_initialized", False))


def make_tbb_loadable() -> bool:
    """Load the ``tbb`` package's library so that Numba's threading layer can use it.

    Only on Linux (where the fork problem is, and where the dependency is installed), once
    per process, and only before Numba has started a threading layer (afterwards the choice
    is made). Returns whether the library is loaded. Never raises: without TBB, Numba picks
    another layer as it always did.
    """
    global _tbb_handle, _tbb_tried
    if _tbb_handle is not None:
        return True
    if _tbb_tried or not sys.platform.startswith("linux") or _numba_layer_started():
        return False
    _tbb_tried = True
    try:  # already in the process (loaded by something else): Numba will find that copy
        _tbb_handle = ctypes.CDLL(TBB_LIBRARY, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        pass
    path = tbb_library_path()
    if path is None:
        return False
    try:
        # RTLD_GLOBAL: Numba's own dlopen("libtbb.so.12") and its TBB extension module then
        # resolve to this copy by its soname.
        _tbb_handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def _openmp_running() -> bool:
    """Whether this process runs Numba's OpenMP layer with a non-fork-safe runtime (GNU
    OpenMP: Numba's OpenMP layer everywhere but Windows and macOS)."""
    if not _numba_layer_started() or sys.platform in ("win32", "darwin"):
        return False
    parallel = sys.modules["numba.np.ufunc.parallel"]
    return getattr(parallel, "_threading_layer", None) == "omp"


# Parallel regions running in this process now (any thread): a child forked meanwhile
# inherits a thread pool caught mid-region, which TBB cannot shut down before the fork
# ("Unable to join threads to shut down before fork()"); a parallel region in that child
# could then wait forever. One entry per region: ``list.append`` and ``list.pop`` are each
# atomic, where a counter needs a lock (two lock round trips cost 0.8 µs a call, more right
# after a product that streamed more than the L2 cache).
_regions: list[None] = []


def regions_running() -> int:
    """How many parallel regions of tilegemm this process is running now (any thread)."""
    return len(_regions)


class InParallel:
    """Around a call that runs a parallel region: counted, so that a child forked while it
    runs computes on its calling thread only (:func:`parallel_unsafe`), and, until the
    pool's threads are known, a :class:`PoolWatch` (the first regions may start the pool).

    One object and no system call once the pool is known: this runs between parallel
    regions, where right after one that streamed more than the L2 cache every line of
    Python costs ten times its usual time (see :func:`place_workers`); a ``PoolWatch``
    and this, apart, cost 11 µs there on an Intel Xeon (family 6 model 167)."""

    __slots__ = ("watch",)

    def __enter__(self) -> InParallel:
        _regions.append(None)
        self.watch = None if _pool_tids.get(_pid[0]) else PoolWatch()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.watch is not None:
            self.watch.__exit__()
        _regions.pop()


_pid = [os.getpid()]  # this process's id (os.getpid() is a system call), kept after forks


def _after_fork_in_child() -> None:
    global _forked_unsafe, _starting
    _pid[0] = os.getpid()
    # the parent's regions of other threads do not exist here, but its pool is unusable
    _forked_unsafe = _forked_unsafe or _openmp_running() or len(_regions) > 0
    _regions.clear()
    _starting = threading.Lock()  # another thread of the parent may have held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_unsafe() -> bool:
    """True in a process forked (at any depth) from one that was running Numba's GNU
    OpenMP layer, or that was inside a parallel region in another thread at the fork (any
    layer): a parallel region here would be killed or could hang, so products must stay
    on the calling thread."""
    return _forked_unsafe


# --- Where Numba's worker threads run -------------------------------------------------------
#
# After the process has been idle for a tenth of a second or more, the first parallel
# region of a product often ran without its second thread for about 4 ms, one scheduler
# tick (measured on a 2-vCPU KVM guest, AMD EPYC Zen 5, TBB and OpenMP layers alike; 1024³
# float32 then took 10 ms instead of 5). The woken worker was queued behind the calling
# thread on the caller's CPU, and moved to the idle CPU only by the next load balancing.
# A worker allowed on one CPU, not the caller's, is woken there at once (5-7 ms after any
# pause). So before a threaded product the workers are spread over the CPUs the caller may
# use, one each, none on the CPU the caller is running on.

PIN_ENV = "TILEGEMM_PIN_THREADS"
_LINUX = sys.platform.startswith("linux")

_pool_tids: dict[int, list[int]] = {}  # pid -> the threads that Numba's first region started
_placement: dict[int, tuple[int, frozenset[int]]] = {}  # pid -> (caller's CPU, allowed)


_pin_setting, _encode = environ_reader(PIN_ENV)
_PIN_OFF = _encode("0")
# While the caller stays on one CPU, place_workers reads the CPUs it may use at most this
# often: the system call and the set cost 0.5 µs in a loop, 4 µs right after a product that
# streamed more than the L2 cache (see place_workers).
AFFINITY_INTERVAL_NS = 50_000_000
_affinity_read = [0]  # time.monotonic_ns() of the last read that found the placement current


def pinning_enabled() -> bool:
    """Whether tilegemm places Numba's worker threads (``TILEGEMM_PIN_THREADS=0`` turns it
    off; only on Linux, where threads can be placed by id)."""
    return _LINUX and _pin_setting() != _PIN_OFF


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


_getcpu: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]


def current_cpu() -> int:
    """The CPU the calling thread runs on (-1 where the C library cannot tell)."""
    global _getcpu
    if _getcpu is None:
        try:
            _getcpu = ctypes.CDLL(None).sched_getcpu
            _getcpu.restype, _getcpu.argtypes = ctypes.c_int, []
        except (OSError, AttributeError):
            return -1
    return int(_getcpu())


def worker_cpus(workers: int, allowed: set[int] | frozenset[int], caller: int) -> list[int]:
    """The CPU for each of ``workers`` threads: the allowed CPUs other than the caller's, in
    order, one per thread (round again only when there are more threads than CPUs)."""
    others = sorted(c for c in allowed if c != caller) or sorted(allowed)
    return [others[i % len(others)] for i in range(workers)]


class PoolWatch:
    """Around what may start Numba's thread pool (loading or compiling the rung's code, and
    in the first threaded products both asking Numba for its thread count and the calls
    themselves): the threads that appear meanwhile are Numba's workers (and the threading
    library's helpers), remembered for placing. Watches at most ``WATCHES`` times per
    process (the import and two per product, until the pool is found); if the pool was
    already running (the process ran parallel Numba code before tilegemm), nothing
    appears and nothing is ever placed."""

    WATCHES = 7

    def __init__(self, always: bool = False) -> None:
        """``always``: watch even when ``WATCHES`` are used up (the one call that starts
        the pool, :func:`pool_threads`)."""
        pid = os.getpid()
        self.before: set[int] | None = None
        if not _pool_tids.get(pid) and (always or _watches.get(pid, 0) < self.WATCHES):
            _watches[pid] = _watches.get(pid, 0) + 1
            self.before = _thread_ids()

    def __enter__(self) -> PoolWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            # Threads Python started meanwhile (the application's own, another library's
            # ``threading`` pool) are never Numba's workers: those run no Python code.
            new = _thread_ids() - self.before - _python_thread_ids()
            if new:
                _pool_tids[os.getpid()] = sorted(new)


_watches: dict[int, int] = {}  # pid -> how many times PoolWatch looked
_starting = threading.Lock()


def pool_threads() -> int:
    """``numba.get_num_threads()``, whose first call starts Numba's thread pool: that first
    call is made by one thread at a time, inside a :class:`PoolWatch`, so the pool's
    threads are seen even when many threads make their first product at once (there,
    concurrent watches used up ``WATCHES`` before the pool started, and it was never
    placed)."""
    if _numba_layer_started():
        # what numba.get_num_threads() returns once the pool runs, without the two locks
        # it takes first (one a multiprocessing lock): 0.8 µs in a loop, 12 µs right after
        # a product that streamed more than the L2 cache (see place_workers)
        count = getattr(sys.modules["numba.np.ufunc.parallel"], "_get_num_threads", None)
        threads = count() if count is not None else 0
        return threads if threads > 0 else import_numba().get_num_threads()
    with _starting, PoolWatch(always=True):
        return import_numba().get_num_threads()


def planned_threads() -> int:
    """The threads a product would use, without starting Numba's pool (``plan`` asks)."""
    import numba

    if _numba_layer_started():
        return numba.get_num_threads()
    return int(numba.config.NUMBA_NUM_THREADS)


def _python_thread_ids() -> set[int]:
    """The kernel thread ids of the threads Python's ``threading`` knows (every thread that
    runs Python code, the main thread included)."""
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def place_workers() -> None:
    """Pin each of Numba's worker threads to one CPU the caller may use, other than the one
    it runs on now (see above). Never raises: a thread that has gone, or a CPU refused,
    leaves that thread where it is.

    Cheap when nothing changed since the last call: the caller's CPU is read every time,
    the CPUs it may use every ``AFFINITY_INTERVAL_NS``. This runs between parallel
    regions, and right after one that streamed more than the L2 cache every line of
    Python it runs comes from L3: on an Intel Xeon (family 6 model 167, 2 MiB of L2) this
    function took 15 µs there (1.6 µs in a loop of its own), with a system call and
    ``os.environ`` read each time; a float64 1024 × 1024 matrix times a vector takes
    170 µs."""
    pid = _pid[0]
    tids = _pool_tids.get(pid)
    if not tids or not pinning_enabled():
        return
    cpu = current_cpu()
    placed = _placement.get(pid)
    now = time.monotonic_ns()
    if placed is not None and placed[0] == cpu and (
            now - _affinity_read[0] < AFFINITY_INTERVAL_NS):
        return
    try:
        allowed = frozenset(os.sched_getaffinity(0))
    except OSError:
        return
    if len(allowed) < 2:
        return
    if placed == (cpu, allowed):
        _affinity_read[0] = now
        return
    alive = []
    for tid, target in zip(tids, worker_cpus(len(tids), allowed, cpu), strict=True):
        try:
            os.sched_setaffinity(tid, {target})
            alive.append(tid)
        except OSError:  # gone, or not ours to move
            pass
    _pool_tids[pid] = alive
    _placement[pid] = (cpu, allowed)
    _affinity_read[0] = now
