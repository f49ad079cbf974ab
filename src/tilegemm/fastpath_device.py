"""Repeated products of device arrays without re-deciding what an earlier call decided.

A host product's decision is remembered with everything its call derives from it
(:mod:`tilegemm.fastpath`); on device arrays the decision alone is, or the program a
backend gives for launching directly. Both are made again when the tuning results they
read change (:mod:`tilegemm.remembered`).

**The decision.** A plain call on device arrays (pyopencl arrays; numba, CuPy or PyTorch
CUDA arrays) remembers the decision alone: which backend, device, rung and parameters, and
the problem as that backend computes it, keyed by the ``kernel``/``backend`` strings, the
parameters given, and each operand's array type, shape, dtype, byte strides and, where the
device is chosen by it, the device the array lives on (``Backend.array_place``). The next
call with the same key still describes its operands (the checks that depend on the array
object itself, such as a pyopencl offset inside an element, run on every call) and runs
through the backend's ``run``, with every per-call check there, but skips NumPy's dtype
rules, the backend and rung choice, the tuned-parameter look-up and the limit checks. On
PoCL (Xeon family 6 model 167) an 8×8×8 float32 product on pyopencl arrays took about
270 µs a call on the full path, of which about 100 µs was that decision. What qualifies:
no ``device``, ``stream``, ``precision`` or ``dtype``; ``out`` and gemm's ``c`` may be
given when each is an array of the operands' kind (its type, shape, dtype, strides and
device are then part of the key, and whether ``out`` overlaps an operand is seen on every
call, by ``run``), and gemm's transpose flags are part of the key. alpha and beta are not:
the decision does not depend on them, and ``run`` checks and converts each call's (a
repeated ``gemm(a, b, c, alpha=0.5, beta=1.0)`` on pyopencl arrays took 250 µs a call at
8³, 160 with the decision remembered; ``out=c`` 197 → 108; Xeon family 6 model 207,
PoCL 3.0).

**Launched directly.** A backend may give more than the decision for a
plain call without ``out``: a program that takes the caller's arrays of that case
(``Backend.device_program``; the CUDA backend's, for CuPy and PyTorch arrays, launches on
views of their memory: ``backends/cuda_direct``). Such a case is keyed by the program's
own reading of each operand's attributes (``key_of``: for PyTorch its dtype, shape,
strides, device and ``requires_grad``), with no ``describe`` at all, and checked before
anything else a call reads. On an H100's host a ``matmul`` on PyTorch tensors took
86–121 µs this way, against 548–948 with the decision alone (2026-11-26,
``benchmarks/results/logs-nvidia-h100-2026-11-26f``). The program may still decline a
call (another context current on the thread), which then takes the path above.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from tilegemm.remembered import POISON_OFF, enter, forget, given, poison, stale, table

_decisions: dict[tuple[Any, ...], Any] = table({})  # api.Decision by device_key
# a backend's device_program by _direct_key; the key function of each array type such a
# program was remembered for
_direct: dict[tuple[Any, ...], Any] = table({})
_keyers: dict[type, Callable[[Any], Any]] = {}


def device_key(ops: Any, kernel: Any, backend: Any,
               params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
    """The key of a decision for the described arrays ``ops`` (a, b, and gemm's ``c`` and
    the call's ``out`` where given, all device arrays of one kind) with these ``kernel=``
    and ``backend=`` arguments and rung parameters, or None when such a call is never
    remembered."""
    if type(kernel) is not str or type(backend) is not str:
        return None
    kind = ops[0].kind
    if kind == "host" or any(op.kind != kind or op.strides is None for op in ops):
        return None  # host operands have their own table; mixed kinds are refused later
    named = given(params)
    if named is None:
        return None
    owner = _owner(kind)
    return (kernel, backend, named) + tuple(
        (type(op.obj), op.shape, op.dtype, op.strides, owner.array_place(op.obj))
        for op in ops)


@cache
def _owner(kind: str) -> Any:
    """The backend whose device arrays are of ``kind`` (the first registered)."""
    from tilegemm.backends import ARRAY_KINDS, get_backend

    return get_backend(next(n for n, k in ARRAY_KINDS.items() if k == kind))


def remembered_decision(key: tuple[Any, ...] | None) -> Any:
    """The decision remembered for ``key`` (:func:`device_key`), or None."""
    if key is None:
        return None
    chosen = _decisions.get(key)
    if chosen is None:
        return None
    if stale():
        forget()
        return None
    return chosen


def remember_decision(key: tuple[Any, ...], chosen: Any, tuning_cache: str | None,
                      tuning_mtime: int | None) -> None:
    """Record the decision ``chosen`` the full path just ran for ``key``, made under the
    tuning cache file ``tuning_cache`` as it was (modification time ``tuning_mtime``)
    before deciding; see :func:`remember`."""
    enter(tuning_cache, tuning_mtime, _decisions)
    _decisions[key] = chosen


def _direct_key(a: Any, b: Any, kernel: Any, backend: Any, params: dict[str, Any] | None,
                keyer: Callable[[Any], Any]) -> tuple[Any, ...] | None:
    """The key of a directly launched device case, or None when it has none."""
    if type(b) is not type(a) or type(kernel) is not str or type(backend) is not str:
        return None
    named = given(params)
    if named is None:
        return None
    ka, kb = keyer(a), keyer(b)
    if ka is None or kb is None:
        return None
    return (kernel, backend, named, type(a), ka, kb)


def try_remembered_device(a: Any, b: Any, kernel: Any, backend: Any,
                          params: dict[str, Any] | None = None) -> Any:
    """The product ``a @ b`` of device arrays, launched directly by the program a backend
    gave for an earlier plain call of the same case (``Backend.device_program``), or None
    (nothing launched): no such case, or the program found its conditions unmet."""
    keyer = _keyers.get(type(a))
    if keyer is None:
        return None
    key = _direct_key(a, b, kernel, backend, params, keyer)
    program = None if key is None else _direct.get(key)
    if program is None:
        return None
    if stale():
        forget()
        return None
    return program(a, b, poison() not in POISON_OFF)


def remember_device(a: Any, b: Any, make_program: Callable[[], Any],
                    tuning_cache: str | None, tuning_mtime: int | None, *, kernel: Any,
                    backend: Any, params: dict[str, Any] | None = None) -> None:
    """Record the program ``make_program()`` gives (the backend's ``device_program``, or
    None) for later plain calls like ``matmul(a, b, kernel=kernel, backend=backend,
    **params)`` on device arrays, made under the tuning cache file as it was (see
    :func:`remember`)."""
    program = make_program()
    if program is None:
        return
    key = _direct_key(a, b, kernel, backend, params, program.key_of)
    if key is None:
        return
    enter(tuning_cache, tuning_mtime, _direct)
    _direct[key] = program
    _keyers[type(a)] = program.key_of
