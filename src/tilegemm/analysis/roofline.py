"""Roofline bounds: the fastest a kernel could run given its FLOPs and bytes moved.

A kernel that does ``F`` floating-point operations and moves ``Q`` bytes from memory can
run no faster than ``min(peak FLOP/s, F/Q × bandwidth)``. Two byte counts bracket reality:

- *traced*: every 32-byte sector the warps request (what the tracer counts), as if no
  cache ever served a second request for the same sector — the pessimistic bound and
  the one the optimisation note's transaction counts imply;
- *compulsory*: each input read once and the output written once — the bound with a
  perfect cache.

Peak figures (dense, non-tensor-core; from NVIDIA's datasheets):

- H100 SXM5: 67 TFLOP/s FP32, 34 TFLOP/s FP64, 3.35 TB/s HBM3 — "NVIDIA H100 Tensor Core
  GPU" datasheet (nvidia.com/en-us/data-center/h100/), SXM column.
- H100 PCIe: 51 / 26 TFLOP/s, 2.0 TB/s — same datasheet, PCIe column.
- H200 SXM: 67 / 34 TFLOP/s, 4.8 TB/s HBM3e — "NVIDIA H200 Tensor Core GPU" datasheet
  (nvidia.com/en-us/data-center/h200/).
- A100 SXM4 80GB: 19.5 / 9.7 TFLOP/s, 2.039 TB/s; A100 40GB: 1.555 TB/s — "NVIDIA A100
  Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/a100/).

Tensor-core rungs (``mma``, ``wgmma``) are bounded by the tensor-core peak, dense, from
the same datasheets: TF32 494.7 TFLOP/s and FP16/BF16 989.4 on the H100 SXM5 and the H200,
378 and 756.5 on the H100 PCIe, 156 and 312 on the A100. 3xTF32 issues three TF32 mma for
each product term, so its roof in useful FLOP/s is a third of TF32's.

Integer dtypes have no peak here; their bound is the memory roof only, in operations
(OP/s) rather than FLOP/s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tilegemm.errors import InvalidValueError


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    arch: str
    sms: int
    fp32_tflops: float
    fp64_tflops: float
    bandwidth_tbs: float
    tf32_tflops: float = 0.0  # dense tensor-core peaks
    fp16_tflops: float = 0.0

    def peak_flops(self, dtype: str, tensor_passes: int = 0) -> float | None:
        """Peak FLOP/s for ``dtype`` (None for integers: no FLOP roof).

        ``tensor_passes`` > 0: computed on tensor cores with that many mma per product
        term (float32: 1 for TF32, 3 for 3xTF32; 16-bit dtypes: 1), so the useful peak is
        the tensor-core peak divided by it.
        """
        if tensor_passes:
            peak = {"float32": self.tf32_tflops, "float16": self.fp16_tflops,
                    "bfloat16": self.fp16_tflops}.get(dtype)
            return peak * 1e12 / tensor_passes if peak else None
        if dtype == "float32":
            return self.fp32_tflops * 1e12
        if dtype == "float64":
            return self.fp64_tflops * 1e12
        return None

    def peak_label(self, dtype: str, tensor_passes: int = 0) -> str:
        """What bounds compute, for a roofline's title: 'TF32 tensor cores 494.7 TFLOP/s'."""
        if tensor_passes:
            if dtype == "float32":
                label = f"TF32 tensor cores {self.tf32_tflops} TFLOP/s"
                return label + (f", ÷{tensor_passes} for {tensor_passes}xTF32"
                                if tensor_passes > 1 else "")
            return f"FP16/BF16 tensor cores {self.fp16_tflops} TFLOP/s"
        if dtype in ("float32", "float64"):
            return f"{self.fp32_tflops} TFLOP/s FP32, {self.fp64_tflops} FP64"
        return f"no {dtype} peak listed: the memory roof only"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


GPUS: dict[str, GPU] = {g.key: g for g in (
    GPU("h100", "NVIDIA H100 SXM5 80GB", "sm_90", 132, 67.0, 34.0, 3.35, 494.7, 989.4),
    GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", "sm_90", 114, 51.0, 26.0, 2.0, 378.0, 756.5),
    GPU("h200", "NVIDIA H200 SXM 141GB", "sm_90", 132, 67.0, 34.0, 4.8, 494.7, 989.4),
    GPU("a100", "NVIDIA A100 SXM4 80GB", "sm_80", 108, 19.5, 9.7, 2.039, 156.0, 312.0),
    GPU("a100-40gb", "NVIDIA A100 SXM4 40GB", "sm_80", 108, 19.5, 9.7, 1.555, 156.0, 312.0),
)}


def get_gpu(key: str) -> GPU:
    try:
        return GPUS[key.lower()]
    except KeyError:
        raise InvalidValueError(f"unknown GPU {key!r}; known: {', '.join(GPUS)}") from None


@dataclass(frozen=True)
class Bound:
    bytes: float
    intensity: float | None          # FLOP per byte
    flops_per_s: float | None        # the bound
    limited_by: str                  # 'memory' or 'compute'


def bound(gpu: GPU, dtype: str, flops: float, nbytes: float,
          tensor_passes: int = 0) -> Bound:
    """``min(peak, intensity × bandwidth)`` for one byte count (``tensor_passes``: see
    :meth:`GPU.peak_flops`)."""
    bw = gpu.bandwidth_tbs * 1e12
    intensity = flops / nbytes if nbytes > 0 else None
    mem = intensity * bw if intensity is not None else None
    peak = gpu.peak_flops(dtype, tensor_passes)
    if mem is None:
        return Bound(nbytes, None, peak, "compute")
    if peak is None or mem < peak:
        return Bound(nbytes, intensity, mem, "memory")
    return Bound(nbytes, intensity, peak, "compute")
