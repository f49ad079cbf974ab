"""Products of a few row blocks (M from MC to a few MC, K and N large) on the CPU: split
into row blocks that share a packed panel of B, against one row block whose threads each
pack their own part of B (the L2 rule of ``k02_blocked.one_row_block``).

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/cpu_row_blocks.py               # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/cpu_row_blocks.py --no-save --share 0.75

Three ways are timed in alternating blocks of whole ``matmul`` calls with a pause before
each block (as in ``cpu_shapes``): ``split`` (no L2 budget: more than MC rows are always
several row blocks), ``rule`` (this CPU's budget, ``ONE_BLOCK_L2_SHARE`` of its L2, or
``--share``) and NumPy; each ratio is NumPy's median block time over ours (> 1: faster than
NumPy). Run it on a CPU whose L2 differs from the machines the rule was measured on (see
docs/cpu.md) before changing the share. Writes
``benchmarks/results/cpu-row-blocks-<cpu>-<isa>-m<family>-<model>.json``.
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
from tilegemm.backends.cpu import l2_cache_bytes  # noqa: E402
from tilegemm.bench.timing import alternating, call_block, calls_per_block  # noqa: E402
from tilegemm.kernels.cpu import k02_blocked  # noqa: E402
from tilegemm.kernels.cpu._threads import planned_threads  # noqa: E402

SHAPES = [(m, n, n) for m in (128, 192, 256, 384) for n in (2048, 4096)] + [
    (2048, 2048, 32), (512, 4096, 64)]  # K < KC: a panel of B that L2 holds


def module_of(dtype: str) -> tuple[object, dict[str, int]]:
    """The generated module ``kernel="auto"`` runs for ``dtype``, and its parameters."""
    spec = next(s for s in tilegemm.kernels("cpu") if s.name == "blocked")
    x = np.ones((256, 256), dtype)
    params = dict(tilegemm.plan(x, x).params)
    return spec.program(params, np.dtype(dtype)).module, params


def measure(mod: object, a: np.ndarray, b: np.ndarray, budget: int, rounds: int,
            pause: float) -> dict[str, float]:
    def ours(value: int) -> Callable[[], object]:
        def call() -> object:
            mod.L2_BUDGET = value
            return tilegemm.matmul(a, b)
        return call

    ways = {"split": ours(0), "rule": ours(budget), "numpy": lambda: np.matmul(a, b)}
    for name in ("split", "rule"):
        tilegemm.assert_close(ways[name](), a, b, what=f"{name} {a.shape} @ {b.shape}")
    calls = calls_per_block(ways["split"], 0.03)
    times = alternating({k: call_block(f, calls) for k, f in ways.items()}, rounds,
                        pause=pause)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {"ratio_split": round(med["numpy"] / med["split"], 3),
            "ratio_rule": round(med["numpy"] / med["rule"], 3),
            "ms_numpy": round(med["numpy"] * 1e3, 3), "calls_per_block": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--share", type=float, default=k02_blocked.ONE_BLOCK_L2_SHARE,
                    help="share of L2 for the block of A and a chunk of B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pause", type=float, default=0.4)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    l2 = l2_cache_bytes()
    if l2 is None:
        sys.exit("this system does not say how large its L2 cache is: nothing to compare")
    budget = int(l2 * args.share)
    threads = planned_threads()
    rng = np.random.default_rng(0)
    rows = []
    for dtype in args.dtypes:
        mod, params = module_of(dtype)
        default = mod.L2_BUDGET
        item = np.dtype(dtype).itemsize
        try:
            for m, n, k in SHAPES:
                a = rng.standard_normal((m, k)).astype(dtype)
                b = rng.standard_normal((k, n)).astype(dtype)
                one = k02_blocked.one_row_block(m, n, k, threads, params, item, budget)
                row = {"dtype": dtype, "m": m, "n": n, "k": k, "params": params,
                       "one_row_block_by_rule": one}
                row.update(measure(mod, a, b, budget, args.rounds, args.pause))
                rows.append(row)
                print(f"{dtype:8s} {m:5d}x{n}x{k:<5d} one block: {one!s:5s} split "
                      f"{row['ratio_split']:5.2f}  rule {row['ratio_rule']:5.2f}  (x NumPy)",
                      flush=True)
        finally:
            mod.L2_BUDGET = default
    if not args.no_save:
        cpu_blocked.save_results("cpu-row-blocks", {
            "share": args.share, "budget_bytes": budget, "threads": threads,
            "method": f"whole matmul calls, split / rule / np.matmul in alternating blocks "
                      f"(about 30 ms each, after one untimed call), {args.pause} s idle before "
                      f"each block, {args.rounds} rounds, median block; ratio = NumPy time / "
                      "tilegemm time",
            "cases": rows,
        })


if __name__ == "__main__":
    main()
