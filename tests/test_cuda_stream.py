"""The CUDA stream a product runs on: the caller's, or the one ``stream=`` names.

Results handed back to CuPy or PyTorch were produced on stream 0 with no ordering against
the caller's stream, so a consumer on a non-blocking stream could read C before the kernel
ended. What can be checked without a GPU is checked here: which stream is chosen for each
kind of operand (with stand-in objects), argument validation, and, on the simulator, that
every launch receives the chosen stream. docs/gpu-session.md has the check on hardware.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import tilegemm
from tilegemm.backends.cuda_stream import choose_stream, describe_stream, operand_stream
from tilegemm.errors import InvalidTypeError, InvalidValueError


class _CAIv3:
    """Any object exposing ``__cuda_array_interface__`` version 3 with a stream."""

    def __init__(self, stream):
        self.__cuda_array_interface__ = {"shape": (2, 2), "typestr": "<f4", "version": 3,
                                         "data": (0, False), "strides": None,
                                         "stream": stream}


class _ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0xBEEF)


def test_explicit_streams_are_classified():
    assert describe_stream(0) == ("handle", 0)
    assert describe_stream(7) == ("handle", 7)
    assert describe_stream(_ProtocolStream()) == ("handle", 0xBEEF)


@pytest.mark.parametrize("bad", [-1, True, "stream", 1.5, object()])
def test_bad_stream_argument_is_a_type_error(bad):
    with pytest.raises(InvalidTypeError, match="stream"):
        describe_stream(bad)


def test_cai_v3_stream_field_is_used():
    assert operand_stream(_CAIv3(1234)) == ("handle", 1234)
    assert operand_stream(_CAIv3(None)) is None
    assert choose_stream(None, [_CAIv3(None), _CAIv3(99)]) == ("handle", 99)
    # An explicit stream= wins over the operands'.
    assert choose_stream(5, [_CAIv3(99)]) == ("handle", 5)
    assert choose_stream(None, []) is None


def test_cupy_and_torch_current_streams(monkeypatch):
    """Stand-ins for CuPy and PyTorch: the library's *current* stream is used, not 0."""
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=4242))
    torch = types.ModuleType("torch")
    seen = []

    def current_stream(device):
        seen.append(device)
        return types.SimpleNamespace(cuda_stream=777)

    torch.cuda = types.SimpleNamespace(current_stream=current_stream)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "torch", torch)
    CupyArray = type("ndarray", (), {"__module__": "cupy._core.core"})
    TorchTensor = type("Tensor", (), {"__module__": "torch", "device": "cuda:1"})
    assert operand_stream(CupyArray()) == ("handle", 4242)
    assert operand_stream(TorchTensor()) == ("handle", 777)
    assert seen == ["cuda:1"]
    CupyStream = type("Stream", (), {"__module__": "cupy.cuda.stream", "ptr": 31})
    TorchStream = type("Stream", (), {"__module__": "torch.cuda.streams", "cuda_stream": 32})
    assert describe_stream(CupyStream()) == ("handle", 31)
    assert describe_stream(TorchStream()) == ("handle", 32)


def test_stream_on_a_backend_without_streams_is_refused_before_running():
    a = np.ones((3, 2), np.float32)
    b = np.ones((2, 4), np.float32)
    out = np.full((3, 4), 5.0, np.float32)
    with pytest.raises(InvalidValueError, match="stream="):
        tilegemm.matmul(a, b, backend="cpu", stream=0, out=out)
    assert (out == 5.0).all()


@pytest.mark.cudasim
@pytest.mark.simulator
def test_every_launch_gets_the_chosen_stream(monkeypatch, rng):
    from numba import cuda

    from tilegemm.backends.cuda_program import CudaProgram
    from tilegemm.reference import assert_close

    launched = []
    original = CudaProgram.launch

    def spy(self, A, B, C, alpha, beta, stream=0):
        launched.append(stream)
        return original(self, A, B, C, alpha, beta, stream)

    monkeypatch.setattr(CudaProgram, "launch", spy)
    a = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    mine = cuda.stream()
    got = tilegemm.matmul(a, b, backend="cuda", kernel="naive", stream=mine)
    assert_close(got, a, b)
    assert launched == [mine]
    # A numba device array bound to a stream: that stream is used without stream=. (The
    # simulator's to_device drops its stream argument, so the arrays are made directly.)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    theirs = cuda.stream()
    da = FakeCUDAArray(a.copy(), stream=theirs)
    db = FakeCUDAArray(b.copy(), stream=theirs)
    got = tilegemm.matmul(da, db, backend="cuda", kernel="naive")
    assert_close(got.copy_to_host(), a, b)
    assert launched[-1] is theirs
    with pytest.raises(InvalidTypeError):
        tilegemm.matmul(a, b, backend="cuda", kernel="naive", stream="fast")


@pytest.mark.cudasim
def test_a_numba_object_that_is_not_a_stream_is_refused():
    """Any object from the numba package passed as a stream: a device array was ignored
    with device operands, and failed after the launch with host ones."""
    from numba import cuda

    assert describe_stream(cuda.stream())[0] == "numba"
    with pytest.raises(InvalidTypeError, match="stream"):
        describe_stream(cuda.to_device(np.ones(3)))


def _numba_stream(handle):
    """numba-cuda's own Stream object for a handle, as ``cuda.external_stream(handle)``
    makes it (no GPU needed to build one)."""
    binding = pytest.importorskip("cuda.bindings.driver")
    from numba.cuda.cudadrv.driver import Stream

    return Stream(binding.CUstream(handle), external=True)


def test_split_k_workspaces_are_kept_per_stream_handle_not_per_object():
    """The key was id() of the stream object: numba makes a new object per call for the
    same stream, and a freed object's id came back for another stream, which then shared
    a workspace with work still queued on the first."""
    from tilegemm.kernels.cuda._workspace import stream_key as _stream_key

    keys = []
    for handle in (0x1111, 0x2222, 0x3333, 0x1111):
        stream = _numba_stream(handle)
        keys.append(_stream_key(stream))
        del stream  # (as a call's stream object goes when the call returns)
    assert keys == [0x1111, 0x2222, 0x3333, 0x1111]
    assert _stream_key(_numba_stream(0)) == 0 == _stream_key(None) == _stream_key(0)
    assert _stream_key(_numba_stream(1)) == 1  # the legacy default stream


def test_the_per_thread_default_stream_is_one_workspace_key_per_thread(monkeypatch):
    """Handle 2 (or 0 where numba uses the per-thread default stream) names a different
    stream in each host thread: two threads shared a workspace under one key, and their
    kernels, on streams that do not wait for each other, could overwrite each other's
    partial sums."""
    import threading

    from tilegemm.kernels.cuda._workspace import stream_key as _stream_key

    def in_a_thread(handle):  # noqa: ANN001, ANN202
        out = []
        t = threading.Thread(target=lambda: out.append(_stream_key(handle)))
        t.start()
        t.join()
        return out[0]

    here = _stream_key(2)
    assert here != in_a_thread(2) and here == _stream_key(_numba_stream(2))
    assert _stream_key(0) == in_a_thread(0) == 0  # the legacy default: one stream
    try:
        from numba.cuda.core import config
    except ImportError:
        from numba.core import config
    monkeypatch.setattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 1, raising=False)
    assert _stream_key(0) != in_a_thread(0)


@pytest.mark.parametrize(("exported", "ours", "wait", "synced"), [
    (0x1111, 0x1111, True, False),  # the same stream orders the work: no host wait
    (0x1111, 0x2222, True, True),  # another stream: numba waits for the array's
    (None, 0x2222, True, False),  # nothing to wait for
    (0x1111, None, True, True),  # no stream given: as numba does by default
    (0x1111, 0x2222, False, False),  # a view for its address only
    (1, 0, True, False),  # CuPy's null stream (named 1, legacy default) is numba's stream 0
    (2, 0, True, True),  # the per-thread default stream is not
])
def test_a_device_view_waits_on_the_host_only_for_another_stream(monkeypatch, exported, ours,
                                                                  wait, synced):
    """CuPy arrays name their stream in the CUDA Array Interface, and numba's
    as_cuda_array waited on the host for it (sync=True) on every call, although the
    product then runs on that same stream."""
    from numba import cuda

    from tilegemm.backends import cuda as backend_module

    calls = []
    monkeypatch.setattr(cuda, "as_cuda_array", lambda x, sync=True: calls.append(sync))
    stream = None if ours is None else _numba_stream(ours)
    backend_module._as_device(_CAIv3(exported), stream, wait=wait)
    assert calls == [synced]


def test_stream_zero_is_the_default_stream_numba_launches_on(monkeypatch):
    """Handle 0 is the legacy default stream (1) for numba, or the per-thread default
    stream (2) where numba is set to use it; every other handle is only itself."""
    from numba.cuda.core import config

    from tilegemm.backends.cuda_stream import same_stream

    assert same_stream(1, 0) and same_stream(0, 1) and same_stream(0, 0)
    assert not same_stream(2, 0) and not same_stream(0x1111, 0) and not same_stream(None, 0)
    monkeypatch.setattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 1)
    assert same_stream(2, 0) and not same_stream(1, 0)
