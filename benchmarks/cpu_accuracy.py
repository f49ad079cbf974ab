"""The README's accuracy table: float32 error against float64 as K grows, per summation order.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/cpu_accuracy.py            # prints the table
    PYTHONPATH=src python benchmarks/cpu_accuracy.py --json out.json

8 × 8 outputs, float32 operands, each product compared with the float64 product of the same
float32 values. Data: "all positive" is uniform on [0, 1), the error measured against
Σ|a||b| (= the result here); "random signs" is standard normal, the error measured against
|C| per element (cancellation makes |C| much smaller than Σ|a||b|), largest and median over
the 64 elements. Each figure is the median over ``--seeds`` seeds (largest: the range over
seeds). Summation orders: serial K (the CPU `triple_loop`, the OpenCL `naive` rung when
OpenCL is usable), the CPU `blocked` rung (K in blocks of its KC), NumPy (OpenBLAS).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

import tilegemm  # noqa: E402


def contenders() -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """The summation orders compared, by column name (OpenCL only where it is usable)."""
    got: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
        "triple_loop": lambda a, b: tilegemm.matmul(a, b, backend="cpu", kernel="triple_loop"),
    }
    if any(b.name == "opencl" and b.usable for b in tilegemm.backends()):
        got["opencl naive"] = lambda a, b: tilegemm.matmul(a, b, backend="opencl",
                                                           kernel="naive")
    got["blocked"] = lambda a, b: tilegemm.matmul(a, b, backend="cpu", kernel="blocked")
    got["numpy"] = np.matmul
    return got


def errors(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Error measures of the float32 product ``c`` against the float64 one."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64
    err = np.abs(c.astype(np.float64) - exact)
    scale = np.abs(a64) @ np.abs(b64)
    rel = err / np.abs(exact)
    return {"over_sum_abs": float((err / scale).max()), "largest_over_c": float(rel.max()),
            "median_over_c": float(np.median(rel))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log2k", type=int, nargs="+", default=[10, 20])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    runs = contenders()
    rows = []
    for log2k in args.log2k:
        k = 2**log2k
        for data in ("positive", "signs"):
            per: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
            for seed in range(args.seeds):
                rng = np.random.default_rng(seed)
                if data == "positive":
                    a = rng.random((8, k), dtype=np.float32)
                    b = rng.random((k, 8), dtype=np.float32)
                else:
                    a = rng.standard_normal((8, k), dtype=np.float32)
                    b = rng.standard_normal((k, 8), dtype=np.float32)
                for name, run in runs.items():
                    per[name].append(errors(run(a, b), a, b))
            for name, got in per.items():
                row = {"k": k, "data": data, "rung": name}
                for measure in got[0]:
                    values = sorted(g[measure] for g in got)
                    row[measure] = values[len(values) // 2]
                    row[measure + "_range"] = [values[0], values[-1]]
                rows.append(row)
    print("| K | data | " + " | ".join(runs) + " |")
    print("|---:|---|" + "---:|" * len(runs))
    for log2k in args.log2k:
        k = 2**log2k
        for data, measure, label in (
                ("positive", "over_sum_abs", "uniform [0, 1), error / Σ|a||b|"),
                ("signs", "largest_over_c", "standard normal, largest error / |C|"),
                ("signs", "median_over_c", "standard normal, median error / |C|")):
            if log2k < max(args.log2k) and data == "signs":
                continue
            cells = []
            for name in runs:
                r = next(r for r in rows if r["k"] == k and r["data"] == data
                         and r["rung"] == name)
                lo, hi = r[measure + "_range"]
                cells.append(f"{lo:.1e} – {hi:.1e}" if measure == "largest_over_c"
                             else f"{r[measure]:.1e}")
            print(f"| 2^{log2k} | {label} | " + " | ".join(cells) + " |")
    if args.json:
        # the machine record every CPU results file carries (CPU model, ISA, versions,
        # NumPy's BLAS, the commit), then the figures
        cpu_blocked.save_results("cpu-accuracy", {
            "method": "8x8 outputs of float32 operands against the float64 product of the "
                      "same values; median over the seeds (and the range)",
            "seeds": args.seeds, "rows": rows}, path=Path(args.json))


if __name__ == "__main__":
    main()
