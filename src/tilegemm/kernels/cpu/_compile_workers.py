"""A rung's first compile spread over worker processes, one function per worker at a time.

With an empty cache the blocked rung compiles about twenty-five functions, one after
another on one core: 15-20 s per tile on a 2-vCPU machine, what a user's first product
(``make demo``) and every tuner candidate with a new tile wait for. Numba compiles under
one process-wide lock, so threads cannot share that work, but processes can: a worker
compiles a function and saves it to the disk cache once the functions linked into its
code are there (it loads those instead of compiling them again), and the importing
process loads the result, as any later process would. A function its code calls by name
(``_lazy.called_by_name``) need not be compiled first: the worker only compiles and saves
the caller's machine code, whose call names the callee's symbol, so it gives that symbol
a stand-in address (:func:`stand_in_address`); the importing process names the callee's
real code before it loads the caller, as it does for code cached by an earlier process.

The importing process runs a small scheduler: it starts up to ``TILEGEMM_COMPILE_JOBS``
workers (default: the CPUs this process may use, at most four; the longest single compiles,
the parallel region's 3 s, bound the gain beyond that), hands each a function
whose linked callees are all compiled, the costliest remaining chain first (a rough cost:
the function's bytecode, three times for a parallel region), and waits. Anything that
goes wrong (a worker that cannot start, fails or dies) stops the workers, and the
importing process compiles what is missing itself, as it always did: this only moves work,
it never decides what is compiled. A worker imports the same tilegemm, Numba and
generated source, for the same CPU features, under the same settings (the vector width in
force is passed on): its code is what this process would have compiled. Not on Windows
(the scheduler waits on pipes with ``selectors``) nor in a frozen application, whose
``sys.executable`` is the application itself.

Private (underscore) module: discovery does not look for a rung here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tilegemm.errors import InvalidValueError

JOBS_ENV = "TILEGEMM_COMPILE_JOBS"
MOST_JOBS = 4  # the default's cap (see the module docstring)
REPLY_SECONDS = 600.0  # one function's compile, at most, before the workers are given up

log = logging.getLogger(__name__)

# True in a worker: importing the rung's module declares its functions and compiles
# nothing (the scheduler says what to compile).
IN_WORKER = False
# What a worker process runs (``python -c``), with this tilegemm's folder first on its path.
WORKER_CODE = ("import sys; sys.path.insert(0, {root!r}); "
               "from tilegemm.kernels.cpu._compile_workers import serve; serve()")


def compile_jobs() -> int:
    """Worker processes for a first compile: ``TILEGEMM_COMPILE_JOBS`` if set (1: compile
    in the importing process, as before), else the CPUs this process may use, at most
    :data:`MOST_JOBS`."""
    text = os.environ.get(JOBS_ENV, "").strip()
    if not text:
        from tilegemm.backends.cpu import usable_cpus

        return min(usable_cpus(), MOST_JOBS)
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise InvalidValueError(f"{JOBS_ENV}={text!r}: give a whole number of worker "
                                "processes, 1 or more (1 compiles in the calling process)")
    return jobs


def linked_callees(functions: Sequence[Any]) -> dict[str, set[str]]:
    """For each function (a ``_lazy`` dispatcher), the others among ``functions`` that it
    calls directly: their code is linked into its own, so they are compiled first (a
    worker then loads them). Those it calls by name are not among them: a worker compiles
    a caller against a stand-in address for such a callee (:func:`stand_in_address`),
    which the importing process, loading the caller, replaces with the callee's own."""
    from tilegemm.kernels.cpu._lazy import WhenCalledDispatcher, _global_names

    names = {id(f): f.py_func.__name__ for f in functions}
    out: dict[str, set[str]] = {}
    for f in functions:
        scope = f.py_func.__globals__
        found = {names[id(obj)] for obj in map(scope.get, _global_names(f.py_func.__code__))
                 if isinstance(obj, WhenCalledDispatcher) and id(obj) in names}
        found.discard(names[id(f)])
        out[names[id(f)]] = found
    return out


_STAND_IN: list[Any] = []  # the callback behind stand_in_address, kept alive


def stand_in_address() -> int:
    """The address a worker gives a function called by name that it has not compiled: the
    caller's machine code is only compiled and saved there, never run, and the process that
    loads it names the callee's real code first. Should it ever run, it ends the worker
    with a message rather than jumping to arbitrary memory."""
    import ctypes

    if not _STAND_IN:
        def never_called() -> int:
            sys.stderr.write("tilegemm: a compile worker ran code it only compiles\n")
            os._exit(70)

        _STAND_IN.append(ctypes.CFUNCTYPE(ctypes.c_int)(never_called))
    return ctypes.cast(_STAND_IN[0], ctypes.c_void_p).value


def _code_size(code: Any) -> int:
    """Bytes of bytecode of a function and the code nested in it (comprehensions)."""
    return len(code.co_code) + sum(_code_size(c) for c in code.co_consts
                                   if hasattr(c, "co_code"))


def compile_cost(f: Any) -> int:
    """A rough measure of how long ``f`` takes to compile, to start the longest work
    first: its bytecode's size, three times that for a parallel region (Numba's lowering
    of ``prange`` builds and compiles the region and three wrappers around it: the
    blocked rung's took 3 s of 17 on a 2-vCPU Zen 3, its largest plain function 2.4)."""
    parallel = bool(getattr(f, "targetoptions", {}).get("parallel"))
    return _code_size(f.py_func.__code__) * (3 if parallel else 1)


def _critical_paths(deps: dict[str, set[str]], cost: dict[str, int]) -> dict[str, int]:
    """For each function, its cost plus the costliest chain of functions waiting for it:
    the largest first, so the end of the longest chain is reached as early as it can be."""
    waiting: dict[str, set[str]] = {name: set() for name in deps}
    for name, needs in deps.items():
        for callee in needs:
            waiting[callee].add(name)
    memo: dict[str, int] = {}

    def path(name: str) -> int:
        if name not in memo:
            memo[name] = cost[name] + max((path(w) for w in waiting[name]), default=0)
        return memo[name]

    return {name: path(name) for name in deps}


def compile_in_workers(functions: Sequence[Any]) -> None:
    """Compile the pending ones of ``functions`` (a generated rung module's, callees before
    callers) in worker processes into the disk cache, where the caller then loads them;
    nothing happens with one job, inside a worker, or for a module without a disk cache."""
    from tilegemm.kernels.cpu._lazy import QuickLoadCache

    pending = [f for f in functions if f.pending]
    if (IN_WORKER or len(pending) < 2 or not sys.executable or os.name == "nt"
            or getattr(sys, "frozen", False)):
        return
    jobs = compile_jobs()
    module = sys.modules.get(pending[0].py_func.__module__)
    path = Path(getattr(module, "__file__", None) or "")
    if (jobs < 2 or not path.is_file() or not os.access(path.parent, os.W_OK)
            or not all(isinstance(f._cache, QuickLoadCache) for f in pending)):
        return  # nothing to share, or nothing a worker compiled could be kept
    deps = linked_callees(pending)  # (among the pending ones: the others are in the cache)
    cost = {f.py_func.__name__: compile_cost(f) for f in pending}
    init = {"stem": path.stem, "path": str(path), "width": pending[0].declaration[2]}
    try:
        _Scheduler(deps, cost, min(jobs, len(pending)), init).run()
    except Exception:  # noqa: BLE001 - only work moved: the caller compiles what is missing
        log.debug("compiling in worker processes failed; the rest compiles here",
                  exc_info=True)


class _Scheduler:
    """Hands out functions to workers as their callees are done (see the module docstring);
    stops at the first failure, leaving the rest to the caller."""

    def __init__(self, deps: dict[str, set[str]], cost: dict[str, int], jobs: int,
                 init: dict[str, Any]) -> None:
        self.deps = deps
        self.jobs = jobs
        self.init = init
        order = _critical_paths(deps, cost)
        self.todo = sorted(deps, key=lambda n: -order[n])  # stable: declared order on ties
        self.done: set[str] = set()
        self.workers: list[subprocess.Popen] = []
        self.busy: dict[int, str] = {}  # worker index -> the function it compiles

    def run(self) -> None:
        with tempfile.TemporaryFile() as errors, selectors.DefaultSelector() as sel:
            try:
                for i in range(self.jobs):
                    worker = self._start(errors)
                    self.workers.append(worker)
                    sel.register(worker.stdout, selectors.EVENT_READ, i)
                self._dispatch()
                while self.busy:
                    events = sel.select(timeout=REPLY_SECONDS)
                    if not events:
                        raise TimeoutError(f"no worker answered in {REPLY_SECONDS:.0f} s")
                    for key, _ in events:
                        self._reply(key.data, key.fileobj.readline())
                    self._dispatch()
            except (OSError, _WorkerFailed) as exc:  # TimeoutError is an OSError
                self._stop()  # (the workers' output is whole once they have ended)
                errors.seek(0)
                log.debug("compiling in worker processes stopped (%s); the rest compiles "
                          "here. The workers wrote:\n%s", exc,
                          errors.read().decode(errors="replace")[-4000:])
            finally:
                self._stop()  # (none left after a failure; on Ctrl-C, those compiling)

    def _start(self, errors: Any) -> subprocess.Popen:
        root = str(Path(__file__).resolve().parents[3])  # the folder holding tilegemm/
        worker = subprocess.Popen([sys.executable, "-c", WORKER_CODE.format(root=root)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=errors, text=True, bufsize=1, env=worker_env())
        assert worker.stdin is not None
        worker.stdin.write(json.dumps(self.init) + "\n")
        return worker

    def _dispatch(self) -> None:
        """Give each idle worker the first function whose linked callees are all done."""
        for i, worker in enumerate(self.workers):
            if i in self.busy:
                continue
            ready = next((n for n in self.todo if self.deps[n] <= self.done), None)
            if ready is None:
                return
            self.todo.remove(ready)
            self.busy[i] = ready
            assert worker.stdin is not None
            worker.stdin.write(ready + "\n")

    def _reply(self, i: int, line: str) -> None:
        """Take a worker's reply (:class:`_WorkerFailed` when it failed or ended)."""
        name = self.busy.pop(i, None)
        if line.strip() != f"ok {name}":
            raise _WorkerFailed(f"worker {i}, compiling {name}: {line.strip() or 'ended'}")
        self.done.add(name)

    def _stop(self) -> None:
        """End every worker: its input closed, it stops after the function it compiles
        (killed if it is still compiling; the caller compiles that function itself)."""
        workers, self.workers = self.workers, []
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.stdin.close()  # a worker ends when its input does
        for worker in workers:
            if self.busy:
                worker.kill()
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            with contextlib.suppress(OSError):
                worker.stdout.close()


def worker_env() -> dict[str, str]:
    """A worker's environment: this process's, with the CPU Numba compiles for as this
    process has it (``numba.config.CPU_NAME`` and ``CPU_FEATURES`` may have been set in
    code, not through ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES``): code for another CPU would
    be saved where this process never looks, and compiled again here."""
    from numba.core import config

    env = dict(os.environ)
    for name, value in (("NUMBA_CPU_NAME", config.CPU_NAME),
                        ("NUMBA_CPU_FEATURES", config.CPU_FEATURES)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


class _WorkerFailed(Exception):
    """A worker answered that it failed, or ended without answering."""


def serve() -> None:
    """A worker's loop: import the rung's module as its importer did (compiling nothing),
    then compile each function named on standard input, answering ``ok NAME`` (or
    ``failed NAME``) on standard output once its code is in the disk cache."""
    global IN_WORKER
    IN_WORKER = True
    init = json.loads(sys.stdin.readline())
    from tilegemm.compile_cache import _import
    from tilegemm.kernels.cpu._slp import vector_width
    from tilegemm.kernels.cpu._threads import make_tbb_loadable

    make_tbb_loadable()  # the threading layer the importer's parallel code was built for
    with vector_width(init["width"]):
        module = _import(init["stem"], Path(init["path"]))
    for line in sys.stdin:
        name = line.strip()
        try:
            getattr(module, name).ensure()
        except Exception:  # noqa: BLE001 - the importer compiles it and reports the error
            traceback.print_exc()  # for the importer's DEBUG log
            print(f"failed {name}", flush=True)
            return
        print(f"ok {name}", flush=True)
