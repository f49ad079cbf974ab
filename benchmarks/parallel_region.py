"""What a parallel region costs on this machine, per Numba threading layer: the time of a
``prange`` of one task per thread, each task a fixed amount of work, against the same
tasks on one thread.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/parallel_region.py            # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/parallel_region.py --no-save --layers tbb omp

Why: the CPU rung decides from sizes when a product is worth threads (a product of one
row or one column beyond a share of the L2, small products given one region each), and
those sizes are right only where a region costs what it cost on the machine they were
measured on. With Numba's TBB layer (tilegemm's choice, see docs/cpu.md) every region
makes a new task arena, and an idle worker has to arrive in it: on a 2-vCPU AMD EPYC
(Zen 3, KVM) two tasks of 11 µs each took as long on two threads as on one (the calling
thread ran both before the worker came), while GNU OpenMP, whose workers wait spinning,
split them. Each layer runs in a process of its own (Numba takes its layer once per
process), with ``import tilegemm`` first, as a user's process has it.

Each layer's figures: for each amount of work per task, the median and best time of a
region of ``threads`` tasks, back to back (a loop of products), on ``threads`` threads and
on one; ``speedup`` is the one-thread time over the threaded one (ideal: ``threads``).
The work is a dependent chain of multiply-adds, calibrated to microseconds on one thread
first. Writes ``benchmarks/results/parallel-region-<cpu>-<isa>-m<family>-<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import tilegemm  # noqa: F401  (makes TBB loadable, as in a user's process)
import numba
from numba import njit, prange

@njit(parallel=True, nogil=True)
def region(x, tasks, spins):
    for t in prange(tasks):
        s = x[t]
        for _ in range(spins):
            s = s * 0.999999 + 1e-9
        x[t] = s

@njit(nogil=True)
def chain(x, spins):
    s = x[0]
    for _ in range(spins):
        s = s * 0.999999 + 1e-9
    x[0] = s

args = json.loads(sys.argv[1])
threads, rounds, calls = args["threads"], args["rounds"], args["calls"]
x = np.ones(max(threads, 1))
chain(x, 10)
spins = 1 << 16  # calibrate: spins per microsecond of one task
times = []
for _ in range(20):
    t0 = time.perf_counter()
    chain(x, spins)
    times.append(time.perf_counter() - t0)
per_us = spins / (min(times) * 1e6)
rows = []
for work in args["work_us"]:
    n = int(round(work * per_us))
    row = {"work_us": work, "spins": n}
    for nt in (1, threads):
        numba.set_num_threads(nt)
        region(x, threads, n)
        times = []
        for _ in range(rounds):
            time.sleep(0.01)
            t0 = time.perf_counter()
            for _ in range(calls):
                region(x, threads, n)
            times.append((time.perf_counter() - t0) / calls * 1e6)
        row[f"us_{nt}_thread" + ("s" if nt > 1 else "")] = {
            "median": round(statistics.median(times), 2), "best": round(min(times), 2)}
    one = row["us_1_thread"]["median"]
    many = row[f"us_{threads}_threads"]["median"] if threads > 1 else one
    row["speedup"] = round(one / many, 3) if many else None
    rows.append(row)
print(json.dumps({"layer": numba.threading_layer(), "threads": threads, "rows": rows}))
"""


def run_layer(layer: str, threads: int, work: list[float], rounds: int,
              calls: int) -> dict | str:
    """One layer's figures from a process of its own, or why there are none."""
    env = dict(os.environ)
    if layer != "default":
        env["NUMBA_THREADING_LAYER"] = layer
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(
            {"threads": threads, "work_us": work, "rounds": rounds, "calls": calls})],
        capture_output=True, text=True, env=env)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return f"{layer}: not usable here ({last})"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    import cpu_blocked

    from tilegemm.backends.cpu import usable_cpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", nargs="+", default=["default", "omp"],
                    choices=["default", "tbb", "omp", "workqueue"],
                    help="threading layers to measure (default: the one Numba takes after "
                         "'import tilegemm', then GNU OpenMP)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads per region (default: the CPUs this process may use)")
    ap.add_argument("--work", type=float, nargs="+", default=[0, 5, 10, 20, 50, 100, 200],
                    metavar="US", help="work per task, in microseconds of one thread")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds per figure")
    ap.add_argument("--calls", type=int, default=200, help="regions per round, back to back")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    ap.add_argument("--no-save", action="store_true")
    cpu_blocked.add_suffix_argument(ap)
    args = ap.parse_args()
    threads = args.threads or usable_cpus()
    if threads < 2:
        print("one CPU usable here: a region has nothing to split; nothing was measured")
        return 2
    layers = []
    for layer in args.layers:
        got = run_layer(layer, threads, args.work, args.rounds, args.calls)
        if isinstance(got, str):
            print(got)
            continue
        layers.append({"asked": layer, **got})
        print(f"layer {got['layer']} ({layer}), {threads} threads: µs per region, median "
              "(best), one thread / all")
        for row in got["rows"]:
            one, many = row["us_1_thread"], row[f"us_{threads}_threads"]
            print(f"  {row['work_us']:6.1f} µs a task: {one['median']:8.1f} ({one['best']:.1f})"
                  f" / {many['median']:8.1f} ({many['best']:.1f})  speedup {row['speedup']}")
    if not layers:
        print("nothing was measured; nothing was saved")
        return 2
    if not args.no_save:
        cpu_blocked.save_results("parallel-region", {
            "method": f"a prange of {threads} tasks (one per thread), each a dependent chain of "
                      "multiply-adds calibrated to the given microseconds on one thread; "
                      f"{args.calls} regions back to back per round, {args.rounds} rounds "
                      "after a 10 ms pause each; per region, median and best round; each "
                      "layer in a process of its own after 'import tilegemm'",
            "layers": layers,
        }, suffix=args.suffix, path=args.out)  # (which says where it wrote)
    return 0


if __name__ == "__main__":
    sys.exit(main())
