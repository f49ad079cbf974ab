"""What a user gets from ``kernel="auto"`` on the CPU: large products against NumPy, tiny
products per call, and the first call of a fresh process with a warm compile cache.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/cpu_auto.py            # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/cpu_auto.py --no-save --sizes 1024

Large sizes use ``cpu_blocked.measure`` (blocks of ours and NumPy alternating, pauses
between) with the parameters ``tilegemm.plan`` reports for auto; tiny sizes time whole
``tilegemm.matmul`` calls (validation and dispatch included) against ``np.matmul``; the
first call runs ``import tilegemm`` and one ``matmul`` in new processes, after one process
has filled the cache. Writes ``benchmarks/results/cpu-auto-<cpu>-<isa>-m<family>-<model>.json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm import registry  # noqa: E402
from tilegemm.bench.timing import mean_call_seconds  # noqa: E402

FIRST = """
import time; t = time.perf_counter()
import numpy as np, tilegemm
a = np.ones((64, 64), np.{dtype}); tilegemm.matmul(a, a)
b = np.ones((256, 256), np.{dtype}); tilegemm.matmul(b, b)
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--no-save", action="store_true")
    cpu_blocked.add_suffix_argument(
        ap, "for a second run under other settings (OPENBLAS_CORETYPE=SkylakeX, say)")
    args = ap.parse_args()
    spec = registry.get("blocked", "cpu")
    large = []
    for dtype in args.dtypes:
        for n in args.sizes:
            a = np.ones((n, n), dtype)
            plan = tilegemm.plan(a, a)
            row = cpu_blocked.measure(spec, plan.params, n, dtype, 3, 2, 0.3)
            row.update(params=plan.params, source=plan.source)
            large.append(row)
            print(f"{dtype} {n}: auto {row['gflops_blocked']:.1f} vs NumPy "
                  f"{row['gflops_numpy']:.1f} GFLOP/s = {row['ratio']:.2f}x  ({plan})", flush=True)
    tiny = []
    for dtype in args.dtypes:
        for n in (8, 32, 64):
            a, b = np.random.rand(n, n).astype(dtype), np.random.rand(n, n).astype(dtype)
            ours = mean_call_seconds(lambda a=a, b=b: tilegemm.matmul(a, b))
            ref = mean_call_seconds(lambda a=a, b=b: np.matmul(a, b))
            tiny.append({"size": n, "dtype": dtype, "us_tilegemm": round(ours * 1e6, 1),
                         "us_numpy": round(ref * 1e6, 2), "times_numpy": round(ours / ref, 1)})
            print(f"{dtype} {n}^3 per call: {ours * 1e6:.1f} us vs NumPy {ref * 1e6:.2f} us "
                  f"= {ours / ref:.1f}x", flush=True)
    first = {}
    # as first_call.py: a shell that sets PYTHONDONTWRITEBYTECODE would have every new
    # process compile tilegemm's modules from source, which an installed package never does
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for dtype in args.dtypes:
        code = FIRST.format(dtype=dtype)
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                       env=env)  # fill the caches
        runs = [float(subprocess.run([sys.executable, "-c", code], check=True, env=env,
                                     capture_output=True, text=True).stdout.split()[-1])
                for _ in range(3)]
        first[dtype] = {"seconds_median": round(sorted(runs)[1], 3), "runs": runs}
        print(f"{dtype} import + first calls (64^3 and 256^3), warm cache: "
              f"{sorted(runs)[1]:.2f} s", flush=True)
    if not args.no_save:
        cpu_blocked.save_results("cpu-auto", {
            "method": "large: median of 3 rounds x 2 launches, ours and NumPy alternating by "
                      "block, 0.3 s idle before each block; tiny: whole matmul calls for 0.3 s; "
                      "first call: new process, import + two matmul calls, median of 3, cache "
                      "filled first, Python's bytecode cache allowed (PYTHONDONTWRITEBYTECODE "
                      "removed)",
            "large": large, "tiny": tiny, "first_call_warm_cache": first,
        }, suffix=args.suffix)


if __name__ == "__main__":
    main()
