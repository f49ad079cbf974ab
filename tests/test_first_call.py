"""What a fresh process's first call imports and probes: only the backends it can use.

``backend="auto"`` prefers a GPU, so it asks every backend; a backend that certainly has
none (no CUDA driver library, no GPU device node for OpenCL) is not probed, which keeps
PyOpenCL, numba-cuda and the CUDA rung modules out of a CPU-only process's first call.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tilegemm.backends import ARRAY_KINDS, BACKENDS, _probe, get_backend, host_backend


def test_array_kinds_agree_with_the_backends() -> None:
    assert set(ARRAY_KINDS) == set(BACKENDS)
    for name in BACKENDS:
        assert get_backend(name).array_kind == ARRAY_KINDS[name]
    assert get_backend(host_backend()).array_kind == "host"


def test_opencl_is_probed_only_where_a_gpu_can_exist(monkeypatch) -> None:
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(_probe, "_gpu_device_node", lambda: False)
    assert not _probe.may_be_accelerated("opencl")
    monkeypatch.setenv("PYOPENCL_CTX", "0")  # the user chose a device: always probe
    assert _probe.may_be_accelerated("opencl")
    monkeypatch.delenv("PYOPENCL_CTX")
    monkeypatch.setattr(_probe, "_gpu_device_node", lambda: True)
    assert _probe.may_be_accelerated("opencl")
    monkeypatch.setattr(sys, "platform", "darwin")  # no device nodes to look at: probe
    monkeypatch.setattr(_probe, "_gpu_device_node", lambda: False)
    assert _probe.may_be_accelerated("opencl")
    assert not _probe.may_be_accelerated("cpu")


def test_cuda_is_probed_only_with_a_driver_or_the_simulator(monkeypatch) -> None:
    from tilegemm import simulator

    monkeypatch.setattr(simulator, "enabled", lambda: False)
    monkeypatch.setattr(_probe, "driver_library_present", lambda: False)
    assert not _probe.may_be_accelerated("cuda") and not _probe.may_be_accelerated("cudac")
    monkeypatch.setattr(simulator, "enabled", lambda: True)
    assert _probe.may_be_accelerated("cuda")


SCRIPT = """
import json, sys
import numpy as np
from tilegemm.api import choose_backend
from tilegemm.backends import _probe
from tilegemm.problem import describe
a = np.ones((4, 4), np.float32)
backend = choose_backend("auto", [describe(a, "a"), describe(a, "b")])
print(json.dumps({"backend": backend.name, "modules": sorted(sys.modules),
                  "gpu_possible": [_probe.may_be_accelerated(n) for n in ("cuda", "opencl")]}))
"""


def test_a_cpu_only_first_call_imports_no_gpu_library() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True, env={**__import__("os").environ,
                                          "NUMBA_ENABLE_CUDASIM": "0"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if any(got["gpu_possible"]):
        pytest.skip("this machine may have a GPU: the backends are probed")
    assert got["backend"] == "cpu"
    loaded = set(got["modules"])
    assert not {"pyopencl", "numba.cuda", "tilegemm.backends.opencl",
                "tilegemm.backends.cuda"} & loaded
    assert not any(m.startswith("tilegemm.kernels.cuda") for m in loaded)


OPENCL_ONLY = r"""
import json, sys
import numpy as np
import tilegemm
from tilegemm.backends import get_backend

usable = get_backend("opencl").status().usable
if usable:
    a = np.ones((17, 9), np.float32)
    assert (tilegemm.matmul(a, a.T, backend="opencl") == 9).all()
print(json.dumps({"usable": usable, "modules": sorted(sys.modules)}))
"""


def test_an_opencl_first_call_imports_neither_numba_nor_llvmlite() -> None:
    """An OpenCL call needs neither: importing Numba takes a quarter to a third of a second
    on a 2-core machine, LLVM's bindings 30-70 ms (the host CPU's tier, the kept probe
    binary's key). Both had crept into the first call through the device's key."""
    out = subprocess.run([sys.executable, "-c", OPENCL_ONLY], capture_output=True, text=True,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if not got["usable"]:
        pytest.skip("no usable OpenCL device here")
    loaded = set(got["modules"])
    assert "pyopencl" in loaded  # (the control: the call did go through OpenCL)
    assert not {"numba", "llvmlite"} & loaded


NUMBA_FIRST_IMPORT = r"""
import importlib.abc, json, sys, threading, traceback
import numpy as np

first = []


class Watch(importlib.abc.MetaPathFinder):
    # records where Numba is first imported from, then steps aside
    def find_spec(self, name, path, target=None):
        if name == "numba" and not first:
            first.append([f.name for f in traceback.extract_stack()])
        return None


sys.meta_path.insert(0, Watch())
import tilegemm

assert "numba" not in sys.modules
a, b = np.ones((17, 9), np.float32), np.ones((9, 5), np.float32)
errors = []


def call(kernel):
    try:
        assert (tilegemm.matmul(a, b, backend="cpu", kernel=kernel) == 9).all()
    except Exception as exc:
        errors.append(repr(exc)[:300])


threads = [threading.Thread(target=call, args=(k,)) for k in ("auto", "triple_loop") * 12]
for t in threads:
    t.start()
for t in threads:
    t.join(240)
print(json.dumps({"stack": first[0] if first else [], "errors": errors}))
"""


def test_numba_is_first_imported_by_one_thread_under_a_lock() -> None:
    """Numba's modules import each other in cycles: threads making a fresh process's first
    CPU products at once were handed half-initialised Numba modules (``cannot import name
    'CodeLibrary' from partially initialized module 'numba.core.codegen'``, in 2 of 5
    processes with 24 threads). Numba's first import now goes through
    ``_compat.import_numba``, one thread at a time; 24 threads' first calls all succeed."""
    from conftest import script_json

    got = script_json(NUMBA_FIRST_IMPORT, timeout=300)
    assert "import_numba" in got["stack"], got["stack"][-8:]
    assert got["errors"] == []
