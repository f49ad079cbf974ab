"""List the kernel ladder: rungs, parameters, constraints; optionally compiled resources."""

from __future__ import annotations

import argparse

from tilegemm.commands._params import KERNEL_TYPES_NOTE
from tilegemm.errors import InvalidValueError
from tilegemm.registry import BACKENDS, specs_for

HELP = "the kernel ladder, with parameters and constraints"
DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16")  # any rung's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, help="one backend only")
    parser.add_argument("--resources", action="store_true",
                        help="compile each CUDA rung (Numba with nvJitLink, CUDA C with NVRTC) at "
                             "its defaults for sm_80 and sm_90 (no GPU needed) and show "
                             "registers, spills, shared memory")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="only the rungs that compute this element type; with "
                             "--resources, the type compiled (default: float32). Choices are "
                             + KERNEL_TYPES_NOTE)
    form = parser.add_mutually_exclusive_group()  # one output format per call
    form.add_argument("--json", action="store_true", help="print JSON instead of a table")
    form.add_argument("--markdown", action="store_true",
                      help="print a Markdown table (the README's ladder table is made so)")


def run(args: argparse.Namespace) -> int:
    import json

    from rich.table import Table

    import tilegemm
    from tilegemm.commands._console import console

    specs = tilegemm.kernels(args.backend)
    if args.dtype is not None:
        specs = [s for s in specs if s.supports(args.dtype)]
    if args.resources:
        args.dtype = args.dtype or "float32"
        return _resources(specs, args)
    if args.json:
        print(json.dumps([{
            "name": s.name, "backend": s.backend, "rung": s.rung, "title": s.title,
            "dtypes": list(s.dtypes), "summary": s.summary,
            "params": {p.name: {"default": p.default, "choices": list(p.choices), "help": p.help}
                       for p in s.params},
            "constraints": [c.text for c in s.constraints],
            "device_defaults": {kind: dict(d) for kind, d in s.device_defaults.items()},
        } for s in specs], indent=2))
        return 0
    if args.markdown:
        print(markdown_table(specs))
        return 0
    if not specs:  # an empty table would say nothing about why
        console().print(_none_computes(args.backend, args.dtype), highlight=False)
        return 0
    table = Table(title="tilegemm kernel ladder", show_lines=True)
    for col in ("backend", "rung", "kernel", "what it does", "parameters (default: choices)",
                "constraints", "dtypes"):
        table.add_column(col, overflow="fold")
    for s in specs:
        params = "\n".join(f"{p.name}={p.default}: {','.join(map(str, p.choices))}"
                           for p in s.params)
        table.add_row(s.backend, str(s.rung), s.name, s.title, params,
                      "\n".join(c.text for c in s.constraints), ", ".join(s.dtypes))
    out = console()
    out.print(table)
    for s in specs:  # defaults measured for a kind of device replace the rung's there
        for kind, values in s.device_defaults.items():
            shown = " ".join(f"{k}={v}" for k, v in values.items())
            out.print(f"{s.backend} {s.name} on {kind} devices: defaults {shown}",
                      highlight=False)
    out.print("What a call runs by default on your device, tuned and shipped measurements "
              "included: tilegemm.plan(a, b) or 'tilegemm run' (its 'chosen:' line).",
              highlight=False)
    return 0


def _resources(specs: list, args: argparse.Namespace) -> int:
    import json

    import numpy as np
    from rich.table import Table

    from tilegemm.analysis.resources import archs_for
    from tilegemm.backends import get_backend
    from tilegemm.commands._console import console

    # Each backend compiles its own rungs (no GPU needed) and says what the compiler
    # allocated; backends whose toolchain cannot tell report None and are left out.
    rows = []
    for s in specs:
        if not s.supports(args.dtype):
            continue
        for arch in archs_for(s):
            report = get_backend(s.backend).resource_report(s, {}, np.dtype(args.dtype), arch)
            if report is None:
                break
            rows.append({"backend": s.backend, **report.as_dict()})
    if not rows:
        compiled = [n for n in BACKENDS if get_backend(n).compile_archs]
        if args.backend in compiled:  # it has compiled rungs, none for this dtype
            others = [n for n in compiled if any(s.supports(args.dtype)
                                                  for s in specs_for(n))]
            raise InvalidValueError(
                f"no {args.backend} rung computes {args.dtype}"
                + (f"; the {' and '.join(others)} rungs that do: --backend {others[0]}"
                   if others else ""))
        raise InvalidValueError(
            "--resources reports compiled CUDA rungs (registers, spills, shared memory); "
            f"backend {args.backend!r} has none: use --backend "
            f"{' or '.join(compiled)}, or none")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    title = f"CUDA rungs compiled for each arch ({args.dtype}, default parameters)"
    caption = ("smem: static shared memory per block as the compiler reports it (ptxas's "
               "figure for the Numba rungs on sm_90 includes the 1 KiB the driver reserves "
               "per block; NVRTC's for the CUDA C rungs does not). Dynamic shared memory "
               "(mma, wgmma) is sized at launch and not included.")
    columns = ("backend", "kernel", "arch", "params", "registers", "spill st/ld (B)",
               "stack (B)", "smem (B)")
    cells = [(r["backend"], r["kernel"], r["arch"],
              " ".join(f"{k}={v}" for k, v in r["params"].items()), str(r["registers"]),
              f"{r['spill_stores']}/{r['spill_loads']}", str(r["stack"]), str(r["smem"]))
             for r in rows]
    if args.markdown:
        print(f"**{title}**\n\n| " + " | ".join(columns) + " |\n|"
              + "---|" * len(columns))
        for row in cells:
            print("| " + " | ".join(row) + " |")
        print(f"\n{caption}")
        return 0
    table = Table(title=title, caption=caption)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in cells:
        table.add_row(*row)
    console().print(table)
    return 0


def markdown_table(specs: list) -> str:
    """The ladder as a Markdown table, straight from the registry."""
    lines = ["| backend | rung | kernel | what changed | parameters (default) | dtypes |",
             "|---|---|---|---|---|---|"]
    for s in specs:
        params = ", ".join(f"{p.name}={p.default}" for p in s.params) or "–"
        lines.append(f"| {s.backend} | {s.rung} | `{s.name}` | {s.title} | {params} | "
                     f"{', '.join(s.dtypes)} |")
    return "\n".join(lines)


def _none_computes(backend: str | None, dtype: str) -> str:
    """Why ``--dtype`` left no rung: which backends' rungs compute the type, and that matmul
    still takes such operands (it converts them to a type a rung computes, as float16 to
    float32 on the CPU)."""
    import tilegemm

    others = sorted({s.backend for s in tilegemm.kernels() if s.supports(dtype)})
    where = f"{backend} " if backend else ""
    also = f" (the {' and '.join(others)} rungs do)" if others else ""
    return (f"No {where}rung computes {dtype}{also}. matmul still takes {dtype} operands: it "
            f"computes them in a type a rung computes; 'tilegemm run --dtype {dtype}' or "
            "tilegemm.plan(a, b) shows which.")
