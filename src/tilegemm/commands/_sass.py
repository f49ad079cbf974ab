"""``tilegemm explain --sass``: the machine-code counts of CUDA rungs as a table or JSON."""

from __future__ import annotations

import argparse

from tilegemm.commands._params import parse_params
from tilegemm.errors import InvalidValueError

SHORT = {"fma": "fma", "lds": "LDS", "ldg": "LDG", "sts": "STS", "bar": "BAR", "int": "int",
         "move": "move", "branch": "branch"}


def _specs(args: argparse.Namespace) -> list:
    from tilegemm import registry
    from tilegemm.backends import get_backend

    def tiled(specs: tuple) -> list:
        # FFMA rungs only: the counts are per FFMA (a tensor-core rung issues HMMA instead)
        return [s for s in specs if {"BM", "BN", "BK"} <= {p.name for p in s.params}
                and not s.precisions]

    if args.kernel == "all":
        specs = tiled(registry.specs_for(args.backend))
    else:
        from tilegemm.commands.explain import rung

        # each rung once, in the order given; "a,,b" and a trailing comma name nothing more
        names = dict.fromkeys(n.strip() for n in args.kernel.split(",") if n.strip())
        if not names:
            raise InvalidValueError(f"no kernel named in {args.kernel!r}")
        specs = [rung(name, args.backend) for name in names]
    for s in specs:
        if not get_backend(s.backend).compile_archs:
            raise InvalidValueError(f"{s.name} is a {s.backend} kernel; --sass needs a CUDA rung")
    if args.yardstick:  # the other compiled backends' rungs (CUDA C), side by side
        specs += [s for name in registry.BACKENDS if name != args.backend
                  and get_backend(name).compile_archs for s in tiled(registry.specs_for(name))]
    return specs


def _check_blocks(specs: list, params: dict | None, dtype: str) -> None:
    """Each rung's parameters (given, else its defaults) against the dtype and a block's
    limits, as a call checks them: a float64 tile over 48 KB of shared memory was an
    'internal error' of the compiler."""
    from tilegemm.backends.cuda import check_for_any_gpu

    if dtype not in ("float32", "float64", "float16", "bfloat16"):
        return  # refused below, in the words of the table asked for
    for s in specs:
        if s.supports(dtype):
            check_for_any_gpu(s, params if params is not None else s.resolve({}), dtype)


def run_sass(args: argparse.Namespace) -> int:
    import json

    from tilegemm.analysis.resources import ARCHS
    from tilegemm.analysis.sass import nvdisasm_path, sass_report, toolchain

    if args.arch not in ARCHS:
        raise InvalidValueError(f"unknown arch {args.arch!r}; choices: {', '.join(ARCHS)}")
    specs = _specs(args)
    params = parse_params(args.params)
    if params and len(specs) > 1:
        raise InvalidValueError(
            "KEY=VALUE parameters apply to one rung at a time, and this counts "
            f"{len(specs)} ({', '.join(s.name for s in specs)}"
            + ("; --yardstick adds the CUDA C rungs at their defaults" if args.yardstick
               else "") + "): name one rung, without --yardstick")
    if len(specs) == 1:
        params = specs[0].resolve(params)  # unknown names and broken constraints refused
    _check_blocks(specs, params if len(specs) == 1 else None, args.dtype)
    tensor = [s for s in specs if s.precisions]  # HMMA, not FFMA: counted on their own
    if tensor:
        if len(tensor) < len(specs):
            raise InvalidValueError(
                f"{', '.join(s.name for s in tensor)} (tensor cores, counted per HMMA) cannot "
                "share a table with the FFMA rungs "
                f"({', '.join(s.name for s in specs if not s.precisions)}): explain them "
                "separately" + (" (--yardstick adds FFMA rungs)" if args.yardstick else ""))
        return _run_mma(args, tensor, params if len(specs) == 1 else None)
    if args.dtype not in ("float32", "float64"):
        raise InvalidValueError("--sass counts the FFMA rungs in float32 or float64 (--dtype); "
                                "float16 and bfloat16 run on the tensor-core rungs (mma)")
    nvdisasm_path()
    reports = [sass_report(s, params if len(specs) == 1 else None, args.dtype, args.arch)
               for s in specs]
    if args.json:
        print(json.dumps({"toolchain": toolchain(),
                          "kernels": [dict(r.as_dict(), hot_loop_sass=r.hot_lines)
                                      if args.hot_loop else r.as_dict() for r in reports]},
                         indent=2))
        return 0
    from rich.table import Table

    from tilegemm.analysis.sass import CLASSES
    from tilegemm.commands._console import console

    out = console()
    tools = toolchain()
    table = Table(title=f"Machine code per thread per k step ({args.dtype}, {args.arch}; "
                        f"nvdisasm {tools['nvdisasm']}, NVVM {tools['nvvm']})")
    shown = ("fma", "lds", "ldg", "sts", "bar", "int", "move", "branch")
    for col in ("kernel", "region", "instr", *(SHORT[c] for c in shown), "rest", "FFMA share",
                "FFMA/LDS byte"):
        table.add_column(col, justify="left" if col in ("kernel", "region") else "right",
                         overflow="fold")
    for r in reports:
        d = r.as_dict()
        for region, title in (("hot_loop", "hot loop"), ("k_tile", "k-tile"),
                              ("k_tile_edge", "edge k-tile")):
            x = d[region]
            per = x["per_kstep"]
            rest = sum(per[c] for c in CLASSES if c not in shown)
            fpb = x["fma_per_shared_byte"]
            table.add_row(f"{r.kernel} ({r.source})" if region == "hot_loop" else "", title,
                          f"{per['total']:.1f}", *(f"{per[c]:.3g}" for c in shown),
                          f"{rest:.3g}", f"{x['fma_share']:.1%}",
                          "–" if fpb is None else f"{fpb:.2f}")
    out.print(table)
    if len(reports) == 1:  # the parameters counted (a rung's defaults, or those given)
        given = reports[0].as_dict().get("params") or {}
        out.print("Parameters: " + (" ".join(f"{k}={v}" for k, v in given.items()) or "none"))
    out.print("Per thread per k step. fma: FFMA/DFMA; int: integer/address arithmetic; move: "
              "moves and constants; rest: other FP, STG, local memory, other.")
    out.print(("FFMA" if args.dtype == "float32" else "DFMA") + " share = the issue-bound "
              f"ceiling on the {'FP32' if args.dtype == 'float32' else 'FP64'} peak (one "
              "instruction issues per clock per scheduler). Registers and spills: "
              "tilegemm kernels --resources.")
    if args.hot_loop:
        for r in reports:
            out.print(f"\n[bold]{r.kernel} ({r.source}): hot loop, "
                      f"{r.hot_ksteps:g} k step(s) per iteration[/bold]")
            for line in r.hot_lines:
                out.print(line, markup=False, highlight=False)
    return 0


def _run_mma(args: argparse.Namespace, specs: list, params: dict | None) -> int:
    """Tensor-core rungs: the hot loop's HMMA and what feeds it (analysis.sass_mma)."""
    import json

    from tilegemm.analysis.sass import nvdisasm_path
    from tilegemm.analysis.sass_mma import KINDS, mma_report

    for s in specs:
        if not s.supports(args.dtype):
            raise InvalidValueError(f"{s.name} computes {', '.join(s.dtypes)}, not {args.dtype}")
    nvdisasm_path()
    reports = [mma_report(s, params, args.dtype, args.arch) for s in specs]
    if args.json:
        print(json.dumps({"kernels": [dict(r.as_dict(), hot_loop_sass=list(r.hot_lines))
                                      if args.hot_loop else r.as_dict() for r in reports]},
                         indent=2))
        return 0
    from rich.table import Table

    from tilegemm.commands._console import console

    table = Table(title=f"Tensor-core hot loop, per thread ({args.dtype}, {args.arch})")
    for col in ("kernel", "instr", *KINDS, "HMMA share", "MAC/shared byte", "HMMA in kernel",
                "LDL/STL"):
        table.add_column(col, justify="left" if col == "kernel" else "right", overflow="fold")
    for r in reports:
        passes = (r.params or {}).get("PASSES")  # float32 operands: one TF32 pass, or three
        mode = {1: " (tf32)", 3: " (3xtf32)"}.get(passes, "") if args.dtype == "float32" else ""
        per_byte = r.macs_per_shared_byte
        table.add_row(r.kernel + mode, str(r.hot["total"]), *(str(r.hot[k]) for k in KINDS),
                      f"{r.hmma_share:.1%}", "–" if per_byte is None else f"{per_byte:.2f}",
                      str(r.hmma), str(r.local_memory))
    console().print(table)
    console().print("The loop body once, all its branches counted. HMMA: mma.sync's HMMA, or "
                    "wgmma's HGMMA (one warpgroup-wide product for 128 threads, so its share "
                    "is not comparable with HMMA's). other: integer/address work, moves, "
                    "branches, TF32 rounding, and plain global loads and shared stores. "
                    "MAC/shared byte: the HMMA's multiply-adds per byte of shared memory the "
                    "loop moves (ldmatrix, loads, cp.async copies, stores; wgmma's tensor "
                    "core reads its operands itself: –). An SM's shared memory moves 128 "
                    "bytes a clock and an H100's tensor cores do about 1024 TF32 or 2048 "
                    "16-bit multiply-adds a clock (A100: half), so below 8 (TF32) or 16 "
                    "(16-bit) on an H100, 4 or 8 on an A100, shared memory bounds the loop "
                    "before the tensor cores do. Registers: tilegemm kernels --resources.",
                    highlight=False)
    if args.hot_loop:
        for r in reports:
            console().print(f"\n[bold]{r.kernel}: hot loop[/bold]")
            for line in r.hot_lines:
                console().print(line, markup=False, highlight=False)
    return 0
