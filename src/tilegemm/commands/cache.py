"""Show or clear the compiled-kernel cache (kernels kept on disk between processes).

The first call of a CPU rung compiles it for several seconds, that of a CUDA rung whose k
loop is generated as straight-line code (vectorized and up) for seconds to tens of seconds
(rungs 7-9 took about 35 s on the first H100 run); the cache keeps the machine code so
later processes load it in a fraction of a second. It also holds the PTX that
'kernels --resources' and 'explain --sass' compile, and PoCL's OpenCL programs. Entries
written by another tilegemm, Numba, numba-cuda or Python version, or on another CPU or
driver, are never loaded; --clear removes everything, --clear --stale only those (entries
another machine sharing the directory still uses count as stale here).
TILEGEMM_KERNEL_CACHE sets the directory ('off' disables the cache). The tuning results
('tilegemm tune') are kept separately; 'tilegemm tune --clear' removes those.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tilegemm.errors import InvalidValueError

HELP = "show or clear the compiled-kernel cache"


SUMMARY_ABOVE = 10  # entries: more than this are summarised unless --verbose asks for rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clear", action="store_true", help="delete every cached kernel")
    parser.add_argument("--stale", action="store_true",
                        help="with --clear: delete only the entries this machine cannot use "
                             "(another version, CPU, driver or kernel source)")
    parser.add_argument("--verbose", "--list", action="store_true",
                        help=f"one row per entry (shown anyway for up to {SUMMARY_ABOVE} "
                             "entries); otherwise counts and sizes per backend and kernel")


def run(args: argparse.Namespace) -> int:
    from tilegemm import compile_cache
    from tilegemm.commands._console import console as make_console

    console = make_console()
    root = compile_cache.cache_root()
    if args.stale and not args.clear:
        raise InvalidValueError("--stale only selects what --clear removes: "
                                "'tilegemm cache --clear --stale'")
    if root is None:
        console.print(f"kernel cache: off ({compile_cache.ENV}="
                      f"{os.environ.get(compile_cache.ENV, '')!r} turns it off; nothing is "
                      "kept or cleared)")
        return 0
    unusable = _unusable(root)  # (root is absolute: compile_cache.cache_root)
    if unusable and (not args.clear or not root.is_dir()):
        # said once, here: nothing will be kept there (--clear still tries a folder it
        # cannot write to: its entries are named if they stay; where no folder is, as
        # when a file stands in its place, there is nothing to clear)
        console.print(f"kernel cache {root}: cannot be used ({unusable}); kernels are "
                      f"compiled without it. Set {compile_cache.ENV} to a directory, or "
                      "'off'")
        return 0
    if args.clear:
        n = compile_cache.clear(stale_only=args.stale)
        what = "stale entr" if args.stale else "entr"
        console.print(f"kernel cache {root}: removed {n} {what}{'y' if n == 1 else 'ies'}")
        return 0
    found = compile_cache.entries()
    total = sum(e.bytes for e in found)
    stale = [e for e in found if not e.current]
    note = (f" ({len(stale)} not usable here, {_mb(sum(e.bytes for e in stale))}: "
            "'tilegemm cache --clear --stale' removes them)" if stale else "")
    console.print(f"kernel cache {root}: {len(found)} entr{'y' if len(found) == 1 else 'ies'}, "
                  f"{_mb(total)}{note}")
    if not found:
        return 0
    if args.verbose or len(found) <= SUMMARY_ABOVE:
        console.print(_rows(found))
    else:
        console.print(_summary(found))
        console.print("'tilegemm cache --verbose' lists every entry")
    return 0


def _unusable(root: Path) -> str:
    """Why the cache directory cannot hold entries ("" when it can or will be created),
    found by writing a file there, as the kernel cache will: permission bits say yes to
    root in a read-only or pseudo file system (/proc), where a call then warns."""
    from tilegemm.commands._params import unwritable

    return unwritable(root, folder=True) or ""


def _backend(e) -> str:  # noqa: ANN001 - a compile_cache.CacheEntry
    """The backend an entry serves: its own record, else where it lies (CPU modules carry
    no backend name; PoCL's programs have no files of ours)."""
    if e.describe.get("backend"):
        return e.describe["backend"]
    return "cpu" if e.files else "opencl"


def _kernel(e) -> str:  # noqa: ANN001
    kernel = e.describe.get("kernel", e.name)
    return f"{kernel} ({e.describe['output']})" if e.describe.get("output") else kernel


def _summary(found: list):  # noqa: ANN202 - a rich Table
    """Counts and sizes per backend and kernel: readable whatever the cache holds."""
    from rich.table import Table

    groups: dict[tuple[str, str], list] = {}
    for e in found:
        groups.setdefault((_backend(e), _kernel(e)), []).append(e)
    table = Table()
    for col, justify in (("backend", "left"), ("kernel", "left"), ("dtypes", "left"),
                         ("entries", "right"), ("usable here", "right"), ("size", "right")):
        table.add_column(col, justify=justify, overflow="fold")
    for (backend, kernel), group in sorted(groups.items()):
        dtypes = sorted({e.describe["dtype"] for e in group if e.describe.get("dtype")})
        table.add_row(backend, kernel, " ".join(dtypes), str(len(group)),
                      str(sum(e.current for e in group)), _mb(sum(e.bytes for e in group)))
    return table


def _rows(found: list):  # noqa: ANN202 - a rich Table
    """One row per entry. Its id (the start of its key's digest, as in its file name) and
    when it was written tell apart entries that differ only in what the row does not show
    (the CPU or the kernel source it was compiled for)."""
    from rich.table import Table

    table = Table(caption="usable here: no = written by another tilegemm, Numba or Python "
                          "version, or for another CPU, driver or kernel source")
    table.add_column("id", no_wrap=True)
    for col in ("kernel", "dtype", "parameters", "usable here", "written", "versions"):
        table.add_column(col, overflow="fold")
    table.add_column("size", justify="right", overflow="fold")
    for e in found:
        params = " ".join(f"{k}={v}" for k, v in e.describe.get("params", {}).items())
        versions = " ".join(f"{k} {v}" for k, v in e.versions.items())
        table.add_row(e.name.rsplit("-", 1)[-1][:12], f"{_backend(e)} {_kernel(e)}",
                      e.describe.get("dtype", ""), params, "yes" if e.current else "no",
                      _written(e), versions, f"{e.bytes / 1e3:.0f} kB")
    return table


def _written(e) -> str:  # noqa: ANN001
    import time

    try:
        stamp = max(p.stat().st_mtime for p in e.files)
    except (OSError, ValueError):  # no files of ours (PoCL), or removed meanwhile
        return ""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"
