"""Show or clear the compiled-kernel cache (kernels kept on disk between processes).

The first call of a CPU rung compiles it for several seconds, that of a written-out CUDA
rung (vectorized and up) for tens of seconds on a GPU; the cache keeps the machine code so
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

HELP = "show or clear the compiled-kernel cache"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clear", action="store_true", help="delete every cached kernel")
    parser.add_argument("--stale", action="store_true",
                        help="with --clear: delete only the entries this machine cannot use "
                             "(another version, CPU, driver or kernel source)")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from tilegemm import compile_cache
    from tilegemm.commands._console import console as make_console

    console = make_console()
    root = compile_cache.cache_root()
    if root is None:
        console.print(f"kernel cache: off ({compile_cache.ENV} is set to turn it off)")
        return 0
    if args.stale and not args.clear:
        console.print("--stale only selects what --clear removes: "
                      "'tilegemm cache --clear --stale'")
        return 2
    if args.clear:
        n = compile_cache.clear(stale_only=args.stale)
        what = "stale entr" if args.stale else "entr"
        console.print(f"kernel cache {root}: removed {n} {what}{'y' if n == 1 else 'ies'}")
        return 0
    found = compile_cache.entries()
    total = sum(e.bytes for e in found)
    stale = [e for e in found if not e.current]
    note = (f" ({len(stale)} not usable here, {sum(e.bytes for e in stale) / 1e6:.1f} MB: "
            "'tilegemm cache --clear --stale' removes them)" if stale else "")
    console.print(f"kernel cache {root}: {len(found)} entr{'y' if len(found) == 1 else 'ies'}, "
                  f"{total / 1e6:.1f} MB{note}")
    if found:
        table = Table()
        for col in ("kernel", "dtype", "parameters", "usable here", "versions", "size"):
            table.add_column(col)
        for e in found:
            params = " ".join(f"{k}={v}" for k, v in e.describe.get("params", {}).items())
            versions = " ".join(f"{k} {v}" for k, v in e.versions.items())
            kernel = " ".join(filter(None, (e.describe.get("backend"),
                                            e.describe.get("kernel", e.name))))
            if e.describe.get("output"):
                kernel += f" ({e.describe['output']})"
            table.add_row(kernel, e.describe.get("dtype", ""), params,
                          "yes" if e.current else "no (other version, CPU or driver)", versions,
                          f"{e.bytes / 1e3:.0f} kB")
        console.print(table)
    return 0
