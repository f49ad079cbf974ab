"""The simulator's cuda.shared.array hands every thread of a block the same array.

numba's own FakeCUDAShared.array does check-then-create on a dict; a slow allocation (a
sleeping np.empty releases the GIL) makes the race certain, so this test fails without
tilegemm's locked replacement and passes with it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest


def _allocate_concurrently(shared, monkeypatch) -> set[int]:
    real_empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.002)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", slow_empty)
    got: list[np.ndarray] = []  # keep the arrays alive: ids of freed arrays get reused

    def worker() -> None:
        got.append(shared.array(8, np.float32))  # one source line for every thread

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {id(a) for a in got}


@pytest.mark.cudasim
@pytest.mark.simulator
def test_shared_array_allocation_is_atomic(monkeypatch):
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    from tilegemm.kernels.cuda._simulator import install

    install()
    assert len(_allocate_concurrently(FakeCUDAShared(0), monkeypatch)) == 1
