"""Run one product with one rung, verify it against float64 NumPy, print time and GFLOP/s.

Exits with status 1 if the result does not match the reference.
"""

from __future__ import annotations

import argparse
import time

from tilegemm.commands._params import add_param_arguments, parse_params

HELP = "run one product, verified, timed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel", default="auto", help="rung name (see 'tilegemm kernels')")
    parser.add_argument("--backend", default="auto", choices=("auto", "cuda", "opencl", "cpu"))
    parser.add_argument("--m", type=int, default=512)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--batch", type=int, default=0, help="batch count (0: a plain 2-D product)")
    parser.add_argument("--dtype", default="float32",
                        choices=("float32", "float64", "int32", "int64"))
    parser.add_argument("--repeat", type=int, default=3, help="timed calls after the first")
    add_param_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import tilegemm
    from tilegemm.api import choose_backend, choose_kernel
    from tilegemm.problem import describe, make_problem
    from tilegemm.reference import assert_close, random_operands

    for name in ("m", "n", "k", "batch", "repeat"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} must be >= 0")
    params = parse_params(args.params)
    lead = (args.batch,) if args.batch else ()
    a, b = random_operands(lead + (args.m, args.k), lead + (args.k, args.n), args.dtype)
    # Resolve what 'auto' means up front so the report names the real choice.
    backend = choose_backend(args.backend, [describe(a, "a"), describe(b, "b")])
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    spec, resolved = choose_kernel(args.kernel, backend, prob, params)

    t0 = time.perf_counter()
    c = tilegemm.matmul(a, b, kernel=spec.name, backend=backend.name, **resolved)
    backend.synchronize()
    first = time.perf_counter() - t0
    try:
        assert_close(c, a, b, what=f"{backend.name}:{spec.name}")
        ok = True
    except AssertionError as exc:
        print(f"MISMATCH: {exc}")
        ok = False
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tilegemm.matmul(a, b, out=c, kernel=spec.name, backend=backend.name, **resolved)
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    shown = " ".join(f"{k}={v}" for k, v in resolved.items())
    print(f"{backend.name}:{spec.name} {shown} {args.dtype} "
          f"M={args.m} N={args.n} K={args.k}{f' batch={args.batch}' if args.batch else ''}")
    print(f"  verified: {'yes' if ok else 'NO'}")
    print(f"  first call (includes compilation): {first * 1e3:.2f} ms")
    if times:
        steady = float(np.median(times))
        gflops = prob.flops / steady / 1e9 if steady > 0 else float("inf")
        print(f"  steady (median of {len(times)}, host wall time incl. transfers): "
              f"{steady * 1e3:.3f} ms, {gflops:.2f} GFLOP/s")
    else:
        print("  steady: not measured (--repeat 0)")
    return 0 if ok else 1
