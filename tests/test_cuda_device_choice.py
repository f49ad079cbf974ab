"""CUDA ``device=`` on a machine with several GPUs, without any GPU: numba's device list
is faked, so the choice of device, the Target it gives and the errors before any launch
are checked here (the launch itself on GPU ``i`` needs the hardware)."""

from __future__ import annotations

import functools

import numba.cuda
import numpy as np
import pytest

import tilegemm
from tilegemm.backends import cuda as cuda_backend
from tilegemm.backends import get_backend
from tilegemm.errors import InvalidValueError


class FakeGpu:
    """What ``numba.cuda.gpus`` yields: a name, a compute capability and attributes."""

    MAX_THREADS_PER_BLOCK = 1024
    MAX_BLOCK_DIM_X, MAX_BLOCK_DIM_Y, MAX_BLOCK_DIM_Z = 1024, 1024, 64
    MAX_REGISTERS_PER_BLOCK = 65536

    def __init__(self, name: str, cc: tuple[int, int]) -> None:
        self.name, self.compute_capability = name.encode(), cc
        # the opt-in shared memory per block: 227 KiB on an H100, 163 KiB on an A100
        self.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = (227 if cc >= (9, 0) else 163) * 1024


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> cuda_backend.CudaBackend:
    """The registered CUDA backend seeing an H100 and an A100 (its caches bypassed)."""
    monkeypatch.setattr(cuda_backend.simulator, "enabled", lambda: False)
    monkeypatch.setattr(cuda_backend, "_driver_library_present", lambda: True)
    monkeypatch.setattr(numba.cuda, "is_available", lambda: True, raising=False)
    monkeypatch.setattr(numba.cuda, "gpus",
                        [FakeGpu("NVIDIA H100 80GB HBM3", (9, 0)),
                         FakeGpu("NVIDIA A100-SXM4-40GB", (8, 0))], raising=False)
    be = get_backend("cuda")
    cls = type(be)
    monkeypatch.setattr(be, "status", functools.partial(cls.status.__wrapped__, be))
    monkeypatch.setattr(be, "_target", functools.partial(cls._target.__wrapped__, be))

    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing may run before the device is checked")

    monkeypatch.setattr(be, "run", no_launch)
    monkeypatch.setattr(be, "prepare", no_launch)
    return be


def test_device_index_chooses_the_gpu_and_its_limits(two_gpus) -> None:  # noqa: ANN001
    t = two_gpus.target(1)
    assert (t.name, t.arch, t.index, t.kind) == ("NVIDIA A100-SXM4-40GB", "sm_80", 1, "gpu")
    assert two_gpus.target().arch == "sm_90"  # the default: GPU 0
    assert two_gpus.target(1).key != two_gpus.target(0).key  # caches tell the GPUs apart
    # each GPU's own opt-in shared memory (the mma rung's ring is checked against it)
    assert (two_gpus.target(0).limits.shared_optin_per_block,
            t.limits.shared_optin_per_block) == (227 * 1024, 163 * 1024)


@pytest.mark.parametrize("bad", [2, -1, "1", True, 1.0])
def test_device_out_of_range_lists_the_gpus_before_any_launch(two_gpus, bad) -> None:  # noqa: ANN001
    a = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match=r"unknown CUDA device .*devices here: "
                       r"0: NVIDIA H100 80GB HBM3 \(sm_90\); 1: NVIDIA A100-SXM4-40GB \(sm_80\)"):
        tilegemm.matmul(a, a, backend="cuda", device=bad)


@pytest.mark.parametrize("bad", ["0", True, 0.0])
def test_a_device_that_is_not_an_int_is_named_as_such(two_gpus, bad) -> None:  # noqa: ANN001
    """device="0" was refused as an unknown device while the listing showed device 0."""
    a = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match=rf"devices here: 0: .*; device= takes an int index, "
                       rf"not {type(bad).__name__}"):
        tilegemm.plan(a, a, backend="cuda", device=bad)


def test_plan_runs_on_the_chosen_gpu(two_gpus) -> None:  # noqa: ANN001
    a = np.ones((64, 64), np.float32)
    assert "sm_80" in tilegemm.plan(a, a, backend="cuda", device=1).device
    assert "sm_90" in tilegemm.plan(a, a, backend="cuda").device


def test_device_with_cuda_device_arrays_is_refused(two_gpus) -> None:  # noqa: ANN001
    from tilegemm.problem import Operand

    op = Operand(obj=None, kind="cuda", shape=(8, 8), dtype=np.dtype(np.float32))
    with pytest.raises(ValueError, match="device=1 with CUDA device arrays"):
        two_gpus.target_for([op], 1)
    with pytest.raises(ValueError, match="unknown CUDA device 5"):
        two_gpus.target_for([op], 5)


def test_a_product_larger_than_the_gpu_is_refused_before_any_launch(two_gpus,  # noqa: ANN001
                                                                    monkeypatch) -> None:
    """Host operands are copied to the GPU whole (a broadcast one materialised) and the
    result needs a buffer: 2**16-square float32 operands and result, 16 GiB each, fit the
    80 GB GPU and not the 40 GB one, which is refused by plan and call alike, naming sizes."""
    memory = {0: 80 * 10**9, 1: 40 * 10**9}
    monkeypatch.setattr(cuda_backend, "_gpu_memory", lambda t: memory[t.index or 0])
    one = np.ones((1, 1), np.float32)
    big = np.broadcast_to(one, (2**16, 2**16))
    assert tilegemm.plan(big, big, backend="cuda").backend == "cuda"
    for call in (tilegemm.plan, tilegemm.matmul):
        with pytest.raises(InvalidValueError,
                           match=r"needs 48\.0 GiB of GPU memory \(the result 16\.0 GiB, "
                                 r"operands .* 32\.0 GiB\), more than NVIDIA A100-SXM4-40GB"):
            call(big, big, backend="cuda", device=1)


def test_gpu_memory_counts_what_a_call_allocates() -> None:
    """Host operands and a host result are allocated on the GPU; a device out is written in
    place; a shared (unbatched) operand is copied once, a batched one per product."""
    from tilegemm.problem import describe, make_problem

    a, b = np.ones((3, 5, 7), np.float32), np.ones((7, 2), np.float32)
    ops = [describe(a, "a"), describe(b, "b")]
    prob = make_problem(*ops)
    assert cuda_backend._gpu_bytes(ops, prob, None) == (4 * (3 * 5 * 7 + 7 * 2), 4 * 3 * 5 * 2)
    assert cuda_backend._gpu_bytes(ops, prob, np.empty((3, 5, 2), np.float32))[1] == 4 * 30
    # no element to compute: the operands are never copied to the GPU
    ops = [describe(np.ones((0, 7), np.float32), "a"), describe(b, "b")]
    assert cuda_backend._gpu_bytes(ops, make_problem(*ops), None) == (0, 0)
