"""OpenCL programs across processes: PoCL's kernel cache, kept in tilegemm's cache dir.

PoCL caches every build itself (PyOpenCL skips its own binary cache on PoCL for that
reason); tilegemm points that cache into its kernel cache. Builds are counted by the
compiled programs (``program.bc``) PoCL writes, never by time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyopencl")
pytestmark = pytest.mark.opencl

SCRIPT = """
import warnings
import numpy as np, tilegemm
from tilegemm import compile_cache
warnings.simplefilter("always", compile_cache.CompileCacheWarning)
a = np.arange(48 * 40, dtype=np.float32).reshape(48, 40) / 100
b = np.arange(40 * 24, dtype=np.float32).reshape(40, 24) / 100
c = tilegemm.matmul(a, b, backend="opencl", kernel="shared")
np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5)
print("ok")
"""


def _run(cache: Path, before: str = "", after: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "POCL_CACHE_DIR"}
    env["TILEGEMM_KERNEL_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-c", before + SCRIPT + after], env=env,
                          capture_output=True, text=True, timeout=300)


def _programs(cache: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (cache / "pocl").glob("*/*/program.bc")}


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tilegemm.backends import get_backend

    if not get_backend("opencl").status().usable:
        pytest.skip("no OpenCL device")
    cache = tmp_path_factory.mktemp("kernels")
    first = _run(cache)
    assert first.returncode == 0 and first.stdout.strip() == "ok", first.stderr
    if not _programs(cache):
        pytest.skip("the default OpenCL device is not PoCL (it keeps no cache here)")
    return cache


def test_a_second_process_builds_nothing(filled: Path) -> None:
    before = _programs(filled)
    second = _run(filled)
    assert second.returncode == 0 and second.stdout.strip() == "ok", second.stderr
    assert _programs(filled) == before  # no program compiled or rewritten


def test_a_corrupt_program_warns_and_rebuilds(filled: Path) -> None:
    for program in _programs(filled):
        program.write_bytes(program.read_bytes()[:100])
    out = _run(filled)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "CompileCacheWarning" in out.stderr and "PoCL rebuilds it" in out.stderr
    rebuilt = _programs(filled)
    assert rebuilt and all(p.stat().st_size > 100 for p in rebuilt)


def test_cache_listing_and_clear_include_pocl(filled: Path, monkeypatch) -> None:
    from tilegemm import compile_cache

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(filled))
    found = [e for e in compile_cache.entries() if e.name.startswith("pocl-")]
    assert found and all(e.bytes > 0 for e in found)
    assert compile_cache.clear() >= len(found)
    assert not _programs(filled)


def test_a_users_pocl_cache_dir_is_left_alone(tmp_path: Path, monkeypatch) -> None:
    from tilegemm import compile_cache

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "mine"))
    compile_cache.use_pocl_cache()
    assert os.environ["POCL_CACHE_DIR"] == str(tmp_path / "mine")
    assert not (tmp_path / "pocl").exists()


def test_a_process_that_never_exits_normally_records_what_it_wrote(tmp_path: Path) -> None:
    """Entries were recorded only by exit handlers, which a multiprocessing worker or a
    killed process never runs: a later truncation of such an entry's code then aborted
    every process that loaded it, with no warning. Now the first launch records them."""
    from tilegemm.backends import get_backend

    if not get_backend("opencl").status().usable:
        pytest.skip("no OpenCL device")
    cache = tmp_path / "kernels"
    first = _run(cache, after="import sys, os; sys.stdout.flush(); os._exit(0)\n")
    assert first.returncode == 0 and first.stdout.strip() == "ok", first.stderr
    code = [p for p in (cache / "pocl").glob("*/*/**/*.so")]
    if not code:
        pytest.skip("the default OpenCL device is not PoCL (it keeps no cache here)")
    assert (cache / "pocl" / "tilegemm-manifest.json").is_file()
    for path in code:
        path.write_bytes(path.read_bytes()[:100])
    out = _run(cache)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "PoCL rebuilds it" in out.stderr


def test_pyopencl_imported_first_still_uses_the_cache(tmp_path: Path) -> None:
    """tilegemm pointed PoCL into its cache only when it imported PyOpenCL itself; the
    documented device-array example imports it first, and PoCL kept its default folder."""
    from tilegemm.backends import get_backend

    if not get_backend("opencl").status().usable:
        pytest.skip("no OpenCL device")
    out = _run(tmp_path, before="import pyopencl\n")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    if not _programs(tmp_path):
        default = _run(tmp_path / "plain")
        if not _programs(tmp_path / "plain"):
            pytest.skip("the default OpenCL device is not PoCL (it keeps no cache here)")
        pytest.fail(f"no PoCL programs in the cache after importing pyopencl first: {default}")
