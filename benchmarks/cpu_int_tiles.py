"""Integer register tiles of the CPU ``blocked`` rung, against each other.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/cpu_int_tiles.py                  # int32 + int64
    PYTHONPATH=src python benchmarks/cpu_int_tiles.py --dtypes int32 --tiles 8x32 4x16 \\
        --sizes 1024 --no-save

NumPy has no BLAS for integers (its integer matmul is a plain loop, one to two orders of
magnitude slower), so the yardstick here is the tiles themselves: which MR×NR a new ISA
entry of the database should name. Each tile is timed in blocks of calls
(``tilegemm.matmul`` with the tile given, ``kernel="blocked"``), the tiles in turn,
``--pause`` seconds idle before each block, ``--rounds`` times; the figure is the best and
the median block. Every tile's result is first checked exactly against the float64
product (operands in [-100, 100], exact in float64 and in int32 at these sizes). NumPy's
own integer matmul is timed once at the smallest size, for scale. Writes
``benchmarks/results/cpu-int-tiles-<cpu>-<isa>-m<family>-<model>.json`` unless
``--no-save``.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm.bench.timing import alternating, call_block, calls_per_block  # noqa: E402

DEFAULT_TILES = ("16x8", "8x8", "8x16", "8x32", "6x16", "4x16", "12x16")


def tile(text: str) -> tuple[int, int]:
    """``"8x32"`` → (8, 32)."""
    mr, sep, nr = text.lower().partition("x")
    if not sep or not mr.isdigit() or not nr.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a tile as MRxNR, e.g. 8x32")
    return int(mr), int(nr)


def refusals(tiles: list[tuple[int, int]], dtype: str) -> dict[tuple[int, int], str]:
    """Why the rung refuses each tile it does not take in ``dtype`` (its own register-tile
    rule: MR·NR fits 24 AVX-512 registers); the tiles it takes are not in it."""
    from tilegemm import registry

    spec = registry.get("blocked", "cpu")
    why = {t: spec.dtype_check({"MR": t[0], "NR": t[1]}, np.dtype(dtype)) for t in tiles}
    return {t: reason for t, reason in why.items() if reason is not None}


def tiles_fit(tiles: list[tuple[int, int]], dtypes: list[str]) -> bool:
    """Say which tiles the rung refuses in each dtype, and whether each dtype has a tile
    left to time (if not, say why and give up before anything is timed)."""
    for dtype in dtypes:
        refused = refusals(tiles, dtype)
        if len(refused) == len(tiles):
            print(f"no tile given fits {dtype}: {next(iter(refused.values()))}")
            return False
        for (mr, nr), reason in refused.items():
            print(f"{dtype}: tile {mr}x{nr} left out: {reason}", flush=True)
    return True


def fitting(tiles: list[tuple[int, int]], dtype: str) -> list[tuple[int, int]]:
    """The tiles the rung takes in ``dtype``."""
    refused = refusals(tiles, dtype)
    return [t for t in tiles if t not in refused]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["int32", "int64"])
    ap.add_argument("--tiles", type=tile, nargs="+", default=[tile(t) for t in DEFAULT_TILES])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    cpu_blocked.add_run_arguments(ap, rounds=4, pause=0.2)
    args = ap.parse_args()
    if not tiles_fit(args.tiles, args.dtypes):  # before anything is timed
        return 2
    rng = np.random.default_rng(0)
    rows = []
    for dtype in args.dtypes:
        tiles = fitting(args.tiles, dtype)
        auto = tilegemm.plan(np.ones((1024, 1024), dtype), np.ones((1024, 1024), dtype))
        for n in args.sizes:
            a = rng.integers(-100, 101, (n, n)).astype(dtype)
            b = rng.integers(-100, 101, (n, n)).astype(dtype)
            want = (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype)
            contenders, first = {}, {}
            for mr, nr in tiles:
                call = partial(tilegemm.matmul, a, b, kernel="blocked", backend="cpu",
                               MR=mr, NR=nr)
                t0 = time.perf_counter()
                got = call()
                first[(mr, nr)] = time.perf_counter() - t0
                if not np.array_equal(got, want):
                    raise SystemExit(f"{dtype} {n}: tile {mr}x{nr} gave a wrong product")
                contenders[f"{mr}x{nr}"] = call_block(call, calls_per_block(call, 0.3, 20))
            times = alternating(contenders, args.rounds, pause=args.pause)
            numpy_s = None
            if n == min(args.sizes):
                t0 = time.perf_counter()
                np.matmul(a, b)
                numpy_s = time.perf_counter() - t0
            ops = 2.0 * n**3
            result = {"dtype": dtype, "size": n, "auto_params": auto.params,
                      "numpy_int_matmul_gops": None if numpy_s is None
                      else round(ops / numpy_s / 1e9, 2), "tiles": {}}
            for name, samples in times.items():
                mr, nr = tile(name)
                result["tiles"][name] = {
                    "gops_best": round(ops / min(samples) / 1e9, 2),
                    "gops_median": round(ops / float(np.median(samples)) / 1e9, 2),
                    "first_call_s": round(first[(mr, nr)], 3)}
            rows.append(result)
            best = max(result["tiles"], key=lambda k: result["tiles"][k]["gops_median"])
            print(f"{dtype} {n}: " + "  ".join(
                f"{k} {v['gops_median']:.1f}" for k, v in result["tiles"].items())
                + f"  GOP/s (median); best {best}; auto "
                f"{auto.params['MR']}x{auto.params['NR']}"
                + (f"; NumPy {result['numpy_int_matmul_gops']:.2f}" if numpy_s else ""),
                flush=True)
    if not args.no_save:
        cpu_blocked.save_results("cpu-int-tiles", {
            "kernel": "cpu:blocked", "sizes": args.sizes,
            "method": (f"{args.rounds} rounds, the tiles in turn, each a block of calls of "
                       f"about 0.3 s after {args.pause} s idle; best and median block (mean "
                       "call); every tile's product checked exactly first"),
            "results": rows,
        }, suffix=args.suffix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
