"""Run one product with one rung, verify it against float64 NumPy, print time and GFLOP/s.

Exit status: 0 verified; 1 the result does not match the reference; 2 the request was
refused (a bad parameter, a size the device or memory cannot hold); 3 an internal error.
"""

from __future__ import annotations

import argparse

from tilegemm.commands._params import (
    add_device_argument,
    add_param_arguments,
    add_shape_arguments,
    check_fits_in_memory,
    check_verification_fits,
    device_target,
    parse_params,
)
from tilegemm.errors import InvalidValueError
from tilegemm.problem import RESULT_DTYPES
from tilegemm.registry import BACKENDS

HELP = "run one product, verified, timed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel", default="auto", help="rung name (see 'tilegemm kernels')")
    parser.add_argument("--backend", default="auto", choices=("auto", *BACKENDS),
                        help="where to run ('auto': the best usable backend here)")
    add_device_argument(parser)
    add_shape_arguments(
        parser, 512, 0, RESULT_DTYPES,
        f"element type of A and B, any that matmul computes: {', '.join(RESULT_DTYPES)}. "
        "Where the rung computes in another type, as matmul does (float16 and bfloat16 in "
        "float32 except on tensor cores; bool and narrow or unsigned integers in int32 or "
        "int64), the report says so",
        metavar="DTYPE")
    parser.add_argument("--precision", choices=("ieee", "tf32", "3xtf32"),
                        help="float32 on tensor cores (CUDA, sm_80 or newer), as matmul's "
                             "precision=: tf32 (one pass) or 3xtf32 (near float32); "
                             "default: IEEE float32 multiply-adds")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls after the first")
    add_param_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from tilegemm.api import _check_params_are_upper_case, choose_backend, decide
    from tilegemm.bench.timing import OK, SKIPPED, WRONG, Policy, measure_kernel
    from tilegemm.plan import _path
    from tilegemm.problem import describe, host_operand_3d, make_problem
    from tilegemm.reference import random_operands

    for name in ("m", "n", "k", "batch", "repeat"):
        if getattr(args, name) < 0:
            raise InvalidValueError(f"--{name} must be >= 0")
    params = parse_params(args.params)
    lead = (args.batch,) if args.batch else ()
    check_fits_in_memory(args.m, args.n, args.k, args.batch, args.dtype)
    # Decided on operands not yet filled (their memory is not touched), so that the
    # backend's refusals, which say more, and the check that the run fits in memory both
    # come before the operands are made: filled first, A and B alone could be more than
    # the machine holds, and the system ended the process with no message.
    shape_a, shape_b = lead + (args.m, args.k), lead + (args.k, args.n)
    try:
        ops = [describe(np.empty(shape_a, args.dtype), "a"),
               describe(np.empty(shape_b, args.dtype), "b")]
    except MemoryError:  # both at once, where the system counts what it promised
        check_verification_fits(args.m, args.n, args.k, args.batch, args.dtype)
        raise
    # Resolve what 'auto' means up front so the report names the real choice.
    backend = choose_backend(args.backend, ops, args.device, args.kernel,  # as matmul does
                             make_problem(*ops), args.precision)
    target = device_target(backend, args.device, args.backend)
    # What matmul would run (the one decision, api.decide), and why: so the run times it,
    # in the type the chosen backend computes the product in (float16 on tensor cores,
    # float32 elsewhere, say), on operands converted to it as matmul converts them.
    _check_params_are_upper_case(params)
    chosen = decide(ops, make_problem(*ops), kernel=args.kernel, backend=backend.name,
                    device=args.device, params=params, precision=args.precision)
    prob, spec, resolved = chosen.prob, chosen.spec, dict(chosen.params)
    check_verification_fits(args.m, args.n, args.k, args.batch, args.dtype)
    a, b = random_operands(shape_a, shape_b, args.dtype)
    simulated = target.simulated
    source = chosen.source
    if simulated and not params and spec.sim_params is not None:
        # One Python thread per CUDA thread: the rung's smallest tiles, not its defaults
        # (kernel="auto" already chose them; this is for a rung named explicitly).
        resolved = backend.resolve(spec, spec.sim_params, target)
        source = "simulator"
        print(f"note: CUDA simulator, so {spec.name} runs with its small simulator parameters "
              f"({_shown(resolved)}); pass parameters to override")
    path = _path(spec.key, prob, resolved)
    if simulated and prob.flops > 2 * 64**3:
        print("note: the CUDA simulator runs one Python thread per GPU thread; expect minutes "
              "at this size (try --m 32 --n 32 --k 32)")

    # One home for timing: verify on a NaN-poisoned first launch, then device-timed launches.
    reps = args.repeat
    policy = Policy(warmup=1 if reps else 0, min_reps=reps, max_reps=reps, budget_s=1e9)
    meas = measure_kernel(backend, spec, resolved, prob, host_operand_3d(a, prob, "a"),
                          host_operand_3d(b, prob, "b"), policy, target=target)
    print(f"{backend.name}:{spec.name} {_shown(meas.params)} {args.dtype} "
          f"M={args.m} N={args.n} K={args.k}{f' batch={args.batch}' if args.batch else ''}")
    if (prob.dtype.name, prob.out_dtype.name) != (args.dtype, args.dtype):
        print(f"  types: {args.dtype} operands, computed in {prob.dtype.name}, "
              f"{prob.out_dtype.name} result (as np.matmul's); the conversions are not timed")
    print(f"  chosen: {source}{f'; {path}' if path else ''}")
    index = f"[{target.index}] " if backend.accepts_device and target.index is not None else ""
    print(f"  device: {index}{target.name}" + (f" ({target.arch})" if target.arch else ""))
    if meas.status == SKIPPED:  # refused before it ran (device limits): the caller can fix it
        raise InvalidValueError(meas.reason)
    if meas.status != OK:
        print(f"  {meas.status}: {meas.reason}")
        # a wrong result is the answer this command exists to give (1); a rung that did
        # not build or run is a fault of tilegemm's (3, as any internal error)
        return 1 if meas.reason.startswith(WRONG) else 3
    print("  verified: yes (against float64 NumPy, output poisoned with NaN first)")
    if meas.first_s is not None:
        print(f"  first call (build/compile + upload + one launch): {meas.first_s * 1e3:.2f} ms")
    stats = meas.stats
    if stats is None:
        print("  steady: not measured (--repeat 0)")
    else:
        rate = ("no work (an empty product)" if not meas.flops
                else "no rate (below the timer's resolution)" if meas.gflops is None
                else f"{meas.gflops:.2f} GFLOP/s")
        print(f"  steady: median {stats.median * 1e3:.3f} ms of {len(meas.samples)} launches "
              f"({meas.method}), {rate}")
    return 0


def _shown(params: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())
