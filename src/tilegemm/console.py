"""The rich console every subcommand prints through.

Rich assumes 80 columns when output is not a terminal (CI logs, ``make demo | tee``), which
truncates the wide benchmark and ladder tables into ellipses. Off a terminal we use the
``COLUMNS`` environment variable if set, else 160 columns.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich exits with status 1 when the reader closes the pipe (``| head``), which
            # the command line uses for "verification failed"; the command line's own
            # handling (quiet, status 141 as other Unix tools) applies instead.
            raise BrokenPipeError

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return _Console(stderr=stderr)
    return _Console(stderr=stderr, width=_columns())


def _columns() -> int:
    """``COLUMNS`` when it is a usable width (empty, text or 0 is not: 160, as unset)."""
    try:
        width = int(os.environ.get("COLUMNS", "").strip() or 160)
    except ValueError:
        return 160
    return width if width > 0 else 160

