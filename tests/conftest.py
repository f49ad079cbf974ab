"""Shared test setup: NaN poisoning everywhere, and skips by what a test needs.

Markers (declared in pyproject.toml):
- ``cudasim``: runs CUDA kernels. Runs when NUMBA_ENABLE_CUDASIM=1 (``make test`` runs these
  in a second pytest process with it set) or, on a GPU machine, with TILEGEMM_GPU_TESTS=1.
- ``ptx``: compiles kernels to PTX and links with nvJitLink; needs no GPU but cannot run
  under the simulator.
- ``opencl``: needs a usable OpenCL device (PoCL is enough).
- ``simulator``: (with ``cudasim``) needs numba's simulator itself (Python stand-ins for the
  intrinsics, tracing, simulator-sized defaults); skipped on a real GPU, where it would fail
  and stop ``pytest -x`` before the kernels are checked.
- ``gpu``: needs a real GPU (TILEGEMM_GPU_TESTS=1), e.g. CuPy/PyTorch interop.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import pytest

# Every fresh output buffer a backend allocates is filled with NaN (ints: a sentinel)
# before the launch, so an element a kernel never writes fails the check.
os.environ.setdefault("TILEGEMM_POISON", "1")


def _session_dir(variable: str, prefix: str) -> None:
    """``variable`` names a fresh directory of this test session unless it is set, removed
    when the process that made it exits (pytest-xdist's workers inherit it from the
    controller, which outlives them; every session had left ~5 MB behind)."""
    if variable in os.environ:
        return
    path = tempfile.mkdtemp(prefix=prefix)
    os.environ[variable] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)


# Compiled kernels are cached in a directory of this test session, never the user's cache.
_session_dir("TILEGEMM_KERNEL_CACHE", "tilegemm-kernels-")
# Tuned parameters too: a developer's tuning cache must not change what kernel="auto" or a
# named rung picks in a test (tests that tune set their own directory).
_session_dir("TILEGEMM_CACHE_DIR", "tilegemm-cache-")
# A first compile runs in the process that needs it, so the tests' counts of compilations
# and loads stay exact (tests/test_cpu_compile_workers.py asks for worker processes).
os.environ.setdefault("TILEGEMM_COMPILE_JOBS", "1")

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0")
REAL_GPU = os.environ.get("TILEGEMM_GPU_TESTS", "") not in ("", "0")

# Shapes chosen to break tiling: 1×1×1, a row times a column, K=1, primes, partial tiles
# on every edge (tile 8), and sizes just above a tile multiple.
HOSTILE_SHAPES = [
    (1, 1, 1),
    (1, 9, 1),  # (M, N, K): 1×K times K×1 below has K=9
    (1, 1, 9),
    (5, 3, 1),
    (7, 13, 5),
    (9, 17, 8),
    (33, 17, 65),
    (16, 16, 16),
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda = pytest.mark.skip(reason="needs NUMBA_ENABLE_CUDASIM=1 or TILEGEMM_GPU_TESTS=1")
    skip_ptx = pytest.mark.skip(reason="PTX compilation is not available under the simulator")
    for item in items:
        if "cudasim" in item.keywords and not (SIM or REAL_GPU):
            item.add_marker(skip_cuda)
        if "simulator" in item.keywords and not SIM:
            item.add_marker(pytest.mark.skip(reason="needs numba's CUDA simulator itself"))
        if "gpu" in item.keywords and not REAL_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a real GPU (TILEGEMM_GPU_TESTS=1)"))
        if "ptx" in item.keywords and SIM:
            item.add_marker(skip_ptx)
        if "opencl" in item.keywords and _opencl_problem():
            item.add_marker(pytest.mark.skip(reason=_opencl_problem()))


_OPENCL: str | None = None


def _opencl_problem() -> str:
    """"" when the OpenCL backend is usable, else its reason (shown with the skips: on a
    CPU that the pip PoCL's LLVM does not know, the tests say so instead of failing)."""
    global _OPENCL
    if _OPENCL is None:
        from tilegemm.backends import get_backend

        status = get_backend("opencl").status()
        _OPENCL = "" if status.usable else f"no usable OpenCL device: {status.reason}"[:300]
    return _OPENCL


@pytest.fixture
def count_calls(monkeypatch):  # type: ignore[no-untyped-def]
    """``count_calls(owner, name)`` replaces ``owner.name`` for the test by a wrapper that
    calls it and counts: the list returned grows by one per call."""
    def patch(owner, name: str) -> list[int]:  # type: ignore[no-untyped-def]
        calls: list[int] = []
        real = getattr(owner, name)

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)
        return calls
    return patch


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random data every run (the seed is printed on failure by pytest's repr)."""
    return np.random.default_rng()


class FakeCudaEvent:
    """A CUDA event (CuPy/PyTorch style) on a fake clock: each ``record`` advances it by 1 ms,
    so a launch timed between two events takes exactly 1 ms."""

    clock = 0.0

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.t = 0.0

    def record(self) -> None:
        FakeCudaEvent.clock += 0.001
        self.t = FakeCudaEvent.clock

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeCudaEvent) -> float:  # milliseconds, as torch and CuPy
        return (end.t - self.t) * 1e3


def host_tile(dtype: Any) -> dict[str, int]:
    """The register tile (MR, NR) that ``matmul`` runs for ``dtype`` on this machine with
    nothing tuned: the database's, else the registry default's."""
    from tilegemm import registry
    from tilegemm.backends import get_backend
    from tilegemm.tune.select import untuned_choice

    choice = untuned_choice(get_backend("cpu"), np.dtype(dtype).name)
    params = choice[1] if choice is not None else registry.get("blocked", "cpu").defaults()
    return {"MR": params["MR"], "NR": params["NR"]}


def host_blocked_params(dtype: Any, overrides: dict[str, int] | None = None
                        ) -> dict[str, int]:
    """The CPU ``blocked`` rung's registry defaults with the register tile (MR, NR) that
    ``matmul`` runs for ``dtype`` on this machine with nothing tuned (the database's), and
    ``overrides``. Tests that need some tile, not a particular one, use these: they then
    test the tile users get here, and share its compiled module with the tests that call
    ``matmul`` (a tile compiles in about 20 s on a 2-vCPU machine, and compiling is most
    of the test suite's time). The path thresholds a database entry may also set
    (FEW_KB, FEW_KC, UNPACKED_KB) stay the registry's, which the tests' shapes assume."""
    from tilegemm import registry

    return registry.get("blocked", "cpu").resolve({**host_tile(dtype), **(overrides or {})})


def blocked_module(params: dict[str, int], dtype: Any) -> tuple[dict[str, int], Any]:
    """(the parameters resolved, the generated module the CPU ``blocked`` rung runs in for
    them and ``dtype``): its compiled functions, for tests that call them directly.
    Parameters not given are this machine's (``host_blocked_params``)."""
    from tilegemm import registry

    params = host_blocked_params(dtype, params)
    return params, registry.get("blocked", "cpu").program(params, np.dtype(dtype)).module


def bound(mod: Any, params: dict[str, int], **changes: int) -> tuple[int, ...]:
    """``cb``, the tuple of bound parameters that the compiled functions of ``mod`` (a
    ``blocked_module``) take, for ``params`` with ``changes`` (the rung's parameter names:
    ``bound(mod, params, KC=64)``)."""
    return mod.bind({**params, **changes}).bound


def run_in_threads(work, count: int) -> None:  # type: ignore[no-untyped-def]
    """Call ``work(i)`` for i in range(count), each in its own thread, and wait for all."""
    import threading

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# A generated module of compiled functions (as a rung's): ``heavy`` called by name from
# ``first``, whose code ``second`` links; the ``more`` block may declare more functions
# (listed in MORE), before the probe. Filled with compile_cache.fill_template.
BY_NAME_TEMPLATE = '''
import numba
from tilegemm.kernels.cpu._lazy import called_by_name, load_compiled, njit_when_called

# @header
SCALE = 1
CACHE = False
# @end-header

f8, v = numba.float64, numba.float64[::1]


@njit_when_called(f8(v), cache=CACHE, error_model="python")
def heavy(x):
    if x.shape[0] == 0:
        raise ValueError("heavy needs a value")
    t = 0.0
    for i in range(x.shape[0]):
        t += SCALE * x[i]
    return t


call_heavy = called_by_name(heavy)


@njit_when_called(f8(v), cache=CACHE)
def first(x):
    return call_heavy(x) + 1


@njit_when_called(f8(v), cache=CACHE)
def second(x):  # reaches heavy through first, whose code is linked into its own
    return 2 * first(x)


# @more
MORE = ()
# @end-more


@njit_when_called(numba.boolean(f8), cache=CACHE)
def probe(x):
    return x > 0


COMPILED = (heavy, first, second, *MORE, probe)
CALLED_FROM_PYTHON = (probe, first, second, *MORE)
load_compiled(COMPILED, CALLED_FROM_PYTHON)
'''


def script_json(script: str, *args: str, env: dict[str, str] | None = None,
                timeout: float = 300) -> dict:
    """Run ``script`` (Python source) in a fresh interpreter with ``args``; the JSON object
    its last line of output prints. A failing script fails the test with its output."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def transposed_device_array(rng: np.random.Generator, shape: tuple, dtype: Any
                            ) -> tuple[Any, np.ndarray]:
    """(a numba device array of ``shape`` laid out transposed: the transpose of a C-ordered
    one in its last two dimensions, as ``x.T`` is; its values on the host, C-ordered).
    numba's own ``transpose`` takes 2-D arrays only, so the view is made with the backend's
    ``strided_view``."""
    from numba import cuda

    from tilegemm.backends.cuda_program import strided_view

    base = rng.standard_normal(shape[:-2] + shape[-2:][::-1]).astype(dtype)
    axes = tuple(range(base.ndim - 2)) + (base.ndim - 1, base.ndim - 2)
    host = base.transpose(axes)
    return (strided_view(cuda.to_device(base), host.shape, host.strides),
            np.ascontiguousarray(host))


def record_async_copies(monkeypatch: Any) -> list[tuple[tuple[int, ...], int]]:
    """The simulator's ``cp.async`` copies from now on, as (the source array's shape, bytes
    the instruction copies: 16 or 4), e.g. to check that an operand's tiles went by whole
    16-byte chunks rather than by a kernel's narrower paths."""
    from tilegemm.kernels.cuda import _tensorcore

    seen: list[tuple[tuple[int, ...], int]] = []
    queue = _tensorcore._queue_copy

    def recorded(dst: Any, didx: Any, src: Any, sidx: Any, size: int, nbytes: Any) -> None:
        seen.append((tuple(src.shape), size))
        queue(dst, didx, src, sidx, size, nbytes)

    monkeypatch.setattr(_tensorcore, "_queue_copy", recorded)
    return seen
