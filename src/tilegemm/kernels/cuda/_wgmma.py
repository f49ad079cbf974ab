"""Hopper warpgroup MMA (``wgmma``, sm_90a) for Numba kernels, and its simulator stand-in.

``mma.sync`` (see ``_tensorcore``) is a warp instruction whose A and B come from registers.
On Hopper the fastest path is ``wgmma.mma_async``: four warps (a *warpgroup*, 128 threads)
issue one 64×N×K product together, A and B are read by the tensor core straight from shared
memory through 64-bit *matrix descriptors*, and the instruction runs asynchronously, so a
kernel can issue the next loads while it runs. Only ``sm_90a`` (the architecture-specific
Hopper target) has it; plain ``sm_90`` code cannot use it (numba-cuda compiles for
``sm_90a`` when it runs on a 9.x device, and :func:`compile_sm90a` asks for it offline).
The route is the same as for ``mma``: a numba ``@intrinsic`` emitting the PTX through
llvmlite's ``ir.InlineAsm``.

The instructions (:func:`wgmma_ops` returns them for the current mode):

- ``fence()``: ``wgmma.fence.sync.aligned``. Needed before the first ``mma_async`` of a
  warpgroup, and again whenever the accumulators were touched by other instructions;
- ``commit()``: ``wgmma.commit_group.sync.aligned``: the ``mma_async`` issued so far form
  one group;
- ``wait(n)``: the function for ``wgmma.wait_group.sync.aligned n`` (an immediate, so one
  function per ``n``). It takes the accumulator tuple and returns it: the registers pass
  through the instruction, so the compiler cannot read them before the wait retires the
  product that writes them;
- ``fence_proxy_async()``: ``fence.proxy.async.shared::cta``. ``wgmma`` reads shared memory
  through the "async proxy"; ordinary stores to shared memory are only guaranteed visible
  to it after this fence (then a barrier, so every thread's stores are fenced);
- ``mma_tf32(n)``: the function ``(acc, desc_a, desc_b, scale_d) -> acc`` for
  ``wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32``: ``acc`` is a tuple of ``n // 2``
  float32 (this thread's part of the 64×n D, layout :func:`d_layout`), ``desc_a`` and
  ``desc_b`` are uint64 descriptors, and ``scale_d`` is 0 (D = A·B, the accumulators are
  ignored) or 1 (D = A·B + D). TF32 operands must be K-major (no transposed forms exist);
- ``mma_bf16(n, b_mn=False, a_mn=False)`` / ``mma_f16(...)``: the same for
  ``m64n{n}k16.f32.bf16.bf16`` / ``.f16.f16``, A and B K-major (``imm-trans-a`` =
  ``imm-trans-b`` = 0) or, ``b_mn=True``, B MN-major (``imm-trans-b`` = 1: B stored K×N
  with N contiguous, as a row-major B is), ``a_mn=True``, A MN-major (``imm-trans-a`` = 1:
  A stored K×M, M contiguous); only 16-bit types have these forms;
- ``smem_desc(arr, off, lbo, sbo)``: the descriptor of a matrix starting ``off`` bytes into
  the shared array ``arr`` (16-byte aligned), with leading-dimension byte offset ``lbo`` and
  stride-dimension byte offset ``sbo`` and no swizzle (:func:`encode_desc`). The descriptor
  drops the address's low 4 bits, and numba declares shared arrays only 4-byte aligned, so
  declare ``arr`` with ``alignment=shared_alignment()`` (128 compiled; the simulator
  refuses the keyword, so None there); a misaligned array would be read from the wrong
  address on the GPU, which the simulator cannot show;
- ``smem_desc_128b(arr, off, sbo)``: the descriptor of a K-major operand in the 128-byte
  swizzle layout (:func:`swizzle_offset`; swizzle mode 1, LBO unused): rows of 128 bytes,
  8-row atoms ``sbo`` (1024) bytes apart. The hardware applies the swizzle to address bits
  (:func:`swizzle_address`), so the atoms must be 1024-byte aligned
  (``shared_alignment(1024)``); stepping along K inside a row adds to the start address;
- ``smem_desc_128b_mn(arr, off, lbo, sbo)``: the descriptor of an MN-major 16-bit operand
  in the 128-byte swizzle layout (:func:`mn_swizzle_offset`): *panels* of 64 values of M or
  N (128 bytes a row) ``lbo`` bytes apart, inside a panel 8-row atoms of K ``sbo`` (1024)
  bytes apart; stepping along K adds ``16 / 8 * sbo`` bytes a k16 step to the start address;
- ``sts4_at(arr, off, v0, v1, v2, v3)``: one 16-byte shared store (``st.shared.v4.b32``) of
  four 32-bit values at byte ``off``; ``pack_halves(lo, hi)``: two 16-bit values' bits in
  one uint32, ``lo`` in the low half. (Rung wgmma's transposing B copies read B with
  ``_access.load_at``, an element at a kept per-thread offset.)

Shared-memory layout without swizzle (PTX ISA "Shared Memory Matrix Layout"): the operand
is cut into *core matrices* of 8 rows × 16 bytes (8×4 tf32 values, 8×8 16-bit values), each
stored as 128 contiguous bytes, row after row. For K-major A (64×K) and B (stored N×K, one
row per column of B) the core matrix holding rows ``8i..8i+7`` and the ``j``-th 16 bytes of
K starts at ``i * sbo + j * lbo`` bytes from the descriptor's start: LBO steps along K, SBO
along M (or N). :func:`kmajor_offset` writes that out.

Under numba's simulator the instructions cannot run, so :func:`wgmma_ops` returns Python
stand-ins. The shared arrays a kernel takes descriptors of get addresses in a simulated
shared-memory window (per block); the stand-in of ``mma_async`` gathers the 128 threads'
accumulators, decodes both descriptors, reads the core matrices from those arrays, computes
D in float64 from TF32-truncated (or 16-bit) inputs, rounds to float32 and gives each thread
its fragment. A wrong stride or fragment therefore gives a wrong product, as on the GPU.
The asynchrony is modelled: ``mma_async`` computes nothing at issue; ``commit`` closes a
group, and ``wait(n)`` computes the products of the groups it
retires, in order, reading shared memory *then*, and returns the accumulators they give.
So a kernel that rewrites a tile before the product reading it has retired, or that reads
the accumulators without waiting, gets a wrong result under the simulator too. The
stand-in also refuses an ``mma_async`` that no ``fence`` preceded since the last ``wait``,
and a ``wait`` with products not committed.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from tilegemm.kernels.cuda._tensorcore import (
    bf16_value,
    collective_compute,
    note_access,
    sum_to_float32,
    tf32_truncate,
    untraced,
)

WARPGROUP = 128  # threads that issue one wgmma together
SWIZZLE_MODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}  # descriptor bits 62-63
N_SIZES = tuple(range(8, 257, 8))  # the n of m64nNk*: multiples of 8 up to 256


class WgmmaOps(NamedTuple):
    fence: Any
    commit: Any
    wait: Any  # wait(n) -> the function for wgmma.wait_group n
    fence_proxy_async: Any
    mma_tf32: Any  # mma_tf32(n) -> the function for m64n{n}k8 tf32
    mma_bf16: Any  # mma_bf16(n) -> m64n{n}k16 bf16
    mma_f16: Any  # mma_f16(n) -> m64n{n}k16 f16
    smem_desc: Any
    smem_desc_128b: Any  # smem_desc_128b(arr, off, sbo): a K-major 128-byte-swizzle descriptor
    smem_desc_128b_mn: Any  # smem_desc_128b_mn(arr, off, lbo, sbo): the same, MN-major
    sts4_at: Any  # sts4_at(arr, off, v0, v1, v2, v3): one 16-byte shared store
    pack_halves: Any  # pack_halves(lo, hi) -> uint32: two 16-bit values' bits, lo first


# --- descriptor and layouts (PTX ISA), shared by the stand-ins, kernels and tests ---------


def encode_desc(addr: int, lbo: int, sbo: int, swizzle: str = "none",
                base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format").

    Bits 0-13: shared address >> 4; 16-29: leading-dimension byte offset >> 4; 32-45:
    stride-dimension byte offset >> 4; 49-51: matrix base offset (only for swizzled layouts
    not aligned to the swizzle's repeat); 62-63: swizzle mode. The low 4 bits of the three
    byte quantities are dropped, so all must be multiples of 16; refused otherwise, since
    the hardware would silently use a different address.
    """
    for name, v in (("address", addr), ("lbo", lbo), ("sbo", sbo)):
        if v % 16 or not 0 <= v < 1 << 18:
            raise ValueError(f"wgmma descriptor: {name} {v} must be a multiple of 16 "
                             "below 256 KiB")
    if not 0 <= base_offset < 8:
        raise ValueError(f"wgmma descriptor: base offset {base_offset} is 3 bits")
    return ((addr >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | base_offset << 49
            | SWIZZLE_MODES[swizzle] << 62)


class Descriptor(NamedTuple):
    addr: int
    lbo: int
    sbo: int
    base_offset: int
    swizzle: str


def decode_desc(desc: int) -> Descriptor:
    """The fields of a descriptor, byte quantities restored (inverse of :func:`encode_desc`)."""
    desc = int(desc)
    mode = {v: k for k, v in SWIZZLE_MODES.items()}[(desc >> 62) & 3]
    return Descriptor((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4,
                      ((desc >> 32) & 0x3FFF) << 4, (desc >> 49) & 7, mode)


def kmajor_offset(row: Any, k: Any, itemsize: int, lbo: int, sbo: int) -> Any:
    """Byte offset of element (``row``, ``k``) of a K-major operand in the no-swizzle layout:
    core matrix (``row // 8``, ``k // per``) at ``(row // 8) * sbo + (k // per) * lbo``, then
    16 bytes per row inside it (``per`` = 16 // itemsize values of K in a row). Works on
    ints and on NumPy arrays."""
    per = 16 // itemsize
    return (row // 8) * sbo + (k // per) * lbo + (row % 8) * 16 + (k % per) * itemsize


SWIZZLE_BYTES = {"128B": 128, "64B": 64, "32B": 32}  # row width of each swizzle's atom


def swizzle_offset(row: Any, kbyte: Any, width: int = 128) -> Any:
    """Byte offset of byte ``kbyte`` (< ``width``) of row ``row`` of a K-major operand in
    the ``width``-byte swizzle layout (PTX ISA "Shared Memory Matrix Layout", swizzle modes
    128B/64B/32B): rows of ``width`` bytes, 8 rows an atom of ``8 * width`` bytes, atoms one
    after the other (SBO = ``8 * width``), and inside a row the 16-byte chunk ``j`` stored at
    chunk ``j ^ (row % 8)`` (128B), ``j ^ ((row % 8) // 2)`` (64B) or ``j ^ ((row % 8) //
    4)`` (32B). The atoms must start ``8 * width``-aligned in shared memory, since the
    hardware applies the XOR to address bits (see :func:`swizzle_address`). Works on ints
    and on NumPy arrays."""
    chunk = kbyte // 16
    xor = (row % 8) // (128 // width)
    return (row // 8) * 8 * width + (row % 8) * width + (chunk ^ xor) * 16 + kbyte % 16


def mn_swizzle_offset(mn: Any, k: Any, itemsize: int, lbo: int, sbo: int = 1024) -> Any:
    """Byte offset of element (``mn``, ``k``) of an MN-major operand (M or N contiguous:
    a row-major B, K×N) in the 128-byte swizzle layout, CUTLASS's canonical
    ``Layout_MN_SW128_Atom`` tiled (``make_gmma_desc<Major::MN>``): the operand is cut into
    *panels* of 128 bytes of M/N (64 16-bit values), ``lbo`` bytes apart (the descriptor's
    leading-dimension byte offset); inside a panel each k is a 128-byte row, 8 rows an atom,
    atoms ``sbo`` bytes apart along K (the stride-dimension byte offset), and the 16-byte
    chunk ``j`` of row ``k`` sits at chunk ``j ^ (k % 8)``, as in the K-major layout with
    the roles of the two dimensions exchanged. Works on ints and on NumPy arrays."""
    per = 128 // itemsize
    return ((mn // per) * lbo + (k // 8) * sbo
            + swizzle_offset(k % 8, (mn % per) * itemsize))


def swizzle_address(addr: Any, swizzle: str) -> Any:
    """A shared address as the tensor core reads it under ``swizzle``: the 16-byte chunk
    bits 4.. XORed with bits 7.. (CUTLASS's ``Swizzle<3,4,3>``, ``<2,4,3>``, ``<1,4,3>`` for
    128B, 64B, 32B). The pattern repeats every 1024 bytes; the descriptor's base offset
    covers atoms that do not start at a multiple of it, which these kernels avoid."""
    if swizzle == "none":
        return addr
    bits = {"128B": 3, "64B": 2, "32B": 1}[swizzle]
    mask = (1 << bits) - 1
    return addr ^ (((addr >> 7) & mask) << 4)


def d_layout(thread: int, i: int) -> tuple[int, int]:
    """(row, col) of the 64×N f32 D held by register ``i`` (0 … N/2-1) of warpgroup thread
    ``thread`` (0-127), PTX ISA "Register Fragments … wgmma .m64nNk*": warp ``w`` holds rows
    16w-16w+15, and each 8 columns repeat the m16n8 accumulator pattern of ``mma``."""
    w, lane = divmod(thread, 32)
    g, t = lane // 4, lane % 4
    return 16 * w + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * t + i % 2


# --- simulator stand-ins ------------------------------------------------------------------

_LOCK = threading.Lock()
_WINDOW_START = 1024  # first simulated shared address (so a zero descriptor points nowhere)


def _block_state() -> tuple[Any, dict]:
    """(this thread, the per-block dict of wgmma simulator state)."""
    t = threading.current_thread()
    manager = t._manager  # type: ignore[attr-defined]
    with _LOCK:
        blocks = manager.__dict__.setdefault("_tilegemm_wgmma", {})
        state = blocks.setdefault(tuple(t.blockIdx), {  # type: ignore[attr-defined]
            "window": [], "next": _WINDOW_START})
    return t, state


def group_compute(value: Any, fn: Any) -> Any:
    """Simulator only: every thread of the calling warpgroup gives ``value``; one of them
    computes ``fn(all 128 values)`` and every thread gets that result (the product a
    warpgroup instruction makes, computed once instead of by each of its 128 threads).
    An exception in ``fn`` reaches every thread."""
    return collective_compute(WARPGROUP, "wgmma instructions", value, fn)


def _shared_base(arr: np.ndarray) -> int:
    """The simulated shared address of ``arr``'s first byte: arrays get addresses, 1 KiB
    aligned, in the order a block first takes a descriptor of them."""
    arr = untraced(arr)  # the memory tracer's array: its data (descriptors read no memory)
    if not arr.flags.c_contiguous:
        raise TypeError("smem_desc: needs a contiguous shared array")
    _, state = _block_state()
    key = arr.__array_interface__["data"][0]
    with _LOCK:
        for base, start, _ in state["window"]:
            if start == key:
                return base
        base = state["next"]
        state["window"].append((base, key, arr.reshape(-1).view(np.uint8)))
        state["next"] = base + (arr.nbytes + 1023) // 1024 * 1024
    return base


def _read_shared(addr: np.ndarray, itemsize: int) -> np.ndarray:
    """The ``itemsize``-byte words at simulated shared addresses ``addr`` (as unsigned ints),
    all within one array of the window (an address outside every array is an error)."""
    _, state = _block_state()
    lo, hi = int(addr.min()), int(addr.max()) + itemsize
    for base, _, raw in state["window"]:
        if base <= lo and hi <= base + raw.size:
            idx = (addr - base)[..., None] + np.arange(itemsize)
            words = np.ascontiguousarray(raw[idx])
            return words.view(f"<u{itemsize}")[..., 0]
    raise IndexError(f"wgmma: shared addresses {lo}-{hi} are not inside one shared array "
                     "that a descriptor was taken of")


def _py_smem_desc(arr: Any, off: Any, lbo: Any, sbo: Any) -> np.uint64:
    return np.uint64(encode_desc(_shared_base(arr) + int(off), int(lbo), int(sbo)))


def _py_smem_desc_128b(arr: Any, off: Any, sbo: Any) -> np.uint64:
    # LBO is unused by K-major swizzled layouts whose K extent per instruction (32 bytes)
    # fits one swizzle row; 16 (encoded 1), as CUTLASS writes it
    return np.uint64(encode_desc(_shared_base(arr) + int(off), 16, int(sbo), "128B"))


def _operand(desc: int, rows: int, k: int, itemsize: int, mn_major: bool = False
             ) -> np.ndarray:
    """The rows×k operand a descriptor points at, as raw words. K-major: the no-swizzle
    layout (core matrices at LBO/SBO steps, :func:`kmajor_offset`), or a swizzled one (rows
    of the swizzle's width, 8-row atoms SBO apart, the address's chunk bits XORed as the
    hardware does, :func:`swizzle_address`; LBO unused). ``mn_major`` (the instruction's
    transpose flag): the 128-byte swizzle's MN-major layout, panels of 128 bytes of M/N
    LBO apart, 8-k atoms SBO apart inside a panel (:func:`mn_swizzle_offset`)."""
    d = decode_desc(desc)
    if d.base_offset:
        raise NotImplementedError("wgmma stand-in: a non-zero base offset is not emulated "
                                  "(keep swizzle atoms aligned to their repeat)")
    r, c = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
    if mn_major:
        per = 128 // itemsize
        if d.swizzle != "128B" or rows % per:
            raise NotImplementedError("wgmma stand-in: MN-major operands only in the 128B "
                                      f"swizzle, in whole panels of {per} rows")
        plain = (d.addr + (r // per) * d.lbo + (c // 8) * d.sbo + (c % 8) * 128
                 + (r % per) * itemsize)
        return _read_shared(swizzle_address(plain, "128B"), itemsize)
    if d.swizzle == "none":
        return _read_shared(d.addr + kmajor_offset(r, c, itemsize, d.lbo, d.sbo), itemsize)
    width = SWIZZLE_BYTES[d.swizzle]
    if k * itemsize > width:
        raise NotImplementedError("wgmma stand-in: an instruction's K wider than the swizzle")
    plain = d.addr + (r // 8) * d.sbo + (r % 8) * width + c * itemsize
    return _read_shared(swizzle_address(plain, d.swizzle), itemsize)


def _py_smem_desc_128b_mn(arr: Any, off: Any, lbo: Any, sbo: Any) -> np.uint64:
    return np.uint64(encode_desc(_shared_base(arr) + int(off), int(lbo), int(sbo), "128B"))


def _py_sts4_at(arr: Any, off: Any, *values: Any) -> None:
    if int(off) % 16:
        raise AssertionError(f"sts4_at: shared offset {off} is not 16-byte aligned")
    words = np.array([np.asarray(v).view(np.uint32) if np.asarray(v).dtype.itemsize == 4
                      else np.uint32(int(v) & 0xFFFFFFFF) for v in values], np.uint32)
    flat = untraced(arr).reshape(-1).view(np.uint8)
    if int(off) < 0 or int(off) + 16 > flat.size:
        raise IndexError(f"sts4_at: offset {off} outside a shared array of {flat.size} bytes")
    note_access(arr, off, 16, True)  # one st.shared.v4 (the memory tracer's array only)
    flat[int(off):int(off) + 16] = words.view(np.uint8)


def _bits16(x: Any) -> int:
    a = np.asarray(x)
    if a.dtype.itemsize != 2:
        raise TypeError(f"pack_halves: needs 16-bit values, got {a.dtype}")
    return int(a.view(np.uint16))


def _py_pack_halves(lo: Any, hi: Any) -> np.uint32:
    return np.uint32(_bits16(lo) | _bits16(hi) << 16)


class _Issue(threading.local):
    """One thread's wgmma state: fenced since the last wait, the products issued since the
    last commit, and the committed groups not yet retired (oldest first)."""

    def __init__(self) -> None:
        self.fenced = False
        self.open: list[Any] = []
        self.groups: list[list[Any]] = []


_issue = _Issue()


def _py_fence() -> None:
    _issue.fenced = True


def _py_fence_proxy_async() -> None:
    pass  # the simulator's shared memory is one coherent array


def _py_commit() -> None:
    _issue.groups.append(_issue.open)
    _issue.open = []


@cache
def _py_wait(n: int) -> Any:
    def wait(acc: Any) -> Any:
        if _issue.open:
            raise AssertionError("wgmma.wait_group with mma_async not committed "
                                 "(wgmma.commit_group) before it")
        retire = max(len(_issue.groups) - n, 0)
        for group in _issue.groups[:retire]:
            for product in group:  # in issue order, each on the previous one's result
                acc = product(acc)
        _issue.groups = _issue.groups[retire:]
        _issue.fenced = False  # accumulators may be touched now: the next issue needs a fence
        return acc

    return wait


def _check_mma(kind: str, n: int, b_mn: bool, a_mn: bool) -> None:
    if n not in N_SIZES:
        raise ValueError(f"wgmma: n={n} is not a multiple of 8 in 8-256")
    if (a_mn or b_mn) and kind == "tf32":
        raise ValueError("wgmma: TF32 operands have no MN-major (transposed) form")


@cache
def _py_mma(kind: str, n: int, b_mn: bool = False, a_mn: bool = False) -> Any:
    _check_mma(kind, n, b_mn, a_mn)
    k, itemsize = (8, 4) if kind == "tf32" else (16, 2)

    def values(words: np.ndarray) -> np.ndarray:
        if kind == "tf32":
            return tf32_truncate(words.astype(np.uint32).view(np.float32)).astype(np.float64)
        if kind == "f16":
            return words.astype(np.uint16).view(np.float16).astype(np.float64)
        return bf16_value(words.astype(np.uint16)).astype(np.float64)

    def mma(acc: Any, desc_a: Any, desc_b: Any, scale_d: Any) -> tuple[Any, ...]:
        if len(acc) != n // 2:
            raise TypeError(f"wgmma m64n{n}: needs {n // 2} accumulators, got {len(acc)}")
        if not _issue.fenced:
            raise AssertionError("wgmma.mma_async without a wgmma.fence since the last wait")
        key = (int(desc_a), int(desc_b), int(scale_d))

        def product(acc_now: Any) -> tuple[np.float32, ...]:
            """Run when a wait retires this product: shared memory is read then, so a tile
            rewritten between issue and retirement gives a wrong result, as it may on the
            GPU (the tensor core reads it at any time in between)."""

            def compute(frags: list[Any]) -> np.ndarray:
                if len({f[1] for f in frags}) != 1:
                    raise AssertionError("wgmma: descriptors and scale-d differ across the "
                                         "warpgroup")
                A = values(_operand(key[0], 64, k, itemsize, a_mn))
                B = values(_operand(key[1], n, k, itemsize, b_mn)).T  # B's N×K, transposed
                C = np.zeros((64, n))
                if key[2]:
                    for thread, f in enumerate(frags):
                        for i in range(n // 2):
                            C[d_layout(thread, i)] = f[0][i]
                with np.errstate(invalid="ignore", over="ignore"):
                    return sum_to_float32(A @ B + C)

            D = group_compute((tuple(acc_now), key), compute)
            me = threading.current_thread().thread_id % WARPGROUP  # type: ignore[attr-defined]
            return tuple(D[d_layout(me, i)] for i in range(n // 2))

        _issue.open.append(product)
        return tuple(acc)  # the registers change when a wait retires the product

    mma.__name__ = f"wgmma_m64n{n}_{kind}{'_amn' if a_mn else ''}{'_bmn' if b_mn else ''}"
    return mma


def shared_alignment(nbytes: int = 128) -> int | None:
    """The ``alignment=`` for shared arrays that descriptors point into: ``nbytes`` when
    compiling (numba's default is 4 and the descriptor needs 16; 128 by default, 1024 for
    the 128-byte swizzle, whose atoms must be aligned); None under the simulator, whose
    ``shared.array`` refuses the keyword (its arrays sit in a simulated window aligned to
    1 KiB)."""
    from tilegemm import simulator

    return None if simulator.enabled() else nbytes


@cache
def wgmma_ops() -> WgmmaOps:
    """The instructions for the current mode (real compilation or the simulator)."""
    from tilegemm import simulator

    if simulator.enabled():
        from tilegemm.kernels.cuda._simulator import install

        install()  # numba's simulator races on cuda.shared.array; see _simulator.py
        return WgmmaOps(_py_fence, _py_commit, _py_wait, _py_fence_proxy_async,
                        lambda n: _py_mma("tf32", n),
                        lambda n, b_mn=False, a_mn=False: _py_mma("bf16", n, b_mn, a_mn),
                        lambda n, b_mn=False, a_mn=False: _py_mma("f16", n, b_mn, a_mn),
                        _py_smem_desc,
                        _py_smem_desc_128b, _py_smem_desc_128b_mn, _py_sts4_at,
                        _py_pack_halves)
    return _compiled_ops()


# --- compiled intrinsics ------------------------------------------------------------------


@cache
def _compiled_ops() -> WgmmaOps:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def barrier_like(asm: str) -> Any:
        """An intrinsic with no operands: the instruction, kept in place (side effect and a
        memory clobber, so no load or store moves across it)."""

        @intrinsic
        def op(typingctx: Any) -> Any:
            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
                builder.asm(ir.FunctionType(ir.VoidType(), []), asm, "~{memory}", [],
                            side_effect=True)

            return types.void(), codegen

        return op

    fence = barrier_like("wgmma.fence.sync.aligned;")
    commit = barrier_like("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = barrier_like("fence.proxy.async.shared::cta;")

    def float_tuple(t: Any, what: str) -> int:
        if not isinstance(t, types.BaseTuple) or not all(isinstance(x, types.Float)
                                                         for x in t):
            raise TypingError(f"{what}: needs a tuple of floats, got {t}")
        return len(t)

    def through_asm(builder: Any, context: Any, tupty: Any, val: Any, count: int,
                    asm: str, extra: list, extra_constraints: list[str]) -> list:
        """Run ``asm`` with ``count`` f32 registers read and written in place ($0… outputs,
        tied to the first inputs), then ``extra`` operands; return the written registers."""
        items = [context.cast(builder, x, t, types.float32)
                 for x, t in zip(cgutils.unpack_tuple(builder, val, count=count), tupty)]
        constraints = (["=f"] * count + [str(q) for q in range(count)] + extra_constraints
                       + ["~{memory}"])
        ret = ir.LiteralStructType([f32] * count) if count > 1 else f32
        fty = ir.FunctionType(ret, [f32] * count + [x.type for x in extra])
        res = builder.asm(fty, asm, ",".join(constraints), items + extra, side_effect=True)
        return [builder.extract_value(res, q) for q in range(count)] if count > 1 else [res]

    @cache
    def wait(n: int) -> Any:
        @intrinsic
        def wait_group(typingctx: Any, acc: Any) -> Any:
            count = float_tuple(acc, f"wgmma wait({n})")
            sig = types.UniTuple(types.float32, count)(acc)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                out = through_asm(builder, context, sig.args[0], args[0], count,
                                  f"wgmma.wait_group.sync.aligned {n};", [], [])
                return context.make_tuple(builder, sig.return_type, out)

            return sig, codegen

        return wait_group

    @cache
    def mma(kind: str, n: int, b_mn: bool = False, a_mn: bool = False) -> Any:
        _check_mma(kind, n, b_mn, a_mn)
        regs = n // 2
        if kind == "tf32":
            opcode, tail = f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32", "1, 1"
        else:  # 16-bit inputs: scale-a, scale-b, then A's and B's K-major (0) or MN-major (1)
            opcode = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind}"
            tail = f"1, 1, {int(a_mn)}, {int(b_mn)}"
        dregs = ",".join(f"${q}" for q in range(regs))
        a, b, s = 2 * regs, 2 * regs + 1, 2 * regs + 2  # after the outputs and tied inputs
        asm = (f"{{ .reg .pred %p; setp.ne.b32 %p, ${s}, 0; "
               f"{opcode} {{{dregs}}}, ${a}, ${b}, %p, {tail}; }}")

        @intrinsic
        def mma_async(typingctx: Any, acc: Any, desc_a: Any, desc_b: Any,
                      scale_d: Any) -> Any:
            what = f"wgmma m64n{n} {kind}"
            if float_tuple(acc, what) != regs:
                raise TypingError(f"{what}: needs {regs} accumulators, got {acc}")
            if not all(isinstance(x, types.Integer) for x in (desc_a, desc_b, scale_d)):
                raise TypingError(f"{what}: descriptors and scale_d must be integers")
            sig = types.UniTuple(types.float32, regs)(acc, desc_a, desc_b, scale_d)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                _, ta, tb, ts = sig.args
                extra = [context.cast(builder, args[1], ta, types.uint64),
                         context.cast(builder, args[2], tb, types.uint64),
                         context.cast(builder, args[3], ts, types.int32)]
                out = through_asm(builder, context, sig.args[0], args[0], regs, asm, extra,
                                  ["l", "l", "r"])
                return context.make_tuple(builder, sig.return_type, out)

            return sig, codegen

        return mma_async

    def desc_codegen(context: Any, builder: Any, arrty: Any, arr: Any, offty: Any, off: Any,
                     lbo: Any, sbo: Any, mode: int) -> Any:
        """The descriptor of byte ``off`` of shared array ``arr``: address, LBO and SBO
        (i64 values) each >> 4 in their 14-bit fields, the swizzle mode in bits 62-63."""
        ary = context.make_array(arrty)(context, builder, value=arr)
        sptr = builder.addrspacecast(ary.data,
                                     ir.PointerType(ary.data.type.pointee, addrspace=3))
        addr = builder.add(builder.ptrtoint(sptr, i32),
                           context.cast(builder, off, offty, types.int32))

        def field(v: Any, shift: int) -> Any:  # (v >> 4) & 0x3FFF, placed at bit shift
            v = builder.zext(v, i64) if v.type != i64 else v
            v = builder.and_(builder.lshr(v, ir.Constant(i64, 4)), ir.Constant(i64, 0x3FFF))
            return builder.shl(v, ir.Constant(i64, shift)) if shift else v

        desc = builder.or_(builder.or_(field(addr, 0), field(lbo, 16)), field(sbo, 32))
        return builder.or_(desc, ir.Constant(i64, mode << 62)) if mode else desc

    def desc_with_strides(name: str, mode: int) -> Any:
        """The intrinsic ``name(arr, off, lbo, sbo) -> uint64``: the descriptor of byte
        ``off`` of shared array ``arr`` with both byte offsets given, in swizzle ``mode``."""

        @intrinsic
        def desc(typingctx: Any, arr: Any, off: Any, lbo: Any, sbo: Any) -> Any:
            if not isinstance(arr, types.Array) or not all(
                    isinstance(x, types.Integer) for x in (off, lbo, sbo)):
                raise TypingError(f"{name}: needs a shared array and integer offsets")
            sig = types.uint64(arr, off, lbo, sbo)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                arrty, offty, lboty, sboty = sig.args
                return desc_codegen(context, builder, arrty, args[0], offty, args[1],
                                    context.cast(builder, args[2], lboty, types.uint64),
                                    context.cast(builder, args[3], sboty, types.uint64),
                                    mode)

            return sig, codegen

        return desc

    smem_desc = desc_with_strides("smem_desc", 0)
    smem_desc_128b_mn = desc_with_strides("smem_desc_128b_mn", SWIZZLE_MODES["128B"])

    @intrinsic
    def smem_desc_128b(typingctx: Any, arr: Any, off: Any, sbo: Any) -> Any:
        if not isinstance(arr, types.Array) or not all(
                isinstance(x, types.Integer) for x in (off, sbo)):
            raise TypingError("smem_desc_128b: needs a shared array and integer offsets")
        sig = types.uint64(arr, off, sbo)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arrty, offty, sboty = sig.args
            return desc_codegen(context, builder, arrty, args[0], offty, args[1],
                                ir.Constant(i64, 16),
                                context.cast(builder, args[2], sboty, types.uint64),
                                SWIZZLE_MODES["128B"])

        return sig, codegen

    def as_i32(context: Any, builder: Any, v: Any, ty: Any) -> Any:
        """A 32-bit float or integer value as its 32 bits."""
        if isinstance(ty, types.Float):
            return builder.bitcast(context.cast(builder, v, ty, types.float32), i32)
        return context.cast(builder, v, ty, types.uint32)

    @intrinsic
    def sts4_at(typingctx: Any, arr: Any, off: Any, v0: Any, v1: Any, v2: Any,
                v3: Any) -> Any:
        vals = (v0, v1, v2, v3)
        if not isinstance(arr, types.Array) or not isinstance(off, types.Integer):
            raise TypingError("sts4_at: needs a shared array and an integer offset")
        if not all(isinstance(v, (types.Float, types.Integer)) and v.bitwidth == 32
                   for v in vals):
            raise TypingError(f"sts4_at: needs four 32-bit values, got {vals}")
        sig = types.void(arr, off, *vals)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            arrty, offty = sig.args[:2]
            ary = context.make_array(arrty)(context, builder, value=args[0])
            sptr = builder.addrspacecast(ary.data,
                                         ir.PointerType(ary.data.type.pointee, addrspace=3))
            addr = builder.add(builder.ptrtoint(sptr, i32),
                               context.cast(builder, args[1], offty, types.int32))
            words = [as_i32(context, builder, v, t) for v, t in zip(args[2:], sig.args[2:])]
            builder.asm(ir.FunctionType(ir.VoidType(), [i32] * 5),
                        "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}",
                        [addr, *words], side_effect=True)

        return sig, codegen

    @intrinsic
    def pack_halves(typingctx: Any, lo: Any, hi: Any) -> Any:
        for v in (lo, hi):
            if not (isinstance(v, (types.Float, types.Integer)) and v.bitwidth == 16):
                raise TypingError(f"pack_halves: needs 16-bit values, got {v}")
        sig = types.uint32(lo, hi)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            i16 = ir.IntType(16)

            def bits(v: Any) -> Any:
                return builder.zext(builder.bitcast(v, i16) if v.type != i16 else v, i32)

            return builder.or_(bits(args[0]),
                               builder.shl(bits(args[1]), ir.Constant(i32, 16)))

        return sig, codegen

    return WgmmaOps(fence, commit, wait, fence_proxy_async, lambda n: mma("tf32", n),
                    lambda n, b_mn=False, a_mn=False: mma("bf16", n, b_mn, a_mn),
                    lambda n, b_mn=False, a_mn=False: mma("f16", n, b_mn, a_mn), smem_desc,
                    smem_desc_128b,
                    smem_desc_128b_mn, sts4_at, pack_halves)


def compile_sm90a(pyfunc: Any, sig: tuple) -> str:
    """PTX for ``sm_90a`` of a kernel using these instructions (link it with
    ``-arch=sm_90a``). ``wgmma`` exists only on the architecture-specific target: plain
    ``sm_90`` PTX with it does not assemble. numba-cuda takes the arch suffix as a third
    element of the compute capability, and picks it by itself when it compiles for a
    device of compute capability 9.0 or above (``_ensure_cc`` in its codegen), so the same
    kernel also compiles when launched on an H100."""
    from numba.cuda import compile_ptx

    ptx, _ = compile_ptx(pyfunc, sig, cc=(9, 0, "a"))
    if "\n.target sm_90a" not in ptx:
        raise RuntimeError("numba-cuda did not write '.target sm_90a' for cc (9, 0, 'a')")
    return ptx


# --- a prototype GEMM: the building blocks in a k loop ------------------------------------

_GEMM = """
def wgmma_gemm(A, B, C):
    m, n, k_len = C.shape[0], C.shape[1], A.shape[1]
    sA = cuda.shared.array(SIZE, np.float32, alignment=ALIGN)
    sB = cuda.shared.array(SIZE, np.float32, alignment=ALIGN)
    t = cuda.threadIdx.x
    i0 = cuda.blockIdx.y * 64
    j0 = cuda.blockIdx.x * 64
    da = smem_desc(sA, 0, LBO, SBO)
    db = smem_desc(sB, 0, LBO, SBO)
    z = np.float32(0.0)
    acc = (#@ZEROS)
    for k0 in range(0, k_len, BK):
        for e in range(t, 64 * BK, 128):
            r = e // BK  # A: consecutive threads read consecutive k of one row
            c = e % BK
            i = i0 + r
            k = k0 + c
            sA[((r // 8) * SBO + (c // 4) * LBO + (r % 8) * 16 + (c % 4) * 4) // 4] = (
                to_tf32(A[i, k]) if i < m and k < k_len else z)
            c = e // 64  # B: consecutive threads read consecutive n of one row
            r = e % 64
            j = j0 + r
            k = k0 + c
            sB[((r // 8) * SBO + (c // 4) * LBO + (r % 8) * 16 + (c % 4) * 4) // 4] = (
                to_tf32(B[k, j]) if j < n and k < k_len else z)
        fence_proxy_async()
        cuda.syncthreads()
        fence()
#@STEPS
        commit()
        acc = wait0(acc)
        cuda.syncthreads()  # every warp's product has read the tiles before they change
    w = t // 32
    g = (t % 32) // 4
    q = t % 4
#@STORES
"""


@cache
def gemm_kernel(bk: int = 32) -> Any:
    """A prototype wgmma GEMM, C = A·B for 2-D float32 A (M×K), B (K×N), C (M×N), any M,
    N, K, in TF32 (inputs rounded to nearest): one warpgroup per 64×64 tile of C, grid
    (ceil(N/64), ceil(M/64)), 128 threads. Per ``bk``-deep slice of K the warpgroup copies
    the A and B tiles into shared memory in the no-swizzle K-major layout (LBO 128: the
    core matrices of one 8-row group along K are adjacent; SBO = bk/4 × 128), zero outside
    the matrices, then issues bk/8 ``mma_async`` whose descriptors step 256 bytes along K,
    and waits. Not a rung (no pipeline, no swizzle, no batch, strides or alpha/beta): it
    checks that the building blocks accumulate across a k loop, edges included, and shows
    the code a loop gives (the tests read its SASS)."""
    from numba import cuda

    from tilegemm.kernels.cuda._codegen import compile_source
    from tilegemm.kernels.cuda._tensorcore import tensorcore_ops

    if bk % 8 or not 8 <= bk <= 64:
        raise ValueError(f"gemm_kernel: bk={bk} must be a multiple of 8 in 8-64")
    ops = wgmma_ops()
    lbo, sbo = 128, bk // 4 * 128
    steps = [f"        acc = mma(acc, da + np.uint64({2 * s * lbo >> 4}), "
             f"db + np.uint64({2 * s * lbo >> 4}), 1)" for s in range(bk // 8)]
    stores = []
    for i in range(32):
        row, col = f"i0 + 16 * w + g + {8 * ((i // 2) % 2)}", f"j0 + {8 * (i // 4) + i % 2} + 2 * q"
        stores.append(f"    if {row} < m and {col} < n:\n        C[{row}, {col}] = acc[{i}]")
    # four 8-tuples joined: one 32-element tuple display becomes a list-to-tuple in
    # CPython 3.11's bytecode here, which numba-cuda's bytecode reader refuses
    zeros = ") + (".join([", ".join(["z"] * 8)] * 4)
    source = (_GEMM.replace("#@ZEROS", zeros).replace("#@STEPS", "\n".join(steps))
              .replace("#@STORES", "\n".join(stores)))
    namespace = {"cuda": cuda, "np": np, "BK": bk, "SIZE": 64 * bk, "ALIGN": shared_alignment(),
                 "LBO": lbo, "SBO": sbo,
                 "to_tf32": tensorcore_ops().to_tf32, "fence": ops.fence, "commit": ops.commit,
                 "wait0": ops.wait(0), "fence_proxy_async": ops.fence_proxy_async,
                 "smem_desc": ops.smem_desc, "mma": ops.mma_tf32(64)}
    return cuda.jit(compile_source(source, "wgmma_gemm", namespace))
