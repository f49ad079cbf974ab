"""Parsing ``KEY=VALUE`` kernel parameters from the command line (shared by subcommands)."""

from __future__ import annotations

import argparse

from tilegemm.errors import InvalidValueError


def add_param_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "params", nargs="*", metavar="KEY=VALUE",
        help="kernel parameters, e.g. TILE=16 or BM=128 BN=128 (see 'tilegemm kernels')",
    )


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
