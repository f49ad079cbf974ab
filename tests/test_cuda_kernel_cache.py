"""The persistent cache of the written-out CUDA rungs, checked without a GPU.

A generated kernel is written to a module file of the compile cache and jitted with
numba-cuda's own disk cache; these tests check the file and its key (what must change it
and what must not), that a second process reuses the file untouched (numba keys its cubins
to the file's time and size), the uncached paths (``off``, an unwritable directory), the
guard that turns an unreadable numba cache entry into a warning and a rebuild, and
``tilegemm cache``. One test compiles a rung through the dispatcher to a cubin with the
device's answers stood in for, and counts the compilations of a second process; the last
test does the same on a real GPU (TILEGEMM_GPU_TESTS=1), launching the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tilegemm import compile_cache, registry
from tilegemm.compile_cache import CUDA_SUBDIR, CompileCacheWarning

# A generated kernel in the shape of the real ones: constants and a device function as
# globals, jitted by kernel_jit. Never compiled here (that needs a GPU): only built.
SOURCE = """
def toy(out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = twice(SCALE * i)
"""
TWICE = """
@cuda.jit(device=True, inline=True)
def twice(x):
    return FACTOR * x
"""


def _toy(scale: int = 3, factor: int = 2, threads: int = 64, min_blocks: int = 0):
    from numba import cuda

    from tilegemm.kernels.cuda._codegen import compile_source
    from tilegemm.kernels.cuda._jit import kernel_jit

    twice = compile_source(TWICE, "twice", {"cuda": cuda, "FACTOR": factor})
    fn = compile_source(SOURCE, "toy", {"cuda": cuda, "SCALE": scale, "twice": twice})
    return kernel_jit(threads, min_blocks)(fn)


def _files(root: Path) -> list[Path]:
    return sorted((root / CUDA_SUBDIR).glob("*.py"))


# Real numba-cuda dispatchers (built, never launched): not under the simulator.
offline = pytest.mark.ptx


@offline
def test_generated_kernel_comes_from_a_cache_file(tmp_path, monkeypatch):
    from numba.cuda.dispatcher import CUDACache

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    kernel = _toy()
    [path] = _files(tmp_path)
    assert Path(kernel.py_func.__code__.co_filename) == path
    assert isinstance(kernel._cache, CUDACache)
    assert Path(kernel._cache._cache_path).is_relative_to(tmp_path / CUDA_SUBDIR)
    assert kernel.stats.cache_path == kernel._cache.cache_path
    assert kernel.targetoptions["launch_bounds"] == 64
    assert kernel.py_func.__globals__["SCALE"] == 3  # the namespace became its globals
    assert "def toy(out):" in path.read_text()


@offline
def test_key_changes_with_what_the_code_depends_on_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    _toy()
    _toy()  # the same kernel again: the same file
    assert len(_files(tmp_path)) == 1
    _toy(scale=4)  # a constant of the kernel
    assert len(_files(tmp_path)) == 2
    _toy(factor=5)  # a constant of a device function it calls
    assert len(_files(tmp_path)) == 3
    _toy(threads=128)  # launch bounds
    _toy(min_blocks=2)
    assert len(_files(tmp_path)) == 5
    real = compile_cache._versions()
    monkeypatch.setattr(compile_cache, "_versions", lambda: {**real, "numba": "0.0-other"})
    _toy()  # another Numba version
    assert len(_files(tmp_path)) == 6
    monkeypatch.setattr(compile_cache, "_versions", lambda: real)
    monkeypatch.setattr(compile_cache, "cuda_sources_digest", lambda: "edited")
    _toy()  # tilegemm's CUDA sources (the intrinsics) changed
    assert len(_files(tmp_path)) == 7
    monkeypatch.undo()
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    _toy()
    assert len(_files(tmp_path)) == 7


@offline
def test_fingerprint_sees_closure_cells_and_generated_globals():
    from numba import cuda

    from tilegemm.kernels.cuda._codegen import Unfingerprintable, compile_source, fingerprint
    from tilegemm.kernels.cuda._tensorcore import tensorcore_ops

    tc = tensorcore_ops()
    # one function, other captured values: other code
    assert fingerprint(tc.cp_wait(0)) == fingerprint(tc.cp_wait(0))
    assert fingerprint(tc.cp_wait(0)) != fingerprint(tc.cp_wait(2))
    # generated device functions: by text and globals, not by their per-call file name
    one = compile_source(TWICE, "twice", {"cuda": cuda, "FACTOR": 2})
    assert fingerprint(one) == fingerprint(compile_source(TWICE, "twice",
                                                          {"cuda": cuda, "FACTOR": 2}))
    assert fingerprint(one) != fingerprint(compile_source(TWICE, "twice",
                                                          {"cuda": cuda, "FACTOR": 3}))
    assert fingerprint(np.float32(0)) != fingerprint(np.float64(0))
    with pytest.raises(Unfingerprintable):
        fingerprint({"x": object()})


@offline
def test_a_global_without_a_stable_description_compiles_uncached(tmp_path, monkeypatch):
    from numba import cuda
    from numba.cuda.core.caching import NullCache

    from tilegemm.kernels.cuda._codegen import compile_source
    from tilegemm.kernels.cuda._jit import kernel_jit

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    fn = compile_source(SOURCE, "toy", {"cuda": cuda, "SCALE": 1, "twice": object()})
    with pytest.warns(CompileCacheWarning, match="without the cache"):
        kernel = kernel_jit(32)(fn)
    assert isinstance(kernel._cache, NullCache) and _files(tmp_path) == []


@offline
@pytest.mark.parametrize(("rung", "dtype"), [
    ("vectorized", "float32"), ("vectorized", "float64"), ("smem_layout", "float32"),
    ("warptile", "float32"), ("pipelined", "float32"), ("pipelined", "float64"),
    ("mma", "float32"), ("mma", "float16"), ("mma", "bfloat16")])
def test_every_written_out_rung_is_cached(tmp_path, monkeypatch, recwarn, rung, dtype):
    from numba.cuda.dispatcher import CUDACache

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    spec = registry.get(rung, "cuda")
    params = spec.resolve({})
    kernel = registry._build.__wrapped__(spec, tuple(sorted(params.items())), dtype).kernel
    assert not [w for w in recwarn if issubclass(w.category, CompileCacheWarning)]
    assert isinstance(kernel._cache, CUDACache)
    [entry] = compile_cache.entries()
    assert entry.describe == {"kernel": rung, "backend": "cuda", "dtype": dtype,
                              "params": params, "output": "compiled kernel"}
    assert entry.current


BUILD = """
import json, sys
from tilegemm import registry
spec = registry.get("vectorized", "cuda")
kernel = spec.program(spec.resolve({}), "float32").kernel
print(json.dumps({"file": kernel.py_func.__code__.co_filename,
                  "cache": kernel._cache.cache_path}))
"""


def _build_in_subprocess(cache: Path) -> dict:
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(cache), NUMBA_ENABLE_CUDASIM="0")
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@offline
def test_second_process_reuses_the_file_untouched(tmp_path):
    first = _build_in_subprocess(tmp_path)
    path = Path(first["file"])
    assert path.parent == tmp_path / CUDA_SUBDIR
    assert Path(first["cache"]).is_relative_to(tmp_path)
    before = path.stat()
    second = _build_in_subprocess(tmp_path)
    after = Path(second["file"]).stat()
    assert second == first
    # numba's index is valid only while the source file keeps its time and size
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino, before.st_mtime_ns, before.st_size)


# A whole compile through the dispatcher with no GPU: only the device's answers are stood
# in for (an sm_90 device; bind() builds the cubin, as it does before numba saves a kernel,
# but cannot load it without a driver). numba's lowering, NVVM, nvJitLink, the save and the
# load are the real ones.
COMPILE = """
import hashlib, json
from types import SimpleNamespace
from typing import Any
from numba.cuda import codegen, dispatcher
from numba.cuda.cudadrv import runtime
CC = (9, 0, "a")
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=CC[:2])
codegen.JITCUDACodegen.magic_tuple = lambda self: (runtime.get_version(), CC[:2])
codegen.CUDACodeLibrary._ensure_cc = lambda self, cc: CC if cc is None else cc
dispatcher._Kernel.bind = lambda self: self._codelibrary.get_cubin()
from tilegemm import compile_cache, registry
spec = registry.get("vectorized", "cuda")
program = spec.program(spec.resolve(spec.sim_params), "float32")
kernel = program.kernel.compile(program.signature("float32"))
cubin = kernel._codelibrary._cubin_cache[CC]
print(json.dumps({"stats": compile_cache.STATS,
                  "cubin": hashlib.sha256(bytes(cubin.code)).hexdigest()}))
"""


def _two_fresh_processes(code: str, cache: Path, timeout: int) -> list[Any]:
    """Run ``code`` in two new Python processes sharing the kernel cache ``cache`` (on a
    real compile path, numba's own cache directory not moved); the JSON each printed last."""
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(cache), NUMBA_ENABLE_CUDASIM="0")
    env.pop("NUMBA_CACHE_DIR", None)
    out = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, timeout=timeout)
        out.append(json.loads(run.stdout.strip().splitlines()[-1]))
    return out


@offline
@pytest.mark.slow
def test_second_process_loads_the_compiled_kernel_instead_of_compiling(tmp_path):
    runs = _two_fresh_processes(COMPILE, tmp_path, timeout=300)
    assert runs[0]["stats"] == {"compiled": 1, "loaded": 0}
    assert runs[1]["stats"] == {"compiled": 0, "loaded": 1}
    assert runs[1]["cubin"] == runs[0]["cubin"]  # the saved cubin itself


@offline
def test_cache_off_compiles_in_memory(monkeypatch):
    from numba.cuda.core.caching import NullCache

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", "off")
    kernel = _toy(scale=9)
    assert isinstance(kernel._cache, NullCache)
    assert kernel.py_func.__code__.co_filename.startswith("<tilegemm generated")


@offline
def test_unwritable_cache_dir_warns_and_compiles_in_memory(tmp_path, monkeypatch):
    from numba.cuda.core.caching import NullCache

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(blocker / "cache"))
    with pytest.warns(CompileCacheWarning, match="cannot be used"):
        kernel = _toy(scale=10)
    assert isinstance(kernel._cache, NullCache)
    assert kernel.py_func.__code__.co_filename.startswith("<tilegemm generated")


class _Codegen:
    """Stands in for the device's codegen: numba asks it for the compute capability."""

    def magic_tuple(self):
        return ((13, 0), (9, 0))


class _Context:
    def refresh(self) -> None:
        pass

    def codegen(self) -> _Codegen:
        return _Codegen()


def _saved_entry(tmp_path, monkeypatch):
    """A toy kernel's cache with one entry written by numba's own index and data files
    (the payload stands in for a compiled kernel, which needs a GPU)."""
    from numba.cuda import types

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    cache = _toy(scale=11)._cache
    sig = (types.float32[::1],)
    cache._cache_file.save(cache._index_key(sig, _Codegen()), _payload(sig))
    monkeypatch.setattr(cache._impl, "rebuild", lambda ctx, payload: SimpleNamespace(
        signature=SimpleNamespace(args=payload["args"]), cubin=payload["cubin"]))
    return cache, sig


def _payload(sig):
    return {"args": sig, "cubin": b"\x7fELF" * 64}


@offline
@pytest.mark.parametrize("damaged", ["nbc", "nbi"])
def test_corrupt_entry_warns_is_deleted_and_rebuilt(tmp_path, monkeypatch, damaged):
    from numba.cuda.dispatcher import CUDACache

    cache, sig = _saved_entry(tmp_path, monkeypatch)
    loaded = compile_cache.STATS["loaded"]
    assert cache.load_overload(sig, _Context()).cubin == b"\x7fELF" * 64
    assert compile_cache.STATS["loaded"] == loaded + 1
    [path] = Path(cache.cache_path).glob(f"*.{damaged}")
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    # numba's own cache raises on the truncated file (what would fail the launch) ...
    plain = CUDACache(cache._py_func)
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever unpickling raises
        CUDACache._load_overload(plain, sig, _Context())
    # ... the guarded one warns, deletes the entry and reports a miss: the kernel compiles
    with pytest.warns(CompileCacheWarning, match="could not be loaded"):
        assert cache.load_overload(sig, _Context()) is None
    assert not list(Path(cache.cache_path).glob("*.nb*"))
    assert cache.load_overload(sig, _Context()) is None  # nothing left to warn about


@offline
def test_entry_for_other_argument_types_is_not_used(tmp_path, monkeypatch):
    from numba.cuda import types

    cache, sig = _saved_entry(tmp_path, monkeypatch)
    # the index names a data file that holds another signature's kernel
    cache._cache_file.save(cache._index_key(sig, _Codegen()), _payload((types.int32[::1],)))
    with pytest.warns(CompileCacheWarning, match="could not be loaded"):
        assert cache.load_overload(sig, _Context()) is None
    assert not list(Path(cache.cache_path).glob("*.nb*"))


@offline
def test_saves_of_one_kernel_wait_for_each_other(tmp_path, monkeypatch):
    import threading

    from numba.cuda import types

    cache, sig = _saved_entry(tmp_path, monkeypatch)
    other = (types.float64[::1],)
    monkeypatch.setattr(cache._impl, "reduce", lambda kernel: _payload(other))
    kernel = SimpleNamespace(codegen=_Codegen())
    with cache._save_lock():  # another process saving this kernel
        saver = threading.Thread(target=cache.save_overload, args=(other, kernel))
        saver.start()
        saver.join(0.5)
        assert saver.is_alive()
    saver.join(10)
    assert not saver.is_alive()
    assert cache.load_overload(other, _Context()).signature.args == other
    assert cache.load_overload(sig, _Context()).signature.args == sig


@offline
def test_failed_save_warns_and_counts_the_compilation(tmp_path, monkeypatch):
    cache, sig = _saved_entry(tmp_path, monkeypatch)

    def refuse(kernel):
        raise RuntimeError("Cannot pickle CUDACodeLibrary with linking files")

    monkeypatch.setattr(cache._impl, "reduce", refuse)
    monkeypatch.setattr(cache._impl, "check_cachable", lambda data: True)
    compiled = compile_cache.STATS["compiled"]
    with pytest.warns(CompileCacheWarning, match="could not be saved"):
        cache.save_overload(sig, SimpleNamespace(codegen=_Codegen()))
    assert compile_cache.STATS["compiled"] == compiled + 1


@offline
def test_cache_command_lists_and_clears_cuda_entries(tmp_path, monkeypatch, capsys):
    from tilegemm.cli import main

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    spec = registry.get("warptile", "cuda")
    registry._build.__wrapped__(spec, tuple(sorted(spec.resolve({}).items())), "float32")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "1 entry" in out and "cuda warptile (compiled kernel)" in out and "WNITER=2" in out
    assert "float32" in out and "numba-cuda" in out
    assert main(["cache", "--clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert not (tmp_path / CUDA_SUBDIR).exists() and compile_cache.entries() == []


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.parametrize("rung", ["warptile", "mma"])
def test_simulator_keeps_the_in_memory_path(tmp_path, monkeypatch, rung):
    import linecache

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    spec = registry.get(rung, "cuda")
    params = spec.resolve(spec.sim_params or {})
    kernel = registry._build.__wrapped__(spec, tuple(sorted(params.items())),
                                         "float32").kernel
    filename = kernel.py_func.__code__.co_filename
    assert filename.startswith("<tilegemm generated") and linecache.getlines(filename)
    assert not (tmp_path / CUDA_SUBDIR).exists()


# Run in fresh processes on a GPU: the second must load the kernel, not compile it.
RUN = """
import json
import numpy as np
import tilegemm
from tilegemm import compile_cache
from tilegemm.reference import assert_close
rng = np.random.default_rng(0)
a = rng.standard_normal((96, 80)).astype(np.float32)
b = rng.standard_normal((80, 72)).astype(np.float32)
assert_close(tilegemm.matmul(a, b, backend="cuda", kernel="warptile"), a, b)
print(json.dumps(compile_cache.STATS))
"""


@pytest.mark.gpu
def test_second_process_loads_the_cubin_instead_of_compiling(tmp_path):
    stats = _two_fresh_processes(RUN, tmp_path, timeout=600)
    assert stats[0]["compiled"] >= 1
    assert stats[1] == {"compiled": 0, "loaded": stats[0]["compiled"]}
