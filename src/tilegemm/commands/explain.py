"""Explain a CUDA rung by counting: memory requests and 32-byte sectors per warp, shared-memory
bank conflicts, registers/spills/shared memory, occupancy and the roofline bound.

The memory counts are traced from the kernel's own code on numba's CUDA simulator (in a
child process); large problems trace a sample of blocks per class (interior, edges) and
scale, and the report says exactly what was traced. Rung mma's ``cp.async`` copies and
``ldmatrix`` reads are counted per thread at the instruction's width; rung wgmma, whose
operands the tensor core reads from shared memory itself, is refused with a pointer to
``--sass``. Resources come from compiling the
kernel for sm_80 and sm_90 with nvJitLink. No GPU is needed for any of it.
"""

from __future__ import annotations

import argparse

from tilegemm.commands._params import add_param_arguments, add_shape_arguments, parse_params
from tilegemm.errors import InvalidValueError

HELP = "count a kernel's memory transactions, bank conflicts, resources, occupancy, roofline"


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
                             "by class in the hot loop and one interior k-tile, FFMA share "
                             "(needs nvdisasm: pip install nvidia-cuda-nvdisasm)")
    parser.add_argument("--arch", default="sm_90",
                        help="with --sass: the architecture to compile for (sm_80, sm_90)")
    parser.add_argument("--hot-loop", action="store_true",
                        help="with --sass: also print the hot loop's SASS, annotated")
    parser.add_argument("--yardstick", action="store_true",
                        help="with --sass: add the CUDA C rungs (NVRTC) to the table")
    add_shape_arguments(parser, 32, 1,
                        ("float32", "float64", "int32", "int64", "float16", "bfloat16"),
                        "float16/bfloat16: rung mma (wgmma with --sass only)")
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


def run(args: argparse.Namespace) -> int:
    import json

    if args.sass:
        from tilegemm.commands._sass import run_sass

        return run_sass(args)

    from tilegemm.analysis.report import explain, render, to_json

    for name in ("m", "n", "k"):
        if getattr(args, name) < 0:
            raise InvalidValueError(f"--{name} must be >= 0")
    if args.batch < 1:
        raise InvalidValueError("--batch must be >= 1")
    if args.samples < 1:
        raise InvalidValueError("--samples must be >= 1")
    ex = explain(args.kernel, args.m, args.n, args.k, params=parse_params(args.params),
                 dtype=args.dtype, batch=args.batch, beta=args.beta, gpu=args.gpu,
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
