"""Show the backends and devices found here, and the versions of what tilegemm uses."""

from __future__ import annotations

import argparse

from tilegemm.bench.environment import versions

HELP = "backends and devices found, versions"

def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    import tilegemm
    from tilegemm.commands._console import console as make_console

    console = make_console()
    table = Table(title="backends")
    for col in ("backend", "usable", "devices", "why"):
        table.add_column(col, overflow="fold")  # long names wrap whole, never cut with …
    for s in tilegemm.backends():
        usable = "[green]yes[/]" if s.usable else "[red]no[/]"
        if s.usable and s.default_problem:  # only a call that names a working device runs
            usable = "[yellow]with device=[/]"
        if s.simulated:
            usable += " (simulated)"
        table.add_row(s.name, usable, escape("\n".join(s.devices)), escape(s.reason))
    console.print(table)
    for details in _device_tables():
        console.print(details)
    vt = Table(title="versions")
    vt.add_column("package", overflow="fold")
    vt.add_column("version", overflow="fold")
    for k, v in versions().items():
        vt.add_row(k, v)
    console.print(vt)
    return 0


def _device_tables() -> list[object]:
    """Each backend's own device table, for the backends that offer one."""
    from tilegemm.backends import get_backend
    from tilegemm.registry import BACKENDS

    tables = (get_backend(name).describe_devices() for name in BACKENDS)
    return [t for t in tables if t is not None]
