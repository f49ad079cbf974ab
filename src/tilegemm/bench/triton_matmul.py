"""Triton's tutorial matmul: the Python-authored GEMM that tilegemm's rungs are timed beside.

The kernel follows Triton's tutorial "Matrix Multiplication" (03-matrix-multiplication,
https://triton-lang.org/main/getting-started/tutorials/03-matrix-multiplication.html,
source: https://github.com/triton-lang/triton/blob/main/python/tutorials/03-matrix-multiplication.py):
one program per BLOCK_SIZE_M × BLOCK_SIZE_N tile of C, tiles visited in groups of
GROUP_SIZE_M rows so that neighbouring programs share rows of A and columns of B in the L2,
K walked in BLOCK_SIZE_K steps with the tail masked, a float32 accumulator, and the
tutorial's autotuning configurations for CUDA, tuned again for every (M, N, K). Two things
differ, both so that it computes what the rung beside it computes:

- the dot's input precision is an argument: ``"ieee"`` (float32 FMA arithmetic, what the
  FFMA rungs and cuBLAS SGEMM do) or ``"tf32"`` (TF32 tensor cores, what the tensor-core
  rungs and cuBLAS TF32 do). Triton's own default for float32 is TF32, which would be a
  different, less accurate product. Triton before 3.0 spells it ``allow_tf32``;
  :data:`DOT_PRECISION_KEYWORD` says which one the installed Triton takes.
- C is stored in its own dtype (the tutorial stores float16), so one kernel serves float32,
  float16 and bfloat16 operands.

This module imports ``triton`` when it is imported; :mod:`tilegemm.bench.vendors` imports it
only when Triton is to be timed, so neither tilegemm nor a CPU or OpenCL benchmark loads
Triton or PyTorch.

The tutorial is part of Triton, under the MIT licence:

    Copyright 2018-2020 Philippe Tillet
    Copyright 2020-2022 OpenAI

    Permission is hereby granted, free of charge, to any person obtaining
    a copy of this software and associated documentation files
    (the "Software"), to deal in the Software without restriction,
    including without limitation the rights to use, copy, modify, merge,
    publish, distribute, sublicense, and/or sell copies of the Software,
    and to permit persons to whom the Software is furnished to do so,
    subject to the following conditions:

    The above copyright notice and this permission notice shall be
    included in all copies or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND,
    EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF
    MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.
    IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY
    CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT,
    TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE
    SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""

# No ``from __future__ import annotations``: Triton reads the kernels' annotations
# (``tl.constexpr``), as in the tutorial.
import inspect
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

# The tutorial's CUDA configurations: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_stages,
# num_warps), GROUP_SIZE_M = 8 in all. The last eight are the tutorial's picks for 8-bit
# inputs; they stay, so the search is the tutorial's (a tile too large for the device's
# shared memory is dropped by Triton's autotuner when it fails to launch).
CUDA_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
    (128, 256, 128, 3, 8), (256, 128, 128, 3, 8), (256, 64, 128, 4, 4), (64, 256, 128, 4, 4),
    (128, 128, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 32, 64, 4, 4),
)
GROUP_SIZE_M = 8


def dot_precision_keyword(dot: Callable[..., Any]) -> str:
    """``"input_precision"`` where ``tl.dot`` takes it (Triton >= 3.0), else ``"allow_tf32"``."""
    try:
        return "input_precision" if "input_precision" in inspect.signature(dot).parameters \
            else "allow_tf32"
    except (TypeError, ValueError):  # no signature to read: the older spelling
        return "allow_tf32"


DOT_PRECISION_KEYWORD = dot_precision_keyword(tl.dot)


def autotune_configs() -> list[Any]:
    """The tutorial's CUDA configurations as ``triton.Config`` objects."""
    return [triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                           "GROUP_SIZE_M": GROUP_SIZE_M}, num_stages=stages, num_warps=warps)
            for bm, bn, bk, stages, warps in CUDA_CONFIGS]


@triton.jit
def tile_of(pid, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M):
    """The (row, column) tile of C that program ``pid`` computes, in the tutorial's grouped
    order: GROUP_SIZE_M tile rows are walked column by column, so programs that run at
    the same time read the same few rows of A and columns of B (L2 reuse)."""
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)  # the last group may be short
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


if DOT_PRECISION_KEYWORD == "input_precision":
    @triton.jit
    def _dot(a, b, acc, INPUT_PRECISION: tl.constexpr):
        return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
else:  # Triton before 3.0: no accumulator argument, TF32 as a flag
    @triton.jit
    def _dot(a, b, acc, INPUT_PRECISION: tl.constexpr):
        return acc + tl.dot(a, b, allow_tf32=INPUT_PRECISION == "tf32")


@triton.autotune(configs=autotune_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                  BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    """C = A @ B for row-strided A (M, K), B (K, N) and C (M, N)."""
    pid_m, pid_n = tile_of(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                           GROUP_SIZE_M)
    # Rows of A and columns of B past the edge wrap around (% M, % N) instead of being
    # masked: they compute elements of C that the masked store below drops.
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K  # the last step reads zeros past K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def grid(m: int, n: int) -> Callable[[dict[str, Any]], tuple[int]]:
    """The launch grid for an m × n C under the configuration the autotuner is trying:
    one program per tile, a partial tile at each edge included."""
    return lambda meta: (triton.cdiv(m, meta["BLOCK_SIZE_M"])
                         * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)


def matmul_into(a: Any, b: Any, c: Any, input_precision: str) -> None:
    """Launch C = A @ B on 2-D device tensors (PyTorch's, or anything with ``shape`` and
    ``stride``), ``input_precision`` "ieee" or "tf32" for float32 operands. The first call
    for each (M, N, K) autotunes (compiles and times every configuration) before it runs."""
    m, k = a.shape
    k_b, n = b.shape
    if k != k_b or tuple(c.shape) != (m, n):
        raise ValueError(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(c.shape)}")
    matmul_kernel[grid(m, n)](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                              b.stride(1), c.stride(0), c.stride(1),
                              INPUT_PRECISION=input_precision)


def chosen_config() -> dict[str, int]:
    """The configuration the autotuner chose for the last launch ({} before any), in the
    rungs' short names: BM, BN, BK, GROUP_M, warps, stages."""
    cfg = getattr(matmul_kernel, "best_config", None)
    if cfg is None:
        return {}
    kw = cfg.kwargs
    return {"BM": kw["BLOCK_SIZE_M"], "BN": kw["BLOCK_SIZE_N"], "BK": kw["BLOCK_SIZE_K"],
            "GROUP_M": kw["GROUP_SIZE_M"], "warps": cfg.num_warps, "stages": cfg.num_stages}
