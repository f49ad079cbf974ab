"""Explain a CUDA rung by counting: memory requests and 32-byte sectors per warp, shared-memory
bank conflicts, registers/spills/shared memory, occupancy and the roofline bound.

The memory counts are traced from the kernel's own code on numba's CUDA simulator (in a
child process); large problems trace a sample of blocks per class (interior, edges) and
scale, and the report says exactly what was traced. The tensor-core rungs' ``cp.async``
copies and ``ldmatrix`` reads are counted per thread at the instruction's width; the
operands wgmma's tensor core reads itself, through descriptors, are not thread accesses,
and the report says they are not counted. Resources come from compiling the kernel with
nvJitLink for sm_80 and sm_90 (those it compiles for). No GPU is needed for any of it.
"""

from __future__ import annotations

import argparse
import math

from tilegemm.commands._params import (
    KERNEL_TYPES_NOTE,
    add_param_arguments,
    add_shape_arguments,
    check_fits_in_memory,
    parse_params,
)
from tilegemm.errors import InvalidTypeError, InvalidValueError

HELP = "count a kernel's memory transactions, bank conflicts, resources, occupancy, roofline"
SASS_ARCH = "sm_90"  # --sass compiles for this architecture unless --arch names another


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tilegemm.analysis.roofline import GPUS
    from tilegemm.backends import get_backend
    from tilegemm.registry import BACKENDS

    parser.add_argument("kernel", help="rung name (see 'tilegemm kernels --backend cuda'); "
                        "with --sass also several, comma-separated, or 'all'")
    traced = tuple(name for name in BACKENDS if get_backend(name).traceable)
    parser.add_argument("--backend", default=traced[0], choices=traced,
                        help="only CUDA rungs are traced")
    parser.add_argument("--sass", action="store_true",
                        help="count the compiled machine code instead: instructions per k step "
                             "by class in the hot loop, one interior k-tile and one k-tile "
                             "of an edge block, FFMA share "
                             "(needs nvdisasm: pip install nvidia-cuda-nvdisasm)")
    parser.add_argument("--arch",
                        help=f"with --sass: the architecture to compile for (sm_80, sm_90; "
                             f"default: {SASS_ARCH})")
    parser.add_argument("--hot-loop", action="store_true",
                        help="with --sass: also print the hot loop's SASS, annotated")
    parser.add_argument("--yardstick", action="store_true",
                        help="with --sass: add the CUDA C rungs (NVRTC) to the table")
    add_shape_arguments(parser, 32, 0,
                        ("float32", "float64", "int32", "int64", "float16", "bfloat16"),
                        "element type; each rung computes some of these ('tilegemm kernels' "
                        "lists them); float16/bfloat16: the tensor-core rungs. These are "
                        + KERNEL_TYPES_NOTE)
    parser.add_argument("--beta", type=float, default=0.0,
                        help="non-zero: the kernel also reads C (beta·C)")
    parser.add_argument("--gpu", default="h100", choices=tuple(GPUS),
                        help="GPU for the roofline bound")
    parser.add_argument("--samples", type=int, default=2,
                        help="blocks traced per block class when the grid is sampled")
    parser.add_argument("--full", action="store_true",
                        help="trace every block (slow for large grids)")
    parser.add_argument("--full-limit", type=int, default=16,
                        help="grids with at most this many blocks are traced in full")
    parser.add_argument("--no-resources", action="store_true",
                        help="skip compiling with nvJitLink (registers, occupancy)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_param_arguments(parser)
    # What only the trace reads: --sass counts the machine code per k step, which no problem
    # size, sampling or roofline GPU changes. Their defaults are applied on the trace's path
    # (None here), so --sass refuses every one given, even at its default value.
    trace_defaults = {dest: parser.get_default(dest) for dest in TRACE_ONLY}
    parser.set_defaults(trace_only=trace_defaults, **{dest: None for dest in TRACE_ONLY})
    # ... which the help formatter, showing no None default, then left out of --help
    for action in parser._actions:
        value = trace_defaults.get(action.dest)
        if value not in (None, False) and action.help:
            action.help += f" (default: {value})"


# the options of the trace alone (by destination; the flag is "--" + dest with "-" for "_")
TRACE_ONLY = ("m", "n", "k", "batch", "beta", "gpu", "samples", "full", "full_limit",
              "no_resources")


def run(args: argparse.Namespace) -> int:
    import json

    if args.sass:
        from tilegemm.commands._sass import run_sass

        given = ["--" + dest.replace("_", "-") for dest in getattr(args, "trace_only", {})
                 if getattr(args, dest) is not None]
        if given:
            raise InvalidValueError(
                f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} only to the "
                "trace, not with --sass (the machine code per k step is the same for every "
                "problem size): leave " + ("it" if len(given) == 1 else "them") + " out")
        args.arch = args.arch or SASS_ARCH
        return run_sass(args)

    from tilegemm.analysis.report import explain, render, to_json

    for dest, default in getattr(args, "trace_only", {}).items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    ignored = [flag for flag, given in (("--arch", args.arch is not None),
                                        ("--hot-loop", args.hot_loop),
                                        ("--yardstick", args.yardstick)) if given]
    if ignored:
        raise InvalidValueError(f"{' and '.join(ignored)} appl{'ies' if len(ignored) == 1 else 'y'}"
                                " only with --sass (the machine-code counts): add --sass or "
                                "leave "+ ("it" if len(ignored) == 1 else "them") + " out")
    if args.kernel == "all" or "," in args.kernel:
        raise InvalidValueError(f"{args.kernel!r}: several rungs at once only with --sass (the "
                                "machine-code table); the trace explains one rung")
    for name in ("m", "n", "k", "batch", "full_limit"):
        if getattr(args, name) < 0:
            raise InvalidValueError(f"--{name.replace('_', '-')} must be >= 0")
    if args.samples < 1:
        raise InvalidValueError("--samples must be >= 1")
    if not math.isfinite(args.beta):
        # only whether beta is zero matters to the trace (C is read or not); NaN and inf
        # are not zero, but are surely a typing slip
        raise InvalidValueError(f"--beta must be a finite number, got {args.beta}")
    # Checked here, before the tracer's child process starts, so a request the rung or the
    # machine cannot meet is a one-line refusal rather than a failure inside the child.
    spec = rung(args.kernel, args.backend)
    if not spec.supports(args.dtype):
        raise InvalidTypeError(f"kernel {spec.name!r} does not compute {args.dtype}; it "
                               f"computes {', '.join(spec.dtypes)} (choose one with --dtype)")
    batch = max(args.batch, 1)  # 0 and 1 are both one plain product
    check_fits_in_memory(args.m, args.n, args.k, batch if args.batch else 0, args.dtype)
    ex = explain(args.kernel, args.m, args.n, args.k, params=parse_params(args.params),
                 dtype=args.dtype, batch=batch, beta=args.beta, gpu=args.gpu,
                 samples=args.samples, full=args.full, full_limit=args.full_limit,
                 backend=args.backend, resources=not args.no_resources)
    if args.json:
        print(json.dumps(to_json(ex), indent=2))
        return 0
    from tilegemm.commands._console import console

    out = console()
    for item in render(ex):
        out.print(item)
    return 0


def rung(name: str, backend: str):  # noqa: ANN201 - a KernelSpec
    """The rung ``name`` of the traced ``backend``. A rung of another backend is refused
    with a message that does not send the user to a --backend explain cannot take."""
    from tilegemm import registry

    try:
        return registry.get(name, backend)
    except InvalidValueError:
        owners = [b for b in registry.BACKENDS if any(s.name == name
                                                       for s in registry.specs_for(b))]
        if not owners:
            raise
        choices = ", ".join(s.name for s in registry.specs_for(backend))
        raise InvalidValueError(
            f"kernel {name!r} is a rung of {registry.backends_phrase(owners)}; explain "
            f"analyses the {backend} rungs only: {choices}") from None
