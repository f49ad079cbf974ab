"""Our best OpenCL rung against CLBlast and NumPy, float32, square sizes, in one run.

    PYTHONPATH=src python benchmarks/opencl_vs_clblast.py [--sizes 512 1024 2048] [--reps 7]

Every contender is verified against float64 NumPy before it is timed. Timing is host wall
time around one call plus ``queue.finish()`` for both OpenCL libraries (CLBlast may
launch several kernels per call, so one profiling event would not cover it), operands
already on the device; NumPy multiplies host arrays. Calls are interleaved round-robin
(ours, CLBlast, NumPy, ours, ...) so a burst of load from elsewhere on the machine hits
all three alike, and the ratios use each contender's best time; medians are recorded too.
Each NumPy call is followed by an untimed pause while OpenBLAS's threads stop spinning
(``tilegemm.bench.host_blas.settle``): on the host's cores they would slow the OpenCL
call after it.
When ``auto`` runs parameters other than the rung's defaults (a database entry), the
defaults are timed in the same rounds as a fourth contender, so the entry's gain is
measured under the same conditions.

CLBlast comes from ``pyclblast`` built against the system library (see docs/opencl.md);
when it cannot be imported the comparison with it is skipped with a message, never
estimated. Results go to benchmarks/results/opencl-<platform>-<cpu>-m<family>-<model>.json
(the family and model keep two machines with one vendor string apart).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tilegemm.bench.environment import (
    cpu_family_model,
    cpu_name,
    git_commit,
    slug,
    write_cpu_results,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from tilegemm import registry  # noqa: E402
from tilegemm.backends import get_backend  # noqa: E402
from tilegemm.backends.base import wall_clock_elapsed  # noqa: E402
from tilegemm.backends.cpu import usable_cpus  # noqa: E402
from tilegemm.bench.host_blas import SETTLE_S, settle  # noqa: E402
from tilegemm.bench.timing import alternating, prepare_verified  # noqa: E402
from tilegemm.problem import describe, make_problem  # noqa: E402
from tilegemm.reference import assert_close  # noqa: E402


def version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def clblast_library_version() -> str | None:
    """The CLBlast library's version: the Debian package's, or else read from the file
    name of the library this process loaded (``libclblast.so.1.7.0``, a build from source
    installed where ``pyclblast`` finds it)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libclblast1"],
                             capture_output=True, text=True)
        if out.stdout.strip():
            return out.stdout.strip()
    except OSError:
        pass
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"(/\S*libclblast\.so\.(\d+\.\d+\.\d+))", maps)
    return f"{found.group(2)} ({found.group(1)})" if found else None


def host_timed(call: Callable[[], Any]) -> Callable[[], list[float]]:
    """One wall-clock-timed call (``call`` ends with ``queue.finish()``): the same clock
    for ours, CLBlast and NumPy."""
    return lambda: wall_clock_elapsed(call, 1)


def _then_settle(block: Callable[[], list[float]]) -> list[float]:
    """``block``'s samples, returned once NumPy's BLAS threads have stopped spinning."""
    samples = block()
    settle()
    return samples


def ladder_table(backend: Any, queue: Any, n: int, reps: int) -> list[dict[str, Any]]:
    """Every OpenCL rung at its (device) defaults, one size: what each step buys here."""
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    rows = []
    for spec in registry.specs_for("opencl"):
        params = backend.resolve(spec, {})
        prepared = prepare_verified(backend, spec, params, prob, a[None], b[None])
        launch = host_timed(lambda p=prepared: (p.launch(), queue.finish()))
        best = min(alternating({spec.name: launch}, reps, pause=0.0)[spec.name])
        rows.append({"rung": spec.rung, "kernel": spec.name, "params": params, "n": n,
                     "gflops_best": 2.0 * n**3 / best / 1e9})
        print(f"ladder n={n}: {spec.rung} {spec.name:11s} {rows[-1]['gflops_best']:7.1f} "
              f"GFLOP/s  {params}", flush=True)
    return rows


def square_problem(n: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """Fresh float32 operands of an n×n×n product (seeded by n, so each script and run
    times the same data) and its problem description."""
    rng = np.random.default_rng(n)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    return a, b, make_problem(describe(a, "a"), describe(b, "b"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--reps", type=int, default=7, help="timed calls per contender")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="idle seconds before each contender's call")
    parser.add_argument("--kernel", default="auto", help="OpenCL rung (auto: the highest)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    parser.add_argument("--no-save", action="store_true",
                        help="print only: write no results file (the default one may be "
                             "a committed file of this machine)")
    parser.add_argument("--ladder", type=int, default=512, metavar="N",
                        help="also time every OpenCL rung at its defaults at N³ (0: skip)")
    args = parser.parse_args()

    import pyopencl as cl
    import pyopencl.array as cla

    backend = get_backend("opencl")
    status = backend.status()
    if not status.usable:
        print(f"OpenCL is not usable here: {status.reason}")
        return 1
    own = backend.own_device()
    queue, device = own.queue, own.device
    spec = (registry.default_for("opencl", "float32") if args.kernel == "auto"
            else registry.get(args.kernel, "opencl"))
    params = backend.resolve(spec, {})
    try:
        import pyclblast
    except ImportError as exc:
        pyclblast = None
        print(f"CLBlast comparison skipped: pyclblast cannot be imported ({exc}); see "
              "docs/opencl.md for installing libclblast-dev and pyclblast")

    print(f"device: {device.name.strip()} ({device.platform.version.strip()})")
    print("ours: kernel=auto, per size below" if args.kernel == "auto"
          else f"ours: opencl:{spec.name} {params}")
    load_before = os.getloadavg()
    rows = []
    for n in args.sizes:
        a, b, prob = square_problem(n)
        flops = 2.0 * n**3

        if args.kernel == "auto":  # what kernel="auto" runs for this size (database included)
            import tilegemm

            planned = tilegemm.plan(a, b, backend="opencl")
            spec, params = registry.get(planned.kernel, "opencl"), dict(planned.params)
            print(f"n={n}: auto runs {planned}", flush=True)
        prepared = prepare_verified(backend, spec, params, prob, a[None], b[None])
        calls = {"ours": lambda p=prepared: (p.launch(), queue.finish())}
        defaults = backend.resolve(spec, {})
        if params != defaults:  # auto runs a database entry: time the defaults beside it
            plain = prepare_verified(backend, spec, defaults, prob, a[None], b[None])
            calls["default"] = lambda p=plain: (p.launch(), queue.finish())

        if pyclblast is not None:
            da, db = cla.to_device(queue, a), cla.to_device(queue, b)
            dc = cla.empty(queue, (n, n), np.float32)

            def clblast(da=da, db=db, dc=dc, n=n) -> None:
                pyclblast.gemm(queue, n, n, n, da, db, dc, a_ld=n, b_ld=n, c_ld=n)
                queue.finish()

            clblast()
            assert_close(dc.get(), a, b, what=f"CLBlast n={n}")
            calls["clblast"] = clblast
        calls["numpy"] = lambda a=a, b=b: np.matmul(a, b)
        calls["numpy"]()
        settle()  # the checks and NumPy's first call leave BLAS threads spinning

        blocks = {name: host_timed(call) for name, call in calls.items()}
        numpy_block = blocks["numpy"]
        blocks["numpy"] = lambda block=numpy_block: _then_settle(block)
        times = alternating(blocks, args.reps, pause=args.pause)
        result: dict[str, Any] = {"n": n, "ours_kernel": spec.name, "ours_params": params}
        for name, ts in times.items():
            result[name] = {
                "gflops_best": flops / min(ts) / 1e9,
                "gflops_median": flops / float(np.median(ts)) / 1e9,
                "seconds": ts,
            }
        ours = result["ours"]["gflops_best"]
        result["ratio_vs_numpy"] = ours / result["numpy"]["gflops_best"]
        if "default" in result:
            result["default_params"] = defaults
            result["ratio_vs_default"] = ours / result["default"]["gflops_best"]
        if "clblast" in result:
            result["ratio_vs_clblast"] = ours / result["clblast"]["gflops_best"]
        rows.append(result)
        line = f"n={n:5d}  ours {ours:7.1f} GFLOP/s"
        if "default" in result:
            line += (f"  default {result['default']['gflops_best']:7.1f}"
                     f"  ours/default {result['ratio_vs_default']:.2f}x")
        if "clblast" in result:
            line += (f"  CLBlast {result['clblast']['gflops_best']:7.1f}"
                     f"  ours/CLBlast {result['ratio_vs_clblast']:.2f}x")
        line += (f"  NumPy {result['numpy']['gflops_best']:7.1f}"
                 f"  ours/NumPy {result['ratio_vs_numpy']:.2f}x")
        print(line, flush=True)

    ladder = ladder_table(backend, queue, args.ladder, args.reps) if args.ladder else []

    record = {
        "benchmark": "opencl_vs_clblast",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": git_commit(),
        "device": device.name.strip(),
        "device_type": cl.device_type.to_string(device.type),
        "platform": device.platform.name.strip(),
        "platform_version": device.platform.version.strip(),
        "driver_version": device.driver_version.strip(),
        "cpu": cpu_name(),
        "cpu_count": usable_cpus(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "versions": {
            "python": platform.python_version(), "numpy": np.__version__,
            "pyopencl": version("pyopencl"), "pocl-binary-distribution":
                version("pocl-binary-distribution"), "pyclblast": version("pyclblast"),
            "libclblast": clblast_library_version(),
        },
        "dtype": "float32",
        "cpu_family_model": cpu_family_model(),
        "timing": "best (and median) of --reps wall-clock calls incl. queue.finish(), "
                  "interleaved call by call, --pause s idle before each call, "
                  f"{SETTLE_S} s after each NumPy call (its BLAS threads spin); operands "
                  "already on the device",
        "pause": args.pause,
        "reps": args.reps,
        "ours": {"kernel": spec.name, "params": params},
        "clblast": "measured" if pyclblast is not None else "skipped: pyclblast not importable",
        "results": rows,
        "ladder": ladder,
    }
    kind = "pocl" if "portable computing" in device.platform.name.lower() else slug(
        device.platform.name)
    if args.no_save:
        return 0
    if args.out:
        write_results(args.out, record, ROOT)
    else:
        write_cpu_results(ROOT, f"opencl-{kind}", "", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
