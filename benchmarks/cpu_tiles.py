"""Floating-point register tiles of the CPU ``blocked`` rung, against each other and NumPy.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/cpu_tiles.py                      # float32, 8x32 vs 6x64
    PYTHONPATH=src python benchmarks/cpu_tiles.py --dtypes float64 --tiles 8x16 6x32 \\
        --shapes 1024 2048x256x2048 --no-save
    PYTHONPATH=src python benchmarks/cpu_tiles.py --dtypes float64 --tiles 6x32 \\
        --blocks - MC=192 MC=144,KC=384 --shapes 1024 2048 --no-save   # cache blocks

Which MR×NR a database entry should name, and for which products: a tile that wins on
large squares can lose where most of its columns are padding (a 64-wide tile over 96
columns computes 128), so the default shapes mix squares with narrow products. Each tile
(``tilegemm.matmul`` with the tile given, ``kernel="blocked"``, the other parameters the
rung's defaults for the device) and ``np.matmul`` into a preallocated output are timed in
blocks of about 0.3 s, all in turn, ``--pause`` seconds idle before each block (OpenBLAS's
threads spin after a call), ``--rounds`` times; the figures are the medians of the blocks
and each tile's ratio to NumPy. Every tile's product is first checked against the float64
product. ``auto`` is what ``kernel="auto"`` picks for the shape (``tilegemm.plan``), so a
run after adding an entry shows it in use. ``--blocks`` times each tile with other cache
blocks too (``MC=192``, ``MC=144,KC=384``; ``-``: the rung's own), all in the same rounds,
so that a change of MC, KC or NC is judged against the same minutes of a noisy machine. Writes
``benchmarks/results/cpu-tiles-<cpu>-<isa>-m<family>-<model>.json`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402
from cpu_int_tiles import fitting, tile, tiles_fit  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm.bench.timing import alternating, call_block, calls_per_block  # noqa: E402

DEFAULT_TILES = ("8x32", "6x64")
DEFAULT_SHAPES = ("1024", "2048", "1000", "512", "2048x96x2048", "2048x256x2048",
                  "2048x2048x64", "64x2048x2048")


def shape(text: str) -> tuple[int, int, int]:
    """``"1024"`` → (1024, 1024, 1024); ``"2048x96x2048"`` → M, N, K."""
    parts = text.lower().split("x")
    if len(parts) not in (1, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give N (a cube) or MxNxK, e.g. 2048x96x2048")
    m, n, k = (int(parts[0]),) * 3 if len(parts) == 1 else map(int, parts)
    return m, n, k


def blocks(text: str) -> dict[str, int]:
    """``MC=192,KC=384`` as {"MC": 192, "KC": 384}; ``-`` as {} (the rung's own blocks)."""
    if text.strip() == "-":
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip().upper()
        if key not in ("MC", "KC", "NC") or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"{part!r}: cache blocks are MC=, KC= or NC= a whole number")
        out[key] = int(value)
    return out


def label(mnk: tuple[int, int, int]) -> str:
    m, n, k = mnk
    return f"{m}³" if m == n == k else f"{m}×{n}×{k}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float64"])
    ap.add_argument("--tiles", type=tile, nargs="+", default=[tile(t) for t in DEFAULT_TILES])
    ap.add_argument("--shapes", type=shape, nargs="+",
                    default=[shape(s) for s in DEFAULT_SHAPES])
    ap.add_argument("--blocks", type=blocks, nargs="+", default=[{}], metavar="KEY=V[,KEY=V]",
                    help="cache blocks to time each tile with (MC, KC, NC; '-': the rung's "
                    "own), e.g. - MC=192 MC=144,KC=384")
    cpu_blocked.add_run_arguments(ap, rounds=4, pause=0.3)
    args = ap.parse_args()
    if not tiles_fit(args.tiles, args.dtypes):  # before anything is timed
        return 2
    rng = np.random.default_rng(0)
    rows = []
    for dtype in args.dtypes:
        tiles = fitting(args.tiles, dtype)
        eps = float(np.finfo(dtype).eps)
        for mnk in args.shapes:
            m, n, k = mnk
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            want = a.astype(np.float64) @ b.astype(np.float64)
            bound = 4 * eps * np.sqrt(k) * np.max(np.abs(a).astype(np.float64) @ np.abs(b))
            out = np.empty((m, n), dtype)
            contenders = {}
            for (mr, nr), cache in ((t, c) for t in tiles for c in args.blocks):
                name = f"{mr}x{nr}" + "".join(f" {key}={v}" for key, v in cache.items())
                call = partial(tilegemm.matmul, a, b, out=out, kernel="blocked",
                               backend="cpu", MR=mr, NR=nr, **cache)
                out.fill(np.nan)
                call()
                if not np.max(np.abs(out - want)) <= bound:  # NaN fails too
                    raise SystemExit(f"{dtype} {label(mnk)}: {name} gave a wrong product")
                contenders[name] = call_block(call, calls_per_block(call, 0.3, 50))
            numpy_call = partial(np.matmul, a, b, out=out)
            contenders["numpy"] = call_block(numpy_call, calls_per_block(numpy_call, 0.3, 50))
            times = alternating(contenders, args.rounds, pause=args.pause)
            median = {name: float(np.median(s)) for name, s in times.items()}
            auto = tilegemm.plan(a, b)
            flops = 2.0 * m * n * k
            result = {"dtype": dtype, "shape": [m, n, k],
                      "numpy_gflops": round(flops / median["numpy"] / 1e9, 1),
                      "auto": {"params": auto.params, "source": auto.source}, "tiles": {}}
            for name, t in median.items():
                if name != "numpy":
                    result["tiles"][name] = {"gflops": round(flops / t / 1e9, 1),
                                             "vs_numpy": round(median["numpy"] / t, 3)}
            rows.append(result)
            print(f"{dtype} {label(mnk)}: " + "  ".join(
                f"{name} {v['vs_numpy']:.2f}x" for name, v in result["tiles"].items())
                + f"  of NumPy ({result['numpy_gflops']:.0f} GFLOP/s); auto "
                f"{auto.params['MR']}x{auto.params['NR']} [{auto.source}]", flush=True)
    if not args.no_save:
        cpu_blocked.save_results("cpu-tiles", {
            "kernel": "cpu:blocked", "shapes": [list(s) for s in args.shapes],
            "blocks": args.blocks,
            "method": (f"{args.rounds} rounds, the tiles and np.matmul (into a preallocated "
                       f"output) in turn, each a block of calls of about 0.3 s after "
                       f"{args.pause} s idle; median block (mean call); every tile's product "
                       "checked against float64 first"),
            "results": rows,
        }, suffix=args.suffix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
