"""Show the backends and devices found here, and the versions of what tilegemm uses."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import platform

HELP = "backends and devices found, versions"

PACKAGES = ("tilegemm", "numpy", "numba", "numba-cuda", "pyopencl", "pocl-binary-distribution",
            "cuda-bindings", "nvidia-nvjitlink", "cupy-cuda12x", "cupy-cuda13x", "torch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return found


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    import tilegemm
    from tilegemm.commands._console import console as make_console

    console = make_console()
    table = Table(title="backends")
    for col in ("backend", "usable", "devices", "why"):
        table.add_column(col)
    for s in tilegemm.backends():
        usable = "[green]yes[/]" if s.usable else "[red]no[/]"
        if s.simulated:
            usable += " (simulated)"
        table.add_row(s.name, usable, "\n".join(s.devices), s.reason)
    console.print(table)
    extra = _opencl_details()
    if extra:
        console.print(extra)
    vt = Table(title="versions")
    vt.add_column("package")
    vt.add_column("version")
    for k, v in versions().items():
        vt.add_row(k, v)
    console.print(vt)
    return 0


def _opencl_details() -> object | None:
    """The OpenCL backend's own device table, when it offers one."""
    from tilegemm.backends import get_backend

    be = get_backend("opencl")
    describe = getattr(be, "describe_devices", None)
    return describe() if describe else None
