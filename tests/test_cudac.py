"""The CUDA C rungs compile with NVRTC for sm_80 and sm_90 with no GPU, and say what
ptxas allocated; the cudac backend says why it cannot run here.

Compilations are kept per process (``compile_cubin`` caches), so every test below that
asks for the same (rung, parameters, dtype, arch) reuses one compilation. Correctness is
checked on the CPU by tests/test_cudac_host.py (the same sources built with g++ and
AddressSanitizer) and on hardware by tests/test_cuda_rungs.py, which runs every cudac rung
through the same cases as the Numba rungs when a GPU is present (``gpu`` marker).
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm.kernels.cudac import ARCHS, compile_cubin, cudac_resources
from tilegemm.kernels.cudac import _compile as nvrtc_compile
from tilegemm.registry import KernelSpec, get

SPECS = tilegemm.kernels("cudac")


def _declared_smem(spec: KernelSpec, dtype: str) -> int:
    assert spec.smem is not None
    return spec.smem(spec.defaults(), np.dtype(dtype).itemsize)


def test_the_source_kernels_are_registered_with_the_numba_rung_names() -> None:
    names = {s.name: s.rung for s in SPECS}
    assert names == {"naive": 1, "coalesced": 2, "shared": 3, "register1d": 4, "warptile": 8,
                     "pipelined": 9}
    numba = {s.name: s.rung for s in tilegemm.kernels("cuda")}
    for name, rung in names.items():
        assert numba.get(name) == rung, f"{name}: the Numba rung of that name is rung {rung}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_rung_compiles_to_a_cubin(spec: KernelSpec, arch: str) -> None:
    """float32 defaults: an ELF cubin holding the named entry point, exactly the shared
    memory the spec declares (the backend checks that against the device), and no spills
    on sm_90 (on sm_80 ptxas spills 8 bytes of warptile at its 128-register budget)."""
    cubin = compile_cubin(spec, None, "float32", arch)
    assert cubin.data[:4] == b"\x7fELF"
    assert cubin.kernel == f"tilegemm_{spec.name}"
    assert cubin.kernel.encode() in cubin.data
    assert f"Compiling entry function '{cubin.kernel}' for '{arch}'" in cubin.log
    r = cudac_resources(spec, None, "float32", arch)
    assert r.registers > 0 and r.cubin_bytes == len(cubin.data)
    if arch == "sm_90" or spec.name != "warptile":
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    assert r.spills <= 32, r
    assert r.smem == _declared_smem(spec, "float32")
    threads = spec.threads(spec.defaults())
    assert r.registers * threads <= 65_536, "the block must fit an SM's register file"
    if spec.rung <= 3:  # launch bounds ask for 1,024 resident threads: 64 registers
        assert r.registers <= 64, r


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_float64_compiles_for_sm90(spec: KernelSpec) -> None:
    r = cudac_resources(spec, None, "float64", "sm_90")
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    assert r.smem == _declared_smem(spec, "float64")
    assert r.registers * spec.threads(spec.defaults()) <= 65_536


@pytest.mark.parametrize("name", ["naive", "shared"])
def test_1024_thread_blocks_fit_the_register_file(name: str) -> None:
    """A 32×32 block launches only with <= 64 registers a thread: the launch bounds in the
    source make ptxas fit them."""
    spec = get(name, "cudac")
    params = {spec.params[0].name: 32}
    r = cudac_resources(spec, params, "float32", "sm_90")
    assert r.registers <= 64 and r.spills == 0, r


@pytest.mark.parametrize("name", ["warptile", "pipelined"])
def test_fast_rungs_use_vector_and_read_only_loads(name: str) -> None:
    """The yardstick kernels' hot path: 128-bit loads of A and B through the read-only
    path (const __restrict__), 128-bit shared loads, accumulators in registers."""
    ptx = compile_cubin(name, None, "float32", "sm_90").ptx
    assert "ld.global.nc.v4.f32" in ptx
    assert "ld.shared.v4.f32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert ".f64" not in ptx.replace(".f64.f32", "")  # no stray double-precision math


def test_integer_rungs_compile() -> None:
    for name in ("naive", "register1d"):
        r = cudac_resources(name, None, "int32", "sm_80")
        assert r.registers > 0


def test_parameters_reach_the_compiler() -> None:
    small = compile_cubin("shared", {"TILE": 8}, "float32", "sm_90")
    assert small.params == {"TILE": 8}
    assert cudac_resources("shared", {"TILE": 8}, "float32", "sm_90").smem == 2 * 8 * 8 * 4
    assert compile_cubin("shared", {"TILE": 8}, "float32", "sm_90") is small  # cached


def test_bad_requests_are_refused_before_compiling() -> None:
    with pytest.raises(ValueError, match="choices"):
        compile_cubin("nope")
    with pytest.raises(ValueError, match="cudac"):
        compile_cubin(get("naive", "cuda"))
    with pytest.raises(ValueError, match="not allowed"):
        compile_cubin("shared", {"TILE": 12})
    with pytest.raises(ValueError, match="constraint"):
        compile_cubin("register1d", {"TILE": 8, "R": 16})
    with pytest.raises(TypeError, match="float32"):
        compile_cubin("warptile", None, "int32")
    with pytest.raises(ValueError, match="sm_90"):
        compile_cubin("naive", None, "float32", "hopper")
    with pytest.raises(ValueError, match="sm_90"):  # was an AttributeError
        compile_cubin("naive", None, "float32", 90)
    # a float64 tile that fits in float32 only: refused, not NVRTC's whole ptxas log
    with pytest.raises(ValueError, match="65536 bytes of shared memory per block"):
        compile_cubin("pipelined", {"BK": 16}, "float64")


def test_a_compile_error_is_reported_with_nvrtc_log(tmp_path, monkeypatch) -> None:
    """A broken source is an internal error (RuntimeError), with the compiler's message."""
    (tmp_path / "_gemm.cuh").write_text((nvrtc_compile.SOURCES / "_gemm.cuh").read_text())
    (tmp_path / "k01_naive.cu").write_text(
        '#include "_gemm.cuh"\nextern "C" __global__ void tilegemm_naive(GEMM_ARGS) '
        "{ undeclared_name = 1; }\n")
    monkeypatch.setattr(nvrtc_compile, "SOURCES", tmp_path)
    # Uncached, so neither this compilation nor the real ones in the cache get mixed up.
    monkeypatch.setattr(nvrtc_compile, "_compile", nvrtc_compile._compile.__wrapped__)
    with pytest.raises(RuntimeError, match=r"k01_naive\.cu.*\n.*undeclared_name"):
        compile_cubin("naive", None, "float64", "sm_80")


def test_backend_says_why_it_cannot_run_here() -> None:
    status = {s.name: s for s in tilegemm.backends()}
    cudac, cuda = status["cudac"], status["cuda"]
    if cudac.usable:
        pytest.skip("a GPU is usable here")
    assert cudac.reason and "\n" not in cudac.reason
    if not cuda.usable:
        assert cudac.reason == cuda.reason  # the same one line as the CUDA backend
    with pytest.raises(RuntimeError, match="backend 'cudac' is not usable here"):
        tilegemm.matmul(np.ones((2, 2)), np.ones((2, 2)), backend="cudac")


def test_cli_kernels_resources_for_cudac(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tilegemm import cli

    assert cli.main(["kernels", "--backend", "cudac", "--resources", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["backend"], r["kernel"], r["arch"]) for r in rows} == {
        ("cudac", s.name, a) for s in SPECS for a in ARCHS}
    assert all(r["registers"] > 0 and r["smem"] >= 0 for r in rows)
    # --markdown was ignored with --resources (a rich table came out)
    assert cli.main(["kernels", "--backend", "cudac", "--resources", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith("| cudac |")]
    assert len(table) == len(rows) and lines[2].startswith("| backend | kernel | arch |")


def test_backend_resource_report_is_the_nvrtc_one() -> None:
    """The hook the kernels command and the tuner's spill check read, per backend."""
    from tilegemm.backends import get_backend

    spec = get("register1d", "cudac")
    report = get_backend("cudac").resource_report(spec, {}, np.dtype("float32"), "sm_90")
    assert report == cudac_resources(spec, None, "float32", "sm_90")
    assert get_backend("cpu").resource_report(get("blocked", "cpu"), {}, np.dtype("float32"),
                                              "sm_90") is None
