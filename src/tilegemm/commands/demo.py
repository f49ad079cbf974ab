"""`make demo`: the quick benchmark of every rung on this machine's backends.

Same as ``tilegemm bench`` (quick by default): every rung of every usable, non-simulated
backend is verified against float64 NumPy, then timed, and shown beside the vendor library
(NumPy/OpenBLAS on the CPU, CLBlast for OpenCL, cuBLAS on NVIDIA GPUs). The ladder table
comes last: every rung at its defaults, and what ``matmul(kernel="auto")`` runs on this
machine (tuned, or the shipped database's parameters). All of ``tilegemm bench``'s options
work here too (``--full``, ``--save``...).
"""

from __future__ import annotations

import argparse

from tilegemm.commands import bench

HELP = "quick benchmark of the whole ladder on this machine (= tilegemm bench --quick)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bench.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return bench.run(args)
