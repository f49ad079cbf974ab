"""The time of one small ``tilegemm.matmul`` on every usable backend, against NumPy and
against the backend's own floor: what a call costs when the arithmetic is nothing.

Usage (from the repository root; take the machine for yourself while it runs)::

    PYTHONPATH=src python benchmarks/small_calls.py            # writes benchmarks/results/
    PYTHONPATH=src python benchmarks/small_calls.py --no-save --backends opencl

Each case times whole ``tilegemm.matmul(a, b, backend=...)`` calls on NumPy arrays, as a
user's script makes them (of one dtype, or of two: ``--dtypes float32@float64 int8
bfloat16@float32``; and ``tilegemm.gemm``'s forms, ``GEMM_FORMS``, against NumPy's same
expression, unless ``--no-gemm``): validation, the ``auto`` choice, copies to and
from the device and the launch. NumPy's ``matmul`` of the same arrays is timed in the
same run, and every result is checked against float64 NumPy first. The floor is the
least a call of that backend can cost: for OpenCL a one-value kernel's launch and the
blocking read of its value on the same queue, for CUDA an empty kernel's launch and
``cuda.synchronize()``; the CPU has none (a call into compiled code costs about a
microsecond). What is above the floor is tilegemm's own work per call.

The device backends are also timed on their own device arrays (pyopencl arrays; numba,
CuPy and PyTorch CUDA arrays, those that are installed), where a call copies nothing and
returns without waiting: blocks of ``BLOCK`` calls, each block followed by one wait for
the device, the mean per call. The floor there is the same one-value or empty kernel
launched ``BLOCK`` times, then one wait. Writes
``benchmarks/results/small-calls-<cpu>-<isa>-m<family>-<model>.json``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_blocked  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm.backends import BACKENDS, get_backend  # noqa: E402
from tilegemm.bench.host_blas import settle  # noqa: E402
from tilegemm.bench.timing import mean_call_seconds  # noqa: E402
from tilegemm.reference import assert_close  # noqa: E402

SIZES = (8, 32, 64, 256)
# tilegemm.gemm's forms, timed beside matmul: (the call, NumPy's same expression); c is a
# fresh C-ordered array of the result, written only by the out=c form
GEMM_FORMS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "gemm(a, b)": (lambda a, b, c, be: tilegemm.gemm(a, b, backend=be),
                   lambda a, b, c: a @ b),
    "gemm(a, b, trans_b=True)": (lambda a, b, c, be: tilegemm.gemm(a, b, trans_b=True,
                                                                   backend=be),
                                 lambda a, b, c: a @ b.T),
    "gemm(a, b, alpha=0.5)": (lambda a, b, c, be: tilegemm.gemm(a, b, alpha=0.5, backend=be),
                              lambda a, b, c: 0.5 * (a @ b)),
    "gemm(a, b, c, alpha=0.5, beta=1.0)": (
        lambda a, b, c, be: tilegemm.gemm(a, b, c, alpha=0.5, beta=1.0, backend=be),
        lambda a, b, c: 0.5 * (a @ b) + c),
    "gemm(a, b, c, beta=1.0, out=c)": (
        lambda a, b, c, be: tilegemm.gemm(a, b, c, beta=1.0, out=c, backend=be),
        lambda a, b, c: np.add(a @ b, c, out=c)),
}


def opencl_floor() -> tuple[str, Callable[[], Any]]:
    """(device name, a kernel that writes one value, launched, and that value read back)
    on tilegemm's own queue: what a call on host arrays cannot do without. The wait is
    the blocking read a call makes; ``queue.finish()`` in its place took about 80 µs on
    PoCL 3.0 where the read took 15-40."""
    import pyopencl as cl

    own = get_backend("opencl").own_device()
    program = cl.Program(own.queue.context,
                         "__kernel void one(__global float *x) { x[0] = 1.0f; }").build()
    kernel = cl.Kernel(program, "one")
    buffer = cl.Buffer(own.queue.context, cl.mem_flags.READ_WRITE, 4)
    host = np.empty(1, np.float32)
    kernel.set_arg(0, buffer)

    def call() -> None:
        cl.enqueue_nd_range_kernel(own.queue, kernel, (1,), None)
        cl.enqueue_copy(own.queue, host, buffer, is_blocking=True)
    return own.device.name.strip(), call


def cuda_floor() -> tuple[str, Callable[[], Any]]:
    """(device name, one empty kernel launched and synchronized) with numba-cuda."""
    from numba import cuda

    @cuda.jit
    def nothing() -> None:
        pass

    def call() -> None:
        nothing[1, 1]()
        cuda.synchronize()
    name = getattr(cuda.get_current_device(), "name", "the CUDA simulator")
    return (name.decode() if isinstance(name, bytes) else str(name)), call


FLOORS: dict[str, Callable[[], tuple[str, Callable[[], Any]]]] = {
    "opencl": opencl_floor, "cuda": cuda_floor, "cudac": cuda_floor}
BLOCK = 10  # device-array calls between two waits for the device


class DeviceArrays(NamedTuple):
    """One kind of device array a backend takes: how to make one, read it back, and wait
    for the device; ``launch`` enqueues the floor's kernel without waiting."""

    label: str
    to_device: Callable[[np.ndarray], Any]
    to_host: Callable[[Any], np.ndarray]
    wait: Callable[[], Any]
    launch: Callable[[], Any]


def opencl_arrays() -> list[DeviceArrays]:
    import pyopencl as cl
    import pyopencl.array as cla

    own = get_backend("opencl").own_device()
    program = cl.Program(own.queue.context, "__kernel void one(__global float *x) "
                         "{ x[0] = 1.0f; }").build()
    kernel = cl.Kernel(program, "one")
    buffer = cl.Buffer(own.queue.context, cl.mem_flags.READ_WRITE, 4)
    kernel.set_arg(0, buffer)  # (the kernel does not keep the buffer alive: launch does)

    def launch() -> None:
        cl.enqueue_nd_range_kernel(own.queue, kernel, (1,), None)
        return buffer
    return [DeviceArrays("pyopencl", lambda x: cla.to_device(own.queue, x),
                         lambda r: r.get(), own.queue.finish, launch)]


def cuda_arrays() -> list[DeviceArrays]:
    from numba import cuda

    @cuda.jit
    def nothing() -> None:
        pass

    def launch() -> None:
        nothing[1, 1]()

    kinds = [DeviceArrays("numba", cuda.to_device, lambda r: r.copy_to_host(),
                          cuda.synchronize, launch)]
    try:
        import cupy

        kinds.append(DeviceArrays("cupy", cupy.asarray, cupy.asnumpy,
                                  cupy.cuda.Device().synchronize, launch))
    except Exception:  # noqa: BLE001 - not installed, or no GPU for it
        pass
    try:
        import torch

        if torch.cuda.is_available():
            kinds.append(DeviceArrays("torch", lambda x: torch.as_tensor(x, device="cuda"),
                                      lambda r: r.cpu().numpy(), torch.cuda.synchronize,
                                      launch))
    except Exception:  # noqa: BLE001
        pass
    return kinds


DEVICE_ARRAYS: dict[str, Callable[[], list[DeviceArrays]]] = {
    "opencl": opencl_arrays, "cuda": cuda_arrays}


def per_call_in_blocks(call: Callable[[], Any], wait: Callable[[], Any],
                       seconds: float) -> float:
    """Mean seconds per ``call()`` over blocks of ``BLOCK`` calls, each block then ``wait()``."""
    def block() -> None:
        for _ in range(BLOCK):
            call()
        wait()
    return mean_call_seconds(block, seconds) / BLOCK


def time_device_arrays(name: str, dtypes: list[str], sizes: list[int], seconds: float,
                       rng: np.random.Generator) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(floors, rows) of ``name``'s calls on each kind of its device arrays."""
    floors, rows = {}, []
    for kind in DEVICE_ARRAYS[name]():
        floor = per_call_in_blocks(kind.launch, kind.wait, seconds)
        floors[kind.label] = round(floor * 1e6, 1)
        print(f"{name} on {kind.label} arrays: floor (a kernel enqueued, one wait per "
              f"{BLOCK}) {floor * 1e6:.1f} us", flush=True)
        for dtype in dtypes:
            for n in sizes:
                a = rng.uniform(-1, 1, (n, n)).astype(dtype)
                b = rng.uniform(-1, 1, (n, n)).astype(dtype)
                da, db = kind.to_device(a), kind.to_device(b)
                try:
                    plan = tilegemm.plan(da, db)
                except tilegemm.errors.UsageError as exc:
                    print(f"{name} {kind.label} {dtype}: skipped ({exc})", flush=True)
                    break
                assert_close(kind.to_host(tilegemm.matmul(da, db)), a, b,
                             what=f"{name} {kind.label} {dtype} {n}^3")
                ours = per_call_in_blocks(lambda da=da, db=db: tilegemm.matmul(da, db),
                                          kind.wait, seconds)
                rows.append({"backend": name, "arrays": kind.label, "dtype": dtype, "size": n,
                             "us_tilegemm": round(ours * 1e6, 1),
                             "us_above_floor": round((ours - floor) * 1e6, 1),
                             "plan": str(plan)})
                print(f"{name} {kind.label} {dtype} {n}^3: {ours * 1e6:.1f} us per call, "
                      f"{(ours - floor) * 1e6:.1f} us above the floor", flush=True)
    return floors, rows


def operand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random non-zero-heavy data of ``dtype``: floats in [-1, 1), integers in [-3, 3]
    (unsigned ones [0, 3]: a product of such never overflows the narrowest), bool half
    true."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind in "iu":
        return rng.integers(0 if kind == "u" else -3, 4, shape).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def time_gemm_forms(name: str, a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
                    seconds: float) -> list[dict[str, Any]]:
    """Rows for :data:`GEMM_FORMS` on ``name`` with square operands ``a`` and ``b``, each
    checked first against float64 NumPy, then timed as the matmul rows are."""
    rows = []
    n, dtype = a.shape[0], a.dtype.name
    for form, (ours_call, numpy_call) in GEMM_FORMS.items():
        c = rng.uniform(-1, 1, a.shape).astype(dtype)
        expected = numpy_call(a.astype(np.float64), b.astype(np.float64), c.astype(np.float64))
        got = ours_call(a, b, c.copy(), name)
        tolerance = 1e-4 if dtype == "float32" else 1e-10
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * n,
                                   err_msg=f"{name} {dtype} {n}^3 {form}")
        ours = mean_call_seconds(partial(ours_call, a, b, c, name), seconds)
        settle()
        ref = mean_call_seconds(partial(numpy_call, a, b, c), seconds)
        settle()
        rows.append({"backend": name, "dtype": dtype, "size": n, "call": form,
                     "us_tilegemm": round(ours * 1e6, 1), "us_numpy": round(ref * 1e6, 2),
                     "times_numpy": round(ours / ref, 1)})
        print(f"{name} {dtype} {n}^3 {form}: {ours * 1e6:.1f} us per call, NumPy "
              f"{ref * 1e6:.2f} us ({ours / ref:.1f}x)", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS),
                    help="backends to time (those not usable here are skipped, with why)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                    help="a's dtype, or a's@b's (float32@float64); gemm's forms are timed "
                         "for float32 and float64 alone")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--seconds", type=float, default=0.3, help="of calls per measurement")
    ap.add_argument("--no-gemm", dest="gemm", action="store_false",
                    help="time matmul only, not also tilegemm.gemm's forms on host arrays")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--out", type=Path, default=None,
                    help="write the results here instead of benchmarks/results/")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    rows, floors, skipped, device_floors, device_rows = [], {}, {}, {}, []
    for name in args.backends:
        status = get_backend(name).status()
        if not status.usable:
            skipped[name] = status.reason
            print(f"{name}: skipped ({status.reason})", flush=True)
            continue
        if name in FLOORS:
            device, floor_call = FLOORS[name]()
            floor = mean_call_seconds(floor_call, args.seconds)
            floors[name] = {"device": device, "us_floor": round(floor * 1e6, 1)}
            print(f"{name} ({device}): floor (an empty kernel and its wait) "
                  f"{floor * 1e6:.1f} us", flush=True)
        if name in DEVICE_ARRAYS:
            one_dtype = [d for d in args.dtypes if "@" not in d]  # (operands of one dtype)
            device_floors[name], more = time_device_arrays(name, one_dtype, args.sizes,
                                                           args.seconds, rng)
            device_rows.extend(more)
        for dtype in args.dtypes:
            dtype_a, _, dtype_b = dtype.partition("@")
            for n in args.sizes:
                a = operand(rng, (n, n), dtype_a)
                b = operand(rng, (n, n), dtype_b or dtype_a)
                try:
                    plan = tilegemm.plan(a, b, backend=name)
                except tilegemm.errors.UsageError as exc:  # a dtype this device cannot compute
                    print(f"{name} {dtype}: skipped ({exc})", flush=True)
                    break
                assert_close(tilegemm.matmul(a, b, backend=name), a, b,
                             what=f"{name} {dtype} {n}^3")
                ours = mean_call_seconds(
                    lambda a=a, b=b, name=name: tilegemm.matmul(a, b, backend=name),
                    args.seconds)
                settle()
                ref = mean_call_seconds(lambda a=a, b=b: np.matmul(a, b), args.seconds)
                settle()
                row = {"backend": name, "dtype": dtype, "size": n,
                       "us_tilegemm": round(ours * 1e6, 1), "us_numpy": round(ref * 1e6, 2),
                       "times_numpy": round(ours / ref, 1), "plan": str(plan)}
                line = (f"{name} {dtype} {n}^3: {ours * 1e6:.1f} us per call, NumPy "
                        f"{ref * 1e6:.2f} us ({ours / ref:.1f}x)")
                if name in floors:
                    above = ours * 1e6 - floors[name]["us_floor"]
                    row["us_above_floor"] = round(above, 1)
                    line += f", {above:.1f} us above the floor"
                rows.append(row)
                print(line, flush=True)
                if args.gemm and dtype in ("float32", "float64"):
                    rows.extend(time_gemm_forms(name, a, b, rng, args.seconds))
    if not rows and not device_rows:  # an empty file would replace committed results
        print("nothing was measured (no backend given is usable here), so nothing was saved")
        return 2
    if not args.no_save:
        cpu_blocked.save_results("small-calls", {
            "method": "mean wall-clock time of whole tilegemm.matmul calls on NumPy arrays "
                      f"for about {args.seconds} s after one untimed call, then np.matmul "
                      "the same way (rows with a 'call': that tilegemm.gemm form against "
                      "NumPy's same expression), a settling pause after each; floor: for "
                      "OpenCL a kernel writing one value launched and that value read back "
                      "(blocking), for CUDA an empty kernel launched and synchronized, on the "
                      "backend's own queue; on device arrays, blocks of "
                      f"{BLOCK} calls each followed by one wait for the device, and the "
                      "floor a kernel enqueued the same way",
            "floors": floors, "skipped": skipped, "calls": rows,
            "device_array_floors": device_floors, "device_array_calls": device_rows,
        }, path=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
