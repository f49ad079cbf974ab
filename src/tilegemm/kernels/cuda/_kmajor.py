"""Operands copied on the device, before the product, into the layout its kernel reads.

Mostly B as a K-major operand: a transposed copy of B (``KMajorBProgram``); also copies of
transposed device operands into the row-major layout of rung mma and rungs 6-9
(``RowMajorProgram``) and rung wgmma's choice of kernel by layout (``InPlaceProgram``).

Tensor cores read both operands K-major (each row of a shared tile is a run of K), and
TF32 has no transposed form. A is K-major as NumPy lays it out (M×K, K contiguous); B is
not (K×N, N contiguous). A kernel can transpose B on its way into shared memory, through
registers, as rung wgmma does with BCOPY=0; the loads then cannot be asynchronous copies,
and their latency is waited for inside the k loop. This module instead transposes B once,
before the product, into a K-major workspace ``Bt`` (batch or 1, N, K), so that the GEMM
kernel copies B's tiles exactly as it copies A's: 16-byte ``cp.async``, several tiles
ahead. The transpose reads and writes B once: for 4096×4096 float32, 128 MB in 46 µs on
an H200, against 440 µs for the TF32 product (rung wgmma went from 26 % to 70 % of cuBLAS
TF32 with it, docs/tensor-cores.md). TF32 operands are rounded by these copies too (A
then gets a rounded copy of its own), so the kernel does no rounding pass in shared
memory.

Where B is K-major already (the transpose of a C-contiguous array, as in ``x @ W.T``) and
nothing is to be rounded, the kernel reads a transposed view of it and nothing is copied.

Private module: imports numba only when a program is launched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from tilegemm import simulator
from tilegemm.backends.cuda_launch import DeviceView, launch_kernel
from tilegemm.backends.cuda_program import CudaProgram, strided_view
from tilegemm.kernels.cuda._workspace import Workspaces, device_key
from tilegemm.launch import MAX_GRID_YZ, ceil_div

TILE = 32  # the transpose's square tile: 32 columns of B read by a warp, 32 rows written
PADDED = TILE + 1  # its rows in shared memory, one value longer (no bank conflicts)
# The rows of the tile a thread handles are ROWS apart: a block is (TILE, ROWS) threads,
# (32, 8) on a GPU. On numba's simulator every thread is a Python thread, started for its
# block and waited for at each barrier, and these copies took 60 % of a simulated wgmma
# product (4.1 of 6.9 s at 128×96×256): there a block is one warp, (32, 1), each thread
# taking every row, the same code with 8 times fewer threads.
ROWS = 1 if simulator.enabled() else 8
log = logging.getLogger(__name__)
cuda: Any = None  # numba.cuda, bound by copy_kernel()


def kmajor_view(B: Any, aligned: bool = True) -> Any | None:
    """A (batch, N, K) view of device array ``B`` (batch, K, N) when that view is what a
    copy would hold: K contiguous, and (``aligned``) rows and the start on 16 bytes (the
    kernel's 16-byte copies); otherwise None. (Of an A (batch, M, K): its (batch, K, M)
    view, M contiguous.)"""
    isz = B.dtype.itemsize  # (a NumPy dtype on every kind of device array here)
    s0, s1, s2 = B.strides
    if s1 != isz and B.shape[1] > 1:
        return None
    if aligned and not _on_16_bytes(B, s2):
        return None
    return strided_view(B, (B.shape[0], B.shape[2], B.shape[1]), (s0, s2, isz))


def transposed_view(X: Any, aligned: bool = True) -> Any | None:
    """A (batch, C, R) view of device operand ``X`` (batch, R, C) when X is laid out
    transposed (R contiguous, not C: the transpose of a C-ordered array, as A is in ``x.T
    @ y`` and B in ``x @ w.T``), with (``aligned``) rows and start on 16 bytes, as a
    kernel reads it in place; ``aligned=False``: whatever its alignment, as a copy into
    X's own layout reads it, coalesced along its rows. Otherwise None."""
    if X.strides[2] == X.dtype.itemsize or X.shape[2] <= 1:
        return None
    return kmajor_view(X, aligned)


def _on_16_bytes(X: Any, row_stride: int) -> bool:
    """Whether device array ``X``'s start, batch stride and ``row_stride`` (bytes) are
    multiples of 16 bytes."""
    return not (row_stride % 16 or X.strides[0] % 16 or _address(X) % 16)


def _address(B: Any) -> int:
    if type(B) is DeviceView:
        return B.ptr
    cai = getattr(B, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return int(np.asarray(getattr(B, "_ary", B)).ctypes.data)  # the simulator's, or NumPy's


def rows_off_16_bytes(X: Any) -> bool:
    """Whether device operand ``X`` (batch, R, C), laid out row by row (C contiguous), has
    rows, batches or its start off 16 bytes, so that a kernel's 16-byte loads cannot read
    it (the vector checks of rungs 6-9 and mma)."""
    return X.strides[2] == X.dtype.itemsize and not _on_16_bytes(X, X.strides[1])


def padded_shape(shape: tuple[int, int, int], itemsize: int) -> tuple[int, int, int]:
    """A copy's workspace for an operand of ``shape`` (batch, R, C) copied as it lies: (batch,
    R, C rounded up to 16 bytes), so every row starts on 16 bytes whatever C is."""
    batch, rows, cols = shape
    per = 16 // itemsize
    return (batch, rows, ceil_div(max(cols, 1), per) * per)


def kmajor_shape(shape: tuple[int, int, int], itemsize: int) -> tuple[int, int, int]:
    """The workspace for B of ``shape`` (batch, K, N): (batch, N, K rounded up to 16
    bytes), so every row starts on 16 bytes whatever K is."""
    batch, k, n = shape
    return padded_shape((batch, n, k), itemsize)


@dataclass(frozen=True)
class KMajorBProgram(CudaProgram):
    """A kernel that reads B as ``Bt`` (batch or 1, N, K); ``launch`` takes B (batch or 1,
    K, N) like every program's and gives the kernel a transposed view or copy of it.

    ``round_tf32``: the kernel reads TF32 operands as they are (the tensor core then
    ignores their last 13 bits), so A and B reach it rounded to the nearest TF32 value by
    the copies made here: B's K-major copy rounds as it transposes (or copies a K-major B),
    and A gets a rounded copy of its own. Rounding in shared memory instead, as the kernel
    does with BCOPY=0, reads and writes every tile once more per k-tile, which on an H200
    cost the TF32 kernel a third of its speed (533 against 865 microseconds at 4096³)."""

    round_tf32: bool = False
    workspaces: Workspaces = field(default_factory=Workspaces, compare=False, repr=False)

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any, stream: Any = 0) -> None:
        view = kmajor_view(B)
        a_t = transposed_view(A, aligned=False)
        if view is not None and a_t is None and not self.round_tf32:
            super().launch(A, view, C, alpha, beta, stream)
            return
        # A is copied to be rounded, or K-major when it is M-major (a device array's
        # transpose, x.T @ y, aligned or not: its tiles would otherwise take the kernel's
        # plain loads); B to be rounded, or K-major when it is not already (the kernel
        # reads its padded rows)
        copies = []
        if self.round_tf32 or a_t is not None:
            copies.append(("A", A, a_t, True))
        if view is not None and self.round_tf32:  # K-major already: a rounded copy
            copies.append(("B", view, None, False))
        elif view is None:  # transposed into a K-major copy
            copies.append(("B", None, B, False))
        with self.workspaces.lock:  # the copies and their reader, enqueued together
            out = copy_operands(self.workspaces, copies, self.round_tf32, stream)
            super().launch(out.get("A", A), out.get("B", view), C, alpha, beta, stream)

    def kernel_operands(self, A: Any, B: Any) -> tuple[Any, Any]:
        from tilegemm.kernels.cuda._tensorcore import tf32_round

        work = np.zeros(kmajor_shape(B.shape, B.dtype.itemsize), dtype=B.dtype)
        work[:, :, : B.shape[1]] = B.transpose(0, 2, 1)
        if self.round_tf32:
            return tf32_round(A), tf32_round(work)
        return A, work


@dataclass(frozen=True)
class InPlaceProgram(CudaProgram):
    """16-bit operands read as they lie, never copied (rung wgmma's BCOPY=2). ``kernel``
    reads A (batch or 1, M, K) K-major and B (batch or 1, K, N) N-major, B's tiles by the
    wgmma's transposed-B form. Where an operand is laid out the other way (the transpose of
    a C-ordered device array: A as in ``x.T @ y``, M contiguous; B as in ``x @ w.T``, K
    contiguous) with its rows on 16 bytes, the launch gives the kernel a transposed view of
    it and picks the variant compiled for that layout, ``variant(a_mn, b_kmajor)``: A's
    tiles M-major (the transposed-A form), B's K-major. Variants are built on first use and
    numba compiles each on its first launch, so a process that never sees such an operand
    compiles none. An operand whose rows are off 16 bytes takes ``kernel``'s plain loads."""

    variant: Callable[[bool, bool], Any] | None = field(default=None, compare=False)
    _variants: dict = field(default_factory=dict, compare=False, repr=False)

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any, stream: Any = 0) -> None:
        a_t, b_t = transposed_view(A), transposed_view(B)  # (batch, K, M), (batch, N, K)
        self.launch_with(self.kernel_for(a_t is not None, b_t is not None),
                         A if a_t is None else a_t, B if b_t is None else b_t, C, alpha,
                         beta, stream)

    def kernel_for(self, a_mn: bool, b_kmajor: bool) -> Any:
        """The kernel for A M-major (``a_mn``) and B K-major (``b_kmajor``) operands."""
        if not (a_mn or b_kmajor):
            return self.kernel
        kernel = self._variants.get((a_mn, b_kmajor))
        if kernel is None:
            kernel = self._variants[(a_mn, b_kmajor)] = self.variant(a_mn, b_kmajor)
        return kernel


# Rungs 6-9 copy an operand only where the product does at least this many multiply-adds
# per element copied (N per element of A, M per element of B; times the batch it is
# broadcast over). The copy reads and writes each element once, at memory bandwidth; the
# element-by-element path it saves costs the kernel on every k-tile. Measured on an H200
# (2026-11-27, rung 9 on CuPy arrays, ``benchmarks/operand_layouts.py``; time without the
# copy over time with it): at 4096³ ``x @ w.T`` 1.52x, ``x.T @ y`` 1.12x, 4097³ (rows off
# 16 bytes) 1.07x; at 1024 multiply-adds per element (a batch of 1024³) 1.44x and 1.07x;
# at 512 (512³) 1.30x and 1.01x. Below that the copy's share grows as 1/reuse, and a
# skinny product (``x.T @ y`` with y a few columns wide) would spend more on the copy than
# on the product.
FFMA_MIN_REUSE = 512
# What the programs of rungs 6-9 are built with (``RowMajorProgram(..., **FFMA_COPIES)``).
FFMA_COPIES = {"pad": True, "min_reuse": FFMA_MIN_REUSE}


@dataclass(frozen=True)
class RowMajorProgram(CudaProgram):
    """A kernel that reads A K-major (M×K, K contiguous) and B N-major (K×N, N contiguous),
    as rung mma's and the CUDA-core rungs 6-9 do. A device operand laid out the other way
    (the transpose of a C-ordered array: A M-major in ``x.T @ y``, B K-major in ``x @
    w.T``) gets a copy in the kernel's layout first, its rows padded to 16 bytes whatever
    their length, so its tiles go by 16-byte loads (``cp.async`` on rung mma) instead of
    the kernel's element-by-element path on every k-tile (four times the load
    instructions, each bounds-checked); both copies, when both are needed, in one launch.
    The copy reads and writes the operand once: for a 4096×4096 float32 operand about
    46 µs on an H200, against milliseconds for the FP32 product. Other strided views are
    read by the element-by-element path as they are.

    ``pad``: an operand laid out as the kernel reads it but with its rows off 16 bytes
    (K or N not a multiple of 4 in float32, as at 4097³ or a vocabulary of 50257) is
    copied too, into rows padded to 16 bytes, for the same reason. ``min_reuse``: an
    operand is copied for its layout only where the product does at least this many
    multiply-adds per element copied (:data:`FFMA_MIN_REUSE` for rungs 6-9; 0, always,
    for rung mma, whose plain loads cost it far more than the scalar path costs rungs
    6-9). ``round_tf32`` (rung mma's RCOPY=1): both operands are copied, rounded to the
    nearest TF32 value, and the kernel does no rounding pass over each k-tile in shared
    memory (which on rung wgmma cost a third of its speed); the copies read and write A and
    B once."""

    round_tf32: bool = False
    pad: bool = False
    min_reuse: int = 0
    workspaces: Workspaces = field(default_factory=Workspaces, compare=False, repr=False)
    _noted: set = field(default_factory=set, compare=False, repr=False)

    def launch(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any, stream: Any = 0) -> None:
        copies = self.copies_for(A, B, C.shape)
        if not copies:
            self.launch_product(A, B, C, alpha, beta, stream)
            return
        self._note(copies)
        with self.workspaces.lock:  # the copies and their reader, enqueued together
            try:
                out = copy_operands(self.workspaces, copies, self.round_tf32, stream)
            except Exception as exc:
                # A copy only for speed whose workspace does not fit the device's free
                # memory (the caller's CuPy or PyTorch pool may hold most of it): the
                # kernel reads the operands as they lie, more slowly. The workspaces are
                # allocated before any copy is launched, so nothing was written yet.
                # TF32's rounding copies are needed for the result: they raise.
                if self.round_tf32 or not out_of_memory(exc):
                    raise
                self._note_no_room(exc)
                out = {}
            self.launch_product(out.get("A", A), out.get("B", B), C, alpha, beta, stream)

    def copies_for(self, A: Any, B: Any, out_shape: tuple[int, int, int]
                   ) -> list[tuple[str, Any, Any, bool]]:
        """The copies (``copy_operands``' form) a launch on device operands A (batch or 1,
        M, K) and B (batch or 1, K, N) makes before its kernel, for a product of
        ``out_shape`` (batch, M, N)."""
        batch, m, n = out_shape
        copies = []
        for slot, X, reuse in (("A", A, n * batch // A.shape[0]),
                               ("B", B, m * batch // B.shape[0])):
            if not self.round_tf32 and reuse < self.min_reuse:
                continue
            X_t = transposed_view(X, aligned=False)  # noqa: N806
            if X_t is not None or self.round_tf32 or (self.pad and rows_off_16_bytes(X)):
                copies.append((slot, X, X_t, True))
        return copies

    def _note(self, copies: list[tuple[str, Any, Any, bool]]) -> None:
        """A DEBUG record (logger ``tilegemm...``) the first time this program copies an
        operand for a reason, so that a user can see why a call made an extra launch."""
        for slot, X, X_t, _ in copies:
            why = ("rounded to TF32" if self.round_tf32 else
                   "laid out transposed" if X_t is not None else "rows off 16 bytes")
            if (slot, why) in self._noted:
                continue
            self._noted.add((slot, why))
            log.debug("%s: %s (%s, shape %s) copied into the kernel's layout before the "
                      "product, rows padded to 16 bytes", getattr(self.kernel, "__name__",
                                                                  "kernel"),
                      slot, why, tuple(X.shape))

    def _note_no_room(self, exc: BaseException) -> None:
        """A WARNING record, once per program, that an operand was read as it lies for
        want of device memory for its copy: the call is right but slower."""
        if "no room" in self._noted:
            return
        self._noted.add("no room")
        log.warning("%s: no device memory for a copy of an operand into the kernel's "
                    "layout (%s); read as it lies instead, which is slower",
                    getattr(self.kernel, "__name__", "kernel"), exc)

    def launch_product(self, A: Any, B: Any, C: Any, alpha: Any, beta: Any,
                       stream: Any) -> None:
        """The product of operands in the kernel's layout: the kernel's launch (a split-K
        program adds the sum of its slices)."""
        self.launch_with(self.kernel, A, B, C, alpha, beta, stream)

    def kernel_operands(self, A: Any, B: Any) -> tuple[Any, Any]:
        from tilegemm.kernels.cuda._tensorcore import tf32_round

        return (tf32_round(A), tf32_round(B)) if self.round_tf32 else (A, B)


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device had no memory for an allocation: numba's
    ``CudaAPIError`` with the driver's CUDA_ERROR_OUT_OF_MEMORY (code 2), or a
    ``MemoryError`` (CuPy's ``OutOfMemoryError`` is one, where CuPy allocates for numba)."""
    if isinstance(exc, MemoryError):
        return True
    try:  # the code is an int, or the CUDA bindings' CUresult (an IntEnum)
        return type(exc).__name__ == "CudaAPIError" and int(exc.code) == 2  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False


def copy_operands(workspaces: Workspaces, copies: list[tuple[str, Any, Any, bool]],
                  round_tf32: bool, stream: Any) -> dict[str, Any]:
    """The copies a program makes before its kernel, by one launch where there are two.
    Each ``(slot, X, X_t, keep_shape)``: ``X`` is the operand in the layout the kernel
    reads, ``X_t`` None or the operand in the other layout, (batch, C, R) for X's (batch,
    R, C); ``X`` is copied as it is, or ``X_t`` transposed into the kernel's layout.
    Returns slot -> the copy: an array of X's shape when ``keep_shape`` (a copy's rows are
    padded to 16 bytes: the kernel reads X's columns of them), else the workspace itself
    (X may then be None)."""
    works = copy_to_workspaces(workspaces, [(X if X_t is None else X_t, slot, X_t is not None)
                                            for slot, X, X_t, _ in copies], round_tf32, stream)
    out = {}
    for (slot, X, _, keep_shape), work in zip(copies, works, strict=True):
        fits = not keep_shape or tuple(work.shape) == tuple(X.shape)
        out[slot] = work if fits else strided_view(work, tuple(X.shape), work.strides)
    return out


def copy_to_workspaces(workspaces: Workspaces, copies: list[tuple[Any, str, bool]],
                       round_tf32: bool, stream: Any) -> list[Any]:
    """Each ``(X, slot, transpose)`` of ``copies`` (one or two), X of shape (batch, R, C),
    copied into the stream's workspace ``slot`` of ``workspaces``: transposed (batch, C, R
    rounded up to 16 bytes) or as it is (batch, R, C rounded up to 16 bytes), rounded to
    TF32 if asked. Two copies of one dtype are made by one launch (``copy_pair_kernel``).
    Returns the workspaces, in order."""
    works = []
    device = device_key()  # once for both
    for X, slot, transpose in copies:
        dtype = np.dtype(X.dtype)
        shape = (kmajor_shape if transpose else padded_shape)(tuple(X.shape), dtype.itemsize)
        works.append(workspaces.get(shape, dtype, stream, slot, device))
    jobs = [(X, W, transpose) for (X, _, transpose), W in zip(copies, works, strict=True)
            if X.shape[1] and X.shape[2]]
    if len(jobs) == 2 and jobs[0][0].dtype == jobs[1][0].dtype:
        (X1, W1, t1), (X2, W2, t2) = jobs
        grid = _grid(X1.shape, X2.shape)
        kernel = copy_pair_kernel(_name(X1.dtype), round_tf32, t1, t2)
        launch_kernel(kernel, grid, (TILE, ROWS), stream, 0, (X1, W1, X2, W2))
        return works
    for X, W, transpose in jobs:
        kernel = copy_kernel(_name(X.dtype), round_tf32, transpose)
        launch_kernel(kernel, _grid(X.shape), (TILE, ROWS), stream, 0, (X, W))
    return works


@cache
def _name(dtype: np.dtype) -> str:
    """``dtype``'s name (NumPy builds it anew on every read: microseconds a launch)."""
    return np.dtype(dtype).name


def _grid(*shapes: tuple[int, int, int]) -> tuple[int, int, int]:
    """The copy's blocks for operands of these (batch, R, C) shapes side by side: a column
    of blocks per TILE columns of each, rows and batches as the largest needs (the grid's
    y and z limits are strided over)."""
    return (sum(ceil_div(s[2], TILE) for s in shapes),
            min(max(ceil_div(s[1], TILE) for s in shapes), MAX_GRID_YZ),
            min(max(s[0] for s in shapes), MAX_GRID_YZ))


@cache
def copy_kernel(dtype: str, tf32: bool = False, transpose: bool = True) -> Any:
    """``copy(X, W)`` for X of shape (batch, R, C): ``transpose``, ``W[z, c, r] = X[z, r, c]``
    (the columns of W past R are left as they are: the GEMM's copies never read them);
    otherwise ``W[z, r, c] = X[z, r, c]``. ``tf32``: each value rounded to the nearest TF32
    value on the way, which the GEMM then need not do in shared memory. Launched on
    (ceil(C / TILE), rows of tiles, batch) blocks of (TILE, ROWS) threads (see
    ``_copy_tiles``)."""
    global cuda
    from numba import cuda

    elt = np.dtype(dtype).type
    tiles = _copy_tiles(dtype, tf32, transpose)

    @cuda.jit
    def copy(X, W):  # noqa: N803
        tile = cuda.shared.array((TILE, PADDED), elt)
        tiles(X, W, cuda.blockIdx.x, tile)

    return copy


@cache
def copy_pair_kernel(dtype: str, tf32: bool, transpose_first: bool,
                     transpose_second: bool) -> Any:
    """``copy2(X1, W1, X2, W2)``: two copies of ``copy_kernel`` in one launch, the first
    ceil(C1 / TILE) columns of blocks copying X1 into W1 and the rest X2 into W2 (rows of
    tiles and batches: as many as the larger copy needs; the other's extra blocks find no
    work). TF32 products copy both operands before the kernel, and each launch costs the
    host tens of microseconds of Python, as much as the copy of a 1024² operand takes the
    GPU."""
    global cuda
    from numba import cuda

    elt = np.dtype(dtype).type
    first = _copy_tiles(dtype, tf32, transpose_first)
    second = _copy_tiles(dtype, tf32, transpose_second)

    @cuda.jit
    def copy2(X1, W1, X2, W2):  # noqa: N803
        tile = cuda.shared.array((TILE, PADDED), elt)
        columns = (X1.shape[2] + TILE - 1) // TILE
        if cuda.blockIdx.x < columns:
            first(X1, W1, cuda.blockIdx.x, tile)
        else:
            second(X2, W2, cuda.blockIdx.x - columns, tile)

    return copy2


@cache
def _copy_tiles(dtype: str, tf32: bool, transpose: bool) -> Any:
    """The device function behind the copies: ``tiles(X, W, bx, tile)`` copies column of
    tiles ``bx`` of X, the rows of tiles from ``blockIdx.y`` on and the batches from
    ``blockIdx.z`` on, striding by the grid (``tile``: the block's shared tile).

    Transposing, a warp reads 32 adjacent columns of one row of X (coalesced) into a shared
    tile and writes 32 adjacent values of one row of W from it; the tile's rows are padded
    by one value,
    so the column reads fall in 32 different banks. Offsets are computed once per tile and
    stepped per row (numba's indexing of a 3-D array costs about 100 instructions per
    element, which bounded a first version at a quarter of the memory bandwidth). Every
    thread of a block takes the same branches around its barriers (``bx`` is the block's)."""
    global cuda
    from numba import cuda

    from tilegemm.kernels.cuda import _access
    from tilegemm.kernels.cuda._tensorcore import tensorcore_ops

    if simulator.enabled():
        from tilegemm.kernels.cuda._simulator import install

        install()  # numba's simulator races on cuda.shared.array; see _simulator.py
    isz = np.dtype(dtype).itemsize
    TRANSPOSE = transpose  # noqa: N806 - a compile-time constant of the kernel
    store = _access.access_ops().store
    load_at = _access.load_at()
    if tf32:
        convert = tensorcore_ops().to_tf32
    else:
        @cuda.jit(device=True, inline=True)
        def convert(x):  # noqa: ANN001, ANN202
            return x

    @cuda.jit(device=True, inline=True)
    def tiles(X, W, bx, tile):  # noqa: ANN001, ANN202, N803
        rows, cols = X.shape[1], X.shape[2]
        s0, s1, s2 = X.strides[0] // isz, X.strides[1] // isz, X.strides[2] // isz
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        c0 = bx * TILE
        z = cuda.blockIdx.z
        while z < X.shape[0]:
            r0 = cuda.blockIdx.y * TILE
            while r0 < rows:
                whole = r0 + TILE <= rows and c0 + TILE <= cols
                off = z * s0 + (r0 + ty) * s1 + (c0 + tx) * s2
                for j in range(TILE // ROWS):
                    i = ty + j * ROWS
                    if whole or (r0 + i < rows and c0 + tx < cols):
                        v = convert(load_at(X, (z, r0 + i, c0 + tx), off))
                        if TRANSPOSE:
                            tile[i, tx] = v
                        else:
                            store(W, (z, r0 + i, c0 + tx), v)
                    off += ROWS * s1
                if TRANSPOSE:
                    cuda.syncthreads()
                    for j in range(TILE // ROWS):
                        i = ty + j * ROWS
                        if whole or (c0 + i < cols and r0 + tx < rows):
                            store(W, (z, c0 + i, r0 + tx), tile[tx, i])
                    cuda.syncthreads()  # the tile is refilled next
                r0 += cuda.gridDim.y * TILE
            z += cuda.gridDim.z

    return tiles
