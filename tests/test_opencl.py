"""The OpenCL backend and every OpenCL rung, on whatever OpenCL device is here (PoCL is enough).

Each rung is checked against float64 NumPy over the hostile shapes, batches (full,
shared and partially broadcast), 1-D operands, alpha/beta, empty dimensions, and pyopencl
arrays in and out; outputs are NaN-poisoned before every launch (conftest sets
TILEGEMM_POISON=1). PoCL compiles each program variant (seconds), so every test reuses
the default parameters except one alternative set per rung.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegemm
from conftest import HOSTILE_SHAPES
from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.reference import assert_close, random_operands
from tilegemm.registry import KernelSpec

pytestmark = pytest.mark.opencl

SPECS = registry.specs_for("opencl")
IDS = [s.name for s in SPECS]

# One alternative parameter set per rung: another work-group shape or path through the
# kernel (non-square tiles for register2d; the local-memory stage of vectorized, whose CPU
# default reads global memory directly). A rung not listed here is run at its defaults.
ALTERNATIVE = {
    "naive": {"BLOCK": 8},
    "coalesced": {"BLOCK": 8},
    "shared": {"TILE": 8},
    "register1d": {"TILE": 16, "R": 4},
    "register2d": {"BM": 16, "BN": 32, "BK": 8, "TM": 4, "TN": 2},
    "vectorized": {"BM": 16, "BN": 32, "BK": 8, "TM": 2, "TN": 8, "VW": 4},
}


def _mm(a, b, spec: KernelSpec, **kw):
    return tilegemm.matmul(a, b, backend="opencl", kernel=spec.name, **kw)


def _cl():
    import pyopencl as cl
    import pyopencl.array as cla

    return cl, cla


@pytest.fixture(scope="module")
def queue():
    """A queue in the backend's own context on the default device."""
    return get_backend("opencl").own_device().queue


# -- every rung, every shape ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_hostile_shapes(spec: KernelSpec, dtype: str) -> None:
    for m, n, k in HOSTILE_SHAPES:
        a, b = random_operands((m, k), (k, n), dtype)
        c = _mm(a, b, spec)
        assert isinstance(c, np.ndarray) and c.dtype == np.dtype(dtype)
        assert_close(c, a, b, what=f"{spec.name} {dtype} {m}x{n}x{k}")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_alternative_parameters(spec: KernelSpec) -> None:
    """The alternative set, and every per-device-type default set (so a GPU machine still
    runs the CPU defaults' code path, and the other way round)."""
    sets = [ALTERNATIVE.get(spec.name, {}), spec.defaults(),
            *spec.device_defaults.values()]
    for params in sets:
        for m, n, k in [(1, 1, 1), (7, 13, 5), (33, 17, 65), (37, 70, 19), (64, 64, 64)]:
            a, b = random_operands((m, k), (k, n), "float32")
            assert_close(_mm(a, b, spec, **params), a, b,
                         what=f"{spec.name} {params} {m}x{n}x{k}")


def _database_sets() -> list[tuple[str, dict[str, int]]]:
    from tilegemm.tune import database

    sets = [(e["kernel"], dict(e["params"])) for e in database.entries()
            if e["backend"] == "opencl"]
    # The 512-bit direct tile (float16) even where no entry names it.
    sets.append(("vectorized", {"BM": 8, "BN": 32, "BK": 16, "TM": 8, "TN": 32, "VW": 16}))
    return sets


@pytest.mark.parametrize(("kernel", "params"), _database_sets(),
                         ids=[f"{k}-{'-'.join(map(str, p.values()))}" for k, p in _database_sets()])
def test_database_parameters(kernel: str, params: dict[str, int]) -> None:
    """Every OpenCL database entry's parameters compute correctly on this device, whatever
    device it was measured on: odd and prime shapes (partial tiles, rows not a multiple of
    VW), a broadcast batch, transposed operands and beta, in both dtypes where possible."""
    spec = registry.get(kernel, "opencl")
    for dtype in ["float32", "float64"]:
        for m, n, k in [(1, 1, 1), (7, 13, 5), (33, 17, 65), (37, 70, 19), (64, 64, 64),
                        (65, 97, 31)]:
            a, b = random_operands((m, k), (k, n), dtype)
            assert_close(_mm(a, b, spec, **params), a, b,
                         what=f"{kernel} {params} {dtype} {m}x{n}x{k}")
    a, b = random_operands((3, 9, 40), (40, 48), "float32")
    assert_close(_mm(a, b, spec, **params), a, b, what=f"{kernel} {params} batch")
    at, bt = random_operands((40, 9), (48, 40), "float32")
    c0 = random_operands((9, 48), (1,), "float32")[0]
    got = tilegemm.gemm(at, bt, c0, alpha=1.5, beta=-2.0, trans_a=True, trans_b=True,
                        backend="opencl", kernel=kernel, **params)
    assert_close(got, at, bt, alpha=1.5, beta=-2.0, c=c0, trans_a=True, trans_b=True,
                 what=f"{kernel} {params} transposed, beta")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_batches_and_broadcast(spec: KernelSpec) -> None:
    cases = [
        ((3, 9, 17), (3, 17, 5)),     # full batch
        ((4, 9, 17), (17, 5)),        # one B shared by the batch
        ((9, 17), (2, 17, 5)),        # one A shared by the batch
        ((2, 1, 9, 6), (1, 3, 6, 7)),  # partial broadcast on both sides
    ]
    for sa, sb in cases:
        a, b = random_operands(sa, sb, "float32")
        assert_close(_mm(a, b, spec), a, b, what=f"{spec.name} {sa} @ {sb}")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_one_dimensional_operands(spec: KernelSpec) -> None:
    for sa, sb in [((17,), (17, 5)), ((9, 17), (17,)), ((17,), (17,)), ((3, 9, 17), (17,))]:
        a, b = random_operands(sa, sb, "float32")
        c = _mm(a, b, spec)
        assert c.shape == np.matmul(a, b).shape
        assert_close(c, a, b, what=f"{spec.name} {sa} @ {sb}")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.supports("int32")],
                         ids=[s.name for s in SPECS if s.supports("int32")])
def test_int32_exact(spec: KernelSpec) -> None:
    for m, n, k in [(1, 1, 1), (7, 13, 5), (33, 17, 65)]:
        a, b = random_operands((m, k), (k, n), "int32")
        c = _mm(a, b, spec)
        assert c.dtype == np.int32
        np.testing.assert_array_equal(c, a.astype(np.int64) @ b)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_gemm_alpha_beta(spec: KernelSpec) -> None:
    a, b = random_operands((2, 9, 13), (2, 13, 11), "float32")
    c0 = random_operands((2, 9, 11), (1,), "float32")[0]
    for alpha, beta in [(2.5, 0.0), (-1.0, 0.5), (0.0, 2.0)]:
        got = tilegemm.gemm(a, b, c0, alpha=alpha, beta=beta, backend="opencl", kernel=spec.name)
        assert_close(got, a, b, alpha=alpha, beta=beta, c=c0,
                     what=f"{spec.name} alpha={alpha} beta={beta}")
    # c broadcast from a row, and transposed operands
    row = random_operands((11,), (1,), "float32")[0]
    at, bt = np.swapaxes(a, -1, -2).copy(), np.swapaxes(b, -1, -2).copy()
    got = tilegemm.gemm(at, bt, row, alpha=1.5, beta=-2.0, trans_a=True, trans_b=True,
                        backend="opencl", kernel=spec.name)
    assert_close(got, at, bt, alpha=1.5, beta=-2.0, c=row, trans_a=True, trans_b=True,
                 what=f"{spec.name} transposed")
    # out=c updates c in place
    c = c0.copy()
    res = tilegemm.gemm(a, b, c, alpha=1.0, beta=1.0, out=c, backend="opencl", kernel=spec.name)
    assert res is c
    assert_close(c, a, b, beta=1.0, c=c0, what=f"{spec.name} in place")


def test_beta_zero_never_reads_c() -> None:
    """With beta == 0, NaN in C must not reach the result (0 * NaN is NaN)."""
    a, b = random_operands((9, 13), (13, 11), "float32")
    c = np.full((9, 11), np.nan, dtype=np.float32)
    for spec in SPECS:
        got = tilegemm.gemm(a, b, c, beta=0.0, backend="opencl", kernel=spec.name)
        assert_close(got, a, b, what=spec.name)


def test_empty_dimensions() -> None:
    spec = SPECS[-1]
    for sa, sb in [((0, 5), (5, 3)), ((4, 5), (5, 0)), ((0, 4, 5), (5, 3))]:
        a, b = random_operands(sa, sb, "float32")
        c = _mm(a, b, spec)
        assert c.shape == np.matmul(a, b).shape and c.size == 0
    a, b = np.ones((4, 0), np.float32), np.ones((0, 3), np.float32)
    for s in SPECS:
        np.testing.assert_array_equal(_mm(a, b, s), np.zeros((4, 3), np.float32))
        c0 = np.arange(12, dtype=np.float32).reshape(4, 3)
        got = tilegemm.gemm(a, b, c0, beta=2.0, backend="opencl", kernel=s.name)
        np.testing.assert_array_equal(got, 2 * c0)


def test_poison_fills_unwritten_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check behind every other test: a launch that writes nothing leaves NaN/sentinel."""
    from tilegemm.backends import opencl
    from tilegemm.backends.base import poison_value

    monkeypatch.setattr(opencl.OpenCLBackend, "_launch", staticmethod(lambda *a, **k: None))
    a, b = random_operands((5, 7), (7, 3), "float32")
    assert np.isnan(_mm(a, b, SPECS[0])).all()
    ai, bi = random_operands((5, 7), (7, 3), "int32")
    assert (_mm(ai, bi, SPECS[0]) == poison_value(np.int32)).all()


# -- pyopencl arrays stay on the device ----------------------------------------------------------


def test_pyopencl_in_pyopencl_out(queue) -> None:
    cl, cla = _cl()
    a, b = random_operands((3, 21, 19), (19, 10), "float32")
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    for spec in SPECS:
        dc = _mm(da, db, spec)
        assert isinstance(dc, cla.Array) and dc.context == queue.context
        assert dc.shape == (3, 21, 10)
        assert_close(dc.get(), a, b, what=f"{spec.name} device")


def test_repeated_device_results_are_arrays_of_their_own(queue) -> None:
    """A device result is made from a remembered array of its shape (PyOpenCL's
    constructor took a quarter of a small call): each call's result has a buffer of its
    own of exactly its size, and keeps its value when later calls of the same and other
    shapes (a matrix, a vector, an empty one) run."""
    cl, cla = _cl()
    cases = [random_operands((5, 7), (7, 3), "float32"), random_operands((4, 6), (6,), "float32"),
             random_operands((5, 7), (7, 3), "float32"), random_operands((0, 6), (6, 2), "float32")]
    results = []
    for _ in range(2):
        for a, b in cases:
            r = tilegemm.matmul(cla.to_device(queue, a), cla.to_device(queue, b))
            assert r.shape == np.matmul(a, b).shape and r.flags.c_contiguous
            assert (r.base_data is None) == (r.size == 0)
            if r.size:
                assert r.base_data.size == r.nbytes == r.size * 4
            results.append((r, a, b))
    buffers = [r.base_data.int_ptr for r, _, _ in results if r.size]
    assert len(set(buffers)) == len(buffers)
    for r, a, b in results:
        assert_close(r.get(), a, b)


def test_pyopencl_views_and_out(queue) -> None:
    """Offsets, transposed views and partial broadcasts are handled on the device."""
    _, cla = _cl()
    spec = SPECS[-1]
    big = random_operands((40, 30), (1,), "float32")[0]
    dbig = cla.to_device(queue, big)
    a, da = big[5:14], dbig[5:14]  # a row slice: non-zero offset, contiguous
    b = random_operands((30, 12), (1,), "float32")[0]
    db = cla.to_device(queue, b)
    assert_close(_mm(da, db, spec).get(), a, b, what="offset view")
    # transposed device operand (a strided view) via gemm
    bt = np.ascontiguousarray(b.T)
    got = tilegemm.gemm(da, cla.to_device(queue, bt), trans_b=True, backend="opencl",
                        kernel=spec.name)
    assert_close(got.get(), a, bt, trans_b=True, what="trans_b on device")
    got = _mm(da, cla.to_device(queue, bt).T, spec)
    assert_close(got.get(), a, b, what=".T view on device")
    # partial broadcast of device operands
    x, y = random_operands((2, 1, 5, 6), (1, 3, 6, 4), "float32")
    got = _mm(cla.to_device(queue, x), cla.to_device(queue, y), spec)
    assert_close(got.get(), x, y, what="device broadcast")
    # mixed host/device operands, out= on the device, device c with beta
    out = cla.empty(queue, (9, 12), np.float32)
    res = tilegemm.matmul(a, db, out=out, backend="opencl", kernel=spec.name)
    assert res is out
    assert_close(out.get(), a, b, what="device out")
    c0 = random_operands((9, 12), (1,), "float32")[0]
    dc0 = cla.to_device(queue, c0)
    res = tilegemm.gemm(da, db, dc0, alpha=0.5, beta=3.0, out=dc0, backend="opencl",
                        kernel=spec.name)
    assert res is dc0
    assert_close(dc0.get(), a, b, alpha=0.5, beta=3.0, c=c0, what="device c in place")
    # out aliasing an input: computed into a temporary, then copied
    sq = random_operands((16, 16), (1,), "float32")[0]
    dsq = cla.to_device(queue, sq)
    tilegemm.matmul(dsq, dsq, out=dsq, backend="opencl", kernel=spec.name)
    assert_close(dsq.get(), sq, sq, what="out aliases a and b")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_misaligned_device_offsets(spec: KernelSpec, queue) -> None:
    """Operands and out starting one element into a buffer: row lengths are multiples of 8,
    so only the offset decides whether a vector access would be misaligned."""
    _, cla = _cl()
    m, n, k = 19, 24, 40
    a, b = random_operands((m, k), (k, n), "float32")

    def shifted(x: np.ndarray):
        flat = cla.to_device(queue, np.concatenate([[np.float32(7)], x.ravel()]))
        return flat[1:].reshape(x.shape)

    for params in ({}, ALTERNATIVE.get(spec.name, {})):
        out = shifted(np.full((m, n), np.nan, np.float32))
        tilegemm.matmul(shifted(a), shifted(b), out=out, backend="opencl", kernel=spec.name,
                        **params)
        assert_close(out.get(), a, b, what=f"{spec.name} {params} offset by one")


def test_auto_uses_opencl_for_device_arrays(queue) -> None:
    _, cla = _cl()
    a, b = random_operands((6, 5), (5, 4), "float64")
    got = tilegemm.matmul(cla.to_device(queue, a), cla.to_device(queue, b))
    assert isinstance(got, cla.Array)
    assert_close(got.get(), a, b)


# -- device choice and checks before launch --------------------------------------------------------


def test_status_and_device_listing() -> None:
    from tilegemm.backends import opencl

    be = get_backend("opencl")
    st = be.status()
    assert st.usable and len(st.devices) == len(opencl.all_devices())
    default = opencl.all_devices()[opencl.default_device_index()]
    assert st.accelerated == (opencl.device_kind(default) == "gpu")
    if not st.accelerated:  # PoCL on the CPU must never beat the CPU backend to "auto"
        a, b = random_operands((4, 4), (4, 4), "float32")
        from tilegemm.api import choose_backend
        from tilegemm.problem import describe

        assert choose_backend("auto", [describe(a, "a"), describe(b, "b")]).name != "opencl"
    table = be.describe_devices()
    assert table.row_count == len(opencl.all_devices())


def test_pyopencl_ctx_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm.backends import opencl

    last = len(opencl.all_devices()) - 1
    platform = opencl.all_devices()[last].platform
    p_index = [p.int_ptr for p in _cl()[0].get_platforms()].index(platform.int_ptr)
    d_index = [d.int_ptr for d in platform.get_devices()].index(opencl.all_devices()[last].int_ptr)
    monkeypatch.setenv("PYOPENCL_CTX", f"{p_index}:{d_index}")
    assert opencl.default_device_index.__wrapped__() == last
    # PyOpenCL itself takes a device index past the platform's last as its first device
    past = len(platform.get_devices())
    monkeypatch.setenv("PYOPENCL_CTX", f"{p_index}:{past}")
    with pytest.raises(tilegemm.errors.UnavailableError,
                       match=f"names no OpenCL device here \\(platform {p_index} has {past}"):
        opencl.default_device_index.__wrapped__()


def test_explicit_device_index() -> None:
    from tilegemm.backends import opencl

    a, b = random_operands((7, 5), (5, 3), "float32")
    index = opencl.default_device_index()
    assert_close(tilegemm.matmul(a, b, backend="opencl", device=index), a, b)
    n = len(get_backend("opencl").status().devices)
    for bad in (n, -1, "0"):
        with pytest.raises(ValueError, match="unknown OpenCL device"):
            tilegemm.matmul(a, b, backend="opencl", device=bad)
    with pytest.raises(ValueError, match="backend 'cpu' has no device choice; device= works"):
        tilegemm.matmul(a, b, backend="cpu", device=0)


class _FakePlatform:
    name = "Portable Computing Language"
    version = "OpenCL 3.0 PoCL 3.0-rc2  Linux, Release, RELOC, LLVM 14.0.6, SLEEF, DISTRO"


class _FakeDevice:
    """Just what device choice reads: a CPU device of a PoCL platform."""

    def __init__(self, ptr: int, name: str) -> None:
        import pyopencl as cl

        self.int_ptr, self.name, self.type = ptr, name, cl.device_type.CPU
        self.platform = _FakePlatform()
        self.driver_version = "3.0-rc2"


def test_a_device_that_cannot_compile_is_skipped_and_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PoCL 3.0 (LLVM 14) lists a Zen 5 CPU but cannot build for it: the default device is
    the next one that can; naming the broken one with device= is a clear error before any
    launch; with none that can, the backend says why instead of failing in a build."""
    from tilegemm.backends import opencl
    from tilegemm.errors import UnavailableError

    broken, working = _FakeDevice(101, "pthread-AMD EPYC"), _FakeDevice(102, "pthread-ok")
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    monkeypatch.setattr(opencl, "all_devices", lambda: (broken, working))
    monkeypatch.setitem(opencl._BUILD_PROBLEMS, 101, "PoCL 3.0-rc2 (LLVM 14.0.6) cannot "
                        "compile for it: its LLVM does not know this CPU model")
    monkeypatch.setitem(opencl._BUILD_PROBLEMS, 102, "")
    choose = opencl.default_device_index.__wrapped__
    assert choose() == 1
    monkeypatch.setattr(opencl, "default_device_index", lambda: 1)  # not the cached one
    be = opencl.OpenCLBackend()
    with pytest.raises(UnavailableError, match=r"\[0\] pthread-AMD EPYC: PoCL 3.0-rc2 "
                       r"\(LLVM 14.0.6\) cannot compile.*Devices: \[0\]"):
        be.target(0)
    monkeypatch.setattr(opencl, "all_devices", lambda: (broken,))
    with pytest.raises(UnavailableError, match="no OpenCL device here can compile"):
        choose()


def test_a_working_device_runs_when_the_default_cannot_compile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With PYOPENCL_CTX naming a device that cannot compile, every OpenCL call was refused,
    device=0 (one that works) included. Now a call naming a working device runs; one on the
    default device is refused with its reason; ``auto`` steered by device=0 runs OpenCL.
    Device 1 is a stand-in for the broken device, device 0 the real default one."""
    from tilegemm.backends import opencl
    from tilegemm.errors import UnavailableError

    real = opencl.all_devices()[opencl.default_device_index()]
    broken = _FakeDevice(104, "pthread-AMD EPYC")
    monkeypatch.setattr(opencl, "all_devices", lambda: (real, broken))
    monkeypatch.setattr(opencl, "default_device_index", lambda: 1)  # as PYOPENCL_CTX=1 does
    monkeypatch.setitem(opencl._BUILD_PROBLEMS, 104, "PoCL 3.0-rc2 (LLVM 14.0.6) cannot "
                        "compile for it: its LLVM does not know this CPU model")
    be = opencl.OpenCLBackend()  # fresh probes, in place of the process's backend
    monkeypatch.setattr(opencl, "BACKEND", be)
    status = be.status()
    assert status.usable and not status.accelerated
    assert status.default_problem.startswith("the default device [1] pthread-AMD EPYC: PoCL")
    assert status.reason.endswith("calls must name a device that can: device=0")

    a, b = random_operands((7, 5), (5, 3), "float32")
    assert_close(tilegemm.matmul(a, b, backend="opencl", device=0), a, b)
    assert tilegemm.plan(a, b, device=0).backend == "opencl"  # auto, steered by device=
    for call in (lambda: tilegemm.matmul(a, b, backend="opencl"),
                 lambda: tilegemm.matmul(a, b, backend="opencl", device=1)):
        with pytest.raises(UnavailableError, match=r"\[1\] pthread-AMD EPYC: PoCL 3.0-rc2 "
                           r"\(LLVM 14.0.6\) cannot compile"):
            call()
    assert tilegemm.plan(a, b).backend == "cpu"  # auto without device= does not pick it


def test_build_problem_reads_the_compiler_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reason names PoCL and its LLVM, and says what helps; a device that builds has
    none (the real default device included)."""
    import pyopencl as cl

    from tilegemm.backends import opencl

    assert opencl.build_problem(opencl.all_devices()[opencl.default_device_index()]) == ""

    class FakeProgram:
        def __init__(self, context: object, source: str) -> None:
            pass

        def build(self, options: object = (), devices: object = None) -> None:
            raise cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n"
                                  "error: unknown target CPU 'generic'\n")

    monkeypatch.setattr(cl, "Program", FakeProgram)
    monkeypatch.setattr(cl, "Context", lambda devices: None)
    monkeypatch.delitem(opencl._BUILD_PROBLEMS, 103, raising=False)
    reason = opencl.build_problem(_FakeDevice(103, "pthread-AMD EPYC"))
    opencl._BUILD_PROBLEMS.pop(103)
    assert reason == ("PoCL 3.0-rc2 (LLVM 14.0.6) cannot compile for it: its LLVM does not "
                      "know this CPU model (a PoCL built with a newer LLVM does, e.g. "
                      "Debian/Ubuntu's pocl-opencl-icd) [error: unknown target CPU 'generic']")


def test_the_device_probe_is_built_from_its_kept_binary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process built the probe program before choosing a device, 50-60 ms on PoCL even
    when PoCL had it in its cache. Its binary is now kept in the compile cache: built from
    source once, then from the binary; a binary PoCL refuses warns, is built from source
    and kept again."""
    import base64
    import json

    import pyopencl as cl

    from tilegemm import compile_cache
    from tilegemm.backends import opencl

    device = opencl.all_devices()[opencl.default_device_index()]
    if not opencl.is_pocl(device):
        pytest.skip("the binary is kept on PoCL only")
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    built: list[str] = []
    real = cl.Program

    def spy(*args: object) -> object:
        built.append("binary" if len(args) == 3 else "source")
        return real(*args)

    monkeypatch.setattr(cl, "Program", spy)
    key = int(device.int_ptr)

    def probe() -> str:
        monkeypatch.delitem(opencl._BUILD_PROBLEMS, key, raising=False)
        return opencl.build_problem(device)

    assert probe() == "" and built == ["source"]
    [path] = (tmp_path / compile_cache.OPENCL_SUBDIR).glob("probe-*.json")
    kept = json.loads(path.read_text())
    assert base64.b64decode(kept["texts"]["binary"])  # what PoCL gave back
    assert probe() == "" and built == ["source", "binary"]
    [entry] = [e for e in compile_cache.entries() if e.describe.get("backend") == "opencl"]
    assert entry.describe["kernel"] == "probe" and entry.current
    # a binary PoCL refuses (its checksum intact, as from another PoCL build)
    texts = {"binary": base64.b64encode(b"not a PoCL binary").decode()}
    path.write_text(json.dumps({**kept, "texts": texts,
                                "sha256": compile_cache._texts_digest(texts)}))
    with pytest.warns(compile_cache.CompileCacheWarning, match="could not be loaded"):
        assert probe() == ""
    assert built == ["source", "binary", "binary", "source"]
    assert json.loads(path.read_text())["texts"] == kept["texts"]


def test_work_group_limit_is_checked() -> None:
    from tilegemm.backends import opencl

    limit = opencl.all_devices()[opencl.default_device_index()].max_work_group_size
    a, b = random_operands((7, 5), (5, 3), "float32")
    params = {"BM": 128, "BN": 128, "TM": 1, "TN": 1}  # 16384 work-items
    assert limit < 128 * 128
    out = np.full((7, 3), 42.0, np.float32)
    with pytest.raises(ValueError, match="max_work_group_size"):
        tilegemm.matmul(a, b, out=out, backend="opencl", kernel="register2d", **params)
    assert (out == 42.0).all()


class _Limited:
    """A real device with some limits (or extensions) replaced, to test the checks."""

    def __init__(self, device, **override):
        self._device, self._override = device, override

    def __getattr__(self, name):
        return self._override.get(name, getattr(self._device, name))


def test_local_memory_and_fp64_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm.backends import opencl

    real = opencl.all_devices()
    index = opencl.default_device_index()
    small = list(real)
    small[index] = _Limited(real[index], local_mem_size=4096, double_fp_config=0,
                            extensions="cl_khr_byte_addressable_store")
    monkeypatch.setattr(opencl, "all_devices", lambda: tuple(small))
    a, b = random_operands((7, 5), (5, 3), "float32")
    out = np.full((7, 3), 42.0, np.float32)
    with pytest.raises(ValueError, match="local_mem_size=4096"):
        tilegemm.matmul(a, b, out=out, backend="opencl", kernel="shared", TILE=32)
    assert (out == 42.0).all()
    a64, b64 = random_operands((7, 5), (5, 3), "float64")
    with pytest.raises(TypeError, match="lacks cl_khr_fp64"):
        tilegemm.matmul(a64, b64, backend="opencl", kernel="naive")


def test_arrays_from_another_context(queue) -> None:
    cl, cla = _cl()
    other = cl.CommandQueue(cl.Context([queue.device]))
    a, b = random_operands((7, 5), (5, 3), "float32")
    da, db = cla.to_device(queue, a), cla.to_device(other, b)
    with pytest.raises(ValueError, match="different OpenCL contexts"):
        tilegemm.matmul(da, db, backend="opencl")
    out = cla.empty(other, (7, 3), np.float32)
    with pytest.raises(ValueError, match="different OpenCL contexts"):
        tilegemm.matmul(da, cla.to_device(queue, b), out=out, backend="opencl")


def test_a_device_out_of_another_dtype_or_kind_is_a_type_error(queue) -> None:
    """An int32 device out for a float32 result, or a device out for host operands, raised
    a ValueError; a host out of the wrong dtype is NumPy's TypeError, and dtypes and array
    kinds are TypeErrors in the documented rules. Nothing is written."""
    _, cla = _cl()
    a, b = random_operands((7, 5), (5, 3), "float32")
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    wrong = cla.to_device(queue, np.full((7, 3), -1, np.int32))
    with pytest.raises(TypeError, match="out: has dtype int32"):
        tilegemm.matmul(da, db, out=wrong, backend="opencl")
    assert (wrong.get() == -1).all()
    device = cla.to_device(queue, np.full((7, 3), -1, np.float32))
    with pytest.raises(TypeError, match="cannot receive a result computed on host data"):
        tilegemm.matmul(a, b, out=device, backend="opencl")
    assert (device.get() == -1).all()


def test_build_failure_carries_the_compiler_log() -> None:
    be = get_backend("opencl")
    program = SPECS[0].program(SPECS[0].defaults(), np.dtype("float32"))
    with pytest.raises(RuntimeError, match="(?s)OpenCL build of naive failed.*error"):
        be.kernel(be.own_device(), program, source="kernel void gemm() { this is not C }")


def test_prepare_times_with_profiling_events() -> None:
    from tilegemm.problem import describe, make_problem

    be = get_backend("opencl")
    spec = SPECS[-1]
    a, b = random_operands((2, 33, 17), (2, 17, 40), "float32")
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    prepared = be.prepare(spec, be.resolve(spec, {}), prob, a, b)
    times = prepared.elapsed(3)
    assert len(times) == 3 and all(t > 0 for t in times)
    prepared.launch()
    assert_close(prepared.fetch(), a, b, what="prepared")


def test_info_lists_opencl_devices(capsys: pytest.CaptureFixture[str]) -> None:
    from tilegemm.backends import opencl
    from tilegemm.cli import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "OpenCL devices" in out
    assert opencl.all_devices()[0].name.strip()[:10] in out


@pytest.mark.opencl
def test_benchmark_uses_the_backends_device_defaults():
    """The harness resolves parameters through the backend, as matmul does, so a rung's
    measured per-device defaults are what gets benchmarked."""
    from tilegemm.bench.timing import Policy, measure_kernel
    from tilegemm.problem import describe, host_operand_3d, make_problem

    backend = get_backend("opencl")
    spec = next(s for s in tilegemm.kernels("opencl") if s.device_defaults)
    expected = backend.resolve(spec, {})
    a, b = random_operands((33, 17), (17, 20), np.float32)
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    meas = measure_kernel(backend, spec, {}, prob, host_operand_3d(a, prob, "a"),
                          host_operand_3d(b, prob, "b"), Policy(budget_s=0.01, min_reps=1,
                                                                max_reps=1, warmup=0))
    assert meas.params == expected


@pytest.mark.opencl
def test_benchmark_plan_uses_the_backends_device_defaults():
    """The sweep plans each rung with the parameters matmul would use on this device."""
    from tilegemm.bench.sweeps import PARAMS_DEFAULTS, Settings, plan

    backend = get_backend("opencl")
    cases = plan(["opencl"], Settings.quick(reports=("ladder",), ladder_sizes=(64,)))
    # each rung's defaults row (the ladder also has a row for what kernel='auto' runs)
    planned = {c.spec.name: dict(c.params) for c in cases
               if c.spec is not None and c.source == PARAMS_DEFAULTS}
    for spec in tilegemm.kernels("opencl"):
        assert planned[spec.name] == backend.resolve(spec, {}), spec.name


def test_mixed_dtype_device_operands_are_converted_on_the_device(queue) -> None:
    """float32 @ float64 pyopencl arrays were refused ('cast it on the device first');
    NumPy's result type, float64, is computed, converting the float32 operand once."""
    _, cla = _cl()
    a, b = random_operands((5, 7), (7, 3), "float32")
    b64 = b.astype(np.float64)
    got = tilegemm.matmul(cla.to_device(queue, a), cla.to_device(queue, b64), backend="opencl")
    assert isinstance(got, cla.Array) and got.dtype == np.float64
    assert_close(got.get(), a.astype(np.float64), b64)
    with pytest.raises(TypeError, match="cast back on the host only"):
        tilegemm.matmul(cla.to_device(queue, a.astype(np.float16)),
                        cla.to_device(queue, b.astype(np.float16)), backend="opencl")


def test_prepare_poisons_its_output_so_the_verified_launch_proves_every_write() -> None:
    """Benchmarks and the tuner verify the first launch of a prepared product; that proves
    something only if the output held NaN before it (as the CUDA and CPU backends do)."""
    from tilegemm.bench.timing import poisoned, prepare_verified
    from tilegemm.problem import problem_for

    be = get_backend("opencl")
    spec = registry.get("naive", "opencl")
    prob = problem_for(5, 3, 4, "float32")
    a, b = random_operands((1, 5, 4), (1, 4, 3), "float32")
    with poisoned():
        prepared = be.prepare(spec, be.resolve(spec, {}), prob, a, b)
    assert np.isnan(prepared.fetch()).all()
    prepared = prepare_verified(be, spec, be.resolve(spec, {}), prob, a, b)
    assert_close(prepared.fetch(), a, b)


def _broken(monkeypatch, filename: str, line: int) -> None:
    """The rung file ``filename`` as shipped, with the ``;`` ending line ``line`` removed."""
    from tilegemm.backends import opencl_program

    real = opencl_program.read_source

    def read(name: str) -> str:
        text = real(name)
        if name != filename:
            return text
        lines = text.split("\n")
        lines[line - 1] = lines[line - 1].rstrip().rstrip(";") + " oops"
        return "\n".join(lines)

    monkeypatch.setattr(opencl_program, "read_source", read)
    # and the kernels already built and checked in this process forgotten for the test
    monkeypatch.setattr(get_backend("opencl")._cache, "checked", {})


def test_a_build_error_names_the_rung_file_and_its_line(monkeypatch):
    from tilegemm.backends import opencl_program

    text = opencl_program.read_source("k03_shared.cl").split("\n")
    line = next(i for i, t in enumerate(text, 1) if t.rstrip().endswith(";") and "=" in t)
    _broken(monkeypatch, "k03_shared.cl", line)
    a, b = random_operands((20, 20), (20, 20), "float32")
    with pytest.raises(RuntimeError, match=rf"k03_shared\.cl:{line}\b"):
        tilegemm.matmul(a, b, backend="opencl", kernel="shared", TILE=8)


def test_run_reports_a_failed_build_as_an_internal_error(monkeypatch, capsys):
    from tilegemm.cli import main

    _broken(monkeypatch, "k02_coalesced.cl", 20)
    code = main(["run", "--backend", "opencl", "--kernel", "coalesced", "--m", "20", "--n",
                 "20", "--k", "20", "--repeat", "0"])
    assert code == 3, capsys.readouterr()


def test_mixed_dtype_device_views_are_gathered_before_conversion(queue) -> None:
    """A transposed float32 view with a float64 operand came back transposed (PyOpenCL's
    astype of a view keeps memory order under row-major strides); a strided int32 view
    raised PyOpenCL's own RuntimeError after out had been written. Both are gathered in
    their own type, then converted."""
    _, cla = _cl()
    b = random_operands((2, 3), (1,), "float32")[0]
    a64 = random_operands((2, 3), (1,), "float64")[0]
    got = tilegemm.matmul(cla.to_device(queue, b).T, cla.to_device(queue, a64),
                          backend="opencl")
    assert_close(got.get(), b.T.astype(np.float64), a64, what="float32 .T @ float64")
    ints = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
    w, c0 = random_operands((3, 3), (3, 3), "float64")
    out = cla.to_device(queue, np.full((3, 3), 7.0))
    got = tilegemm.gemm(cla.to_device(queue, ints)[:, 1:], cla.to_device(queue, w),
                        cla.to_device(queue, c0), trans_a=True, beta=1.0, out=out,
                        backend="opencl")
    assert got is out
    assert_close(out.get(), ints[:, 1:].astype(np.float64), w, trans_a=True, beta=1.0, c=c0,
                 what="int32 strided view, trans_a")
    # a broadcast batch of a converted operand is converted once and shared
    x = random_operands((1, 4, 5), (1,), "float32")[0]
    y = random_operands((3, 5, 2), (1,), "float64")[0]
    got = tilegemm.matmul(cla.to_device(queue, x), cla.to_device(queue, y), backend="opencl")
    assert_close(got.get(), x.astype(np.float64), y, what="broadcast float32 @ float64")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_a_gathered_device_operand_shared_by_a_batch(spec: KernelSpec, queue) -> None:
    """A 2-D device operand that must be gathered (a .T view, trans_b) beside a batched one
    was given a batch stride: every product after the first read past its end."""
    _, cla = _cl()
    a, bt = random_operands((3, 4, 5), (6, 5), "float32")
    got = _mm(cla.to_device(queue, a), cla.to_device(queue, bt).T, spec)
    assert_close(got.get(), a, bt.T, what=".T shared by a batch of 3")
    got = tilegemm.gemm(cla.to_device(queue, bt)[None], cla.to_device(queue, a), trans_a=False,
                        trans_b=True, backend="opencl", kernel=spec.name)
    assert_close(got.get(), bt[None], np.swapaxes(a, -1, -2), what="batch 1 against 3")


@pytest.mark.parametrize(("small", "big"), [("float16", "float32"), ("float16", "float64"),
                                            ("bool", "float32")])
def test_device_float16_and_bool_operands_are_converted(small: str, big: str, queue) -> None:
    """PyOpenCL's astype maps neither half nor bool: a float16 or bool device operand beside
    a float32 one raised PyOpenCL's own ValueError ('unable to map dtype')."""
    _, cla = _cl()
    rng = np.random.default_rng(7)
    x = (rng.random((5, 7)) > 0.5) if small == "bool" else rng.random((5, 7)).astype(small)
    y = random_operands((7, 4), (1,), big)[0]
    got = tilegemm.matmul(cla.to_device(queue, x).T.T, cla.to_device(queue, y),
                          backend="opencl")
    assert got.dtype == np.matmul(x, y).dtype
    assert_close(got.get(), x.astype(np.float64), y, what=f"{small} @ {big}")
    got = tilegemm.matmul(cla.to_device(queue, y).T, cla.to_device(queue, x).T,
                          backend="opencl")
    assert_close(got.get(), y.T, x.T.astype(np.float64), what=f"{big}.T @ {small}.T")


def test_out_in_a_sub_buffer_of_an_operand_is_detected(queue) -> None:
    """A sub-buffer has a handle of its own: an out carved from A's buffer was taken as
    separate memory and written while A was read."""
    cl, cla = _cl()
    n = 16
    x = random_operands((2 * n * n,), (1,), "float32")[0]
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=x)
    a = cla.Array(queue, (n, n), np.float32, data=buf)
    out = cla.Array(queue, (n, n), np.float32, data=buf.get_sub_region(0, n * n * 4))
    tilegemm.matmul(a, a, out=out, backend="opencl", kernel="naive")
    square = x[: n * n].reshape(n, n)
    assert_close(out.get(), square, square, what="out in a sub-buffer of a")


def test_device_c_overlapping_out_is_read_before_it_is_overwritten(queue) -> None:
    """c sharing out's buffer without being out itself (out.T, shifted rows) was copied
    into out element by element, reading what it had already written."""
    _, cla = _cl()
    x = random_operands((16, 16), (1,), "float32")[0]
    dx = cla.to_device(queue, x)
    base = random_operands((40, 16), (1,), "float32")[0]
    big = cla.to_device(queue, base)
    tilegemm.gemm(dx, dx, big[0:16], beta=1.0, out=big[8:24], backend="opencl")
    assert_close(big[8:24].get(), x, x, beta=1.0, c=base[0:16], what="c rows 0:16 -> 8:24")
    o = cla.to_device(queue, base[:16].copy())
    tilegemm.gemm(dx, dx, o.T, beta=1.0, out=o, backend="opencl")
    assert_close(o.get(), x, x, beta=1.0, c=base[:16].T, what="c = out.T")


def test_work_on_other_queues_comes_first_and_the_result_carries_its_event(queue) -> None:
    """An operand filled on another queue of the context was read before the fill ran
    (tilegemm launched on A's queue and ignored the arrays' events); out on another queue
    could be read before the product was written."""
    cl, cla = _cl()
    other = cl.CommandQueue(queue.context)
    a = random_operands((6, 5), (1,), "float32")[0]
    da = cla.to_device(queue, a)
    seen = []
    real = cl.enqueue_barrier

    def barrier(q, wait_for=None):  # noqa: ANN001, ANN202
        seen.append(list(wait_for or ()))
        return real(q, wait_for=wait_for)

    import pytest as _pytest

    # the other queue held back until the call has been made, so db's fill is pending then
    gate = cl.UserEvent(queue.context)
    cl.enqueue_barrier(other, wait_for=[gate])
    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(cl, "enqueue_barrier", barrier)
        db = cla.zeros(other, (5, 4), np.float32)
        db.fill(2.0)  # an event on db, enqueued on the other queue
        got = tilegemm.matmul(da, db, backend="opencl")
    gate.set_status(cl.command_execution_status.COMPLETE)
    assert seen and len(seen[0]) >= 2  # db's events and a marker of the other queue
    assert got.events, "the result carries the call's event for PyOpenCL to wait on"
    assert_close(got.get(), a, np.full((5, 4), 2.0, np.float32), what="B filled on another queue")
    out = cla.empty(other, (6, 4), np.float32)
    tilegemm.matmul(da, db, out=out, backend="opencl")
    assert out.events
    assert_close(out.get(), a, np.full((5, 4), 2.0, np.float32), what="out on another queue")


def _out_of_order_queue(queue):  # noqa: ANN001, ANN202
    """An out-of-order queue on ``queue``'s context, or the test skipped."""
    cl, _ = _cl()
    try:
        return cl.CommandQueue(
            queue.context, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    except cl.Error:
        pytest.skip("no out-of-order queues on this device")


def test_an_out_of_order_queue_is_not_used_for_the_calls_own_steps(queue) -> None:
    cl, cla = _cl()
    ooo = _out_of_order_queue(queue)
    be = get_backend("opencl")
    x = cla.to_device(ooo, np.ones((3, 3), np.float32))
    place = be._place([x], None)
    assert place.queue is not ooo and not (
        place.queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)


def test_finishing_an_out_of_order_callers_queue_covers_the_call(queue) -> None:
    """Operands on an out-of-order queue: the call runs on an in-order queue of ours, and
    the result was left there, so ``finish()`` on the caller's queue returned with the
    product still running (seen at 300x300, 5 runs of 5). Now a marker on the caller's
    queue waits for the call, and a new result keeps the caller's queue."""
    cl, cla = _cl()
    ooo = _out_of_order_queue(queue)
    a, b = random_operands((9, 7), (7, 5), "float32")
    da, db = cla.to_device(ooo, a), cla.to_device(ooo, b)
    gate = cl.UserEvent(queue.context)  # holds the call back until the checks below
    da.add_event(gate)
    try:
        got = tilegemm.matmul(da, db, backend="opencl")
        out = cla.empty(queue, (9, 5), np.float32)
        assert tilegemm.matmul(da, db, out=out, backend="opencl") is out  # keeps its queue
        on_callers = [e for e in got.events
                      if e.get_info(cl.event_info.COMMAND_QUEUE) == ooo]
        # (asserted as plain values: a failing assert's report would print the array, whose
        # repr reads it back, waiting for the gated call)
        keeps_queue = bool(got.queue == ooo)
        waiting = [e.command_execution_status != cl.command_execution_status.COMPLETE
                   for e in on_callers]  # it waits for the gated call
        assert keeps_queue
        assert waiting == [True]
    finally:  # (a failure above must not leave the queues waiting for ever)
        gate.set_status(cl.command_execution_status.COMPLETE)
    ooo.finish()
    assert all(e.command_execution_status == cl.command_execution_status.COMPLETE
               for e in got.events)
    assert_close(got.get(), a, b, what="on an out-of-order queue")
    assert_close(out.get(), a, b, what="out, operands on an out-of-order queue")


def test_shared_virtual_memory_out(queue) -> None:
    """An SVM-allocated out failed in the overlap check (AttributeError: no int_ptr)."""
    cl, cla = _cl()
    import pyopencl.tools as clt

    try:
        alloc = clt.SVMAllocator(queue.context, queue=queue)
        a, b = random_operands((7, 5), (5, 3), "float32")
        da = cla.to_device(queue, a, allocator=alloc)
        out = cla.empty(queue, (7, 3), np.float32, allocator=alloc)
    except (cl.Error, AttributeError, NotImplementedError) as exc:
        pytest.skip(f"no shared virtual memory here ({exc})")
    got = tilegemm.matmul(da, cla.to_device(queue, b, allocator=alloc), out=out,
                          backend="opencl")
    assert got is out
    assert_close(out.get(), a, b, what="SVM out")


def test_plan_refuses_what_a_device_call_refuses(queue) -> None:
    """plan() accepted arrays of two contexts, float16 device arrays and a device c of
    another dtype, which matmul/gemm refuse."""
    cl, cla = _cl()
    other = cl.CommandQueue(cl.Context([queue.device]))
    a = cla.to_device(queue, np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="different OpenCL contexts"):
        tilegemm.plan(a, cla.to_device(other, np.ones((3, 2), np.float32)))
    h = np.ones((4, 3), np.float16)
    with pytest.raises(TypeError, match="cast back on the host only"):
        tilegemm.plan(cla.to_device(queue, h), cla.to_device(queue, h.T.copy()))
    with pytest.raises(TypeError, match="device c has dtype float64"):
        tilegemm.plan(a, cla.to_device(queue, np.ones((3, 2), np.float32)),
                      cla.to_device(queue, np.ones((4, 2), np.float64)))


def test_a_constraint_error_names_the_given_values_first() -> None:
    """BK=4 VW=8 was reported as "'TN % VW == 0' fails", TN=4 being a default the caller
    never set."""
    a = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError) as err:
        tilegemm.matmul(a, a, backend="opencl", kernel="vectorized", BK=4, VW=8)
    text = str(err.value)
    assert text.index("'BK % VW == 0' fails for BK=4, VW=8") < text.index("TN=4 (default)")


def test_a_small_host_product_waits_on_the_queue_once(monkeypatch) -> None:
    """Per call on NumPy arrays: the operands go to the device as buffers created from
    host memory (no blocking write through the queue each), the kernels' scalar types are
    given to PyOpenCL once, and the compiled work-group limit is read once; the only wait
    is the read of the result. On PoCL this took a small product from about 0.6 to 0.3 ms
    (benchmarks/small_calls.py); counted here, never timed."""
    import pyopencl as cl
    import pyopencl.array as cla

    a, b = random_operands((7, 13), (13, 5), "float32")
    assert_close(tilegemm.matmul(a, b, backend="opencl"), a, b)  # built, typed, limit read
    counts = {"blocking copies": 0, "typed": 0, "limit queries": 0}
    real_copy = cl.enqueue_copy

    def copy(*args, **kwargs):
        counts["blocking copies"] += bool(kwargs.get("is_blocking", True))
        return real_copy(*args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("a host operand went through a blocking pyopencl write")

    real_typed, real_query = cl.Kernel.set_scalar_arg_dtypes, cl.Kernel.get_work_group_info

    def typed(self, *args):
        counts["typed"] += 1
        return real_typed(self, *args)

    def query(self, *args):  # (PyOpenCL's own fill, which poisons the result, queries too)
        counts["limit queries"] += self.function_name == "gemm"
        return real_query(self, *args)

    monkeypatch.setattr(cl, "enqueue_copy", copy)
    monkeypatch.setattr(cla, "to_device", refuse)
    monkeypatch.setattr(cl.Kernel, "set_scalar_arg_dtypes", typed)
    monkeypatch.setattr(cl.Kernel, "get_work_group_info", query)
    for _ in range(3):
        a, b = random_operands((7, 13), (13, 5), "float32")
        assert_close(tilegemm.matmul(a, b, backend="opencl"), a, b)
    assert counts == {"blocking copies": 3, "typed": 0, "limit queries": 0}


THREADED = """
import sys, threading
import numpy as np
import pyopencl.array as cla
import tilegemm
from tilegemm.backends import get_backend
sys.setswitchinterval(1e-6)  # switch threads as often as Python can
wrong = []
DEVICE = sys.argv[1] == "device"  # pyopencl arrays, whose decisions are remembered
queue = get_backend("opencl").own_device().queue

def work(seed):
    rng = np.random.default_rng(seed)
    for i in range(250):
        m, k, n = (int(x) for x in rng.integers(1, 12 if DEVICE else 40, 3))
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        if DEVICE:
            c = tilegemm.matmul(cla.to_device(queue, a), cla.to_device(queue, b)).get()
        else:
            c = tilegemm.matmul(a, b, backend="opencl")
        if not np.allclose(c, a.astype(np.float64) @ b, atol=1e-4):
            wrong.append((seed, i, m, k, n))

tilegemm.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32), backend="opencl")
threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("wrong", len(wrong), wrong[:3])
"""


@pytest.mark.parametrize("arrays", ["host", "device"])
def test_calls_from_several_threads_at_once(tmp_path, arrays: str) -> None:
    """Six threads multiply different shapes on one device at once, switching as often as
    Python can: each gets its own product. A kernel object holds one set of arguments, and
    without a lock around setting them and enqueueing the kernel the process crashed in
    PoCL (in a new process here, so a crash fails this test instead of the test run). On
    pyopencl arrays the shapes repeat, so most calls run a remembered decision."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TILEGEMM_POISON": "1"}
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", THREADED, arrays],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["wrong", "0"], done.stdout


@pytest.mark.parametrize("case", ["first launch of a kernel", "host c"])
def test_a_device_call_returns_before_the_callers_work_has_run(queue, case,
                                                               monkeypatch) -> None:
    """An operand waits on the caller's UserEvent, set only after the call returns: the
    call must enqueue and return (as PyOpenCL's own operations do), not wait. It hung:
    the first launch of each kernel waited for its event (to record PoCL's cache), and a
    host c went in by a blocking write behind the caller's work."""
    import threading

    cl, cla = _cl()
    a, b = random_operands((9, 7), (7, 5), "float32")
    c = random_operands((9, 5), (1, 1), "float32")[0]
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    gate = cl.UserEvent(queue.context)
    da.add_event(gate)
    if case == "first launch of a kernel":
        class EveryKernel(set):  # every launch is taken for its kernel's first
            def __contains__(self, item):
                return True

        monkeypatch.setattr(get_backend("opencl")._cache, "unrecorded", EveryKernel())
        call = lambda: tilegemm.matmul(da, db)  # noqa: E731
        expected = a.astype(np.float64) @ b
    else:
        tilegemm.matmul(cla.to_device(queue, a), db).get()  # every kernel launched before
        call = lambda: tilegemm.gemm(da, db, c, beta=0.5)  # noqa: E731
        expected = a.astype(np.float64) @ b + 0.5 * c
    results = []
    worker = threading.Thread(target=lambda: results.append(call()), daemon=True)
    worker.start()
    worker.join(timeout=20)
    returned = not worker.is_alive()
    gate.set_status(cl.command_execution_status.COMPLETE)  # (frees a hung call too)
    worker.join(timeout=60)
    assert returned, "the call waited for the caller's event"
    np.testing.assert_allclose(results[0].get(), expected, rtol=1e-5, atol=1e-5)


def test_byte_offsets_inside_an_element_are_refused(queue) -> None:
    """PyOpenCL allows a float32 array at byte offset 2; the kernels address elements,
    so the offset was rounded down: a wrong product, and an out written 2 bytes before
    its start. Refused before anything is enqueued, the buffer left as it was."""
    cl, cla = _cl()
    a, b = random_operands((4, 4), (4, 4), "float32")
    da = cla.to_device(queue, a)
    raw = np.full(80, 0xAB, np.uint8)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=raw)
    odd = cla.Array(queue, (4, 4), np.float32, data=buf, offset=2)
    with pytest.raises(ValueError, match=r"a: a pyopencl array at byte offset 2, which is "
                       "not a multiple of its 4-byte elements"):
        tilegemm.matmul(odd, da)
    with pytest.raises(ValueError, match="out: .*byte offset 2"):
        tilegemm.matmul(da, da, out=odd)
    with pytest.raises(ValueError, match="c: .*byte offset 2"):
        tilegemm.gemm(da, da, odd, beta=1.0)
    back = np.empty_like(raw)
    cl.enqueue_copy(queue, back, buf)
    assert (back == 0xAB).all()
    aligned = cla.Array(queue, (4, 4), np.float32, data=buf, offset=4)  # a whole element
    aligned.set(b)
    assert_close(tilegemm.matmul(da, aligned).get(), a, b)


def test_pyopencl_objects_by_type_not_module(queue) -> None:
    """A raw pyopencl.Buffer failed with AttributeError ('Buffer' has no 'shape'); a
    subclass of pyopencl.array.Array defined outside PyOpenCL was taken for a host
    array (and refused as an object array)."""
    cl, cla = _cl()
    a, b = random_operands((7, 5), (5, 3), "float32")
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=a)
    with pytest.raises(TypeError, match=r"a: a pyopencl\._cl\.Buffer is not an array; "
                       r"pass a pyopencl\.array\.Array"):
        tilegemm.matmul(buf, b, backend="opencl")

    class Mine(cla.Array):
        pass

    mine = Mine(queue, (5, 3), np.float32)
    mine.set(b)
    got = tilegemm.matmul(cla.to_device(queue, a), mine)
    assert isinstance(got, cla.Array)
    assert_close(got.get(), a, b)
    assert_close(tilegemm.matmul(a, mine).get(), a, b)  # the device operand decides


def test_callers_contexts_are_not_kept_for_the_whole_process(queue, monkeypatch) -> None:
    """Each cached kernel holds its context: a context made per task stayed alive with
    its programs and queues until the process exited (about 2 MiB each on PoCL). Only
    the most recently used callers' contexts keep their kernels; the backend's own
    contexts always do, and a context whose kernels were dropped still works."""
    import importlib

    cl, cla = _cl()
    module = importlib.import_module("tilegemm.backends.opencl")
    backend = get_backend("opencl")
    monkeypatch.setattr(module, "CONTEXTS_KEPT", 2)
    a, b = random_operands((6, 5), (5, 4), "float32")
    assert_close(tilegemm.matmul(a, b, backend="opencl"), a, b)  # the own context
    own = {o.context.int_ptr for o in backend._own.values()}
    contexts = []
    for _ in range(5):
        ctx = cl.Context([queue.device])
        q = cl.CommandQueue(ctx)
        contexts.append(ctx)
        assert_close(tilegemm.matmul(cla.to_device(q, a), cla.to_device(q, b)).get(), a, b)
    cached = {key[0] for key in backend._cache.kernels}
    assert cached - own == {c.int_ptr for c in contexts[-2:]}
    assert own <= cached
    # the kernels checked against each device go with their contexts
    assert {key[0] for key in backend._cache.checked} - own == {c.int_ptr
                                                                 for c in contexts[-2:]}
    assert not backend._used  # (it held every caller's queue, for synchronize())
    q = cl.CommandQueue(contexts[0])  # dropped: built again
    assert_close(tilegemm.matmul(cla.to_device(q, a), cla.to_device(q, b)).get(), a, b)
    assert contexts[0].int_ptr in {key[0] for key in backend._cache.kernels}


FORKED_CHILD = r"""
import json, multiprocessing as mp, numpy as np, tilegemm

a = np.ones((48, 48), np.float32)
tilegemm.matmul(a, a, backend="opencl")  # the parent starts OpenCL (and remembers the case)
tilegemm.matmul(a, a, backend="opencl")


def child(queue):
    got = {}
    for name, call in (("remembered", lambda: tilegemm.matmul(a, a, backend="opencl")),
                       ("new", lambda: tilegemm.matmul(a[:5], a, backend="opencl")),
                       ("auto", lambda: tilegemm.matmul(a[:7], a))):
        try:
            got[name] = float(call()[0, 0])
        except Exception as exc:
            got[name] = f"{type(exc).__name__}: {exc}"
    queue.put(got)


ctx = mp.get_context("fork")
queue = ctx.Queue()
p = ctx.Process(target=child, args=(queue,))
p.start()
p.join(60)
hung = p.exitcode is None
if hung:
    p.kill()
print(json.dumps({"hung": hung, "got": None if hung else queue.get(timeout=10)}))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "register_at_fork"), reason="no fork")
def test_a_child_forked_after_opencl_started_is_refused_not_hung() -> None:
    """PoCL started in the parent does not work in a forked child: the child's first OpenCL
    call, remembered or not, waited for ever. It is refused with the way out (spawn), and
    the CPU still serves the child's backend="auto" calls."""
    from conftest import script_json

    got = script_json(FORKED_CHILD, timeout=180)
    assert not got["hung"], "the forked child's OpenCL call hung"
    for name in ("remembered", "new"):
        message = " ".join(str(got["got"][name]).split())
        assert message.startswith("UnavailableError") and "'spawn'" in message, message
    assert got["got"]["auto"] == 48.0


def test_the_fork_watch_is_registered_once_and_only_where_opencl_started(monkeypatch):
    """Registered before the platforms were listed, the fork handler was added again on
    every failed listing (a machine with PyOpenCL and no OpenCL platform), and a child
    then said OpenCL had been started in its parent when it never was."""
    from tilegemm.backends import opencl

    class NoPlatform:
        @staticmethod
        def get_platforms():
            raise RuntimeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    class Empty:
        @staticmethod
        def get_platforms():
            return []

    registered = []
    monkeypatch.setattr(opencl.os, "register_at_fork",
                        lambda **kwargs: registered.append(kwargs), raising=False)
    monkeypatch.setattr(opencl, "_FORK_WATCHED", False)
    try:
        monkeypatch.setattr(opencl, "_cl", lambda: NoPlatform)
        for _ in range(3):
            opencl.all_devices.cache_clear()
            with pytest.raises(RuntimeError, match="PLATFORM_NOT_FOUND"):
                opencl.all_devices()
        assert registered == []
        monkeypatch.setattr(opencl, "_cl", lambda: Empty)
        for _ in range(3):
            opencl.all_devices.cache_clear()
            assert opencl.all_devices() == ()
        assert registered == [{"after_in_child": opencl._forked_after_use}]
    finally:
        opencl.all_devices.cache_clear()


def test_each_parameter_set_launches_its_own_kernel(monkeypatch) -> None:
    """The kernel checked against the device is kept per rung, dtype and parameters:
    TILE=16 after TILE=8 launches 16x16 work-groups, not the kernel checked first."""
    from tilegemm.backends.opencl import OpenCLBackend

    launched = []
    real = OpenCLBackend._launch

    def launch(kernel, program, *args):  # noqa: ANN001, ANN202
        launched.append(program.local)
        return real(kernel, program, *args)

    monkeypatch.setattr(OpenCLBackend, "_launch", staticmethod(launch))
    a, b = random_operands((20, 20), (20, 20), "float32")
    for tile in (8, 16, 8):
        assert_close(tilegemm.matmul(a, b, backend="opencl", kernel="shared", TILE=tile), a, b)
    assert launched == [(8, 8), (16, 16), (8, 8)]


@pytest.mark.opencl
def test_a_device_mismatch_names_the_device_the_arrays_are_on() -> None:
    """With two identical devices (two PoCL devices here; two identical GPUs alike) the
    refusal read "device=0 is Xeon, but the pyopencl arrays live on Xeon"."""
    import os
    import subprocess
    import sys

    code = """
import numpy as np, pyopencl as cl, pyopencl.array as cla, tilegemm
# a context holds one platform's devices (two PoCL installs side by side are two
# platforms, and a context over both crashed PoCL); tilegemm numbers the first platform's
# devices first
devs = cl.get_platforms()[0].get_devices()
if len(devs) < 2:
    print("one device"); raise SystemExit
q = cl.CommandQueue(cl.Context(devs), devs[1])
a = cla.to_device(q, np.ones((4, 4), np.float32))
try:
    tilegemm.matmul(a, a, backend="opencl", device=0)
except ValueError as e:
    print(e)
"""
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    env.pop("PYOPENCL_CTX", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.strip() == "one device":
        pytest.skip("PoCL gave one device")
    assert "arrays live on device 1 (" in done.stdout, done.stdout


def test_a_cpu_rung_named_for_pyopencl_arrays_says_to_copy_them(queue) -> None:
    """kernel='blocked' on pyopencl arrays advised "pass backend='cpu'", which then refused
    the arrays; the advice now fits the data: copy it to the host, or an OpenCL rung."""
    _, cla = _cl()
    a = cla.to_device(queue, np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"copy them to the host .* name a rung of 'opencl'"):
        tilegemm.matmul(a, a, kernel="blocked")
    with pytest.raises(ValueError, match="unknown kernel 'nosuch'"):
        tilegemm.matmul(a, a, kernel="nosuch")


@pytest.mark.parametrize(("a_shape", "b_shape"), [((9, 7), (7, 5)), ((2, 9, 7), (7, 5)),
                                                  ((7,), (7, 5))])
def test_a_device_out_is_written_in_place_without_another_array(queue, monkeypatch, a_shape,
                                                                b_shape) -> None:
    """A repeated ``out=`` call on pyopencl arrays writes ``out`` itself, in its own shape:
    no PyOpenCL Array is made (a reshape to (batch, M, N) was one, 20-30 µs, a fifth of a
    small call), and the result is right (NaN in out before)."""
    _, cla = _cl()
    monkeypatch.setenv("TILEGEMM_POISON", "0")  # the fill under poisoning makes one
    a, b = random_operands(a_shape, b_shape, "float32")
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    out = cla.to_device(queue, np.full(np.matmul(a, b).shape, np.nan, np.float32))
    tilegemm.matmul(da, db, out=out)  # decided and compiled
    out.fill(np.nan)
    made: list[int] = []
    real = cla.Array.__init__

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        made.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cla.Array, "__init__", counted)
    assert tilegemm.matmul(da, db, out=out) is out
    assert made == []
    monkeypatch.undo()
    assert_close(out.get(), a, b)
