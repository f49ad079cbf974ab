"""Tensor-core primitives (tilegemm.kernels.cuda._tensorcore): fragment layouts against the
PTX ISA tables, the simulator emulations against NumPy (with negative controls), and the
compiled instructions in the sm_80/sm_90 machine code."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tilegemm.kernels.cuda import _tensorcore as T

cuda: Any = None  # numba.cuda, a module global: the simulator swaps it through globals

# --- layouts against entries transcribed from the PTX ISA fragment figures -----------------
# (lane, register or element) -> (row, col), read off "Matrix Fragments for mma.m16n8k8"
# (.tf32) and "mma.m16n8k16 with floating point type" (.f16/.bf16).
ISA_TABLE = {
    "a_tf32": {(0, 0): (0, 0), (0, 1): (8, 0), (0, 2): (0, 4), (0, 3): (8, 4),
               (3, 0): (0, 3), (4, 0): (1, 0), (31, 3): (15, 7), (13, 2): (3, 5)},
    "b_tf32": {(0, 0): (0, 0), (0, 1): (4, 0), (1, 0): (1, 0), (4, 0): (0, 1),
               (31, 1): (7, 7), (30, 0): (2, 7)},
    "c": {(0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1), (1, 0): (0, 2),
          (4, 0): (1, 0), (31, 3): (15, 7)},
    "a_16bit": {(0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1),
                (0, 4): (0, 8), (0, 5): (0, 9), (0, 6): (8, 8), (0, 7): (8, 9),
                (1, 0): (0, 2), (4, 0): (1, 0), (31, 7): (15, 15)},
    "b_16bit": {(0, 0): (0, 0), (0, 1): (1, 0), (0, 2): (8, 0), (0, 3): (9, 0),
                (1, 0): (2, 0), (4, 0): (0, 1), (31, 3): (15, 7)},
}
LAYOUTS: dict[str, tuple[Any, int, tuple[int, int]]] = {
    # name: (function, registers per lane, matrix shape)
    "a_tf32": (T.a_tf32_layout, 4, (16, 8)),
    "b_tf32": (T.b_tf32_layout, 2, (8, 8)),
    "c": (T.c_layout, 4, (16, 8)),
    "a_16bit": (T.a_16bit_layout, 8, (16, 16)),
    "b_16bit": (T.b_16bit_layout, 4, (16, 8)),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_matches_isa_table_and_covers_matrix_once(name: str) -> None:
    fn, regs, shape = LAYOUTS[name]
    for (lane, i), where in ISA_TABLE[name].items():
        assert fn(lane, i) == where, (name, lane, i)
    cells = [fn(lane, i) for lane in range(32) for i in range(regs)]
    assert sorted(cells) == [(r, c) for r in range(shape[0]) for c in range(shape[1])]


def _ldmatrix_x4_elements(layout):
    """(lane, register j, half h, row, column) of each element an ldmatrix x4 ``layout``
    hands out: its matrices m = 0..3 are the 8 × 8 quarters (rows 0-7, cols 0-7), (rows
    8-15, cols 0-7), (0-7, 8-15), (8-15, 8-15) of one 16 × 16 tile."""
    for lane in range(32):
        for j in range(4):
            for h in range(2):
                m, r, c = layout(lane, j, h)
                yield lane, j, h, r + 8 * (m % 2), c + 8 * (m // 2)


def test_ldmatrix_layout_is_the_mma_16bit_a_fragment() -> None:
    for lane, j, h, row, col in _ldmatrix_x4_elements(T.ldmatrix_layout):
        assert T.a_16bit_layout(lane, 2 * j + h) == (row, col)


def test_ldmatrix_trans_layout_is_the_mma_16bit_b_fragment() -> None:
    # x4.trans from a row-major k×n tile: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), then
    # the same for n 8-15; registers 0, 1 are the B fragment of n 0-7, registers 2, 3 of 8-15
    for lane, j, h, k, n in _ldmatrix_x4_elements(T.ldmatrix_trans_layout):
        kb, nb = T.b_16bit_layout(lane, 2 * (j % 2) + h)
        assert (k, n) == (kb, nb + 8 * (j // 2))


def test_tf32_round_is_nearest_ties_away_and_truncate_drops_13_bits() -> None:
    one = np.float32(1.0)
    ulp = np.float32(2.0**-10)  # TF32 keeps 10 mantissa bits
    assert T.tf32_round(one + ulp / 2) == one + ulp  # a tie rounds away from zero
    assert T.tf32_round(-(one + ulp / 2)) == -(one + ulp)
    assert T.tf32_round(one + ulp / 4) == one
    assert T.tf32_truncate(one + ulp * np.float32(0.99)) == one
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    r = T.tf32_round(x)
    assert np.all(r.view(np.uint32) & 0x1FFF == 0)
    assert np.max(np.abs(r - x) / np.abs(x)) <= 2.0**-11
    assert np.isinf(T.tf32_round(np.float32(np.inf)))


def test_bf16_round_trip() -> None:
    x = np.array([1.0, -2.5, 3.14159, 1e-3], np.float32)
    back = T.bf16_value(T.bf16_bits(x))
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-8)
    assert T.bf16_value(T.bf16_bits(np.float32(1.0 + 2.0**-8))) == 1.0  # tie to even


# --- kernels that drive each primitive for one warp ----------------------------------------


def _kernels(swap: bool = False) -> tuple[Any, Any]:
    """A TF32 and a 16-bit (cp.async → ldmatrix → mma) one-warp kernel. ``swap`` exchanges
    two A registers: the negative control the layout checks must catch."""
    global cuda
    from numba import cuda

    tc = T.tensorcore_ops()
    mma_tf32, mma_bf16, mma_f16, to_tf32 = tc.mma_tf32, tc.mma_bf16, tc.mma_f16, tc.to_tf32
    ldsm, cp16, commit, wait0 = tc.ldmatrix_x4, tc.cp_async16, tc.cp_commit, tc.cp_wait(0)

    @cuda.jit
    def tf32(A, B, C, D):
        lane = cuda.threadIdx.x
        g = lane // 4
        t = lane % 4
        a0, a1 = to_tf32(A[g, t]), to_tf32(A[g + 8, t])
        if swap:
            a0, a1 = a1, a0
        a = (a0, a1, to_tf32(A[g, t + 4]), to_tf32(A[g + 8, t + 4]))
        b = (to_tf32(B[t, g]), to_tf32(B[t + 4, g]))
        c = (C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
        d = mma_tf32(a, b, c)
        D[g, 2 * t] = d[0]
        D[g, 2 * t + 1] = d[1]
        D[g + 8, 2 * t] = d[2]
        D[g + 8, 2 * t + 1] = d[3]

    @cuda.jit
    def half(A, Bt, C, D, E):
        # A: 16×16 and Bt: 8×16 (B transposed) of 16-bit patterns; D = bf16 product + C,
        # E = f16 product of the same bits + C (the bits are read as each format).
        sA = cuda.shared.array((16, 16), np.uint16)
        sB = cuda.shared.array((8, 16), np.uint16)
        lane = cuda.threadIdx.x
        r = lane // 2
        h = (lane % 2) * 8
        cp16(sA, (r, h), A, (r, h), 16)
        if lane < 16:
            cp16(sB, (r, h), Bt, (r, h), 16)
        commit()
        wait0()
        cuda.syncthreads()
        m = lane // 8
        rr = lane % 8
        a = ldsm(sA, (rr + 8 * (m % 2), 8 * (m // 2)))
        bb = ldsm(sB, (rr, 8 * (m % 2)))  # matrices 0, 1: B for k 0-7 and 8-15 (2, 3 repeat them)
        if swap:
            a = (a[1], a[0], a[2], a[3])
        g = lane // 4
        t = lane % 4
        c = (C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
        d = mma_bf16(a, (bb[0], bb[1]), c)
        e = mma_f16(a, (bb[0], bb[1]), c)
        D[g, 2 * t] = d[0]
        D[g, 2 * t + 1] = d[1]
        D[g + 8, 2 * t] = d[2]
        D[g + 8, 2 * t + 1] = d[3]
        E[g, 2 * t] = e[0]
        E[g, 2 * t + 1] = e[1]
        E[g + 8, 2 * t] = e[2]
        E[g + 8, 2 * t + 1] = e[3]

    return tf32, half


def _run_tf32(swap: bool, rng: np.random.Generator) -> float:
    tf32, _ = _kernels(swap)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, np.float32)
    tf32[1, 32](A, B, C, D)
    want = T.tf32_round(A).astype(np.float64) @ T.tf32_round(B) + C
    return float(np.max(np.abs(D - want)))


def _run_half(swap: bool, rng: np.random.Generator) -> tuple[float, float]:
    _, half = _kernels(swap)
    A = rng.standard_normal((16, 16)).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, np.float32)
    E = np.full((16, 8), np.nan, np.float32)
    # bf16 run: the bits are bf16 patterns; the f16 kernel reads them as float16 instead.
    abits, bbits = T.bf16_bits(A), T.bf16_bits(np.ascontiguousarray(B.T))
    half[1, 32](abits, bbits, C, D, E)
    want_bf = T.bf16_value(abits).astype(np.float64) @ T.bf16_value(bbits).T + C
    fa = abits.view(np.float16).astype(np.float64)
    fb = bbits.view(np.float16).astype(np.float64)
    with np.errstate(all="ignore"):
        want_f = fa @ fb.T + C
    ok = np.isfinite(want_f)
    return (float(np.max(np.abs(D - want_bf))),
            float(np.max(np.abs(E[ok] - want_f[ok]) / (1 + np.abs(want_f[ok])))))


@pytest.mark.cudasim
def test_mma_tf32_matches_numpy_and_catches_a_swapped_fragment(rng: np.random.Generator) -> None:
    assert _run_tf32(False, rng) < 1e-4
    assert _run_tf32(True, rng) > 1e-2  # negative control


@pytest.mark.cudasim
def test_cp_async_ldmatrix_mma_16bit_match_numpy_and_catch_a_swap(
        rng: np.random.Generator) -> None:
    bf, f = _run_half(False, rng)
    assert bf < 1e-4 and f < 1e-4
    bf, f = _run_half(True, rng)
    assert bf > 1e-2 and f > 1e-2  # negative control


@pytest.mark.cudasim
@pytest.mark.simulator
def test_cp_async_lands_only_at_the_wait_that_retires_its_group() -> None:
    global cuda
    from numba import cuda

    tc = T.tensorcore_ops()
    cp4, commit, wait0, wait1 = tc.cp_async4, tc.cp_commit, tc.cp_wait(0), tc.cp_wait(1)

    @cuda.jit
    def k(src, out):
        s = cuda.shared.array(2, np.float32)
        s[0] = 0.0
        s[1] = 0.0
        cp4(s, (0,), src, (0,), 4)
        commit()
        cp4(s, (1,), src, (1,), 0)  # zero bytes read: zero-fill
        commit()
        out[0] = s[0]  # nothing has landed yet
        wait1()  # retires the first group only
        out[1] = s[0]
        s[1] = 7.0
        wait0()
        out[2] = s[1]

    out = np.full(3, np.nan, np.float32)
    k[1, 1](np.array([5.0, 6.0], np.float32), out)
    assert out.tolist() == [0.0, 5.0, 0.0]


# --- the compiled instructions --------------------------------------------------------------


def _sass(kernel: Any, sig: tuple, arch: str) -> tuple[str, dict[str, int]]:
    from numba.cuda import compile_ptx

    from tilegemm.analysis.resources import ARCHS, link_ptx, parse_ptxas_log
    from tilegemm.analysis.sass import disassemble, link_cubin

    ptx, _ = compile_ptx(kernel.py_func, sig, cc=ARCHS[arch])
    return disassemble(link_cubin(ptx, arch)), parse_ptxas_log(link_ptx(ptx, arch)[0])


@pytest.mark.ptx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_core_instructions_in_sass_without_local_memory(arch: str) -> None:
    from numba import types

    tf32, half = _kernels()
    f2, u2 = types.float32[:, ::1], types.uint16[:, ::1]
    text, figures = _sass(tf32, (f2, f2, f2, f2), arch)
    assert len(re.findall(r"HMMA\.1688\.F32\.TF32", text)) == 1
    assert not re.search(r"\b(LDL|STL)\b", text)
    assert figures["spill_stores"] == figures["spill_loads"] == figures["stack"] == 0
    text, figures = _sass(half, (u2, u2, f2, f2, f2), arch)
    assert len(re.findall(r"HMMA\.16816\.F32\.BF16", text)) == 1
    assert len(re.findall(r"HMMA\.16816\.F32\b(?!\.BF16)", text)) == 1
    assert len(re.findall(r"LDSM\.16\.M88\.4", text)) == 2
    assert re.search(r"LDGSTS\.E\.BYPASS\.128", text)
    assert re.search(r"LDGDEPBAR", text) and re.search(r"DEPBAR", text)
    assert not re.search(r"\b(LDL|STL)\b", text)
    assert figures["spill_stores"] == figures["spill_loads"] == figures["stack"] == 0


def test_offset_forms_check_their_offsets_in_the_simulator() -> None:
    """The simulator stand-ins of the offset-addressed instructions refuse an offset that is
    not the one of the index they stand for, or outside the shared array (negative control
    for the kernels' written-out offsets)."""
    src = np.arange(64, dtype=np.float32).reshape(1, 8, 8)
    dst = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(AssertionError, match="not that of index"):
        T._py_cp_async16_at(dst, 0, src, (0, 1, 4), 13, 16)
    with pytest.raises(AssertionError, match="not that of index"):
        T._py_cp_async16_ptr(dst, 0, src, (0, 1, 4), 13 * 4, 16)
    with pytest.raises(IndexError, match="outside a shared array"):
        T._py_cp_async16_at(dst, 256, src, (0, 1, 4), 12, 16)
    with pytest.raises(IndexError, match="outside a shared array"):
        T._py_lds_at(1)(dst, 256)
    v = np.array([1 + 2.0**-11, 1 + 2.0**-12, np.nan, -np.inf], np.float32)
    shared = v.copy()
    T._py_round_tf32_at(shared, 0)
    assert np.array_equal(shared, T.tf32_round(v), equal_nan=True)


def test_split_in_shared_memory_matches_the_fragment_split() -> None:
    """3×TF32 splits each value once, in shared memory (``split_tf32_at``): the big part in
    place, the small part at a second offset, exactly as ``split_tf32`` splits a fragment
    value; big + small is the value to 2**-22 relative, NaN and infinity propagate to the
    small part (so the product stays NaN), and misaligned or out-of-range offsets are
    refused (negative control for the kernel's written-out offsets)."""
    rng = np.random.default_rng(5)
    v = np.concatenate([rng.standard_normal(4).astype(np.float32),
                        np.array([1 + 2.0**-11, -3 - 2.0**-12, np.nan, np.inf], np.float32)])
    shared = np.zeros(16, np.float32)
    shared[:8] = v
    T._py_split_tf32_at(shared, 0, 32)
    T._py_split_tf32_at(shared, 16, 48)
    for x, big, small in zip(v, shared[:8], shared[8:]):
        want_big, want_small = T._py_split_tf32(x)
        assert np.array_equal([big, small], [want_big, want_small], equal_nan=True)
        assert big == T.tf32_round(np.float32(x)) or not np.isfinite(x)
    fin = np.isfinite(v)
    total = shared[:8][fin].astype(np.float64) + shared[8:][fin]
    assert np.all(np.abs(total - v[fin]) <= 2.0**-22 * np.abs(v[fin]))
    assert np.all(np.isnan(shared[8:][~fin]))
    assert shared[4] != v[4] and shared[12] != 0  # 1 + 2**-11 rounds up, leaving -2**-11
    with pytest.raises(AssertionError, match="16-byte aligned"):
        T._py_split_tf32_at(shared, 4, 32)
    with pytest.raises(IndexError, match="outside a shared array"):
        T._py_split_tf32_at(shared, 0, 64)


def test_sim_barrier_releases_all_and_gives_up_when_the_block_aborts() -> None:
    """The emulations' warp barrier: every party released together; a party of a block
    whose thread failed (the simulator sets ``abort``) stops waiting at once instead of
    sitting out the timeout; and a party that never arrives still ends in the timeout."""
    import threading
    import time

    from tilegemm.kernels.cuda._tensorcore import SimBarrier

    def run(barrier: SimBarrier, n: int, abort_after: float | None = None) -> list[str]:
        out: list[str] = []
        def party() -> None:
            try:
                barrier.wait()
                out.append("ok")
            except RuntimeError:  # the block aborted
                out.append("aborted")

        threads = [threading.Thread(target=party) for _ in range(n)]
        for t in threads:
            t.abort = False  # type: ignore[attr-defined]
            t.start()
        if abort_after is not None:
            time.sleep(abort_after)
            for t in threads:
                t.abort = True  # type: ignore[attr-defined]
        for t in threads:
            t.join(10)
        return out

    assert run(SimBarrier(4), 4) == ["ok"] * 4
    start = time.monotonic()
    assert run(SimBarrier(4, timeout=60), 3, abort_after=0.2) == ["aborted"] * 3  # one died
    assert time.monotonic() - start < 5
    with pytest.raises(threading.BrokenBarrierError, match="1 of 2 threads never arrived"):
        SimBarrier(2, timeout=0.3).wait()


def _in_threads(work: Any, count: int) -> None:
    """``work(i)`` in ``count`` threads (with the ``abort`` flag the simulator's threads
    carry), joined."""
    import threading

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.abort = False  # type: ignore[attr-defined]
        t.start()
    for t in threads:
        t.join(60)


def test_a_collective_slot_reused_at_once_gives_each_call_its_own_result() -> None:
    """compute_once waits at one barrier, whose last arrival computes: 8 threads make 300
    calls in a row on one slot, each call's result the sum of that call's values (a result
    overwritten before a slow thread read it, or values of two calls mixed, give another
    sum). An exception in the computation reaches every thread."""
    from tilegemm.kernels.cuda._tensorcore import CollectiveSlot, compute_once

    parties, calls = 8, 300
    slot = CollectiveSlot(parties)
    got: list[list[int]] = [[] for _ in range(parties)]

    def party(i: int) -> None:
        for n in range(calls):
            got[i].append(compute_once(slot, i, n * 100 + i, sum))

    _in_threads(party, parties)
    want = [n * 100 * parties + sum(range(parties)) for n in range(calls)]
    assert all(g == want for g in got)

    errors: list[str] = []

    def failing(i: int) -> None:
        try:
            compute_once(slot, i, i, lambda values: 1 // 0)
        except ZeroDivisionError as exc:
            errors.append(str(exc))

    _in_threads(failing, parties)
    assert errors == ["integer division or modulo by zero"] * parties


def test_the_emulated_tensor_core_truncates_its_sums() -> None:
    """The emulations round each mma's exact sum toward zero, as the tensor cores do (a
    long accumulation inside them loses what rounding to nearest would keep)."""
    from tilegemm.kernels.cuda._tensorcore import sum_to_float32

    up = 1 + 3 * 2.0**-25  # to nearest: 1 + 2**-23; toward zero: 1
    x = np.array([up, -up, 1.5, np.nan, np.inf, -np.inf, 2.0**200, -(2.0**200), 0.0])
    r = sum_to_float32(x)
    big = np.finfo(np.float32).max
    assert r.dtype == np.float32
    assert r[0] == 1.0 and r[1] == -1.0 and r[2] == 1.5 and np.float32(up) == 1 + 2.0**-23
    assert np.isnan(r[3]) and r[4] == np.inf and r[5] == -np.inf
    assert r[6] == big and r[7] == -big and r[8] == 0.0
