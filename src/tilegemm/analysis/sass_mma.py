"""The machine code of a tensor-core rung, counted: HMMA and what feeds it.

The FFMA accounting of :mod:`tilegemm.analysis.sass` does not apply to a tensor-core rung:
its multiply-adds are HMMA instructions, each a whole 16×8×k fragment product for the warp.
What matters instead is how much else the hot loop issues around them (fragment loads,
TF32 conversions, address arithmetic): this module finds the loop with the most HMMA
(innermost first) and counts its instructions by kind, with the HMMA share of them. The
counts cover the loop body once with all its branches (the 16-byte and the 4-byte copy
paths alike), so they bound from above what the interior path issues.

Rung wgmma's tensor-core instructions are HGMMA (one warpgroup-wide 64×N×k product,
operands read from shared memory): counted in the same column as HMMA, and its
``WARPGROUP.ARRIVE``/``WARPGROUP.DEPBAR`` (``wgmma.fence``/``wait_group``) with the waits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilegemm.analysis.resources import Compiled
from tilegemm.analysis.sass import hot_loop, parse_sass
from tilegemm.registry import KernelSpec

#: Kinds of instruction a tensor-core hot loop is made of, in report order.
KINDS = ("HMMA", "LDSM", "LDS", "LDGSTS", "DEPBAR", "BAR", "other")


MMA_OPS = ("HMMA", "HGMMA")  # mma.sync and wgmma.mma_async


def kind(op: str) -> str:
    if op in MMA_OPS:
        return "HMMA"
    if op in ("LDSM", "LDS", "LDGSTS", "BAR"):
        return op
    if op in ("DEPBAR", "LDGDEPBAR", "WARPGROUP"):
        return "DEPBAR"
    return "other"  # integer/address work, moves, branches, and TF32 rounding (ptxas expands
    # cvt.rna.tf32.f32 into a compare and integer operations)


@dataclass(frozen=True)
class MmaSass(Compiled):
    instructions: int  # in the whole kernel
    hmma: int  # in the whole kernel
    local_memory: int  # LDL/STL anywhere
    hot: dict[str, int]  # the hot loop's counts by kind, and "total"

    @property
    def hmma_share(self) -> float:
        return self.hot["HMMA"] / self.hot["total"] if self.hot["total"] else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "arch": self.arch, "dtype": self.dtype,
                "params": self.params, "instructions": self.instructions, "hmma": self.hmma,
                "local_memory_instructions": self.local_memory, "hot_loop": self.hot,
                "hmma_share": self.hmma_share}


def count(text: str, *, kernel: str, arch: str, dtype: str,
          params: dict[str, int]) -> MmaSass:
    """Counts of a disassembled tensor-core kernel (nvdisasm text)."""
    instrs = parse_sass(text)
    hot, _ = hot_loop(instrs, lambda i: i.op in MMA_OPS, kernel, "HMMA")
    kinds = Counter(kind(i.op) for i in instrs if hot.contains(i.addr))
    counts = {k: kinds.get(k, 0) for k in KINDS}
    counts["total"] = sum(kinds.values())
    return MmaSass(kernel=kernel, arch=arch, dtype=dtype, params=params,
                   instructions=len(instrs), hmma=sum(1 for i in instrs if i.op in MMA_OPS),
                   local_memory=sum(1 for i in instrs if i.op in ("LDL", "STL")), hot=counts)


def mma_report(spec: KernelSpec, params: dict[str, int] | None = None,
               dtype: str = "float32", arch: str = "sm_90") -> MmaSass:
    """Compile, disassemble and count one tensor-core rung."""
    from tilegemm.analysis.resources import ptx_for
    from tilegemm.analysis.sass import disassemble, link_cubin

    params = spec.resolve(params)
    dt = np.dtype(dtype).name
    text = disassemble(link_cubin(ptx_for(spec, params, dt, arch), arch))
    return count(text, kernel=spec.name, arch=arch, dtype=dt, params=params)
