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

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=int(os.environ.get("COLUMNS", "160")))
