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

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilegemm.analysis.resources import Compiled
from tilegemm.analysis.sass import CLASS_TITLES, Instr, hot_loop, listing, parse_sass
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


def macs(ins: Instr) -> int:
    """Multiply-adds one thread's share of an ``HMMA`` does: m16n8k8 (TF32) or m16n8k16
    (16-bit), a 16×8×k product for 32 threads. 0 for anything else, HGMMA included."""
    if ins.op != "HMMA":
        return 0
    shape = re.match(r"\.(\d+)", ins.mods)
    k = {"1688": 8, "16816": 16, "16832": 32}.get(shape.group(1) if shape else "", 0)
    return 16 * 8 * k // 32


def shared_bytes(ins: Instr) -> int:
    """Bytes of shared memory one thread's share of ``ins`` reads or writes: ldmatrix (4
    bytes a thread per 8×8 matrix: ``.4`` → 16), plain shared loads and stores, and
    cp.async copies (written into shared memory)."""
    if ins.op == "LDSM":
        count = re.search(r"\.MT?88(?:\.(\d))?", ins.mods)
        return 4 * int(count.group(1) or 1) if count else 0
    if ins.op in ("LDS", "STS", "LDGSTS"):
        return ins.width
    return 0


@dataclass(frozen=True)
class MmaSass(Compiled):
    instructions: int  # in the whole kernel
    hmma: int  # in the whole kernel
    local_memory: int  # LDL/STL anywhere
    hot: dict[str, int]  # the hot loop's counts by kind, and "total"
    hot_macs: int = 0  # multiply-adds of one thread's HMMA in the hot loop
    hot_shared_bytes: int = 0  # shared memory one thread reads and writes there
    hot_lines: tuple[str, ...] = ()  # the hot loop's SASS, each line with its kind

    @property
    def hmma_share(self) -> float:
        return self.hot["HMMA"] / self.hot["total"] if self.hot["total"] else 0.0

    @property
    def macs_per_shared_byte(self) -> float | None:
        """Tensor-core multiply-adds per byte of shared memory moved in the hot loop (reads
        by ldmatrix and loads, writes by cp.async and stores). An SM's shared memory moves
        128 bytes a clock, so below (multiply-adds an SM's tensor cores do a clock) / 128
        the loop waits on shared memory first. None for wgmma, whose tensor core reads its
        operands from shared memory itself, unseen by these counts."""
        if not self.hot_macs or not self.hot_shared_bytes:
            return None
        return self.hot_macs / self.hot_shared_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "arch": self.arch, "dtype": self.dtype,
                "params": self.params, "instructions": self.instructions, "hmma": self.hmma,
                "local_memory_instructions": self.local_memory, "hot_loop": self.hot,
                "hmma_share": self.hmma_share, "hot_loop_macs_per_thread": self.hot_macs,
                "hot_loop_shared_bytes_per_thread": self.hot_shared_bytes,
                "macs_per_shared_byte": self.macs_per_shared_byte}


def count(text: str, *, kernel: str, arch: str, dtype: str,
          params: dict[str, int]) -> MmaSass:
    """Counts of a disassembled tensor-core kernel (nvdisasm text)."""
    instrs = parse_sass(text)
    hot, _ = hot_loop(instrs, lambda i: i.op in MMA_OPS, kernel, "HMMA")
    body = [i for i in instrs if hot.contains(i.addr)]
    kinds = Counter(kind(i.op) for i in body)
    counts = {k: kinds.get(k, 0) for k in KINDS}
    counts["total"] = sum(kinds.values())
    return MmaSass(kernel=kernel, arch=arch, dtype=dtype, params=params,
                   instructions=len(instrs), hmma=sum(1 for i in instrs if i.op in MMA_OPS),
                   local_memory=sum(1 for i in instrs if i.op in ("LDL", "STL")), hot=counts,
                   hot_macs=sum(map(macs, body)),
                   hot_shared_bytes=sum(map(shared_bytes, body)),
                   hot_lines=tuple(listing(instrs, hot, title)))


def title(ins: Instr) -> str:
    """What one hot-loop instruction is, for the listing: its kind, or for the rest
    (``other``) the class the FFMA accounting gives it (integer/address, moves, ...)."""
    k = kind(ins.op)
    return CLASS_TITLES[ins.cls] if k == "other" else k


def mma_report(spec: KernelSpec, params: dict[str, int] | None = None,
               dtype: str = "float32", arch: str = "sm_90") -> MmaSass:
    """Compile, disassemble and count one tensor-core rung."""
    from tilegemm.analysis.resources import ptx_for
    from tilegemm.analysis.sass import disassemble, link_cubin

    params = spec.resolve(params)
    dt = np.dtype(dtype).name
    text = disassemble(link_cubin(ptx_for(spec, params, dt, arch), arch))
    return count(text, kernel=spec.name, arch=arch, dtype=dt, params=params)
