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

Integer dtypes have no FLOP peak here; their bound is the memory roof only.
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

    def peak_flops(self, dtype: str) -> float | None:
        """Peak FLOP/s for ``dtype`` (None for integers: no FLOP roof)."""
        if dtype == "float32":
            return self.fp32_tflops * 1e12
        if dtype == "float64":
            return self.fp64_tflops * 1e12
        return None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


GPUS: dict[str, GPU] = {g.key: g for g in (
    GPU("h100", "NVIDIA H100 SXM5 80GB", "sm_90", 132, 67.0, 34.0, 3.35),
    GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", "sm_90", 114, 51.0, 26.0, 2.0),
    GPU("h200", "NVIDIA H200 SXM 141GB", "sm_90", 132, 67.0, 34.0, 4.8),
    GPU("a100", "NVIDIA A100 SXM4 80GB", "sm_80", 108, 19.5, 9.7, 2.039),
    GPU("a100-40gb", "NVIDIA A100 SXM4 40GB", "sm_80", 108, 19.5, 9.7, 1.555),
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


def bound(gpu: GPU, dtype: str, flops: float, nbytes: float) -> Bound:
    """``min(peak, intensity × bandwidth)`` for one byte count."""
    bw = gpu.bandwidth_tbs * 1e12
    intensity = flops / nbytes if nbytes > 0 else None
    mem = intensity * bw if intensity is not None else None
    peak = gpu.peak_flops(dtype)
    if mem is None:
        return Bound(nbytes, None, peak, "compute")
    if peak is None or mem < peak:
        return Bound(nbytes, intensity, mem, "memory")
    return Bound(nbytes, intensity, peak, "compute")
