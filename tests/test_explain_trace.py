"""Traced counts of real kernels on numba's CUDA simulator (``tilegemm explain``'s numbers).

These run the kernels' own code with instrumented arrays (tilegemm.analysis.trace), so they
need NUMBA_ENABLE_CUDASIM=1 (``make test`` runs them in the simulator pytest process).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tilegemm.analysis.trace import trace_launch, trace_rung

pytestmark = [pytest.mark.cudasim, pytest.mark.simulator]

cuda: Any = None  # numba.cuda for the test kernels below, bound inside the builders


def _site(result: dict, text: str) -> dict:
    (site,) = [s for s in result["sites"] if s["text"] == text]
    return site


def test_seed_004_transaction_counts():
    """Seed 004: width 32, one 32×32 block, x → column: 5120 load and 128 store transactions.

    Per warp and k-step: 1 sector for the broadcast A element + 4 for 32 consecutive B
    floats; 32 warps × 32 steps × 5 = 5120. Stores: 32 warps × 4 sectors = 128.
    """
    r = trace_rung("coalesced", 32, 32, 32, params={"BLOCK": 32})
    t = r["totals"]
    assert t["global_load"]["sectors"] == 5120
    assert t["global_store"]["sectors"] == 128
    assert t["global_load"]["requests"] == 2 * 32 * 32  # two load instructions per k-step
    assert t["global_store"]["requests"] == 32
    a, b = _site(r, "A[za, i, k]"), _site(r, "B[zb, k, j]")
    assert (a["requests"], a["sectors"]) == (1024, 1024)  # broadcast: 1 sector per request
    assert (b["requests"], b["sectors"]) == (1024, 4096)  # 128 B: 4 sectors per request
    assert r["verified"] is True
    assert r["sampling"]["mode"] == "full" and r["grid"] == [1, 1, 1]


@pytest.mark.parametrize("block, per_warp_step", [(8, 4 + 1), (16, 2 + 2), (32, 1 + 4)])
def test_seed_004_block_shape_and_transactions(block, per_warp_step):
    """Seed 004 says its naive kernel is flat over 8×8, 16×16 and 32×32 blocks because the
    block shape does not change a warp's transactions. Traced: a warp covers 32/BLOCK rows,
    so per k-step it reads that many A sectors (one per row, broadcast within the row) and
    BLOCK floats of B (BLOCK/8 sectors): 4+1, 2+2 and 1+4. 8 and 32 agree (5120); 16×16
    needs a fifth fewer (4096)."""
    r = trace_rung("coalesced", 32, 32, 32, params={"BLOCK": block})
    assert r["totals"]["global_load"]["sectors"] == 32 * 32 * per_warp_step
    assert r["totals"]["global_store"]["sectors"] == 128  # 4 sectors per warp regardless


def test_naive_seed_mapping_is_uncoalesced():
    """numba's mapping (x → row): a warp reads 32 rows of A and writes 32 rows of C."""
    naive = trace_rung("naive", 32, 32, 32, params={"BLOCK": 32})
    coalesced = trace_rung("coalesced", 32, 32, 32, params={"BLOCK": 32})
    a = _site(naive, "A[za, i, k]")
    b = _site(naive, "B[zb, k, j]")
    c = _site(naive, "C[z, i, j]")
    assert a["sectors"] == 32 * a["requests"] == 32 * 1024  # one sector per lane
    assert b["sectors"] == b["requests"] == 1024  # the B element is now the broadcast
    assert c["sectors"] == 32 * c["requests"] == 1024
    assert naive["totals"]["global_load"]["sectors"] == 33792 > 5120
    assert (naive["totals"]["global_store"]["sectors"]
            > coalesced["totals"]["global_store"]["sectors"])
    assert naive["verified"] is True


def _column_read_kernel(width: int, dtype: type):
    """One warp fills a 32×width shared tile by rows, then each lane reads its row (a column
    access across the warp): lane t reads tile[t, j] for j = 0..31."""
    global cuda
    from numba import cuda

    @cuda.jit
    def column_read(src, out):
        tile = cuda.shared.array((32, width), dtype)
        tx = cuda.threadIdx.x
        for j in range(32):
            tile[j, tx] = src[j, tx]
        cuda.syncthreads()
        acc = dtype(0)
        for j in range(32):
            acc += tile[tx, j]
        out[tx] = acc

    return column_read


@pytest.mark.parametrize("width, dtype, waves_per_read, degree", [
    (32, np.float32, 32, 32),  # row stride 32 words: every lane in the same bank
    (33, np.float32, 1, 1),    # padded: row stride 33 words, lane t in bank (t + j) % 32
    (32, np.float64, 32, 16),  # doubles: 2 half-warp phases of 16 lanes in one bank pair
    (33, np.float64, 2, 1),    # padded doubles: two conflict-free phases
])
def test_bank_conflicts_of_a_column_read(width, dtype, waves_per_read, degree):
    kernel = _column_read_kernel(width, dtype)
    src = np.random.default_rng().uniform(1, 2, (32, 32)).astype(dtype)
    out = np.full(32, np.nan, dtype)
    tr = trace_launch(kernel, (1,), (32,), [src, out])
    (counts,) = tr.per_block.values()
    by_text = {tr.infos[s].text: c for s, c in counts.sites.items()}
    read, write = by_text["tile[tx, j]"], by_text["tile[j, tx]"]
    assert read.requests == write.requests == 32
    assert read.wavefronts == 32 * waves_per_read
    assert read.max_degree == degree
    assert read.conflicted == (32 if degree > 1 else 0)
    # the row writes are conflict-free in every layout
    assert write.wavefronts == write.ideal_wavefronts == 32 * (1 if dtype == np.float32 else 2)
    assert by_text["src[j, tx]"].sectors == 32 * (4 if dtype == np.float32 else 8)
    assert counts.barriers == 1
    np.testing.assert_allclose(out, src.sum(axis=1), rtol=1e-12 if dtype == np.float64 else 1e-5)


# The counts docs/explain.md publishes for the `shared` rung at M = N = K = 32.
SHARED_32 = {
    # TILE: (global load sectors, global store sectors, shared requests, barriers per block)
    8: (1024, 128, 2 * 1024 + 2 * 128, 8),
    16: (512, 128, 2 * 1024 + 2 * 64, 4),
    32: (256, 128, 2 * 1024 + 2 * 32, 2),
}


@pytest.mark.parametrize("tile", sorted(SHARED_32))
def test_shared_rung_has_no_bank_conflicts_at_any_tile(tile):
    """Seed 004 blames bank conflicts for 8×8 and 16×16 blocks (warps of 8×4 and 16×2
    threads). Traced: none, at any tile; what changes with TILE is global traffic."""
    r = trace_rung("shared", 32, 32, 32, params={"TILE": tile})
    t = r["totals"]
    loads, stores, shared_requests, barriers = SHARED_32[tile]
    assert t["global_load"]["sectors"] == loads
    assert t["global_store"]["sectors"] == stores
    assert t["global_load"]["sectors"] == 4 * t["global_load"]["requests"]  # 128 B per request
    sh = [t["shared_load"], t["shared_store"]]
    assert sum(s["requests"] for s in sh) == shared_requests
    assert all(s["wavefronts"] == s["ideal_wavefronts"] == s["requests"] for s in sh)
    assert all(s["conflicted"] == 0 for s in sh)
    assert r["launch"]["barriers_per_block"] == barriers
    assert r["verified"] is True


@pytest.mark.parametrize("kernel, params, shape", [
    ("shared", {"TILE": 8}, (20, 28, 16)),     # partial tiles on both edges: 4×3 blocks
    ("coalesced", {"BLOCK": 8}, (20, 40, 16)),  # 5×3 blocks, last block row partial
    # tiles numbered along x in the grouped order: edge tiles anywhere in x (a sample of
    # 64x48 counted 480 load sectors for the launch's 448 while classed by position)
    ("pipelined", {"BM": 32, "BN": 32, "BK": 8, "WM": 32, "WN": 16, "WNITER": 1, "TM": 4,
                   "TN": 4, "GROUP_M": 2}, (96, 80, 16)),
])
def test_sampled_trace_scales_to_the_full_trace(kernel, params, shape):
    m, n, k = shape
    full = trace_rung(kernel, m, n, k, params=params, full=True)
    sampled = trace_rung(kernel, m, n, k, params=params, full=False, samples=2)
    assert full["sampling"]["mode"] == "full" and full["verified"] is True
    assert sampled["sampling"]["mode"] == "sampled"
    assert sampled["sampling"]["traced_blocks"] < full["sampling"]["traced_blocks"]
    assert len(sampled["sampling"]["classes"]) == 4  # interior, both edges, corner
    assert sampled["totals"] == full["totals"]
    assert sampled["launch"] == full["launch"]
    assert [(s["text"], s["requests"], s["sectors"]) for s in sampled["sites"]] == \
        [(s["text"], s["requests"], s["sectors"]) for s in full["sites"]]


def test_beta_reads_c_and_batches_are_counted():
    r = trace_rung("coalesced", 8, 8, 8, params={"BLOCK": 8}, beta=0.5, batch=2)
    c_loads = [s for s in r["sites"] if s["array"] == "C" and s["kind"] == "global load"]
    assert len(c_loads) == 1
    # A warp covers 4 rows × 8 floats: 4 aligned 32-byte sectors; 2 warps × 2 batches.
    assert c_loads[0]["accesses"] == 2 * 8 * 8
    assert c_loads[0]["sectors"] == 2 * 8
    assert r["verified"] is True


def test_bad_input_is_refused_before_tracing():
    with pytest.raises(ValueError, match="TILE"):
        trace_rung("shared", 8, 8, 8, params={"TILE": 7})
    with pytest.raises(ValueError, match="unknown kernel"):
        trace_rung("nope", 8, 8, 8)
    with pytest.raises(ValueError, match="CUDA"):
        trace_rung("naive", 8, 8, 8, backend="opencl")
    with pytest.raises(ValueError):
        trace_rung("naive", -1, 8, 8)


def _shared_sites(r: dict) -> dict[str, tuple[float, float]]:
    """Shared-memory site text → (wavefronts, ideal wavefronts) per request."""
    return {s["text"]: (s["wavefronts"] / s["requests"], s["ideal_wavefronts"] / s["requests"])
            for s in r["sites"] if s["kind"].startswith("shared")}


def test_vector_rungs_traced_conflicts_match_the_hand_model():
    """Rungs 6-7 at their defaults (one 128×128 block, one BK slice). The tracer counts a
    128-bit vload/vstore as one 16-byte access (quarter-warp phases, 4 wavefronts ideal) and
    finds what tests/test_cuda_perf_banks.py derives by hand: rung 6 reads A 2-way and B
    at twice the ideal, rung 7's transposed, swizzled layout removes both."""
    v = _shared_sites(trace_rung("vectorized", 128, 128, 16))
    # The k steps are written out: one site per k step and row (A) or vector (B).
    a_reads = {w for t, w in v.items() if t.startswith("ld(As, ")}
    b_reads = {w for t, w in v.items() if t.startswith("vload(Bs, ")}
    a_stores = {w for t, w in v.items() if t.startswith("vstore(As, ")}
    assert len(a_reads) == len(b_reads) == len(a_stores) == 1, v
    assert a_reads == {(2, 1)}  # two thread rows 8·16 words apart: 2-way
    assert b_reads == {(8, 4)}  # a quarter-warp's vectors 32 bytes apart: twice the ideal
    assert a_stores == {(4, 4)}  # row-major 128-bit stores: clean
    s = _shared_sites(trace_rung("smem_layout", 128, 128, 16))
    assert all(waves == ideal for waves, ideal in s.values()), s
    # Scalar stores of A (1 wavefront) and 128-bit accesses (4); the k steps are written
    # out, so each step's shared loads are sites of their own.
    assert {ideal for _, ideal in s.values()} == {1, 4}
