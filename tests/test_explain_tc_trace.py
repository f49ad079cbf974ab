"""The memory trace of the tensor-core rung ``mma`` (``tilegemm explain mma``), on the simulator.

Rung mma keeps its tiles in one dynamic shared buffer, fills it with ``cp.async`` and reads
it with ``ldmatrix`` (and, for TF32's B fragments, 32-bit shared loads by offset). The
simulator stand-ins of those instructions report each access to the tracer at the
instruction's width, per thread: a 16-byte global read and shared write per ``cp.async``,
one 16-byte row per lane per ``ldmatrix``. These tests check what the counts show (the
copies coalesced, the swizzled ``ldmatrix`` reads conflict-free) and that the counter can
see the opposite: rows 128 bytes apart and the rung with its swizzle removed both read
8-way conflicted, and scattered copies need a sector per lane. Rung wgmma's threads'
accesses are counted the same way; the operands its tensor core reads through descriptors
are not thread accesses and the report says so.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tilegemm.analysis.trace import trace_launch, trace_rung

pytestmark = [pytest.mark.cudasim, pytest.mark.simulator]

cuda: Any = None  # numba.cuda for the test kernels below, bound inside the builders


def _sites(result: dict, start: str, kind: str) -> list[dict]:
    return [s for s in result["sites"] if s["text"].startswith(start) and s["kind"] == kind]


def _per_request(sites: list[dict], key: str) -> set[float]:
    return {s[key] / s["requests"] for s in sites}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_mma_defaults_copies_coalesced_and_ldmatrix_conflict_free(dtype):
    """The default tile (128×128, BK 16, 8 warps) on one block: every ldmatrix request is
    4 phases of 8 rows (16 bytes each) in distinct banks, so 4 wavefronts and no conflict;
    every cp.async moves 16 bytes a lane and a full warp's copy is 512 contiguous-enough
    bytes: 16 sectors, one per 32 bytes asked for."""
    r = trace_rung("mma", 128, 128, 16, dtype=dtype)
    assert r["verified"] is True
    ldsm = _sites(r, "ldsm", "shared load")  # ldsm(As, ...) and float16's ldsm_t(Bs, ...)
    # per k step, MI=4 A fragments (+ NB=2 pairs of B fragments): TF32 2 steps, 16-bit 1
    assert len(ldsm) == (2 * 4 if dtype == "float32" else 4 + 2)
    for s in ldsm:
        assert s["accesses"] == 32 * s["requests"]
        assert s["bytes"] == 16 * s["accesses"]  # one 16-byte row per lane
        assert s["wavefronts"] == s["ideal_wavefronts"] == 4 * s["requests"]
        assert s["conflicted"] == 0 and s["max_degree"] == 1
    copies_in = _sites(r, "cp16", "global load")
    copies_out = _sites(r, "cp16", "shared store")
    assert len(copies_in) == len(copies_out) == 2  # A's and B's (checked loader)
    for s in copies_in:
        assert s["bytes"] == 16 * s["accesses"]
        assert s["sectors"] == s["bytes"] / 32  # coalesced: every sector wholly used
        assert _per_request([s], "sectors") == {16}  # full warps: 512 bytes, 16 sectors
    for s in copies_out:
        assert s["wavefronts"] == s["ideal_wavefronts"] == 4 * s["requests"]
    # TF32's B fragments: scalar loads from the k-swizzled B tile, one wavefront each
    lds = _sites(r, "lds1", "shared load")
    assert (len(lds) > 0) == (dtype == "float32")
    assert all(s["wavefronts"] == s["requests"] for s in lds)
    t = r["totals"]
    assert t["shared_load"]["conflicted"] == t["shared_store"]["conflicted"] == 0
    # the epilogue writes each of the 128×128 results once, two adjacent ones a thread per
    # store (tests/test_cuda_mma_store.py)
    assert t["global_store"]["bytes"] == 128 * 128 * np.dtype(dtype).itemsize
    assert t["global_store"]["accesses"] == 128 * 128 // 2
    assert r["traced_shared_bytes"] == 4 * (128 * 16 + 16 * 128) * np.dtype(dtype).itemsize


def test_mma_interior_loop_is_traced_too():
    """Blocks wholly inside the operands copy by per-thread pointer (cp16_ptr) in their
    interior k loop; a second k-tile with a 2-stage ring runs it. Its copies and reads are
    as clean as the checked loader's."""
    params = {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "STAGES": 2}
    r = trace_rung("mma", 64, 64, 32, params=params)
    assert r["verified"] is True
    fast = _sites(r, "cp16_ptr", "global load")
    assert len(fast) == 4  # 256 chunks of A and of B: two rounds of 128 threads each
    assert all(s["sectors"] == s["bytes"] / 32 for s in fast)
    assert _per_request(_sites(r, "cp16_ptr", "shared store"), "wavefronts") == {4}
    assert _per_request(_sites(r, "ldsm", "shared load"), "wavefronts") == {4}


def _ldmatrix_rows_kernel(stride: int):
    """One warp: lane l gives row l % 8 of matrix l // 8 at byte (l % 8)·stride + 16·(l // 8)
    of a dynamic shared buffer (what ldmatrix.x4 reads), after filling the buffer."""
    global cuda
    from numba import cuda

    from tilegemm.kernels.cuda._tensorcore import tensorcore_ops

    ldsm = tensorcore_ops().ldmatrix_x4_at

    @cuda.jit
    def rows(out):
        buf = cuda.shared.array(0, np.float16)
        lane = cuda.threadIdx.x
        for i in range(lane, buf.shape[0], 32):
            buf[i] = i % 7
        cuda.syncthreads()
        r0, r1, r2, r3 = ldsm(buf, (lane % 8) * stride + 16 * (lane // 8))
        out[lane, 0] = r0
        out[lane, 1] = r1
        out[lane, 2] = r2
        out[lane, 3] = r3

    return rows


@pytest.mark.parametrize("stride, degree", [
    (128, 8),  # 8 rows 128 bytes apart: the same 4 banks, served one row per wavefront
    (64, 4),   # two rows per 128 bytes: 4 rows on each group of 4 banks
    (144, 1),  # padded by 16 bytes: the 8 rows cover all 32 banks once
])
def test_ldmatrix_bank_conflicts_of_a_hand_made_pattern(stride, degree):
    """Negative control: the counter sees an ldmatrix's conflicts when its rows share
    banks (each matrix's 8 rows, from lanes 8i..8i+7, are one 128-byte phase)."""
    kernel = _ldmatrix_rows_kernel(stride)
    out = np.zeros((32, 4), np.uint32)
    tr = trace_launch(kernel, (1,), (32,), [out], dynamic_shared=8 * stride + 64)
    (counts,) = tr.per_block.values()
    (read,) = [c for s, c in counts.sites.items() if tr.infos[s].text.startswith("ldsm(")]
    assert (read.requests, read.accesses, read.bytes) == (1, 32, 512)
    assert read.ideal_wavefronts == 4
    assert read.wavefronts == 4 * degree
    assert read.max_degree == degree
    assert read.conflicted == (1 if degree > 1 else 0)
    assert tr.infos[next(s for s in counts.sites if tr.infos[s].text.startswith("ldsm("))
                    ].array == "buf"
    # the stand-in still returns the data: lane 0's first register is row 0, values 0, 1
    assert int(out[0, 0]) == int(np.float16(1).view(np.uint16)) << 16


def _copy_kernel(stride: int):
    """One warp: lane l copies 16 bytes from element l·stride of ``src`` (float32) into
    16 bytes of a dynamic shared buffer by cp.async, then writes them out."""
    global cuda
    from numba import cuda

    from tilegemm.kernels.cuda._tensorcore import tensorcore_ops

    tc = tensorcore_ops()
    cp16, commit, wait = tc.cp_async16, tc.cp_commit, tc.cp_wait(0)

    @cuda.jit
    def copy(src, out):
        buf = cuda.shared.array(0, np.float32)
        lane = cuda.threadIdx.x
        cp16(buf, (4 * lane,), src, (lane * stride,), 16)
        commit()
        wait()
        cuda.syncthreads()
        for q in range(4):
            out[lane, q] = buf[4 * lane + q]

    return copy


@pytest.mark.parametrize("stride, sectors", [
    (4, 16),   # consecutive 16-byte chunks: 512 bytes in 16 sectors
    (16, 32),  # 64 bytes apart: every lane its own sector, half of each unused
])
def test_cp_async_coalescing(stride, sectors):
    src = np.arange(32 * stride + 4, dtype=np.float32)
    out = np.zeros((32, 4), np.float32)
    tr = trace_launch(_copy_kernel(stride), (1,), (32,), [src, out], dynamic_shared=512)
    (counts,) = tr.per_block.values()
    by = {(tr.infos[s].text.split("(")[0], tr.infos[s].kind): c
          for s, c in counts.sites.items()}
    read, write = by[("cp16", "global load")], by[("cp16", "shared store")]
    assert (read.requests, read.bytes, read.sectors) == (1, 512, sectors)
    assert (write.requests, write.wavefronts, write.ideal_wavefronts) == (1, 4, 4)
    np.testing.assert_array_equal(out, src[np.arange(32)[:, None] * stride + np.arange(4)])


def _unswizzled_mma(monkeypatch: pytest.MonkeyPatch, params: dict[str, int]) -> Any:
    """Rung mma (TF32) built with its chunk swizzles replaced by 0: the same kernel with
    A's and B's tiles stored plainly row-major (copies and reads agree, so it still
    computes the product)."""
    from tilegemm.kernels.cuda import k10_mma

    swz_fn, tf32_parts = k10_mma._swz_fn, k10_mma._tf32_parts

    def plain_parts(*args: Any, **kw: Any) -> tuple[list[str], list[str]]:
        bases, lines = tf32_parts(*args, **kw)
        a_swz, b_swz = "s_a = (r_l // ASWZ) % ACH", "((2 * t) & BSWZ)"
        assert a_swz in bases and any(b_swz in b for b in bases)  # else the rung changed
        return [b.replace(a_swz, "s_a = 0").replace(b_swz, "0") for b in bases], lines

    monkeypatch.setattr(k10_mma, "_swz_fn", lambda expr, ns: swz_fn("0", ns))
    monkeypatch.setattr(k10_mma, "_tf32_parts", plain_parts)
    return k10_mma.build(params, np.dtype("float32"))


def test_mma_without_its_swizzle_reads_8_way_conflicted(monkeypatch):
    """Negative control on the rung itself: BK 32 makes an A row 128 bytes, so without the
    swizzle the 8 rows of each ldmatrix phase fall in the same 4 banks (8-way, 8× the
    wavefronts); with it (the real rung, same parameters) they are conflict-free."""
    from tilegemm import registry
    from tilegemm.analysis.trace import operands

    params = {"BM": 32, "BN": 16, "BK": 32, "WM": 16, "WN": 16, "STAGES": 2,
              "GROUP_M": 2, "PASSES": 1}
    swizzled = trace_rung("mma", 32, 16, 32, params=params)
    assert swizzled["verified"] is True
    assert _per_request(_sites(swizzled, "ldsm", "shared load"), "wavefronts") == {4}

    program = _unswizzled_mma(monkeypatch, registry.get("mma", "cuda").resolve(params))
    a, b, c = operands(32, 16, 32, 1, np.dtype(np.float32))
    tr = trace_launch(program.kernel, program.grid(1, 32, 16), program.block,
                      [a, b, c, np.float32(1), np.float32(0)],
                      dynamic_shared=program.dynamic_smem)
    (counts,) = tr.per_block.values()
    reads = [c_ for s, c_ in counts.sites.items() if tr.infos[s].text.startswith("ldsm(")]
    assert reads
    for read in reads:
        assert read.max_degree == 8
        assert read.wavefronts == 8 * read.ideal_wavefronts == 8 * 4 * read.requests
    exact = np.matmul(a.astype(np.float64), b)  # still the product, at TF32 precision
    assert np.max(np.abs(c - exact)) <= 32 * 2.0**-10 * np.max(np.abs(exact))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("bcopy", [0, 1])
def test_wgmma_threads_accesses_are_counted_and_its_operand_reads_named(dtype, bcopy):
    """Rung wgmma (one block): A by cp.async; B with BCOPY=0 loaded by the threads and
    stored transposed (sts4: 16 bytes a lane) into the 128-byte swizzle layout,
    conflict-free, with BCOPY=1 (the default) copied by cp.async like A from its K-major
    copy (the copy kernel runs before, outside the trace), with nothing stored or loaded
    in shared memory by the threads. The operands the tensor core reads through
    descriptors are not thread accesses, so the report says they are not counted and no
    shared load is theirs."""
    from tilegemm.analysis.report import explain, render

    r = trace_rung("wgmma", 64, 32, 64, dtype=dtype, params={"BCOPY": bcopy})
    assert r["verified"] is True
    assert "descriptors" in r["not_counted"]
    stores = _sites(r, "sts4", "shared store")
    assert bool(stores) == (bcopy == 0)
    for s in stores:
        assert s["bytes"] == 16 * s["accesses"]
        assert s["wavefronts"] == s["ideal_wavefronts"] == 4 * s["requests"]
    copies = _sites(r, "cp16", "global load")
    assert copies and all(s["sectors"] == s["bytes"] / 32 for s in copies)
    # the copies read A, and with BCOPY=1 B too: cp16(<shared>, (<offset>,), <operand>, ...)
    operands = {re.match(r"cp16\(\w+, \([^)]*\), (\w+),", s["text"]).group(1)
                for s in copies}
    assert operands == ({"A"} if bcopy == 0 else {"A", "B"}), operands
    # the threads' own shared loads: TF32's in-place rounding (BCOPY=0), nothing else
    loads = {s["text"].split("(")[0] for s in r["sites"] if s["kind"] == "shared load"}
    assert loads == ({"round_tf32"} if dtype == "float32" and bcopy == 0 else set())
    text = " ".join(str(item) for item in render(explain("wgmma", 64, 32, 64, dtype=dtype)))
    assert "not counted: the operands wgmma itself reads" in text


def test_mma_report_says_nothing_is_left_out():
    assert trace_rung("mma", 32, 16, 16)["not_counted"] is None


def test_wgmma_n_major_b_copies_are_coalesced_and_conflict_free():
    """BCOPY=2 (float16): B's tiles copied as they lie in B, N-major, by cp.async: a warp
    reads whole 32-byte sectors of B's rows and writes them into the swizzled panels
    without bank conflicts, as A's copies do; the threads load and store nothing else."""
    r = trace_rung("wgmma", 64, 128, 128, dtype="float16", params={"BCOPY": 2, "BN": 128})
    assert r["verified"] is True
    copies = _sites(r, "cp16", "global load")
    assert {re.match(r"cp16\(\w+, \([^)]*\), (\w+),", s["text"]).group(1)
            for s in copies} == {"A", "B"}
    assert all(s["sectors"] == s["bytes"] / 32 for s in copies)
    stores = [s for s in r["sites"] if s["kind"] == "shared store"]
    assert stores and all(s["text"].startswith("cp16") for s in stores)
    assert all(s["wavefronts"] == s["ideal_wavefronts"] for s in stores)
    assert not [s for s in r["sites"] if s["kind"] == "shared load"]
