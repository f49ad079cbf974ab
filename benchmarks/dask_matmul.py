"""tilegemm.dask.matmul against Dask's own ``a @ b`` (NumPy/OpenBLAS blocks), same chunks,
same scheduler, and a product whose operands exceed a worker's memory limit.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/dask_matmul.py                    # both parts, saves
    PYTHONPATH=src python benchmarks/dask_matmul.py --n 4096 --no-save --skip-memory

Speed: the operands are generated and persisted first (never timed); then rounds alternate
``tilegemm.dask.matmul(a, b).persist()`` and ``(a @ b).persist()`` (each waited for, then
dropped), with a pause before each, after one untimed product of each that loads the
kernels in every worker, on the threaded scheduler and on a ``LocalCluster`` of worker
processes. Each result is checked against the other on a sample of rows. On the cluster the
task stream also gives each side's median block-task compute time (the multiply of two
chunks, fused with the first partial sum), which leaves out scheduling and transfers.

Memory: a ``LocalCluster`` of 2 workers with a ``--limit`` memory limit each multiplies
operands larger than one worker's limit, and the peak memory each worker reported
(sampled every 0.2 s) is recorded beside the chunk budget. Writes
``benchmarks/results/dask-matmul-<cpu>-<isa>-m<family>-<model>.json``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import threading
import time
from pathlib import Path

import dask
import dask.array as da
import distributed
import numba
import numpy as np
from distributed import Client, LocalCluster, get_task_stream, wait

import tilegemm
import tilegemm.dask as tgd
from tilegemm.bench.environment import (
    cpu_family_model,
    cpu_name,
    git_commit,
    write_cpu_results,
)
from tilegemm.tune.database import host_isa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_blocked import simd_flags  # noqa: E402


def _timed(make, scheduler, client, tasks: list[float] | None = None) -> float:
    """Seconds to persist ``make()``; on a cluster, the compute seconds of its block tasks
    (the first layer of the reduction) are appended to ``tasks``."""
    t = time.perf_counter()
    if client is None:
        with dask.config.set(scheduler=scheduler):
            x = make().persist()
        dt = time.perf_counter() - t
    else:
        with get_task_stream(client) as stream:
            x = make().persist()
            wait(x)
            dt = time.perf_counter() - t
        if tasks is not None:
            tasks.extend(_block_task_seconds(stream.data))
    del x
    return dt


def _block_task_seconds(records: list[dict]) -> list[float]:
    """Compute seconds of each block-product task: the most numerous task group (one task
    per output block and contraction block; the reduction's aggregates are fewer)."""
    groups: dict[str, list[float]] = {}
    for r in records:
        key = r["key"][0] if isinstance(r["key"], tuple) else str(r["key"])
        busy = sum(s["stop"] - s["start"] for s in r["startstops"] if s["action"] == "compute")
        groups.setdefault(key, []).append(busy)
    return max(groups.values(), key=len) if groups else []


def _check(a, b, client, scheduler) -> float:
    """Max relative difference between the two products on a few rows."""
    rows = slice(0, 64)
    with dask.config.set(scheduler=scheduler if client is None else "sync"):
        ours = tgd.matmul(a[rows], b)
        theirs = a[rows] @ b
        if client is None:
            x, y = dask.compute(ours, theirs)
        else:
            x, y = client.compute([ours, theirs], sync=True)
    return float(np.max(np.abs(x - y)) / np.max(np.abs(y)))


def speed(n: int, chunk: int, rounds: int, pause: float, cluster: bool) -> dict:
    client = None
    if cluster:
        lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=None, memory_limit="6GiB")
        client = Client(lc)
    a = da.random.default_rng(1).random((n, n), chunks=chunk, dtype=np.float32)
    b = da.random.default_rng(2).random((n, n), chunks=chunk, dtype=np.float32)
    a, b = (a.persist(), b.persist()) if client is None else client.persist([a, b])
    if client is not None:
        wait([a, b])
    sched = "distributed" if client else "threads"
    err = _check(a, b, client, "threads")
    # float32 sums of n terms, in another order than Dask's own: a wrong block is ~1
    if not err <= 64 * n * np.finfo(np.float32).eps:
        raise SystemExit(f"tilegemm.dask.matmul differs from Dask's own product by {err:.3g} "
                         f"(relative) at n={n}, chunk={chunk}: not timed")
    ours, theirs = [], []
    ours_tasks: list[float] = []
    theirs_tasks: list[float] = []
    # one warm-up each (compiles / loads the kernel in every worker)
    _timed(lambda: tgd.matmul(a, b), "threads", client)
    _timed(lambda: a @ b, "threads", client)
    for _ in range(rounds):
        time.sleep(pause)
        ours.append(_timed(lambda: tgd.matmul(a, b), "threads", client, ours_tasks))
        time.sleep(pause)
        theirs.append(_timed(lambda: a @ b, "threads", client, theirs_tasks))
    worker_env = dask.config.get("distributed.nanny.pre-spawn-environ") if cluster else None
    if client is not None:
        client.close()
        lc.close()
    flop = 2.0 * n ** 3
    t_ours, t_theirs = float(np.median(ours)), float(np.median(theirs))
    row = {"scheduler": sched, "n": n, "chunk": chunk, "dtype": "float32",
           "workers": "2 processes x 1 thread" if cluster else f"{dask.system.CPU_COUNT} threads",
           "seconds_tilegemm": ours, "seconds_dask_numpy": theirs,
           "gflops_tilegemm": round(flop / t_ours / 1e9, 1),
           "gflops_dask_numpy": round(flop / t_theirs / 1e9, 1),
           "ratio": round(t_theirs / t_ours, 3), "max_rel_difference": err}
    if cluster:
        tt, tn = float(np.median(ours_tasks)), float(np.median(theirs_tasks))
        block_flop = 2.0 * chunk ** 3
        row.update(worker_environment=worker_env, block_tasks=len(ours_tasks),
                   block_task_seconds_median_tilegemm=round(tt, 4),
                   block_task_seconds_median_dask_numpy=round(tn, 4),
                   block_task_gflops_tilegemm=round(block_flop / tt / 1e9, 1),
                   block_task_gflops_dask_numpy=round(block_flop / tn / 1e9, 1),
                   block_task_ratio=round(tn / tt, 3))
    print(f"{sched:12s} {n}^2 chunks {chunk}: tilegemm {row['gflops_tilegemm']} vs "
          f"dask+NumPy {row['gflops_dask_numpy']} GFLOP/s = {row['ratio']}x "
          f"(max rel diff {err:.1e})")
    if cluster:
        print(f"{'':12s} block tasks (median compute): tilegemm "
              f"{row['block_task_gflops_tilegemm']} vs NumPy "
              f"{row['block_task_gflops_dask_numpy']} GFLOP/s per worker thread = "
              f"{row['block_task_ratio']}x")
    return row


def memory(n: int, chunk: int, limit: str) -> dict:
    lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit=limit)
    client = Client(lc)
    peaks: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for addr, ws in client.scheduler_info()["workers"].items():
                peaks[addr] = max(peaks.get(addr, 0), ws["metrics"]["memory"])
            time.sleep(0.2)

    a = da.random.default_rng(1).random((n, n), chunks=chunk, dtype=np.float32)
    b = da.random.default_rng(2).random((n, n), chunks=chunk, dtype=np.float32)
    c = tgd.matmul(a, b)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    # Reduce on the workers (a column sum per block) so the result never has to fit anywhere
    # whole; every block of c is still computed.
    total = client.compute(c.sum(axis=0), sync=True)
    seconds = time.perf_counter() - t
    stop.set()
    sampler.join()
    # Column sums of a @ b are (column sums of a) @ b: a cheap independent check by NumPy.
    expect = client.compute(a.astype(np.float64).sum(axis=0) @ b.astype(np.float64), sync=True)
    rel = float(np.max(np.abs(total - expect)) / np.max(np.abs(expect)))
    client.close()
    lc.close()
    operand_bytes = 2 * n * n * 4
    row = {"n": n, "chunk": chunk, "dtype": "float32", "workers": 2, "memory_limit": limit,
           "operands_bytes": operand_bytes, "result_bytes": n * n * 4,
           "chunk_bytes": chunk * chunk * 4, "seconds": round(seconds, 1),
           "peak_worker_memory_bytes": sorted(peaks.values()),
           "max_rel_difference_vs_dask_numpy": rel}
    print(f"memory: {operand_bytes / 2**30:.1f} GiB of operands, 2 workers x {limit}: "
          f"done in {seconds:.0f} s, peak worker memory "
          f"{', '.join(f'{p / 2**30:.2f} GiB' for p in row['peak_worker_memory_bytes'])}, "
          f"max rel diff {rel:.1e}")
    return row


def method() -> str:
    """The prose of this module's docstring that says how the parts measure (the
    paragraphs after the usage lines, without the closing "Writes ..." sentence)."""
    prose = [p.strip() for p in __doc__.split("\n\n")[1:]
             if p.strip() and not p.startswith((" ", "\t")) and not p.startswith("Usage")]
    text = "\n\n".join(prose)
    return text.split(" Writes\n")[0].split(" Writes ")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--memory-n", type=int, default=20480,
                    help="size of the memory-limit product (20480: 3.1 GiB of operands)")
    ap.add_argument("--limit", default="2GiB", help="memory limit per worker")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    doc = {
        "cpu_model": cpu_name(), "cpu_family_model": cpu_family_model(), "isa": host_isa(),
        "simd": simd_flags(), "machine": platform.machine(),
        "cores": dask.system.CPU_COUNT, "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "versions": {"tilegemm": tilegemm.__version__, "dask": dask.__version__,
                     "distributed": distributed.__version__, "numpy": np.__version__,
                     "numba": numba.__version__},
        "git_commit": git_commit(), "method": method(),
    }
    if not args.skip_speed:
        doc["speed"] = [speed(args.n, args.chunk, args.rounds, args.pause, cluster)
                        for cluster in (False, True)]
    if not args.skip_memory:
        doc["memory"] = memory(args.memory_n, args.chunk, args.limit)
    if args.skip_speed and args.skip_memory:  # machine details alone would replace results
        print("nothing was measured (--skip-speed and --skip-memory), so nothing was saved")
        return 2
    if not args.no_save:
        write_cpu_results(ROOT, "dask-matmul", host_isa(), doc, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
