"""``kernel_jit(threads)``: ``cuda.jit`` with launch bounds, so every block size launches,
and, for generated kernels, with the compiled code kept on disk across processes.

Launch bounds: without them ptxas may give a kernel up to 255 registers per thread, but a
block must fit the 65,536-register file of an SM: at 1,024 threads that is 64 registers
each. numba's index arithmetic is 64-bit and needs 70–80 registers even for the naive
kernel, so a 32×32 block compiled without bounds fails at launch ("too many resources
requested"). Telling ptxas the block size (``.maxntid`` in the PTX) makes it fit the
registers to the block, spilling if it must, and the resource report
(tilegemm.analysis.resources) compiles with the same bounds. Numba's simulator has no
``launch_bounds`` option and needs none.

The persistent cache: a written-out rung (vectorized and up) takes tens of seconds to
compile on its first call (numba's lowering, then NVVM), in every new process. Its kernel
comes from :func:`tilegemm.kernels.cuda._codegen.compile_source`, text exec'd in memory,
which numba-cuda cannot cache. So on a real GPU (never under the simulator, which swaps
``cuda`` in the kernel's globals and reads the source through ``linecache``) the kernel's
text is written to a file of the compile cache (``cuda-jit/`` under
``$TILEGEMM_KERNEL_CACHE``; :func:`tilegemm.compile_cache.load_kernel_module`), imported
with the same globals, and jitted with numba-cuda's own cache. numba-cuda compiles and
binds the kernel before saving it, so the entry holds the cubin: a later process loads it
and skips lowering, NVVM and ptxas.

What keys the entry:
- numba-cuda's index (``numba/cuda/core/caching.py``, ``Cache._index_key``): the argument
  types, ``codegen.magic_tuple()`` (``numba/cuda/codegen.py``: the NVRTC version and the
  current device's compute capability, so a cubin is only loaded on the architecture it
  was built for), the numba-cuda version and the kernel's bytecode; the index file is
  valid only while the source file keeps its modification time and size.
- the file's name, for everything else: a hash of the source, the globals the kernel is
  compiled with (numba freezes them into the code and its index does not see them:
  :func:`tilegemm.kernels.cuda._codegen.fingerprint`, which covers the generated device
  functions it calls, e.g. mma's ``load_stage``: their code is compiled into the kernel's
  entry, so the kernel's key holds their source), the jit options (launch bounds), a hash
  of tilegemm's CUDA kernel sources (intrinsics and device functions are Python code
  there) and the versions of tilegemm, Numba, numba-cuda, Python, the CUDA compiler
  packages and the driver (:func:`tilegemm.compile_cache.cuda_versions`).

A cache is never a reason to fail: an entry numba cannot read back (a truncated index or
data file) gives a :class:`~tilegemm.compile_cache.CompileCacheWarning`, is deleted and
recompiled; a save that fails warns; an unwritable directory warns and the kernel compiles
in memory as before; ``TILEGEMM_KERNEL_CACHE=off`` turns it off. Two processes compiling
one kernel at once are safe (the module file is written under a temporary name and renamed;
numba's saves of one kernel wait for each other on a lock file). ``NUMBA_CACHE_DIR``, if
set, moves numba's files there (then ``tilegemm cache --clear`` does not remove them).
Loads and compilations are counted in ``compile_cache.STATS``. Hand-written rungs (1–5)
are closures of their ``build()`` that compile in about a second and call intrinsics from
other files, which numba's index would not notice changing, so they are not cached.

Private (underscore) module, so discovery does not look for a SPEC here; it imports numba
only when called (from a rung's build()).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import linecache
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tilegemm import compile_cache
from tilegemm.compile_cache import CompileCacheWarning


def kernel_jit(threads: int, min_blocks: int = 0) -> Callable[[Callable[..., Any]], Any]:
    """The decorator for a rung's kernel launched with exactly ``threads`` threads a block.

    ``min_blocks`` > 0 also asks ptxas to fit that many blocks per SM (``.minnctapersm``):
    at 256 threads and 2 blocks, at most 128 registers a thread.
    """
    from numba import cuda

    from tilegemm import simulator

    if simulator.enabled():
        from tilegemm.kernels.cuda._simulator import install

        install()  # numba's simulator races on cuda.shared.array; see _simulator.py
        return cuda.jit
    from tilegemm.kernels.cuda._numba_compile import install as speed_up_lowering

    speed_up_lowering()  # same PTX, a faster numba-cuda lowering step; see _numba_compile.py
    options = {"launch_bounds": (threads, min_blocks) if min_blocks else threads}
    return functools.partial(cached_jit, options=options)


def cached_jit(fn: Callable[..., Any], options: dict[str, Any]) -> Any:
    """``cuda.jit(**options)(fn)``; when ``fn`` was generated by ``compile_source`` and the
    compile cache is usable, the same kernel from a file of the cache, with numba-cuda's
    disk cache on (see the module docstring)."""
    from numba import cuda

    from tilegemm.kernels.cuda._codegen import generated_source

    source = generated_source(fn)
    module = None if source is None else _kernel_module(fn, source, options)
    if module is None:
        return cuda.jit(**options)(fn)
    kernel = cuda.jit(**options)(getattr(module, fn.__name__))
    try:
        kernel._cache = guarded_cache_class()(kernel.py_func)  # what cache=True would do
    except Exception as exc:  # noqa: BLE001 - numba found no usable cache directory
        warnings.warn(f"numba-cuda cannot cache {module.__file__} ({type(exc).__name__}: "
                      f"{exc}); compiling without the cache", CompileCacheWarning,
                      stacklevel=3)
    return kernel


def _kernel_module(fn: Callable[..., Any], source: str, options: dict[str, Any]) -> Any:
    """The module file holding ``fn``'s source, imported with ``fn``'s globals, or None."""
    from tilegemm.kernels.cuda._codegen import Unfingerprintable, fingerprint

    if compile_cache.cache_root() is None:
        return None
    namespace = {k: v for k, v in fn.__globals__.items()  # type: ignore[attr-defined]
                 if not k.startswith("__") and k != fn.__name__}
    try:
        names = fingerprint(namespace)
    except Unfingerprintable as exc:  # a new kind of global: correct, just not cached
        warnings.warn(f"kernel {fn.__name__} is compiled without the cache: {exc}",
                      CompileCacheWarning, stacklevel=4)
        return None
    describe = compile_cache.current_describe() or {"kernel": fn.__name__}
    key = {"describe": {**describe, "output": "compiled kernel"},
           "namespace": names, "jit": options, "sources": compile_cache.cuda_sources_digest(),
           "versions": compile_cache.cuda_versions()}
    module = compile_cache.load_kernel_module(fn.__name__, source, key, namespace)
    if module is not None and module.__file__:
        # tracebacks read the file; keep its text even if the cache is cleared meanwhile
        text = Path(module.__file__).read_text()
        linecache.cache[module.__file__] = (len(text), None, text.splitlines(keepends=True),
                                            module.__file__)
    return module


@functools.cache
def guarded_cache_class() -> type:
    """numba-cuda's ``CUDACache``, made safe to trust (built on first use: it imports
    numba-cuda)."""
    from numba.cuda.core.caching import _InTreeCacheLocator
    from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

    class BesideTheSource(CUDACacheImpl):  # type: ignore[misc, valid-type]
        # always the __pycache__ beside the kernel's file, which `tilegemm cache` counts
        # and clears, not NUMBA_CACHE_DIR
        _locator_classes = [_InTreeCacheLocator]

    class GuardedCUDACache(CUDACache):  # type: ignore[misc, valid-type]
        """numba-cuda's kernel cache, made safe to trust.

        - An entry it cannot read back (numba unpickles a truncated index or data file and
          raises, failing the launch) gives a CompileCacheWarning, is deleted and compiled
          again; so does an entry holding a kernel for other argument types.
        - Saves of one kernel are serialised by a lock file: numba's save reads the index,
          picks a data file name and writes both, so two processes saving two signatures
          of one kernel at once could otherwise leave the index naming the other's data.
        - A save that fails warns (the kernel is compiled and runs; only reuse is lost).
        - Loads and compilations are counted in ``compile_cache.STATS``.
        - Entries sit beside the kernel's file whatever ``NUMBA_CACHE_DIR`` says.
        """

        _impl_class = BesideTheSource

        def _load_overload(self, sig: Any, target_context: Any) -> Any:
            # Cache._load_overload, guarded; the key needs the device, so its errors are
            # not the cache's and propagate.
            if not self._enabled:
                return None
            key = self._index_key(sig, target_context.codegen())
            try:
                data = self._cache_file.load(key)
                if data is not None:
                    data = self._impl.rebuild(target_context, data)
                    _check_signature(data, sig)
            except Exception as exc:  # noqa: BLE001 - any unreadable entry: rebuild it
                warnings.warn(f"kernel cache entry {self._impl.filename_base} in "
                              f"{self._cache_path} could not be loaded ({type(exc).__name__}:"
                              f" {exc}); deleting and rebuilding it", CompileCacheWarning,
                              stacklevel=2)
                self.discard()
                return None
            if data is not None:
                compile_cache.STATS["loaded"] += 1
            return data

        def save_overload(self, sig: Any, data: Any) -> None:
            compile_cache.STATS["compiled"] += 1  # the dispatcher saves what it compiled
            try:
                with self._save_lock():
                    super().save_overload(sig, data)
            except Exception as exc:  # noqa: BLE001 - the kernel works; only reuse is lost
                warnings.warn(f"kernel cache entry {self._impl.filename_base} could not be "
                              f"saved ({type(exc).__name__}: {exc})", CompileCacheWarning,
                              stacklevel=2)

        @contextlib.contextmanager
        def _save_lock(self) -> Iterator[None]:
            self._impl.locator.ensure_cache_path()
            path = Path(self._cache_path) / f".{self._impl.filename_base}.lock"
            with open(path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                yield

        def discard(self) -> None:
            """Delete this kernel's index, data and marker files."""
            base = glob.escape(self._impl.filename_base)
            for pattern in (".nbi", ".*.nbc", ".lcs"):
                for path in Path(self._cache_path).glob(base + pattern):
                    path.unlink(missing_ok=True)

    return GuardedCUDACache


def _check_signature(kernel: Any, sig: Any) -> None:
    """Raise when a loaded kernel was compiled for other argument types than ``sig``."""
    from numba.cuda.core import sigutils

    wanted, _ = sigutils.normalize_signature(sig)
    got = tuple(getattr(getattr(kernel, "signature", None), "args", ()))
    if got != tuple(wanted):
        raise ValueError(f"the entry holds a kernel for {got}, not {tuple(wanted)}")
