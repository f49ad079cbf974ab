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
