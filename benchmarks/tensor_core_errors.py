"""Error against float64 of every tensor-core mode of rung ``mma``, measured on the kernel.

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=src python benchmarks/tensor_core_errors.py \
        [--k 64 256 1024] [--mn 32] [--json benchmarks/results/FILE.json]

Runs where the CUDA backend runs: under numba's CUDA simulator (no GPU; the tensor-core
instructions are the PTX-ISA emulations of ``kernels/cuda/_tensorcore.py``, each mma
computed exactly from its inputs and rounded to float32, so the sums are rounded once per
k step of 8 or 16 rather than inside the hardware's adder tree), or on a real GPU with
larger sizes. For each K, standard-normal float32 A (M×K) and B (K×N), and the metric

    max over C of |C − C64| / (|A|·|B|)     (elementwise, independent of cancellation)

where C64 is the float64 product of the operands *as the kernel received them* (for the
16-bit modes, the rounded 16-bit values: what remains is the kernel's own error). Modes:
``ieee`` (kernel="auto", the FFMA rungs), ``tf32``, ``3xtf32``, ``float16`` and
``bfloat16`` (a 16-bit result, asked for with ``dtype=``: NumPy's rule makes a bfloat16
product float32) and their ``dtype=float32`` results; NumPy's
float32 matmul (the host BLAS) for scale.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from tilegemm.backends.base import BackendStatus


def _error(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.max(np.abs(c.astype(np.float64) - a64 @ b64)
                        / (np.abs(a64) @ np.abs(b64))))


def measure(k: int, mn: int, seed: int) -> dict[str, float]:
    import tilegemm

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((mn, k)).astype(np.float32)
    b = rng.standard_normal((k, mn)).astype(np.float32)
    row: dict[str, float] = {"k": k, "m": mn, "n": mn}
    row["ieee"] = _error(tilegemm.matmul(a, b, backend="cuda"), a, b)
    for p in ("tf32", "3xtf32"):
        row[p] = _error(tilegemm.matmul(a, b, backend="cuda", precision=p), a, b)
    for d in ("float16", "bfloat16"):
        ah, bh = a.astype(d), b.astype(d)
        row[d] = _error(tilegemm.matmul(ah, bh, backend="cuda", dtype=d), ah, bh)
        row[f"{d}->float32"] = _error(tilegemm.matmul(ah, bh, backend="cuda",
                                                      dtype=np.float32), ah, bh)
    row["numpy float32"] = _error(a @ b, a, b)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--mn", type=int, default=32, help="M = N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the rows and the machine details here")
    args = parser.parse_args()

    from tilegemm.backends import get_backend

    status = get_backend("cuda").status()
    if not status.usable:
        print(f"the CUDA backend cannot run here: {status.reason} (set NUMBA_ENABLE_CUDASIM=1)")
        return 2
    rows = []
    for k in args.k:
        t0 = time.perf_counter()
        row = measure(k, args.mn, args.seed + k)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        write_json(Path(args.json), status, rows)
    return 0


def write_json(path: Path, status: BackendStatus, rows: list[dict]) -> None:
    """The rows with what every results file records: the device and the backend's details
    (driver, compute capability... as ``backend_info`` gives them), the host, the package
    versions and the git commit."""
    from tilegemm.backends import get_backend
    from tilegemm.bench.environment import (
        backend_info,
        git_commit,
        host_info,
        versions,
        write_results,
    )

    device = ", ".join(status.devices) or status.reason  # the GPU's name where there is one
    doc = {"what": "max |C - C64| / (|A|.|B|), rung mma per mode", "device": device,
           "backend": status.reason, "simulated": status.simulated,
           "backend_info": backend_info(get_backend("cuda")), "host": host_info(),
           "machine": platform.processor() or platform.machine(),
           "versions": versions(), "git_commit": git_commit(), "rows": rows}
    write_results(path, doc)


if __name__ == "__main__":
    sys.exit(main())
