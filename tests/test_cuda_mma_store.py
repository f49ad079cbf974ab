"""The tensor-core rungs' epilogue stores each thread's two adjacent columns as one access.

In the mma accumulator layout a thread holds columns 2t and 2t+1 of a row, so rungs mma
and wgmma store such a pair as one 8-byte access (float32, ``STG.E.64``) or one 4-byte
access (16-bit results) when the pair lies inside N and its address is a multiple of the
pair's size, and one value at a time otherwise. These tests check the machine code (the
pair stores are there, the k loop is the same instructions as without them), the traced
stores (half the requests and sectors), and the results on the shapes and views where
only some pairs, or none, may be stored whole: odd N, an odd row stride, a view whose
start is not 8-byte aligned, batches, beta != 0, outputs poisoned with NaN.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tilegemm import registry
from tilegemm.reference import assert_close

MMA = registry.get("mma", "cuda")
WGMMA = registry.get("wgmma", "cuda")
BF16 = np.dtype("bfloat16")

# precision modes: (operand dtype, result dtype, PASSES)
MODES: dict[str, tuple[Any, Any, int]] = {
    "tf32": (np.float32, np.float32, 1),
    "3xtf32": (np.float32, np.float32, 3),
    "float16": (np.float16, np.float16, 1),
    "bfloat16": (BF16, BF16, 1),
    "float16->float32": (np.float16, np.float32, 1),
}


# --- machine code ---------------------------------------------------------------------------


def _loop_listing(instrs: list, loop: Any) -> list[str]:
    """The loop's instructions with addresses and branch targets relative to its start, so
    two kernels' loops compare equal wherever the loop lies in each."""
    out = []
    for i in instrs:
        if loop.contains(i.addr):
            text = re.sub(r"`\(\.L_x_\d+\)", "", i.text)
            target = f" -> {i.target - loop.start:+d}" if i.target is not None else ""
            out.append(f"{i.addr - loop.start:05x} {text}{target}")
    return out


def _sass_facts(ptx: str, arch: str, kernel: str) -> dict[str, Any]:
    """Registers, local memory, the hot loop's listing and the global accesses by opcode."""
    from collections import Counter

    from tilegemm.analysis.resources import link, parse_ptxas_log
    from tilegemm.analysis.sass import disassemble, hot_loop, parse_sass
    from tilegemm.analysis.sass_mma import MMA_OPS

    log, cubin = link(ptx, arch)
    instrs = parse_sass(disassemble(cubin))
    hot, holding = hot_loop(instrs, lambda i: i.op in MMA_OPS, kernel, "HMMA")
    # the loops with tensor-core instructions that hold no epilogue (not the tile loop)
    inner = [lp for lp in holding if not any(i.op == "STG" and lp.contains(i.addr)
                                             for i in instrs)]
    return {"ptxas": parse_ptxas_log(log), "hot": _loop_listing(instrs, hot),
            "inner": [_loop_listing(instrs, lp) for lp in inner],
            "hot_range": (hot.start, hot.end),
            "local": sum(1 for i in instrs if i.op in ("LDL", "STL")),
            "global": Counter(i.op + i.mods for i in instrs if i.op in ("LDG", "STG")),
            "stg64_addrs": [i.addr for i in instrs if i.op == "STG" and i.mods == ".E.64"]}


def _opcodes(listing: list[str]) -> Any:
    """How many of each opcode (modifiers included) a loop listing holds."""
    from collections import Counter

    return Counter(next(t for t in line.split()[1:] if not t.startswith("@"))
                   for line in listing)


def _ptx_without_pairs(spec: Any, params: dict[str, int], dtype: str,
                       monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The rung's PTX (every architecture it compiles for) with the pair test answering
    False: the epilogue of one value at a time that the rungs had before."""
    from numba import types
    from numba.cuda.extending import intrinsic

    from tilegemm.analysis.resources import compile_ptx_all
    from tilegemm.kernels.cuda import _tensorcore, k10_mma, k11_wgmma

    @intrinsic
    def never(typingctx: Any, arr: Any, idx: Any) -> Any:  # an intrinsic: a device
        # function would be compiled for the current GPU's architecture, and there is none
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return context.get_constant(types.boolean, False)

        return types.boolean(arr, idx), codegen

    ops = _tensorcore.tensorcore_ops()._replace(pair_aligned=never)
    monkeypatch.setattr(k10_mma, "tensorcore_ops", lambda: ops)
    monkeypatch.setattr(k11_wgmma, "tensorcore_ops", lambda: ops)
    registry._build.cache_clear()  # build the program afresh, and again after this
    try:
        return compile_ptx_all(spec, params, dtype)
    finally:
        monkeypatch.undo()
        registry._build.cache_clear()


SASS_CASES = [("mma", "float32", 1), ("mma", "float16", 1), ("wgmma", "float32", 1)]


@pytest.mark.ptx
@pytest.mark.slow  # four compilations (~25 s each case)
@pytest.mark.parametrize(("name", "dtype", "passes"), SASS_CASES)
def test_pair_stores_leave_the_k_loop_as_it_was(name: str, dtype: str, passes: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """At the defaults, for every architecture the rung compiles for (mma: sm_80, sm_90;
    wgmma: sm_90a): the epilogue has its pair stores (float32: STG.E.64, and LDG.E.64 for
    C when beta != 0), none inside the hot loop, and the loops with tensor-core
    instructions are instruction for instruction those of the same kernel storing one value
    at a time, with the same registers and no local memory."""
    from tilegemm.analysis.resources import archs_for, ptx_for

    spec = registry.get(name, "cuda")
    params = spec.resolve({"PASSES": passes})
    without = _ptx_without_pairs(spec, params, dtype, monkeypatch)
    pairs_per_thread = (params["BM"] * params["BN"]) // (2 * spec.threads(params))
    for arch in archs_for(spec):
        new = _sass_facts(ptx_for(spec, params, dtype, arch), arch, name)
        old = _sass_facts(without[arch], arch, name)
        if name == "wgmma":
            # with B copied by cp.async (BCOPY=1) ptxas schedules the loop differently with
            # either epilogue (2026-11-26: other registers, an IMAD.X for an IADD3, one
            # branch fewer with pairs in the hot loop, two more in the checked loop's 775):
            # within 1 % of the instructions, the same memory and tensor instructions
            assert len(new["inner"]) == len(old["inner"]), arch
            for n_loop, o_loop in zip([new["hot"], *new["inner"]],
                                      [old["hot"], *old["inner"]], strict=True):
                assert len(n_loop) <= len(o_loop) + max(2, len(o_loop) // 100), arch
                n_ops, o_ops = _opcodes(n_loop), _opcodes(o_loop)
                assert all(n_ops[op] == o_ops[op] for op in o_ops | n_ops
                           if op.startswith(("HGMMA", "LDGSTS", "LDS", "STS", "BAR", "LDG",
                                             "STG", "WARPGROUP"))), arch
        else:
            assert new["hot"] == old["hot"], arch
            assert new["inner"] == old["inner"], arch
        assert abs(new["ptxas"]["registers"] - old["ptxas"]["registers"]) <= 4, arch
        assert new["local"] == 0 and new["ptxas"]["spill_stores"] == 0
        assert new["ptxas"]["spill_loads"] == 0 and new["ptxas"]["stack"] == 0
        pair_store = "STG.E.64" if dtype == "float32" else "STG.E"
        pair_load = "LDG.E.64" if dtype == "float32" else "LDG.E"
        # one pair store per accumulator pair in each of the epilogue's two paths (beta
        # zero or not), and a pair load of C in the second; none without the pair path
        assert new["global"][pair_store] >= 2 * pairs_per_thread, (arch, new["global"])
        assert new["global"][pair_load] >= pairs_per_thread, (arch, new["global"])
        assert old["global"][pair_store] == 0, (arch, old["global"])
        lo, hi = new["hot_range"]
        assert not any(lo <= a <= hi for a in new["stg64_addrs"])


@pytest.mark.ptx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mma_epilogue_stores_float32_pairs_as_64_bit(arch: str) -> None:
    """The default mma kernel (TF32, the compilation the other machine-code tests share):
    32 accumulator pairs a thread, each stored with one STG.E.64 (beta zero) or after one
    LDG.E.64 of C (beta != 0), all after the hot loop; no local memory."""
    from tilegemm.analysis.resources import ptx_for

    params = MMA.resolve({"PASSES": 1})
    facts = _sass_facts(ptx_for(MMA, params, "float32", arch), arch, "mma")
    pairs_per_thread = (params["BM"] * params["BN"]) // (2 * MMA.threads(params))
    assert pairs_per_thread == 32
    assert facts["global"]["STG.E.64"] == 2 * pairs_per_thread
    assert facts["global"]["LDG.E.64"] == pairs_per_thread
    lo, hi = facts["hot_range"]
    assert all(a > hi or a < lo for a in facts["stg64_addrs"])
    assert facts["local"] == 0 and facts["ptxas"]["spill_stores"] == 0


# --- traced stores --------------------------------------------------------------------------


def _global_stores(r: dict) -> list[dict]:
    return [s for s in r["sites"] if s["kind"] == "global store"]


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_traced_stores_of_the_default_tile_are_pairs(dtype: str) -> None:
    """One 128×128 block at the defaults (8 warps): every result is stored as half of a
    pair, so a warp's request writes 8 rows × 8 pairs, 8 sectors of 32 bytes (float32:
    each wholly used; float16: half) and there are 128·128/64 = 256 requests with 2048
    sectors, where one value at a time took 512 requests and 4096 sectors."""
    from tilegemm.analysis.trace import trace_rung

    r = trace_rung("mma", 128, 128, 16, dtype=dtype)
    assert r["verified"] is True
    sites = _global_stores(r)
    assert sites and all(s["text"].startswith("store2_f32(") for s in sites)
    t = r["totals"]["global_store"]
    isz = np.dtype(dtype).itemsize
    assert t["bytes"] == 128 * 128 * isz  # each result written once
    assert t["accesses"] == 128 * 128 // 2
    assert t["requests"] == 256 and t["sectors"] == 2048
    assert t["sectors"] == t["bytes"] // 32 * (4 // isz)  # float32: every byte of a sector


@pytest.mark.cudasim
@pytest.mark.simulator
def test_traced_stores_with_beta_load_c_in_pairs_too() -> None:
    from tilegemm.analysis.trace import trace_rung

    r = trace_rung("mma", 128, 128, 16, beta=1.0)
    assert r["verified"] is True
    loads = [s for s in r["sites"] if s["kind"] == "global load" and s["array"] == "C"]
    assert loads and all(s["text"].startswith("load2_f32(") for s in loads)
    assert sum(s["requests"] for s in loads) == 256
    assert sum(s["sectors"] for s in loads) == 2048


@pytest.mark.cudasim
@pytest.mark.simulator
def test_traced_stores_with_odd_n_take_both_paths() -> None:
    """N = 15, contiguous: the row stride is 15 floats, so a pair's address is a multiple
    of 8 bytes on even rows only, and column 14 has no partner. Both store paths are
    traced, every result is written once, and the result is right."""
    from tilegemm.analysis.trace import trace_rung

    r = trace_rung("mma", 32, 15, 16, params=MMA.sim_params)
    assert r["verified"] is True
    sites = _global_stores(r)
    kinds = {s["text"].split("(")[0] for s in sites}
    assert kinds == {"store2_f32", "store_f32"}
    assert r["totals"]["global_store"]["bytes"] == 32 * 15 * 4
    pairs = sum(s["accesses"] for s in sites if s["text"].startswith("store2_f32("))
    assert pairs == 16 * 7  # even rows, columns 0..13


@pytest.mark.cudasim
@pytest.mark.simulator
def test_traced_stores_of_wgmma_are_pairs() -> None:
    from tilegemm.analysis.trace import trace_rung

    r = trace_rung("wgmma", 64, 32, 64)
    assert r["verified"] is True
    sites = _global_stores(r)
    assert sites and all(s["text"].startswith("store2_f32(") for s in sites)
    t = r["totals"]["global_store"]
    assert (t["requests"], t["sectors"], t["bytes"]) == (32, 256, 64 * 32 * 4)


# --- results on the simulator ---------------------------------------------------------------

SENTINEL = 7.0  # in the padding around a view of C: must survive the launch


def _c_view(layout: str, batch: int, m: int, n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """(buffer, view of it as C, NaN-poisoned) for a layout:
    ``contiguous`` (row stride N), ``odd-ldc`` (row stride N + 1, odd for even N: every
    other row's pairs are misaligned), ``offset`` (starts one element into a buffer of row
    stride N + 2: every pair misaligned)."""
    pad = {"contiguous": 0, "odd-ldc": 1, "offset": 2}[layout]
    buf = np.full((batch, m, n + pad), SENTINEL, dtype)
    start = 1 if layout == "offset" else 0
    view = buf[:, :, start:start + n]
    view[...] = np.nan
    return buf, view


def _launch(spec: Any, mode: str, a: np.ndarray, b: np.ndarray, c: np.ndarray,
            alpha: float, beta: float) -> None:
    """The rung's simulator-sized program launched on ``c`` itself (a view is written in
    place, as on a GPU: the simulator's device array wraps it, no copy)."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    in_dtype, _, passes = MODES[mode]
    params = spec.resolve({**spec.sim_params, "PASSES": passes})
    program = spec.program(params, np.dtype(in_dtype))
    elem = np.int16 if np.dtype(in_dtype) == BF16 else in_dtype
    cview = c.view(np.int16) if c.dtype == BF16 else c
    program.launch(a.view(elem), b.view(elem), FakeCUDAArray(cview), np.float32(alpha),
                   np.float32(beta))


def _eps(spec: Any, mode: str) -> float | None:
    from tilegemm.precision import tolerance_eps

    in_dtype, _, passes = MODES[mode]
    return tolerance_eps(spec, {spec.precision_param: passes}, np.dtype(in_dtype))


def _check(spec: Any, mode: str, layout: str, batch: int, m: int, n: int, k: int,
           beta: float, rng: np.random.Generator) -> None:
    in_dtype, out_dtype, _ = MODES[mode]
    a = rng.standard_normal((batch, m, k)).astype(in_dtype)
    b = rng.standard_normal((1, k, n)).astype(in_dtype)  # broadcast over the batch
    buf, c = _c_view(layout, batch, m, n, out_dtype)
    c0 = rng.standard_normal((batch, m, n)).astype(out_dtype)
    if beta:
        c[...] = c0
    _launch(spec, mode, a, b, c, 1.5, beta)
    assert_close(c, a, b, alpha=1.5, beta=beta, c=c0 if beta else None,
                 what=f"{spec.name} {mode} {layout}", eps=_eps(spec, mode))
    mask = np.ones(buf.shape, bool)
    start = 1 if layout == "offset" else 0
    mask[:, :, start:start + n] = False
    assert np.all(buf[mask].astype(np.float64) == SENTINEL)  # nothing beyond the view


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("layout", "n", "beta"), [
    ("contiguous", 17, 0.0),  # odd N: misaligned odd rows, a last column without partner
    ("contiguous", 18, -0.5),  # every pair whole, C read in pairs
    ("odd-ldc", 18, 0.0),  # even N, odd row stride: half the rows one value at a time
    ("offset", 18, -0.5),  # a start 4 (16-bit: 2) bytes past alignment: no pair whole
])
def test_mma_results_on_every_layout_of_c(mode: str, layout: str, n: int, beta: float,
                                          rng: np.random.Generator) -> None:
    _check(MMA, mode, layout, 2, 20, n, 16, beta, rng)


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.parametrize(("mode", "layout", "n", "beta"), [
    ("tf32", "odd-ldc", 34, -0.5), ("bfloat16", "contiguous", 33, 0.0),
    ("3xtf32", "offset", 34, 0.0), ("float16->float32", "odd-ldc", 34, 0.0)])
def test_wgmma_results_on_views_of_c(mode: str, layout: str, n: int, beta: float,
                                     rng: np.random.Generator) -> None:
    _check(WGMMA, mode, layout, 2, 9, n, 64 if MODES[mode][0] != np.float32 else 32,
           beta, rng)


@pytest.mark.cudasim
@pytest.mark.simulator
def test_forcing_the_pair_path_on_an_odd_row_stride_is_caught(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a kernel whose pair test always says yes stores misaligned pairs
    on the odd-ldc view, which the simulator's pair store refuses (on a GPU: a misaligned
    address fault), so the tests above would catch a wrong test."""
    from tilegemm.kernels.cuda import _tensorcore, k10_mma

    ops = _tensorcore.tensorcore_ops()._replace(pair_aligned=lambda arr, idx: True)
    monkeypatch.setattr(k10_mma, "tensorcore_ops", lambda: ops)
    params = MMA.resolve({**MMA.sim_params, "PASSES": 1})
    program = MMA.build(params, np.dtype(np.float32))  # not the registry's cached one
    a = rng.standard_normal((1, 20, 16)).astype(np.float32)
    b = rng.standard_normal((1, 16, 18)).astype(np.float32)
    _, c = _c_view("odd-ldc", 1, 20, 18, np.float32)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    with pytest.raises(AssertionError, match="is not 8-byte aligned"):
        program.launch(a, b, FakeCUDAArray(c), np.float32(1), np.float32(0))


@pytest.mark.cudasim
@pytest.mark.simulator
def test_the_simulators_pair_test_reads_the_views_own_address() -> None:
    """The stand-in of pair_aligned asks the host array's real data pointer (the kernel
    sees the simulator's wrapper of it), so a view starting one float past an 8-byte
    boundary is refused on every row, and its neighbour view accepted."""
    from numba.cuda.simulator.cudadrv.devicearray import (
        FakeCUDAArray,
        FakeWithinKernelCUDAArray,
    )

    from tilegemm.kernels.cuda._tensorcore import _py_pair_aligned

    buf = np.zeros((1, 4, 10), np.float32)
    assert buf.__array_interface__["data"][0] % 8 == 0
    inside = FakeWithinKernelCUDAArray(FakeCUDAArray(buf[:, :, 1:9]))
    aligned = FakeWithinKernelCUDAArray(FakeCUDAArray(buf[:, :, 0:8]))
    for row in range(4):
        assert not _py_pair_aligned(inside, (0, row, 0))
        assert _py_pair_aligned(aligned, (0, row, 2))
    column = FakeWithinKernelCUDAArray(FakeCUDAArray(buf[:, :, ::2]))
    assert not _py_pair_aligned(column, (0, 0, 0))  # a strided last axis: never a pair
