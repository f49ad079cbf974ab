"""Parsing ``KEY=VALUE`` kernel parameters from the command line (shared by subcommands)."""

from __future__ import annotations

import argparse

from tilegemm.errors import InvalidValueError


def add_param_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "params", nargs="*", metavar="KEY=VALUE",
        help="kernel parameters, e.g. TILE=16 or BM=128 BN=128 (see 'tilegemm kernels')",
    )


def add_shape_arguments(parser: argparse.ArgumentParser, size: int, batch: int,
                        dtypes: tuple[str, ...], dtype_help: str) -> None:
    """``--m --n --k --batch --dtype``: the product a subcommand runs, explains or tunes."""
    parser.add_argument("--m", type=int, default=size, help="rows of A and of the result")
    parser.add_argument("--n", type=int, default=size, help="columns of B and of the result")
    parser.add_argument("--k", type=int, default=size, help="the shared (contracted) dimension")
    parser.add_argument("--batch", type=int, default=batch,
                        help="batch count" + (" (0: a plain 2-D product)" if batch == 0 else ""))
    parser.add_argument("--dtype", default="float32", choices=dtypes, help=dtype_help)


def parse_params(items: list[str]) -> dict[str, int]:
    params: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidValueError(f"parameter {item!r} is not KEY=VALUE")
        try:
            params[key.strip()] = int(value)
        except ValueError:
            raise InvalidValueError(f"parameter {key}: {value!r} is not an integer") from None
    return params
