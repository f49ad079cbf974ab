"""CudaBackend.prepare (device-resident operands, event timing) on numba's simulator: the
harness verifies a real rung, and catches a rung that leaves elements unwritten."""

from __future__ import annotations

import numpy as np
import pytest

from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.backends.cuda_program import CudaProgram
from tilegemm.bench.timing import FAILED, OK, Policy, measure_kernel
from tilegemm.problem import GemmProblem
from tilegemm.reference import assert_close, random_operands
from tilegemm.registry import KernelSpec

pytestmark = pytest.mark.cudasim

cuda = None  # numba.cuda, bound in _build_lazy (the simulator patches kernel globals)
POLICY = Policy(warmup=1, min_reps=2, max_reps=3, budget_s=0.01)


def _problem(m: int, n: int, k: int, batch: int = 1):  # type: ignore[no-untyped-def]
    prob = GemmProblem(m=m, n=n, k=k, dtype=np.dtype(np.float32), batch_shape=(batch,),
                       a_batch_shape=(batch,), b_batch_shape=(1,))
    a3, b3 = random_operands((batch, m, k), (1, k, n), np.float32)
    return prob, a3, b3


def test_prepare_runs_a_rung_and_times_it() -> None:
    be = get_backend("cuda")
    spec = registry.get("naive", "cuda")
    prob, a3, b3 = _problem(9, 13, 5, batch=2)
    prepared = be.prepare(spec, {"BLOCK": 8}, prob, a3, b3)
    prepared.launch()
    assert_close(prepared.fetch(), a3, b3)
    times = prepared.elapsed(2)
    assert len(times) == 2 and all(t > 0 for t in times)
    m = measure_kernel(be, spec, {"BLOCK": 8}, prob, a3, b3, POLICY)
    assert m.status == OK and m.samples
    assert ("simulator" in m.method) == be.status().simulated


def _build_lazy(p, dtype):  # type: ignore[no-untyped-def]
    global cuda
    from numba import cuda

    @cuda.jit
    def lazy(A, B, C, alpha, beta):
        i, j = cuda.grid(2)
        if i < C.shape[1] - 1 and j < C.shape[2]:  # forgets the last row
            acc = 0.0
            for k in range(A.shape[2]):
                acc += A[0, i, k] * B[0, k, j]
            C[0, i, j] = acc

    return CudaProgram(lazy, (8, 8, 1), lambda b, m, n: ((m + 7) // 8, (n + 7) // 8, 1))


def test_unwritten_elements_are_caught_by_the_poisoned_first_launch() -> None:
    spec = KernelSpec(name="lazy_fake", backend="cuda", rung=99, title="forgets a row",
                      build=_build_lazy)
    prob, a3, b3 = _problem(5, 6, 3)
    m = measure_kernel(get_backend("cuda"), spec, {}, prob, a3, b3, POLICY)
    assert m.status == FAILED and "wrong result" in m.reason and "(0, 4, 0)" in m.reason


def test_cache_flush_only_on_a_real_gpu() -> None:
    be = get_backend("cuda")
    flush = be.cache_flusher()
    if be.status().simulated:
        assert flush is None
    else:
        flush()
        be.synchronize()
