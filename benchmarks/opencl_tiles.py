"""OpenCL `vectorized` register tiles against each other (and CLBlast) in one run.

    PYTHONPATH=src python benchmarks/opencl_tiles.py [--sizes 1024 2048]
        [--tiles 8x16/8 16x16/8 ...] [--rounds 5] [--reps 2] [--pause 0.5] [--out FILE]
        [--no-save] [--in-place]

Why a script of its own: the database entry for an OpenCL device is a choice between a few
one-work-item-per-group tiles (``TMxTN/VW``: BM = TM, BN = TN), and the rates of PoCL
kernels (and CLBlast's even more) drift between runs on a shared 2-core machine, so tiles
measured in different runs cannot be compared. Here every contender is verified first,
then all are timed round-robin in blocks of ``--reps`` calls with ``--pause`` seconds idle
before each block, ``--rounds`` times; best and median are reported per contender, and the
ratios use the first tile (the device default unless told otherwise) of the same run.

Timing is host wall time around one call plus ``queue.finish()`` (as in
``opencl_vs_clblast.py``: CLBlast may launch several kernels per call), operands already on
the device. Take the machine for yourself while it runs (``flock -x /work/cpu.lock``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from first_call import cpu_identity  # noqa: E402
from opencl_vs_clblast import clblast_library_version, square_problem, version  # noqa: E402

from tilegemm import registry  # noqa: E402
from tilegemm.backends import get_backend, opencl_program  # noqa: E402
from tilegemm.backends.base import wall_clock_elapsed  # noqa: E402
from tilegemm.backends.cpu import usable_cpus  # noqa: E402
from tilegemm.bench.environment import (  # noqa: E402
    cpu_family_model,
    cpu_name,
    git_commit,
    write_cpu_results,
    write_results,
)
from tilegemm.bench.timing import alternating, prepare_verified  # noqa: E402
from tilegemm.reference import assert_close  # noqa: E402


def tile_params(tile: str) -> dict[str, int]:
    """``"16x16/8"`` → the direct-path parameters (one work-item per group, BK unused but
    kept a multiple of VW so the rung's constraints hold)."""
    shape, _, vw = tile.partition("/")
    tm, tn = (int(x) for x in shape.split("x"))
    w = int(vw or 8)
    return {"BM": tm, "BN": tn, "BK": max(8, w), "TM": tm, "TN": tn, "VW": w}


@contextlib.contextmanager
def packing_off() -> Iterator[None]:
    """Products read A and B in place while this is in force: ``OpenCLProgram.packs``
    requires more work-groups per panel than any product has."""
    saved = opencl_program.PANEL_MIN_READS
    opencl_program.PANEL_MIN_READS = 1 << 62
    try:
        yield
    finally:
        opencl_program.PANEL_MIN_READS = saved


def _unpacked(prepared: Any, queue: Any) -> None:
    with packing_off():  # packing is decided at each launch
        prepared.launch()
    queue.finish()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--tiles", nargs="+", default=["8x16/8", "16x16/8", "8x32/8"],
                        help="TMxTN/VW, the first one is the baseline for the ratios")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=2, help="calls per block")
    parser.add_argument("--pause", type=float, default=0.5, help="idle seconds per block")
    parser.add_argument("--no-clblast", action="store_true")
    parser.add_argument("--in-place", action="store_true",
                        help="also time each tile with A and B read in place (no packing)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: "
                        "results/opencl-pocl-tiles-<cpu>-m<family>-<model>.json)")
    parser.add_argument("--no-save", action="store_true")
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
    spec = registry.get("vectorized", "opencl")
    pyclblast = None
    if not args.no_clblast:
        try:
            import pyclblast
        except ImportError as exc:
            print(f"CLBlast skipped: {exc}")
    print(f"device: {device.name.strip()} ({device.platform.version.strip()})", flush=True)
    load_before = os.getloadavg()
    rows = []
    for n in args.sizes:
        a, b, prob = square_problem(n)
        calls: dict[str, Callable[[], Any]] = {}
        params: dict[str, dict[str, int]] = {}
        for tile in args.tiles:
            params[tile] = tile_params(tile)
            prepared = prepare_verified(backend, spec, params[tile], prob, a[None], b[None])
            calls[tile] = lambda p=prepared: (p.launch(), queue.finish())
            if args.in_place:  # the same tile with packing turned off, in the same rounds
                name = f"{tile} in place"
                params[name] = params[tile]
                with packing_off():
                    unpacked = prepare_verified(backend, spec, params[tile], prob, a[None],
                                                b[None])
                calls[name] = lambda p=unpacked: _unpacked(p, queue)
        if pyclblast is not None:
            da, db = cla.to_device(queue, a), cla.to_device(queue, b)
            dc = cla.empty(queue, (n, n), np.float32)

            def clblast(da: Any = da, db: Any = db, dc: Any = dc, n: int = n) -> None:
                pyclblast.gemm(queue, n, n, n, da, db, dc, a_ld=n, b_ld=n, c_ld=n)
                queue.finish()

            clblast()
            assert_close(dc.get(), a, b, what=f"CLBlast n={n}")
            calls["clblast"] = clblast
        for call in calls.values():  # one untimed warm-up call each
            call()
        times = alternating(
            {name: (lambda c=call: wall_clock_elapsed(c, args.reps))
             for name, call in calls.items()}, args.rounds, pause=args.pause)
        flops = 2.0 * n**3
        base = flops / min(times[args.tiles[0]]) / 1e9
        result: dict[str, Any] = {"n": n, "contenders": []}
        for name, ts in times.items():
            best = flops / min(ts) / 1e9
            entry = {"name": name, "params": params.get(name),
                     "gflops_best": round(best, 2),
                     "gflops_median": round(flops / statistics.median(ts) / 1e9, 2),
                     "ratio_best_vs_first_tile": round(best / base, 3),
                     "seconds": [round(t, 5) for t in ts]}
            result["contenders"].append(entry)
        if "clblast" in times:
            cb = flops / min(times["clblast"]) / 1e9
            cm = flops / statistics.median(times["clblast"]) / 1e9
            for entry in result["contenders"]:
                entry["ratio_best_vs_clblast_best"] = round(entry["gflops_best"] / cb, 3)
                entry["ratio_median_vs_clblast_median"] = round(entry["gflops_median"] / cm, 3)
        rows.append(result)
        for entry in result["contenders"]:
            line = (f"n={n:5d} {entry['name']:>9s}  best {entry['gflops_best']:7.1f}  "
                    f"median {entry['gflops_median']:7.1f} GFLOP/s  "
                    f"x{entry['ratio_best_vs_first_tile']:.2f} first tile")
            if "ratio_best_vs_clblast_best" in entry:
                line += (f"  x{entry['ratio_best_vs_clblast_best']:.2f} CLBlast (best), "
                         f"x{entry['ratio_median_vs_clblast_median']:.2f} (median)")
            print(line, flush=True)

    record = {
        "benchmark": "opencl vectorized register tiles and CLBlast on one device "
                     "(benchmarks/opencl_tiles.py, same run, interleaved)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": git_commit(),
        "cpu": cpu_name(),
        "cpu_family_model": cpu_family_model(),
        "cpu_identity": cpu_identity(),
        "cpu_count": usable_cpus(),
        "device": device.name.strip(),
        "device_type": cl.device_type.to_string(device.type),
        "platform_version": device.platform.version.strip(),
        "driver_version": device.driver_version.strip(),
        "versions": {"numpy": np.__version__, "pyopencl": version("pyopencl"),
                     "pocl-binary-distribution": version("pocl-binary-distribution"),
                     "pyclblast": version("pyclblast"),
                     "libclblast": clblast_library_version()},
        "dtype": "float32",
        "kernel": "vectorized",
        "timing": f"wall clock of one call + queue.finish(), operands on the device; blocks of "
                  f"{args.reps} calls per contender, {args.pause} s idle before each block, "
                  f"{args.rounds} rounds round-robin; best and median of all calls",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "results": rows,
    }
    if not args.no_save:
        if args.out:
            write_results(args.out, record, ROOT)
        else:
            write_cpu_results(ROOT, "opencl-pocl-tiles", "", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
