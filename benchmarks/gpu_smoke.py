"""First call on a GPU: every path that only runs on real hardware, once, in about a minute.

    PYTHONPATH=src python3 benchmarks/gpu_smoke.py

Each check prints ``ok`` or ``FAIL`` with its error and the script goes on, so one run
shows every breakage: device listing, each rung on numba device arrays, CuPy arrays and
PyTorch tensors at 257×129×65 (and 257×128×64, the 128-bit path), transposes, ``out=``,
``gemm`` with a device ``c``, results ordered with the caller's CUDA stream (CuPy,
PyTorch, ``stream=``), ``Backend.prepare`` with CUDA events and the L2 flush, the
device details the results file records, the cuBLAS reference (FP32, and TF32/FP16/BF16
for the tensor-core rung), the tensor-core rung at each precision, float16/bfloat16 from
NumPy and PyTorch with 16-bit and float32 results. Exit status 1 if any check failed.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import numpy as np

import tilegemm
from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.precision import TOLERANCE_EPS
from tilegemm.reference import assert_close, random_operands

FAILED: list[str] = []


def check(what: str, fn: Callable[[], object]) -> None:
    try:
        note = fn()
        print(f"ok    {what}" + (f": {note}" if note else ""), flush=True)
    except Exception as exc:  # report and go on: the point is to see everything at once
        FAILED.append(what)
        print(f"FAIL  {what}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc(limit=-3)


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    from numba import cuda

    be = get_backend("cuda")
    st = be.status()
    print("cuda:", st.reason, st.devices)
    if not st.usable or st.simulated:
        print("gpu_smoke.py needs a real CUDA GPU; nothing was checked")
        return 2
    libs: dict[str, tuple[Callable, Callable]] = {
        "numba": (cuda.to_device, lambda x: x.copy_to_host())}
    try:
        import cupy

        libs["cupy"] = (cupy.asarray, cupy.asnumpy)
    except ImportError as exc:
        print("no CuPy:", exc)
    try:
        import torch

        libs["torch"] = (lambda x: torch.as_tensor(x, device="cuda"), lambda x: x.cpu().numpy())
    except ImportError as exc:
        print("no PyTorch:", exc)
    shapes = [(257, 129, 65), (257, 128, 64)]
    for spec in tilegemm.kernels("cuda"):
        # a tensor-core rung runs only on request: at each precision it computes
        for precision in spec.precisions or (None,):
            eps = TOLERANCE_EPS.get(precision or "ieee")
            for lib, (to, back) in libs.items():
                for m, n, k in shapes:
                    a, b = random_operands((m, k), (k, n), np.float32)

                    def one(spec=spec, to=to, back=back, a=a, b=b, precision=precision,
                            eps=eps) -> None:  # noqa: ANN001
                        r = tilegemm.matmul(to(a), to(b), backend="cuda", kernel=spec.name,
                                            precision=precision)
                        assert_close(back(r), a, b, what=type(r).__name__, eps=eps)

                    check(f"{spec.name:12s} {lib:6s} {m}x{n}x{k}"
                          + (f" {precision}" if precision else ""), one)
    for dtype in ("float16", "bfloat16"):  # tensor cores, 16-bit and float32 results
        m, n, k = shapes[0]
        a, b = random_operands((m, k), (k, n), dtype)

        def half(a=a, b=b) -> None:  # noqa: ANN001
            r = tilegemm.matmul(a, b, backend="cuda")
            # NumPy's result type: float16 for float16, float32 for ml_dtypes' bfloat16
            assert r.dtype == np.matmul(a[:1, :1], b[:1, :1]).dtype, r.dtype
            assert_close(r, a, b, what=a.dtype.name)
            r32 = tilegemm.matmul(a, b, backend="cuda", dtype=np.float32)
            assert r32.dtype == np.float32
            assert_close(r32, a, b, what=f"{a.dtype.name} -> float32")

        check(f"mma          numpy  {m}x{n}x{k} {dtype} (and dtype=float32)", half)
    if "torch" in libs:
        def torch_bf16() -> None:
            import torch

            from tilegemm.bench.vendors import _from_torch, _to_torch

            m, n, k = shapes[0]
            a, b = random_operands((m, k), (k, n), "bfloat16")
            r = tilegemm.matmul(_to_torch(torch, a), _to_torch(torch, b))
            assert r.dtype == torch.bfloat16 and r.is_cuda
            assert_close(_from_torch(torch, r), a, b, what="torch.bfloat16")
            r32 = tilegemm.matmul(_to_torch(torch, a), _to_torch(torch, b), dtype=np.float32)
            assert r32.dtype == torch.float32
            assert_close(r32.cpu().numpy(), a, b, what="torch.bfloat16 -> float32")

        check("mma          torch  bfloat16 tensors (and dtype=float32)", torch_bf16)
    m, n, k = shapes[0]
    for lib, (to, back) in libs.items():
        a, b = random_operands((k, m), (k, n), np.float64)
        c = np.random.default_rng().uniform(-1, 1, (m, n))

        def paths(to=to, back=back, a=a, b=b, c=c) -> None:  # noqa: ANN001
            r = tilegemm.gemm(to(a), to(b), trans_a=True, backend="cuda")
            assert_close(back(r), a, b, trans_a=True, what="trans_a")
            out = to(np.full((m, n), np.nan))
            assert tilegemm.gemm(to(a), to(b), trans_a=True, out=out, backend="cuda") is out
            assert_close(back(out), a, b, trans_a=True, what="out=")
            dc = to(c)
            assert tilegemm.gemm(to(a), to(b), dc, alpha=2.0, beta=0.5, trans_a=True,
                                 out=dc, backend="cuda") is dc
            assert_close(back(dc), a, b, alpha=2.0, beta=0.5, c=c, trans_a=True, what="c=out")

        check(f"trans_a, out=, device c   {lib}", paths)

    def caller_stream_cupy() -> str:
        """Operands written, multiplied and read on the caller's non-blocking stream, with a
        long kernel queued first: launching on another stream would race with it."""
        import cupy

        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            x = cupy.random.random((4096, 4096), dtype=cupy.float32)
            for _ in range(3):
                x = x @ x / 4096  # keeps the stream busy for a while
            a = cupy.random.random((257, 65), dtype=cupy.float32) + x[:257, :65] * 0
            b = cupy.random.random((65, 129), dtype=cupy.float32)
            r = tilegemm.matmul(a, b, backend="cuda", kernel="naive")
            copy = r.copy()  # read on the caller's stream right after the call
        s.synchronize()
        assert_close(cupy.asnumpy(copy), cupy.asnumpy(a), cupy.asnumpy(b), what="cupy stream")
        return "result ordered with the caller's stream"

    def caller_stream_torch() -> str:
        import torch

        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.rand(4096, 4096, device="cuda")
            for _ in range(3):
                x = x @ x / 4096
            a = torch.rand(257, 65, device="cuda") + x[:257, :65] * 0
            b = torch.rand(65, 129, device="cuda")
            r = tilegemm.matmul(a, b, backend="cuda", kernel="naive")
            copy = r.clone()
        s.synchronize()
        assert_close(copy.cpu().numpy(), a.cpu().numpy(), b.cpu().numpy(), what="torch stream")
        explicit = tilegemm.matmul(a, b, backend="cuda", kernel="naive", stream=s)
        s.synchronize()
        assert_close(explicit.cpu().numpy(), a.cpu().numpy(), b.cpu().numpy(), what="stream=")
        return "result ordered with the caller's stream; stream= too"

    if "cupy" in libs:
        check("caller's stream (CuPy, non-blocking)", caller_stream_cupy)
    if "torch" in libs:
        check("caller's stream (PyTorch) and stream=", caller_stream_torch)

    def prepared() -> str:
        from tilegemm.bench.timing import Policy, measure_kernel
        from tilegemm.problem import problem_for

        prob = problem_for(1024, 1024, 1024, "float32")
        a3, b3 = random_operands((1, 1024, 1024), (1, 1024, 1024), np.float32)
        meas = measure_kernel(be, registry.default_for("cuda", prob.dtype), {}, prob,
                              a3, b3, Policy(warmup=1, min_reps=3, budget_s=0.2, flush=True))
        assert meas.status == "ok", meas.reason
        return f"{meas.kernel} 1024^3 {meas.flops / min(meas.samples) / 1e9:.0f} GFLOP/s " \
               f"({meas.method}, flushed={meas.flushed})"

    check("prepare + CUDA events + L2 flush", prepared)

    def details() -> str:
        from tilegemm.bench.environment import backend_info

        info = backend_info(be)
        assert "compute_capability" in info, info
        return ", ".join(f"{k}={info.get(k)}" for k in (
            "device", "compute_capability", "driver", "driver_cuda_version", "l2_bytes",
            "sm_count"))

    check("device details", details)

    def vendor() -> str:
        from tilegemm.bench.timing import Policy
        from tilegemm.bench.vendors import find_vendor, measure_vendor
        from tilegemm.problem import problem_for

        v, note = find_vendor(be)
        assert v is not None, note
        prob = problem_for(1024, 1024, 1024, "float32")
        a3, b3 = random_operands((1, 1024, 1024), (1, 1024, 1024), np.float32)
        meas = measure_vendor(v, "cuda", prob, a3, b3, Policy(warmup=1, min_reps=3, budget_s=0.2))
        assert meas.status == "ok", meas.reason
        return f"{note}: {meas.flops / min(meas.samples) / 1e9:.0f} GFLOP/s"

    check("vendor (cuBLAS)", vendor)

    def vendors_at_precision() -> str:
        from tilegemm.bench.timing import Policy
        from tilegemm.bench.vendors import find_vendor, measure_vendor, tf32_overridden
        from tilegemm.problem import problem_for

        notes = []
        for dtype, math in (("float32", "tf32"), ("float16", "fp16"), ("bfloat16", "bf16")):
            if math == "tf32" and tf32_overridden():
                # the environment's choice, not a defect: say so and check the others
                notes.append(f"TF32 not checked ({tf32_overridden()})")
                continue
            v, note = find_vendor(be, math=math)
            assert v is not None, note
            prob = problem_for(1024, 1024, 1024, dtype)
            a3, b3 = random_operands((1, 1024, 1024), (1, 1024, 1024), dtype)
            meas = measure_vendor(v, "cuda", prob, a3, b3,
                                  Policy(warmup=1, min_reps=3, budget_s=0.2))
            assert meas.status == "ok", meas.reason
            notes.append(f"{v.name} {meas.flops / min(meas.samples) / 1e12:.0f} TFLOP/s")
        return "; ".join(notes)

    check("vendors at TF32/FP16/BF16 (cuBLAS)", vendors_at_precision)
    print(f"{len(FAILED)} failed" + (": " + "; ".join(FAILED) if FAILED else ""))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
