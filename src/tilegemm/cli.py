"""The ``tilegemm`` command. Each subcommand is a module in ``tilegemm.commands``.

A subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Errors a user can cause (bad shapes, parameters, missing backends,
sizes that do not fit in memory) print as one readable line and exit with status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import tilegemm.commands as commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilegemm", description="Matrix multiplication as a ladder of kernels."
    )
    parser.add_argument("--version", action="version",
                        version=f"tilegemm {importlib.import_module('tilegemm').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"tilegemm.commands.{info.name}")
        p = sub.add_parser(info.name.replace("_", "-"), help=module.HELP,
                           description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes a positional KERNEL and the KEY=VALUE list in one chunk, so KEY=VALUE
    # written after options ('explain shared --m 64 TILE=8') arrives here as extra words.
    if extra and hasattr(args, "params") and all(
            "=" in e and not e.startswith("-") for e in extra):
        args.params = list(args.params or []) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, RuntimeError, OSError, MemoryError) as exc:
        print(f"tilegemm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
