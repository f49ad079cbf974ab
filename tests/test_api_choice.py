"""How a call chooses its backend and what it tells the caller: ``device=`` and a named
``kernel=`` with ``backend="auto"``, ``plan`` refusing what ``matmul`` refuses, float16
operands with a float32 ``out`` as NumPy computes them, and the log of first calls."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

import tilegemm
from conftest import host_tile
from tilegemm import api
from tilegemm.backends import get_backend
from tilegemm.errors import InvalidValueError, UsageError


def _operands() -> tuple[np.ndarray, np.ndarray]:
    return np.ones((4, 6), np.float32), np.ones((6, 5), np.float32)


def _tile() -> dict[str, int]:
    """The register tile named in the calls below: this machine's float32 tile, whose
    module the other tests compile too (the log records are what is tested, not a tile)."""
    return host_tile("float32")


def _tile_text() -> str:
    return " ".join(f"{k}={v}" for k, v in _tile().items())


def _stand_in(backend, usable: bool, accelerated: bool, reason: str):  # noqa: ANN001, ANN202
    """A backend as choose_backend reads it (its status, device choice and array kind)."""
    status = SimpleNamespace(name=backend.name, usable=usable, accelerated=accelerated,
                             reason=reason)
    return SimpleNamespace(name=backend.name, accepts_device=backend.accepts_device,
                           array_kind=backend.array_kind, status=lambda: status)


def _device_backends_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every backend with a device choice (CUDA, OpenCL) unusable, as on a machine
    with neither a GPU nor an OpenCL driver; the CPU backend stays the real one."""
    real = api.get_backend

    def fake(name: str):  # noqa: ANN202
        backend = real(name)
        if not backend.accepts_device:
            return backend
        return _stand_in(backend, False, False, f"no {name} driver")

    monkeypatch.setattr(api, "get_backend", fake)
    monkeypatch.setattr(api, "may_be_accelerated", lambda name: False)


@pytest.mark.parametrize("call", [tilegemm.matmul, tilegemm.plan])
def test_plan_refuses_device_where_matmul_does(call) -> None:
    """plan runs the checks of a call: a device index for the CPU backend is refused by
    both, with the same message."""
    a, b = _operands()
    with pytest.raises(InvalidValueError) as err:
        call(a, b, backend="cpu", device=0)
    assert str(err.value) == ("backend 'cpu' has no device choice; device= works with "
                              "backend='cuda' or backend='opencl'")


@pytest.mark.parametrize("call", [tilegemm.matmul, tilegemm.plan])
def test_device_with_auto_and_no_device_backend_says_auto_chose_the_cpu(
        call, monkeypatch: pytest.MonkeyPatch) -> None:
    _device_backends_unusable(monkeypatch)
    a, b = _operands()
    with pytest.raises(InvalidValueError) as err:
        call(a, b, device=0)
    text = str(err.value)
    assert "device= chooses a device of backend 'cuda' or 'opencl'" in text
    assert "none of them is usable here (cuda: no cuda driver; opencl: no opencl driver)" in text
    assert text.endswith("backend='auto' chose 'cpu', which has no device choice: leave "
                         "device= out")


@pytest.mark.opencl
def test_device_with_auto_steers_to_a_backend_with_devices() -> None:
    """``device=0`` with ``backend="auto"`` on host arrays: the backend auto prefers when
    it has a device choice (a GPU), else OpenCL, whose device 0 ``tilegemm info`` lists."""
    a, b = _operands()
    preferred = tilegemm.plan(a, b).backend
    expected = preferred if get_backend(preferred).accepts_device else "opencl"
    chosen = tilegemm.plan(a, b, device=0)
    assert chosen.backend == expected
    assert chosen.device == get_backend(expected).target(0).key
    np.testing.assert_array_equal(tilegemm.matmul(a, b, device=0), a @ b)


@pytest.mark.opencl
def test_a_named_kernel_with_auto_runs_on_a_usable_backend_that_has_it() -> None:
    """The CPU backend has no rung 'shared': ``backend="auto"`` takes the first usable
    backend that has one rather than refusing the call."""
    a, b = _operands()
    preferred = tilegemm.plan(a, b).backend
    expected = "opencl" if preferred == "cpu" else preferred
    chosen = tilegemm.plan(a, b, kernel="shared", TILE=8)
    assert (chosen.backend, chosen.kernel, chosen.params) == (expected, "shared", {"TILE": 8})
    if expected == "opencl":
        np.testing.assert_array_equal(tilegemm.matmul(a, b, kernel="shared", TILE=8), a @ b)


def test_a_named_kernel_nothing_usable_has_keeps_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No usable backend has 'shared': the call stays on auto's choice and the hint names
    the backends that have the rung without recommending one that cannot run."""
    _device_backends_unusable(monkeypatch)
    import importlib

    backends = importlib.import_module("tilegemm.backends")
    monkeypatch.setattr(backends, "get_backend", api.get_backend)  # the registry's hint
    a, b = _operands()
    with pytest.raises(UsageError) as err:
        tilegemm.matmul(a, b, kernel="shared")
    text = str(err.value)
    assert text.startswith("unknown kernel 'shared' for backend 'cpu' (kernel 'shared' is a "
                           "rung of backends 'cuda', 'opencl' and 'cudac', none of them usable "
                           "here)")
    assert "pass backend=" not in text


def _half_operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float16 operands whose products and float32 sums are exact in any order (multiples
    of 1/8 and 1/64, small), but whose sums need more bits than float16 has: every correct
    kernel gives the same float32 sums, and rounding them to float16 changes them."""
    rng = np.random.default_rng(7)
    a = (rng.integers(-64, 65, (3, 4, 6)) / 8).astype(np.float16)
    b = (rng.integers(-64, 65, (6, 5)) / 8).astype(np.float16)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    return a, b, exact


@pytest.mark.parametrize("backend", ["cpu", pytest.param("opencl", marks=pytest.mark.opencl)])
def test_float16_operands_with_a_float32_out_follow_numpy(backend: str) -> None:
    """NumPy computes the float16 result and casts it into the float32 out; the CPU and
    OpenCL do the same (only CUDA's tensor cores take a float32 out as a request for their
    unrounded sums)."""
    a, b, exact = _half_operands()
    want = np.empty(exact.shape, np.float32)
    np.matmul(a, b, out=want)
    assert not np.array_equal(want, exact)  # the data does tell the two apart
    out = np.full(exact.shape, np.nan, np.float32)
    assert tilegemm.matmul(a, b, out, backend=backend) is out
    np.testing.assert_array_equal(out, want)
    # dtype=np.float32 asks NumPy (and tilegemm) for the float32 sums themselves
    np.testing.assert_array_equal(tilegemm.matmul(a, b, backend=backend, dtype=np.float32),
                                  exact)


def _first_use_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tilegemm.api"]


def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fresh process: no kernel used yet, and no call remembered (a remembered
    call, parameters included, skips the path that logs a first use)."""
    from tilegemm import remembered

    monkeypatch.setattr(api, "_USED", set())
    remembered.forget()


def test_first_call_of_a_kernel_is_logged_once_and_quietly(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call of a (rung, parameters, dtype) leaves a DEBUG record; later calls
    none. Nothing at INFO or above for a quick first call, so nothing shows by default."""
    _fresh_process(monkeypatch)
    monkeypatch.setattr(api, "time", SimpleNamespace(perf_counter=lambda: 0.0))  # quick
    a, b = _operands()
    with caplog.at_level(logging.DEBUG, logger="tilegemm"):
        tilegemm.matmul(a, b, backend="cpu", kernel="blocked", **_tile())
        tilegemm.matmul(a, b, backend="cpu", kernel="blocked", **_tile())
    records = _first_use_records(caplog)
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert records[0].getMessage().startswith(
        f"first use of cpu:blocked {_tile_text()} MC=")
    assert "for float32 in this process" in records[0].getMessage()


def test_a_slow_first_call_is_explained_at_info(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first call that takes longer than the threshold gets one INFO record that says
    it was compiling and what the kernel cache does about it (a fake clock: no timing)."""
    _fresh_process(monkeypatch)
    ticks = iter(range(0, 1000, 3))  # every reading 3 s after the last
    monkeypatch.setattr(api, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", "off")
    a, b = _operands()
    with caplog.at_level(logging.INFO, logger="tilegemm"):
        tilegemm.matmul(a, b, backend="cpu", kernel="blocked", **_tile())
        tilegemm.matmul(a, b, backend="cpu", kernel="blocked", **_tile())
    records = _first_use_records(caplog)
    assert [r.levelno for r in records] == [logging.INFO]
    text = records[0].getMessage()
    assert text.startswith(f"cpu:blocked {_tile_text()} MC=")
    assert "for float32: the first call took 3.0 s, which includes compiling the kernel" in text
    assert "the kernel cache is off (TILEGEMM_KERNEL_CACHE)" in text


def test_a_slow_first_call_does_not_promise_an_unusable_cache(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """With a kernel-cache directory that could not be written, the INFO record says that
    nothing was kept (it used to say later processes would load the kernel)."""
    from tilegemm import compile_cache

    _fresh_process(monkeypatch)
    ticks = iter(range(0, 1000, 3))
    monkeypatch.setattr(api, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(not_a_dir))
    monkeypatch.setattr(compile_cache, "_UNUSABLE", {str(not_a_dir / "cpu")})
    a, b = _operands()
    with caplog.at_level(logging.INFO, logger="tilegemm"):
        tilegemm.matmul(a, b, backend="cpu", kernel="blocked", **_tile())
    text = _first_use_records(caplog)[0].getMessage()
    assert "could not be used here" in text and "loads in well under" not in text


def test_a_cache_warning_names_the_callers_line(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path) -> None:
    from tilegemm import compile_cache

    monkeypatch.setattr(compile_cache, "_UNUSABLE", set())
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.warns(compile_cache.CompileCacheWarning, match="cannot be used") as seen:
        assert not compile_cache._write_entry(not_a_dir / "cpu" / "entry.py", "text")
    assert seen[0].filename == __file__
    assert compile_cache.unusable_folders() == [str(not_a_dir / "cpu")]


def test_a_call_logs_nothing_by_default(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without logging configured, even a slow first call writes nothing to stdout or
    stderr (its record is INFO, below what Python shows by default)."""
    _fresh_process(monkeypatch)
    ticks = iter(range(0, 1000, 30))
    monkeypatch.setattr(api, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    a, b = _operands()
    tilegemm.matmul(a, b, backend="cpu", kernel="blocked", **_tile())
    assert capsys.readouterr() == ("", "")


def _a_gpu_backend(monkeypatch: pytest.MonkeyPatch, cpu_usable: bool = True) -> None:
    """A usable GPU backend ("cuda", a stand-in: choose_backend reads its status only)
    ahead of the real CPU backend in auto's order; the CPU made unusable on request."""
    real = api.get_backend

    def fake(name: str):  # noqa: ANN202
        backend = real(name)
        if name == "cuda":
            return _stand_in(backend, True, True, "fake")
        if name == "cpu" and not cpu_usable:
            return _stand_in(backend, False, False, "no numba")
        return backend

    monkeypatch.setattr(api, "get_backend", fake)
    monkeypatch.setattr(api, "may_be_accelerated", lambda name: name == "cuda")


def _chosen(m: int, n: int, k: int, dtype: str = "float32", batch: int = 0,
            b_dtype: str | None = None, **kw) -> str:
    """The backend choose_backend picks for host operands of these shapes, given the
    problem as a call gives it."""
    from tilegemm.problem import describe, make_problem

    lead = (batch,) if batch else ()
    ops = [describe(np.empty(lead + (m, k), dtype), "a"),
           describe(np.empty(lead + (k, n), b_dtype or dtype), "b")]
    prob = make_problem(*ops, dtype=kw.pop("dtype", None))
    return api.choose_backend("auto", ops, kw.pop("device", None), kw.pop("kernel", "auto"),
                              prob, kw.pop("precision", None)).name


def test_small_host_products_run_on_the_cpu_instead_of_a_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _a_gpu_backend(monkeypatch)
    assert _chosen(8, 8, 8) == "cpu"
    assert _chosen(1, 1, 1, "float64") == "cpu"
    assert _chosen(256, 256, 256) == "cpu"  # SMALL_HOST_PRODUCT itself
    assert _chosen(256, 256, 257) == "cuda"
    assert _chosen(64, 64, 64, batch=64) == "cpu"  # the batch counts: 64 * 64^3 = 256^3
    assert _chosen(64, 64, 64, batch=65) == "cuda"
    assert _chosen(1, 1, 1, precision="ieee") == "cpu"


@pytest.mark.parametrize("why", [
    {"precision": "tf32"},  # tensor cores asked for
    {"device": 0},  # a GPU asked for
    {"kernel": "naive"},  # a rung of the GPU's (steered as before)
    {"dtype": "float16"},  # 16-bit operands: the GPU's tensor cores
    {"b_dtype": "float16"},
    {"dtype": "int32"},
    {"dtype": "float32", "b_dtype": "int32"},
])
def test_small_products_stay_on_the_gpu_when_the_call_asks_for_more(
        monkeypatch: pytest.MonkeyPatch, why: dict) -> None:
    _a_gpu_backend(monkeypatch)
    kw = dict(why)
    dtype = kw.pop("dtype", "float32")
    assert _chosen(8, 8, 8, dtype, **kw) == "cuda"


def test_small_products_stay_on_the_gpu_without_a_usable_cpu_backend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _a_gpu_backend(monkeypatch, cpu_usable=False)
    assert _chosen(8, 8, 8) == "cuda"


def test_without_the_problem_the_size_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers that choose a backend for something other than one product (the tuner)
    pass no problem: the GPU, as before."""
    from tilegemm.problem import describe

    _a_gpu_backend(monkeypatch)
    ops = [describe(np.empty((8, 8), np.float32), "a")] * 2
    assert api.choose_backend("auto", ops).name == "cuda"


@pytest.mark.opencl
def test_a_small_product_runs_on_the_cpu_where_auto_prefers_a_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end, with PoCL's device taken for a GPU: plan and matmul agree, a small
    product runs on the CPU (right, and remembered per shape), a larger one and one that
    names a rung on OpenCL."""
    from dataclasses import replace

    opencl = get_backend("opencl")
    accelerated = replace(opencl.status(), accelerated=True)
    monkeypatch.setattr(opencl, "status", lambda: accelerated)
    monkeypatch.setattr(api, "may_be_accelerated", lambda name: name == "opencl")
    rng = np.random.default_rng(11)
    for (m, n, k), backend in (((7, 13, 5), "cpu"), ((64, 64, 4097), "opencl")):
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        assert tilegemm.plan(a, b).backend == backend
        for _ in range(2):  # the second call is the remembered one
            got = tilegemm.matmul(a, b)
            np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4,
                                       atol=1e-4 * np.sqrt(k))
    assert tilegemm.plan(a, b, kernel="naive").backend == "opencl"
