"""Theoretical occupancy: how many blocks of a kernel fit on one SM, and what limits it.

The optimisation note explains why its register kernel slows down beyond 8 outputs per thread by
occupancy: more registers per thread and the same shared memory per block mean fewer
resident warps. This module does that arithmetic the way NVIDIA's occupancy calculator
(``cuda_occupancy.h``, ``cudaOccMaxActiveBlocksPerMultiprocessor``) does, from the
registers and shared memory ptxas reported (:mod:`tilegemm.analysis.resources`):

- warps: ``max warps per SM // warps per block``;
- blocks: the per-SM block limit;
- registers: registers are given to warps in units of 256 (``regs × 32`` rounded up to
  256), from 4 sub-partitions of ``65536 / 4`` registers each, so
  ``4 × (16384 // regs_per_warp) // warps per block``; a block whose registers, with its
  warps rounded up to a multiple of 4, exceed 65,536 cannot launch at all;
- shared memory: each block takes its static shared memory plus 1 KiB the driver reserves
  per block (sm_80 and later), rounded up to 128 bytes, out of the SM's shared memory
  (assumed configured at its maximum carveout: 164 KiB on sm_80, 228 KiB on sm_90).

Figures per architecture are from the CUDA C++ Programming Guide, "Compute Capabilities",
table "Technical Specifications per Compute Capability" (CUDA 12), and ``cuda_occupancy.h``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

WARP = 32


@dataclass(frozen=True)
class SMLimits:
    arch: str
    max_threads: int = 2048
    max_blocks: int = 32
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    reg_unit: int = 256            # registers allocated per warp in multiples of this
    sub_partitions: int = 4
    smem_per_sm: int = 167936      # bytes, maximum carveout
    smem_per_block: int = 166912   # bytes a block may opt in to
    smem_reserved: int = 1024      # bytes the driver reserves per block (sm_80+)
    smem_unit: int = 128

    @property
    def max_warps(self) -> int:
        return self.max_threads // WARP


ARCH_LIMITS: dict[str, SMLimits] = {
    "sm_80": SMLimits("sm_80"),  # A100: 164 KiB shared per SM, 163 KiB per block
    "sm_90": SMLimits("sm_90", smem_per_sm=233472, smem_per_block=232448),  # H100: 228/227 KiB
}


@dataclass(frozen=True)
class Occupancy:
    arch: str
    threads_per_block: int
    registers: int
    smem_per_block: int       # static shared memory of the kernel (bytes)
    by_warps: int             # blocks per SM each resource allows
    by_blocks: int
    by_registers: int
    by_smem: int
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float          # active warps / max warps
    limited_by: tuple[str, ...]
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["limited_by"] = list(self.limited_by)
        return d


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(threads_per_block: int, registers: int, smem_per_block: int,
              arch: str = "sm_90") -> Occupancy:
    """Theoretical occupancy of one kernel launch configuration on ``arch``."""
    if arch not in ARCH_LIMITS:
        raise ValueError(f"no occupancy limits for {arch!r}; known: {', '.join(ARCH_LIMITS)}")
    if threads_per_block < 1 or registers < 0 or smem_per_block < 0:
        raise ValueError("threads per block must be >= 1; registers and shared memory >= 0")
    lim = ARCH_LIMITS[arch]
    warps = -(-threads_per_block // WARP)
    notes = []

    by_warps = lim.max_warps // warps if threads_per_block <= 1024 else 0
    if threads_per_block > 1024:
        notes.append(f"{threads_per_block} threads per block exceeds 1024")
    by_blocks = lim.max_blocks

    regs_per_warp = _round_up(max(registers, 1) * WARP, lim.reg_unit)
    assumed = regs_per_warp * _round_up(warps, lim.sub_partitions)
    if registers > lim.max_regs_per_thread or assumed > lim.regs_per_block:
        by_regs = 0
        notes.append(f"cannot launch: {registers} registers × {threads_per_block} threads "
                     f"needs {assumed} registers per block (warps rounded up to a multiple of "
                     f"{lim.sub_partitions}), more than {lim.regs_per_block}")
    else:
        per_sub = (lim.regs_per_sm // lim.sub_partitions) // regs_per_warp
        by_regs = (per_sub * lim.sub_partitions) // warps

    smem_alloc = _round_up(smem_per_block + lim.smem_reserved, lim.smem_unit)
    if smem_per_block > lim.smem_per_block:
        by_smem = 0
        notes.append(f"cannot launch: {smem_per_block} bytes of shared memory per block "
                     f"exceeds {lim.smem_per_block}")
    else:
        by_smem = lim.smem_per_sm // smem_alloc

    limits = {"warps": by_warps, "blocks": by_blocks, "registers": by_regs,
              "shared memory": by_smem}
    blocks = min(limits.values())
    limited_by = tuple(k for k, v in limits.items() if v == blocks)
    active = blocks * warps
    return Occupancy(arch=arch, threads_per_block=threads_per_block, registers=registers,
                     smem_per_block=smem_per_block, by_warps=by_warps, by_blocks=by_blocks,
                     by_registers=by_regs, by_smem=by_smem, blocks_per_sm=blocks,
                     warps_per_sm=active, occupancy=active / lim.max_warps,
                     limited_by=limited_by, note="; ".join(notes))
