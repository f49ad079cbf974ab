"""CUDA backend: Numba CUDA rungs; the same kernels run on numba's simulator.

With ``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported, ``backend="cuda"`` runs every
rung on numba's CUDA simulator (correct but slow: tiny shapes only), so anyone can check a
rung without a GPU. ``backend="auto"`` never picks the simulator.

Arrays with ``__cuda_array_interface__`` (numba, CuPy, PyTorch) are used in place and the
result is returned as the same library's array, with no copy to the host. Repeated plain
calls on CuPy or PyTorch arrays skip numba's array objects (``backends/cuda_direct``), and
every kernel is launched through the driver once numba has launched it
(``backends/cuda_launch``).
"""

from __future__ import annotations

import contextlib
import math
import subprocess
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np

from tilegemm import simulator
from tilegemm.backends import cuda_staging
from tilegemm.backends._probe import driver_library_present as _driver_library_present
from tilegemm.backends.base import (
    Backend,
    BackendStatus,
    Limits,
    Prepared,
    Target,
    check_block_limits,
    poison_enabled,
    poison_value,
    resolve_scalars,
    size_text,
    wall_clock_elapsed,
)
from tilegemm.backends.cuda_program import MIN_OPTIN_SMEM_SM80, STATIC_SMEM_LIMIT, strided_view
from tilegemm.backends.cuda_stream import (
    choose_stream,
    numba_stream,
    same_stream,
    stream_handle,
)
from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError
from tilegemm.problem import (
    GemmProblem,
    Operand,
    array_kind,
    host_operand_3d,
    rounded_to_result,
)
from tilegemm.registry import KernelSpec, specs_for

# The architectures rungs are compiled for without a GPU (nvJitLink), by compute capability.
COMPILE_ARCHS: dict[str, tuple[int, int]] = {"sm_80": (8, 0), "sm_90": (9, 0)}
MAX_THREADS_PER_BLOCK = 1024
MAX_STATIC_SMEM = STATIC_SMEM_LIMIT  # bytes of static shared memory a block, any arch
# Every CUDA GPU since sm_50: 1,024 threads, 48 KiB of static shared memory and 64 Ki
# registers per block, at most 255 registers a thread. The tuner and the resource checks
# read these through the Target, never from here.
CUDA_LIMITS = Limits(threads_per_block=MAX_THREADS_PER_BLOCK, block_dims=(1024, 1024, 64),
                     shared_per_block=MAX_STATIC_SMEM, registers_per_block=65536,
                     registers_per_thread=255, shared_optin_per_block=MIN_OPTIN_SMEM_SM80)


def check_for_any_gpu(spec: KernelSpec, params: Mapping[str, int], dtype: Any) -> None:
    """What a call checks before it runs, for code made without a GPU (``explain``'s trace
    and machine-code counts, ``compile_cubin``), as the simulator checks it: the rung's
    parameters against the dtype (one mma pass for 16-bit data, say), and a block's
    threads and shared memory (a float64 tile that fits in float32 may not; a rung for
    one architecture, wgmma, may use that architecture's opt-in shared memory). A request
    a call would refuse is refused here too, not traced, or failed in the compiler."""
    anywhere = Target(spec.backend, "the GPUs it runs on", "simulator", "", CUDA_LIMITS,
                      timer="CUDA events", simulated=True)
    BACKEND.check_limits(spec, params, np.dtype(dtype), anywhere)


def _as_device(x: Any, stream: Any = None, wait: bool = True) -> Any:
    """A numba device array view of ``x`` (numba arrays and the simulator's pass through),
    for work on numba stream ``stream``.

    An array that names the stream it was written on (the ``stream`` field of the CUDA
    Array Interface, which CuPy fills) makes numba wait on the host for that stream,
    unless told not to. The wait is kept where it orders something: not when the work
    goes on that same stream, where the stream itself orders it, and not with
    ``wait=False``, for a view whose address alone is read."""
    if getattr(x, "__cuda_ndarray__", False):
        return x
    from numba import cuda

    cai = getattr(x, "__cuda_array_interface__", None)
    exported = cai.get("stream") if isinstance(cai, dict) else None
    same = stream is not None and same_stream(exported, stream_handle(stream))
    return cuda.as_cuda_array(x, sync=wait and exported is not None and not same)


def _bits(x: Any) -> Any:
    """``x`` as numba can hold it: a bfloat16 array (ml_dtypes on the host, torch.bfloat16
    on the device) viewed as its 16-bit patterns (numba has no bfloat16 type; the
    tensor-core rung reads the patterns as bfloat16). Any other array unchanged."""
    if isinstance(x, np.ndarray):
        return x.view(np.int16) if x.dtype.name == "bfloat16" else x
    if _source_library(x) == "torch":
        import torch

        if x.dtype == torch.bfloat16:
            return x.view(torch.int16)
    return x


def _numba_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a device array that holds ``dtype`` values (bfloat16: its bits as int16)."""
    return np.dtype(np.int16) if np.dtype(dtype).name == "bfloat16" else np.dtype(dtype)


def _reshape(d: Any, shape: tuple[int, ...]) -> Any:
    """A view of a device array with another shape; a ValueError where that needs a copy.

    numba's ``DeviceNDArray.reshape`` gives an F-contiguous array C-order strides, so
    (2, 3, M, K) in Fortran order reshaped to (6, M, K) reads the wrong elements (NumPy,
    and so the simulator, copies instead). A non-C-contiguous array is therefore reshaped
    here with NumPy's no-copy rule, or refused, the same way on the GPU and under the
    simulator.
    """
    if tuple(d.shape) != tuple(shape) and not d.is_c_contiguous():
        strides = _nocopy_strides(tuple(d.shape), tuple(d.strides), d.dtype, tuple(shape))
        if strides is None:
            raise _no_view(tuple(d.shape), tuple(shape))
        return strided_view(d, tuple(shape), strides)
    r = d.reshape(shape)
    if simulator.enabled() and not getattr(r, "__cuda_ndarray__", False):
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(r)
    return r


def _no_view(shape: tuple[int, ...], new: tuple[int, ...]) -> InvalidValueError:
    return InvalidValueError(
        f"a non-contiguous device array of shape {shape} cannot be viewed as {new} without a "
        "copy; pass a C-contiguous array (or a CuPy/PyTorch array, whose library copies on "
        "the device)")


def _nocopy_strides(shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype,
                    new: tuple[int, ...]) -> tuple[int, ...] | None:
    """Byte strides for viewing an array of ``shape`` and byte ``strides`` as ``new``
    without a copy (NumPy's rule), or None."""
    # A probe with that layout over one element; only its metadata is used, never its data.
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=dtype), shape, strides)
    try:
        return tuple(np.reshape(probe, new, copy=False).strides)
    except ValueError:
        return None
    except TypeError:  # NumPy < 2.1 has no copy=: an in-place shape change never copies
        view = probe.view()
        try:
            view.shape = new
        except AttributeError:
            return None
        return tuple(view.strides)


def _source_library(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def _check_device_operand(op: Operand, prob: GemmProblem, which: str) -> None:
    """What a device operand ``which`` ("a", "b") of ``prob`` cannot be, refused before
    anything runs (``check_problem``, so ``plan`` refuses it too): numba device arrays have
    no device-side cast, transpose of a batch or partial broadcast; bfloat16 is taken on
    the device as PyTorch tensors only."""
    if op.kind != "cuda":
        return
    lib = _source_library(op.obj)
    if prob.dtype.name == "bfloat16" and lib != "torch":
        # Only PyTorch has bfloat16 device tensors whose bits this backend can view;
        # numba's simulator accepted ml_dtypes arrays and its kernel read the values as
        # 16-bit integers, returning zeros.
        raise InvalidTypeError(
            f"matmul: device operand {which} holds bfloat16 in a {lib} array; bfloat16 "
            "on the device is taken as torch.bfloat16 tensors (or pass NumPy arrays of "
            "ml_dtypes.bfloat16 from the host)")
    if lib in ("cupy", "torch"):
        return  # the array's own library converts, transposes and broadcasts on the device
    if op.dtype != prob.dtype:
        swapped = op.dtype.newbyteorder("=") == prob.dtype  # same type, other byte order
        raise InvalidTypeError(
            f"matmul: numba device operand {which} has dtype "
            + (f"{op.dtype.str} (big-endian {op.dtype.name})" if swapped else op.dtype.name)
            + f" but the product is computed in {prob.dtype.name}, and numba arrays have no "
            "device-side cast; cast it first (CuPy and PyTorch arrays are converted)")
    if (prob.trans_a if which == "a" else prob.trans_b) and len(op.shape) > 2:
        raise InvalidValueError(
            "gemm: trans_a/trans_b on batched numba device arrays is not "
            "supported; pass a CuPy or PyTorch array or transpose first")
    if (len(op.shape) > 2 and op.strides is not None
            and prob.batch_mode(which) == "full"):  # viewed as (batch, rows, cols)
        new = (prob.batch, *op.shape[-2:])
        if _nocopy_strides(tuple(op.shape), tuple(op.strides), op.dtype, new) is None:
            raise _no_view(tuple(op.shape), new)  # (run's view would say so: plan too)
    if prob.batch_mode(which) == "broadcast":
        raise InvalidValueError(
            "matmul: partially broadcast batch dimensions on numba device arrays are not "
            "supported; pass CuPy/PyTorch arrays or give both operands full batch shapes")


def _library_result(like: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A fresh (uninitialised) result of ``shape`` and ``dtype`` from the allocator of
    ``like``'s library, on the device ``like`` is on: CuPy's memory pool or PyTorch's
    caching allocator; None for any other array (numba then allocates).

    Such memory is handed out in a few microseconds, ordered on the library's current
    stream (where the call runs when no ``stream=`` is given), and given back to the pool
    when the caller drops the result. Memory from numba (``cuda.device_array``) is a
    ``cuMemAlloc`` per call, and numba frees it in batches of ten with ``cuMemFree``, which
    waits for the whole device: a caller's loop of products on CuPy arrays would stall the
    host every tenth result dropped."""
    lib = _source_library(like)
    if lib == "cupy":
        import cupy

        with like.device:
            return cupy.empty(shape, dtype=dtype)
    if lib == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name),
                           device=like.device)
    return None


def _wrap_like(result: Any, like: Any, dtype: np.dtype | None = None) -> Any:
    """Return ``result`` (a numba device array) as the array type of ``like``, zero-copy;
    ``dtype`` bfloat16: ``result`` holds bit patterns, returned as torch.bfloat16."""
    lib = _source_library(like)
    if lib == "cupy":
        import cupy

        return cupy.asarray(result)
    if lib == "torch":
        import torch

        t = torch.as_tensor(result, device=like.device)
        if dtype is not None and np.dtype(dtype).name == "bfloat16":
            t = t.view(torch.bfloat16)
        return t
    return result


class CudaBackend(Backend):
    name = "cuda"
    label = "CUDA"
    array_kind = "cuda"
    compile_archs = tuple(COMPILE_ARCHS)
    traceable = True
    kernel_source = "numba"
    accepts_stream = True  # matmul/gemm(stream=...) chooses the stream (backends/cuda_stream)
    accepts_device = True  # matmul/gemm(device=i): GPU i of numba's list (``tilegemm info``)

    @cache  # noqa: B019 - one backend object per process
    def status(self) -> BackendStatus:
        if not simulator.enabled() and not _driver_library_present():
            # Importing numba-cuda takes about half a second; kernel="auto" asks every
            # backend on the first call, so a machine without a driver should not pay it.
            return BackendStatus("cuda", False, "no CUDA GPU or driver found (no libcuda)")
        try:
            from numba import cuda
        except Exception as exc:  # pragma: no cover - numba-cuda is a dependency
            return BackendStatus("cuda", False, f"numba-cuda cannot be imported: {exc}")
        if simulator.enabled():
            return BackendStatus("cuda", True, "numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1)",
                                 ("simulator",), simulated=True)
        try:
            if not cuda.is_available():
                return BackendStatus("cuda", False, "no CUDA GPU or driver found")
            devices = tuple(
                f"{d.name.decode() if isinstance(d.name, bytes) else d.name} "
                f"(sm_{d.compute_capability[0]}{d.compute_capability[1]})"
                for d in cuda.gpus
            )
        except Exception as exc:
            return BackendStatus("cuda", False, f"CUDA driver error: {exc}")
        return BackendStatus("cuda", True, "numba-cuda", devices, accelerated=True)

    @cache  # noqa: B019 - one backend object per process
    def _target(self, index: int | None) -> Target:
        vendors = ("cupy", "torch")
        if simulator.enabled():
            return Target(self.name, "simulator", "simulator", "", CUDA_LIMITS,
                          timer="CUDA events", simulated=True)
        from numba import cuda

        dev = cuda.gpus[0 if index is None else index]  # attributes proxy to the device
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        major, minor = dev.compute_capability
        limits = Limits(
            threads_per_block=int(dev.MAX_THREADS_PER_BLOCK),
            block_dims=(int(dev.MAX_BLOCK_DIM_X), int(dev.MAX_BLOCK_DIM_Y),
                        int(dev.MAX_BLOCK_DIM_Z)),
            shared_per_block=MAX_STATIC_SMEM,  # what a kernel may declare statically
            # rungs with dynamic shared memory (KernelSpec.dynamic_smem) opt in up to this
            shared_optin_per_block=int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            registers_per_block=int(dev.MAX_REGISTERS_PER_BLOCK),
            registers_per_thread=CUDA_LIMITS.registers_per_thread,
        )
        return Target(self.name, name, "gpu", f"sm_{major}{minor}", limits,
                      timer="CUDA events", index=index, accelerated=True, vendors=vendors,
                      capability=(int(major), int(minor)),
                      compute_units=_sm_count(dev), handle=dev)

    def cubin(self, spec: KernelSpec, params: dict[str, int], dtype: str, arch: str) -> bytes:
        from tilegemm.analysis.resources import ptx_for
        from tilegemm.analysis.sass import link_cubin

        return link_cubin(ptx_for(spec, params, dtype, arch), arch)

    def resource_report(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                        arch: str) -> Any:
        """ptxas's report for the rung's PTX linked by nvJitLink for ``arch``; no GPU needed."""
        from tilegemm.analysis.resources import cuda_resources

        return cuda_resources(spec, dict(params), np.dtype(dtype).name, arch)

    def device_details(self, target: Target) -> dict[str, Any]:
        """Name, compute capability, driver and runtime versions, L2 size, SM count."""
        if target.simulated:
            return {}
        return _cuda_details()

    def check_limits(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                     target: Target | None = None) -> None:
        target = target or self.target()
        have = target.capability
        only = spec.only_cc  # architecture-specific instructions (wgmma: sm_90a)
        if only and have and tuple(have[:2]) != tuple(only):
            others = [s.name for s in specs_for(self.name) if s.precisions
                      and not s.only_cc and (not s.min_cc or have >= tuple(s.min_cc))]
            raise UnavailableError(
                f"{spec.name}: uses sm_{only[0]}{only[1]}a instructions that only GPUs of "
                f"compute capability {only[0]}.{only[1]} (H100, H200, GH200) have; this GPU "
                f"is sm_{have[0]}{have[1]}. Tensor-core kernels that run here: "
                f"{', '.join(others) or 'none'}")
        if target.simulated and only:
            # the simulator stands for any GPU, so a rung for one architecture (wgmma:
            # sm_90a) is held to that architecture's opt-in shared memory, not sm_80's
            from dataclasses import replace

            from tilegemm.analysis.occupancy import ARCH_LIMITS

            arch = ARCH_LIMITS.get(f"sm_{only[0]}{only[1]}")
            if arch is not None:
                target = replace(target, limits=replace(
                    target.limits, shared_optin_per_block=arch.smem_per_block))
        need = spec.min_cc  # e.g. tensor-core rungs: (8, 0)
        if need and have and have < tuple(need):
            raise UnavailableError(
                f"{spec.name}: needs a GPU of compute capability {need[0]}.{need[1]} "
                f"(sm_{need[0]}{need[1]}) or newer for its tensor-core instructions; this "
                f"GPU is sm_{have[0]}{have[1]}. Float32 operands: precision='ieee' (the "
                "FFMA rungs); float16/bfloat16 operands: kernel='auto', which computes them "
                "in float32 here and rounds back once")
        check_block_limits(spec, params, dtype, target)

    def _device_operand(self, op: Operand, prob: GemmProblem, which: str,
                        stream: Any = None) -> Any:
        """A device operand as a (batch or 1, rows, cols) numba device array, no host trip,
        for work on ``stream``."""

        _check_device_operand(op, prob, which)
        x = op.obj
        lib = _source_library(x)
        squeeze = prob.squeeze_m if which == "a" else prob.squeeze_n
        trans = prob.trans_a if which == "a" else prob.trans_b
        rows, cols = (prob.m, prob.k) if which == "a" else (prob.k, prob.n)
        mode = prob.batch_mode(which)
        if op.dtype != prob.dtype:
            # Mixed dtypes are converted once, on the device, by the array's own library.
            if lib == "cupy":
                x = x.astype(prob.dtype)
            else:
                import torch

                x = x.to(getattr(torch, prob.dtype.name))
        if lib in ("cupy", "torch"):
            # The array's own library reshapes/broadcasts on the device.
            if squeeze:
                x = x[None, :] if which == "a" else x[:, None]
            if trans:
                x = x.swapaxes(-1, -2) if lib == "cupy" else x.transpose(-1, -2)
            if mode == "single":
                x = x.reshape(1, rows, cols)
            elif mode == "full":
                x = x.reshape(prob.batch, rows, cols)
            else:
                shape = prob.batch_shape + (rows, cols)
                if lib == "torch":
                    x = x.broadcast_to(shape)
                else:
                    import cupy

                    x = cupy.broadcast_to(x, shape)
                x = x.reshape(prob.batch, rows, cols)  # materialises the partial broadcast
            return _as_device(_bits(x), stream)
        d = _as_device(x, stream)
        if squeeze:
            d = _reshape(d, (1, cols) if which == "a" else (rows, 1))
        if trans:
            # A strided view: numba's DeviceNDArray.T is a copy made by a transpose kernel
            # that numba defines, and so compiles, afresh on every call.
            d = strided_view(d, d.shape[::-1], d.strides[::-1])
        if d.ndim == 2:
            return _reshape(d, (1, rows, cols)) if d.is_c_contiguous() else _as3d_strided(d)
        n = 1 if mode == "single" else prob.batch
        return _reshape(d, (n, rows, cols))

    def check_problem(self, operands: Sequence[Operand], prob: GemmProblem, target: Target,
                      out: Any = None) -> None:
        for op, which in zip(operands[:2], "ab"):
            _check_device_operand(op, prob, which)
        total = _gpu_memory(target)
        if total is None:
            return
        copies, result = _gpu_bytes(operands, prob, out)
        if copies + result > total:
            raise InvalidValueError(
                f"this product needs {size_text(copies + result)} of GPU memory (the result "
                f"{size_text(result)}, operands copied to the GPU or converted there "
                f"{size_text(copies)}), more than {target.name} has ({size_text(total)}); "
                "split it into smaller products")

    def target_for(self, operands: Sequence[Operand], device: int | None = None) -> Target:
        """Device arrays run where they live (the current CUDA device); ``device=`` picks
        the GPU for host operands only, so the two together are refused."""
        if device is not None and any(op.kind == self.array_kind for op in operands):
            self.target(device)  # an unknown index still gets the listing first
            raise InvalidValueError(
                f"device={device} with CUDA device arrays: they run on the device they live "
                "on; drop device= (or move the arrays there)")
        return self.target(device)

    def _on(self, target: Target | None) -> contextlib.AbstractContextManager[Any]:
        """``target``'s GPU made current for the block (the default device: left as is)."""
        if target is None or target.index is None or target.simulated:
            return contextlib.nullcontext()
        from numba import cuda

        return cuda.gpus[target.index]

    def _bound(self, target: Target | None, f: Callable[..., Any]) -> Callable[..., Any]:
        """``f`` run with ``target``'s GPU current (prepared closures run later)."""
        def on_target(*args: Any) -> Any:
            with self._on(target):
                return f(*args)
        return on_target

    def run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
        target: Target | None = None, stream: Any = None,
    ) -> Any:
        with self._on(target):
            return self._run(spec, params, prob, a, b, c, out, alpha, beta, stream)

    def _run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
        stream: Any,
    ) -> Any:
        from numba import cuda

        alpha, beta = resolve_scalars(prob, alpha, beta)  # float32 for 16-bit operands
        cdt = prob.store_dtype  # what the kernel writes: the result, or float32 on request
        ndt = _numba_dtype(cdt)
        # A device c (read when beta != 0) also keeps the result on the device: api.check_out
        # then demands a device out, which must not be treated as a host array below.
        device_ops = [op for op in (a, b, c) if op is not None and op.kind == "cuda"]
        on_device = bool(device_ops)
        shape3 = (prob.batch, prob.m, prob.n)
        # Every copy and the launch go on the caller's stream (see backends/cuda_stream).
        device_arrays = [op.obj for op in device_ops]
        if out is not None and on_device:
            device_arrays.append(out)
        s = numba_stream(choose_stream(stream, device_arrays))

        # Operands and a device c first: their checks (a layout that needs a copy, a wrong
        # c) must raise before out is written (poisoned or loaded with c).
        staged = None  # A, B and the result's buffers when all are on the host (reused)
        if not prob.empty and not on_device:
            ha, hb = (_bits(host_operand_3d(op.obj, prob, w)) for op, w in ((a, "a"), (b, "b")))
            staging_key, staged = cuda_staging.take(
                ((ha.shape, ha.dtype), (hb.shape, hb.dtype), (shape3, ndt)), s)
            a3, b3, c3 = staged
            cuda_staging.copy_in(a3, ha, s)
            cuda_staging.copy_in(b3, hb, s)
        elif not prob.empty:
            a3, b3 = (
                self._device_operand(op, prob, w, s) if op.kind == "cuda"
                else cuda.to_device(_bits(host_operand_3d(op.obj, prob, w)), stream=s)
                for op, w in ((a, "a"), (b, "b"))
            )
        dc = self._device_c(c, prob, s) if beta != 0 and c.kind == "cuda" else None

        # Destination on the device: out itself when it is a device array.
        mine = None  # a result made by the operands' own library (see _library_result)
        if out is not None and on_device:
            dout = _as_device(_bits(out), s)
            if not dout.is_c_contiguous():
                raise InvalidValueError("out: a device out array must be C-contiguous")
            dest3 = _reshape(dout, shape3)
            # out=a: kernels read A while writing C, so an out overlapping a device operand
            # gets a fresh buffer, copied into out after the launch.
            alias = any(op.kind == "cuda"
                        and _may_overlap(dout, _as_device(_bits(op.obj), wait=False))
                        for op in (a, b))
            c3 = cuda.device_array(shape3, dtype=ndt, stream=s) if alias else dest3
        else:
            alias = False
            # a result for CuPy or PyTorch operands comes from their library's allocator
            # when the call runs on that library's current stream (see _library_result)
            if on_device and out is None and stream is None and not prob.empty:
                mine = _library_result(device_ops[0].obj, shape3, cdt)
            if mine is not None:
                c3 = _as_device(_bits(mine), s)
            elif staged is None:
                c3 = cuda.device_array(shape3, dtype=ndt, stream=s)
        in_place = dc is not None and _same_memory(c3, dc)  # out is c: C0 is there already
        if dc is not None and not in_place and not alias and _may_overlap(c3, dc):
            # out overlaps c in part: a copy between overlapping ranges is undefined in
            # CUDA, so the product goes to a fresh buffer, copied into out after
            alias = True
            c3 = cuda.device_array(shape3, dtype=ndt, stream=s)
        if dc is not None:
            if not in_place and c3.size:
                c3.copy_to_device(dc, stream=s)
        elif beta != 0 and c3.size:
            # a dense copy: broadcasting gives a size-1 axis a zero stride, which NumPy
            # still calls C-contiguous (so ascontiguousarray keeps it) and the simulator's
            # copy refused
            host_c = np.empty(shape3, dtype=cdt)
            np.copyto(host_c.reshape(prob.out_shape),
                      np.asarray(rounded_to_result(c.obj, prob), dtype=cdt))
            c3.copy_to_device(_bits(host_c), stream=s)
        elif poison_enabled() and c3.size:
            c3.copy_to_device(_bits(np.full(shape3, poison_value(cdt), dtype=cdt)), stream=s)

        if not prob.empty:
            program = spec.program(params, prob.dtype)
            program.launch(a3, b3, c3, alpha, beta, stream=s)

        if on_device:
            # No wait: the caller's next work on the same stream runs after ours.
            if out is not None:
                if alias and c3.size:
                    dest3.copy_to_device(c3, stream=s)
                return out
            if mine is not None:
                return mine.reshape(prob.out_shape)
            result = _reshape(c3, prob.out_shape) if prob.out_shape != shape3 else c3
            like = device_ops[0].obj
            return _wrap_like(result, like, cdt)
        host = out if out is not None else np.empty(prob.out_shape, dtype=cdt)
        if host.size:
            host3 = _bits(host).reshape(shape3)
            if staged is not None:
                cuda_staging.copy_out(host3, c3, s)
            else:
                c3.copy_to_host(host3, stream=s)
            s.synchronize()  # a host result is complete when the call returns
        if staged is not None:  # the device is done with them: the next call may reuse them
            cuda_staging.put_back(staging_key, staged)
        return host

    def device_program(self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
                       target: Target, ops: Sequence[Operand]) -> Callable[..., Any] | None:
        """CuPy and PyTorch operands of plain cases: launched on views of their memory,
        without numba's array objects (see ``backends/cuda_direct``)."""
        if target.simulated or target.index is not None:
            return None
        from tilegemm.backends.cuda_direct import device_program

        alpha, beta = resolve_scalars(prob, 1.0, 0.0)
        return device_program(spec.program(params, prob.dtype), prob, (ops[0], ops[1]),
                              alpha, beta)

    def _device_c(self, c: Operand, prob: GemmProblem, stream: Any = None) -> Any:
        """A device C0 for beta != 0: must already have the result's shape and dtype."""

        if c.dtype != prob.store_dtype or c.shape != prob.out_shape:
            raise InvalidValueError(
                f"gemm: a device c must have the result's shape {prob.out_shape} and dtype "
                f"{prob.store_dtype.name}; got {c.shape} {c.dtype.name}"
            )
        d = _as_device(_bits(c.obj), stream)
        if not d.is_c_contiguous():
            raise InvalidValueError("gemm: a device c must be C-contiguous")
        return _reshape(d, (prob.batch, prob.m, prob.n))

    def synchronize(self) -> None:
        from numba import cuda

        cuda.synchronize()

    def prepare(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a3: np.ndarray, b3: np.ndarray, target: Target | None = None,
    ) -> Prepared:
        """Operands uploaded once; each launch bracketed by a pair of CUDA events.

        The output is NaN-poisoned once here (under TILEGEMM_POISON) so the first launch
        is verifiable. Under the simulator events record no time, so ``elapsed`` falls back
        to the host clock (numbers then mean nothing; only correctness does).
        """
        with self._on(target):
            prepared = self._prepare(spec, params, prob, a3, b3)
        return Prepared(launch=self._bound(target, prepared.launch),
                        fetch=self._bound(target, prepared.fetch),
                        elapsed=self._bound(target, prepared.elapsed))

    def _prepare(self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
                 a3: np.ndarray, b3: np.ndarray) -> Prepared:
        from numba import cuda

        program = spec.program(params, prob.dtype)
        da, db = cuda.to_device(_bits(a3)), cuda.to_device(_bits(b3))
        shape3 = (prob.batch, prob.m, prob.n)
        cdt = prob.store_dtype
        dc = cuda.device_array(shape3, dtype=_numba_dtype(cdt))
        if poison_enabled() and dc.size:
            dc.copy_to_device(_bits(np.full(shape3, poison_value(cdt), dtype=cdt)))
        if prob.dtype.name == "bfloat16" or prob.c_dtype is not None:
            alpha, beta = np.float32(1), np.float32(0)
        else:
            alpha, beta = prob.dtype.type(1), prob.dtype.type(0)

        def launch() -> None:
            if not prob.empty:
                program.launch(da, db, dc, alpha, beta)

        def elapsed(n: int) -> list[float]:
            if simulator.enabled():
                return wall_clock_elapsed(launch, n)
            events = [(cuda.event(), cuda.event()) for _ in range(n)]
            for start, end in events:
                start.record()
                launch()
                end.record()
            events[-1][1].synchronize()
            return [cuda.event_elapsed_time(s, e) / 1e3 for s, e in events]

        def fetch() -> np.ndarray:
            return dc.copy_to_host().view(cdt)  # bfloat16: its bits, viewed back

        return Prepared(launch=launch, fetch=fetch, elapsed=elapsed)

    def cache_flusher(self, target: Target | None = None) -> Any:
        """Evict L2 between timed launches: a device-to-device copy of twice its size."""
        if simulator.enabled():
            return None
        from numba import cuda

        l2 = int(cuda.get_current_device().L2_CACHE_SIZE) or 64 * 1024 * 1024
        src = cuda.device_array(2 * l2, dtype=np.uint8)
        dst = cuda.device_array(2 * l2, dtype=np.uint8)
        return lambda: dst.copy_to_device(src)


def _gpu_memory(target: Target) -> int | None:
    """The GPU's total memory in bytes; None on the simulator or when it cannot be read.

    Total, not free: numba frees released arrays lazily and retries an allocation that
    fails after freeing them, so the free figure of the moment would refuse products that
    run.
    """
    if target.simulated or target.handle is None:
        return None
    return _total_memory(target.index or 0)


@cache
def _total_memory(index: int) -> int | None:
    """GPU ``index``'s memory, read once per process (a call should not pay a driver query)."""
    try:
        from numba import cuda

        with cuda.gpus[index]:
            return int(cuda.current_context().get_memory_info()[1])
    except Exception:
        return None


def _gpu_bytes(operands: Sequence[Operand], prob: GemmProblem, out: Any) -> tuple[int, int]:
    """Bytes a call allocates on the GPU: (operand copies, result).

    Host operands are copied whole (a broadcast batch materialised); CuPy and PyTorch
    arrays of another dtype are converted, and partially broadcast ones materialised, by
    their own library; numba arrays are read in place. The result needs a buffer unless
    ``out`` is a device array (a temporary is taken only when out overlaps an operand).
    """
    copies = 0
    # an empty product reads, and so copies, neither operand (see _run)
    for op, which in zip(() if prob.empty else operands[:2], "ab"):
        whole = prob.operand_elements(which) * prob.dtype.itemsize
        if op.kind != "cuda":
            copies += whole
        elif _source_library(op.obj) in ("cupy", "torch"):
            if op.dtype != prob.dtype:
                copies += math.prod(op.shape) * prob.dtype.itemsize
            if prob.batch_mode(which) == "broadcast":
                copies += whole
    in_place = out is not None and array_kind(out) == "cuda"
    result = 0 if in_place else prob.batch * prob.m * prob.n * prob.store_dtype.itemsize
    return copies, result


def _sm_count(dev: Any) -> int:
    """The device's SM count, 0 when it cannot be read (then nothing depends on it)."""
    try:
        return int(dev.MULTIPROCESSOR_COUNT)
    except Exception:
        return 0


def _cuda_details() -> dict[str, Any]:
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    details: dict[str, Any] = {"device": name,
                               "compute_capability": "{}.{}".format(*dev.compute_capability)}
    try:
        major, minor = cuda.cudadrv.driver.driver.get_version()
        details["driver_cuda_version"] = f"{major}.{minor}"
    except Exception:
        pass
    try:
        major, minor = cuda.runtime.get_version()
        details["runtime_cuda_version"] = f"{major}.{minor}"
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            details["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        details["l2_bytes"] = int(dev.L2_CACHE_SIZE)
        details["sm_count"] = int(dev.MULTIPROCESSOR_COUNT)
    except Exception:
        pass
    return details


def _may_overlap(x: Any, y: Any) -> bool:
    """Whether two numba device arrays may share memory (by address range; conservative)."""
    if simulator.enabled():
        return bool(np.may_share_memory(np.asarray(x._ary), np.asarray(y._ary)))
    return _span(x)[0] < _span(y)[1] and _span(y)[0] < _span(x)[1]


def _same_memory(x: Any, y: Any) -> bool:
    """Whether two C-contiguous numba device arrays of one shape and dtype are the same
    elements."""
    if simulator.enabled():
        ax, ay = np.asarray(x._ary), np.asarray(y._ary)
        return (ax.__array_interface__["data"][0] == ay.__array_interface__["data"][0]
                and ax.nbytes == ay.nbytes)
    return _span(x) == _span(y)


def _span(d: Any) -> tuple[int, int]:
    """The half-open byte range ``[lo, hi)`` a device array's elements occupy."""
    if d.size == 0:
        return (0, 0)
    ptr = int(d.device_ctypes_pointer.value or 0)
    lo = ptr + sum(min(0, (n - 1) * s) for n, s in zip(d.shape, d.strides))
    hi = ptr + sum(max(0, (n - 1) * s) for n, s in zip(d.shape, d.strides)) + d.dtype.itemsize
    return lo, hi


def _as3d_strided(d: Any) -> Any:
    """A strided 2-D device array viewed as (1, rows, cols) without a copy."""
    return strided_view(d, (1,) + tuple(d.shape), (0,) + tuple(d.strides))


BACKEND = CudaBackend()
