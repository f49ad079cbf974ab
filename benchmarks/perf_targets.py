"""Measure the performance targets on a GPU: fast CUDA rungs vs cuBLAS (FP32, no TF32).

    CUPY_TF32=0 python benchmarks/perf_targets.py [--kernel pipelined] [--tuned]

Prints GFLOP/s of the rung and of cuBLAS (CuPy) per shape, their ratio, the ratio at
4096³ (target >= 0.80) and the geometric mean over the eight shapes (target >= 0.70).
Every result is verified on a NaN-poisoned output against float64 NumPy before it is
timed, through the benchmarks' own path (``bench.timing.measure_kernel`` and
``measure_vendor``): CUDA events and CuPy events, median of --repeat after two warm-ups.
``--queued N`` also times N launches of each with the GPU's queue filled first
(``tilegemm.bench.queued``): the figures above bracket each launch with events, so where
the host takes longer to issue a launch than the GPU to run it they hold the host's time;
the queued figures do not. ``--tuned`` uses the tuning cache's entry instead of the
defaults; ``--auto`` uses exactly what ``kernel="auto"`` runs for each shape (tuned
entry, else the defaults adapted to the GPU's SM count: a smaller tile or split-K for
shapes whose tiles cannot fill it).

Then, where ``triton`` and ``torch`` import (``--no-triton``: not at all), Triton's tutorial
matmul in FP32 without TF32 (``bench.vendors``' rival) on the same operands, timed and
verified the same way: its GFLOP/s, its share of cuBLAS and the rung's speed relative to
it. It comes after the targets are printed and saved, because its first call of each shape
compiles and autotunes every configuration of the tutorial (expected: about a minute per
shape class, not yet measured; cached on disk by Triton afterwards); the results file is
then written again.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
          (1000, 1000, 1000), (4097, 4097, 4097), (4096, 4096, 512), (512, 512, 8192)]


def _shape(text: str) -> tuple[int, int, int]:
    """``MxNxK`` as three positive integers (an argparse type: a bad one is a usage error)."""
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MxNxK") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each size must be at least 1")
    return m, n, k


def main() -> int:
    from tilegemm.commands._params import comma_params

    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="pipelined")
    parser.add_argument("--tuned", action="store_true")
    parser.add_argument("--auto", action="store_true",
                        help='what kernel="auto" runs for each shape (overrides --kernel)')
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", help="also write the rows, device, versions and commit here")
    parser.add_argument("--no-triton", action="store_true",
                        help="do not time Triton's tutorial matmul after the targets")
    parser.add_argument("--shapes", nargs="+", type=_shape, metavar="MxNxK",
                        help="these shapes instead of the eight targets (the target lines "
                        "are then not printed), e.g. 1000x1000x1000 1024x1024x1024")
    parser.add_argument("--queued", type=int, default=0, metavar="N",
                        help="also time N launches of each, ours and cuBLAS, with the GPU's "
                        "queue filled first (bench.queued): the GPU's time per launch "
                        "without the host's")
    parser.add_argument("--params", type=comma_params, default={}, metavar="K=V,...",
                        help="parameters set on top of the chosen ones for every shape, "
                        "e.g. SHIFT_EDGES=1 beside --auto")
    args = parser.parse_args()
    shapes = args.shapes or SHAPES

    from tilegemm import registry
    from tilegemm.backends import get_backend
    from tilegemm.bench.queued import gpu_seconds_per_launch
    from tilegemm.bench.timing import OK, fixed, measure_kernel
    from tilegemm.bench.vendors import VENDORS, find_rival, measure_vendor
    from tilegemm.problem import problem_for
    from tilegemm.reference import random_operands
    from tilegemm.tune.select import auto_plan, tuned_choice

    backend = get_backend("cuda")
    status = backend.status()
    if not status.usable or status.simulated:
        print(f"needs a real GPU: {status.reason}")
        return 2
    print(f"device: {status.devices[0]}")
    target = backend.target()
    cublas = VENDORS["cupy"](target)
    policy = fixed(args.repeat, warmup=2)
    ratios = {}
    rows = []
    # one seed per shape, fresh each run: Triton later gets the very same operands
    seeds = [int(s) for s in np.random.default_rng().integers(2**31, size=len(shapes))]
    for (m, n, k), seed in zip(shapes, seeds):
        prob = problem_for(m, n, k, "float32")
        why = ""
        if args.auto:
            spec, params, why = auto_plan(backend, target, prob)
        elif args.tuned:
            spec, params = tuned_choice(backend, prob) or (registry.get(args.kernel, "cuda"), {})
        else:
            spec, params = registry.get(args.kernel, "cuda"), {}
        params = spec.resolve({**params, **args.params})
        a, b = random_operands((1, m, k), (1, k, n), np.float32, seed=seed)
        mine = measure_kernel(backend, spec, params, prob, a, b, policy, target=target)
        ref = measure_vendor(cublas, backend.name, prob, a, b, policy)
        if mine.status != OK or ref.status != OK or not mine.stats or not ref.stats:
            print(f"{m}x{n}x{k}: {mine.status} {mine.reason} | cuBLAS {ref.status} {ref.reason}")
            return 1
        ours, theirs = mine.stats.median, ref.stats.median
        flops = 2.0 * m * n * k
        ratios[(m, n, k)] = theirs / ours
        rows.append({"m": m, "n": n, "k": k, "kernel": spec.name, "params": dict(params),
                     "seconds": ours, "cublas_seconds": theirs,
                     "gflops": flops / ours / 1e9, "cublas_gflops": flops / theirs / 1e9,
                     "ratio": theirs / ours, **({"why": why} if why else {})})
        print(f"{m:>5}x{n:>5}x{k:>5}  {spec.name} {params}  {flops / ours / 1e9:9.1f} GFLOP/s"
              f"  cuBLAS {flops / theirs / 1e9:9.1f}  ratio {theirs / ours:.3f}")
        if args.queued:
            # the same launches (verified above) with the queue filled first: the GPU's time
            # per launch, where the figures above may hold the host's time to issue one
            mine_q, mine_dry = gpu_seconds_per_launch(
                backend.prepare(spec, params, prob, a, b, target=target).launch, args.queued)
            ref_q, ref_dry = gpu_seconds_per_launch(cublas.prepare(prob, a, b).launch,
                                                    args.queued)
            rows[-1].update(gpu_seconds=mine_q, cublas_gpu_seconds=ref_q,
                            gpu_ratio=ref_q / mine_q, queue_ran_dry=mine_dry or ref_dry)
            print(f"{'':17}queued: {mine_q * 1e6:9.1f} us, cuBLAS {ref_q * 1e6:9.1f} us, "
                  f"ratio {ref_q / mine_q:.3f}" + ("  (the queue ran dry)"
                                                   if mine_dry or ref_dry else ""))
    geo = math.exp(sum(map(math.log, ratios.values())) / len(ratios))
    at4096 = ratios.get((4096, 4096, 4096))
    if args.shapes:
        print(f"geomean ratio {geo:.3f} over these {len(shapes)} shapes")
    else:
        print(f"4096^3 ratio {at4096:.3f} (target >= 0.80): "
              f"{'MET' if at4096 >= 0.8 else 'NOT MET'}")
        print(f"geomean ratio {geo:.3f} (target >= 0.70): {'MET' if geo >= 0.7 else 'NOT MET'}")
    doc: dict = {}
    if args.json:
        from tilegemm.bench.environment import backend_info, git_commit, host_info, versions

        doc = {"what": "fast rung vs cuBLAS FP32 (CuPy, TF32 off) over the target shapes",
               "tuned": args.tuned, "auto": args.auto, "repeat": args.repeat,
               "timing": "median of CUDA events"
               + (f"; queued: {args.queued} launches behind a kernel holding the GPU"
                  if args.queued else ""),
               "device": backend_info(backend, target), "host": host_info(),
               "versions": versions(), "commit": git_commit(),
               "cublas": cublas.name if hasattr(cublas, "name") else "cupy",
               "rows": rows, "ratio_4096": at4096, "geomean_ratio": geo}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    if args.no_triton:
        return 0

    # Triton's tutorial matmul, FP32 without TF32, on each shape's same operands
    triton, note = find_rival("triton", target, "float32")
    print(note)
    if triton is None:
        return 0
    versus = []
    for row, seed in zip(rows, seeds):
        m, n, k = row["m"], row["n"], row["k"]
        prob = problem_for(m, n, k, "float32")
        a, b = random_operands((1, m, k), (1, k, n), np.float32, seed=seed)
        theirs = measure_vendor(triton, backend.name, prob, a, b, policy)
        if theirs.status != OK or not theirs.stats:
            print(f"{m}x{n}x{k}: Triton {theirs.status} {theirs.reason}")
            row["triton"] = {"status": theirs.status, "reason": theirs.reason}
            continue
        t = theirs.stats.median
        flops = 2.0 * m * n * k
        row["triton"] = {"seconds": t, "gflops": flops / t / 1e9, "config": theirs.params,
                         "share_of_cublas": row["cublas_seconds"] / t,
                         "rung_over_triton": t / row["seconds"]}
        versus.append(t / row["seconds"])
        print(f"{m:>5}x{n:>5}x{k:>5}  Triton {flops / t / 1e9:9.1f} GFLOP/s"
              f"  {100 * row['cublas_seconds'] / t:5.1f}% of cuBLAS  {row['kernel']}/Triton "
              f"{t / row['seconds']:.3f}  {theirs.params}")
    if versus:
        print(f"geomean {rows[0]['kernel'] if not args.auto else 'auto'}/Triton speed "
              f"{math.exp(sum(map(math.log, versus)) / len(versus)):.3f}")
    if args.json:
        doc["triton"] = note
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
