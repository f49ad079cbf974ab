"""Compiled helpers that are compiled (or loaded from the disk cache) only when needed.

The blocked rung is about twenty compiled functions, and ``numba.njit(signature)``
compiles each one eagerly: with a warm disk cache, every one of them is still loaded
(unpickled and linked into the JIT) when the rung's module is imported. But the functions
that only other compiled functions call (the micro-kernel, packing, the loop nest) are never
needed in a process whose callers come from the cache: a caller's cached machine code
already holds the code of everything it calls. Loading them anyway cost about a fifth of
the first call itself in a fresh process (about 55 of 250 ms on a 2-vCPU Zen 5), a tenth
or so of the process's import and first calls. This module imports Numba, so only the
generated rung module imports it.

:func:`njit_when_called` declares such a helper with the same explicit signature: nothing
is compiled until a caller that is itself being compiled asks for it (a cold or stale
cache), and then exactly the declared signature is compiled, under the code-generation
settings that were in force where the helper was declared (the SLP vectoriser for the
micro-kernel, the vector width for all), as the eager decorator would have.
:func:`load_compiled`, at the end of the module, loads one function to learn whether the
cache is warm; with a warm cache each function Python calls is then loaded on its first
call (a process that multiplies only small matrices never loads the threaded loop nest),
and with a cold one everything compiles in order.

:func:`called_by_name` is the exception to "a caller holds its callees' code": a few
heavy helpers (the micro-kernel's loop over tiles, packing, the vector-matrix and
small-product paths) are called from compiled code through a symbol of their own, so
their machine code is generated once rather than once per caller (a cold compile of the
rung took less than half as long). Such a helper is compiled or loaded, and its address
named, before any function whose code reaches it (:class:`CalledByName`).

Loading from the cache skips Numba's registry set-up (:class:`QuickLoadCache`): that
imports and registers every implementation Numba could compile with (about 60 ms in a fresh
process on a 2-vCPU Zen 5, a fifth of the first call), and loading machine code compiles
nothing. A compilation still does it first, as Numba always does. Nor does loading parse
the LLVM IR kept for linking (:func:`_linked_on_demand`), import the modules environments
belong to (:func:`_environment`) or ``numpy.ma`` (``WhenCalledDispatcher.typeof_pyval``),
or compile Numba's runtime functions again (:func:`_start_runtime`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import inspect
import os
import pickle
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from numba.core import environment, errors, event, typeinfer, types
from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    InTreeCacheLocator,
)
from numba.core.compiler_lock import global_compiler_lock
from numba.core.environment import Environment, lookup_environment
from numba.core.registry import CPUDispatcher
from numba.core.runtime import nrtdynmod, rtsys
from numba.np import numpy_support

from tilegemm.compile_cache import CompileCacheWarning, write_atomic
from tilegemm.errors import user_stacklevel
from tilegemm.kernels.cpu._slp import (
    current_vector_width,
    held_by_a_lost_thread,
    vector_width,
)


def njit_when_called(signature: Any, *, settings: tuple[Callable[[], AbstractContextManager],
                                                        ...] = (),
                     **flags: Any) -> Callable[[Callable], WhenCalledDispatcher]:
    """Like ``numba.njit(signature, **flags)``, but compiled on first use.

    ``settings``: context-manager factories (module-level functions, e.g. ``slp_enabled``)
    entered around the compilation; the vector width in force at declaration is kept as
    well. A call from Python compiles it too (a helper can be called directly in tests).
    """
    width = current_vector_width()

    def wrap(func: Callable) -> WhenCalledDispatcher:
        options = dict(flags)
        cache = options.pop("cache", False)
        options.setdefault("nopython", True)
        disp = WhenCalledDispatcher(func, targetoptions=options)
        if cache:
            disp.enable_caching()
        disp.declaration = (signature, tuple(settings), width)
        disp.pending = True
        return disp

    return wrap


class CalledByName:
    """Calls from compiled code to ``callee``'s machine code through a symbol of its own,
    so that the callee's code is made once instead of once per caller.

    Numba links the code of every function a compiled function calls into the caller's
    own code library, optimises the whole again and generates machine code for all of it:
    the rung's micro-kernel and packing were compiled some ten times, once into each
    function that reached them (the serial loop nest, the small-product path, the parallel
    region and the three wrappers Numba makes around it, the threaded driver). That was
    two thirds of a cold compile (about 35 s for a float32 tile on a 2-vCPU Xeon). A call
    through this object instead declares an external function named :attr:`symbol` and
    calls it with Numba's own calling convention; the callee is compiled (or loaded) once,
    on its own, and its address is given that name in the JIT's symbol table before any
    caller is compiled or loaded (:meth:`WhenCalledDispatcher.ensure`). The name is derived
    from the generated module's name, which holds a hash of its source, and the callee's,
    so a caller loaded from the disk cache in another process finds the same name.

    The cost: the call is not inlined, which matters nothing for functions that each run
    for at least a whole block of the product.
    """

    def __init__(self, callee: WhenCalledDispatcher) -> None:
        from numba.core import cgutils
        from numba.core.extending import intrinsic

        if callee.declaration is None:
            raise TypeError(f"{callee!r} was not declared with njit_when_called")
        self.callee = callee
        func = callee.py_func
        self.symbol = f"tilegemm.{func.__module__}.{func.__qualname__}"
        sig = callee.declaration[0]
        symbol = self.symbol

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            fnty = context.call_conv.get_function_type(sig.return_type, sig.args)
            fn = cgutils.get_or_insert_function(builder.module, fnty, symbol)
            status, result = context.call_conv.call_function(builder, fn, sig.return_type,
                                                             sig.args, args)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return result

        def typer(typingctx: Any, *args: Any) -> Any:
            # A caller is being compiled: the callee must be in the symbol table before the
            # caller's code is linked (ensure() has done it already, unless the caller was
            # not found to reach this object, e.g. one rebuilt from a pickle).
            self.publish()
            # the declared signature: Numba casts each argument to it, as for the callee
            return sig, codegen

        typer.__name__ = f"call_{func.__name__}"
        # Numba folds a call's arguments by the typer's signature: one parameter each
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        typer.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(name, kind)
             for name in ("typingctx", *(f"arg{i}" for i in range(len(sig.args))))])
        self.call = intrinsic(typer)  # what compiled code calls
        self.call.by_name = self

    def publish(self) -> None:
        """Compile or load the callee, then give its machine code this object's name (in a
        worker compiling for another process, a stand-in address while the callee waits:
        see :mod:`~tilegemm.kernels.cpu._compile_workers`)."""
        from llvmlite import binding

        from tilegemm.kernels.cpu import _compile_workers

        if _compile_workers.IN_WORKER and self.callee.pending:
            if binding.address_of_symbol(self.symbol) is None:
                binding.add_symbol(self.symbol, _compile_workers.stand_in_address())
            return
        self.callee.ensure()
        (cres,) = self.callee.overloads.values()
        binding.add_symbol(self.symbol,
                           cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name))


def called_by_name(callee: WhenCalledDispatcher) -> Any:
    """What compiled code calls to run ``callee`` through a symbol of its own
    (:class:`CalledByName`): an intrinsic with the callee's declared signature."""
    return CalledByName(callee).call


def _reached_by_name(func: Callable, seen: set[int] | None = None) -> list[CalledByName]:
    """The :class:`CalledByName` callees that ``func``'s code reaches: those it calls, and
    those of the rung functions it calls, whose code is linked into its own."""
    seen = set() if seen is None else seen
    found: list[CalledByName] = []
    names = func.__globals__
    for name in _global_names(func.__code__):
        obj = names.get(name)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        by_name = getattr(obj, "by_name", None)
        if isinstance(by_name, CalledByName):
            found.append(by_name)
        elif isinstance(obj, WhenCalledDispatcher):
            found += _reached_by_name(obj.py_func, seen)
    return found


def _global_names(code: Any) -> Iterator[str]:
    """The names a code object and those nested in it (comprehensions) look up."""
    yield from code.co_names
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            yield from _global_names(const)


def load_compiled(functions: tuple[Any, ...], called_from_python: tuple[Any, ...]) -> None:
    """Compile or load what a module's callers need, when its module is imported.

    ``functions``: every function declared with :func:`njit_when_called`, callees before
    callers; ``called_from_python``: those that Python code calls, the first of them one
    that calls no compiled function (the probe). The probe is loaded (or compiled) now. If
    it came from the cache, the cache is warm and the others are left to load on their
    first call. If not, everything compiles now in the order given, as eager declarations
    would: a helper compiled inside its caller's compilation instead took about 7 % longer
    in all (float32 blocked rung, Zen 5), and a cold cache's compile belongs in the import
    that :mod:`tilegemm.compile_cache` reports, not in some later call. Where the machine
    has several CPUs, worker processes compile them into the disk cache first and this
    process loads them (:mod:`~tilegemm.kernels.cpu._compile_workers`). A damaged cache
    entry found later gives a warning and is compiled again (:class:`QuickLoadCache`).
    """
    probe = called_from_python[0]
    probe.ensure()
    if sum(probe.stats.cache_hits.values()) == 0:  # cold
        from tilegemm.kernels.cpu import _compile_workers

        if _compile_workers.IN_WORKER:
            return  # a worker compiling for another process: that one says what
        _compile_workers.compile_in_workers(functions)  # into the cache, where they load
        for f in functions:
            f.ensure()


def _after_fork_in_child() -> None:
    """A child forked while another thread of the parent held Numba's compiler lock (a
    rung function loading or compiling on its first call, say): that thread does not exist
    here and would never release it, so the child's first compile would wait for ever.
    The child gets a free lock instead (one held by the forking thread itself is kept)."""
    if held_by_a_lost_thread(global_compiler_lock._lock):
        global_compiler_lock._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# Ctrl-C during a compile. Python's own handler raises KeyboardInterrupt wherever Python
# is: inside one of llvmlite's callbacks from LLVM's code generator it is printed ("Exception
# ignored on calling ctypes callback function") and dropped, so Ctrl-C seemed ignored for the
# rest of a compile of up to 15 s (a tuner ran on for minutes); and between two of
# llvmlite's calls that hand an LLVM module over, it leaves the module owned twice, and the
# process crashes when both are freed (seen: a segmentation fault in Module._dispose). So
# while tilegemm compiles, Ctrl-C only notes the request, and the compile stops at the next
# boundary between Numba's compiler passes (at most a second or two), where every LLVM
# object has one owner. A second Ctrl-C stops at once, as before.
_stop_requested = False


def _note_interrupt(signum: int, frame: Any) -> None:
    global _stop_requested
    if _stop_requested:
        signal.default_int_handler(signum, frame)
    _stop_requested = True


def _stop_if_requested() -> None:
    global _stop_requested
    if _stop_requested:
        _stop_requested = False
        raise KeyboardInterrupt


class _StopBetweenPasses(event.Listener):
    """Raises the noted KeyboardInterrupt as a compiler pass starts or ends."""

    def on_start(self, ev: Any) -> None:
        _stop_if_requested()

    def on_end(self, ev: Any) -> None:
        _stop_if_requested()


event.register("numba:run_pass", _StopBetweenPasses())


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Around a compile or load: Ctrl-C stops it at a safe point (see above). Only in the
    main thread (where Python runs signal handlers), and only where SIGINT has Python's own
    handler: a handler the program installed is left alone."""
    global _stop_requested
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _stop_requested = False
    signal.signal(signal.SIGINT, _note_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stopped, _stop_requested = _stop_requested, False
    if stopped:  # after the last pass: the compile is whole, the interrupt still counts
        raise KeyboardInterrupt


@contextlib.contextmanager
def _linked_on_demand(codegen: Any, entry_points: tuple[str, ...]) -> Iterator[None]:
    """Libraries unserialised in this context read the LLVM IR kept for linking them into
    other code only when something links them.

    A cached library is its machine code plus the whole of its optimised IR as bitcode,
    which Numba parses as it loads, only to list the symbols the code defines and in case a
    function compiled later in the process calls this one and links its IR in. Calls made
    from compiled code go through symbols of their own here (:class:`CalledByName`) and
    tilegemm's callers are cached with their callees' code, so a warm process parses IR for
    nothing: 39 ms of a fresh process's first two calls (the ten libraries of a 64³ and a
    256³ float32 product) on a 2-vCPU AMD EPYC family 25 model 1. Here the library's code is
    loaded as Numba loads it, the two symbols looked up in it (``entry_points``: the
    function and its Python wrapper) are recorded as defined, and the bitcode is parsed,
    and all its symbols recorded, the first time the library is linked (or cached again).
    Entered with Numba's compiler lock held.
    """

    def unserialize_library(serialized: tuple[str, str, Any]) -> Any:
        name, kind, data = serialized
        if kind != "object":
            return type(codegen).unserialize_library(codegen, serialized)
        object_code, shared_bitcode = data
        library = codegen.create_library(name)
        library.enable_object_caching()
        library._set_compiled_object(object_code)

        def module_for_linking() -> Any:
            if library._shared_module is None:
                library._shared_module = llvm.parse_bitcode(shared_bitcode)
                codegen._engine._load_defined_symbols(library._shared_module)
            return library._shared_module

        library._get_module_for_linking = module_for_linking  # (Numba's reads it lazily)
        library._finalize_final_module()
        codegen._engine._defined_symbols.update(entry_points)
        return library

    codegen.unserialize_library = unserialize_library
    try:
        yield
    finally:
        del codegen.unserialize_library


def _start_runtime(target_context: Any, where: Callable[[], Path]) -> None:
    """Start Numba's runtime (reference counting, which cached code calls), with its
    compiled part kept at ``where()`` (asked only if the runtime is not started yet):
    beside the cache entry of the module loading, whose key (Numba's version, the CPU and
    the features compiled for) is also this code's.

    Numba compiles that part, a few functions of LLVM IR, in every process: 25-30 ms of a
    fresh process's first call on a 2-vCPU AMD EPYC family 25 model 1, where loading it
    takes a few. A file that is missing, damaged or unreadable is compiled as Numba does
    and written again (a damaged one with a warning); one that cannot be written is not
    kept.
    """
    if rtsys._init:
        return
    path = where()
    numbas_own = nrtdynmod.compile_nrt_functions

    def kept(ctx: Any) -> Any:
        codegen = ctx.codegen()
        try:
            raw = path.read_bytes()
        except OSError:
            pass
        else:
            try:
                return codegen.unserialize_library(("nrt", "object", _unframed(raw)))
            except Exception as exc:  # noqa: BLE001 - damaged: compile instead
                warnings.warn(f"kernel cache entry {path} could not be loaded "
                              f"({type(exc).__name__}: {exc}); compiling it again",
                              CompileCacheWarning, stacklevel=user_stacklevel())
        ir_module, library = nrtdynmod.create_nrt_module(ctx)
        library.enable_object_caching()  # (what numbas_own does, with the code kept)
        library.add_ir_module(ir_module)
        library.finalize()
        with contextlib.suppress(OSError):
            write_atomic(path, _framed(library.serialize_using_object_code()[2]))
        return library

    nrtdynmod.compile_nrt_functions = kept
    try:
        rtsys.initialize(target_context)
    finally:
        nrtdynmod.compile_nrt_functions = numbas_own


_RUNTIME_MAGIC = b"tilegemm-nrt-sha256\n"


def _framed(code: tuple[bytes, bytes]) -> bytes:
    """Machine code and bitcode as one file, with the SHA-256 of both."""
    return _signed(_RUNTIME_MAGIC, len(code[0]).to_bytes(8, "little") + code[0] + code[1])


def _unframed(raw: bytes) -> tuple[bytes, bytes]:
    """:func:`_framed`'s parts, or ValueError where the file is not whole."""
    blob = _verified(_RUNTIME_MAGIC, raw)
    size = int.from_bytes(blob[:8], "little")
    return blob[8:8 + size], blob[8 + size:]


def _signed(magic: bytes, blob: bytes) -> bytes:
    """A file's contents: ``magic``, the SHA-256 of ``blob``, ``blob``."""
    return magic + hashlib.sha256(blob).digest() + blob


def _verified(magic: bytes, raw: bytes) -> bytes:
    """The blob of :func:`_signed` file contents, or ValueError where they are not whole."""
    head = len(magic)
    digest, blob = raw[head:head + 32], raw[head + 32:]
    if raw[:head] != magic or hashlib.sha256(blob).digest() != digest:
        raise ValueError("its contents differ from the checksum written with them")
    return blob


class _BesideTheSource(CompileResultCacheImpl):
    """Numba's cache of one function, always in the ``__pycache__`` beside its source:
    with ``NUMBA_CACHE_DIR`` set Numba would keep it there instead, where `tilegemm
    cache` neither counts nor clears it (and a cleared entry's code was loaded again)."""

    _locator_classes = [InTreeCacheLocator]


class _CheckedCacheFile(IndexDataCacheFile):
    """Numba's index and data files of one function, each data file (the compiled machine
    code) written with the SHA-256 of its contents and checked against it before loading.

    Numba unpickles a data file and links the machine code in it: a file damaged in place,
    its size unchanged (a bad disk block, a partial overwrite), unpickled and linked, and
    the process crashed (a segmentation fault in every later process, with no warning).
    A file whose digest differs now raises, so :class:`QuickLoadCache` warns, compiles the
    function again and rewrites the entry."""

    MAGIC = b"tilegemm-sha256\n"

    def _save_data(self, name: str, data: Any) -> None:
        blob = self._dump(data)
        with self._open_for_write(self._data_path(name)) as f:
            f.write(_signed(self.MAGIC, blob))

    def _load_data(self, name: str) -> Any:
        with open(self._data_path(name), "rb") as f:
            raw = f.read()
        return pickle.loads(_verified(self.MAGIC, raw))


@contextlib.contextmanager
def _environments_unimported() -> Iterator[None]:
    """Unpickling in this context rebuilds Numba's environments with :func:`_environment`
    (the pickles name ``numba.core.environment._rebuild_env``, looked up as they load; some
    are nested in Numba's own pickles, beyond the reach of an unpickler of ours). Entered
    with Numba's compiler lock held, as every load and compile in the process is."""
    environment._rebuild_env = _environment
    try:
        yield
    finally:
        environment._rebuild_env = _numba_rebuild_env


_numba_rebuild_env = environment._rebuild_env


def _environment(modname: str, consts: list, env_name: str) -> Environment:
    """Numba's ``_rebuild_env`` without importing the module that the environment belongs to,
    where it is not imported yet.

    An environment holds the globals of the Python module a compiled function came from,
    which only code compiled in object mode reads (``pylowering``); a nopython function's
    environment is its constants. The machine code of ``np.empty`` in a cached function
    carries the environment of Numba's implementation, in ``numba.np.arrayobj``, and
    rebuilding it imported that module and the string types it imports: 35-50 ms of a fresh
    process's first call (of 0.65 s) on a 2-vCPU AMD EPYC family 25 model 1, where nothing
    else needs them. Its globals are then a dictionary that only names the module, which
    is all Numba reads of them when a function referring to it is cached again.
    """
    env = lookup_environment(env_name)
    if env is not None:
        return env
    module = sys.modules.get(modname)
    env = Environment(module.__dict__ if module is not None else {"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    Environment._memo[env_name] = env
    return env


class QuickLoadCache(FunctionCache):
    """Numba's on-disk cache of one function, loading without the registry set-up.

    Numba's own ``load_overload`` first refreshes the target context: it imports every
    module of implementations Numba can compile (lists, dicts, random numbers, ...) and
    registers them, about 60 ms the first time in a process, the largest part of a
    first call with a warm cache after importing Numba itself. Loading machine code needs
    none of that, only Numba's runtime (reference counting, which the cached code calls),
    which is initialised here; a compilation refreshes the context itself first.

    An entry that cannot be loaded (a truncated or damaged file, one whose checksum does not
    match, an index written by another process mid-way) gives a
    :class:`~tilegemm.compile_cache.CompileCacheWarning` and counts as absent: its index is
    emptied (Numba would fail to read it again when saving), the function is compiled again
    and its entry rewritten. At import
    :mod:`tilegemm.compile_cache` handles damage the same way for the whole module; this
    covers functions loaded later, on their first call.
    """

    _impl_class = _BesideTheSource

    def __init__(self, py_func: Any) -> None:
        super().__init__(py_func)
        self._cache_file = _CheckedCacheFile(  # as Numba makes it, with the checksums
            cache_path=self._cache_path, filename_base=self._impl.filename_base,
            source_stamp=self._impl.locator.get_source_stamp())

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        _start_runtime(target_context, self._runtime_path)
        try:
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception as exc:  # noqa: BLE001 - any damage: compile instead
            self._remove_folders_in_the_way()
            with contextlib.suppress(OSError):  # unwritable: the compile is just not kept
                self.flush()  # an empty index, written whole (Numba's own)
            func = self._py_func
            warnings.warn(f"kernel cache entry of {func.__module__}.{func.__qualname__} "
                          f"(in {self._cache_path}) could not be loaded "
                          f"({type(exc).__name__}: {exc}); compiling it again",
                          CompileCacheWarning, stacklevel=user_stacklevel())
            return None

    def _load_overload(self, sig: Any, target_context: Any) -> Any:
        """Numba's, with environments rebuilt without importing their modules
        (:func:`_environment`) and the library's code for linking read only if it is ever
        linked (:func:`_linked_on_demand`)."""
        if not self._enabled:
            return None
        codegen = target_context.codegen()
        with _environments_unimported():
            data = self._cache_file.load(self._index_key(sig, codegen))
            if data is None:
                return None
            fndesc = data[1]  # (library, function descriptor, ...): CompileResult._reduce
            with _linked_on_demand(codegen, (fndesc.llvm_func_name,
                                             fndesc.llvm_cpython_wrapper_name)):
                return self._impl.rebuild(target_context, data)

    def _runtime_path(self) -> Path:
        """Where :func:`_start_runtime` keeps Numba's runtime functions: beside this
        function's entry, named for its module."""
        module = Path(self._py_func.__code__.co_filename).stem
        return Path(self._cache_path) / f"{module}.nrt.bin"

    def _remove_folders_in_the_way(self) -> None:
        """Delete a directory standing where this function's index or data files go:
        Numba can neither read nor replace it, so every process warned and compiled
        again, for ever."""
        index = Path(self._cache_file._index_path)
        for path in (index, *index.parent.glob(f"{glob.escape(index.stem)}.*.nbc")):
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    shutil.rmtree(path)

    def save_overload(self, sig: Any, data: Any) -> None:
        """Numba's save, made harmless: a disk that is full, or a cache folder removed or
        replaced while the function compiled, leaves the compiled code unkept (with a
        warning) instead of failing the call that compiled it. A directory where a data
        file goes is removed and the save tried once more."""
        try:
            try:
                super().save_overload(sig, data)
            except IsADirectoryError:
                self._remove_folders_in_the_way()
                super().save_overload(sig, data)
        except Exception as exc:  # noqa: BLE001 - the code is compiled; only keeping failed
            func = self._py_func
            warnings.warn(f"kernel cache: the compiled {func.__module__}.{func.__qualname__} "
                          f"could not be kept in {self._cache_path} "
                          f"({type(exc).__name__}: {exc}); this process runs it uncached",
                          CompileCacheWarning, stacklevel=user_stacklevel())


class WhenCalledDispatcher(CPUDispatcher):
    """A CPU dispatcher holding one declared signature until something needs it.

    Constructed as Numba's own; :func:`njit_when_called` sets :attr:`declaration`
    (signature, settings, vector width) and :attr:`pending`. A pickled one comes back
    pending, with its declaration, and compiles (or loads) under the same settings.
    """

    # (signature, settings, vector width), kept after compiling (pickling carries it)
    declaration: tuple[Any, tuple[Callable[[], AbstractContextManager], ...],
                       int | None] | None = None
    pending = False  # declared and not compiled yet
    # called with the dispatcher once it has compiled or loaded its signature
    # (tilegemm.compile_cache counts loads and compilations with it)
    on_ready: Callable[[WhenCalledDispatcher], None] | None = None

    def enable_caching(self) -> None:
        self._cache = QuickLoadCache(self.py_func)

    def typeof_pyval(self, val: Any) -> Any:
        """The Numba type of an argument the dispatcher's own code has not seen the kind of
        before (Numba's, which it calls, caches the answer per kind of array).

        Numba's first asks whether the array is a NumPy masked array, and that question
        imports ``numpy.ma``: 20-30 ms of a fresh process's first call on a 2-vCPU AMD EPYC
        family 25 model 1, for a module nothing else there uses. An argument whose type is
        ``numpy.ndarray`` itself is not masked; its type is worked out as Numba does."""
        if type(val) is np.ndarray:
            try:
                dtype = numpy_support.from_dtype(val.dtype)
            except errors.NumbaNotImplementedError:
                pass  # Numba's own raises the error it gives
            else:
                tp = types.Array(dtype, val.ndim, numpy_support.map_layout(val),
                                 readonly=not val.flags.writeable)
                self._types_active_call.add(tp)
                return tp
        return super().typeof_pyval(val)

    def _settings(self) -> ExitStack:
        """The declared settings, entered (the caller closes the returned stack)."""
        _, settings, width = self.declaration
        with ExitStack() as stack:  # a setting that fails leaves none of the others entered
            for factory in settings:
                stack.enter_context(factory())
            stack.enter_context(vector_width(width))
            return stack.pop_all()

    def ensure(self) -> None:
        """Compile (or load) the declared signature, then allow no other, as
        ``njit(signature)`` does."""
        if not self.pending:
            return
        # the settings' lock first, then Numba's: the order every compilation takes them in
        with interruptible(), self._settings(), global_compiler_lock:
            if not self.pending:  # another thread did it meanwhile
                return
            for callee in _reached_by_name(self.py_func):  # before this code is linked
                callee.publish()
            with typeinfer.register_dispatcher(self):
                self.compile(self.declaration[0])
            self.disable_compile()
            self.pending = False
            for cres in self.overloads.values():
                # Code loaded from Numba's cache comes back in a library that has forgotten
                # what must run before it is used (for a parallel function, starting the
                # threading layer that provides symbols such as ``allocate_sched``); a
                # caller compiled against it then inherits nothing and is cached so, and a
                # later process that loads only that caller aborts in LLVM ("Symbol not
                # found"). Give the library back its list, which the cache did keep.
                cres.library._reload_init.update(cres.reload_init or ())
            if self.on_ready is not None:
                self.on_ready(self)

    def get_call_template(self, args: Any, kws: Any) -> Any:
        # a caller being compiled: from here on this is an eager dispatcher
        self.ensure()
        return super().get_call_template(args, kws)

    def _compile_for_args(self, *args: Any, **kws: Any) -> Any:
        # A call from Python that matched no compiled signature: compile (or load) the
        # declared one, then hand the call back to the dispatcher, which runs it, or, if
        # the arguments do not match it, raises Numba's TypeError, as njit(signature) does.
        # (Also when another thread got here first: compiling is disabled by then.)
        if self.declaration is None:
            return super()._compile_for_args(*args, **kws)
        self.ensure()
        return self

    def _reduce_states(self) -> dict[str, Any]:
        states = super()._reduce_states()
        if self.declaration is not None:  # comes back pending: compiled under its settings
            states.update(can_compile=True, sigs=[], declaration=self.declaration)
        return states

    @classmethod
    def _rebuild(cls, uuid: str, py_func: Callable, locals: dict, targetoptions: dict,
                 can_compile: bool, sigs: list, declaration: Any = None) -> Any:
        self = super()._rebuild(uuid, py_func, locals, targetoptions, can_compile, sigs)
        if declaration is not None and self.declaration is None:  # not this process's own
            self.declaration, self.pending = declaration, True
        return self
