"""Tensor-core and asynchronous-copy instructions for Numba kernels, and their simulator
stand-ins.

numba-cuda has no tensor-core API, but a numba ``@intrinsic`` can emit any PTX instruction
through llvmlite's ``ir.InlineAsm``: ptxas then sees an ordinary ``mma``/``ldmatrix``/
``cp.async`` in the kernel's own PTX and schedules and allocates registers around it, so the
fragments stay in registers (linking a separately compiled CUDA C device function instead
leaves a real call, and the fragments go through local memory). The instructions:

- ``mma_tf32(a, b, c)``: ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``; ``a`` is a
  4-tuple and ``b`` a 2-tuple of float32 (the hardware uses their top 19 bits, the TF32
  part; round them first with ``to_tf32``), ``c`` and the result are 4-tuples of float32;
- ``mma_f16(a, b, c)`` / ``mma_bf16(a, b, c)``: ``mma.sync.aligned.m16n8k16.row.col.f32``
  with f16 or bf16 inputs; ``a`` is a 4-tuple and ``b`` a 2-tuple of uint32, each holding two
  16-bit values (the lower-indexed element in the low half), ``c``/result float32;
- ``to_tf32(x)``: ``cvt.rna.tf32.f32``, a float32 rounded to nearest (ties away from zero)
  to TF32, returned as a float32 whose low 13 mantissa bits are zero;
- ``ldmatrix_x4(arr, idx)``: ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``. ``arr`` is a
  16-bit shared array; lane ``l`` gives the address of row ``l % 8`` of 8×8 matrix ``l // 8``
  (8 consecutive elements from ``arr[idx]``, 16-byte aligned); the result is 4 uint32,
  register ``j`` holding elements ``2*(l%4)`` and ``2*(l%4)+1`` of row ``l // 4`` of matrix
  ``j``: exactly an A (x4) or two B (x2 + x2) fragments of ``m16n8k16``. On a 32-bit
  array (float32) each 8×8 b16 matrix is 8 rows of 4 values and register ``j`` is value
  ``l % 4`` of row ``l // 4``, returned as arr's type: exactly the A fragment of
  ``m16n8k8.tf32`` (matrices: rows 0–7 and 8–15 of k 0–3, then of k 4–7);
- ``ldmatrix_x4_trans(arr, idx)``: the same with ``.trans`` (16-bit only): register ``j``
  holds elements (row ``2*(l%4)``, col ``l // 4``) and (row ``2*(l%4)+1``, same col) of
  matrix ``j``; from a row-major k×n B tile that is the B fragment of ``m16n8k16``;
- ``cp_async16(dst, didx, src, sidx, nbytes)``: ``cp.async.cg.shared.global`` of 16 bytes,
  of which the first ``nbytes`` come from ``src[sidx]`` and the rest are zero (so a
  partial vector at an edge needs no branch; ``nbytes == 0`` reads nothing). Both addresses
  must be 16-byte aligned. ``cp_async4`` is the 4-byte ``cp.async.ca`` for unaligned data;
- ``cp_commit()``: ``cp.async.commit_group``; ``cp_wait(n)`` returns the function for
  ``cp.async.wait_group n`` (n is an immediate, so one function per n);
- ``ldmatrix_x4_at(arr, off)``, ``ldmatrix_x4_trans_at(arr, off)``, ``lds_at(w)(arr, off)``
  and ``cp_async16_at(dst, doff, src, sidx, soff, nbytes)``: the same instructions (``lds_at``:
  a ``w``-element shared load, ``ld.shared.v{w}``) addressed by offsets instead of index
  tuples: ``off``/``doff`` in bytes from the start of a shared array (its elements in
  row-major order), ``soff`` in elements from ``src``'s data pointer
  (``sum(i * stride / itemsize)`` of ``sidx``).
  A kernel keeps per-thread offsets and adds constants to them, so the shared addresses
  become a register plus an immediate (``LDSM.16.M88.4 R8, [R2+0x800]``) and a copy's source
  is one pointer bumped per k-tile, instead of rebuilding each address from an index tuple
  (the swizzle, the ``% STAGES``, 64-bit index arithmetic). Compiled, ``sidx`` is unused;
  the simulator stand-in checks that ``soff`` is ``sidx``'s offset and that shared offsets
  are in range, so simulator tests catch a wrong offset;
- ``cp_async16_ptr(dst, doff, src, sidx, ptr, nbytes)``: the same copy from the byte address
  ``ptr`` (``address(src)`` + byte offset of ``sidx``), so a kernel can bump one 64-bit
  address per k-tile; the simulator, where ``address`` is 0, checks ``ptr`` against ``sidx``;
- ``split_tf32(x)``: ``(big, small)`` for 3×TF32: ``big`` is ``x`` rounded to TF32 (to
  nearest, ties away, low 13 bits cleared: half a TF32 ulp added to the bits, then masked)
  and ``small = x - big`` (exact) rounded for the tensor core as ``round_tf32_at`` rounds
  (low bits unspecified). Five instructions where ``to_tf32`` twice and the subtraction
  take seven. A NaN ``x`` gives a NaN ``small`` (its ``big`` may be anything), so the
  product stays NaN; an infinite ``x`` gives ``big = x`` and a NaN ``small``, as before;
- ``round_tf32_at(arr, off)``: the 4 float32 at byte offset ``off`` (16-byte aligned) of
  a shared array rounded in place to TF32 for the tensor core: ``ld.shared.v4``, per value
  ``cvt.rna.tf32.f32`` as ptxas expands it (finite: half a TF32 ulp added to the bits), then
  ``st.shared.v4``. The low 13 bits are left unspecified, as ptxas leaves them in a
  ``cvt.rna.tf32.f32`` result that only an mma reads (it ignores them), so only an mma may
  read the stored values; the stand-in stores them cleared;
- ``split_tf32_at(arr, off, small_off)``: ``split_tf32`` of the 4 float32 at byte offset
  ``off`` (16-byte aligned) of a shared array, in place: ``big`` stored back at ``off``,
  ``small`` at ``small_off`` (``ld.shared.v4``, 5 instructions a value, two
  ``st.shared.v4``). 3×TF32 splits each value once per block this way, where splitting
  each fragment value as it is read does it once per warp that reads it; only an mma may
  read the stored values (their low 13 bits are unspecified, as for ``round_tf32_at``);
- ``load_f32(arr, idx)`` / ``store_f32(arr, idx, x)``: an element of a float32, float16 or
  bfloat16 array read as, or written from, a float32, converted by the array's type at
  compile time (so one epilogue serves every output dtype). bfloat16 arrays are 16-bit
  integer arrays holding the bit patterns (numba has no bfloat16 array type); writing one
  rounds to nearest even (``cvt.rn.bf16.f32``), NaN staying NaN;
- ``load2_f32(arr, idx)`` / ``store2_f32(arr, idx, x0, x1)``: the same for the two adjacent
  elements ``idx`` and ``idx`` + 1 along the last axis, as one access of twice the element
  size (a float32 pair: ``ld/st.global.v2.f32``, ``STG.E.64``; a 16-bit pair: one 32-bit
  access). The caller guarantees that both elements exist, that the last axis is
  contiguous and that the pair's address is a multiple of its size (a misaligned vector
  access is a hardware fault); the stand-ins check all three;
- ``pair_aligned(arr, idx)``: whether the pair at ``idx`` may be accessed that way: the
  last axis contiguous and the pair's address a multiple of the pair's size. Asked per
  pair, from the address the access itself computes (so it costs a mask and a compare, and
  nothing that LLVM could hoist out of the tile loop to hold across the k loop): C may be
  any strided view, and with a row stride of an odd number of elements (a contiguous C of
  odd N) every other row is misaligned. The stand-in asks the real data pointer (a traced
  array's address in the tracer's space), not ``_access.address``'s 0, so simulator runs of
  a view with a misaligned start take the one-value path as the GPU would.

The fragment layouts are those of the PTX ISA ("Matrix Fragments for mma.m16n8k8" and
"for mma.m16n8k16 with floating point type"), written out as the ``*_layout`` functions
below; the simulator stand-ins are built on the same functions, and
tests/test_cuda_tensorcore.py checks both against entries transcribed from the ISA tables.

Under numba's CUDA simulator the instructions cannot execute, so :func:`tensorcore_ops`
returns Python emulations with the same signatures. A warp-wide instruction is emulated
warp-wide: every lane deposits its fragment in a per-warp scratch, a barrier, then one
lane rebuilds the warp's whole A, B and C from the layout and computes D = A·B + C once for
the warp (in float64 from TF32-truncated or 16-bit inputs, rounded to float32), and each
lane returns its own part (:func:`compute_once`).
``cp.async`` is emulated faithfully in its ordering: a copy is queued per thread and lands
only at the ``cp_wait`` that retires its group, so a kernel that reads shared memory before
waiting reads stale data in the simulator too.

The memory tracer (``tilegemm explain``, :mod:`tilegemm.analysis.trace`) passes arrays that
record their accesses. The stand-ins report to such an array each access the compiled
instruction makes, per thread and at its width (a ``cp.async``: its source bytes read and
its 16 or 4 bytes written to shared memory, at issue; an ``ldmatrix``: the 16-byte row
this lane addresses; ``lds_at(w)``: ``w`` elements; ``round_tf32_at``/``split_tf32_at``:
their 16-byte shared loads and stores), then work on the untraced data (:func:`untraced`),
so the stand-in's own element copies are not counted. Nothing here changes the compiled
instructions.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from tilegemm.kernels.cuda._access import check_index, item_pointer


class TensorCoreOps(NamedTuple):
    mma_tf32: Any
    mma_f16: Any
    mma_bf16: Any
    to_tf32: Any
    ldmatrix_x4: Any
    ldmatrix_x4_trans: Any
    cp_async16: Any
    cp_async4: Any
    cp_commit: Any
    cp_wait: Any  # cp_wait(n) -> the function for cp.async.wait_group n
    load_f32: Any
    store_f32: Any
    ldmatrix_x4_at: Any
    ldmatrix_x4_trans_at: Any
    lds_at: Any  # lds_at(w) -> the function for a w-element shared load
    cp_async16_at: Any
    cp_async16_ptr: Any
    round_tf32_at: Any
    split_tf32: Any
    split_tf32_at: Any
    load2_f32: Any
    store2_f32: Any
    pair_aligned: Any


# --- fragment layouts (PTX ISA), shared by the emulations and the tests --------------------
# g = lane // 4 ("groupID"), t = lane % 4 ("threadID_in_group").


def a_tf32_layout(lane: int, i: int) -> tuple[int, int]:
    """(row, col) in the 16×8 A of m16n8k8.tf32 held by register ``i`` (0–3) of ``lane``."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i % 2), t + 4 * (i // 2)


def b_tf32_layout(lane: int, i: int) -> tuple[int, int]:
    """(row=k, col=n) in the 8×8 B of m16n8k8.tf32 held by register ``i`` (0–1)."""
    g, t = lane // 4, lane % 4
    return t + 4 * i, g


def c_layout(lane: int, i: int) -> tuple[int, int]:
    """(row, col) in the 16×8 C/D (float32) of m16n8k8 and m16n8k16, register ``i`` (0–3)."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def a_16bit_layout(lane: int, i: int) -> tuple[int, int]:
    """(row, col) in the 16×16 A of m16n8k16 of 16-bit element ``i`` (0–7; register i//2,
    half i%2 with the even element in the low half)."""
    g, t = lane // 4, lane % 4
    return g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)


def b_16bit_layout(lane: int, i: int) -> tuple[int, int]:
    """(row=k, col=n) in the 16×8 B of m16n8k16 of 16-bit element ``i`` (0–3)."""
    g, t = lane // 4, lane % 4
    return 2 * t + i % 2 + 8 * (i // 2), g


def ldmatrix_layout(lane: int, j: int, h: int) -> tuple[int, int, int]:
    """(matrix, row, col) of half ``h`` of register ``j`` of ``lane`` after ldmatrix.x4."""
    return j, lane // 4, 2 * (lane % 4) + h


def ldmatrix_trans_layout(lane: int, j: int, h: int) -> tuple[int, int, int]:
    """(matrix, row, col) of half ``h`` of register ``j`` after ldmatrix.x4.trans."""
    return j, 2 * (lane % 4) + h, lane // 4


# --- NumPy models of the arithmetic ---------------------------------------------------------


def tf32_round(x: Any) -> np.ndarray:
    """float32 → TF32 rounded to nearest, ties away from zero (``cvt.rna.tf32.f32``)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


def tf32_truncate(x: Any) -> np.ndarray:
    """The TF32 part the tensor core reads from a float32 register (low 13 bits dropped)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return (bits & np.uint32(0xFFFFE000)).view(np.float32)


def sum_to_float32(x: np.ndarray) -> np.ndarray:
    """A tensor core's float32 result of the exact sum ``x`` (float64): rounded toward zero.

    The tensor cores of A100 and later normalize their sums by truncation, not to nearest
    (Fasi et al., "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021; and on an
    H100/H200 here, 2026-11-26: 3×TF32 accumulated over all of K in the tensor core lost
    to SGEMM by 12× at 4096³). The emulations round so, that the simulator shows what the
    hardware does to a long accumulation; the hardware also truncates while aligning the
    products, which this leaves out (its error is at least this one). NaN and infinities
    pass through; a finite sum beyond float32's range gives its largest finite value."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.asarray(x, np.float64).astype(np.float32)
        away = np.abs(r.astype(np.float64)) > np.abs(x)  # rounded away from zero
    r[away] = np.nextafter(r[away], np.float32(0))
    return r


def bf16_bits(x: Any) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays NaN
    (a quiet NaN of the same sign, as ``cvt.rn.bf16.f32`` gives)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x7FC0, rounded).astype(np.uint16)


def bf16_value(bits: Any) -> np.ndarray:
    """bfloat16 bit patterns (uint16) → float32."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def _half_values(words: Any, kind: str) -> np.ndarray:
    """Two 16-bit values (low half first) of each uint32 in ``words`` as float64."""
    w = np.asarray(words, dtype=np.uint32)
    halves = np.stack([w & 0xFFFF, w >> 16], axis=-1).astype(np.uint16)
    if kind == "f16":
        return halves.view(np.float16).astype(np.float64)
    return bf16_value(halves).astype(np.float64)


# --- simulator emulations -------------------------------------------------------------------

_LOCK = threading.Lock()
_TIMEOUT = 120.0  # seconds a lane waits for its warp before the emulation gives up
_POLL = 0.1  # seconds between a waiting lane's looks at its block's abort flag


class SimBarrier:
    """A barrier for ``parties`` simulator threads that gives up at once when the block is
    aborted.

    When one thread of a block raises (an index past a shared array, say), numba's simulator
    sets ``abort`` on every thread of the block and reports that exception; a lane waiting
    here for the failed one must then stop too, instead of sitting out ``threading.Barrier``'s
    timeout (120 s per negative-control launch). ``timeout`` still bounds a wait in which no
    thread failed but one never arrives (a kernel whose lanes diverge at a warp-wide
    instruction), and raises ``threading.BrokenBarrierError`` as ``threading.Barrier`` does.
    The simulator can also miss a failed thread (it drops threads that have ended before
    looking at their exception), and then only the timeout ends the wait.
    """

    def __init__(self, parties: int, timeout: float | None = None) -> None:
        self.parties = parties
        self.timeout = _TIMEOUT if timeout is None else timeout
        self._cond = threading.Condition()
        self._arrived = 0
        self._generation = 0

    def wait(self, last: Callable[[], None] | None = None) -> None:
        """Wait until all ``parties`` threads have called this; the last to arrive runs
        ``last`` first (if given), while every other thread still waits."""
        me = threading.current_thread()
        with self._cond:
            generation = self._generation
            self._arrived += 1
            if self._arrived == self.parties:
                try:
                    if last is not None:
                        last()
                finally:
                    self._arrived = 0
                    self._generation += 1
                    self._cond.notify_all()
                return
            waited = 0.0
            while generation == self._generation:
                if getattr(me, "abort", False):
                    raise RuntimeError("another thread of this block failed")
                if waited >= self.timeout:
                    raise threading.BrokenBarrierError(
                        f"{self.parties - self._arrived} of {self.parties} threads never "
                        f"arrived within {self.timeout:.0f} s")
                self._cond.wait(_POLL)
                waited += _POLL


class CollectiveSlot:
    """The scratch of one warp (or warpgroup) for :func:`compute_once`."""

    def __init__(self, parties: int) -> None:
        self.values: list[Any] = [None] * parties
        self.result: tuple[bool, Any] = (True, None)
        self.barrier = SimBarrier(parties)


def compute_once(slot: CollectiveSlot, index: int, value: Any,
                 fn: Callable[[list[Any]], Any]) -> Any:
    """Simulator only: each of the slot's threads gives ``value`` (``index``: its place);
    the last to arrive computes ``fn(all the values)`` and every thread gets that result.
    What a warp-wide instruction produces is thus computed once, not by each of its threads
    (an m16n8k16 product rebuilt by every lane made the tensor-core tests 32 times the
    work). An exception in ``fn`` reaches every thread.

    One barrier, whose last arrival computes before it opens. The slot is safe to reuse
    without a second one: the next result is made only when every thread has arrived at
    the next call, that is after each has read this one. Each opening wakes the group's
    threads one by one: with three barriers (values given, result made, result read) a
    3xTF32 product of rung wgmma on the simulator took 19.1 s instead of 12.3 (2-vCPU Zen
    3)."""
    slot.values[index] = value

    def make() -> None:
        try:
            slot.result = (True, fn(list(slot.values)))
        except Exception as exc:  # noqa: BLE001 - handed to every thread below
            slot.result = (False, exc)

    slot.barrier.wait(make)
    ok, out = slot.result
    if not ok:
        raise out
    return out


def collective_compute(parties: int, what: str, value: Any,
                       fn: Callable[[list[Any]], Any]) -> Any:
    """Simulator only: :func:`compute_once` over the calling thread's group of ``parties``
    threads (32: its warp; 128: its warpgroup), whose scratch is kept on the simulator's
    block manager. Needs blocks of whole groups, every thread arriving, as the
    ``.sync.aligned`` instructions it stands for do (``what`` names them in the error)."""
    t = threading.current_thread()
    manager = t._manager  # type: ignore[attr-defined]
    if math.prod(manager._block_dim) % parties:
        raise RuntimeError(f"{what} need blocks of whole groups of {parties} threads")
    tid = t.thread_id  # type: ignore[attr-defined]
    key = (tuple(t.blockIdx), parties, tid // parties)  # type: ignore[attr-defined]
    with _LOCK:
        slots = manager.__dict__.setdefault("_tilegemm_collectives", {})
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = CollectiveSlot(parties)
    return compute_once(slot, tid % parties, value, fn)


def warp_exchange(value: Any) -> list[Any]:
    """Simulator only: every lane of the calling warp gives ``value``; each gets all 32."""
    return warp_compute(value, lambda values: values)


def warp_compute(value: Any, fn: Callable[[list[Any]], Any]) -> Any:
    """Simulator only: every lane of the calling warp gives ``value``; ``fn`` of the 32
    values, computed once for the warp, is returned to each lane (:func:`compute_once`)."""
    return collective_compute(32, "warp-wide tensor-core instructions", value, fn)


def _emulate_mma(a: Any, b: Any, c: Any, k: int,
                 operands: Callable[[int, Any, Any, np.ndarray, np.ndarray], None]
                 ) -> tuple[np.float32, ...]:
    """This lane's result of a warp's m16n8k``k`` mma: the 32 lanes' fragments gathered,
    ``operands(lane, fa, fb, A, B)`` places a lane's A and B values in A (16×k) and B
    (k×8), the accumulators go by ``c_layout``, and D = A·B + C is rounded to float32 as the
    tensor core rounds (:func:`sum_to_float32`)."""
    def product(frags: list[Any]) -> np.ndarray:  # once for the warp
        A, B, C = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
        for lane, (fa, fb, fc) in enumerate(frags):
            operands(lane, fa, fb, A, B)
            for i in range(4):
                C[c_layout(lane, i)] = fc[i]
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf pass through,
            return sum_to_float32(A @ B + C)  # silently, as on the tensor cores

    D = warp_compute((tuple(a), tuple(b), tuple(c)), product)
    lane = threading.current_thread().thread_id % 32  # type: ignore[attr-defined]
    return tuple(D[c_layout(lane, i)] for i in range(4))


def _py_mma_tf32(a: Any, b: Any, c: Any) -> tuple[np.float32, ...]:
    def operands(lane: int, fa: Any, fb: Any, A: np.ndarray, B: np.ndarray) -> None:
        ta, tb = tf32_truncate(np.array(fa, np.float32)), tf32_truncate(np.array(fb, np.float32))
        for i in range(4):
            A[a_tf32_layout(lane, i)] = ta[i]
        for i in range(2):
            B[b_tf32_layout(lane, i)] = tb[i]

    return _emulate_mma(a, b, c, 8, operands)


def _py_mma_16bit(kind: str) -> Any:
    def operands(lane: int, fa: Any, fb: Any, A: np.ndarray, B: np.ndarray) -> None:
        va, vb = _half_values(fa, kind).ravel(), _half_values(fb, kind).ravel()
        for i in range(8):
            A[a_16bit_layout(lane, i)] = va[i]
        for i in range(4):
            B[b_16bit_layout(lane, i)] = vb[i]

    def mma(a: Any, b: Any, c: Any) -> tuple[np.float32, ...]:
        return _emulate_mma(a, b, c, 16, operands)

    mma.__name__ = f"mma_{kind}"
    return mma


def _py_to_tf32(x: Any) -> np.float32:
    return np.float32(tf32_round(np.float32(x)))


def _traced(arr: Any) -> bool:
    """Whether ``arr`` is one of the memory tracer's arrays. Asked of the type: the
    simulator's in-kernel arrays answer any unknown attribute with an IndexError."""
    return hasattr(type(arr), "trace_access")


def untraced(arr: Any) -> Any:
    """The plain array behind a traced one (the tracer's), else ``arr`` itself."""
    return arr.untraced if _traced(arr) else arr


def note_access(arr: Any, offset: int, size: int, store: bool) -> None:
    """Report one ``size``-byte access at byte ``offset`` of ``arr`` to the memory tracer,
    when ``arr`` is one of its arrays (a no-op for any other array)."""
    if _traced(arr):
        arr.trace_access(int(offset), int(size), store)


def note_access_at(arr: Any, idx: Any, size: int, store: bool) -> None:
    """:func:`note_access` of the access at element ``idx`` of ``arr``."""
    if _traced(arr):
        offset = sum(int(i) * int(st) for i, st in zip(idx, arr.strides))
        arr.trace_access(offset, int(size), store)


def _row(arr: Any, idx: tuple[int, ...], count: int) -> np.ndarray:
    head, last = tuple(int(i) for i in idx[:-1]), int(idx[-1])
    return np.array([arr[head + (last + q,)] for q in range(count)])


def _flat(arr: Any, off: Any, count: int, what: str) -> np.ndarray:
    """Simulator: ``count`` elements of shared ``arr`` from byte offset ``off`` (row-major)."""
    arr = untraced(arr)
    if int(off) % arr.dtype.itemsize:
        raise AssertionError(f"{what}: byte offset {off} is not a whole element")
    flat, off = arr.reshape(-1), int(off) // arr.dtype.itemsize
    if off < 0 or off + count > flat.size:
        raise IndexError(f"{what}: offset {off} (+{count}) outside a shared array of "
                         f"{flat.size} elements")
    return flat[off:off + count]


def _ldmatrix_rows(arr: Any, row: np.ndarray) -> tuple[Any, ...]:
    if arr.dtype.itemsize not in (2, 4):
        raise TypeError("ldmatrix_x4: needs a 16- or 32-bit shared array")
    lane = threading.current_thread().thread_id % 32  # type: ignore[attr-defined]
    if arr.dtype.itemsize == 4:
        rows32 = warp_exchange(np.asarray(row, arr.dtype))
        return tuple(rows32[8 * j + lane // 4][lane % 4] for j in range(4))
    rows = warp_exchange(np.asarray(row, arr.dtype).view(np.uint16))
    out = []
    for j in range(4):
        m, r, c = ldmatrix_layout(lane, j, 0)
        row16 = rows[8 * m + r]
        out.append(np.uint32(int(row16[c]) | (int(row16[c + 1]) << 16)))
    return tuple(out)


def _ldmatrix_trans_rows(arr: Any, row: np.ndarray) -> tuple[Any, ...]:
    if arr.dtype.itemsize != 2:
        raise TypeError("ldmatrix_x4_trans: needs a 16-bit shared array")
    lane = threading.current_thread().thread_id % 32  # type: ignore[attr-defined]
    rows = warp_exchange(np.asarray(row, arr.dtype).view(np.uint16))
    out = []
    for j in range(4):
        halves = []
        for h in range(2):
            m, r, c = ldmatrix_trans_layout(lane, j, h)
            halves.append(int(rows[8 * m + r][c]))
        out.append(np.uint32(halves[0] | (halves[1] << 16)))
    return tuple(out)


# ldmatrix .x4: each lane gives the address of one 16-byte row (lanes 8i..8i+7: the rows
# of matrix i), so the tracer sees one 16-byte shared load per lane.
LDMATRIX_ROW_BYTES = 16


def _py_ldmatrix_x4(arr: Any, idx: Any) -> tuple[Any, ...]:
    note_access_at(arr, idx, LDMATRIX_ROW_BYTES, False)
    arr = untraced(arr)
    return _ldmatrix_rows(arr, _row(arr, idx, 16 // arr.dtype.itemsize))


def _py_ldmatrix_x4_trans(arr: Any, idx: Any) -> tuple[Any, ...]:
    note_access_at(arr, idx, LDMATRIX_ROW_BYTES, False)
    arr = untraced(arr)
    return _ldmatrix_trans_rows(arr, _row(arr, idx, 8))


def _py_ldmatrix_x4_at(arr: Any, off: Any) -> tuple[Any, ...]:
    count = 16 // arr.dtype.itemsize
    row = _flat(arr, off, count, "ldmatrix_x4_at").copy()
    note_access(arr, off, LDMATRIX_ROW_BYTES, False)
    return _ldmatrix_rows(untraced(arr), row)


def _py_ldmatrix_x4_trans_at(arr: Any, off: Any) -> tuple[Any, ...]:
    row = _flat(arr, off, 8, "ldmatrix_x4_trans_at").copy()
    note_access(arr, off, LDMATRIX_ROW_BYTES, False)
    return _ldmatrix_trans_rows(untraced(arr), row)


@cache
def _py_lds_at(w: int) -> Any:
    def lds_at(arr: Any, off: Any) -> tuple[Any, ...]:
        if int(off) % (w * arr.dtype.itemsize):
            raise AssertionError(f"lds_at({w}): byte offset {off} is not {w}-element aligned")
        values = tuple(_flat(arr, off, w, f"lds_at({w})").copy())
        note_access(arr, off, w * arr.dtype.itemsize, False)
        return values

    return lds_at


class _CopyQueue(threading.local):
    def __init__(self) -> None:
        self.open: list[Any] = []
        self.groups: list[list[Any]] = []


_copies = _CopyQueue()


def _queue_copy(dst: Any, didx: Any, src: Any, sidx: Any, size: int, nbytes: Any) -> None:
    """Queue one ``size``-byte copy (``nbytes`` from ``src[sidx]``, the rest zero) into
    ``dst`` from ``didx``, reported to the tracer as its global read and its shared write."""
    if dst.dtype.itemsize != src.dtype.itemsize:
        raise TypeError("cp_async: source and destination element sizes differ")
    note_access_at(src, sidx, int(nbytes), False)  # nbytes 0: reads nothing
    note_access_at(dst, didx, size, True)
    dst, src = untraced(dst), untraced(src)
    count = size // dst.itemsize
    valid = int(nbytes) // dst.itemsize
    values = np.zeros(count, dst.dtype)
    if valid:
        values[:valid] = _row(src, sidx, valid)  # read at issue: global data is constant
    _copies.open.append((dst, tuple(int(i) for i in didx), values))


def _py_cp_async(size: int) -> Any:
    def cp_async(dst: Any, didx: Any, src: Any, sidx: Any, nbytes: Any) -> None:
        _queue_copy(dst, didx, src, sidx, size, nbytes)

    cp_async.__name__ = f"cp_async{size}"
    return cp_async


def _py_cp_async16_at(dst: Any, doff: Any, src: Any, sidx: Any, soff: Any,
                      nbytes: Any) -> None:
    isz = src.dtype.itemsize
    expect = sum(int(i) * (st // isz) for i, st in zip(sidx, src.strides))
    if int(soff) != expect:
        raise AssertionError(f"cp_async16_at: offset {soff} is not that of index {sidx} "
                             f"({expect})")
    if int(doff) % 16:
        raise AssertionError(f"cp_async16_at: shared offset {doff} is not 16-byte aligned")
    _flat(dst, doff, 16 // dst.dtype.itemsize, "cp_async16_at")  # range check
    # the traced array is shared memory as the kernel declared it; the copy is by offset
    note_access(dst, doff, 16, True)
    note_access_at(src, sidx, int(nbytes), False)
    flat = untraced(dst).reshape(-1)
    _queue_copy(flat, (int(doff) // flat.itemsize,), untraced(src), sidx, 16, nbytes)


def _py_cp_async16_ptr(dst: Any, doff: Any, src: Any, sidx: Any, ptr: Any,
                       nbytes: Any) -> None:
    isz = src.dtype.itemsize
    if int(ptr) % isz:
        raise AssertionError(f"cp_async16_ptr: address {ptr} is not element-aligned")
    _py_cp_async16_at(dst, doff, src, sidx, int(ptr) // isz, nbytes)  # address(src) == 0


def _py_split_tf32(x: Any) -> tuple[Any, Any]:
    """The big and small TF32 parts of float32 ``x`` (a value, or an array of them)."""
    big = np.float32(tf32_round(np.float32(x)))
    with np.errstate(invalid="ignore"):
        return big, np.float32(tf32_round(np.float32(x) - big))


def _py_round_tf32_at(arr: Any, off: Any) -> None:
    if arr.dtype != np.float32 or int(off) % 16:
        raise AssertionError("round_tf32_at: needs float32 and a 16-byte aligned offset")
    v = _flat(arr, off, 4, "round_tf32_at")
    note_access(arr, off, 16, False)  # ld.shared.v4, then st.shared.v4 to the same place
    note_access(arr, off, 16, True)
    v[:] = tf32_round(v)


def _py_split_tf32_at(arr: Any, off: Any, small_off: Any) -> None:
    if arr.dtype != np.float32 or int(off) % 16 or int(small_off) % 16:
        raise AssertionError("split_tf32_at: needs float32 and 16-byte aligned offsets")
    v = _flat(arr, off, 4, "split_tf32_at")
    small = _flat(arr, small_off, 4, "split_tf32_at (small part)")
    note_access(arr, off, 16, False)  # ld.shared.v4, then two st.shared.v4
    note_access(arr, off, 16, True)
    note_access(arr, small_off, 16, True)
    v[:], small[:] = _py_split_tf32(np.array(v))  # all four at once (a copy: v is written)


def _py_cp_commit() -> None:
    _copies.groups.append(_copies.open)
    _copies.open = []


@cache
def _py_cp_wait(n: int) -> Any:
    def cp_wait() -> None:
        keep = len(_copies.groups) - n
        for group in _copies.groups[:max(keep, 0)]:
            for dst, didx, values in group:
                head, last = didx[:-1], didx[-1]
                for q, v in enumerate(values):
                    dst[head + (last + q,)] = v
        _copies.groups = _copies.groups[max(keep, 0):]

    return cp_wait


def _py_load_f32(arr: Any, idx: Any) -> np.float32:
    v = arr[idx]
    if arr.dtype.kind in "iu":  # bfloat16 bit patterns
        return np.float32(bf16_value(np.uint16(int(v) & 0xFFFF)))
    return np.float32(v)


def _py_store_f32(arr: Any, idx: Any, x: Any) -> None:
    if arr.dtype.kind in "iu":
        arr[idx] = bf16_bits(np.float32(x)).astype(arr.dtype)
    else:
        arr[idx] = np.float32(x)  # NumPy rounds to nearest even into float16


def _pair_offset(arr: Any, idx: Any, what: str) -> int:
    """Simulator: the byte offset of the pair at ``idx`` from ``arr``'s start, after the
    checks the compiled access cannot make: both elements inside the array, the last axis
    contiguous, and the pair's address (the data pointer + offset) a multiple of its size.
    A kernel that takes the pair path where it must not fails here, as the GPU would fault
    (or, with a non-contiguous last axis, write the wrong element)."""
    isz, last = arr.dtype.itemsize, len(idx) - 1  # (the simulator's shape tuples take
    # no negative index)
    cols, step = int(arr.shape[last]), int(arr.strides[last])
    if not 0 <= int(idx[last]) < cols - 1:
        raise IndexError(f"{what}: the pair at column {int(idx[last])} is not inside the "
                         f"{cols} columns")
    if step != isz:
        raise AssertionError(f"{what}: the last axis has stride {step}, not {isz} (the "
                             f"pair is not contiguous)")
    offset = sum(int(i) * int(st) for i, st in zip(idx, arr.strides))
    if (_py_data_address(arr) + offset) % (2 * isz):
        raise AssertionError(f"{what}: the pair at {tuple(int(i) for i in idx)} is not "
                             f"{2 * isz}-byte aligned")
    return offset


def _pair_index(idx: Any, q: int) -> tuple[int, ...]:
    return tuple(int(i) for i in idx[:-1]) + (int(idx[-1]) + q,)


def _py_load2_f32(arr: Any, idx: Any) -> tuple[np.float32, np.float32]:
    offset = _pair_offset(arr, idx, "load2_f32")
    note_access(arr, offset, 2 * arr.dtype.itemsize, False)
    plain = untraced(arr)
    return _py_load_f32(plain, _pair_index(idx, 0)), _py_load_f32(plain, _pair_index(idx, 1))


def _py_store2_f32(arr: Any, idx: Any, x0: Any, x1: Any) -> None:
    offset = _pair_offset(arr, idx, "store2_f32")
    note_access(arr, offset, 2 * arr.dtype.itemsize, True)
    plain = untraced(arr)
    _py_store_f32(plain, _pair_index(idx, 0), x0)
    _py_store_f32(plain, _pair_index(idx, 1), x1)


def _py_pair_aligned(arr: Any, idx: Any) -> bool:
    last = len(idx) - 1
    isz = arr.dtype.itemsize
    offset = sum(int(i) * int(st) for i, st in zip(idx, arr.strides))
    return (int(arr.strides[last]) == isz
            and (_py_data_address(arr) + offset) % (2 * isz) == 0)


def _py_data_address(arr: Any) -> int:
    """The data pointer the simulator's array stands for: a traced array's address in the
    tracer's space (256-byte aligned allocations, views offset from them), else the host
    array's own (NumPy aligns allocations to 16 bytes at least)."""
    if _traced(arr):
        return int(arr.base)
    host = getattr(arr, "_ary", arr)  # the simulator's device array wraps a NumPy array
    return int(np.asarray(host).__array_interface__["data"][0])


@cache
def tensorcore_ops() -> TensorCoreOps:
    """The instructions for the current mode (real compilation or the simulator)."""
    from tilegemm import simulator

    if simulator.enabled():
        return TensorCoreOps(_py_mma_tf32, _py_mma_16bit("f16"), _py_mma_16bit("bf16"),
                             _py_to_tf32, _py_ldmatrix_x4, _py_ldmatrix_x4_trans,
                             _py_cp_async(16), _py_cp_async(4),
                             _py_cp_commit, _py_cp_wait, _py_load_f32, _py_store_f32,
                             _py_ldmatrix_x4_at, _py_ldmatrix_x4_trans_at, _py_lds_at,
                             _py_cp_async16_at, _py_cp_async16_ptr, _py_round_tf32_at,
                             _py_split_tf32, _py_split_tf32_at, _py_load2_f32,
                             _py_store2_f32, _py_pair_aligned)
    return _compiled_ops()


# --- compiled intrinsics --------------------------------------------------------------------


@cache
def _compiled_ops() -> TensorCoreOps:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def tuple_of(t: Any, n: int, kind: Any, what: str) -> None:
        if (not isinstance(t, types.BaseTuple) or len(t) != n
                or not all(isinstance(x, kind) for x in t)):
            raise TypingError(f"{what}: needs a tuple of {n} {kind.__name__} values, got {t}")

    def unpack(context: Any, builder: Any, tupty: Any, val: Any, to: Any, llty: Any) -> list:
        items = cgutils.unpack_tuple(builder, val, count=len(tupty))
        out = []
        for x, t in zip(items, tupty):
            x = context.cast(builder, x, t, to)
            out.append(builder.bitcast(x, llty) if x.type != llty else x)
        return out

    def mma_intrinsic(opcode: str, na: int, nb: int, a_kind: Any, a_type: Any) -> Any:
        # D (4 × f32) = A·B + C; A, B as 32-bit registers ("r"), C, D as "f".
        asm = (f"{opcode} {{$0,$1,$2,$3}}, {{{','.join(f'${4 + i}' for i in range(na))}}}, "
               f"{{{','.join(f'${4 + na + i}' for i in range(nb))}}}, "
               f"{{{','.join(f'${4 + na + nb + i}' for i in range(4))}}};")
        constraints = ",".join(["=f"] * 4 + ["r"] * (na + nb) + ["f"] * 4)
        fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * (na + nb) + [f32] * 4)

        @intrinsic
        def mma(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
            tuple_of(a, na, a_kind, opcode)
            tuple_of(b, nb, a_kind, opcode)
            tuple_of(c, 4, types.Float, opcode)
            sig = types.UniTuple(types.float32, 4)(a, b, c)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                ta, tb, tc = sig.args
                ops = (unpack(context, builder, ta, args[0], a_type, i32)
                       + unpack(context, builder, tb, args[1], a_type, i32)
                       + unpack(context, builder, tc, args[2], types.float32, f32))
                res = builder.asm(fty, asm, constraints, ops, side_effect=False)
                items = [builder.extract_value(res, q) for q in range(4)]
                return context.make_tuple(builder, sig.return_type, items)

            return sig, codegen

        return mma

    mma_tf32 = mma_intrinsic("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 4, 2,
                             types.Float, types.float32)
    mma_f16 = mma_intrinsic("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 4, 2,
                            types.Integer, types.uint32)
    mma_bf16 = mma_intrinsic("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 4, 2,
                             types.Integer, types.uint32)

    @intrinsic
    def to_tf32(typingctx: Any, x: Any) -> Any:
        if not isinstance(x, types.Float):
            raise TypingError(f"to_tf32: needs a float, got {x}")
        sig = types.float32(x)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            bits = builder.asm(ir.FunctionType(i32, [f32]), "cvt.rna.tf32.f32 $0, $1;",
                               "=r,f", [v], side_effect=False)
            return builder.bitcast(bits, f32)

        return sig, codegen

    def shared_address(builder: Any, ptr: Any) -> Any:
        """A generic pointer into shared memory as the 32-bit shared-window address."""
        sptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, addrspace=3))
        return builder.ptrtoint(sptr, i32)

    def ldmatrix_result(what: str, trans: bool, arr: Any) -> Any:
        """The tuple type an ldmatrix of ``arr`` returns: four 32-bit registers (16-bit pairs
        as uint32); refuses element widths the instruction cannot move."""
        widths = (16,) if trans else (16, 32)
        if arr.dtype.bitwidth not in widths:
            raise TypingError(f"{what}: needs a {' or '.join(map(str, widths))}-bit "
                              f"shared array, got {arr}")
        return types.UniTuple(types.uint32 if arr.dtype.bitwidth == 16 else arr.dtype, 4)

    def emit_ldmatrix(context: Any, builder: Any, rettype: Any, trans: bool,
                      addr: Any) -> Any:
        """``ldmatrix...x4`` from the 32-bit shared address ``addr``, as ``rettype``."""
        opcode = "ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "")
        fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
        # side_effect: LLVM does not see the read, so this keeps it between the barriers
        # and cp.async waits around it
        res = builder.asm(fty, f"{opcode}.shared.b16 {{$0,$1,$2,$3}}, [$4];",
                          "=r,=r,=r,=r,r", [addr], side_effect=True)
        items = [builder.extract_value(res, q) for q in range(4)]
        llty = context.get_value_type(rettype.dtype)
        items = [builder.bitcast(x, llty) if llty != i32 else x for x in items]
        return context.make_tuple(builder, rettype, items)

    def ldmatrix_intrinsic(trans: bool) -> Any:
        what = "ldmatrix_x4_trans" if trans else "ldmatrix_x4"

        @intrinsic
        def ldmatrix(typingctx: Any, arr: Any, idx: Any) -> Any:
            check_index(arr, idx, what)
            sig = ldmatrix_result(what, trans, arr)(arr, idx)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                ptr = item_pointer(context, builder, sig.args[0], args[0], sig.args[1],
                                   args[1])
                return emit_ldmatrix(context, builder, sig.return_type, trans,
                                     shared_address(builder, ptr))

            return sig, codegen

        return ldmatrix

    def cp_async_intrinsic(size: int) -> Any:
        op = "cg" if size == 16 else "ca"

        @intrinsic
        def cp_async(typingctx: Any, dst: Any, didx: Any, src: Any, sidx: Any,
                     nbytes: Any) -> Any:
            check_index(dst, didx, "cp_async")
            check_index(src, sidx, "cp_async")
            if dst.dtype.bitwidth != src.dtype.bitwidth:
                raise TypingError("cp_async: source and destination element sizes differ")
            if not isinstance(nbytes, types.Integer):
                raise TypingError("cp_async: nbytes must be an integer")
            sig = types.void(dst, didx, src, sidx, nbytes)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
                dty, dity, sty, sity, nty = sig.args
                dptr = item_pointer(context, builder, dty, args[0], dity, args[1])
                sptr = item_pointer(context, builder, sty, args[2], sity, args[3])
                n = context.cast(builder, args[4], nty, types.int32)
                fty = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
                builder.asm(fty, f"cp.async.{op}.shared.global [$0], [$1], {size}, $2;",
                            "r,l,r,~{memory}",
                            [shared_address(builder, dptr), builder.ptrtoint(sptr, i64), n],
                            side_effect=True)

            return sig, codegen

        return cp_async

    @intrinsic
    def cp_commit(typingctx: Any) -> Any:
        sig = types.void()

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            builder.asm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;",
                        "~{memory}", [], side_effect=True)

        return sig, codegen

    @cache
    def cp_wait(n: int) -> Any:
        @intrinsic
        def wait(typingctx: Any) -> Any:
            sig = types.void()

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
                builder.asm(ir.FunctionType(ir.VoidType(), []), f"cp.async.wait_group {n};",
                            "~{memory}", [], side_effect=True)

            return sig, codegen

        return wait

    def check_element(arr: Any, idx: Any, what: str) -> None:
        check_index(arr, idx, what)
        d = arr.dtype
        if not (d in (types.float32, types.float16)
                or (isinstance(d, types.Integer) and d.bitwidth == 16)):
            raise TypingError(f"{what}: needs a float32, float16 or 16-bit (bfloat16 bits) "
                              f"array, got {arr}")

    @intrinsic
    def load_f32(typingctx: Any, arr: Any, idx: Any) -> Any:
        check_element(arr, idx, "load_f32")
        sig = types.float32(arr, idx)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arrty = sig.args[0]
            v = builder.load(item_pointer(context, builder, arrty, args[0], sig.args[1],
                                          args[1]))
            if arrty.dtype == types.float32:
                return v
            if arrty.dtype == types.float16:
                if v.type != ir.HalfType():  # numba stores float16 as its i16 bits
                    v = builder.bitcast(v, ir.HalfType())
                return builder.fpext(v, f32)
            wide = builder.shl(builder.zext(v, i32), ir.Constant(i32, 16))
            return builder.bitcast(wide, f32)

        return sig, codegen

    @intrinsic
    def store_f32(typingctx: Any, arr: Any, idx: Any, x: Any) -> Any:
        check_element(arr, idx, "store_f32")
        if not isinstance(x, types.Float):
            raise TypingError(f"store_f32: needs a float value, got {x}")
        sig = types.void(arr, idx, x)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            arrty = sig.args[0]
            ptr = item_pointer(context, builder, arrty, args[0], sig.args[1], args[1])
            v = context.cast(builder, args[2], sig.args[2], types.float32)
            if arrty.dtype == types.float16:
                v = builder.fptrunc(v, ir.HalfType())
                if ptr.type.pointee != v.type:  # numba stores float16 as its i16 bits
                    v = builder.bitcast(v, ptr.type.pointee)
            elif arrty.dtype != types.float32:
                v = builder.asm(ir.FunctionType(ir.IntType(16), [f32]),
                                "cvt.rn.bf16.f32 $0, $1;", "=h,f", [v], side_effect=False)
            builder.store(v, ptr)

        return sig, codegen

    def pair_pointer(context: Any, builder: Any, arrty: Any, arr: Any, idxty: Any,
                     idx: Any) -> tuple[Any, int]:
        """The pair at ``arr[idx]`` as one pointer: to ``<2 x float>`` (float32) or to an
        i32 (two 16-bit values, the lower-indexed in the low half); and its alignment."""
        ptr = item_pointer(context, builder, arrty, arr, idxty, idx)
        if arrty.dtype == types.float32:
            return builder.bitcast(ptr, ir.VectorType(f32, 2).as_pointer()), 8
        return builder.bitcast(ptr, i32.as_pointer()), 4

    def to_bits16(builder: Any, arrty: Any, v: Any) -> Any:
        """A float32 as the 16 bits ``arr`` holds (store_f32's conversions)."""
        if arrty.dtype == types.float16:
            return builder.bitcast(builder.fptrunc(v, ir.HalfType()), ir.IntType(16))
        return builder.asm(ir.FunctionType(ir.IntType(16), [f32]), "cvt.rn.bf16.f32 $0, $1;",
                           "=h,f", [v], side_effect=False)

    def from_bits16(builder: Any, arrty: Any, h: Any) -> Any:
        """16 bits of ``arr`` as a float32 (load_f32's conversions)."""
        if arrty.dtype == types.float16:
            return builder.fpext(builder.bitcast(h, ir.HalfType()), f32)
        return builder.bitcast(builder.shl(builder.zext(h, i32), ir.Constant(i32, 16)), f32)

    @intrinsic
    def load2_f32(typingctx: Any, arr: Any, idx: Any) -> Any:
        check_element(arr, idx, "load2_f32")
        sig = types.UniTuple(types.float32, 2)(arr, idx)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arrty = sig.args[0]
            ptr, align = pair_pointer(context, builder, arrty, args[0], sig.args[1], args[1])
            v = builder.load(ptr, align=align)
            if arrty.dtype == types.float32:
                items = [builder.extract_element(v, ir.Constant(i32, q)) for q in range(2)]
            else:
                halves = [builder.trunc(v, ir.IntType(16)),
                          builder.trunc(builder.lshr(v, ir.Constant(i32, 16)), ir.IntType(16))]
                items = [from_bits16(builder, arrty, h) for h in halves]
            return context.make_tuple(builder, sig.return_type, items)

        return sig, codegen

    @intrinsic
    def store2_f32(typingctx: Any, arr: Any, idx: Any, x0: Any, x1: Any) -> Any:
        check_element(arr, idx, "store2_f32")
        if not (isinstance(x0, types.Float) and isinstance(x1, types.Float)):
            raise TypingError(f"store2_f32: needs two float values, got {x0}, {x1}")
        sig = types.void(arr, idx, x0, x1)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            arrty = sig.args[0]
            ptr, align = pair_pointer(context, builder, arrty, args[0], sig.args[1], args[1])
            vals = [context.cast(builder, args[2 + q], sig.args[2 + q], types.float32)
                    for q in range(2)]
            if arrty.dtype == types.float32:
                v = ir.Constant(ir.VectorType(f32, 2), ir.Undefined)
                for q, x in enumerate(vals):
                    v = builder.insert_element(v, x, ir.Constant(i32, q))
            else:
                lo, hi = (builder.zext(to_bits16(builder, arrty, x), i32) for x in vals)
                v = builder.or_(lo, builder.shl(hi, ir.Constant(i32, 16)))
            builder.store(v, ptr, align=align)

        return sig, codegen

    @intrinsic
    def pair_aligned(typingctx: Any, arr: Any, idx: Any) -> Any:
        check_element(arr, idx, "pair_aligned")
        sig = types.boolean(arr, idx)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arrty, idxty = sig.args
            # the addresses of the pair's two elements, as the stores would compute them
            # (so LLVM shares the arithmetic); a contiguous array's stride is known
            p0 = builder.ptrtoint(item_pointer(context, builder, arrty, args[0], idxty,
                                               args[1]), i64)
            ary = context.make_array(arrty)(context, builder, value=args[0])
            step = (context.get_constant(types.intp, arrty.dtype.bitwidth // 8)
                    if arrty.layout == "C" else
                    builder.extract_value(ary.strides, arrty.ndim - 1))
            size = arrty.dtype.bitwidth // 8
            contiguous = builder.icmp_signed("==", step, ir.Constant(i64, size))
            low = builder.and_(p0, ir.Constant(i64, 2 * size - 1))
            aligned = builder.icmp_unsigned("==", low, ir.Constant(i64, 0))
            return builder.and_(contiguous, aligned)

        return sig, codegen

    def check_offset(arr: Any, off: Any, what: str) -> None:
        if not isinstance(arr, types.Array) or not isinstance(off, types.Integer):
            raise TypingError(f"{what}: needs an array and an integer offset")

    def shared_at(context: Any, builder: Any, arrty: Any, arr: Any, offty: Any,
                  off: Any) -> Any:
        """The 32-bit shared-window address ``off`` bytes into shared array ``arr``."""
        ary = context.make_array(arrty)(context, builder, value=arr)
        o = context.cast(builder, off, offty, types.int32)
        return builder.add(shared_address(builder, ary.data), o)

    def ldmatrix_at_intrinsic(trans: bool) -> Any:
        what = "ldmatrix_x4_trans_at" if trans else "ldmatrix_x4_at"

        @intrinsic
        def ldmatrix_at(typingctx: Any, arr: Any, off: Any) -> Any:
            check_offset(arr, off, what)
            sig = ldmatrix_result(what, trans, arr)(arr, off)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                addr = shared_at(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                return emit_ldmatrix(context, builder, sig.return_type, trans, addr)

            return sig, codegen

        return ldmatrix_at

    @cache
    def lds_at(w: int) -> Any:
        suffix = "" if w == 1 else f".v{w}"
        outs = ",".join(f"${q}" for q in range(w))

        @intrinsic
        def lds(typingctx: Any, arr: Any, off: Any) -> Any:
            check_offset(arr, off, f"lds_at({w})")
            if arr.dtype.bitwidth != 32:
                raise TypingError(f"lds_at({w}): needs a 32-bit shared array, got {arr}")
            sig = types.UniTuple(arr.dtype, w)(arr, off)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                # a 32-bit shared address, so ptxas folds the constant part of the offset
                # into the instruction; side_effect keeps the read between the barriers
                # and cp.async waits around it (LLVM does not see it)
                addr = shared_at(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                # (one output is a plain i32, several a struct)
                ret = ir.LiteralStructType([i32] * w) if w > 1 else i32
                dst = f"{{{outs}}}" if w > 1 else outs
                res = builder.asm(ir.FunctionType(ret, [i32]),
                                  f"ld.shared{suffix}.b32 {dst}, [${w}];",
                                  ",".join(["=r"] * w + ["r"]), [addr], side_effect=True)
                llty = context.get_value_type(sig.return_type.dtype)
                items = [builder.bitcast(builder.extract_value(res, q) if w > 1 else res, llty)
                         for q in range(w)]
                return context.make_tuple(builder, sig.return_type, items)

            return sig, codegen

        return lds

    @intrinsic
    def cp_async16_at(typingctx: Any, dst: Any, doff: Any, src: Any, sidx: Any, soff: Any,
                      nbytes: Any) -> Any:
        check_offset(dst, doff, "cp_async16_at")
        check_index(src, sidx, "cp_async16_at")
        if not isinstance(soff, types.Integer) or not isinstance(nbytes, types.Integer):
            raise TypingError("cp_async16_at: soff and nbytes must be integers")
        if dst.dtype.bitwidth != src.dtype.bitwidth:
            raise TypingError("cp_async16_at: source and destination element sizes differ")
        sig = types.void(dst, doff, src, sidx, soff, nbytes)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            dty, doty, sty, _, soty, nty = sig.args
            daddr = shared_at(context, builder, dty, args[0], doty, args[1])
            sary = context.make_array(sty)(context, builder, value=args[2])
            so = context.cast(builder, args[4], soty, types.int64)
            sptr = builder.gep(sary.data, [so])
            n = context.cast(builder, args[5], nty, types.int32)
            fty = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
            builder.asm(fty, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                        [daddr, builder.ptrtoint(sptr, i64), n], side_effect=True)

        return sig, codegen

    @intrinsic
    def cp_async16_ptr(typingctx: Any, dst: Any, doff: Any, src: Any, sidx: Any, ptr: Any,
                       nbytes: Any) -> Any:
        check_offset(dst, doff, "cp_async16_ptr")
        check_index(src, sidx, "cp_async16_ptr")
        if not isinstance(ptr, types.Integer) or not isinstance(nbytes, types.Integer):
            raise TypingError("cp_async16_ptr: ptr and nbytes must be integers")
        sig = types.void(dst, doff, src, sidx, ptr, nbytes)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            dty, doty, _, _, pty, nty = sig.args
            daddr = shared_at(context, builder, dty, args[0], doty, args[1])
            p = context.cast(builder, args[4], pty, types.int64)
            n = context.cast(builder, args[5], nty, types.int32)
            fty = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
            builder.asm(fty, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                        [daddr, p, n], side_effect=True)

        return sig, codegen

    @intrinsic
    def round_tf32_at(typingctx: Any, arr: Any, off: Any) -> Any:
        check_offset(arr, off, "round_tf32_at")
        if arr.dtype != types.float32:
            raise TypingError(f"round_tf32_at: needs a float32 shared array, got {arr}")
        sig = types.void(arr, off)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            addr = shared_at(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            # cvt.rna.tf32.f32 as ptxas expands it (a finite value gets half a TF32 ulp
            # added to its bits; the carry rounds, ties away), without the mask that
            # clears the low 13 bits when the result is stored: the tensor core ignores
            # them. Infinities and NaNs are left as they are.
            # (|x| < inf as one FSETP: testp.finite becomes integer mask-and-compare)
            rnd = " ".join(f"abs.f32 %a{q}, %t{q}; setp.lt.f32 %p{q}, %a{q}, 0f7F800000; "
                           f"@%p{q} add.u32 %t{q}, %t{q}, 4096;" for q in range(4))
            asm = ("{ .reg .b32 %t<4>; .reg .f32 %a<4>; .reg .pred %p<4>; "
                   "ld.shared.v4.b32 {%t0,%t1,%t2,%t3}, [$0]; " + rnd +
                   " st.shared.v4.b32 [$0], {%t0,%t1,%t2,%t3}; }")
            builder.asm(ir.FunctionType(ir.VoidType(), [i32]), asm, "r,~{memory}", [addr],
                        side_effect=True)

        return sig, codegen

    @intrinsic
    def split_tf32(typingctx: Any, x: Any) -> Any:
        if not isinstance(x, types.Float):
            raise TypingError(f"split_tf32: needs a float, got {x}")
        sig = types.UniTuple(types.float32, 2)(x)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ("{ .reg .b32 %b, %s; .reg .f32 %a; .reg .pred %p; "
                   "mov.b32 %b, $2; add.u32 %b, %b, 4096; and.b32 %b, %b, 0xFFFFE000; "
                   "sub.f32 %s, $2, %b; "
                   "abs.f32 %a, %s; setp.lt.f32 %p, %a, 0f7F800000; "
                   "@%p add.u32 %s, %s, 4096; mov.b32 $0, %b; mov.b32 $1, %s; }")
            res = builder.asm(ir.FunctionType(ir.LiteralStructType([f32, f32]), [f32]), asm,
                              "=f,=f,f", [v], side_effect=False)
            items = [builder.extract_value(res, q) for q in range(2)]
            return context.make_tuple(builder, sig.return_type, items)

        return sig, codegen

    @intrinsic
    def split_tf32_at(typingctx: Any, arr: Any, off: Any, small_off: Any) -> Any:
        check_offset(arr, off, "split_tf32_at")
        check_offset(arr, small_off, "split_tf32_at")
        if arr.dtype != types.float32:
            raise TypingError(f"split_tf32_at: needs a float32 shared array, got {arr}")
        sig = types.void(arr, off, small_off)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
            addr = shared_at(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            small = shared_at(context, builder, sig.args[0], args[0], sig.args[2], args[2])
            # per value split_tf32's five instructions: big = (bits + half a TF32 ulp) with
            # the low 13 bits cleared, small = x - big (exact), rounded unless not finite
            split = " ".join(
                f"add.u32 %b{q}, %t{q}, 4096; and.b32 %b{q}, %b{q}, 0xFFFFE000; "
                f"sub.f32 %s{q}, %t{q}, %b{q}; abs.f32 %a{q}, %s{q}; "
                f"setp.lt.f32 %p{q}, %a{q}, 0f7F800000; @%p{q} add.u32 %s{q}, %s{q}, 4096;"
                for q in range(4))
            asm = ("{ .reg .b32 %t<4>, %b<4>, %s<4>; .reg .f32 %a<4>; .reg .pred %p<4>; "
                   "ld.shared.v4.b32 {%t0,%t1,%t2,%t3}, [$0]; " + split +
                   " st.shared.v4.b32 [$0], {%b0,%b1,%b2,%b3};"
                   " st.shared.v4.b32 [$1], {%s0,%s1,%s2,%s3}; }")
            builder.asm(ir.FunctionType(ir.VoidType(), [i32, i32]), asm, "r,r,~{memory}",
                        [addr, small], side_effect=True)

        return sig, codegen

    return TensorCoreOps(mma_tf32, mma_f16, mma_bf16, to_tf32, ldmatrix_intrinsic(False),
                         ldmatrix_intrinsic(True), cp_async_intrinsic(16), cp_async_intrinsic(4),
                         cp_commit, cp_wait, load_f32, store_f32, ldmatrix_at_intrinsic(False),
                         ldmatrix_at_intrinsic(True), lds_at, cp_async16_at, cp_async16_ptr,
                         round_tf32_at, split_tf32, split_tf32_at, load2_f32, store2_f32,
                         pair_aligned)
