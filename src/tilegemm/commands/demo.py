"""The main job: run the ladder on the best backends present and print what each rung gets.

Every rung of every usable, non-simulated backend runs at a small size, is verified against
float64 NumPy and timed. (Superseded by the benchmark harness's quick report when it lands.)
"""

from __future__ import annotations

import argparse

HELP = "run the ladder on this machine's backends (quick)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=256, help="M = N = K")


def run(args: argparse.Namespace) -> int:
    import time

    import numpy as np
    from rich.console import Console
    from rich.table import Table

    import tilegemm
    from tilegemm.backends import get_backend
    from tilegemm.reference import assert_close, random_operands

    n = args.size
    a, b = random_operands((n, n), (n, n), np.float32)
    table = Table(title=f"tilegemm ladder, float32, {n}³")
    for col in ("backend", "rung", "kernel", "verified", "GFLOP/s"):
        table.add_column(col)
    t0 = time.perf_counter()
    _ = a @ b
    numpy_t = time.perf_counter() - t0
    failed = 0
    for status in tilegemm.backends():
        if not status.usable or status.simulated:
            continue
        be = get_backend(status.name)
        for spec in tilegemm.kernels(status.name):
            c = tilegemm.matmul(a, b, kernel=spec.name, backend=status.name)
            try:
                assert_close(c, a, b)
                ok = "yes"
            except AssertionError:
                ok, failed = "[red]NO[/]", failed + 1
            t0 = time.perf_counter()
            tilegemm.matmul(a, b, out=c, kernel=spec.name, backend=status.name)
            be.synchronize()
            t = time.perf_counter() - t0
            table.add_row(status.name, str(spec.rung), spec.name, ok, f"{2 * n**3 / t / 1e9:.1f}")
    table.add_row("numpy", "-", "a @ b", "reference", f"{2 * n**3 / numpy_t / 1e9:.1f}")
    Console().print(table)
    return 1 if failed else 0
