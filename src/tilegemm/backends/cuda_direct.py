"""Repeated products on CuPy or PyTorch arrays, launched without numba's array objects.

A call such as ``tilegemm.matmul(a, b)`` on PyTorch tensors took 0.35–0.93 ms of host
time on an H100 machine (``benchmarks/results/logs-nvidia-h100-2026-11-26e``), against
16–27 µs for cuBLAS's whole call: more than the GPU needs for a 4096³ FP16 product, so a
loop of such calls ran at the host's pace. That time was spread over describing the
operands (PyTorch builds its ``__cuda_array_interface__`` dict in Python, and it was read
about twelve times a call), wrapping each tensor and the result as a numba device array
(each wrap entering numba's context checks), choosing the stream, and numba's launch.

:func:`device_program` gives what a later call of the same case needs, once the full
path has run it: the compiled program, the (batch or 1, rows, cols) layout of each
operand as the rung reads it, alpha and beta, the result's shape and dtype, the context
it ran in. A call of that case then reads each operand's address (``data_ptr()``, CuPy's
``data.ptr``), allocates the result from the operands' own library on its current stream
(as the full path does), and launches the program on :class:`DeviceView` s of that
memory, on the library's current stream. The case is keyed by each operand's own
attributes (dtype, shape, strides, device: :func:`torch_key`, :func:`cupy_key`), which
:mod:`tilegemm.fastpath_device` looks up before anything else is read.

Only plain cases qualify: CuPy or PyTorch operands of one library and of the product's
dtype (no conversion), batches that are full or absent (no broadcast), operands that are
viewed as (batch or 1, rows, cols) without a copy, a program launched through numba
kernels (not the CUDA C rungs). A call finds the case's conditions again or takes the
full path: another context current on the calling thread (another device, or a thread
numba has not set up). Under ``TILEGEMM_POISON`` the result is filled with NaN first, by
its library on the same stream, as the full path does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilegemm.backends.base import poison_value
from tilegemm.backends.cuda import _nocopy_strides, _numba_dtype, _source_library
from tilegemm.backends.cuda_launch import DeviceView, contiguity, driver
from tilegemm.problem import _c_strides

_STREAMS_KEPT = 8  # numba stream objects a program keeps, by handle


def torch_key(x: Any) -> tuple[Any, ...]:
    """What a remembered case of PyTorch tensor ``x`` depends on, read from the tensor's own
    attributes (its ``__cuda_array_interface__`` is built in Python on every read)."""
    return (x.dtype, x.shape, x.stride(), x.device, x.requires_grad)


def cupy_key(x: Any) -> tuple[Any, ...]:
    """What a remembered case of CuPy array ``x`` depends on (see :func:`torch_key`)."""
    return (x.dtype, x.shape, x.strides, x.device.id)


def _torch_stream(device: Any) -> Callable[[], int]:
    """The handle of PyTorch's current stream on ``device``, read as cheaply as PyTorch
    allows (its raw-stream query, else ``torch.cuda.current_stream``)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: int(raw(index))
    return lambda: int(torch.cuda.current_stream(device).cuda_stream)


def _cupy_stream() -> int:
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


def _operand_view(shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype,
                  new: tuple[int, ...], squeeze: str) -> tuple[tuple[int, ...], dict] | None:
    """Byte strides and numba's contiguity flags of an operand of ``shape`` and byte
    ``strides`` viewed as ``new`` = (batch or 1, rows, cols) without a copy, or None.
    ``squeeze``: "row" for a vector taken as a (1, K) row, "col" as a (K, 1) column."""
    if squeeze == "row":
        shape, strides = (1,) + shape, (shape[0] * strides[0],) + strides
    elif squeeze == "col":
        shape, strides = shape + (1,), strides + (strides[0],)
    viewed = _nocopy_strides(shape, strides, dtype, new)
    if viewed is None:
        return None
    return viewed, contiguity(new, viewed, dtype.itemsize)


class DirectProgram:
    """``program(a, b, poison)``: the product of a remembered case, or None where this call
    must take the full path (its conditions are not met now; nothing was launched).
    ``poison``: fill the result with NaN before the launch, as the full path does under
    ``TILEGEMM_POISON``.
    ``key_of(x)``: the key of an operand of such calls (its library's: :func:`torch_key`,
    :func:`cupy_key`)."""

    def __init__(self, program: Any, lib: str, layouts: tuple[Any, Any],
                 result_shape: tuple[int, ...], shape3: tuple[int, int, int],
                 store: np.dtype, alpha: Any, beta: Any, context: int, like: Any) -> None:
        self.program = program
        self.layouts = layouts  # per operand: (3-D shape, byte strides, flags, dtype)
        kernel_dtype = _numba_dtype(store)
        strides3 = _c_strides(shape3, kernel_dtype.itemsize)
        self.result_view = (shape3, strides3, kernel_dtype,
                            contiguity(shape3, strides3, kernel_dtype.itemsize))
        self.alpha, self.beta = alpha, beta
        self.poison = poison_value(store)
        self.context = context
        self.streams: dict[int, Any] = {}
        if lib == "torch":
            import torch

            device = like.device
            torch_dtype = getattr(torch, store.name)
            self.key_of: Callable[[Any], tuple[Any, ...]] = torch_key
            self.address: Callable[[Any], int] = _torch_address
            self.empty: Callable[[], Any] = lambda: torch.empty(
                result_shape, dtype=torch_dtype, device=device)
            self.stream: Callable[[], int] = _torch_stream(device)
            self.fill: Callable[[Any, Any], Any] = lambda x, v: x.fill_(float(v))
        else:
            import cupy

            self.key_of = cupy_key
            self.address = _cupy_address
            self.empty = lambda: cupy.empty(result_shape, dtype=store)
            self.stream = _cupy_stream
            self.fill = lambda x, v: x.fill(v)

    def __call__(self, a: Any, b: Any, poison: bool = False) -> Any:
        drv = driver()
        if drv is None or drv.context() != self.context:
            return None
        handle = self.stream()
        stream = self.streams.get(handle)
        if stream is None:
            stream = self._numba_stream(handle)
        (sa, ta, fa, da), (sb, tb, fb, db) = self.layouts
        A = DeviceView(self.address(a), sa, ta, da, fa)  # noqa: N806 - the rungs' names
        B = DeviceView(self.address(b), sb, tb, db, fb)  # noqa: N806
        result = self.empty()
        if poison:  # NaN first, on the same stream: a result the rung leaves unwritten shows
            self.fill(result, self.poison)
        shape3, strides3, dtype3, flags3 = self.result_view
        C = DeviceView(self.address(result), shape3, strides3, dtype3, flags3)  # noqa: N806
        self.program.launch(A, B, C, self.alpha, self.beta, stream=stream)
        return result

    def _numba_stream(self, handle: int) -> Any:
        """numba's stream object for ``handle``, kept (numba makes a new one each time)."""
        from tilegemm.backends.cuda_stream import numba_stream

        stream = numba_stream(("handle", handle))
        if len(self.streams) >= _STREAMS_KEPT:
            self.streams.clear()
        self.streams[handle] = stream
        return stream


def _torch_address(x: Any) -> int:
    return int(x.data_ptr())


def _cupy_address(x: Any) -> int:
    return int(x.data.ptr)


def device_program(program: Any, prob: Any, ops: tuple[Any, Any], alpha: Any,
                   beta: Any) -> DirectProgram | None:
    """What later calls of the plain case ``prob`` on device operands ``ops`` (described
    :class:`~tilegemm.problem.Operand` s) may run directly, or None where they must take
    the full path. Called right after the full path ran ``program`` for it, in the context
    it ran in; ``alpha`` and ``beta`` as that path gave them to the program."""
    from tilegemm import simulator
    from tilegemm.backends.cuda_program import CudaProgram

    if simulator.enabled() or prob.empty or driver() is None:
        return None
    if not isinstance(program, CudaProgram):
        return None  # (a CUDA C rung's launch reads the interface itself)
    libs = {_source_library(op.obj) for op in ops}
    if len(libs) != 1 or not libs <= {"torch", "cupy"}:
        return None
    if prob.trans_a or prob.trans_b or prob.store_dtype != prob.dtype:
        return None
    layouts = []
    for op, which in zip(ops, "ab"):
        mode = prob.batch_mode(which)
        if op.dtype != prob.dtype or op.strides is None or mode not in ("single", "full"):
            return None
        rows, cols = (prob.m, prob.k) if which == "a" else (prob.k, prob.n)
        new = (1 if mode == "single" else prob.batch, rows, cols)
        squeeze = ("row" if which == "a" and prob.squeeze_m
                   else "col" if which == "b" and prob.squeeze_n else "")
        kernel_dtype = _numba_dtype(op.dtype)
        view = _operand_view(tuple(op.shape), tuple(op.strides), kernel_dtype, new, squeeze)
        if view is None:
            return None
        layouts.append((new, view[0], view[1], kernel_dtype))
    context = driver().context()
    if not context:
        return None
    return DirectProgram(program, libs.pop(), (layouts[0], layouts[1]), prob.out_shape,
                         (prob.batch, prob.m, prob.n), prob.store_dtype, alpha, beta,
                         context, ops[0].obj)
