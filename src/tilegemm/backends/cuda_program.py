"""What a CUDA rung's ``build`` returns: the jitted kernel and how to launch it.

Kept free of numba imports so rung modules can import it at top level. Every CUDA rung has
the same kernel signature ``kernel(A, B, C, alpha, beta)`` with ``A`` (batch or 1, M, K),
``B`` (batch or 1, K, N), ``C`` (batch, M, N); one signature is what lets the backend,
the resource report and the analysis treat all rungs alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CudaProgram:
    kernel: Any  # numba.cuda Dispatcher
    block: tuple[int, int, int]
    grid: Callable[[int, int, int], tuple[int, int, int]]  # (batch, M, N) -> blocks
    # numba types of (operands and C, alpha and beta) for ahead-of-time PTX, where they
    # are not the dtype's own: bfloat16 arrays are passed as their bit patterns (int16)
    # (numba has no bfloat16 array type) with float32 scalars.
    arg_types: tuple[str, str] | None = None

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any, stream: Any = 0) -> None:
        batch, m, n = C.shape
        self.kernel[self.grid(batch, m, n), self.block, stream](A, B, C, alpha, beta)

    def signature(self, dtype: str) -> str:
        """The C-contiguous signature used for ahead-of-time PTX (resource reports)."""
        elem, scalar = self.arg_types or (dtype, dtype)
        arr = f"{elem}[:, :, ::1]"
        return f"void({arr}, {arr}, {arr}, {scalar}, {scalar})"
