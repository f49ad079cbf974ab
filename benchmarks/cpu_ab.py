"""Two versions of the CPU ``blocked`` rung timed in one process: this tree's and another
tree's (an earlier commit checked out beside it), product by product, against NumPy.

Usage (from the repository root; take the machine for yourself while it runs)::

    git worktree add /tmp/before <commit>
    PYTHONPATH=src python benchmarks/cpu_ab.py /tmp/before --shapes 16x1024x1024 32x512x512
    PYTHONPATH=src python benchmarks/cpu_ab.py /tmp/before --dtypes float64 --b-transposed \\
        --shapes 16x1024x1024

Why in one process: on a shared 2-vCPU machine the speed of the same code moved by up to a
third between two runs minutes apart (docs/results.md), more than most changes to a path
are worth. Here both generated modules are loaded side by side (``k02_blocked.build`` with
the other tree's ``_blocked_source.py``) and each product is timed for this tree, the
other and NumPy in turn, in blocks of about 20 ms with a pause before each
(``bench.timing.alternating``), so a drift of the machine touches all three alike.

What is compared is the generated module only: the other tree's template runs with this
tree's helper modules, micro-kernel generator and parameters (this machine's, or
``--params``), and the operands are handed to the rung as the CPU backend hands them
(``--b-transposed``: B as the transpose of a C-ordered array, ``x @ w.T``). A template
that needs helpers this tree no longer has fails to import: compare nearer commits. Each
result is checked against float64 NumPy first. Prints medians in µs; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import tilegemm
from tilegemm.bench.timing import alternating, call_block, calls_per_block
from tilegemm.kernels.cpu import k02_blocked


def shape(text: str) -> tuple[int, int, int]:
    """``MxNxK`` as three sides."""
    sides = tuple(int(x) for x in text.lower().split("x"))
    if len(sides) != 3 or min(sides) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MxNxK, e.g. 16x1024x1024")
    return sides  # type: ignore[return-value]


def param(text: str) -> tuple[str, int]:
    """``NAME=VALUE``, an integer rung parameter."""
    name, _, value = text.partition("=")
    if not name or not value.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=INTEGER, e.g. KC=256")
    return name, int(value)


def compare(programs: dict[str, Any], dtype: np.dtype, sides: tuple[int, int, int],
            b_transposed: bool, rounds: int, pause: float, rng: np.random.Generator
            ) -> dict[str, float]:
    """Median µs per product of each program and of NumPy on fresh operands of these sides,
    after checking each program's product against float64 NumPy."""
    m, n, k = sides
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    want = a.astype(np.float64) @ b
    one, zero = dtype.type(1), dtype.type(0)
    if b_transposed:  # the transpose of a C-ordered array, handed over as its storage
        w = np.ascontiguousarray(b.T)
        a3, b3, tr = a[None], w[None], 2

        def numpy_call() -> Any:
            return a @ w.T
    else:
        a3, b3, tr = a[None], b[None], 0

        def numpy_call() -> Any:
            return a @ b

    def product(run: Any) -> np.ndarray:
        c = np.empty((1, m, n), dtype)
        run(a3, b3, c, one, zero, tr)
        return c

    for name, run in programs.items():
        err = np.abs(product(run)[0] - want).max() / max(np.abs(want).max(), 1e-30)
        if not err < 1e-4 * np.sqrt(k):
            raise SystemExit(f"{name} {dtype} {m}x{n}x{k}: relative error {err:.2e}")
    calls = {name: partial(product, run) for name, run in programs.items()}
    calls["NumPy"] = numpy_call
    blocks = {name: call_block(call, calls_per_block(call)) for name, call in calls.items()}
    got = alternating(blocks, rounds, pause=pause)
    return {name: statistics.median(t) * 1e6 for name, t in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other", type=Path, help="the other tree (its src/ holds tilegemm)")
    ap.add_argument("--shapes", type=shape, nargs="+", required=True)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--b-transposed", action="store_true",
                    help="B as the transpose of a C-ordered array (x @ w.T)")
    ap.add_argument("--params", type=param, nargs="*", default=[], metavar="NAME=VALUE",
                    help="rung parameters instead of this machine's (MR=8 NR=32 ...)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pause", type=float, default=0.25)
    args = ap.parse_args(argv)
    folder = args.other / "src" / "tilegemm" / "kernels" / "cpu"
    if not (folder / "_blocked_source.py").is_file():
        ap.error(f"{args.other}: no src/tilegemm/kernels/cpu/_blocked_source.py there")
    rng = np.random.default_rng(1)
    print(f"this tree against {args.other}; µs per product, medians of {args.rounds} blocks")
    for dtype in map(np.dtype, args.dtypes):
        probe = np.ones((64, 64), dtype)
        params = {**tilegemm.plan(probe, probe, kernel="blocked").params, **dict(args.params)}
        programs = {"this": k02_blocked.build(params, dtype),
                    "other": k02_blocked.build(params, dtype, template_dir=folder)}
        for m, n, k in args.shapes:
            us = compare(programs, dtype, (m, n, k), args.b_transposed, args.rounds, args.pause,
                         rng)
            print(f"{dtype} {m}x{n}x{k}{' (x @ w.T)' if args.b_transposed else ''}: "
                  f"this {us['this']:9.1f}  other {us['other']:9.1f}  NumPy {us['NumPy']:9.1f}"
                  f"  | other/this {us['other'] / us['this']:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
