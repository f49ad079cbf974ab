"""Hopper warpgroup MMA (tilegemm.kernels.cuda._wgmma): the descriptor and fragment layouts
against the PTX ISA, a one-warpgroup 64×64 product under the simulator against float64
NumPy (with negative controls), and the compiled kernel's sm_90a machine code (HGMMA, no
local memory).

The products (marker ``cudasim`` without ``simulator``) also run on a real Hopper GPU with
``TILEGEMM_GPU_TESTS=1``: there they check the hardware's reading of the descriptors and
fragments, which the simulator cannot (the stand-in and the kernels share one reading of
the PTX ISA)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tilegemm.kernels.cuda import _wgmma as W
from tilegemm.kernels.cuda._codegen import compile_source
from tilegemm.kernels.cuda._tensorcore import bf16_bits, bf16_value, tf32_round

cuda: Any = None  # numba.cuda, a module global: the simulator swaps it through globals

# The tiny kernel's shared layout: the two core matrices along K of one 8-row group are
# adjacent (LBO = 128 bytes), and 8-row groups follow each other (SBO = 256 bytes).
LBO, SBO = 128, 256
N = 64



def _needs_wgmma() -> None:
    """Skip on a real GPU without wgmma (before Hopper, sm_90a); the simulator always runs."""
    from tilegemm import simulator

    if not simulator.enabled():
        from numba import cuda as real_cuda

        if tuple(real_cuda.get_current_device().compute_capability) < (9, 0):
            pytest.skip("wgmma needs a Hopper GPU (sm_90a)")


# --- descriptor and layouts ---------------------------------------------------------------


def test_descriptor_bit_fields() -> None:
    # PTX ISA "Matrix Descriptor Format": address >> 4 in bits 0-13, LBO >> 4 in 16-29,
    # SBO >> 4 in 32-45, base offset in 49-51, swizzle mode in 62-63 (128B = 1)
    desc = W.encode_desc(0x400, 128, 256)
    assert desc == 0x40 | 8 << 16 | 16 << 32
    assert W.encode_desc(0x3FFF0, 0x3FFF0, 0x3FFF0, "128B", 7) == (
        0x3FFF | 0x3FFF << 16 | 0x3FFF << 32 | 7 << 49 | 1 << 62)
    assert W.decode_desc(W.encode_desc(0x1230, 2048, 512, "32B", 3)) == (
        0x1230, 2048, 512, 3, "32B")
    for bad in ((0x408, 128, 256), (0x400, 100, 256), (1 << 18, 128, 256)):
        with pytest.raises(ValueError):
            W.encode_desc(*bad)


def test_d_layout_matches_isa_entries_and_covers_the_tile_once() -> None:
    # read off the PTX ISA figure for the m64nNk8 / m64nNk16 f32 accumulator D
    entries = {(0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1), (0, 4): (0, 8),
               (1, 0): (0, 2), (4, 0): (1, 0), (32, 0): (16, 0), (127, 31): (63, 63),
               (96, 5): (48, 9)}
    for (thread, i), where in entries.items():
        assert W.d_layout(thread, i) == where, (thread, i)
    for n in (8, 64, 256):
        cells = sorted(W.d_layout(t, i) for t in range(128) for i in range(n // 2))
        assert cells == [(r, c) for r in range(64) for c in range(n)]


@pytest.mark.parametrize("itemsize", [2, 4])
def test_kmajor_offsets_tile_core_matrices_without_overlap(itemsize: int) -> None:
    k = 32 // itemsize  # one wgmma step: 32 bytes of K
    r, c = np.meshgrid(np.arange(64), np.arange(k), indexing="ij")
    off = W.kmajor_offset(r, c, itemsize, LBO, SBO)
    assert sorted(off.ravel().tolist()) == list(range(0, 64 * 32, itemsize))
    # one core matrix is 8 rows of 16 contiguous bytes
    assert off[1, 0] - off[0, 0] == 16 and off[0, 16 // itemsize] - off[0, 0] == LBO
    assert off[8, 0] - off[0, 0] == SBO


# --- a one-warpgroup kernel: shared tiles, fence, mma_async, commit, wait, store ----------

_KERNEL = """
def wgmma_tile(A, B, D):
    sA = cuda.shared.array(SIZE, DTYPE, alignment=ALIGN)
    sB = cuda.shared.array(SIZE, DTYPE, alignment=ALIGN)
    t = cuda.threadIdx.x
    for e in range(t, 64 * K, 128):
        r = e // K
        c = e % K
        o = ((r // 8) * SBO + (c // PER) * LBO + (r % 8) * 16 + (c % PER) * ITEM) // ITEM
        sA[o] = A[r, c]
        sB[o] = B[c, r]  # B is K x 64; stored K-major: its column r is row r of sB
    fence_proxy_async()
    cuda.syncthreads()
    z = np.float32(0.0)
    acc = (#@ZEROS)
    fence()
    acc = mma(acc, smem_desc(sA, 0, A_LBO, A_SBO), smem_desc(sB, 0, LBO, SBO), 0)
    commit()
    acc = wait0(acc)
    w = t // 32
    g = (t % 32) // 4
    q = t % 4
#@STORES
"""


def _tile_kernel(kind: str, a_lbo: int = LBO, a_sbo: int = SBO, swap: bool = False) -> Any:
    """The one-warpgroup kernel for ``kind`` ("tf32", "bf16", "f16"). ``a_lbo``/``a_sbo``
    are what A's descriptor claims (the negative control lies); ``swap`` exchanges two
    accumulator registers at the store (a wrong fragment layout)."""
    from numba import cuda

    ops = W.wgmma_ops()
    item = 4 if kind == "tf32" else 2
    k = 32 // item
    stores = []
    for i in range(N // 2):
        j = {0: 1, 1: 0}.get(i, i) if swap else i
        row = f"16 * w + g + {8 * ((i // 2) % 2)}"
        col = f"{8 * (i // 4) + i % 2} + 2 * q"
        stores.append(f"    D[{row}, {col}] = acc[{j}]")
    source = (_KERNEL.replace("#@ZEROS", ", ".join(["z"] * (N // 2)))
              .replace("#@STORES", "\n".join(stores)))
    namespace = {
        "cuda": cuda, "np": np, "SIZE": 64 * k, "K": k, "PER": 16 // item, "ITEM": item,
        "DTYPE": np.float32 if kind == "tf32" else np.uint16, "LBO": LBO, "SBO": SBO,
        "A_LBO": a_lbo, "A_SBO": a_sbo, "ALIGN": W.shared_alignment(), "fence": ops.fence,
        "commit": ops.commit,
        "wait0": ops.wait(0), "fence_proxy_async": ops.fence_proxy_async,
        "smem_desc": ops.smem_desc,
        "mma": {"tf32": ops.mma_tf32, "bf16": ops.mma_bf16, "f16": ops.mma_f16}[kind](N),
    }
    return cuda.jit(compile_source(source, "wgmma_tile", namespace))


_RING_KERNEL = """
def ring_address(out):
    ring = cuda.shared.array(0, np.float32, alignment=ALIGN)
    if cuda.threadIdx.x == 0:
        out[0] = smem_desc_128b(ring, 0, 1024)
"""


@pytest.mark.gpu
def test_dynamic_ring_starts_1024_byte_aligned() -> None:
    """Rung wgmma's ring is dynamic shared memory declared like this (``alignment=1024``,
    no static shared memory) and its 128-byte swizzle is applied to address bits, so its
    descriptors assume the ring starts on a 1024-byte boundary. Alignment on an extern
    shared declaration is not honoured everywhere; this reads the address the hardware
    gives (the descriptor's start-address field) so a misaligned ring shows here, by name,
    rather than only as wrong products."""
    from numba import cuda

    _needs_wgmma()
    ops = W.wgmma_ops()
    kernel = cuda.jit(compile_source(_RING_KERNEL, "ring_address", {
        "cuda": cuda, "np": np, "ALIGN": W.shared_alignment(1024),
        "smem_desc_128b": ops.smem_desc_128b}))
    out = np.zeros(1, np.uint64)
    kernel[1, 32, 0, 4096](out)
    assert W.decode_desc(int(out[0])).addr % 1024 == 0, hex(int(out[0]))


def _operands(kind: str, rng: np.random.Generator) -> tuple[Any, Any, np.ndarray]:
    """A (64×K) and B (K×64) as the kernel takes them, and their float64 product."""
    k = 8 if kind == "tf32" else 16
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, N)).astype(np.float32)
    if kind == "tf32":
        a, b = tf32_round(a), tf32_round(b)
        return a, b, a.astype(np.float64) @ b
    if kind == "bf16":
        a, b = bf16_bits(a), bf16_bits(b)
        return a, b, bf16_value(a).astype(np.float64) @ bf16_value(b)
    a, b = a.astype(np.float16), b.astype(np.float16)
    return a.view(np.uint16), b.view(np.uint16), a.astype(np.float64) @ b


def _error(kind: str, rng: np.random.Generator, **lie: Any) -> float:
    a, b, want = _operands(kind, rng)
    d = np.full((64, N), np.nan, np.float32)
    _tile_kernel(kind, **lie)[1, 128](a, b, d)
    return float(np.max(np.abs(d - want)))


@pytest.mark.cudasim
@pytest.mark.parametrize("kind", ["tf32", "bf16", "f16"])
def test_wgmma_tile_matches_numpy(kind: str, rng: np.random.Generator) -> None:
    _needs_wgmma()
    assert _error(kind, rng) < 1e-4


@pytest.mark.cudasim
def test_wgmma_tile_negative_controls(rng: np.random.Generator) -> None:
    _needs_wgmma()
    # A's descriptor with LBO and SBO exchanged: the core matrices are read in the wrong order
    assert _error("tf32", rng, a_lbo=SBO, a_sbo=LBO) > 1e-2
    assert _error("tf32", rng, swap=True) > 1e-2  # two accumulators stored in each other's place


@pytest.mark.cudasim
@pytest.mark.simulator
def test_wgmma_stand_in_refuses_a_missing_fence_and_a_stray_address() -> None:
    global cuda
    from numba import cuda

    ops = W.wgmma_ops()
    mma, smem_desc = ops.mma_tf32(8), ops.smem_desc

    @cuda.jit
    def unfenced(out):
        s = cuda.shared.array(256, np.float32)
        z = np.float32(0.0)
        d = mma((z, z, z, z), smem_desc(s, 0, 128, 256), smem_desc(s, 0, 128, 256), 0)
        out[0] = d[0]

    with pytest.raises(AssertionError, match="without a wgmma.fence"):
        unfenced[1, 128](np.zeros(1, np.float32))

    fence, commit, wait0 = ops.fence, ops.commit, ops.wait(0)

    @cuda.jit
    def stray(out):
        s = cuda.shared.array(64, np.float32)  # too small for a 64-row A
        z = np.float32(0.0)
        fence()
        d = mma((z, z, z, z), smem_desc(s, 0, 128, 256), smem_desc(s, 0, 128, 256), 0)
        commit()
        d = wait0(d)  # the product is computed (and shared memory read) here
        out[0] = d[0]

    with pytest.raises(IndexError, match="not inside one shared array"):
        stray[1, 128](np.zeros(1, np.float32))


# --- the 128-byte swizzle: layout, descriptor, stand-in ------------------------------------


def test_swizzle_layout_matches_the_isa_pattern() -> None:
    # PTX ISA "Shared Memory Matrix Layout", 128B swizzle: rows of 128 bytes, 8-row atoms of
    # 1024 bytes; in row r the 16-byte chunk j sits at chunk j ^ (r % 8). 64B: j ^ (r%8)//2
    # in 64-byte rows; 32B: j ^ (r%8)//4 in 32-byte rows.
    assert W.swizzle_offset(0, 0) == 0 and W.swizzle_offset(1, 0) == 128 + 16
    assert W.swizzle_offset(3, 5 * 16 + 7) == 3 * 128 + (5 ^ 3) * 16 + 7
    assert W.swizzle_offset(9, 16) == 1024 + 128  # row 9 = row 1 of the second atom
    assert W.swizzle_offset(7, 112, 128) == 7 * 128 + (7 ^ 7) * 16
    assert W.swizzle_offset(3, 0, 64) == 3 * 64 + 1 * 16
    assert W.swizzle_offset(5, 16, 32) == 5 * 32 + (1 ^ 1) * 16
    for width in (32, 64, 128):
        r, kb = np.meshgrid(np.arange(16), np.arange(width), indexing="ij")
        off = W.swizzle_offset(r, kb, width)
        assert sorted(off.ravel().tolist()) == list(range(16 * width))  # a permutation
        # the tensor core's reading: the row-major (unswizzled) address, chunk bits XORed
        mode = {128: "128B", 64: "64B", 32: "32B"}[width]
        assert np.array_equal(W.swizzle_address((r // 8) * 8 * width + (r % 8) * width + kb,
                                                mode), off)
    desc = W.decode_desc(W.encode_desc(0x2000, 16, 1024, "128B"))
    assert (desc.swizzle, desc.sbo, desc.base_offset) == ("128B", 1024, 0)


_SWIZZLED = """
def wgmma_swizzled(A, B, D):
    sA = cuda.shared.array(SIZE, DTYPE, alignment=ALIGN)
    sB = cuda.shared.array(SIZE, DTYPE, alignment=ALIGN)
    t = cuda.threadIdx.x
    for e in range(t, 64 * K, 128):
        r = e // K
        c = e % K
        kb = c * ITEM
        o = ((r // 8) * 1024 + (r % 8) * 128 + ((kb // 16) ^ ((r % 8) // SHRINK)) * 16
             + kb % 16) // ITEM
        sA[o] = A[r, c]
        sB[o] = B[c, r]
    fence_proxy_async()
    cuda.syncthreads()
    z = np.float32(0.0)
    acc = (#@ZEROS)
    fence()
    da = smem_desc(sA, 0, 1024)
    db = smem_desc(sB, 0, 1024)
    for s in range(4):  # the 4 k steps of a 128-byte row: +32 bytes on the start address
        acc = mma(acc, da + np.uint64(2 * s), db + np.uint64(2 * s), 1)
    commit()
    if CLOBBER:  # A rewritten while the products may still read it (a race on the GPU)
        cuda.syncthreads()
        for e in range(t, SIZE, 128):
            sA[e] = 0
        cuda.syncthreads()
    acc = wait0(acc)
    w = t // 32
    g = (t % 32) // 4
    q = t % 4
#@STORES
"""


def _swizzled_kernel(kind: str, shrink: int = 1, clobber: bool = False) -> Any:
    """One warpgroup, a 64×64×(128 bytes) product from 128B-swizzled tiles, the descriptor
    stepped 32 bytes along K per instruction. ``shrink`` > 1 fills the tiles with a wrong
    swizzle (chunk ^ (r % 8) // shrink, which the descriptor does not describe);
    ``clobber`` zeroes A between the commit and the wait."""
    from numba import cuda

    ops = W.wgmma_ops()
    item = 4 if kind == "tf32" else 2
    stores = [f"    D[16 * w + g + {8 * ((i // 2) % 2)}, {8 * (i // 4) + i % 2} + 2 * q] = "
              f"acc[{i}]" for i in range(N // 2)]
    source = (_SWIZZLED.replace("#@ZEROS", ") + (".join([", ".join(["z"] * 8)] * 4))
              .replace("#@STORES", "\n".join(stores)))
    namespace = {
        "cuda": cuda, "np": np, "SIZE": 64 * 128 // item, "K": 128 // item, "ITEM": item,
        "SHRINK": shrink, "CLOBBER": clobber, "DTYPE": np.float32 if kind == "tf32" else np.uint16,
        "ALIGN": W.shared_alignment(1024), "fence": ops.fence, "commit": ops.commit,
        "wait0": ops.wait(0), "fence_proxy_async": ops.fence_proxy_async,
        "smem_desc": ops.smem_desc_128b,
        "mma": {"tf32": ops.mma_tf32, "bf16": ops.mma_bf16, "f16": ops.mma_f16}[kind](N),
    }
    return cuda.jit(compile_source(source, "wgmma_swizzled", namespace))


def _swizzled_error(kind: str, rng: np.random.Generator, shrink: int = 1,
                    clobber: bool = False) -> float:
    a, b, want = _product_operands(kind, rng, 128 // (4 if kind == "tf32" else 2), N)
    d = np.full((64, N), np.nan, np.float32)
    _swizzled_kernel(kind, shrink, clobber)[1, 128](a, b, d)
    return float(np.max(np.abs(d - want)))


def _product_operands(kind: str, rng: np.random.Generator, k: int,
                      n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A 64×k, B k×n, A·B in float64) for a one-warpgroup product in ``kind``: random
    values rounded to TF32, or 16-bit values passed as their bits (uint16)."""
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if kind == "tf32":
        a, b = tf32_round(a), tf32_round(b)
        return a, b, a.astype(np.float64) @ b
    if kind == "bf16":
        a, b = bf16_bits(a), bf16_bits(b)
        return a, b, bf16_value(a).astype(np.float64) @ bf16_value(b)
    a, b = a.astype(np.float16), b.astype(np.float16)
    return a.view(np.uint16), b.view(np.uint16), a.astype(np.float64) @ b


@pytest.mark.cudasim
@pytest.mark.parametrize("kind", ["tf32", "bf16", "f16"])
def test_wgmma_from_128b_swizzled_tiles_matches_numpy(kind: str,
                                                      rng: np.random.Generator) -> None:
    _needs_wgmma()
    assert _swizzled_error(kind, rng) < 1e-4


@pytest.mark.cudasim
@pytest.mark.simulator
def test_a_wrong_swizzle_is_caught(rng: np.random.Generator) -> None:
    # the 64B pattern (chunk ^ (r % 8) // 2) written, the 128B one described: wrong product
    assert _swizzled_error("tf32", rng, shrink=2) > 1e-2
    assert _swizzled_error("tf32", rng, shrink=8) > 1e-2  # no swizzle at all


@pytest.mark.cudasim
@pytest.mark.simulator
def test_the_stand_in_reads_shared_memory_when_the_product_retires(
        rng: np.random.Generator) -> None:
    """A tile rewritten after the issue but before the wait changes the product, as it may
    on the GPU: the stand-in computes a product when a wait retires it."""
    assert _swizzled_error("bf16", rng) < 1e-4
    assert _swizzled_error("bf16", rng, clobber=True) > 1e-2


@pytest.mark.ptx
def test_swizzled_kernel_compiles_to_chained_hgmma() -> None:
    from numba import types

    from tilegemm.analysis.resources import link
    from tilegemm.analysis.sass import disassemble

    sig = (types.float32[:, ::1], types.float32[:, ::1], types.float32[:, ::1])
    ptx = W.compile_sm90a(_swizzled_kernel("tf32").py_func, sig)
    assert len(re.findall(r"\.shared \.align 1024 ", ptx)) == 2
    log, cubin = link(ptx, "sm_90a")
    assert "serialized" not in log
    text = disassemble(cubin)
    assert len(re.findall(r"HGMMA\.64x64x8\.F32\.TF32", text)) == 4
    # the descriptor's swizzle bits survive into the instruction's operand (bit 62 set)
    assert "wgmma.mma_async" in ptx


# --- an N-major B (16-bit, imm-trans-b = 1): layout, stand-in, machine code --------------

MN_N = 128  # two 64-column panels: the descriptor's LBO is used
PANEL = 64 * 128  # bytes of one panel of the 64-deep (k) tile: its 8 atoms of 8 k rows


def test_mn_major_layout_is_cutlass_canonical() -> None:
    """The N-major 128B layout (CUTLASS ``make_gmma_desc<Major::MN>``, B128: in 16-byte
    units ((8, n), (8, k)) : ((1, LBO), (8, SBO)) under Swizzle<3,4,3>; PTX ISA: LBO steps
    between (swizzle bytes / 16) rows of 16-byte units along N, SBO between groups of 8
    along K): written out here from those definitions, independently of mn_swizzle_offset,
    and read back through the address swizzle the stand-in applies."""
    n, k = np.meshgrid(np.arange(MN_N), np.arange(64), indexing="ij")
    unit, within = (n % 64) // 8, (n % 8) * 2  # the 16-byte unit along N, bytes inside it
    cutlass = ((n // 64) * PANEL + (k // 8) * 1024 + (k % 8) * 128
               + (unit ^ (k % 8)) * 16 + within)
    off = W.mn_swizzle_offset(n, k, 2, PANEL)
    assert np.array_equal(off, cutlass)
    assert sorted(off.ravel().tolist()) == list(range(0, 2 * MN_N * 64, 2))  # no overlap
    plain = (n // 64) * PANEL + (k // 8) * 1024 + (k % 8) * 128 + (n % 64) * 2
    assert np.array_equal(W.swizzle_address(plain, "128B"), off)
    assert W.mn_swizzle_offset(9, 3, 2, PANEL) == 3 * 128 + (1 ^ 3) * 16 + 2
    assert W.mn_swizzle_offset(64, 8, 2, PANEL) == PANEL + 1024


_MN = """
def wgmma_mn(A, B, D):
    sA = cuda.shared.array(A_SIZE, np.uint16, alignment=ALIGN)
    sB = cuda.shared.array(B_SIZE, np.uint16, alignment=ALIGN)
    t = cuda.threadIdx.x
    for e in range(t, 64 * 64, 128):  # A K-major: row r, k c (the 128B layout of rows)
        r = e // 64
        c = e % 64
        sA[((r // 8) * 1024 + (r % 8) * 128 + (((c * 2) // 16) ^ (r % 8)) * 16
            + (c * 2) % 16) // 2] = A[r, c]
    for e in range(t, MN_N * 64, 128):  # B N-major: k row c, column j
        c = e // MN_N
        j = e % MN_N
        sB[((j // 64) * WRITE_LBO + (c // 8) * WRITE_SBO + (c % 8) * 128
            + ((((j % 64) * 2) // 16) ^ (c % 8)) * 16 + (j * 2) % 16) // 2] = B[c, j]
    fence_proxy_async()
    cuda.syncthreads()
    z = np.float32(0.0)
    acc = (#@ZEROS)
    fence()
    da = smem_desc(sA, 0, 1024)
    db = smem_desc_mn(sB, 0, PANEL, 1024)
    for s in range(4):  # k16 steps: 32 bytes along A's rows, 2 atoms (2048 bytes) down B
        acc = mma(acc, da + np.uint64(2 * s), db + np.uint64(128 * s), 1)
    commit()
    acc = wait0(acc)
    w = t // 32
    g = (t % 32) // 4
    q = t % 4
#@STORES
"""


def _mn_kernel(kind: str, write_lbo: int = PANEL, write_sbo: int = 1024) -> Any:
    """The Python function of the one-warpgroup product below (see :func:`_mn_error`)."""
    from numba import cuda

    ops = W.wgmma_ops()
    stores = [f"    D[16 * w + g + {8 * ((i // 2) % 2)}, {8 * (i // 4) + i % 2} + 2 * q] = "
              f"acc[{i}]" for i in range(MN_N // 2)]
    zeros = ") + (".join([", ".join(["z"] * 8)] * (MN_N // 16))
    source = _MN.replace("#@ZEROS", zeros).replace("#@STORES", "\n".join(stores))
    namespace = {"cuda": cuda, "np": np, "MN_N": MN_N, "PANEL": PANEL, "A_SIZE": 64 * 64,
                 "B_SIZE": MN_N * 64, "WRITE_LBO": write_lbo, "WRITE_SBO": write_sbo,
                 "ALIGN": W.shared_alignment(1024), "fence": ops.fence, "commit": ops.commit,
                 "wait0": ops.wait(0), "fence_proxy_async": ops.fence_proxy_async,
                 "smem_desc": ops.smem_desc_128b, "smem_desc_mn": ops.smem_desc_128b_mn,
                 "mma": {"bf16": ops.mma_bf16, "f16": ops.mma_f16}[kind](MN_N, b_mn=True)}
    return compile_source(source, "wgmma_mn", namespace)


def _mn_error(kind: str, rng: np.random.Generator, write_lbo: int = PANEL,
              write_sbo: int = 1024) -> float:
    """One warpgroup, a 64×128×64 product with B's tile N-major (two panels) read by the
    transposed-B wgmma. ``write_lbo``/``write_sbo``: the panel and atom steps the tile is
    written with (the descriptor always says PANEL and 1024)."""
    from numba import cuda

    kernel = cuda.jit(_mn_kernel(kind, write_lbo, write_sbo))
    a, b, want = _product_operands(kind, rng, 64, MN_N)
    d = np.full((64, MN_N), np.nan, np.float32)
    kernel[1, 128](a, b, d)
    return float(np.max(np.abs(d - want)))


@pytest.mark.cudasim
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_wgmma_with_an_n_major_b_matches_numpy(kind: str, rng: np.random.Generator) -> None:
    _needs_wgmma()
    assert _mn_error(kind, rng) < 1e-4


@pytest.mark.cudasim
@pytest.mark.simulator
def test_an_n_major_b_with_other_steps_is_caught(rng: np.random.Generator) -> None:
    """The tile written with its panels interleaved (panel step 1024, atom step 2048: also a
    canonical N-major layout) while the descriptor says otherwise: a wrong product (the
    stand-in reads LBO and SBO as the PTX ISA defines them for N-major tiles)."""
    assert _mn_error("bf16", rng, write_lbo=1024, write_sbo=2048) > 1e-2


def test_tf32_has_no_n_major_form() -> None:
    with pytest.raises(ValueError, match="TF32 operands have no MN-major"):
        W._py_mma("tf32", 64, True)


@pytest.mark.ptx
def test_n_major_b_compiles_to_hgmma_with_transposed_b() -> None:
    from numba import types

    from tilegemm.analysis.resources import link
    from tilegemm.analysis.sass import disassemble

    sig = (types.uint16[:, ::1], types.uint16[:, ::1], types.float32[:, ::1])
    ptx = W.compile_sm90a(_mn_kernel("bf16"), sig)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16 .*"
                     r"1, 1, 0, 1;", ptx)
    log, cubin = link(ptx, "sm_90a")
    assert "serialized" not in log
    text = disassemble(cubin)
    hgmma = re.findall(r"HGMMA\.64x128x16\.F32\.BF16 [^;]*", text)
    assert len(hgmma) == 4 and all(".tnspB" in h for h in hgmma), hgmma
    assert not re.search(r"\b(LDL|STL)\b", text)


# --- the compiled kernel's machine code ---------------------------------------------------


@pytest.mark.ptx
@pytest.mark.parametrize("kind,opcode", [("tf32", r"HGMMA\.64x64x8\.F32\.TF32"),
                                         ("bf16", r"HGMMA\.64x64x16\.F32\.BF16")])
def test_wgmma_tile_compiles_to_hgmma_without_local_memory(kind: str, opcode: str) -> None:
    from numba import types

    from tilegemm.analysis.resources import link, parse_ptxas_log
    from tilegemm.analysis.sass import disassemble

    dt = types.float32 if kind == "tf32" else types.uint16
    sig = (dt[:, ::1], dt[:, ::1], types.float32[:, ::1])
    ptx = W.compile_sm90a(_tile_kernel(kind).py_func, sig)
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx
    # descriptors drop the low 4 address bits: the tiles must be declared aligned
    assert len(re.findall(r"\.shared \.align 128 ", ptx)) == 2
    log, cubin = link(ptx, "sm_90a")
    text = disassemble(cubin)
    assert len(re.findall(opcode, text)) == 1, text
    assert re.search(r"\bWARPGROUP\.(ARRIVE|DEPBAR)", text)
    assert not re.search(r"\b(LDL|STL)\b", text)
    figures = parse_ptxas_log(log)
    assert figures["spill_stores"] == figures["spill_loads"] == figures["stack"] == 0


@pytest.mark.ptx
def test_wgmma_does_not_assemble_for_plain_sm_90() -> None:
    """Why sm_90a: the same PTX for the generic sm_90 target is refused by ptxas."""
    from numba import types
    from numba.cuda import compile_ptx

    from tilegemm.analysis.resources import link

    f = types.float32[:, ::1]
    ptx, _ = compile_ptx(_tile_kernel("tf32").py_func, (f, f, f), cc=(9, 0))
    with pytest.raises(Exception, match="PTX_COMPILE|nvJitLink failed"):  # (either call)
        link(ptx, "sm_90")


# --- the prototype GEMM: the blocks in a k loop, edges included ----------------------------


@pytest.mark.cudasim
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (70, 50, 37), (66, 65, 72)])  # 3 k-tiles
def test_wgmma_gemm_prototype_matches_numpy(m: int, n: int, k: int,
                                            rng: np.random.Generator) -> None:
    _needs_wgmma()
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    W.gemm_kernel(32)[((n + 63) // 64, (m + 63) // 64), 128](a, b, c)
    want = tf32_round(a).astype(np.float64) @ tf32_round(b)
    assert np.max(np.abs(c - want)) < 1e-5 * (1 + np.sqrt(k)) * 4


@pytest.mark.ptx
def test_wgmma_gemm_prototype_sass() -> None:
    from numba import types

    from tilegemm.analysis.resources import link, parse_ptxas_log
    from tilegemm.analysis.sass import disassemble

    f = types.float32[:, ::1]
    ptx = W.compile_sm90a(W.gemm_kernel(32).py_func, (f, f, f))
    assert len(re.findall(r"\.shared \.align 128 ", ptx)) == 2
    log, cubin = link(ptx, "sm_90a")
    text = disassemble(cubin)
    assert len(re.findall(r"HGMMA\.64x64x8\.F32\.TF32", text)) == 4  # bk / 8 per k-tile
    assert not re.search(r"\b(LDL|STL)\b", text)
    figures = parse_ptxas_log(log)
    assert figures["spill_stores"] == figures["spill_loads"] == figures["stack"] == 0
