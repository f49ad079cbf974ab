"""The first ``tilegemm.matmul`` of a fresh Python process, with warm caches, on the CPU and
on OpenCL: ``import tilegemm`` plus two calls (64³ and 256³), as a user's script pays it.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/first_call.py           # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/first_call.py --no-save --runs 3
    PYTHONPATH=src python benchmarks/first_call.py --cold 2   # and with empty caches

Warm means what a second run of the same script finds: tilegemm's compile cache (CPU
``blocked``), PoCL's kernel cache (OpenCL) and Python's bytecode cache. The child processes
run with ``PYTHONDONTWRITEBYTECODE`` removed from their environment, since a development
shell that sets it would recompile every tilegemm module from source on every start (about
40 ms), which an installed package never does. One process fills the caches first; the
median of ``--runs`` new processes is reported, with the time split into imports and calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

from tilegemm.backends import BACKENDS  # noqa: E402
from tilegemm.backends.cpu import usable_cpus  # noqa: E402
from tilegemm.bench.environment import cpu_name, git_commit, versions, write_cpu_results  # noqa: E402
from tilegemm.kernels.cpu._compile_workers import compile_jobs  # noqa: E402
from tilegemm.tune.database import host_isa  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = """
import time; t0 = time.perf_counter()
import numpy as np, tilegemm
t1 = time.perf_counter()
a = np.ones((64, 64), np.{dtype}); tilegemm.matmul(a, a{backend})
b = np.ones((256, 256), np.{dtype}); tilegemm.matmul(b, b{backend})
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, t2 - t0)
"""


def run_once(code: str, env: dict[str, str]) -> tuple[float, float, float]:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    imports, calls, total = (float(x) for x in out[-3:])
    return imports, calls, total


def cold_runs(code: str, env: dict[str, str], runs: int) -> list[float]:
    """Seconds of ``code`` in new processes, each with an empty kernel cache of its own
    (compiled, not loaded: the first call after installing, or with a tile not used before)."""
    import tempfile

    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tilegemm-cold-") as cache:
            out.append(round(run_once(code, dict(env, TILEGEMM_KERNEL_CACHE=cache))[2], 2))
    return out


def cpu_identity() -> dict[str, str]:
    """Family, model and stepping from /proc/cpuinfo, and every AVX-512/AMX flag."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model", "stepping") and key not in out:
                out[key] = value.strip()
            elif key == "flags":
                out["avx512_amx_flags"] = " ".join(
                    f for f in value.split() if f.startswith(("avx512", "amx")))
                break
    except OSError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--backends", nargs="+", default=["auto", "opencl"],
                    choices=["auto", *BACKENDS],
                    help="auto: tilegemm's own choice; those not usable here are skipped")
    ap.add_argument("--cold", type=int, default=0, metavar="N",
                    help="also N runs each with an empty compile cache of its own (the "
                         "first call compiles: what a new install or a new tile pays)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    rows = []
    for backend in args.backends:
        if backend != "auto":
            from tilegemm.backends import get_backend

            status = get_backend(backend).status()
            if not status.usable:
                print(f"{backend}: not usable here ({status.reason}); skipped", flush=True)
                continue
        for dtype in args.dtypes:
            code = SCRIPT.format(dtype=dtype,
                                 backend="" if backend == "auto" else f", backend={backend!r}")
            run_once(code, env)  # fills the caches
            runs = []
            for _ in range(args.runs):
                time.sleep(0.2)
                runs.append(run_once(code, env))
            total = statistics.median(r[2] for r in runs)
            row = {"backend": backend, "dtype": dtype, "seconds_median": round(total, 3),
                   "imports_median": round(statistics.median(r[0] for r in runs), 3),
                   "calls_median": round(statistics.median(r[1] for r in runs), 3),
                   "runs": [round(r[2], 3) for r in runs], "target_seconds": 0.5,
                   "meets_target": total <= 0.5}
            rows.append(row)
            print(f"{backend:6s} {dtype}: {total:.3f} s (imports {row['imports_median']:.3f}, "
                  f"calls {row['calls_median']:.3f}); runs {row['runs']}", flush=True)
            if args.cold:
                cold = cold_runs(code, env, args.cold)
                row["cold_cache_runs"] = cold
                row["cold_cache_seconds_median"] = round(statistics.median(cold), 2)
                print(f"{backend:6s} {dtype}: empty cache {statistics.median(cold):.1f} s; "
                      f"runs {cold}", flush=True)
    result = {
        "cpu_model": cpu_name(), "isa": host_isa(), "simd": cpu_blocked.simd_flags(),
        "cpu": cpu_identity(),
        "cores": usable_cpus(), "versions": versions(), "git_commit": git_commit(),
        # worker processes of a first CPU compile (what the empty-cache runs used)
        "compile_jobs": compile_jobs(),
        "method": "new process: import numpy and tilegemm, matmul 64^3 then 256^3; caches "
                  "filled by one process first; median of runs, 0.2 s apart; bytecode "
                  "cache allowed (PYTHONDONTWRITEBYTECODE removed)",
        "load_average_at_end": list(os.getloadavg()), "first_call_warm_cache": rows,
        "cold_cache": ("with --cold: cold_cache_runs, the same script in new processes "
                       "each with an empty TILEGEMM_KERNEL_CACHE") if args.cold else None,
    }
    if not rows:  # an empty file would replace the committed results of this machine
        print("nothing was measured (no backend given is usable here), so nothing was saved")
        return 2
    if not args.no_save:
        write_cpu_results(ROOT, "first-call", host_isa(), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
