"""The CPU rung's unpacked tiles against its packed loop nest, on one thread.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/cpu_small_tiles.py
    PYTHONPATH=src python benchmarks/cpu_small_tiles.py --dtypes float64 --cubes 32 48 64 \\
        --narrow 2048x16x2048 --no-save

Two thresholds of the ``blocked`` rung rest on this comparison, first measured on one CPU
(an AMD Zen 5, with AVX-512 code and with AVX2 code): products of at most 48³
multiply-adds are computed with the unpacked tiles (``PACKED_MIN_PRODUCT`` in
``kernels/cpu/_blocked_source.py``), and so are products at most two vectors of columns wide
at any size (``NARROW_VECTORS`` in ``kernels/cpu/_small_tile.py``). Run it on another CPU to
see whether they hold there (for AVX2 code on an AVX-512 CPU set ``NUMBA_CPU_NAME=haswell``
and ``NUMBA_CPU_FEATURES``, see docs/cpu.md).

Both paths are called directly in the compiled module of the rung's parameters for this
machine (``direct``: the tiles; ``products_serial``: packing), on the calling thread, on the
same operands; they must give the same bits (checked first). Cubes are timed as batches of
``--batch`` products (µs per product), narrow products one at a time (ms); each contender in
blocks of about 0.2 s, alternating, ``--pause`` s idle before each, ``--rounds`` rounds,
medians. Writes ``benchmarks/results/cpu-small-tiles-<cpu>-<isa>-m<family>-<model>.json``
unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402
from cpu_tiles import shape  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm import registry  # noqa: E402
from tilegemm.bench.timing import alternating, call_block, calls_per_block  # noqa: E402
from tilegemm.reference import random_operands  # noqa: E402

DEFAULT_CUBES = (16, 24, 32, 48, 64, 80, 96)
DEFAULT_NARROW = ("2048x8x2048", "2048x16x2048", "2048x32x2048", "2048x64x2048")


def time_pair(a: np.ndarray, b: np.ndarray, module, params: dict, rounds: int,
              pause: float) -> dict:
    """Median seconds per call of the unpacked tiles and of the packed loop nest on ``a @ b``
    (3-D operands), after checking that they agree bit for bit."""
    dt = a.dtype
    batch, m, n = a.shape[0], a.shape[1], b.shape[2]
    cb = module.bind(params).bound  # the parameters compiled code takes as cb
    one, zero = dt.type(1), dt.type(0)
    tiles, packed = np.empty((batch, m, n), dt), np.empty((batch, m, n), dt)

    def run_tiles() -> None:
        module.direct(a, b, tiles, one, zero, cb, 0, batch, 0, m)

    def run_packed() -> None:
        module.products_serial(a, b, packed, one, zero, 0, batch, 0, cb)

    run_tiles()
    run_packed()
    if not np.array_equal(tiles, packed):
        raise SystemExit(f"the two paths disagree on {a.shape} @ {b.shape} {dt}: a bug")
    tilegemm.assert_close(tiles, a, b, what=f"{a.shape} @ {b.shape} {dt}")
    calls = calls_per_block(run_packed, seconds=0.2, most=5000)
    times = alternating({"tiles": call_block(run_tiles, calls),
                         "packed": call_block(run_packed, calls)}, rounds, pause=pause)
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--cubes", nargs="+", type=int, default=list(DEFAULT_CUBES),
                    help="edge of each cube, timed as a batch of products")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--narrow", nargs="+", type=shape, default=[shape(s) for s in DEFAULT_NARROW],
                    metavar="MxNxK", help="single products, e.g. 2048x16x2048")
    cpu_blocked.add_run_arguments(ap, rounds=5, pause=0.2)
    args = ap.parse_args()
    if any(c <= 0 for c in args.cubes) or args.batch <= 0:
        ap.error("cube edges and --batch must be positive")
    spec = registry.get("blocked", "cpu")
    rows = []
    for dtype in args.dtypes:
        params = tilegemm.plan(np.ones((64, 64), dtype), np.ones((64, 64), dtype),
                               kernel="blocked", backend="cpu").params
        module = spec.program(params, np.dtype(dtype)).module
        cases = [((args.batch, c, c), (args.batch, c, c)) for c in args.cubes]
        cases += [((1, m, k), (1, k, n)) for m, n, k in args.narrow]
        for sa, sb in cases:
            a, b = random_operands(sa, sb, dtype, seed=sum(sa) + sum(sb))
            t = time_pair(a, b, module, params, args.rounds, args.pause)
            per = sa[0]
            row = {"dtype": dtype, "batch": per, "m": sa[1], "n": sb[2], "k": sa[2],
                   "params": params, "s_per_product_tiles": t["tiles"] / per,
                   "s_per_product_packed": t["packed"] / per,
                   "tiles_over_packed": round(t["tiles"] / t["packed"], 3)}
            rows.append(row)
            unit, scale = ("us", 1e6) if per > 1 else ("ms", 1e3)
            print(f"{dtype:8s} {per:3d} x {sa[1]}x{sb[2]}x{sa[2]:<6d} tiles "
                  f"{row['s_per_product_tiles'] * scale:9.3f} {unit}  packed "
                  f"{row['s_per_product_packed'] * scale:9.3f} {unit}  tiles/packed "
                  f"{row['tiles_over_packed']:5.2f}", flush=True)
    if not args.no_save:
        cpu_blocked.save_results("cpu-small-tiles", {
            "method": f"the rung's direct (unpacked tiles) and products_serial (packing) called "
                      f"on the calling thread on the same operands, checked equal bit for bit; "
                      f"blocks of about 0.2 s alternating, {args.pause} s idle before each, "
                      f"{args.rounds} rounds, medians",
            "cases": rows,
        }, suffix=args.suffix)


if __name__ == "__main__":
    main()
