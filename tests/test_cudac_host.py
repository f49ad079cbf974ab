"""The CUDA C rungs' own sources, run on the CPU against float64 NumPy (no GPU needed).

``tests/cudac_host/host_cuda.h`` supplies just enough of CUDA for g++ to compile a kernel
as it is (one std::thread per CUDA thread, std::barrier for ``__syncthreads()``, blocks in
turn), built with AddressSanitizer and UBSan, so every out-of-bounds access and signed
overflow fails the run and a thread leaving before a barrier hangs it (the timeout fails
it). Outputs start as NaN, so an element no thread writes fails the comparison. This checks
what a GPU run would: index arithmetic, edges, strides, batches, alpha/beta and the grid-
stride loops, on the exact text NVRTC compiles. It says nothing about speed or about
races the CPU happens to hide; tests/test_cuda_rungs.py repeats the cases on a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilegemm
from conftest import HOSTILE_SHAPES
from tilegemm.kernels.cudac import _compile
from tilegemm.reference import assert_close, random_operands
from tilegemm.registry import KernelSpec, get

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

HOST = Path(__file__).resolve().parent / "cudac_host"
_BUILT: dict[tuple[Any, ...], Path] = {}  # one executable per (source, params, dtype)


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cudac_host")


def _small(spec: KernelSpec) -> dict[str, int]:
    """The Numba rung's simulator-sized parameters where they apply (few threads, so quick
    on the CPU), else the defaults."""
    numba = {s.name: s for s in tilegemm.kernels("cuda")}.get(spec.name)
    small = dict(numba.sim_params or {}) if numba else {}
    return spec.resolve(small if small and spec.is_valid(small) else {})


def _executable(build_dir: Path, name: str, params: tuple[tuple[str, int], ...],
                dtype: str) -> Path:
    """g++ builds the kernel's source, as NVRTC sees it, with the CPU shim and the driver."""
    key = (_compile.SOURCES, name, params, dtype)
    if key in _BUILT:
        return _BUILT[key]
    spec = get(name, "cudac")
    tag = "_".join([name, dtype] + [f"{k}{v}" for k, v in params]) + f"_{len(_BUILT)}"
    text = "\n".join([
        '#include "host_cuda.h"',
        _compile.source_text(_compile.source_file(spec), params, dtype),
        f"#define KERNEL tilegemm_{name}",
        '#include "host_main.inc"',
    ])
    src, exe = build_dir / f"{tag}.cpp", build_dir / tag
    src.write_text(text)
    done = subprocess.run(
        ["g++", "-std=c++20", "-O0", "-pthread", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", "-Wno-unknown-pragmas", f"-I{HOST}",
         f"-I{_compile.SOURCES}", "-o", str(exe), str(src)],
        capture_output=True, text=True)
    assert done.returncode == 0, f"g++ could not build {src}:\n{done.stderr[-3000:]}"
    _BUILT[key] = exe
    return exe


def run_on_cpu(build_dir: Path, spec: KernelSpec, params: dict[str, int], a: np.ndarray,
               b: np.ndarray,
               c: np.ndarray | None = None, alpha: float = 1.0, beta: float = 0.0,
               grid: tuple[int, int, int] | None = None, offset: int = 0) -> np.ndarray:
    """``alpha * a @ b + beta * c`` by the rung's kernel on the CPU. a (batch|1, M, K) and
    b (batch|1, K, N) may be any strided views (their strides go to the kernel as they
    are); ``offset`` elements in front of each operand misalign it; ``grid`` overrides the
    program's (to force the grid-stride loops)."""
    dtype = a.dtype
    program = spec.program(params, dtype)
    batch, m, k = max(a.shape[0], b.shape[0]), a.shape[1], a.shape[2]
    n = b.shape[2]
    out = np.full((batch, m, n), np.nan if dtype.kind == "f" else -7, dtype) if c is None \
        else np.array(c, dtype)
    buffers, args = [], []
    for x in (a, b, out):
        # The smallest buffer holding the view: strides are kept, the data copied into it.
        strides = [s // dtype.itemsize for s in x.strides]
        if x.shape[0] == 1:
            strides[0] = 0
        span = 1 + sum((d - 1) * abs(s) for d, s in zip(x.shape, strides) if d > 0)
        buf = np.zeros(offset + span, dtype)
        view = np.lib.stride_tricks.as_strided(buf[offset:], x.shape,
                                               [s * dtype.itemsize for s in strides])
        view[...] = x if x.shape[0] > 1 or x.ndim < 3 else x[:1]
        buffers.append(buf)
        args += strides
    g = grid or program.grid(batch, m, n)
    argv = [batch, m, n, k, *args, repr(float(alpha)), repr(float(beta)), *g,
            *program.block, *(len(x) for x in buffers), offset, offset, offset]
    exe = _executable(build_dir, spec.name, tuple(sorted(params.items())), dtype.name)
    infile, outfile = build_dir / "in.bin", build_dir / "out.bin"
    infile.write_bytes(b"".join(x.tobytes() for x in buffers))
    done = subprocess.run([str(exe), *map(str, argv), str(infile), str(outfile)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{spec.name} failed on the CPU:\n{done.stderr[-3000:]}"
    result = np.frombuffer(outfile.read_bytes(), dtype)
    c_strides = [s * dtype.itemsize for s in args[6:9]]
    c_strides[0] = c_strides[0] or m * n * dtype.itemsize
    return np.lib.stride_tricks.as_strided(result[offset:], (batch, m, n), c_strides).copy()


def _check(build_dir: Path, spec: KernelSpec, params: dict[str, int],
           shape: tuple[int, int, int], dtype: str, **kw: Any) -> None:
    m, n, k = shape
    a, b = random_operands((1, m, k), (1, k, n), dtype)
    r = run_on_cpu(build_dir, spec, params, a, b, **kw)
    assert_close(r[0], a[0], b[0], what=f"cudac {spec.name} {params} {dtype} {shape}")


SPECS = tilegemm.kernels("cudac")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_shapes_small_tiles(build_dir: Path, spec: KernelSpec) -> None:
    params = _small(spec)
    for shape in HOSTILE_SHAPES:
        _check(build_dir, spec, params, shape, "float32")


@pytest.mark.parametrize("name", ["warptile", "pipelined"])
def test_yardstick_tiles_vector_path_and_edges(build_dir: Path, name: str) -> None:
    """The 128×128 defaults: an interior that takes the 16-byte vector path (K and N
    multiples of 4), partial tiles on every edge, and a misaligned operand that must fall
    back to scalar loads."""
    spec = get(name, "cudac")
    params = spec.defaults()
    _check(build_dir, spec, params, (130, 132, 36), "float32")
    _check(build_dir, spec, params, (129, 131, 37), "float32")
    _check(build_dir, spec, params, (64, 64, 16), "float32", offset=1)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [s for s in SPECS if s.rung >= 3], ids=lambda s: s.name)
def test_float64_int32_and_default_tiles(build_dir: Path, spec: KernelSpec) -> None:
    params = _small(spec)
    _check(build_dir, spec, params, (33, 17, 65), "float64")
    _check(build_dir, spec, spec.defaults(), (33, 17, 65), "float32")
    if spec.supports("int32"):
        m, n, k = 9, 13, 7
        a, b = random_operands((1, m, k), (1, k, n), "int32")
        c, _ = random_operands((1, m, n), (1,), "int32")
        r = run_on_cpu(build_dir, spec, params, a, b, c, alpha=3, beta=-2)
        assert np.array_equal(r, 3 * (a.astype(np.int64) @ b) - 2 * c)


@pytest.mark.parametrize("name", ["shared", "pipelined"])
def test_batches_strides_alpha_beta_and_grid_stride(build_dir: Path, name: str) -> None:
    spec = get(name, "cudac")
    params = _small(spec)
    # A broadcast over 3 products (batch stride 0), B transposed in memory.
    a, _ = random_operands((1, 19, 11), (1,), "float32")
    bt, _ = random_operands((3, 23, 11), (1,), "float32")
    b = bt.transpose(0, 2, 1)  # (3, 11, 23), column-major rows
    c, _ = random_operands((3, 19, 23), (1,), "float32")
    r = run_on_cpu(build_dir, spec, params, a, b, c, alpha=1.5, beta=-0.5)
    for z in range(3):
        assert_close(r[z], a[0], b[z], alpha=1.5, beta=-0.5, c=c[z], what=f"batch {z}")
    # beta == 0 must not read C (NaN there), and a 1×1×1 grid strides over everything.
    nan_c = np.full((3, 19, 23), np.nan, np.float32)
    r = run_on_cpu(build_dir, spec, params, a, b, nan_c, alpha=2.0, beta=0.0, grid=(1, 1, 1))
    for z in range(3):
        assert_close(r[z], a[0], b[z], alpha=2.0, what=f"grid-stride batch {z}")


def test_the_harness_catches_an_out_of_bounds_read(build_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel with the source texts' defect (no bounds check) must fail here."""
    broken = (_compile.SOURCES / "k02_coalesced.cu").read_text().replace(
        "for (int k = 0; k < K; ++k)", "for (int k = 0; k < K + 1; ++k)")
    (tmp_path / "k02_coalesced.cu").write_text(broken)
    (tmp_path / "_gemm.cuh").write_text((_compile.SOURCES / "_gemm.cuh").read_text())
    monkeypatch.setattr(_compile, "SOURCES", tmp_path)
    spec = get("coalesced", "cudac")
    with pytest.raises(AssertionError, match="AddressSanitizer|runtime error"):
        _check(build_dir, spec, spec.resolve({"BLOCK": 8}), (5, 3, 4), "float32")
