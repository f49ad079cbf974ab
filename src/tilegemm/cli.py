"""The ``tilegemm`` command. Each subcommand is a module in ``tilegemm.commands``.

A subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``.

Exit status: 0 success; 1 a kernel computed a wrong result; 2 the command was refused
(errors a user can cause: bad shapes, parameters, missing backends, sizes that do not fit
in memory; one readable line, never a traceback); 3 an internal error, a bug in tilegemm or
a library it uses (one line too, unless ``--debug`` or ``TILEGEMM_DEBUG=1`` asks for the
traceback). Output cut short by the reader (``tilegemm ... | head``) is not an error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys
import traceback
import warnings

import tilegemm.commands as commands
from tilegemm.errors import UsageError

EXIT_REFUSED = 2
EXIT_INTERNAL = 3


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (paragraphs kept), and every option's default shown."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or default is None or default is False
                or default is argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def plain(doc: str | None) -> str | None:
    """A docstring as terminal text: reStructuredText's ``literal`` marks removed."""
    return None if doc is None else re.sub(r"``([^`]+)``", r"\1", doc)


# A keyword of the Python API as an error message writes it: backend='cpu', kernel=
_KEYWORD = re.compile(r"\b([a-z_]+)=(?:'([^']*)'|(?=[\s),;:]|$))")


def as_flags(text: str, options: frozenset[str]) -> str:
    """An error message of the Python API in the command line's words: ``backend='cpu'``
    becomes ``--backend cpu`` and ``kernel=`` becomes ``--kernel`` where the subcommand has
    that option (others are left as written: no flag is named that does not exist)."""

    def flag(match: re.Match[str]) -> str:
        name = "--" + match.group(1).replace("_", "-")
        if name not in options:
            return match.group(0)
        value = match.group(2)
        return name if value is None else f"{name} {value}"

    return _KEYWORD.sub(flag, text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilegemm", description="Matrix multiplication as a ladder of kernels."
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an internal error "
                             "(also TILEGEMM_DEBUG=1)")
    parser.add_argument("--version", action="version",
                        version=f"tilegemm {importlib.import_module('tilegemm').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"tilegemm.commands.{info.name}")
        p = sub.add_parser(info.name.replace("_", "-"), help=module.HELP,
                           description=plain(module.__doc__),
                           formatter_class=_HelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _parser=p, _options=frozenset(
            o for action in p._actions for o in action.option_strings))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # --debug is accepted anywhere on the line, not only before the subcommand.
    debug = "--debug" in argv or os.environ.get("TILEGEMM_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes a positional KERNEL and the KEY=VALUE list in one chunk, so KEY=VALUE
    # written after options ('explain shared --m 64 TILE=8') arrives here as extra words.
    if extra and hasattr(args, "params") and all(
            "=" in e and not e.startswith("-") for e in extra):
        args.params = list(args.params or []) + extra
    elif extra:  # with the subcommand's own usage line, which lists what it takes
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_run", None):
        # No subcommand is a usage error (argparse's convention): a script that forgot it
        # must not read success.
        parser.print_help(sys.stderr)
        return EXIT_REFUSED
    shown = warnings.formatwarning
    if not debug:  # a warning in one line, as errors are (not a file, line and source)
        warnings.formatwarning = _one_line_warning
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader closed the pipe (``| head``): stop quietly, as other Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130
    except (UsageError, MemoryError, OSError) as exc:
        # Refused input, or a size/file the machine cannot provide: the user can fix it.
        if debug:
            traceback.print_exc()
        text = as_flags(str(exc), getattr(args, "_options", frozenset()))
        print(f"tilegemm: error: {text}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        text = " ".join(str(exc).split()) or "(no message)"
        print(f"tilegemm: internal error: {type(exc).__name__}: {text} (this is a bug; "
              "run with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        warnings.formatwarning = shown


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    """A warning as the command line shows it: ``tilegemm: warning: <text>`` (Python's
    own form names the ``tilegemm`` script's line and repeats its source)."""
    text = " ".join(str(message).split())
    return f"tilegemm: warning: {text} ({category.__name__})\n"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
