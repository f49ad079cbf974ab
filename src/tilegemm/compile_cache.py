"""The persistent compile cache: compiled kernels kept on disk across processes.

A Numba rung compiles for seconds (a written-out CUDA rung for tens of seconds); without a
cache every new Python process pays that on its first call. The blocked CPU rung is
written out as one small Python module per (parameters, dtype) with its parameters as
constants, and Numba's own on-disk cache stores the machine code beside that module
(``__pycache__``), so the next process loads it in a fraction of a second. The written-out
CUDA rungs are kept the same way (below).

Where: ``$TILEGEMM_KERNEL_CACHE`` if set (``off`` or ``0`` turns the cache off), else
``kernels/`` under the tuning cache's directory (``$TILEGEMM_CACHE_DIR``, else
``platformdirs.user_cache_dir("tilegemm")``).

Key (CPU): the file name holds a hash of the module's full source (the kernel template, the
parameters and dtype), the versions of tilegemm, Numba, llvmlite and Python, and the CPU
model and features, so a cache written by another version or on another CPU is simply
not found (Numba also checks the CPU and its own version itself). ``tilegemm cache``
lists the entries; ``tilegemm cache --clear`` removes them.

A cache is a convenience, never a reason to fail: a directory that cannot be written gives
a :class:`CompileCacheWarning` and the kernel compiles in memory as before; an entry that
cannot be loaded (a truncated or corrupt file) gives the warning, is deleted and rebuilt.
Two processes filling the same entry at once are safe: every file is written to a
temporary name and renamed into place. They do not both compile it either: a CPU entry's
import (where it compiles) and a text entry's build hold a lock file per entry
(``.<entry>.lock`` beside it), so the first process builds while the others wait, then
load what it saved (at most ``LOCK_WAIT_SECONDS``; then they warn and build it too).

OpenCL programs on PoCL: PoCL keeps its own kernel cache (the compiled program and the
work-group functions, keyed by the source, build options, device and PoCL build), and
PyOpenCL skips its binary cache on PoCL for that reason, so a second process builds nothing.
tilegemm points that cache into ``pocl/`` here (``POCL_CACHE_DIR``, set before PoCL starts
unless the user set it), so ``tilegemm cache`` shows and clears it. PoCL trusts its files,
so tilegemm records their sizes and times after use; an entry changed since then (truncated,
overwritten) gives the warning and is deleted before PoCL starts, and PoCL rebuilds it.
Other drivers cache builds themselves (NVIDIA) or through PyOpenCL's binary cache (AMD and
the rest). A build that PoCL finds in its cache still takes 50-60 ms (PoCL 3.0 runs its
preprocessor over its 1 MB OpenCL header to find the entry); one from the binary PoCL
returns takes 1-2 ms. Asking PoCL for that binary first compiles every kernel for any
work-group size, though: 0.03 s for the small program every process builds to check that
a device can compile (``backends.opencl.build_problem``), whose binary is kept in
``opencl/`` (a text entry, below, keyed by the source, options, device, driver, CPU and
PyOpenCL version), but 2-3 s for a rung's program, which is left to PoCL's cache. A kept
binary the driver refuses gives the warning, is deleted and built from source again.

CUDA rungs on a GPU: a rung whose kernel is generated as source (vectorized and up,
``kernels/cuda/_codegen.py``) has that source written to ``cuda-jit/<kernel>-<hash>.py``
and imported with the kernel's globals (:func:`load_kernel_module`), and is jitted with
numba-cuda's own cache, which keeps the compiled kernel, cubin included, in
``cuda-jit/__pycache__``. numba-cuda's index adds the signature, the GPU's compute
capability and the NVRTC and numba-cuda versions; the file name adds what the file does
not show: a fingerprint of the kernel's globals (constants, intrinsics, the device
functions it calls), its launch bounds, a hash of tilegemm's CUDA kernel sources and the
versions of tilegemm, Numba, numba-cuda, Python, the CUDA compiler packages and the driver
(:func:`cuda_versions`). An entry numba cannot read back gives the warning, is deleted and
recompiled; saves of one kernel take a lock file. Under numba's simulator nothing is
cached (the kernel is exec'd from memory as before), and the hand-written rungs 1–5, which
compile in about a second, are not cached. See ``kernels/cuda/_jit.py``.

CUDA rungs compiled without a GPU (for ``kernels --resources`` and ``explain --sass``) keep
their PTX, one JSON file per (rung, parameters, dtype) holding the text for every
architecture, in ``cuda/`` beside the CPU entries (:func:`cached_texts`). Their key adds a
hash of the CUDA kernel sources and the numba-cuda version; a lock file per entry makes
parallel processes (e.g. test workers) wait for one compile instead of each compiling.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import py_compile
import re
import shutil
import stat as stat_mode
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tilegemm.errors import user_stacklevel

ENV = "TILEGEMM_KERNEL_CACHE"
SUBDIR = "cpu"
CUDA_SUBDIR = "cuda-jit"  # generated CUDA kernels as modules; numba-cuda's cache beside them
MODULE_SUBDIRS = (SUBDIR, CUDA_SUBDIR)  # folders of module entries (load_module and kin)
POCL_SUBDIR = "pocl"  # PoCL's own kernel cache, when tilegemm chose where it lives
OPENCL_SUBDIR = "opencl"  # OpenCL program binaries (PoCL's), see the module's docstring
TEXT_SUBDIRS = ("cuda", OPENCL_SUBDIR)  # keyed stores of compiled text (cached_texts)
# For each keyed store, (module, function) giving what all its entries' keys hold now
# besides _versions(): sources digest, tool versions. An entry keyed otherwise is stale.
TEXT_KEY_COMMON = {"cuda": ("tilegemm.analysis.resources", "ptx_key_common")}
_TEXT_HEADER = "tilegemm compiled-kernel cache entry"

# Compilations and cache loads of every function this process built through the cache
# (Numba's own per-dispatcher counters, summed; a function loaded on its first call is
# counted then); tests and benchmarks read them.
STATS = {"compiled": 0, "loaded": 0}


# Cache folders this process could not use (warned once each): a kernel compiled then is
# not kept, whatever the directory's name promises.
_UNUSABLE: set[str] = set()


def _unusable(folder: Path, exc: OSError) -> None:
    """Note that ``folder`` cannot be used, with a warning the first time in this process
    (every kernel compiled after it would repeat the same words: 'explain' compiles a rung
    for two architectures, a tuner hundreds of candidates)."""
    if str(folder) in _UNUSABLE:
        return
    _UNUSABLE.add(str(folder))
    warnings.warn(f"kernel cache {folder} cannot be used ({exc}); compiling without it "
                  f"(set {ENV} to a writable directory, or to 'off')", CompileCacheWarning,
                  stacklevel=user_stacklevel())


def unusable_folders() -> list[str]:
    """The kernel-cache folders this process could not write (sorted; empty when every
    entry it tried was kept)."""
    return sorted(_UNUSABLE)


class CompileCacheWarning(UserWarning):
    """The compile cache could not be used for a kernel (it compiled without it)."""


def cache_root() -> Path | None:
    """The kernel cache directory, or None when ``TILEGEMM_KERNEL_CACHE=off``."""
    from tilegemm.tune.cache import absolute_once, cache_dir

    env = os.environ.get(ENV)
    if env is not None:
        # absolute, as the working directory was when first read: PoCL is handed the
        # path once (POCL_CACHE_DIR) and resolves a relative one against whatever directory
        # is current when it builds, so a chdir broke every later OpenCL build
        return (None if env.strip().lower() in ("", "0", "off", "no", "false")
                else absolute_once(env))
    return cache_dir() / "kernels"


def pocl_cache_dir() -> Path | None:
    """Where tilegemm keeps PoCL's kernel cache (None when the compile cache is off)."""
    root = cache_root()
    return None if root is None else root / POCL_SUBDIR


def use_pocl_cache() -> None:
    """Point PoCL's kernel cache into ours, unless the user chose one, or turn PoCL's off
    when ours is (``POCL_KERNEL_CACHE=0``); call before PoCL starts (it reads
    ``POCL_CACHE_DIR`` once). Entries changed since a process recorded
    them are removed first, with a warning (see :func:`_check_pocl_entries`). An unusable
    directory warns and leaves PoCL's default."""
    folder = pocl_cache_dir()
    if folder is None:
        # off: PoCL would otherwise keep programs in its own default folder, which this
        # setting promises not to do (the user's POCL_KERNEL_CACHE choice is kept)
        os.environ.setdefault("POCL_KERNEL_CACHE", "0")
        return
    if os.environ.get("POCL_CACHE_DIR"):
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"{folder} is not writable")
    except OSError as exc:
        warnings.warn(f"kernel cache {folder} cannot be used for PoCL ({exc}); PoCL keeps "
                      "its default cache", CompileCacheWarning,
                      stacklevel=user_stacklevel())
        return
    _check_pocl_entries(folder)
    _remove_pocl_temp_files(folder)
    if not (folder / POCL_MANIFEST).exists() and not any(folder.iterdir()):
        # a new folder: recorded at once, so it is known as tilegemm's (listed, cleared)
        # even if no process reaches the record after a launch or at exit
        _record_pocl_files(folder)
    os.environ["POCL_CACHE_DIR"] = str(folder)


POCL_TEMP_AGE_S = 3600.0  # a build in progress in another process is younger than this


def _remove_pocl_temp_files(folder: Path, older_than: float = POCL_TEMP_AGE_S) -> None:
    """Delete the ``tempfile_*`` PoCL 3 leaves at the top of its cache, a few per process
    that builds a program (most of them empty), once they are old enough that no build
    can still be writing them: without this the folder grows by thousands of files."""
    limit = time.time() - older_than
    for path in folder.glob("tempfile_*"):
        try:
            if path.is_file() and path.stat().st_mtime < limit:
                path.unlink()
        except OSError:
            pass  # another process removed it, or it is not ours to remove


POCL_MANIFEST = "tilegemm-manifest.json"
# Files PoCL rewrites in place by design: "last_accessed" on every use, and "build.log",
# which a failed build (a device whose compiler cannot target this CPU, say) leaves as the
# entry's only file and rewrites at every attempt. Neither is code PoCL would load.
_POCL_VOLATILE = ("last_accessed", "build.log")


def _pocl_listing(folder: Path) -> tuple[dict[str, list[Any]], dict[str, int]]:
    """Size and modification time of every file of every PoCL entry (``XX/HASH/...``), keyed
    by its path under ``folder``, and the modification time of every directory below it.

    Walked with ``os.scandir``, which reads each directory once (pathlib's recursive glob
    took 60-80 ms over a cache of 700 files). Directories are not followed through links;
    a file found gone when it is looked at is skipped (another process deleting a damaged
    entry)."""
    files: dict[str, list[Any]] = {}
    dirs: dict[str, int] = {}

    def walk(path: str, prefix: str, depth: int) -> None:
        try:
            with os.scandir(path) as listing:
                found = list(listing)
        except OSError:  # removed while it was walked (another process's check)
            return
        for item in found:
            name = prefix + item.name
            try:
                if item.is_dir(follow_symlinks=False):
                    dirs[name] = item.stat(follow_symlinks=False).st_mtime_ns
                    walk(item.path, name + os.sep, depth + 1)
                    continue
                if depth < 2 or item.name in _POCL_VOLATILE:
                    continue
                st = os.stat(item.path)
            except OSError:  # removed meanwhile: nothing to record
                continue
            if stat_mode.S_ISREG(st.st_mode):
                files[name] = [st.st_size, st.st_mtime_ns]

    walk(os.fspath(folder), "", 0)
    return files, dirs


def _pocl_dirs_unchanged(folder: Path, dirs: dict[str, int]) -> bool:
    """Whether no file or directory was added to or removed from the PoCL cache's entries
    since ``dirs`` (every directory's modification time) was recorded: the same folders at
    the top, and each recorded directory's time unchanged (adding or removing a name in a
    directory changes its time). About a stat per directory, instead of listing them all
    after every first launch, when PoCL found every program in its cache. The top folder's
    own time is not compared: PoCL's temporary files and the record itself change it."""
    root = os.fspath(folder)
    try:
        with os.scandir(root) as listing:
            top = {item.name for item in listing if item.is_dir(follow_symlinks=False)}
    except OSError:
        return False
    if top != {name for name in dirs if os.sep not in name}:
        return False
    for name, mtime in dirs.items():
        try:
            if os.stat(os.path.join(root, name)).st_mtime_ns != mtime:
                return False
        except OSError:
            return False
    return True


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _changed(folder: Path, name: str, recorded: list[Any], now: list[Any]) -> bool:
    """Whether PoCL file ``name`` differs from its record ``[size, mtime, sha256]``: by
    size at once; a file whose time alone differs (a copied cache: ``cp -r`` gives new
    times) is compared by content, when the record has its digest."""
    if recorded[:2] == now[:2]:
        return False
    if recorded[0] != now[0] or len(recorded) < 3:
        return True
    return _file_digest(folder / name) != recorded[2]


def _check_pocl_entries(folder: Path) -> None:
    """PoCL trusts its cache: a truncated or altered compiled program fails the build or, in
    PoCL 3, aborts the process when the kernel is launched. PoCL writes an entry once and
    never changes it, so a file whose size or contents differ from what a process recorded
    after its first launch or at exit (:func:`record_pocl_cache_now`) was damaged: its
    entry is deleted (with a warning) before PoCL starts, and PoCL rebuilds it. Contents
    are compared only where the time differs (a copied cache), so a check reads no file
    of an untouched cache."""
    manifest = folder / POCL_MANIFEST
    try:
        recorded, _ = _pocl_record(manifest)
    except OSError:  # none yet (a new cache), or unreadable: nothing to check against
        return
    except (ValueError, KeyError, TypeError) as exc:
        _drop_unchecked(folder, manifest, exc)
        return
    now = _stat_recorded(folder, recorded)
    bad = {Path(name).parts[:2] for name, record in recorded.items()
           if name in now and _changed(folder, name, record, now[name])}
    for parts in sorted(bad):
        entry = folder.joinpath(*parts)
        warnings.warn(f"PoCL kernel cache entry {entry} was changed after it was written; "
                      "deleting it (PoCL rebuilds it)", CompileCacheWarning,
                      stacklevel=user_stacklevel())
        shutil.rmtree(entry, ignore_errors=True)


def _stat_recorded(folder: Path, recorded: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Size and time now of each recorded file that is still a file (a stat each: a file
    PoCL added since is not in the record and is trusted, so nothing is listed)."""
    now: dict[str, list[Any]] = {}
    root = os.fspath(folder)
    for name in recorded:
        try:
            st = os.stat(os.path.join(root, name))  # (a Path per file: 2-3x the time)
        except OSError:  # removed since (a cleared entry): nothing to compare
            continue
        if stat_mode.S_ISREG(st.st_mode):
            now[name] = [st.st_size, st.st_mtime_ns]
    return now


def _pocl_record(manifest: Path) -> tuple[dict[str, list[Any]], dict[str, int] | None]:
    """The record's ``{file: [size, time, sha256]}`` and its directories' times (None in a
    record written before they were kept, or damaged there); OSError when there is none to
    read, ValueError, KeyError or TypeError when it is damaged."""
    if manifest.is_dir() and not manifest.is_symlink():  # read_text: IsADirectoryError
        raise ValueError("a directory stands in its place")
    data = json.loads(manifest.read_text())
    recorded = data["files"]
    if not isinstance(recorded, dict) or not all(
            isinstance(v, list) and len(v) >= 2 for v in recorded.values()):
        raise TypeError("'files' is not an object of [size, time, digest] lists")
    dirs = data.get("dirs")
    if not isinstance(dirs, dict) or not all(isinstance(v, int) for v in dirs.values()):
        dirs = None
    return recorded, dirs


def _remove(path: Path) -> None:
    """Delete what stands at ``path``: a directory with its contents, else the file or
    link (nothing if it is gone). Entries, records and ``__pycache__`` found to be the
    wrong kind of thing are removed so."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _drop_unchecked(folder: Path, manifest: Path, why: BaseException) -> None:
    """The record is damaged, so no entry can be checked, and an entry damaged as well
    would abort the process inside PoCL: every entry is deleted (PoCL rebuilds them) and
    the record removed, with a warning."""
    warnings.warn(f"PoCL kernel cache record {manifest} is damaged ({why}); deleting the "
                  "PoCL cache's entries, which cannot be checked (PoCL rebuilds them)",
                  CompileCacheWarning, stacklevel=user_stacklevel())
    for entry in folder.glob("*/*"):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
    _remove(manifest)


_RECORDING = False


def record_pocl_cache_at_exit() -> None:
    """At exit, record the files of tilegemm's PoCL cache (PoCL writes a kernel's code at
    its first launch, after the build), for :func:`_check_pocl_entries`."""
    global _RECORDING
    folder = pocl_cache_dir()
    if _RECORDING or folder is None or os.environ.get("POCL_CACHE_DIR") != str(folder):
        return
    _RECORDING = True
    import atexit

    atexit.register(_record_pocl_files, folder)


def record_pocl_cache_now() -> None:
    """Record the files of tilegemm's PoCL cache now (after a kernel's first launch, so a
    process that never reaches its exit handlers has recorded what it wrote)."""
    folder = pocl_cache_dir()
    if folder is not None and os.environ.get("POCL_CACHE_DIR") == str(folder):
        _record_pocl_files(folder)


def _record_pocl_files(folder: Path) -> None:
    """Write the record ``{file: [size, time, sha256]}`` of tilegemm's PoCL cache. A file
    whose size and time match the previous record keeps its digest (only new files are
    read). Unrecorded entries are simply trusted, as PoCL itself does. Where no directory
    changed since the record (PoCL found every program in its cache), nothing is written
    (:func:`_pocl_dirs_unchanged`)."""
    try:
        before, before_dirs = _pocl_record(folder / POCL_MANIFEST)
    except (OSError, ValueError, KeyError, TypeError):
        before, before_dirs = {}, None
    if before_dirs is not None and _pocl_dirs_unchanged(folder, before_dirs):
        return
    files, dirs = _pocl_listing(folder)
    for name, record in files.items():
        old = before.get(name)
        if isinstance(old, list) and len(old) == 3 and old[:2] == record:
            record.append(old[2])
        else:
            record.append(_file_digest(folder / name))
    with contextlib.suppress(OSError):
        write_atomic(folder / POCL_MANIFEST,
                     json.dumps({"header": _TEXT_HEADER, "files": files, "dirs": dirs}))


def _store_versions(subdir: str) -> dict[str, str]:
    """The versions every entry of keyed store ``subdir`` is written under: OpenCL
    programs are built by the driver (whose version the key holds), not by Numba, and an
    OpenCL process does not import Numba (a third of a second) to read one."""
    return _opencl_versions() if subdir == OPENCL_SUBDIR else _versions()


def _opencl_versions() -> dict[str, str]:
    import pyopencl

    from tilegemm import __version__

    return {"tilegemm": __version__, "pyopencl": pyopencl.VERSION_TEXT,
            "python": platform.python_version()}


def _versions() -> dict[str, str]:
    import llvmlite
    import numba

    from tilegemm import __version__

    return {"tilegemm": __version__, "numba": numba.__version__,
            "llvmlite": llvmlite.__version__, "python": platform.python_version()}


def cuda_versions() -> dict[str, str]:
    """What a cached CUDA kernel's machine code depends on besides its source: tilegemm,
    Numba, numba-cuda and Python, the CUDA compiler packages (NVVM, NVRTC, nvJitLink,
    cuda-bindings) and the driver ("none" without one). numba-cuda adds the compute
    capability and NVRTC version itself (its codegen's ``magic_tuple``)."""
    return {**_versions(), **_cuda_packages(), "driver": _driver_version()}


@functools.cache
def _cuda_packages() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("numba-cuda", "cuda-bindings", "nvidia-nvvm", "nvidia-cuda-nvrtc",
                 "nvidia-nvjitlink"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


@functools.cache
def _driver_version() -> str:
    """The CUDA driver's version, asked without creating a context; "none" without one."""
    try:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        return str(v) if int(err) == 0 else "none"
    except Exception:  # noqa: BLE001 - no driver library, or an old binding: no version
        return "none"


@functools.cache
def cuda_sources_digest() -> str:
    """A hash of tilegemm's Numba CUDA kernel sources: the generators, and the intrinsics
    and device functions a generated kernel calls (their code is compiled into it)."""
    return source_digest((Path(__file__).parent / "kernels" / "cuda").glob("*.py"))


_DESCRIBE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "tilegemm_compile_describe", default=None)


@contextlib.contextmanager
def describing(describe: dict[str, Any]) -> Iterator[None]:
    """Kernels compiled inside are listed by ``tilegemm cache`` as ``describe`` (rung,
    parameters, dtype): the rung's build() knows them, the cache it reaches does not."""
    token = _DESCRIBE.set(describe)
    try:
        yield
    finally:
        _DESCRIBE.reset(token)


def current_describe() -> dict[str, Any] | None:
    """The description set by the innermost :func:`describing`, if any."""
    return _DESCRIBE.get()


CPU_KERNELS = Path(__file__).parent / "kernels" / "cpu"


def cpu_sources_digest(folder: Path | None = None) -> str:
    """A hash of the private CPU kernel modules (``kernels/cpu/_*.py``; ``folder``: another
    copy of that folder): a written-out module imports their intrinsics (the explicit
    vector K loop, the prefetch, the thread placement) and compiles them into its code, so
    a cached entry built from other versions of them must not be loaded. The rung modules
    (``kNN_*.py``) are not hashed: what they contribute is in the written-out source
    itself, and adding or editing a rung of your own must not throw away the compiled
    ``blocked`` rung."""
    if folder is None:
        return _installed_cpu_digest()
    return source_digest(folder.glob("_*.py"))


@functools.cache
def _installed_cpu_digest() -> str:
    return cpu_sources_digest(CPU_KERNELS)


def _cpu_key() -> str:
    """CPU model, the CPU and LLVM features Numba compiles for (``NUMBA_CPU_NAME`` and
    ``NUMBA_CPU_FEATURES`` when set: code built for another CPU is another entry) and the
    digest of the CPU kernel sources."""
    from llvmlite import binding as llvm
    from numba.core import config

    from tilegemm.backends.cpu import cpu_name

    name = config.CPU_NAME or llvm.get_host_cpu_name()
    features = (config.CPU_FEATURES if config.CPU_FEATURES is not None
                else llvm.get_host_cpu_features().flatten())
    return f"{cpu_name()}|{name}|{features}|{cpu_sources_digest()}"


def fill_template(template: str, header: dict[str, Any], blocks: dict[str, str]) -> str:
    """``template`` with the ``# @header`` block replaced by ``NAME = repr(value)`` lines and
    each ``# @<name>`` … ``# @end-<name>`` block by ``blocks[name]``."""
    lines = "".join(f"{k} = {v!r}\n" for k, v in header.items())
    out = _replace_block(template, "header", lines)
    for name, text in blocks.items():
        out = _replace_block(out, name, text)
    return out


def _replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"^# @{name}\b[^\n]*\n.*?^# @end-{name}\n", re.S | re.M)
    if not pattern.search(text):
        raise RuntimeError(f"kernel template has no '# @{name}' block")
    return pattern.sub(lambda _: f"# @{name}\n{body}# @end-{name}\n", text, count=1)


def load_module(name: str, source: str, describe: dict[str, Any]) -> ModuleType:
    """Import ``source`` (whose functions use ``cache=CACHE``) through the cache.

    ``describe`` (rung, parameters, dtype) is recorded in the file for ``tilegemm cache``.
    The source must assign ``CACHE = False`` in its header; it is set to True here when the
    cache is usable.
    """
    key = {"describe": describe, "versions": _versions(), "cpu": _cpu_key()}
    digest = hashlib.sha256((source + json.dumps(key, sort_keys=True)).encode()).hexdigest()
    stem = f"{name}-{digest[:20]}"
    root = cache_root()
    if root is None:
        return _exec_uncached(stem, source)
    folder = root / SUBDIR
    text = (f"# {_TEXT_HEADER}: {json.dumps(key, sort_keys=True)}\n"
            + source.replace("\nCACHE = False\n", "\nCACHE = True\n", 1))
    path = folder / f"{stem}.py"
    if not _write_entry(path, text):
        return _exec_uncached(stem, source)
    # Importing compiles what the entry lacks (all of it, the first time): processes that
    # need it at once take turns, so the first compiles and saves while the others wait,
    # then load (without the lock, each compiled the whole rung: a pool's workers, or two
    # test workers, started on an empty cache). A folder where no lock file can be made
    # (read-only, shared) is still read, without one; a process that has waited
    # LOCK_WAIT_SECONDS for another compiles the entry itself.
    with locked(_lock_path(path), required=False, wait=LOCK_WAIT_SECONDS):
        try:
            return _import(stem, path)
        except Exception as exc:  # noqa: BLE001 - any failure to load the entry: rebuild once
            warnings.warn(f"kernel cache entry {path.name} could not be loaded "
                          f"({type(exc).__name__}: {exc}); deleting and rebuilding it",
                          CompileCacheWarning,
                          stacklevel=user_stacklevel())
            try:
                _remove_entry(folder, stem)
                write_atomic(path, text)
            except OSError as write_exc:  # the disk full, the folder gone: compile in memory
                _unusable(folder, write_exc)
                return _exec_uncached(stem, source)
            return _import(stem, path)  # a second failure is a real error, not the cache's


def _write_entry(path: Path, text: str) -> bool:
    """Make ``path`` hold ``text``, rewriting it only when it differs: numba keys its cached
    code to the source file's modification time and size, so an unchanged file must keep
    them. False, with a :class:`CompileCacheWarning`, when the directory cannot be used."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"{folder} is not writable")
        # Numba keeps the compiled code in __pycache__ beside the file; where it cannot, it
        # falls back to a directory of its own outside this cache, or fails the compile
        pycache = folder / "__pycache__"
        if pycache.is_symlink() or (pycache.exists() and not pycache.is_dir()):
            # a file in its place turned the cache off in every process, for good
            warnings.warn(f"kernel cache {pycache} is not a folder; replacing it",
                          CompileCacheWarning, stacklevel=user_stacklevel())
            _remove(pycache)
        pycache.mkdir(exist_ok=True)
        if not os.access(pycache, os.W_OK | os.X_OK):
            raise PermissionError(f"{pycache} is not writable")
        if path.exists() and not path.is_file():  # a damaged entry, not a broken folder
            warnings.warn(f"kernel cache entry {path} is not a file; replacing it",
                          CompileCacheWarning, stacklevel=user_stacklevel())
            _remove(path)
        try:
            same = path.is_file() and path.read_text() == text
        except ValueError:  # not UTF-8 text: damaged, rewritten below
            same = False
        if not same:
            write_atomic(path, text)
    except OSError as exc:
        _unusable(folder, exc)
        return False
    return True


def load_kernel_module(name: str, source: str, key: dict[str, Any],
                       namespace: dict[str, Any]) -> ModuleType | None:
    """Write a generated CUDA kernel's ``source`` to ``cuda-jit/<name>-<hash>.py`` and
    import it with ``namespace`` as its initial globals; None when the cache is off or its
    directory cannot be used (warned), and the caller compiles in memory.

    A kernel defined in a real file is one numba-cuda's ``cache=True`` can keep: its cubin
    goes to ``cuda-jit/__pycache__``, indexed by the file's time and size, the signature,
    the compute capability and NVRTC version, and the numba-cuda version. What the file
    does not show, ``key`` must: the globals the kernel is compiled with (numba freezes them
    into the code, and its index does not hash them), the jit options, the tilegemm CUDA
    sources they come from, and the versions (:func:`cuda_versions`). ``key["describe"]``
    is shown by ``tilegemm cache``. The file is rewritten only when its text changes, so a
    second process finds numba's index still valid.
    """
    root = cache_root()
    if root is None:
        return None
    digest = hashlib.sha256((source + json.dumps(key, sort_keys=True)).encode()).hexdigest()
    stem = f"{name}-{digest[:20]}"
    path = root / CUDA_SUBDIR / f"{stem}.py"
    if not _write_entry(path, f"# {_TEXT_HEADER}: {json.dumps(key, sort_keys=True)}\n"
                              + source):
        return None
    try:
        return _import(stem, path, namespace)
    except Exception as exc:  # noqa: BLE001 - the in-memory path still works
        warnings.warn(f"kernel cache entry {path.name} could not be imported "
                      f"({type(exc).__name__}: {exc}); compiling without the cache",
                      CompileCacheWarning,
                      stacklevel=user_stacklevel())
        return None


def write_atomic(path: Path, text: str | bytes, prefix: str = ".tmp-") -> None:
    """Write ``text`` (or bytes) to ``path`` whole or not at all (a crash mid-write leaves
    neither a half file nor the temporary, named ``prefix...``); the kernel and tuning
    caches."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # as a file written plainly: mkstemp's 0600 shut out the
        os.replace(tmp, path)  # other users of a shared cache directory
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# How long a process waits for another that is building the same entry before it builds
# the entry itself: a cold compile of the CPU rung takes 15-40 s on two cores, and a
# process stopped while holding the lock (suspended, in a debugger) must not hold up every
# other process for ever.
LOCK_WAIT_SECONDS = 300.0


@contextlib.contextmanager
def locked(lock_path: Path, required: bool = True,
           wait: float | None = None) -> Iterator[None]:
    """Hold the lock file ``lock_path`` (made if need be) against other processes; with
    ``required=False``, go on without it where the file cannot be opened; with ``wait``,
    go on without it after that many seconds, with a :class:`CompileCacheWarning`."""
    try:
        lock = open(lock_path, "a")  # noqa: SIM115 - closed below, after the unlock
    except OSError:
        if required:
            raise
        yield
        return
    with lock:
        if not _take(lock, wait):
            warnings.warn(f"waited {wait:g} s for another process building kernel cache "
                          f"entry {lock_path.name[1:-5]}; building it here as well",
                          CompileCacheWarning, stacklevel=user_stacklevel())
            yield
            return
        try:
            yield
        finally:
            # released now, not when the last copy of the descriptor closes: a child
            # forked meanwhile holds one and would keep the lock for its whole life
            fcntl.flock(lock, fcntl.LOCK_UN)


def _take(lock: Any, wait: float | None) -> bool:
    """Lock the open file ``lock``; False if ``wait`` seconds passed first."""
    if wait is None:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _lock_path(entry: Path) -> Path:
    """The lock file of an entry (hidden, beside it; ``tilegemm cache --clear`` removes
    it with the entry)."""
    return entry.with_name(f".{entry.stem}.lock")


def _import(stem: str, path: Path, namespace: dict[str, Any] | None = None) -> ModuleType:
    modname = "tilegemm_kernel_" + stem.replace("-", "_")
    _keep_bytecode(path)
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace or {})  # before the body runs: its names are globals
    sys.modules[modname] = module  # Numba's cache finds functions through their module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    _count(module)
    return module


def _keep_bytecode(path: Path) -> None:
    """Write the entry's compiled bytecode beside it where Python would not
    (``PYTHONDONTWRITEBYTECODE``, set in many container images), so that later processes
    load it instead of compiling the source. The setting keeps Python from writing
    bytecode next to a user's sources; this cache is tilegemm's own, like Numba's machine
    code beside it. A generated CPU module is 70 KB of source: compiling it took 11 ms of
    each new process's first call (Intel Xeon family 6 model 207). The file is written
    whole or not at all, rewritten when it does not match the source (Python's own check:
    magic number, source time and size), and a failure leaves the import to compile the
    source, as before."""
    if not sys.dont_write_bytecode:
        return  # Python writes it itself
    try:
        cached = importlib.util.cache_from_source(str(path))
        if not _bytecode_current(cached, path):
            py_compile.compile(str(path), cfile=cached, doraise=True)
    except (OSError, ValueError, NotImplementedError, py_compile.PyCompileError):
        pass


def _bytecode_current(cached: str, source: Path) -> bool:
    """Whether the bytecode file ``cached`` is one Python would load for ``source``: its
    header (PEP 552) holds this Python's magic number and the source's time and size."""
    try:
        with open(cached, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    st = os.stat(source)
    return (len(head) == 16 and head[:4] == importlib.util.MAGIC_NUMBER
            and int.from_bytes(head[4:8], "little") == 0
            and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)


def _exec_uncached(stem: str, source: str) -> ModuleType:
    module = ModuleType("tilegemm_kernel_" + stem.replace("-", "_"))
    exec(compile(source, f"<tilegemm kernel {stem}>", "exec"), module.__dict__)  # noqa: S102
    _count(module)
    return module


def _count(module: ModuleType) -> None:
    """Count the module's loads and compilations; a function still waiting for its first
    call (``kernels/cpu/_lazy``) is counted when it gets one."""
    for f in getattr(module, "COMPILED", ()):
        if getattr(f, "pending", False):
            f.on_ready = _count_function
        else:
            _count_function(f)


def _count_function(f: Any) -> None:
    hits = sum(f.stats.cache_hits.values())
    STATS["loaded"] += hits
    STATS["compiled"] += len(f.signatures) - hits


def _remove_entry(folder: Path, stem: str) -> None:
    for p in list(folder.glob(f"{stem}.*")) + list((folder / "__pycache__").glob(f"{stem}*")):
        p.unlink(missing_ok=True)


@dataclass
class CacheEntry:
    name: str
    describe: dict[str, Any]
    versions: dict[str, str]
    current: bool  # written by this tilegemm/Numba/Python on this CPU
    bytes: int  # source plus compiled code
    files: tuple[Path, ...] = ()  # what removing the entry deletes


def entries() -> list[CacheEntry]:
    """What the cache holds (empty when it is off or absent)."""
    root = cache_root()
    if root is None:
        return []
    return (_module_entries(root / SUBDIR, {"versions": _versions(), "cpu": _cpu_key()})
            + _module_entries(root / CUDA_SUBDIR, {"versions": cuda_versions(),
                                                   "sources": cuda_sources_digest()})
            + _text_entries(root) + _pocl_entries(root))


# Every entry's file name ends in 20 hex digits of its key's hash ("blocked-float32-<hex>",
# "<rung>-<hex>.json"), and its text starts with the header.
_ENTRY_NAME = re.compile(r"-[0-9a-f]{20}$")
_HEADED = (f"# {_TEXT_HEADER}".encode(), json.dumps({"header": _TEXT_HEADER})[:-1].encode())


def _is_entry(path: Path) -> bool:
    """Whether ``path`` is an entry of ours, damaged or not: named as entries are, or
    starting with the header. Anything else (a cache directory pointed at a folder that
    holds other files) is never listed, nor deleted by ``tilegemm cache --clear``."""
    if not path.is_file():
        return False
    if _ENTRY_NAME.search(path.stem):
        return True
    try:
        with path.open("rb") as f:
            return f.read(80).startswith(_HEADED)
    except OSError:
        return False


def _module_entries(folder: Path, now: dict[str, Any]) -> list[CacheEntry]:
    """One entry per module file (its first line holds its key); current when the parts
    of the key in ``now`` match this process's."""
    out = []
    for path in sorted(p for p in folder.glob("*.py") if _is_entry(p)) if folder.is_dir() else ():
        try:
            first = path.read_text().split("\n", 1)[0]
            key = _mapping(json.loads(first.split(":", 1)[1]))
        except (OSError, ValueError, IndexError):
            key = {}
        files = (path, *(folder / "__pycache__").glob(f"{path.stem}*"), *_lock_of(path))
        out.append(CacheEntry(path.stem, _mapping(key.get("describe")),
                              _mapping(key.get("versions")),
                              bool(key) and all(key.get(k) == v for k, v in now.items()),
                              _size(files), files))
    return out


def _lock_of(entry: Path) -> tuple[Path, ...]:
    """The entry's lock file where one was made (an empty file)."""
    lock = _lock_path(entry)
    return (lock,) if lock.is_file() else ()


def _mapping(value: Any) -> dict[str, Any]:
    """A key's part as written, or {} where an entry is damaged (a list, a string...): such
    an entry is listed as not usable here, and ``--clear`` removes it."""
    if not isinstance(value, dict):
        return {}
    # params are listed as KEY=VALUE; the names shown and sorted by must be text (a number
    # there broke the listing's sort and table)
    return {str(k): v for k, v in value.items()
            if (k != "params" or isinstance(v, dict))
            and (k not in ("kernel", "dtype", "backend", "output") or isinstance(v, str))}


def _size(paths: Iterable[Path]) -> int:
    """Bytes of the files that can be read (a dangling link or a vanished file: 0)."""
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def _pocl_entries(root: Path) -> list[CacheEntry]:
    """PoCL's kernel cache as one entry per compiled program (``program.bc``)."""
    out = []
    folder = root / POCL_SUBDIR
    if not (folder / POCL_MANIFEST).is_file():  # not a PoCL cache tilegemm set up
        return out
    for program in sorted(folder.glob("*/*/program.bc")):
        entry = program.parent
        size = _size(p for p in entry.rglob("*") if p.is_file())
        kernels = sorted(p.name for p in entry.iterdir() if p.is_dir())
        out.append(CacheEntry(f"pocl-{entry.parent.name}{entry.name}"[:25],
                              {"kernel": "OpenCL program (PoCL cache)", "kernels": kernels},
                              {}, True, size))
    return out


def _text_key_common(sub: str) -> dict[str, Any]:
    """What every entry of keyed store ``sub`` holds in its key now (see
    ``TEXT_KEY_COMMON``); {} where that cannot be worked out here."""
    where = TEXT_KEY_COMMON.get(sub)
    if where is None:
        return {}
    try:
        return dict(getattr(importlib.import_module(where[0]), where[1])())
    except Exception:  # a tool missing here (numba-cuda): versions alone decide
        return {}


def _text_entries(root: Path) -> list[CacheEntry]:
    out = []
    for sub in TEXT_SUBDIRS:
        folder = root / sub
        paths = sorted(p for p in folder.glob("*.json") if _is_entry(p)) if folder.is_dir() else []
        common = _text_key_common(sub) if paths else {}
        # an entry written by another tilegemm, Numba or Python, or from other sources
        # or tool versions, is never read again
        now = {**_store_versions(sub), **_mapping(common.get("versions"))} if paths else {}
        for path in paths:
            try:
                key = _mapping(_mapping(json.loads(path.read_text())).get("key"))
            except (OSError, ValueError):
                key = {}
            versions = _mapping(key.get("versions"))
            current = (bool(versions) and all(versions.get(k) == v for k, v in now.items())
                       and all(key.get(k) == v for k, v in common.items() if k != "versions"))
            # the folder names the backend even when the entry is too damaged to say
            describe = {"backend": sub, **_mapping(key.get("describe"))}
            out.append(CacheEntry(path.stem, describe, versions, current, _size((path,)),
                                  (path, *_lock_of(path))))
    return out


def clear(stale_only: bool = False) -> int:
    """Delete every kernel cache entry, or with ``stale_only`` those this process can no
    longer use (written by another tilegemm, Numba or Python version, for another CPU,
    driver or kernel source); returns how many were removed.

    Stale entries are never loaded, but nothing deletes them on its own: a directory shared
    by several machines (a home directory on a cluster's login and GPU nodes, say) holds
    entries that are stale on one machine and in use on another."""
    root = cache_root()
    before = entries()
    targets = [e for e in before if not (stale_only and e.current)]
    failed: list[str] = []

    def note(path: Any, exc: BaseException) -> None:
        failed.append(f"{path}: {getattr(exc, 'strerror', None) or exc}")

    for e in targets:
        for path in e.files:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                note(path, exc)
    if not stale_only and root is not None:
        # PoCL's own cache, where tilegemm put it (its record says so): all of it
        pocl = root / POCL_SUBDIR
        if (pocl / POCL_MANIFEST).is_file():
            # (onerror: the spelling every supported Python takes)
            shutil.rmtree(pocl, onerror=lambda _f, p, info: note(p, info[1]))
        # the entries' folders only where nothing else is left in them: a cache directory
        # may have been pointed at a folder holding other files, which are not ours
        for sub in (*MODULE_SUBDIRS, *TEXT_SUBDIRS, POCL_SUBDIR):
            for folder in (root / sub / "__pycache__", root / sub):
                with contextlib.suppress(OSError):
                    folder.rmdir()
    left = {e.name for e in entries()}
    removed = sum(e.name not in left for e in targets)
    if failed or removed < len(targets):
        shown = "; ".join(dict.fromkeys(failed)) or "entries reappeared (another process?)"
        raise CacheClearError(
            f"removed {removed} of {len(targets)} entr{'y' if len(targets) == 1 else 'ies'}; "
            f"could not remove: {shown[:400]}")
    return removed


class CacheClearError(OSError):
    """``clear`` could not remove everything it should (permissions, a busy file)."""


def source_digest(paths: Iterable[Path]) -> str:
    """A hash of the given source files' contents (part of a text entry's key)."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def cached_texts(subdir: str, name: str, key: dict[str, Any],
                 build: Callable[[], dict[str, str]]) -> dict[str, str]:
    """The texts ``build()`` returns (e.g. PTX per architecture), kept on disk under ``key``.

    ``key`` must hold everything the texts depend on (sources digest, parameters, tool
    versions; the store's own versions are added here, see :func:`_store_versions`) and a
    ``describe`` dict for ``tilegemm cache``. The first process to need an entry builds it
    under a lock file while others wait, then read it. An unreadable entry gives a
    :class:`CompileCacheWarning` and is rebuilt; an unusable directory gives the warning and
    ``build()`` runs uncached.
    """
    root = cache_root()
    if root is None:
        return build()
    full, path = _text_path(root, subdir, name, key)
    folder = path.parent
    lock = _lock_path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock.touch()  # a folder where it cannot be made is unusable: build uncached
    except OSError as exc:
        _unusable(folder, exc)
        return build()
    with locked(lock, wait=LOCK_WAIT_SECONDS):
        texts = _read_texts(path, full)
        if texts is None:
            texts = build()
            try:
                write_atomic(path, json.dumps({"header": _TEXT_HEADER, "key": full,
                                                "texts": texts,
                                                "sha256": _texts_digest(texts)}))
            except OSError as exc:
                warnings.warn(f"kernel cache entry {path.name} could not be written ({exc})",
                              CompileCacheWarning, stacklevel=user_stacklevel())
    return texts


def _text_path(root: Path, subdir: str, name: str,
               key: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """The full key of a text entry (``key`` with the store's versions added) and its file."""
    full = {**key, "versions": {**_store_versions(subdir), **key.get("versions", {})}}
    digest = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:20]
    return full, root / subdir / f"{name}-{digest}.json"


def discard_texts(subdir: str, name: str, key: dict[str, Any]) -> None:
    """Delete the entry :func:`cached_texts` keeps under ``key`` (one its user found
    unusable: a program binary the driver refused), so the next call builds it again."""
    root = cache_root()
    if root is not None:
        with contextlib.suppress(OSError):
            _text_path(root, subdir, name, key)[1].unlink(missing_ok=True)


def _read_texts(path: Path, key: dict[str, Any]) -> dict[str, str] | None:
    if path.is_dir() and not path.is_symlink():  # in the way of every write: replaced
        warnings.warn(f"kernel cache entry {path.name} is a directory; replacing it",
                      CompileCacheWarning, stacklevel=user_stacklevel())
        _remove(path)
        return None
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if entry["key"] != key or not all(isinstance(t, str) for t in entry["texts"].values()):
            raise ValueError("the entry does not match its key")
        if "sha256" in entry and entry["sha256"] != _texts_digest(entry["texts"]):
            # edited or damaged text that is still JSON: the linker failed on it, every run
            # (an entry written before the checksum is read as it is)
            raise ValueError("its texts differ from the checksum written with them")
        return dict(entry["texts"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"kernel cache entry {path.name} could not be loaded "
                      f"({type(exc).__name__}: {exc}); rebuilding it",
                      CompileCacheWarning,
                      stacklevel=user_stacklevel())
        path.unlink(missing_ok=True)
        return None


def _texts_digest(texts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()
