"""``tilegemm.matmul`` against ``np.matmul`` on the shapes and layouts users pass, not only
large squares: mid sizes, sizes that are no power of two, skinny products, vector-matrix
products, transposed and Fortran-ordered operands, batches of small products, products of
a few rows, products of 8-16 rows.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/cpu_shapes.py                 # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/cpu_shapes.py --no-save --only gemv

Whole calls are timed (validation, dispatch and any copy included), ours and NumPy's in
alternating blocks of back-to-back calls, with a pause before each block: OpenBLAS's threads
spin for 0.1-0.3 s after a NumPy call and would share the cores with ours. The first call
of each block is not timed: after an idle pause, the first parallel region of either
library waits for its sleeping threads (see docs/cpu.md); what is reported is the steady
rate of repeated calls. The ratio is NumPy's median block time over ours (> 1: tilegemm is
faster). Every result is checked against NumPy's first. Writes
``benchmarks/results/cpu-shapes-<cpu>-<isa>-m<family>-<model>.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm.bench.timing import alternating, call_block, calls_per_block  # noqa: E402

# (group, label, a's shape, b's shape, layout); layout "c": C-ordered operands, "at"/"bt":
# that operand is the transpose of a C-ordered array, "f": both Fortran-ordered, "aw"/"bw":
# that operand is the first half of the columns of a C-ordered array twice as wide (its
# rows lie apart: ``w[:, :n]``).
CASES: list[tuple[str, str, tuple[int, ...], tuple[int, ...], str]] = [
    ("square", "64³", (64, 64), (64, 64), "c"),
    ("square", "100³", (100, 100), (100, 100), "c"),
    ("square", "160³", (160, 160), (160, 160), "c"),
    ("square", "256³", (256, 256), (256, 256), "c"),
    ("square", "384³", (384, 384), (384, 384), "c"),
    ("square", "512³", (512, 512), (512, 512), "c"),
    ("square", "1000³", (1000, 1000), (1000, 1000), "c"),
    ("square", "1024³", (1024, 1024), (1024, 1024), "c"),
    ("square", "997×1009×1013", (997, 1013), (1013, 1009), "c"),
    ("skinny", "2048×2048×32", (2048, 32), (32, 2048), "c"),
    ("skinny", "2048×32×2048", (2048, 2048), (2048, 32), "c"),
    ("skinny", "32×2048×2048", (32, 2048), (2048, 2048), "c"),
    ("skinny", "8192×256×256", (8192, 256), (256, 256), "c"),
    ("skinny", "2048×16×2048", (2048, 2048), (2048, 16), "c"),
    ("skinny", "2048×17×2048", (2048, 2048), (2048, 17), "c"),
    ("skinny", "4096×8×1024", (4096, 1024), (1024, 8), "c"),
    ("skinny", "100000×3×64", (100000, 64), (64, 3), "c"),
    ("mid", "32×512×512", (32, 512), (512, 512), "c"),
    ("mid", "32×1024×1024", (32, 1024), (1024, 1024), "c"),
    ("mid", "48×1024×1024", (48, 1024), (1024, 1024), "c"),
    ("mid", "128×512×512", (128, 512), (512, 512), "c"),
    ("mid", "200×512×512", (200, 512), (512, 512), "c"),
    ("mid", "300³", (300, 300), (300, 300), "c"),
    ("gemv", "1×4096×4096", (1, 4096), (4096, 4096), "c"),
    ("gemv", "4096×1×4096", (4096, 4096), (4096, 1), "c"),
    ("gemv", "vector @ matrix (4096)", (4096,), (4096, 4096), "c"),
    ("gemv", "matrix @ vector (4096)", (4096, 4096), (4096,), "c"),
    ("gemv", "1×1024×1024", (1, 1024), (1024, 1024), "c"),
    ("gemv", "1024×1×1024", (1024, 1024), (1024, 1), "c"),
    ("gemv", "x @ w.T 1×1024×1024", (1, 1024), (1024, 1024), "bt"),
    ("gemv", "x @ w.T 1×512×2048", (1, 2048), (2048, 512), "bt"),
    ("gemv", "1000×1×999", (1000, 999), (999, 1), "c"),
    # matrices of 1-2.3 MiB (float32): past the L2 of most CPUs, within a few MiB
    ("gemv", "512×1×512", (512, 512), (512, 1), "c"),
    ("gemv", "x @ w.T 1×768×768", (1, 768), (768, 768), "bt"),
    ("layout", "a.T @ b 1024³", (1024, 1024), (1024, 1024), "at"),
    ("layout", "a @ b.T 1024³", (1024, 1024), (1024, 1024), "bt"),
    ("layout", "Fortran order 1024³", (1024, 1024), (1024, 1024), "f"),
    ("layout", "x @ w.T 1×4096×4096", (1, 4096), (4096, 4096), "bt"),
    ("layout", "x.T @ w 2048×16×2048", (2048, 2048), (2048, 16), "at"),
    ("layout", "x @ w.T 4×256×1024", (4, 1024), (1024, 256), "bt"),
    ("layout", "Fortran order 100³", (100, 100), (100, 100), "f"),
    ("layout", "a[:, :k] @ b 1024³", (1024, 1024), (1024, 1024), "aw"),
    ("layout", "a @ b[:, :n] 1024³", (1024, 1024), (1024, 1024), "bw"),
    ("layout", "x @ w[:, :n] 1×4096×4096", (1, 4096), (4096, 4096), "bw"),
    ("layout", "x @ w[:, :n] 12×4096×4096", (12, 4096), (4096, 4096), "bw"),
    ("layout", "w[:, :k] @ x 4096×1×4096", (4096, 4096), (4096, 1), "aw"),
    ("layout", "a @ b[:, :n] 64³", (64, 64), (64, 64), "bw"),
    ("batch", "32 × 128³", (32, 128, 128), (32, 128, 128), "c"),
    ("batch", "256 × 32³", (256, 32, 32), (256, 32, 32), "c"),
    ("batch", "10000 × 4³", (10000, 4, 4), (10000, 4, 4), "c"),
    ("batch", "1000 × 16³", (1000, 16, 16), (1000, 16, 16), "c"),
    ("batch", "500 × 24³", (500, 24, 24), (500, 24, 24), "c"),
    ("batch", "1000 × 8×64×8", (1000, 8, 8), (1000, 8, 64), "c"),
    ("batch", "1000 × 64×1×64", (1000, 64, 64), (1000, 64, 1), "c"),
    # a batch through one matrix (a linear layer over sequences): one product of its rows
    ("batch", "8 × 32×1024 @ 1024²", (8, 32, 1024), (1024, 1024), "c"),
    ("batch", "64 × 1×1024 @ 1024²", (64, 1, 1024), (1024, 1024), "c"),
    ("batch", "16 × 64×512 @ 512²", (16, 64, 512), (512, 512), "c"),
    ("batch", "x @ w.T 8 × 128×768, 3072", (8, 128, 768), (768, 3072), "bt"),
    ("few", "2×1024×1024", (2, 1024), (1024, 1024), "c"),
    ("few", "4×1024×1024", (4, 1024), (1024, 1024), "c"),
    ("few", "7×999×1000", (7, 1000), (1000, 999), "c"),
    ("few", "4×4096×4096", (4, 4096), (4096, 4096), "c"),
    ("few", "3×2048×256", (3, 256), (256, 2048), "c"),
    ("few", "6×512×512", (6, 512), (512, 512), "c"),
    ("few", "4×64×64", (4, 64), (64, 64), "c"),
    ("few", "x @ w.T 4×1024×1024", (4, 1024), (1024, 1024), "bt"),
    ("few", "x @ w.T 4×4096×4096", (4, 4096), (4096, 4096), "bt"),
    ("few", "x @ w.T 7×512×2048", (7, 2048), (2048, 512), "bt"),
    ("rows", "8×1024×1024", (8, 1024), (1024, 1024), "c"),
    ("rows", "12×1024×1024", (12, 1024), (1024, 1024), "c"),
    ("rows", "15×999×1000", (15, 1000), (1000, 999), "c"),
    ("rows", "16×1024×1024", (16, 1024), (1024, 1024), "c"),
    ("rows", "20×999×1000", (20, 1000), (1000, 999), "c"),
    ("rows", "24×1024×1024", (24, 1024), (1024, 1024), "c"),
    ("rows", "12×4096×4096", (12, 4096), (4096, 4096), "c"),
    ("rows", "x @ w.T 8×1024×1024", (8, 1024), (1024, 1024), "bt"),
    ("rows", "x @ w.T 12×4096×4096", (12, 4096), (4096, 4096), "bt"),
]


def operands(a_shape: tuple[int, ...], b_shape: tuple[int, ...], layout: str, dtype: str,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Fresh random operands of the given shapes, in the given memory layout."""
    def make(shape: tuple[int, ...], transposed: bool, apart: bool) -> np.ndarray:
        if transposed:  # the transpose of a C-ordered array of the swapped shape
            return rng.standard_normal(shape[::-1]).astype(dtype).T
        if apart:  # the first half of the columns of an array twice as wide
            return rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(dtype)[
                ..., :shape[-1]]
        return rng.standard_normal(shape).astype(dtype)

    a = make(a_shape, layout == "at", layout == "aw")
    b = make(b_shape, layout == "bt", layout == "bw")
    if layout == "f":
        a, b = np.asfortranarray(a), np.asfortranarray(b)
    return a, b


def measure(a: np.ndarray, b: np.ndarray, rounds: int, pause: float) -> dict:
    """Median block time of ``tilegemm.matmul(a, b)`` and ``np.matmul(a, b)``, blocks of
    calls sized to about 20 ms, alternating."""
    ref = np.matmul(a, b)
    got = tilegemm.matmul(a, b)  # compiles (or loads from the cache), then checked
    tilegemm.assert_close(got, a, b, what=f"{a.shape} @ {b.shape} {a.dtype}")  # no timing
    scale = np.abs(a).max() * np.abs(b).max() * a.shape[-1]
    err = float(np.max(np.abs(got.astype(np.float64) - ref))) / max(float(scale), 1e-30)
    calls = calls_per_block(lambda: tilegemm.matmul(a, b))
    times = alternating({"ours": call_block(lambda: tilegemm.matmul(a, b), calls),
                         "numpy": call_block(lambda: np.matmul(a, b), calls)}, rounds,
                        pause=pause)
    ours, npy = float(np.median(times["ours"])), float(np.median(times["numpy"]))
    return {"ms_tilegemm": round(ours * 1e3, 4), "ms_numpy": round(npy * 1e3, 4),
            "ratio": round(npy / ours, 3), "calls_per_block": calls,
            "max_error_over_scale": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--only", nargs="+", choices=sorted({c[0] for c in CASES}),
                    help="groups to run")
    cpu_blocked.add_run_arguments(ap, rounds=5, pause=0.5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for dtype in args.dtypes:
        for group, label, sa, sb, layout in CASES:
            if args.only and group not in args.only:
                continue
            a, b = operands(sa, sb, layout, dtype, rng)
            row = {"group": group, "case": label, "dtype": dtype, "a_shape": list(sa),
                   "b_shape": list(sb), "layout": layout}
            row.update(measure(a, b, args.rounds, args.pause))
            plan = tilegemm.plan(a, b)
            row.update(kernel=plan.kernel, params=plan.params, source=plan.source)
            rows.append(row)
            print(f"{dtype:8s} {group:7s} {label:24s} tilegemm {row['ms_tilegemm']:9.3f} ms  "
                  f"NumPy {row['ms_numpy']:9.3f} ms  ratio {row['ratio']:5.2f}", flush=True)
    if not args.no_save:
        cpu_blocked.save_results("cpu-shapes", {
            "method": f"whole matmul calls vs np.matmul on the same operands, blocks of calls "
                      f"(about 20 ms each, after one untimed call) alternating, {args.pause} s "
                      f"idle before each block, {args.rounds} rounds, median block; ratio = "
                      "NumPy time / tilegemm time",
            "cases": rows,
        }, suffix=args.suffix)


if __name__ == "__main__":
    main()
