"""Run one CUDA rung a few times on PyTorch tensors, for Nsight Compute to profile one launch.

    ncu --clock-control none --kernel-name regex:"$(python benchmarks/ncu_rung.py --name wgmma)" \\
        --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/ncu_rung.py --kernel wgmma --dtype float32 --precision tf32

``--name KERNEL`` prints the pattern that selects the rung's kernel among everything the
process launches. ncu matches it against the kernel's base name (no namespace, no
parameters), which numba makes ``<rung>_<dtype>..._kernel`` for a generated rung, so the
pattern is anchored: rung ``mma``'s must match neither ``wgmma_...`` nor cuBLAS's own
``..._xmma_...`` kernels (``[^gw]mma_`` matched nothing on an H200, the base name starting
with ``mma``).
The operands are random (never zeros: they can run faster than real data), n×n×n, on the
GPU before the first launch, so the profiled launch is the rung alone; the first launch
compiles (or loads the cached kernel) and is skipped with ``--launch-skip 1``.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    from tilegemm.commands._params import comma_params

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="wgmma", help="the rung (default wgmma)")
    parser.add_argument("--dtype", default="float32",
                        choices=("float32", "float16", "bfloat16", "float64"))
    parser.add_argument("--precision", default=None,
                        help="tf32 or 3xtf32 for float32 on a tensor-core rung")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--params", type=comma_params, default={},
                        help="rung parameters over the defaults, e.g. BCOPY=1,STAGES=6")
    parser.add_argument("--b-kmajor", action="store_true",
                        help="B as the transpose of a C-ordered tensor (K contiguous)")
    parser.add_argument("--name", metavar="KERNEL",
                        help="print the ncu --kernel-name pattern of this rung and exit")
    args = parser.parse_args()
    if args.name:
        print(f"^{args.name}_")
        return 0

    over = args.params
    try:
        import torch
    except ImportError as exc:
        print(f"needs a GPU and PyTorch with CUDA: {exc}", file=sys.stderr)
        return 2

    import tilegemm

    if not torch.cuda.is_available():
        print("needs a GPU and PyTorch with CUDA", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((args.n, args.n), generator=gen, device="cuda").to(dtype)
    b = torch.randn((args.n, args.n), generator=gen, device="cuda").to(dtype)
    if args.b_kmajor:
        b = b.T.contiguous().T
    for _ in range(args.launches):
        c = tilegemm.matmul(a, b, kernel=args.kernel, precision=args.precision, **over)
    torch.cuda.synchronize()
    print(f"{args.kernel} {args.dtype} {args.precision or ''} {args.n}^3: "
          f"{args.launches} launches, c[0, 0] = {float(c[0, 0]):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
