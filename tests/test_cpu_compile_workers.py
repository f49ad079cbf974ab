"""A first compile spread over worker processes (kernels/cpu/_compile_workers): what the
workers compile is what the importing process then loads and runs, callers compiled
against a stand-in for a callee called by name included; a worker that fails leaves the
compile to the importing process; the job count is read strictly.

The test session compiles in the importing process (conftest sets TILEGEMM_COMPILE_JOBS=1,
so compile counts elsewhere stay as they are); these tests ask for workers."""

from __future__ import annotations

import os

import numba
import pytest

from conftest import BY_NAME_TEMPLATE, script_json
from tilegemm.compile_cache import fill_template
from tilegemm.errors import InvalidValueError
from tilegemm.kernels.cpu import _compile_workers
from tilegemm.kernels.cpu._lazy import called_by_name, njit_when_called

# The shared module (conftest) with a third function, which links second's code and calls
# heavy by name too: first and third compile against a stand-in for heavy in a worker
# that has not compiled it.
THIRD = """
@njit_when_called(f8(v), cache=CACHE)
def third(x):
    return second(x) + call_heavy(x)


MORE = (third,)
"""

RUN = """
import json, logging, sys
import numpy as np
from tilegemm import compile_cache
from tilegemm.kernels.cpu import _compile_workers
if len(sys.argv) > 2:  # workers that end at once, before answering
    _compile_workers.WORKER_CODE = "import sys; sys.exit(3)"
records = []
handler = logging.Handler()
handler.emit = lambda r: records.append(r.getMessage())
logging.getLogger("tilegemm").addHandler(handler)
logging.getLogger("tilegemm").setLevel(logging.DEBUG)
m = compile_cache.load_module("workers", sys.argv[1], {"kernel": "workers"})
x = np.arange(4.0)
try:
    m.third(np.empty(0))
    error = None
except ValueError as e:
    error = str(e)
print(json.dumps({"stats": compile_cache.STATS, "values": [m.first(x), m.third(x)],
                  "error": error, "log": [r for r in records if "worker" in r]}))
"""


def _run(tmp_path, jobs: str, *extra: str) -> dict:
    source = fill_template(BY_NAME_TEMPLATE, {"SCALE": 3, "CACHE": False}, {"more": THIRD})
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path), TILEGEMM_COMPILE_JOBS=jobs)
    return script_json(RUN, source, *extra, env=env)


def test_workers_compile_what_the_importing_process_loads_and_runs(tmp_path):
    """With two jobs the importing process compiles only the probe (which tells it the
    cache is cold) and loads the four others from the workers' entries: the values, and an
    exception raised inside the helper called by name, are those of a plain compile. A
    later process compiles nothing."""
    got = _run(tmp_path, "2")
    expected = {"values": [3 * 6.0 + 1, 2 * (3 * 6.0 + 1) + 3 * 6.0],
                "error": "heavy needs a value"}
    assert got["stats"] == {"compiled": 1, "loaded": 4}, got
    assert {k: got[k] for k in expected} == expected
    again = _run(tmp_path, "2")
    assert again["stats"] == {"compiled": 0, "loaded": 4}, again  # the probe loaded at import,
    assert {k: again[k] for k in expected} == expected  # the others on their first call


def test_one_job_compiles_in_the_importing_process(tmp_path):
    got = _run(tmp_path, "1")
    assert got["stats"] == {"compiled": 5, "loaded": 0}, got
    assert got["values"] == [3 * 6.0 + 1, 2 * (3 * 6.0 + 1) + 3 * 6.0]


def test_workers_that_fail_leave_the_compile_to_the_importing_process(tmp_path):
    """Workers that end without answering: the importing process compiles everything
    itself, with the same results, and the tilegemm logger says why (DEBUG)."""
    got = _run(tmp_path, "2", "failing")
    assert got["stats"] == {"compiled": 5, "loaded": 0}, got
    assert got["values"] == [3 * 6.0 + 1, 2 * (3 * 6.0 + 1) + 3 * 6.0]
    assert got["error"] == "heavy needs a value"
    assert any("stopped" in r and "ended" in r for r in got["log"]), got["log"]


@njit_when_called(numba.float64(numba.float64))
def _leaf(x):
    return x + 1


_call_leaf = called_by_name(_leaf)


@njit_when_called(numba.float64(numba.float64))
def _middle(x):
    return _leaf(x) * 2


@njit_when_called(numba.float64(numba.float64))
def _top(x):
    return _middle(x) + _call_leaf(x)


def test_the_schedule_waits_only_for_linked_callees_and_starts_the_longest_chain():
    """A function waits for those whose code is linked into its own, not for those it
    calls by name; the costliest chain of waiting functions is started first."""
    deps = _compile_workers.linked_callees([_leaf, _middle, _top])
    assert deps == {"_leaf": set(), "_middle": {"_leaf"}, "_top": {"_middle"}}
    paths = _compile_workers._critical_paths(deps, {"_leaf": 5, "_middle": 1, "_top": 1})
    assert paths == {"_leaf": 7, "_middle": 2, "_top": 1}
    assert all(f.pending for f in (_leaf, _middle, _top))  # finding them compiled nothing


@pytest.mark.parametrize(("text", "jobs"), [("1", 1), ("3", 3), (" 2 ", 2)])
def test_the_job_count_is_read_from_the_environment(monkeypatch, text, jobs):
    monkeypatch.setenv(_compile_workers.JOBS_ENV, text)
    assert _compile_workers.compile_jobs() == jobs


def test_the_default_job_count_is_the_usable_cpus_at_most_four(monkeypatch):
    from tilegemm.backends.cpu import usable_cpus

    monkeypatch.delenv(_compile_workers.JOBS_ENV, raising=False)
    assert _compile_workers.compile_jobs() == min(usable_cpus(), 4)


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_a_job_count_that_is_no_whole_positive_number_is_refused(monkeypatch, text):
    monkeypatch.setenv(_compile_workers.JOBS_ENV, text)
    with pytest.raises(InvalidValueError, match="TILEGEMM_COMPILE_JOBS"):
        _compile_workers.compile_jobs()


def test_a_stand_in_address_is_a_callable_address():
    """What a worker names a callee it has not compiled: an address in this process (a
    callback ending the worker should it ever run), the same each time."""
    address = _compile_workers.stand_in_address()
    assert isinstance(address, int) and address != 0
    assert _compile_workers.stand_in_address() == address


def test_a_bad_job_count_is_refused_before_the_rung_is_imported(monkeypatch, tmp_path):
    """Refused where the rung is built, with the variable's name: not inside the cache's
    import, whose failures are taken for a damaged entry (a warning, the entry deleted)."""
    import warnings

    import numpy as np

    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.registry import get

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv(_compile_workers.JOBS_ENV, "zero")
    params = get("blocked", "cpu").resolve({"MR": 4, "NR": 8})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidValueError, match="TILEGEMM_COMPILE_JOBS='zero'"):
            k02_blocked.build(params, np.dtype("float32"))
    assert not list(tmp_path.rglob("*.py"))  # nothing was written, nothing compiled


def test_workers_compile_for_the_cpu_numba_compiles_for_here(monkeypatch):
    """Numba's target CPU as this process has it reaches the workers as their environment
    variables: set in code, it is passed on; unset in code (Numba's own choice, the host),
    a variable left in the environment is not passed on."""
    from numba.core import config

    monkeypatch.setattr(config, "CPU_NAME", "znver3")
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+fma")
    env = _compile_workers.worker_env()
    assert env["NUMBA_CPU_NAME"] == "znver3" and env["NUMBA_CPU_FEATURES"] == "+avx2,+fma"
    monkeypatch.setattr(config, "CPU_NAME", None)
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    monkeypatch.setenv("NUMBA_CPU_NAME", "stale")
    env = _compile_workers.worker_env()
    assert "NUMBA_CPU_NAME" not in env and "NUMBA_CPU_FEATURES" not in env
