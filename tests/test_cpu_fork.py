"""The threaded CPU rung in forked worker processes and in several threads at once.

``multiprocessing`` forks by default on Linux (before Python 3.14). A child forked from a
process that had already run Numba's GNU OpenMP threads is killed on its first parallel
region, and a ``multiprocessing.Pool`` then waits forever. tilegemm makes TBB (thread- and
fork-safe) available to Numba where the ``tbb`` package is installed, and otherwise runs
products in such a child on the calling thread (see ``tilegemm.kernels.cpu._threads``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tilegemm
from conftest import run_in_threads
from tilegemm.kernels.cpu import _threads, k02_blocked
from tilegemm.reference import assert_close, random_operands

SRC = Path(tilegemm.__file__).resolve().parent.parent
# Above DIRECT_PRODUCT multiply-adds, so the product takes the packed, threaded path.
SIZE = 128
assert SIZE**3 > k02_blocked.DIRECT_PRODUCT

FORK_SCRIPT = """
import json, multiprocessing as mp, sys
import numba, numpy as np
import tilegemm
from tilegemm.kernels.cpu import _threads

rng = np.random.default_rng(0)
a = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
b = rng.standard_normal((SIZE, SIZE)).astype(np.float32)

def work(i):
    c = tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
    exact = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.abs(c - exact).max()), _threads.parallel_unsafe()

if __name__ == "__main__":
    tilegemm.matmul(a, b, kernel="blocked", backend="cpu")  # the parent's threads start
    with mp.get_context("fork").Pool(2) as pool:
        # A killed worker is replaced and its task never answers: time out, not hang.
        children = pool.map_async(work, range(2)).get(timeout=TIMEOUT)
    print(json.dumps({"layer": numba.threading_layer(), "children": children,
                      "tbb": _threads.tbb_library_path() is not None}))
"""


def _run(script: str, timeout: float, **env: str) -> dict:
    """Run ``script`` in a fresh interpreter on this checkout's sources; its last line of
    output, as JSON."""
    environ = {**os.environ, "PYTHONPATH": str(SRC), **env}
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warm_cache() -> None:
    """Compile the rung here, into the session's kernel cache (the children's environment
    names it), so each child process loads it instead of compiling it again."""
    a, b = random_operands((SIZE, SIZE), (SIZE, SIZE), "float32")
    tilegemm.matmul(a, b, kernel="blocked", backend="cpu")


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="no fork on this platform")
def test_forked_pool_workers_multiply_after_the_parent_did(warm_cache):
    """The repro: the parent multiplies on its threads, then a fork Pool's two workers each
    multiply; both answer, correctly, whatever threading layer Numba took."""
    out = _run(FORK_SCRIPT.replace("SIZE", str(SIZE)).replace("TIMEOUT", "60"), timeout=240)
    assert len(out["children"]) == 2
    for err, unsafe in out["children"]:
        assert err < 1e-3 * SIZE
        # Only under GNU OpenMP do the children fall back to the calling thread.
        assert unsafe == (out["layer"] == "omp" and sys.platform.startswith("linux"))
    if out["tbb"]:  # the tbb package is installed: Numba must have found it
        assert out["layer"] == "tbb"


def test_explicit_threading_layer_is_kept(warm_cache):
    """``NUMBA_THREADING_LAYER`` set by the user wins over the TBB that tilegemm offers."""
    script = """
import json, numba, numpy as np, tilegemm
a = np.ones((SIZE, SIZE), np.float32)
c = tilegemm.matmul(a, a, kernel="blocked", backend="cpu")
print(json.dumps({"layer": numba.threading_layer(), "ok": bool((c == SIZE).all())}))
""".replace("SIZE", str(SIZE))
    out = _run(script, timeout=240, NUMBA_THREADING_LAYER="workqueue")
    assert out == {"layer": "workqueue", "ok": True}


def test_four_threads_at_once_get_right_results():
    """Four threads calling the threaded rung together (Dask's threaded scheduler, a
    user's thread pool) each get their own product. The compiled rung holds the GIL, so
    today their parallel regions take turns; this keeps the results checked should they
    ever overlap."""
    pairs = [random_operands((SIZE + 7 * s, SIZE), (SIZE, SIZE + 3 * s), "float32", seed=s)
             for s in range(4)]
    results: list[object] = [None] * 4
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            results[i] = tilegemm.matmul(*pairs[i], kernel="blocked", backend="cpu")

    run_in_threads(work, 4)
    for i, (a, b) in enumerate(pairs):
        assert_close(results[i], a, b, what=f"thread {i}")


@pytest.mark.parametrize("shape", [(1, 128, 128, 128), (3, 100, 70, 130), (2, 40, 30, 20),
                                   (1, 200, 2100, 600), (2, 9, 7, 0)])
def test_calling_thread_path_matches_numpy(monkeypatch, shape):
    """Where a parallel region would be killed, every product runs without one: the
    larger products through the batch path's per-product code (``small``, counted) with
    the check routing them there, the small ones straight to the same code; all with the
    threaded path's results. The largest shape crosses the NC and KC panel edges."""
    batch, m, n, k = shape
    a, b = random_operands((batch, m, k), (batch, k, n), "float32", seed=sum(shape))
    threaded = tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
    g = _program_used(a, b).__globals__
    products = []
    per_products, serial = g["small"], g["blocked_serial"]

    def counting(A, B, C, alpha, beta, z0, z1, tr, cb):  # noqa: N803 - the rung's names
        products.extend([1] * (z1 - z0))
        per_products(A, B, C, alpha, beta, z0, z1, tr, cb)

    monkeypatch.setitem(g, "small", counting)
    routed = []
    monkeypatch.setitem(g, "blocked_serial", lambda *xs: (routed.append(1), serial(*xs)))
    monkeypatch.setattr(_threads, "_forked_unsafe", True)
    c = tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
    assert_close(c, a, b)
    # Small products never reach a parallel region, so they go straight to the calling
    # thread's code without the check; the others are routed by it.
    packed = k > 0 and batch * m * n * k > k02_blocked.DIRECT_PRODUCT
    assert len(routed) == (1 if packed else 0)
    assert len(products) == batch
    np.testing.assert_array_equal(c, threaded)  # the same sums in the same order


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_parallel_region_computes_on_its_own_thread():
    """A worker forked while another thread of the parent was inside a parallel region
    inherited TBB's pool mid-region and could hang in its first threaded product; such a
    child now runs its products on the calling thread. A child forked between regions
    keeps its threads."""
    def child_sees() -> bool:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, no cleanup of the parent's
            os.write(write, b"1" if _threads.parallel_unsafe() else b"0")
            os._exit(0)
        os.close(write)
        seen = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
        return seen == b"1"

    before = _threads.parallel_unsafe()
    with _threads.InParallel():  # as blocked() wraps its parallel calls
        assert child_sees()
    assert child_sees() is before  # outside any region: as the process already was
    assert _threads.regions_running() == 0


def _program_used(a: np.ndarray, b: np.ndarray):
    """The compiled rung ``matmul(a, b, kernel="blocked")`` runs (its parameters may be the
    tuning database's, not the rung's defaults)."""
    chosen = tilegemm.plan(a, b, kernel="blocked", backend="cpu")
    spec = next(s for s in tilegemm.kernels("cpu") if s.name == "blocked")
    return spec.program(chosen.params, chosen.dtype)


def test_numba_set_num_threads_before_the_first_product_keeps_tbb(warm_cache) -> None:
    """numba.set_num_threads() (Numba's documented way to size the pool) starts Numba's
    threading layer; called before tilegemm's first CPU product it chose OpenMP, which is
    not fork-safe, because TBB was made loadable only by that first product."""
    from tilegemm.kernels.cpu import _threads

    if not sys.platform.startswith("linux") or _threads.tbb_library_path() is None:
        pytest.skip("no TBB package here")
    script = (
        "import json, numba, numpy as np, tilegemm\n"
        "numba.set_num_threads(2)\n"
        "tilegemm.matmul(np.ones((300, 300)), np.ones((300, 300)), backend='cpu')\n"
        "print(json.dumps({'layer': numba.threading_layer()}))\n")
    assert _run(script, 300)["layer"] == "tbb"
