"""Compiled helpers that are compiled (or loaded from the disk cache) only when needed.

The blocked rung is about twenty compiled functions, and ``numba.njit(signature)``
compiles each one eagerly: with a warm disk cache, every one of them is still loaded
(unpickled and linked into the JIT) when the rung's module is imported. But the functions
that only other compiled functions call (the micro-kernel, packing, the loop nest) are never
needed in a process whose callers come from the cache: a caller's cached machine code
already holds the code of everything it calls. Loading them anyway cost about a fifth of
the first call in a fresh process (about 55 of 250 ms on a 2-vCPU Zen 5).

:func:`njit_when_called` declares such a helper with the same explicit signature: nothing
is compiled until a caller that is itself being compiled asks for it (a cold or stale
cache), and then exactly the declared signature is compiled, under the code-generation
settings that were in force where the helper was declared (the SLP vectoriser for the
micro-kernel, the vector width for all), as the eager decorator would have.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any


def njit_when_called(signature: Any, *, settings: tuple[Callable[[], AbstractContextManager],
                                                        ...] = (),
                     **flags: Any) -> Callable[[Callable], Any]:
    """Like ``numba.njit(signature, **flags)``, but compiled on first use.

    ``settings``: context-manager factories entered around the compilation (e.g.
    ``slp_enabled``); the vector width in force at declaration is kept as well.
    A call from Python compiles it too (a helper can be called directly in tests).
    """
    from tilegemm.kernels.cpu._slp import current_vector_width, vector_width

    width = current_vector_width()

    def entered() -> ExitStack:
        stack = ExitStack()
        stack.enter_context(vector_width(width))
        for factory in settings:
            stack.enter_context(factory())
        return stack

    def wrap(func: Callable) -> Any:
        return _lazy_dispatcher_class()(signature, entered, func, flags)

    return wrap


def load_compiled(functions: tuple[Any, ...], called_from_python: tuple[Any, ...]) -> None:
    """Compile or load what a module's callers need, when its module is imported.

    ``functions``: every function declared with :func:`njit_when_called`, callees before
    callers; ``called_from_python``: those that Python code calls, the first of them one
    that calls no compiled function (the probe). With a warm cache only those are loaded.
    With a cold one (the probe was compiled, not loaded) everything compiles in the order
    given, as eager declarations would: a helper compiled inside its caller's compilation
    instead took about 7 % longer in all (float32 blocked rung, Zen 5). Failures (a damaged
    cache entry) surface here, at import, where :mod:`tilegemm.compile_cache` handles them.
    """
    probe = called_from_python[0]
    probe._ensure()
    cold = sum(probe.stats.cache_hits.values()) == 0
    for f in functions if cold else called_from_python:
        f._ensure()


_CLASS: list[type] = []


def _lazy_dispatcher_class() -> type:
    """The dispatcher subclass, defined on first use (importing this module imports no
    Numba)."""
    if _CLASS:
        return _CLASS[0]
    from numba.core import typeinfer
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import CPUDispatcher

    class WhenCalledDispatcher(CPUDispatcher):
        """A CPU dispatcher holding one declared signature until something needs it."""

        def __init__(self, signature: Any, entered: Callable[[], ExitStack], func: Callable,
                     flags: dict[str, Any]) -> None:
            flags = dict(flags)
            cache = flags.pop("cache", False)
            flags.setdefault("nopython", True)
            super().__init__(py_func=func, locals={}, targetoptions=flags)
            if cache:
                self.enable_caching()
            self._declared = (signature, entered)

        def _ensure(self) -> None:
            """Compile (or load) the declared signature, then allow no other, as
            ``njit(signature)`` does."""
            if self._declared is None:
                return
            with global_compiler_lock:
                if self._declared is None:  # another thread did it meanwhile
                    return
                signature, entered = self._declared
                with entered(), typeinfer.register_dispatcher(self):
                    self.compile(signature)
                self.disable_compile()
                self._declared = None

        def get_call_template(self, args: Any, kws: Any) -> Any:
            # a caller being compiled: from here on this is an eager dispatcher
            self._ensure()
            return super().get_call_template(args, kws)

        def _compile_for_args(self, *args: Any, **kws: Any) -> Any:
            # a call from Python before anything compiled it: compile, then let the
            # dispatcher match the arguments against the declared signature
            self._ensure()
            return self

    _CLASS.append(WhenCalledDispatcher)
    return WhenCalledDispatcher
