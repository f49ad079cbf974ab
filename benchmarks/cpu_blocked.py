"""Measure the CPU ``blocked`` rung against NumPy (OpenBLAS) in the same process.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/cpu_blocked.py                # 512/1024/2048, f32+f64
    PYTHONPATH=src python benchmarks/cpu_blocked.py --sizes 1024 --dtypes float32 \\
        --param MR=16 --param KC=384 --no-save                     # try parameters

Timing: operands prepared once through ``CpuBackend.prepare`` (compilation happens there and
is reported separately). Rounds alternate a block of launches of ours with a block of
``np.matmul`` calls into a preallocated output, so that load from other processes hits both
alike; the result is the median of all launches and the ratio of the medians.

Each block starts after a pause (``--pause``, default 0.3 s): OpenBLAS worker threads keep
spinning for about 0.1 s after a call, and Numba's OpenMP workers briefly too, so a launch
that follows the other library immediately shares its cores with those spinning threads.
Strict one-by-one interleaving measured both sides at a third to a half of their speed on
this 2-core machine. Writes
``benchmarks/results/cpu-blocked-<cpu>-<isa>-m<family>-<model>.json`` unless ``--no-save``
(the ISA and the family/model numbers: virtual machines of different generations often
report the same CPU name).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np

from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.backends.base import wall_clock_elapsed
from tilegemm.backends.cpu import l2_cache_bytes, usable_cpus
from tilegemm.bench.environment import (
    cpu_family_model,
    cpu_name,
    git_commit,
    numpy_blas,
    write_cpu_results,
    write_results,
)
from tilegemm.bench.timing import alternating, prepare_verified
from tilegemm.problem import describe, host_operand_3d, make_problem
from tilegemm.reference import random_operands
from tilegemm.tune.database import host_isa

ROOT = Path(__file__).resolve().parent.parent


def simd_flags() -> list[str]:
    """The vector/FMA features that decide the micro-kernel's code (from /proc/cpuinfo:
    x86's ``flags`` line, 64-bit ARM's ``Features``)."""
    wanted = ("avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq",
              "asimd", "fphp", "asimdhp", "sve", "sve2", "sme")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def machine_record() -> dict:
    """What every CPU results file records about the machine and the software: the CPU
    (model, family/model, ISA, vector flags, cores, L2 per CPU), Numba's threads and
    threading layer, NumPy and its BLAS, the environment that changes them, and the
    commit."""
    from tilegemm.bench.environment import host_info

    return {
        "device": "cpu", "cpu_model": cpu_name(), "cpu_family_model": cpu_family_model(),
        "isa": host_isa(), "simd": simd_flags(), "cores": usable_cpus(),
        "l2_bytes_per_cpu": l2_cache_bytes(),
        "numba_threads": numba.get_num_threads(),
        # tbb since tilegemm depends on it on Linux x86-64; omp (GNU OpenMP) before
        "numba_threading_layer": numba.threading_layer(),
        "numpy_version": np.__version__, "numba_version": numba.__version__,
        "numpy_blas": numpy_blas(), "env": host_info()["env"], "git_commit": git_commit(),
    }


def results_suffix(text: str) -> str:
    """``--suffix``'s value as it goes into a results file name: joined with a "-" unless it
    starts with one (``audit`` → ``-audit``, as the committed ``...-m26-2-numba-haswell``);
    "" stays "". (argparse reads ``--suffix -audit`` as an option: ``--suffix=-audit``.)"""
    text = text.strip()
    if "/" in text or "\\" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: a file-name suffix has no path separator")
    return text if not text or text.startswith("-") else f"-{text}"


def add_run_arguments(ap: argparse.ArgumentParser, rounds: int, pause: float) -> None:
    """``--rounds``, ``--pause``, ``--no-save`` and ``--suffix``: the options of the CPU
    scripts that time blocks of calls alternating, with a pause before each, and save
    through :func:`save_results` (``rounds`` and ``pause`` are the script's defaults)."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--pause", type=float, default=pause)
    ap.add_argument("--no-save", action="store_true")
    add_suffix_argument(ap)


def add_suffix_argument(ap: argparse.ArgumentParser, why: str = "") -> None:
    """The ``--suffix`` option of the CPU scripts that save through :func:`save_results`."""
    ap.add_argument("--suffix", type=results_suffix, default="",
                    help="appended to the results file name, after a '-' unless it starts "
                         "with one: --suffix numba-haswell or --suffix=-numba-haswell (a value "
                         "starting with '-' needs the '=')" + (f"; {why}" if why else ""))


def save_results(kind: str, fields: dict, suffix: str = "", path: Path | None = None) -> Path:
    """Write a CPU benchmark's results document: :func:`machine_record`, then ``fields``,
    then the load average at the end of the run, to ``path`` if given, else
    ``benchmarks/results/<kind>-<cpu>-<isa>-m<family>-<model><suffix>.json`` (``suffix``
    joined with a "-", see :func:`results_suffix`)."""
    doc = {**machine_record(), **fields, "load_average_at_end": list(os.getloadavg())}
    if path is not None:
        return write_results(path, doc, ROOT)
    return write_cpu_results(ROOT, kind, host_isa(), doc, suffix=results_suffix(suffix))


def measure(spec, params, n: int, dtype: str, rounds: int, block: int, pause: float) -> dict:
    a, b = random_operands((n, n), (n, n), dtype)
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    backend = get_backend("cpu")
    first: list[float] = []
    # Compiles on the first (dtype, params), warms caches; output NaN-poisoned, then checked
    # (the check is not part of the first call's time)
    prepared = prepare_verified(backend, spec, params, prob, host_operand_3d(a, prob, "a"),
                                host_operand_3d(b, prob, "b"), first_call=first)
    first_call_s = first[0]
    out = np.empty((n, n), dtype=dtype)
    np.matmul(a, b, out=out)
    ours_cpu: list[float] = []
    ref_cpu: list[float] = []

    def blocks(one: Callable[[], list[float]], cpu: list[float]) -> Callable[[], list[float]]:
        def run() -> list[float]:  # ``block`` launches; CPU seconds of each kept aside
            wall = []
            for _ in range(block):
                c = time.process_time()
                wall.extend(one())
                cpu.append(time.process_time() - c)
            return wall
        return run

    times = alternating({
        "ours": blocks(lambda: prepared.elapsed(1), ours_cpu),
        "numpy": blocks(lambda: wall_clock_elapsed(lambda: np.matmul(a, b, out=out), 1), ref_cpu),
    }, rounds, pause=pause)
    ours, ref = times["ours"], times["numpy"]
    flop = 2.0 * n**3
    g_ours, g_np = flop / np.median(ours) / 1e9, flop / np.median(ref) / 1e9
    return {"size": n, "dtype": dtype, "first_call_s": round(first_call_s, 3),
            "gflops_blocked": round(g_ours, 2), "gflops_numpy": round(g_np, 2),
            "ratio": round(g_ours / g_np, 3), "launches": len(ours),
            "gflops_blocked_best": round(flop / min(ours) / 1e9, 2),
            "gflops_numpy_best": round(flop / min(ref) / 1e9, 2),
            # CPU seconds of all threads (spin-waits included): less sensitive to other
            # processes than wall time, and still charges load imbalance.
            "gflops_per_cpu_s_blocked": round(flop / np.median(ours_cpu) / 1e9, 2),
            "gflops_per_cpu_s_numpy": round(flop / np.median(ref_cpu) / 1e9, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--rounds", type=int, default=5, help="alternations of ours and NumPy")
    ap.add_argument("--block", type=int, default=3, help="launches per block")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds idle before a block")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    spec = registry.get("blocked", "cpu")
    given = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            ap.error(f"--param {item!r}: give NAME=VALUE with an integer value, e.g. MR=8")
        given[name.strip()] = int(value)
    params = spec.resolve(given)
    rows = []
    for dtype in args.dtypes:
        for n in args.sizes:
            row = measure(spec, params, n, dtype, args.rounds, args.block, args.pause)
            rows.append(row)
            print(f"{dtype:8} {n:5}  blocked {row['gflops_blocked']:7.1f}  numpy "
                  f"{row['gflops_numpy']:7.1f} GFLOP/s  ratio {row['ratio']:.2f}  "
                  f"| per CPU-s {row['gflops_per_cpu_s_blocked']:6.1f} vs "
                  f"{row['gflops_per_cpu_s_numpy']:6.1f} | first call {row['first_call_s']:.2f} s",
                  flush=True)
    if not args.no_save:
        save_results("cpu-blocked", {
            "kernel": "cpu:blocked", "params": params, "sizes": args.sizes,
            "method": (f"median of {args.rounds} rounds x {args.block} launches, ours and "
                       f"NumPy alternating by block, {args.pause} s idle before each block; "
                       "operands prepared once"),
            "results": rows,
        })


if __name__ == "__main__":
    main()
