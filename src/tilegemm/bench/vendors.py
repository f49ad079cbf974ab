"""The vendor library each backend is measured against, in the same run, the same way.

Speed means little without a reference on the same device at the same moment, so every
table reports a rung's GFLOP/s and its share of:

- ``cuda``: cuBLAS through CuPy (``CUPY_TF32=0``) or PyTorch
  (``torch.backends.cuda.matmul.allow_tf32 = False``): pure FP32 math, never TF32 tensor
  cores, which would be a different (less accurate) product. A tensor-core run is compared
  with cuBLAS *at its own precision* (:func:`vendor_math`): TF32 (CuPy with
  ``CUPY_TF32=1``, or PyTorch with TF32 enabled), FP16 and BF16 with float32 accumulation
  (PyTorch, reduced-precision reductions off); 3xTF32 against FP32 SGEMM, the accuracy it
  matches.
- ``opencl``: CLBlast through ``pyclblast`` when it is installed.
- ``cpu``: NumPy's ``matmul`` (OpenBLAS or whichever BLAS NumPy was built with).

Beside the reference, a *rival* may be timed on the same operands at the same precision
(:data:`RIVALS`): Triton's tutorial matmul (:mod:`tilegemm.bench.triton_matmul`) on a CUDA
device where ``triton`` and ``torch`` import, the Python-authored GEMM to beat. Its share
is of the reference too; where it cannot run, one line says why.

A vendor routine goes through :func:`tilegemm.bench.timing.time_prepared` like a rung:
first call apart, verified, then timed with the library's own events.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilegemm.backends.base import Backend, Prepared, Target, wall_clock_elapsed
from tilegemm.bench.host_blas import settle
from tilegemm.bench.timing import (
    FAILED,
    OK,
    Clock,
    KernelFailure,
    Measurement,
    Policy,
    time_prepared,
)
from tilegemm.problem import GemmProblem
from tilegemm.reference import assert_close


@dataclass(frozen=True)
class Vendor:
    """A vendor GEMM: ``prepare(prob, a3, b3)`` returns launch/fetch/elapsed closures."""

    key: str  # short id used in results: "numpy", "cublas-cupy", "cublas-torch", "clblast"
    name: str  # what tables show, e.g. "cuBLAS (CuPy)"
    note: str  # how it was configured (FP32 compute, BLAS build...)
    prepare: Callable[[GemmProblem, np.ndarray, np.ndarray], Prepared]
    synchronize: Callable[[], None] = lambda: None
    timer: str = "perf_counter"
    math: str = "native"  # see vendor_math: what it computes, and so how it is verified
    # What the library chose for the problem it last ran (Triton: its autotuned tile), kept
    # with the measurement as its parameters; {} where it chooses nothing we can see.
    config: Callable[[], dict[str, int]] = dict
    # NumPy's own BLAS: its threads spin on the host's cores after each call (host_blas)
    host_blas: bool = False


def _numpy_blas() -> str:
    """The BLAS NumPy was built with, e.g. ``OpenBLAS 0.3.31`` (NumPy >= 1.25 records it)."""
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]  # type: ignore[attr-defined]
    except Exception:
        return "BLAS"
    name = str(blas.get("name", "BLAS")).removeprefix("scipy-")
    name = {"openblas": "OpenBLAS", "mkl": "MKL", "accelerate": "Accelerate"}.get(name, name)
    version = ".".join(str(blas.get("version", "")).split(".")[:3])
    return f"{name} {version}".strip()


def numpy_vendor() -> Vendor:
    def prepare(prob: GemmProblem, a3: np.ndarray, b3: np.ndarray) -> Prepared:
        a, b = (a3[0], b3[0]) if prob.batch == 1 else (a3, b3)
        out = np.empty((prob.m, prob.n) if prob.batch == 1 else (prob.batch, prob.m, prob.n),
                       dtype=prob.dtype)

        def launch() -> None:
            np.matmul(a, b, out=out)

        return Prepared(launch, lambda: out.copy(), lambda n: wall_clock_elapsed(launch, n))

    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    note = f"numpy {np.__version__} matmul on the host ({_numpy_blas()}"
    note += f", {threads} BLAS thread(s))" if threads else ", BLAS default threads)"
    return Vendor("numpy", f"NumPy ({_numpy_blas()})", note, prepare, host_blas=True)


# What the vendor reference computes, per (dtype, precision=) of the tilegemm run.
MATHS: tuple[str, ...] = ("native", "tf32", "fp16", "bf16")


def vendor_math(dtype: np.dtype | str, precision: str = "ieee") -> str:
    """The cuBLAS mode a run of ``dtype`` at ``precision`` is compared with: "native" (the
    dtype's own IEEE GEMM: SGEMM, DGEMM), "tf32", "fp16" or "bf16" (16-bit inputs, float32
    accumulation). 3xTF32 is compared with SGEMM: its claim is float32 accuracy, faster."""
    name = np.dtype(dtype).name
    if name == "float16":
        return "fp16"
    if name == "bfloat16":
        return "bf16"
    return "tf32" if precision == "tf32" else "native"


MATH_LABEL = {"native": "", "tf32": " TF32", "fp16": " FP16", "bf16": " BF16"}


def tf32_overridden() -> str | None:
    """Why cuBLAS cannot be the TF32 reference in this process, or None.

    ``NVIDIA_TF32_OVERRIDE=0`` turns TF32 off inside cuBLAS whatever CuPy or PyTorch ask
    for, so a "TF32" reference silently runs FP32 SGEMM (seen on an H100: 52 TFLOP/s with
    SGEMM's error, against 388 for TF32). It is right for FP32 runs, wrong for this one."""
    if os.environ.get("NVIDIA_TF32_OVERRIDE", "").strip() == "0":
        return ("NVIDIA_TF32_OVERRIDE=0 is set: it turns TF32 off inside cuBLAS, so the "
                "TF32 reference would be FP32 SGEMM; unset it for TF32 comparisons")
    return None


def _refuse_tf32_overridden(math: str) -> None:
    why = tf32_overridden() if math == "tf32" else None
    if why:
        raise ValueError(why)


def _cupy_vendor(math: str = "native") -> Vendor:
    # CuPy reads CUPY_TF32 when it is imported, so it is set before; if CuPy was imported
    # earlier with the other setting, refuse (the next vendor is tried) rather than pretend.
    if math not in ("native", "tf32"):
        raise ValueError(f"the CuPy reference covers FP32/TF32 only, not {math.upper()} "
                         "(PyTorch is the reference for 16-bit inputs)")
    _refuse_tf32_overridden(math)
    want = "1" if math == "tf32" else "0"
    if math == "tf32" and "cupy" in sys.modules and os.environ.get("CUPY_TF32", "0") != want:
        raise ValueError("CuPy was imported with CUPY_TF32 unset: no TF32 reference")
    tf32_on = "cupy" in sys.modules and os.environ.get("CUPY_TF32", "0") != "0" and want == "0"
    os.environ["CUPY_TF32"] = want
    import cupy

    def prepare(prob: GemmProblem, a3: np.ndarray, b3: np.ndarray) -> Prepared:
        a, b = (a3[0], b3[0]) if prob.batch == 1 else (a3, b3)
        da, db = cupy.asarray(a), cupy.asarray(b)
        out = cupy.empty((prob.m, prob.n) if prob.batch == 1 else (prob.batch, prob.m, prob.n),
                         dtype=prob.dtype)

        def launch() -> None:
            cupy.matmul(da, db, out=out)

        def elapsed(n: int) -> list[float]:
            events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(n)]
            for start, end in events:
                start.record()
                launch()
                end.record()
            events[-1][1].synchronize()
            return [cupy.cuda.get_elapsed_time(s, e) / 1e3 for s, e in events]

        return Prepared(launch, lambda: cupy.asnumpy(out), elapsed)

    precision = ("CUPY_TF32=1 was set before tilegemm: TF32 may be used" if tf32_on
                 else "CUPY_TF32=1: TF32 tensor cores" if math == "tf32"
                 else "CUPY_TF32=0: FP32 compute, no TF32")
    return Vendor("cublas-cupy" + ("-tf32" if math == "tf32" else ""),
                  f"cuBLAS{MATH_LABEL[math]} (CuPy)", f"cupy {cupy.__version__}, {precision}",
                  prepare, lambda: cupy.cuda.Device().synchronize(), "CUDA events", math)


def _torch_fp32_matmul(torch: Any) -> None:
    """Pure FP32 matmul (no TF32 tensor cores) through the API this PyTorch has.

    PyTorch >= 2.9 has ``torch.backends.cuda.matmul.fp32_precision``; there, touching the
    legacy ``allow_tf32`` flags after anything set the new one raises a RuntimeError about
    mixing the two APIs (and both mean the same for cuBLAS), so the new one is used alone.
    cuDNN's flag is left alone: matmul never goes through cuDNN.
    """
    matmul = torch.backends.cuda.matmul
    try:
        new_api = getattr(matmul, "fp32_precision", None) is not None
    except Exception:  # an older torch's __getattr__ may refuse unknown names in other ways
        new_api = False
    if new_api:
        matmul.fp32_precision = "ieee"
    else:
        matmul.allow_tf32 = False


def _torch_math(torch: Any, math: str) -> str:
    """Set PyTorch's cuBLAS mode for ``math``; the note for the results file."""
    matmul = torch.backends.cuda.matmul
    if math == "tf32":
        try:
            new_api = getattr(matmul, "fp32_precision", None) is not None
        except Exception:
            new_api = False
        if new_api:
            matmul.fp32_precision = "tf32"
        else:
            matmul.allow_tf32 = True
        return "TF32 matmul (tensor cores, TF32 enabled)"
    _torch_fp32_matmul(torch)
    if math == "fp16":
        matmul.allow_fp16_reduced_precision_reduction = False
        return "FP16 matmul, float32 accumulation (no reduced-precision reduction)"
    if math == "bf16":
        matmul.allow_bf16_reduced_precision_reduction = False
        return "BF16 matmul, float32 accumulation (no reduced-precision reduction)"
    return "FP32 matmul (no TF32)"


def _to_torch(torch: Any, x: np.ndarray) -> Any:
    """A host array on the GPU; bfloat16 (ml_dtypes) through its bits, which torch's
    ``from_numpy`` does not know as a dtype."""
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).cuda().view(
            torch.bfloat16)
    return torch.from_numpy(x).cuda()


def _from_torch(torch: Any, t: Any) -> np.ndarray:
    if str(getattr(t, "dtype", "")) == "torch.bfloat16":
        return t.view(torch.int16).cpu().numpy().view("bfloat16")
    return t.cpu().numpy()


def _torch_events(torch: Any, launch: Callable[[], None]) -> Callable[[int], list[float]]:
    """``elapsed(n)``: n launches, each between two CUDA events on PyTorch's stream."""

    def elapsed(n: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, end in events:
            start.record()
            launch()
            end.record()
        events[-1][1].synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in events]

    return elapsed


def _torch_vendor(math: str = "native") -> Vendor:
    import torch

    if not torch.cuda.is_available():
        raise ImportError("PyTorch has no CUDA device")
    _refuse_tf32_overridden(math)
    note = _torch_math(torch, math)

    def prepare(prob: GemmProblem, a3: np.ndarray, b3: np.ndarray) -> Prepared:
        a, b = (a3[0], b3[0]) if prob.batch == 1 else (a3, b3)
        da, db = _to_torch(torch, a), _to_torch(torch, b)
        out = torch.empty((prob.m, prob.n) if prob.batch == 1 else (prob.batch, prob.m, prob.n),
                          dtype=da.dtype, device=da.device)

        def launch() -> None:
            torch.matmul(da, db, out=out)

        return Prepared(launch, lambda: _from_torch(torch, out), _torch_events(torch, launch))

    return Vendor("cublas-torch" + ("" if math == "native" else f"-{math}"),
                  f"cuBLAS{MATH_LABEL[math]} (PyTorch)", f"torch {torch.__version__}, {note}",
                  prepare, torch.cuda.synchronize, "CUDA events", math)


def _opencl_queue(target: Target) -> Any:
    """A profiling queue of our own on the target's OpenCL device."""
    import pyopencl as cl

    ctx = cl.Context([target.handle])
    return cl.CommandQueue(ctx, target.handle,
                           properties=cl.command_queue_properties.PROFILING_ENABLE)


def _clblast_vendor(target: Target) -> Vendor:
    import pyclblast
    import pyopencl as cl
    import pyopencl.array as cla

    queue = _opencl_queue(target)

    def prepare(prob: GemmProblem, a3: np.ndarray, b3: np.ndarray) -> Prepared:
        if prob.batch != 1:
            raise ValueError("the CLBlast reference is measured on single products only")
        a, b = np.ascontiguousarray(a3[0]), np.ascontiguousarray(b3[0])
        da, db = cla.to_device(queue, a), cla.to_device(queue, b)
        dc = cla.empty(queue, (prob.m, prob.n), dtype=prob.dtype)

        def enqueue() -> Any:
            return pyclblast.gemm(queue, prob.m, prob.n, prob.k, da, db, dc,
                                  a_ld=prob.k, b_ld=prob.n, c_ld=prob.n)

        def elapsed(n: int) -> list[float]:
            # CLBlast may enqueue several kernels per call (pad/transpose, then GEMM) and
            # returns the event of the last one only; markers around the call bracket all
            # of them (on PoCL the last event covered 2 ms of an 80 ms call at 1024³).
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                before = cl.enqueue_marker(queue)
                enqueue()
                after = cl.enqueue_marker(queue)
                queue.finish()
                wall = time.perf_counter() - t0
                try:
                    times.append((after.profile.end - before.profile.start) * 1e-9)
                except Exception:  # no profiling info: host time is the bound
                    times.append(wall)
            return times

        def launch() -> None:
            enqueue()

        return Prepared(launch, dc.get, elapsed)

    version = getattr(pyclblast, "__version__", "")
    return Vendor("clblast", "CLBlast", f"pyclblast {version}".strip(), prepare,
                  queue.finish, "OpenCL profiling events")


def _native_only(make: Callable[[Target], Vendor]) -> Callable[[Target, str], Vendor]:
    def vendor(target: Target, math: str = "native") -> Vendor:
        if math != "native":
            raise ValueError(f"no {math.upper()} mode (its dtype's own GEMM only)")
        return make(target)

    return vendor


# The references a Target may name (``Target.vendors``), each made for that device and
# the math to compare with (:func:`vendor_math`); one that cannot compute it raises.
VENDORS: dict[str, Callable[[Target, str], Vendor]] = {
    "numpy": _native_only(lambda target: numpy_vendor()),
    "cupy": lambda target, math="native": _cupy_vendor(math),
    "torch": lambda target, math="native": _torch_vendor(math),
    "clblast": _native_only(_clblast_vendor),
}


# How Triton's dot is asked for each math (:func:`vendor_math`): "ieee" is float32 FMA
# arithmetic (no TF32), "tf32" TF32 tensor cores; 16-bit inputs take Triton's default (the
# setting applies to float32 inputs only).
TRITON_PRECISION = {"native": "ieee", "tf32": "tf32", "fp16": "tf32", "bf16": "tf32"}
TRITON_MATH_NOTE = {
    "native": 'input_precision="ieee": FP32 FMA arithmetic, no TF32',
    "tf32": 'input_precision="tf32": TF32 tensor cores',
    "fp16": "FP16 inputs, float32 accumulation",
    "bf16": "BF16 inputs, float32 accumulation",
}


def _triton_vendor(target: Target, dtype: np.dtype, math: str = "native") -> Vendor:
    """Triton's tutorial matmul on PyTorch tensors, autotuned on the first call of each
    shape (the first call, apart from the timed ones), timed with CUDA events like cuBLAS
    through PyTorch."""
    if np.dtype(dtype).name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"the tutorial matmul is timed in float32, float16 and bfloat16, "
                         f"not {np.dtype(dtype).name}")
    import torch

    if not torch.cuda.is_available():
        raise ImportError("PyTorch has no CUDA device")
    import triton

    # Triton builds its CUDA helpers with the host's C compiler when its driver starts:
    # start it here, so a machine without one is a note, not a FAILED row.
    driver = triton.runtime.driver
    getattr(driver, "active", driver).utils  # noqa: B018 - touched to start the driver
    from tilegemm.bench import triton_matmul as tm

    precision = TRITON_PRECISION[math]

    def prepare(prob: GemmProblem, a3: np.ndarray, b3: np.ndarray) -> Prepared:
        if prob.batch != 1:
            raise ValueError("the Triton matmul is measured on single products only")
        da, db = _to_torch(torch, a3[0]), _to_torch(torch, b3[0])
        # NaN first, as the rungs' outputs are: an element the kernel never writes fails
        # the check instead of showing what an earlier product left in that memory.
        out = torch.full((prob.m, prob.n), float("nan"), dtype=da.dtype, device=da.device)

        def launch() -> None:
            tm.matmul_into(da, db, out, precision)

        return Prepared(launch, lambda: _from_torch(torch, out), _torch_events(torch, launch))

    note = (f"triton {triton.__version__}, the tutorial matmul (03-matrix-multiplication) "
            f"autotuned over its {len(tm.CUDA_CONFIGS)} CUDA configurations on the first call "
            f"of each shape, {TRITON_MATH_NOTE[math]}")
    return Vendor("triton" + ("" if math == "native" else f"-{math}"),
                  f"Triton{MATH_LABEL[math]}", note, prepare, torch.cuda.synchronize,
                  "CUDA events", math, tm.chosen_config)


# Rivals: GEMMs timed beside the reference on the same operands at the same math, not
# instead of it; each is made for (target, dtype, math) and raises where it cannot run.
RIVALS: dict[str, Callable[[Target, np.dtype, str], Vendor]] = {"triton": _triton_vendor}
RIVAL_LABEL = {"triton": "Triton"}


def rivals_for(target: Target) -> tuple[str, ...]:
    """The rivals to time on ``target``: Triton on a real CUDA device (one whose references
    include PyTorch, whose tensors and stream Triton's kernel runs on)."""
    return ("triton",) if "torch" in target.vendors and not target.simulated else ()


def find_rival(name: str, target: Target, dtype: np.dtype | str,
               math: str = "native") -> tuple[Vendor | None, str]:
    """The rival ``name`` on ``target`` for ``dtype`` at ``math``, and one line saying what
    it is, or why it is not timed
    (``Triton not timed: ModuleNotFoundError: No module named 'triton'``)."""
    try:
        v = RIVALS[name](target, np.dtype(dtype), math)
    except Exception as exc:  # ImportError mostly: the rival is simply absent
        why = " ".join(str(exc).split())  # one line, whatever the library's message
        return None, f"{RIVAL_LABEL.get(name, name)} not timed: {type(exc).__name__}: {why}"
    return v, f"{v.name}: {v.note}"


def find_vendor(backend: Backend, target: Target | None = None,
                math: str = "native") -> tuple[Vendor | None, str]:
    """The reference library for the target device (default: the backend's) computing
    ``math`` (:func:`vendor_math`), and a line saying what was found (or why not): the
    first of ``target.vendors`` that loads and has that mode."""
    target = target or backend.target()
    if target.simulated:
        return None, "simulated backend: no vendor reference"
    tried: list[str] = []
    for name in target.vendors:
        try:
            v = VENDORS[name](target, math)
            return v, v.note
        except Exception as exc:  # ImportError mostly; any failure just means "no reference"
            tried.append(f"{type(exc).__name__}: {exc}")
    return None, "no vendor library found" + (f" ({'; '.join(tried)})" if tried else "")


def measure_vendor(
    vendor: Vendor, backend_name: str, prob: GemmProblem, a3: np.ndarray, b3: np.ndarray,
    policy: Policy, *, clock: Clock = time.perf_counter, host_work: int = 0,
    flush: Callable[[], None] | None = None,
) -> Measurement:
    """Verify and time the vendor routine exactly as :func:`measure_kernel` does a rung
    (``host_work``: see :func:`~tilegemm.bench.timing.time_prepared`; ``flush``: the
    backend's cache flusher under ``--flush-l2``, so the reference starts cold as the rungs
    do, not from a warm cache). A vendor that is
    NumPy's own BLAS leaves its threads spinning: the call returns after they settle, so
    the next measurement on these cores starts on idle ones."""
    meas = Measurement(backend=backend_name, kernel=vendor.name, m=prob.m, n=prob.n, k=prob.k,
                       batch=prob.batch, dtype=prob.dtype.name, vendor=True, method=vendor.timer)

    # TF32 is checked at TF32's epsilon, as the rung is (16-bit results: their dtype's own)
    eps = 2.0**-10 if vendor.math == "tf32" else None

    def verify(result: np.ndarray) -> None:
        assert_close(result.reshape(prob.batch, prob.m, prob.n), a3, b3, what=vendor.name,
                     eps=eps)

    meas.flushed = flush is not None
    try:
        meas.first_s, meas.samples = time_prepared(
            lambda: vendor.prepare(prob, a3, b3), verify, policy,
            synchronize=vendor.synchronize, clock=clock, host_work=host_work, flush=flush)
    except KernelFailure as exc:
        meas.status, meas.reason = FAILED, str(exc)
    finally:
        if vendor.host_blas:
            settle()
    if meas.status == OK:  # what it chose for this problem (a failed run chose nothing)
        meas.params = dict(vendor.config())
    return meas
