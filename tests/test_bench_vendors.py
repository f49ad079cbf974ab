"""Vendor references: NumPy for real; cuBLAS-through-CuPy/PyTorch and CLBlast through
stand-in modules (this machine has no GPU or CLBlast), so the glue is exercised: events,
verification, FP32 settings recorded."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types

import numpy as np
import pytest

from conftest import FakeCudaEvent
from tilegemm.backends import get_backend
from tilegemm.backends.base import Backend, BackendStatus, Limits, Target
from tilegemm.bench import vendors
from tilegemm.bench.timing import FAILED, OK, Policy
from tilegemm.problem import GemmProblem
from tilegemm.reference import random_operands

POLICY = Policy(warmup=1, min_reps=2, max_reps=4, budget_s=0.01)


def _problem(m: int = 12, n: int = 7, k: int = 9):  # type: ignore[no-untyped-def]
    prob = GemmProblem(m=m, n=n, k=k, dtype=np.dtype(np.float32), batch_shape=(1,))
    a3, b3 = random_operands((1, m, k), (1, k, n), np.float32)
    return prob, a3, b3


class _GpuBackend(Backend):
    def __init__(self, name: str) -> None:
        self.name = name

    def status(self) -> BackendStatus:
        return BackendStatus(self.name, True, "fake", ("Fake GPU",), accelerated=True)

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise AssertionError

    def _target(self, index: int | None) -> Target:
        return Target(self.name, "Fake GPU", "gpu", "sm_90", Limits(1024), "CUDA events",
                      accelerated=True, vendors=("cupy", "torch"))


def _fake_cupy(wrong: bool = False) -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.__version__ = "0.fake"
    cp.asarray = np.asarray
    cp.empty = np.empty
    cp.asnumpy = np.array

    def matmul(a, b, out):  # type: ignore[no-untyped-def]
        np.matmul(a, b, out=out)
        if wrong:
            out += 1

    cp.matmul = matmul
    cp.cuda = types.SimpleNamespace(
        Event=FakeCudaEvent, get_elapsed_time=lambda s, e: s.elapsed_time(e),
        Device=lambda: types.SimpleNamespace(synchronize=lambda: None))
    return cp


def test_numpy_reference_is_verified_and_timed() -> None:
    prob, a3, b3 = _problem()
    v = vendors.numpy_vendor()
    m = vendors.measure_vendor(v, "cpu", prob, a3, b3, POLICY)
    assert m.status == OK and m.vendor and m.samples and m.kernel.startswith("NumPy")
    assert "numpy" in v.note


class _Importable(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import <fake.__name__>`` return the fake module (a first import)."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != self.module.__name__:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.module

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        pass


def test_cublas_through_cupy_forces_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Importable(_fake_cupy()), *sys.meta_path])
    monkeypatch.setenv("CUPY_TF32", "1")
    v = vendors._cupy_vendor()  # sets CUPY_TF32=0, then imports cupy
    assert os.environ["CUPY_TF32"] == "0" and "no TF32" in v.note
    prob, a3, b3 = _problem()
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == OK and m.method == "CUDA events"
    assert all(t == pytest.approx(1e-3) for t in m.samples)


def test_cupy_imported_earlier_with_tf32_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setenv("CUPY_TF32", "1")
    assert "TF32 may be used" in vendors._cupy_vendor().note


def test_a_wrong_vendor_result_is_failed_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(wrong=True))
    prob, a3, b3 = _problem()
    m = vendors.measure_vendor(vendors._cupy_vendor(), "cuda", prob, a3, b3, POLICY)
    assert m.status == FAILED and "wrong result" in m.reason


def test_cublas_through_torch_disables_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tensor(np.ndarray):
        def cuda(self):  # type: ignore[no-untyped-def]
            return self

        def cpu(self):  # type: ignore[no-untyped-def]
            return self

        def numpy(self):  # type: ignore[no-untyped-def]
            return np.asarray(self)

        @property
        def device(self):  # type: ignore[no-untyped-def]
            return "cuda:0"

    torch = types.ModuleType("torch")
    torch.__version__ = "0.fake"
    torch.from_numpy = lambda a: np.asarray(a).view(Tensor)
    torch.empty = lambda shape, dtype, device: np.empty(shape, dtype).view(Tensor)
    torch.matmul = lambda a, b, out: np.matmul(a, b, out=out)
    flags = types.SimpleNamespace(allow_tf32=True)
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=flags),
                                           cudnn=types.SimpleNamespace(allow_tf32=True))
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, Event=FakeCudaEvent,
                                       synchronize=lambda: None)
    monkeypatch.setitem(sys.modules, "torch", torch)
    v = vendors._torch_vendor()
    assert flags.allow_tf32 is False and "no TF32" in v.note
    prob, a3, b3 = _problem()
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == OK and m.samples


def test_torch_new_precision_api_is_used_alone() -> None:
    """PyTorch >= 2.9: setting the legacy allow_tf32 after the new fp32_precision API was
    used raises 'mix of the legacy and new APIs'; the vendor must set only the new flag."""

    class Matmul:
        fp32_precision = "none"

        @property
        def allow_tf32(self) -> bool:
            raise RuntimeError("mix of the legacy and new APIs")

        @allow_tf32.setter
        def allow_tf32(self, value: bool) -> None:
            raise RuntimeError("mix of the legacy and new APIs")

    torch = types.SimpleNamespace(backends=types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=Matmul())))
    vendors._torch_fp32_matmul(torch)
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


def test_no_vendor_is_a_note_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import fails
    monkeypatch.setitem(sys.modules, "torch", None)
    v, note = vendors.find_vendor(_GpuBackend("cuda"))
    assert v is None and note.startswith("no vendor library found")


@pytest.mark.opencl  # a device that is listed but cannot build programs does not count
def test_clblast_glue_on_a_real_opencl_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyclblast stand-in that computes on the host; the queue, arrays and profiling
    fallback are real pyopencl on PoCL."""
    calls = []

    def gemm(queue, m, n, k, a, b, c, a_ld, b_ld, c_ld):  # type: ignore[no-untyped-def]
        calls.append((m, n, k, a_ld, b_ld, c_ld))
        c.set(np.matmul(a.get(), b.get()).astype(c.dtype))
        return None  # no event: the host-clock fallback is used

    monkeypatch.setitem(sys.modules, "pyclblast", types.SimpleNamespace(gemm=gemm,
                                                                       __version__="0.fake"))
    v = vendors._clblast_vendor(get_backend("opencl").target())
    prob, a3, b3 = _problem()
    m = vendors.measure_vendor(v, "opencl", prob, a3, b3, POLICY)
    assert m.status == OK and m.samples and calls[0] == (12, 7, 9, 9, 7, 7)


@pytest.mark.opencl
def test_clblast_glue_calls_gemm_as_the_installed_pyclblast_declares_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The arguments the glue passes bind to the installed pyclblast's own signature (the
    real library's first call compiles its kernels on PoCL for half a minute, so the suite
    checks the call against the signature instead of making it)."""
    import inspect

    real = pytest.importorskip("pyclblast")
    calls: list[tuple[tuple, dict]] = []

    def gemm(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((args, kwargs))
        c = inspect.signature(real.gemm).bind(*args, **kwargs).arguments["c"]
        c.set(np.matmul(args[4].get(), args[5].get()).astype(c.dtype))

    monkeypatch.setitem(sys.modules, "pyclblast", types.SimpleNamespace(gemm=gemm))
    v = vendors._clblast_vendor(get_backend("opencl").target())
    prob, a3, b3 = _problem()
    assert vendors.measure_vendor(v, "opencl", prob, a3, b3, POLICY).status == OK
    bound = inspect.signature(real.gemm).bind(*calls[0][0], **calls[0][1]).arguments
    assert (bound["m"], bound["n"], bound["k"], bound["a_ld"], bound["b_ld"], bound["c_ld"]) \
        == (12, 7, 9, 9, 7, 7)


@pytest.mark.opencl
def test_clblast_time_covers_every_kernel_a_call_enqueues(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLBlast may enqueue several kernels and return only the last one's event; the
    measured time must bracket all of them (a slow first kernel, a trivial last one)."""
    import pyopencl as cl

    spans: list[float] = []

    def gemm(queue, m, n, k, a, b, c, a_ld, b_ld, c_ld):  # type: ignore[no-untyped-def]
        prg = cl.Program(queue.context, """
            __kernel void slow(__global float *x) {
                float s = 0; for (int i = 0; i < 3000000; ++i) s = s * 0.5f + 1.0f; x[0] = s; }
            __kernel void nop(__global float *x) { }""").build()
        scratch = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4)
        first = prg.slow(queue, (1,), None, scratch)
        c.set(np.matmul(a.get(), b.get()).astype(c.dtype), queue=queue)
        last = prg.nop(queue, (1,), None, scratch)
        first.wait()
        spans.append((first.profile.end - first.profile.start) * 1e-9)
        return last  # like CLBlast: the event of the last kernel only

    monkeypatch.setitem(sys.modules, "pyclblast", types.SimpleNamespace(gemm=gemm,
                                                                       __version__="0.fake"))
    v = vendors._clblast_vendor(get_backend("opencl").target())
    prob, a3, b3 = _problem()
    m = vendors.measure_vendor(v, "opencl", prob, a3, b3,
                               Policy(warmup=0, min_reps=2, max_reps=2, budget_s=0.01))
    assert m.status == OK
    # each timed call took at least as long as its slow first kernel alone
    assert min(m.samples) >= 0.9 * min(spans[-2:])


# --- the reference at the tensor-core rung's own precision --------------------------------


def test_vendor_math_follows_dtype_and_precision() -> None:
    assert vendors.vendor_math("float32") == "native"
    assert vendors.vendor_math("float32", "tf32") == "tf32"
    assert vendors.vendor_math("float32", "3xtf32") == "native"  # 3xTF32 vs SGEMM
    assert vendors.vendor_math("float16") == "fp16"
    assert vendors.vendor_math("bfloat16") == "bf16"


def test_cupy_tf32_reference_and_no_16bit_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setenv("CUPY_TF32", "0")
    with pytest.raises(ValueError, match="FP32/TF32 only, not BF16"):
        vendors._cupy_vendor("bf16")
    fake = _fake_cupy()

    def import_cupy(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "cupy":
            sys.modules["cupy"] = fake
            return fake
        return real_import(name, *args, **kwargs)

    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", import_cupy)
    v = vendors._cupy_vendor("tf32")
    assert os.environ["CUPY_TF32"] == "1" and v.math == "tf32" and "TF32" in v.name
    prob, a3, b3 = _problem()
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == OK  # checked at TF32's epsilon
    monkeypatch.setenv("CUPY_TF32", "0")  # imported already, with TF32 off: no TF32 mode
    with pytest.raises(ValueError, match="no TF32 reference"):
        vendors._cupy_vendor("tf32")


def test_torch_math_modes_set_the_flags() -> None:
    matmul = types.SimpleNamespace(allow_tf32=False,
                                   allow_fp16_reduced_precision_reduction=True,
                                   allow_bf16_reduced_precision_reduction=True)
    torch = types.SimpleNamespace(backends=types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=matmul)))
    assert "TF32" in vendors._torch_math(torch, "tf32") and matmul.allow_tf32 is True
    assert "float32 accumulation" in vendors._torch_math(torch, "bf16")
    assert matmul.allow_tf32 is False and not matmul.allow_bf16_reduced_precision_reduction
    vendors._torch_math(torch, "fp16")
    assert not matmul.allow_fp16_reduced_precision_reduction


def test_a_16bit_run_skips_references_without_that_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)
    v, note = vendors.find_vendor(_GpuBackend("cuda"), math="bf16")
    assert v is None and "FP32/TF32 only" in note
    v, _ = vendors.find_vendor(_GpuBackend("cuda"), math="native")
    assert v is not None and v.math == "native"


def test_no_tf32_reference_where_the_driver_override_turns_tf32_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA_TF32_OVERRIDE=0 makes cuBLAS run SGEMM whatever CuPy or PyTorch ask for: a
    TF32 comparison would be against FP32 (measured so once on an H100). FP32 runs keep
    the override."""
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setenv("CUPY_TF32", "1")
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    v, note = vendors.find_vendor(_GpuBackend("cuda"), math="tf32")
    assert v is None and "NVIDIA_TF32_OVERRIDE=0" in note
    assert vendors.tf32_overridden() is not None
    monkeypatch.setenv("CUPY_TF32", "0")
    v, _ = vendors.find_vendor(_GpuBackend("cuda"), math="native")
    assert v is not None and v.math == "native"
    for value in ("1", ""):
        monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", value)
        assert vendors.tf32_overridden() is None
    monkeypatch.setenv("CUPY_TF32", "1")
    v, _ = vendors.find_vendor(_GpuBackend("cuda"), math="tf32")
    assert v is not None and v.math == "tf32"
