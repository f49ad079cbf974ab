"""Which CUDA stream a product runs on: the caller's, so results are ordered with their work.

CUDA work on one stream runs in order; work on two streams does not. If a CuPy or PyTorch
user's arrays were produced on a stream of theirs and we launched on the default stream, our
kernel could read A before it was written, or their next kernel could read C before ours
finished. So, unless ``stream=`` says otherwise, every copy, the launch and the result
belong to the stream the caller's own library would use now:

- CuPy arrays: ``cupy.cuda.get_current_stream()``;
- PyTorch tensors: ``torch.cuda.current_stream(tensor.device)``;
- numba device arrays: the stream the array was created with (``DeviceNDArray.stream``);
- any other ``__cuda_array_interface__`` object (version 3): its ``stream`` field;
- host arrays only: the default stream (the call then waits for its result anyway).

``stream=`` accepts a numba stream, a CuPy stream, a PyTorch stream, anything with a
``__cuda_stream__`` protocol method, or an integer handle (0 the default stream, 1 the
legacy default stream, 2 the per-thread default stream, otherwise a ``cudaStream_t``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tilegemm.errors import InvalidTypeError

# Stream handles with a fixed meaning in the CUDA Array Interface (version 3).
LEGACY_DEFAULT = 1
PER_THREAD_DEFAULT = 2


def _library(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def describe_stream(stream: Any) -> tuple[str, Any]:
    """Classify an explicit ``stream=`` argument: ("numba", stream) or ("handle", int).

    Raises a TypeError naming what is accepted for anything else, before any work is done.
    """
    if isinstance(stream, bool):
        raise InvalidTypeError(f"stream={stream!r} is not a CUDA stream")
    if isinstance(stream, int):
        if stream < 0:
            raise InvalidTypeError(f"stream={stream} is not a CUDA stream handle (must be >= 0)")
        return ("handle", stream)
    if (_library(stream) == "numba" and type(stream).__name__ in ("Stream", "stream")
            and callable(getattr(stream, "synchronize", None))):
        return ("numba", stream)  # a numba Stream (or the simulator's stand-in)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
        return ("handle", int(stream.__cuda_stream__()[1]))
    if _library(stream) == "cupy" and hasattr(stream, "ptr"):
        return ("handle", int(stream.ptr))
    if _library(stream) == "torch" and hasattr(stream, "cuda_stream"):
        return ("handle", int(stream.cuda_stream))
    raise InvalidTypeError(
        f"stream= must be a numba, CuPy or PyTorch CUDA stream, an object with "
        f"__cuda_stream__, or an integer handle; got {type(stream).__name__}")


def stream_handle(stream: Any) -> int | None:
    """The CUDA handle of a numba stream (0 for the default stream, 1 and 2 for the
    legacy and per-thread default streams), or None for the simulator's stand-in, which
    has none."""
    handle = getattr(stream, "handle", None)  # a CUstream, or a ctypes pointer
    if handle is None:
        return None
    try:
        return int(handle)
    except TypeError:
        return int(getattr(handle, "value", None) or 0)  # a ctypes null pointer: None


def same_stream(exported: int | None, ours: int | None) -> bool:
    """Whether two stream handles name one stream: the same handle, or 0 and the default
    stream numba launches on for 0 (the legacy default stream, 1, unless numba is set to
    use the per-thread default stream, 2). CuPy's arrays name its null stream 1 in the
    CUDA Array Interface, and a call on them runs on numba's stream 0: the same stream,
    which ``_as_device`` must not wait for on the host."""
    if exported is None or ours is None:
        return False
    return canonical_handle(exported) == canonical_handle(ours)


def canonical_handle(handle: int) -> int:
    """The stream a handle names: 0 is numba's default stream, the legacy (1) or, where
    numba is set to use it, the per-thread default stream (2)."""
    if handle != 0:
        return handle
    try:
        from numba.cuda.core import config
    except ImportError:  # an older numba-cuda: its configuration lives in numba's
        from numba.core import config
    return (PER_THREAD_DEFAULT if getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0)
            else LEGACY_DEFAULT)


def operand_stream(x: Any) -> tuple[str, Any] | None:
    """The stream the caller's library would use for device array ``x`` now, or None."""
    lib = _library(x)
    if lib == "cupy":
        import cupy

        return ("handle", int(cupy.cuda.get_current_stream().ptr))
    if lib == "torch":
        import torch

        return ("handle", int(torch.cuda.current_stream(x.device).cuda_stream))
    own = getattr(x, "stream", None)
    if getattr(x, "__cuda_ndarray__", False):  # a numba device array
        return ("numba", own) if own not in (None, 0) else None
    cai = getattr(x, "__cuda_array_interface__", None)
    if isinstance(cai, dict) and cai.get("stream") is not None:
        return ("handle", int(cai["stream"]))
    return None


def choose_stream(stream: Any, device_arrays: Sequence[Any]) -> tuple[str, Any] | None:
    """The explicit ``stream=``, else the first device operand's stream, else None (the
    default stream)."""
    if stream is not None:
        return describe_stream(stream)
    for x in device_arrays:
        found = operand_stream(x)
        if found is not None:
            return found
    return None


def numba_stream(choice: tuple[str, Any] | None) -> Any:
    """The numba stream object for a choice made by :func:`choose_stream`."""
    from numba import cuda

    if choice is None:
        return cuda.default_stream()
    kind, value = choice
    if kind == "numba":
        return value
    from tilegemm import simulator

    if value == 0 or simulator.enabled():  # the simulator runs everything synchronously
        return cuda.default_stream()
    if value == LEGACY_DEFAULT:
        return cuda.legacy_default_stream()
    if value == PER_THREAD_DEFAULT:
        return cuda.per_thread_default_stream()
    return cuda.external_stream(value)
