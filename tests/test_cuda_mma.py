"""Rung ``mma`` (tensor cores) and ``precision=``: results against float64 with the error
model of each precision, the errors for requests nothing can compute, and the compiled
machine code (HMMA, no local memory)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import tilegemm
from conftest import record_async_copies, transposed_device_array
from tilegemm import registry
from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError
from tilegemm.kernels.cuda._tensorcore import tf32_round

SPEC = registry.get("mma", "cuda")


def _operands(rng: np.random.Generator, a_shape: tuple, b_shape: tuple) -> tuple:
    return (rng.standard_normal(a_shape).astype(np.float32),
            rng.standard_normal(b_shape).astype(np.float32))


def _sim(**over: int) -> dict[str, int]:
    return {k: v for k, v in SPEC.sim_params.items() if k != "PASSES"} | over


# (a shape, b shape): partial tiles on every edge, K % 4 != 0 (the 4-byte copy path) and
# == 0 (the 16-byte path), K below one stage, batches with B broadcast, a 1×K row.
CASES = [((7, 13), (13, 5)), ((2, 20, 12), (12, 9)), ((1, 9), (9, 17)),
         ((3, 4), (4, 1))]


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape"), CASES)
def test_tf32_is_the_product_of_tf32_rounded_operands(a_shape: tuple, b_shape: tuple,
                                                     rng: np.random.Generator) -> None:
    a, b = _operands(rng, a_shape, b_shape)
    r = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="mma", **_sim())
    assert r.dtype == np.float32 and r.shape == np.matmul(a, b).shape
    k = a.shape[-1]
    exact_tf32 = np.matmul(tf32_round(a).astype(np.float64), tf32_round(b))
    # float32 accumulation of k exact products (TF32 × TF32 fits a float32)
    assert np.max(np.abs(r - exact_tf32)) <= 4 * k * 2.0**-24 * np.max(np.abs(exact_tf32)) + 1e-6


@pytest.mark.cudasim
def test_rounded_copies_give_the_in_kernel_rounding_bit_for_bit(
        rng: np.random.Generator) -> None:
    """RCOPY=1: A and B rounded to TF32 by copies made before the kernel, which then skips
    its rounding pass in shared memory; the same rounding (to nearest), so the same bits,
    on edge tiles, K % 4 != 0 and a batch with B broadcast."""
    for a_shape, b_shape in CASES[:2]:
        a, b = _operands(rng, a_shape, b_shape)
        kw = {"backend": "cuda", "precision": "tf32", "kernel": "mma"}
        copied = tilegemm.matmul(a, b, **kw, **_sim(RCOPY=1))
        in_kernel = tilegemm.matmul(a, b, **kw, **_sim(RCOPY=0))
        assert np.array_equal(copied, in_kernel), (a_shape, b_shape)
    with pytest.raises(InvalidValueError, match="RCOPY=1"):
        tilegemm.matmul(a, b, backend="cuda", precision="3xtf32", kernel="mma",
                        **_sim(RCOPY=1))


@pytest.mark.cudasim
@pytest.mark.parametrize(("mode", "rcopy", "k"), [("float16", 0, 48), ("tf32", 0, 20),
                                                   ("tf32", 1, 13), ("3xtf32", 0, 20)])
def test_transposed_device_operands_are_copied_row_major(mode: str, rcopy: int, k: int,
                                                         rng: np.random.Generator,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Device operands laid out the other way (A M-major as in ``x.T @ y``, B K-major as
    in ``x @ w.T``, its rows off 16 bytes at K = 13) get copies in the kernel's layout,
    made by one launch, instead of the plain loads on every k-tile; the copies' padded rows
    (K = 13 -> 16, N = 37 -> 40 in float32) are poisoned with NaN, which must not reach
    the result, and their tiles go by whole 16-byte copies though K = 13 and N = 37 are
    not whole chunks. Row-major operands are not copied (RCOPY=0); with RCOPY=1 both are
    copied, rounded, either way."""
    from tilegemm.kernels.cuda._kmajor import kmajor_shape

    dtype = np.float16 if mode == "float16" else np.float32
    program = SPEC.program(SPEC.resolve(_sim(RCOPY=rcopy, PASSES=3 if mode == "3xtf32"
                                             else 1)), dtype)
    program.workspaces._spaces.clear()
    isz = np.dtype(dtype).itemsize
    # the transposing copies' workspaces: of A's (1, K, M) view, of B's (1, N, K) view
    works = []
    for slot, shape in (("A", (1, k, 40)), ("B", (1, 37, k))):
        work = program.workspaces.get(kmajor_shape(shape, isz), np.dtype(dtype), 0, slot)
        work.copy_to_device(np.full(work.shape, np.nan, dtype=dtype))
        works.append((work, shape[1]))
    a, a_host = transposed_device_array(rng, (40, k), dtype)  # A M-major
    b, b_host = transposed_device_array(rng, (k, 37), dtype)  # B K-major
    over = {"dtype": np.float32} if mode == "float16" else {"precision": mode}
    copies = record_async_copies(monkeypatch)
    r = tilegemm.matmul(a, b, backend="cuda", kernel="mma", **over, **_sim(RCOPY=rcopy))
    r = r.copy_to_host()
    a64, b64 = a_host.astype(np.float64), b_host.astype(np.float64)
    if mode == "tf32":
        a64, b64 = tf32_round(a_host).astype(np.float64), tf32_round(b_host)
    assert not np.isnan(r).any()
    tol = 2.0**-22 if mode == "3xtf32" else 2.0**-24
    scale = np.matmul(np.abs(a64), np.abs(b64))
    assert np.all(np.abs(r - np.matmul(a64, b64)) <= 4 * k * tol * scale + 1e-6)
    # both copies made, into these workspaces (padding left), and read by 16-byte copies
    # (the simulator's launches use the stream the workspaces were taken for here)
    from tilegemm import simulator

    if simulator.enabled():
        for work, cols in works:
            assert np.isfinite(work.copy_to_host()[:, :, :cols]).all()
        assert ((1, 40, k), 16) in copies and ((1, k, 37), 16) in copies
    program.workspaces._spaces.clear()
    tilegemm.matmul(a_host, b_host, backend="cuda", kernel="mma", **over, **_sim(RCOPY=rcopy))
    assert {key[-1] for key in program.workspaces._spaces} == ({"A", "B"} if rcopy else set())


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape"), CASES[:2])
def test_3xtf32_is_near_float32_and_better_than_tf32(a_shape: tuple, b_shape: tuple,
                                                     rng: np.random.Generator) -> None:
    a, b = _operands(rng, a_shape, b_shape)
    want = np.matmul(a.astype(np.float64), b)
    r3 = tilegemm.matmul(a, b, backend="cuda", precision="3xtf32", kernel="mma", **_sim())
    r1 = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="mma", **_sim())
    k = a.shape[-1]
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
    assert np.all(np.abs(r3 - want) <= 4 * k * 2.0**-22 * scale)  # float32-like
    assert np.max(np.abs(r1 - want)) > 8 * np.max(np.abs(r3 - want))  # the passes matter


@pytest.mark.cudasim
def test_3xtf32_stays_float32_like_over_a_long_k(rng: np.random.Generator) -> None:
    """The tensor core's sums are truncated, not rounded (the simulator's emulation does
    the same, :func:`~tilegemm.kernels.cuda._tensorcore.sum_to_float32`): 3×TF32 summed
    over all of K in the tensor core had 3× NumPy float32's error at K = 128 here, 12×
    SGEMM's at 4096³ on an H100. Each k step's products go into a fresh partial that the
    thread adds in float32: within 2**-22 of |A|·|B| elementwise, where float32 lands."""
    a, b = _operands(rng, (32, 128), (128, 16))
    r = tilegemm.matmul(a, b, backend="cuda", precision="3xtf32", kernel="mma", **_sim())
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
    err = np.abs(r - np.matmul(a.astype(np.float64), b)) / scale
    assert np.max(err) <= 2.0**-22, np.max(err)


@pytest.mark.cudasim
def test_gemm_alpha_beta_and_auto_with_precision(rng: np.random.Generator) -> None:
    a, b = _operands(rng, (9, 6), (6, 11))
    c = rng.standard_normal((9, 11)).astype(np.float32)
    r = tilegemm.gemm(a, b, c, alpha=2.0, beta=-0.5, backend="cuda", precision="3xtf32")
    want = 2.0 * np.matmul(a.astype(np.float64), b) - 0.5 * c
    assert np.max(np.abs(r - want)) < 1e-4


# --- refused requests (no kernel runs) ------------------------------------------------------


def test_unknown_precision_lists_the_choices() -> None:
    a = np.ones((2, 2), np.float32)
    with pytest.raises(InvalidValueError, match="'ieee', 'tf32', '3xtf32'"):
        tilegemm.matmul(a, a, precision="fp8")


def test_precision_on_a_backend_without_tensor_cores_is_refused() -> None:
    a = np.ones((2, 2), np.float32)
    with pytest.raises(UnavailableError, match="backend 'cpu' has no tensor-core.*: cuda"):
        tilegemm.matmul(a, a, backend="cpu", precision="tf32")


def test_precision_for_float64_is_refused() -> None:
    a = np.ones((2, 2))
    with pytest.raises(InvalidTypeError, match="float32 operands; float64"):
        tilegemm.matmul(a, a, backend="cpu", precision="3xtf32")


@pytest.mark.cudasim
def test_tensor_core_rung_needs_precision_and_a_consistent_passes() -> None:
    a = np.ones((2, 2), np.float32)
    with pytest.raises(InvalidValueError, match="pass precision= one of 'tf32', '3xtf32'"):
        tilegemm.matmul(a, a, backend="cuda", kernel="mma", **_sim())
    with pytest.raises(InvalidValueError, match="PASSES=1 contradicts precision='3xtf32'"):
        tilegemm.matmul(a, a, backend="cuda", kernel="mma", precision="3xtf32",
                        **_sim(PASSES=1))
    with pytest.raises(InvalidValueError, match="cannot compute precision='tf32'"):
        tilegemm.matmul(a, a, backend="cuda", kernel="pipelined", precision="tf32")
    # float64 operands: the message names what the rung computes, not a precision= that
    # would then be refused for float64
    with pytest.raises(InvalidTypeError, match="float16 and bfloat16 operands.*not float64"):
        tilegemm.matmul(a.astype(np.float64), a, backend="cuda", kernel="mma", **_sim())
    # 16-bit operands have one mma mode: PASSES=3 was accepted and ran one pass
    h = a.astype(np.float16)
    with pytest.raises(InvalidValueError, match="float16 takes one mma per step"):
        tilegemm.plan(h, h, backend="cuda", kernel="mma", **_sim(PASSES=3))
    with pytest.raises(InvalidValueError, match="float16 takes one wgmma per k step"):
        tilegemm.plan(h, h, backend="cuda", kernel="wgmma", BM=64, BN=16, STAGES=3, PASSES=3)


def test_auto_at_ieee_never_picks_a_tensor_core_rung() -> None:
    assert registry.default_for("cuda", "float32").name != "mma"
    assert not SPEC.supports("float64")


# --- machine code ---------------------------------------------------------------------------


def _sass_without_local_memory(dtype: str, arch: str,
                               **over: int) -> tuple[dict[str, int], str, int]:
    """The rung at its defaults (with ``over``) compiled for ``arch``: no spills, no stack
    frame, no LDL/STL in the SASS. Returns the parameters, the SASS text and the HMMA of one
    warp-tile k step."""
    from tilegemm.analysis.resources import cuda_resources, ptx_for
    from tilegemm.analysis.sass import disassemble, link_cubin

    params = SPEC.defaults() | over
    r = cuda_resources(SPEC, params, dtype, arch)
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    ptx = ptx_for(SPEC, params, dtype, arch)
    # the ring is one dynamic buffer, 16-byte aligned for cp.async and ldmatrix, and none
    # of it static (sm_90 reports the 1 KB the driver reserves per block)
    assert re.search(r"\.extern \.shared \.align 16 \.b8 \w+\[\]", ptx), ptx[:2000]
    assert r.smem == (1024 if arch == "sm_90" else 0)
    text = disassemble(link_cubin(ptx, arch))
    assert not re.search(r"\b(LDL|STL)(\.|\s)", text)
    return params, text, (params["WM"] // 16) * (params["WN"] // 8)


@pytest.mark.ptx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_hmma_in_sass_and_no_local_memory(arch: str) -> None:
    params, text, per_step = _sass_without_local_memory("float32", arch)
    assert SPEC.smem(params, 4) > 48 * 1024  # the defaults need the opt-in
    hmma = re.findall(r"HMMA\.1688\.F32\.TF32", text)
    assert hmma and len(hmma) % per_step == 0  # whole k steps of the warp tile
    assert re.search(r"LDSM\.16\.M88\.4", text) and re.search(r"LDGSTS\.E\.BYPASS\.128", text)
    from tilegemm.analysis.sass_mma import count

    c = count(text, kernel="mma", arch=arch, dtype="float32", params=params)
    # the hot loop holds whole k steps of the warp tile, fed by ldmatrix, no local memory
    assert c.hot["HMMA"] % per_step == 0 and c.hot["LDSM"] == c.hot["HMMA"] // (
        params["WN"] // 8)
    assert c.local_memory == 0 and 0 < c.hmma_share < 1


@pytest.mark.ptx
@pytest.mark.slow  # two more compilations (~12 s)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_float16_hmma_and_transposed_ldmatrix_without_local_memory(arch: str) -> None:
    _, text, per_step = _sass_without_local_memory("float16", arch)
    hmma = re.findall(r"HMMA\.16816\.F32\b", text)
    assert hmma and len(hmma) % per_step == 0
    assert re.search(r"LDSM\.16\.MT88\.4", text) and re.search(r"LDSM\.16\.M88\.4", text)


@pytest.mark.ptx
@pytest.mark.slow  # one compilation (~15 s; TF32's, also 255 registers without spills, ~25 s)
def test_a_64x64_warp_tile_fits_the_registers() -> None:
    """A 64×64 warp tile (four warps a 128×128 block) reads a third less shared memory per
    multiply-add than the default 64×32, at 255 registers on sm_80: it must stay without
    local memory for a GPU to time it (docs/tensor-cores.md)."""
    params, text, per_step = _sass_without_local_memory("float16", "sm_80", WN=64)
    assert per_step == 32 and SPEC.threads(params) == 128
    assert len(re.findall(r"HMMA\.(1688|16816)\.F32", text)) % per_step == 0


@pytest.mark.ptx
def test_bfloat16_hmma_without_local_memory() -> None:
    _, text, per_step = _sass_without_local_memory("bfloat16", "sm_80")
    hmma = re.findall(r"HMMA\.16816\.F32\.BF16\b", text)
    assert hmma and len(hmma) % per_step == 0
    assert re.search(r"F2FP\.BF16", text)  # the epilogue's cvt.rn.bf16.f32


# --- float16 ------------------------------------------------------------------------------


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape"), [((7, 21), (21, 13)), ((2, 17, 16), (16, 9))])
def test_float16_products_accumulate_in_float32(a_shape: tuple, b_shape: tuple,
                                                rng: np.random.Generator) -> None:
    # K = 21: rows not 16-byte aligned (the plain-load path); K = 16: the cp.async path.
    a = rng.standard_normal(a_shape).astype(np.float16)
    b = rng.standard_normal(b_shape).astype(np.float16)
    r = tilegemm.matmul(a, b, backend="cuda")  # auto: float16 runs on tensor cores
    assert r.dtype == np.float16 and r.shape == np.matmul(a, b).shape
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    # exact float16 inputs, float32 sums: only the final rounding to float16 remains
    assert np.all(np.abs(r - want) <= np.abs(want) * 2.0**-11 + 1e-3)


def test_float16_elsewhere_is_computed_in_float32_and_a_precision_is_refused() -> None:
    """Without a tensor-core rung, float16 is accumulated in float32 and rounded back, as
    NumPy's own float16 matmul does; precision= still needs tensor cores."""
    a = np.full((2, 3), 0.5, np.float16)
    r = tilegemm.matmul(a, a.T, backend="cpu")
    assert r.dtype == np.float16 and np.all(r == np.matmul(a, a.T))
    with pytest.raises(UnavailableError, match="needs tensor cores"):
        tilegemm.matmul(a, a.T, backend="cpu", precision="tf32")


# --- bfloat16, and float32 output on request ---------------------------------------------

BF16 = np.dtype("bfloat16")  # ml_dtypes.bfloat16 (tilegemm imports ml_dtypes)


def _half_operands(rng: np.random.Generator, a_shape: tuple, b_shape: tuple,
                   dtype: np.dtype) -> tuple:
    return (rng.standard_normal(a_shape).astype(dtype),
            rng.standard_normal(b_shape).astype(dtype))


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape"), [((7, 21), (21, 13)), ((2, 17, 16), (16, 9))])
def test_bfloat16_products_accumulate_in_float32(a_shape: tuple, b_shape: tuple,
                                                 rng: np.random.Generator) -> None:
    # K = 21: the plain-load path (rows not 16-byte aligned); K = 16: cp.async, a batch
    # with B broadcast. Odd M and N: partial tiles on both edges.
    a, b = _half_operands(rng, a_shape, b_shape, BF16)
    r = tilegemm.matmul(a, b, backend="cuda")  # auto: bfloat16 runs on tensor cores
    # NumPy arrays: np.matmul's dtype, float32 (ml_dtypes computes bfloat16 in float32)
    assert r.dtype == np.matmul(a, b).dtype == np.float32 and r.shape == np.matmul(a, b).shape
    want = _exact(a, b)
    # exact bfloat16 inputs, so products are exact in float32: float32 sums only
    tol = a.shape[-1] * 2.0**-24 * _exact(np.abs(a), np.abs(b))
    assert np.all(np.abs(r - want) <= tol)
    out = np.empty(want.shape, BF16)  # a bfloat16 out: the same sums, rounded once
    assert tilegemm.matmul(a, b, out, backend="cuda") is out
    err = np.abs(out.astype(np.float64) - want)
    assert np.all(err <= np.abs(want) * 2.0**-8 + 1e-6 * np.sqrt(a.shape[-1]))


@pytest.mark.cudasim
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scalars_of_a_float32_result_are_not_rounded_to_16_bits(dtype: str) -> None:
    """alpha=0.1 was rounded to bfloat16 (0.10009765625) before the float32 kernel scaled
    a float32 result with it: 102.5 for 0.1 · 1024. A Decimal alpha raised bfloat16's own
    TypeError."""
    from decimal import Decimal

    a, b = np.full((2, 16), 8, dtype), np.full((16, 2), 8, dtype)
    c = np.full((2, 2), 1000, np.float32)
    kw = {"backend": "cuda"} | ({} if dtype == "bfloat16" else {"dtype": np.float32})
    r = tilegemm.gemm(a, b, c, alpha=0.1, beta=0.3, **kw)
    assert r.dtype == np.float32
    np.testing.assert_allclose(r, np.float32(0.1) * np.float32(1024) + np.float32(300),
                               rtol=2**-22)
    np.testing.assert_array_equal(tilegemm.gemm(a, b, alpha=Decimal("0.5"), **kw), 512.0)


@pytest.mark.cudasim
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float32_output_on_request_keeps_the_float32_sums(dtype: str,
                                                           rng: np.random.Generator) -> None:
    a, b = _half_operands(rng, (2, 9, 24), (24, 11), np.dtype(dtype))
    want = _exact(a, b)
    r = tilegemm.matmul(a, b, backend="cuda", dtype=np.float32)
    assert r.dtype == np.float32 and r.shape == want.shape
    k = a.shape[-1]  # products of 16-bit values are exact in float32: float32 sums only
    tol = k * 2.0**-24 * _exact(np.abs(a), np.abs(b))
    assert np.all(np.abs(r - want) <= tol)
    rounded = tilegemm.matmul(a, b, np.empty(want.shape, a.dtype), backend="cuda")
    assert np.max(np.abs(r - want)) < np.max(np.abs(
        rounded.astype(np.float64) - want))  # not rounded
    out = np.full(want.shape, np.nan, np.float32)  # a float32 out asks for the same
    assert tilegemm.matmul(a, b, out, backend="cuda") is out
    assert np.array_equal(out, r)


@pytest.mark.cudasim
@pytest.mark.simulator
def test_bfloat16_numba_device_arrays_are_refused_before_anything_is_written(
        rng: np.random.Generator) -> None:
    """numba has no bfloat16 type; its simulator held ml_dtypes arrays anyway, and the
    kernel read their values as 16-bit integers: the product came back as zeros. (On a GPU
    numba cannot make such an array: ``cuda.to_device`` refuses the dtype itself.)"""
    from numba import cuda

    a, b = _half_operands(rng, (9, 5), (5, 7), BF16)
    out = cuda.to_device(np.full((9, 7), np.nan, np.float32))
    with pytest.raises(TypeError, match="torch.bfloat16"):
        tilegemm.matmul(cuda.to_device(a), cuda.to_device(b), out, backend="cuda")
    assert np.isnan(out.copy_to_host()).all()


@pytest.mark.cudasim
def test_bfloat16_gemm_alpha_beta_reads_c(rng: np.random.Generator) -> None:
    a, b = _half_operands(rng, (9, 16), (16, 7), BF16)
    c = rng.standard_normal((9, 7)).astype(BF16)
    r = tilegemm.gemm(a, b, c, alpha=2.0, beta=-0.5, backend="cuda")
    want = 2.0 * _exact(a, b) - 0.5 * c.astype(np.float64)
    assert r.dtype == np.float32  # np.matmul's dtype for NumPy bfloat16 arrays
    assert np.max(np.abs(r - want)) < 1e-5
    r32 = tilegemm.gemm(a, b, c, alpha=2.0, beta=-0.5, backend="cuda", dtype=np.float32)
    assert r32.dtype == np.float32 and np.max(np.abs(r32 - want)) < 1e-5


def test_bfloat16_elsewhere_is_computed_in_float32_and_rounded_back(
        rng: np.random.Generator) -> None:
    """Backends without tensor cores accumulate in float32; the result is float32, as
    np.matmul's for NumPy bfloat16 arrays, and a bfloat16 out= is rounded once."""
    a, b = _half_operands(rng, (5, 7), (7, 3), BF16)
    want32 = np.matmul(a.astype(np.float32), b.astype(np.float32))
    r = tilegemm.matmul(a, b, backend="cpu")
    assert r.dtype == np.float32 and np.allclose(r, want32, rtol=1e-6, atol=1e-6)
    out = tilegemm.matmul(a, b, np.empty((5, 3), BF16), backend="cpu")
    assert out.dtype == BF16 and np.array_equal(out, want32.astype(BF16))
    r32 = tilegemm.matmul(a, b, backend="cpu", dtype=np.float32)
    assert r32.dtype == np.float32 and np.allclose(r32, want32, rtol=1e-6, atol=1e-6)
    with pytest.raises(UnavailableError, match="needs tensor cores"):
        tilegemm.matmul(a, b, backend="cpu", precision="tf32")


@pytest.mark.opencl
def test_bfloat16_on_opencl_is_computed_in_float32(rng: np.random.Generator) -> None:
    a, b = _half_operands(rng, (6, 5), (5, 4), BF16)
    r = tilegemm.matmul(a, b, backend="opencl")
    want32 = np.matmul(a.astype(np.float32), b.astype(np.float32))
    assert r.dtype == np.float32  # as np.matmul's for NumPy bfloat16 arrays
    assert np.all(np.abs(r - want32) <= np.abs(want32) * 2.0**-20 + 1e-6)


def test_dtype_argument_follows_numpy() -> None:
    a = np.ones((2, 3), np.float64)
    with pytest.raises(InvalidTypeError, match="from dtype\\('float64'\\) to dtype\\('int32'\\)"):
        tilegemm.matmul(a, a.T, backend="cpu", dtype=np.int32)
    # no common dtype for result_type, but np.matmul computes the pair (in float32)
    mixed = tilegemm.matmul(np.ones((2, 2), BF16), np.ones((2, 2), np.float16), backend="cpu")
    assert mixed.dtype == np.float32 and np.all(mixed == 2)
    r = tilegemm.matmul(np.ones((2, 3), np.int32), np.ones((3, 2), np.int32), backend="cpu",
                        dtype=np.float64)
    assert r.dtype == np.float64 and np.all(r == 3)


@pytest.mark.cudasim
def test_half_precision_requests_are_refused_with_the_choices() -> None:
    a = np.ones((4, 16), BF16)
    with pytest.raises(InvalidValueError, match="bfloat16 products always use tensor cores"):
        tilegemm.matmul(a, a.T, backend="cuda", precision="tf32")
    with pytest.raises(InvalidTypeError, match="supported result dtypes are .*bfloat16"):
        tilegemm.matmul(a, a.T, backend="cuda", dtype=np.complex64)


def test_an_untyped_cuda_array_is_refused_naming_the_bfloat16_route() -> None:
    class Untyped:  # what a CuPy array of ml_dtypes.bfloat16 would expose
        __cuda_array_interface__ = {"shape": (4, 4), "typestr": "|V2", "data": (0, False),
                                    "version": 3}

    with pytest.raises(InvalidTypeError, match="torch.bfloat16"):
        tilegemm.matmul(Untyped(), Untyped())


def test_a_torch_bfloat16_cuda_tensor_is_described_without_the_array_interface() -> None:
    from tilegemm.problem import array_kind, describe

    class Tensor:  # stands for torch.Tensor: bfloat16 has no __cuda_array_interface__
        dtype = "torch.bfloat16"
        is_cuda = True
        shape = (3, 5)

        @property
        def __cuda_array_interface__(self) -> dict:
            raise TypeError("dtype torch.bfloat16 is not supported")

    Tensor.__module__ = "torch"
    op = describe(Tensor(), "a")
    assert array_kind(Tensor()) == "cuda" and op.dtype == BF16 and op.shape == (3, 5)


# --- the interior path: blocks wholly inside the operands ------------------------------------
# With the simulator's 32×16×16 tiles and 2 stages, these shapes have interior blocks that run
# the unchecked copy loop for several k-tiles (offsets checked against the index by the
# simulator's cp.async), edge blocks on every side, a partial last k-tile, batches with a
# broadcast operand, and a strided (non-contiguous) A.
INTERIOR = [((70, 52), (52, 40), {}), ((2, 64, 48), (48, 33), {"STAGES": 3}),
            ((40, 64), (64, 64), {"BN": 32, "WN": 32}),
            # a 64×64 warp tile (8 fragments across): a third less shared memory read per
            # multiply-add than the default 64×32, for a GPU visit to time
            ((70, 48), (48, 72), {"BM": 64, "BN": 64, "WM": 64, "WN": 64})]


def _strided(x: np.ndarray) -> np.ndarray:
    """``x`` as a view with a row stride larger than its rows (still 16-byte aligned)."""
    pad = np.zeros(x.shape[:-1] + (x.shape[-1] + 8,), x.dtype)
    pad[..., : x.shape[-1]] = x
    return pad[..., : x.shape[-1]]


# 3×TF32 differs from TF32 only in the split into big and small parts in shared memory
# (checked on every edge and the deep ring below): one shape, the batched 3-stage one whose
# small parts alternate between the two slots, is enough (each case costs 15 s here).
TF32_INTERIOR = ([("tf32", *case) for case in INTERIOR] + [("3xtf32", *INTERIOR[1])])


@pytest.mark.cudasim
@pytest.mark.parametrize(("precision", "a_shape", "b_shape", "over"), TF32_INTERIOR)
def test_interior_blocks_tf32(a_shape: tuple, b_shape: tuple, over: dict, precision: str,
                              rng: np.random.Generator) -> None:
    a, b = _operands(rng, a_shape, b_shape)
    a = _strided(a)
    r = tilegemm.matmul(a, b, backend="cuda", precision=precision, kernel="mma",
                        **_sim(**over))
    k = a.shape[-1]
    if precision == "tf32":
        want = np.matmul(tf32_round(a).astype(np.float64), tf32_round(b))
        tol = 4 * k * 2.0**-24 * np.max(np.abs(want)) + 1e-6
        assert np.max(np.abs(r - want)) <= tol
    else:
        want = np.matmul(a.astype(np.float64), b)
        scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
        assert np.all(np.abs(r - want) <= 4 * k * 2.0**-22 * scale)


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape", "over"), INTERIOR)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_interior_blocks_16bit(a_shape: tuple, b_shape: tuple, over: dict, dtype: str,
                               rng: np.random.Generator) -> None:
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        nptype: Any = ml_dtypes.bfloat16
    else:
        nptype = np.float16
    a, b = (x.astype(nptype) for x in _operands(rng, a_shape, b_shape))
    a = _strided(a)
    r = tilegemm.matmul(a, b, backend="cuda", kernel="mma", dtype=np.float32,
                        **_sim(**over))
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    k = a.shape[-1]
    assert r.dtype == np.float32
    assert np.max(np.abs(r - want)) <= 4 * k * 2.0**-24 * np.max(np.abs(want)) + 1e-6


@pytest.mark.cudasim
def test_tf32_rounding_in_shared_memory_keeps_nan_and_inf(rng: np.random.Generator) -> None:
    a, b = _operands(rng, (40, 32), (32, 32))
    a[3, 5], a[36, 20], b[7, 30] = np.nan, np.inf, -np.inf
    r = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="mma", **_sim())
    with np.errstate(invalid="ignore"):
        want = np.matmul(tf32_round(a).astype(np.float64), tf32_round(b))
    assert np.array_equal(np.isnan(r), np.isnan(want))
    assert np.array_equal(np.isinf(r), np.isinf(want))
    fin = np.isfinite(want)
    assert np.max(np.abs(r[fin] - want[fin])) <= 4 * 32 * 2.0**-24 * np.max(np.abs(want[fin]))


# --- dynamic shared memory (the cp.async ring above 48 KB) ----------------------------------
# A 4-stage ring of 64×64×32 tiles: 64 KB in float32, beyond the 48 KB a kernel may declare
# statically, small enough for the simulator (2 warps of 64×32).
DEEP = {"BM": 64, "BN": 64, "BK": 32, "WM": 64, "WN": 32, "STAGES": 4, "GROUP_M": 2}
# (a shape, b shape): odd M, N, K (the 4-byte and plain-load copy paths, partial tiles on
# every edge), for every mode; and for one 32- and one 16-bit mode an aligned shape whose one
# block runs the unchecked copy loop for K/BK - (STAGES - 1) = 2 k-tiles, then the last 3.
DEEP_CASES = [(mode, (67, 45), (45, 35)) for mode in ("tf32", "3xtf32", "float16", "bfloat16")
              ] + [(mode, (64, 160), (160, 64)) for mode in ("tf32", "float16")]


@pytest.mark.cudasim
@pytest.mark.slow  # 20-60 s each in the simulator
@pytest.mark.parametrize(("mode", "a_shape", "b_shape"), DEEP_CASES)
def test_deep_ring_in_dynamic_shared_memory(a_shape: tuple, b_shape: tuple, mode: str,
                                            rng: np.random.Generator) -> None:
    assert SPEC.smem(DEEP, 4) > 48 * 1024  # float32: more than static memory allows
    a, b = _operands(rng, a_shape, b_shape)
    k = a.shape[-1]
    if mode in ("tf32", "3xtf32"):
        r = tilegemm.matmul(a, b, backend="cuda", kernel="mma", precision=mode, **DEEP)
        if mode == "tf32":
            want = np.matmul(tf32_round(a).astype(np.float64), tf32_round(b))
            scale = np.matmul(np.abs(tf32_round(a)).astype(np.float64), np.abs(tf32_round(b)))
            bound = 4 * k * 2.0**-24 * scale
        else:
            want = np.matmul(a.astype(np.float64), b)
            bound = 4 * k * 2.0**-22 * np.matmul(np.abs(a).astype(np.float64), np.abs(b))
    else:
        nptype: Any = (pytest.importorskip("ml_dtypes").bfloat16 if mode == "bfloat16"
                       else np.float16)
        a, b = a.astype(nptype), b.astype(nptype)
        r = tilegemm.matmul(a, b, backend="cuda", kernel="mma", dtype=np.float32, **DEEP)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        bound = 4 * k * 2.0**-24 * np.matmul(np.abs(a).astype(np.float64),
                                            np.abs(b).astype(np.float64))
    assert r.shape == want.shape and r.dtype == np.float32
    assert np.all(np.abs(r - want) <= bound + 1e-30)  # NaN (a missed element) fails too


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.slow  # two launches in the simulator
def test_a_launch_one_stage_short_of_shared_memory_fails(rng: np.random.Generator,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the ring lives in the launch's dynamic shared memory, so a launch
    that gives it one 16-byte chunk less must fail (the simulator checks every offset)."""
    import dataclasses
    import threading

    from tilegemm.kernels.cuda import _tensorcore

    # when the simulator misses the failed lane, its warp-mates wait out the emulation's
    # barrier timeout: 5 s here rather than 120 s
    monkeypatch.setattr(_tensorcore, "_TIMEOUT", 5.0)

    p = SPEC.resolve({**_sim(), "PASSES": 1})
    program = SPEC.program(p, np.float32)
    assert program.dynamic_smem == SPEC.smem(p, 4)
    a, b = _operands(rng, (1, 32, 32), (1, 32, 16))
    c = np.full((1, 32, 16), np.nan, np.float32)
    program.launch(a, b, c, np.float32(1), np.float32(0))
    assert np.allclose(c, np.matmul(a, b), rtol=1e-2, atol=1e-2)
    short = dataclasses.replace(program, dynamic_smem=program.dynamic_smem - 16)
    # the thread that reaches past the buffer raises IndexError ("outside a shared array");
    # the simulator may report instead the broken barrier its block-mates then see
    with pytest.raises((IndexError, threading.BrokenBarrierError)):
        short.launch(a, b, c, np.float32(1), np.float32(0))


class _FakeDispatcher:
    """Stands for a numba dispatcher on a real GPU: records compiles and launches; its one
    kernel is loaded as ``handle`` on device ``device``."""

    def __init__(self, handle: int = 0xBEEF, device: int = 3) -> None:
        from types import SimpleNamespace

        cufunc = SimpleNamespace(handle=handle, device=SimpleNamespace(id=device))
        self.kernel = SimpleNamespace(_codelibrary=SimpleNamespace(get_cufunc=lambda: cufunc))
        self.compiled: list[tuple] = []
        self.launches: list[tuple] = []

    def typeof_pyval(self, value: Any) -> str:
        return type(value).__name__

    def compile(self, sig: tuple) -> Any:
        self.compiled.append(sig)
        return self.kernel

    def __getitem__(self, config: tuple) -> Any:
        return lambda *args: self.launches.append((config, args))


MAX_DYNAMIC = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES in CUDA's driver API


def test_opt_in_only_ever_raises_the_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set once per kernel and device and larger size: the attribute is a maximum, so a
    smaller launch after a larger one sets nothing, and lowering it would make a later
    larger launch fail (CUDA_ERROR_INVALID_VALUE)."""
    from tilegemm.backends import cuda_program

    monkeypatch.setattr(cuda_program, "_OPTED_IN", {})
    calls: list[tuple] = []
    disp = _FakeDispatcher()
    for nbytes in (98304, 98304, 65536, 98304, 131072):
        cuda_program.opt_in_dynamic_shared(disp.kernel, nbytes,
                                           set_attribute=lambda *a: calls.append(a))
    assert [(int(a), v, h, d) for a, v, h, d in calls] == [
        (MAX_DYNAMIC, 98304, 0xBEEF, 3), (MAX_DYNAMIC, 131072, 0xBEEF, 3)]


def test_opt_in_goes_through_numbas_driver_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm import simulator
    from tilegemm.backends import cuda_program

    if simulator.enabled():
        pytest.skip("numba's driver module is the simulator's here")
    from numba.cuda.cudadrv import driver as numba_driver

    monkeypatch.setattr(cuda_program, "_OPTED_IN", {})
    calls: list[tuple] = []
    # an instance attribute, so numba's lazy lookup (which needs a driver) is not reached
    monkeypatch.setitem(vars(numba_driver.driver), "cuKernelSetAttribute",
                        lambda *a: calls.append(a))
    cuda_program.opt_in_dynamic_shared(_FakeDispatcher(7, 0).kernel, 65536)
    assert [(int(a), v, h, d) for a, v, h, d in calls] == [(MAX_DYNAMIC, 65536, 7, 0)]


@pytest.mark.parametrize(("nbytes", "sim", "opted"), [(96 * 1024, False, True),
                                                      (48 * 1024, False, False),
                                                      (96 * 1024, True, False)])
def test_launch_opts_in_only_above_48_kb_on_a_gpu(nbytes: int, sim: bool, opted: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm import simulator
    from tilegemm.backends import cuda_program

    seen: list[tuple] = []
    monkeypatch.setattr(simulator, "enabled", lambda: sim)
    monkeypatch.setattr(cuda_program, "opt_in_dynamic_shared",
                        lambda kernel, n: seen.append((kernel, n)))
    disp = _FakeDispatcher()
    prog = cuda_program.CudaProgram(disp, (256, 1, 1), lambda b, m, n: (4, 1, b),
                                    dynamic_smem=nbytes)
    c = np.zeros((2, 3, 5))
    prog.launch("A", "B", c, 1.0, 0.0, stream=0)
    # the kernel opted in is the one compiled for these arguments' types
    assert seen == ([(disp.kernel, nbytes)] if opted else [])
    if opted:
        assert disp.compiled == [("str", "str", "ndarray", "float", "float")]
    # numba's launch configuration: grid, block, stream, then the dynamic shared bytes
    assert disp.launches[0][0] == ((4, 1, 2), (256, 1, 1), 0, nbytes)


def test_a_ring_beyond_the_devices_opt_in_maximum_is_refused() -> None:
    """The limit checks use the device's opt-in maximum for this rung (not the static 48
    KB), and name it when a ring exceeds it: 99 KB on an sm_86 GPU."""
    from tilegemm.backends.base import Limits, Target
    from tilegemm.backends.cuda import CudaBackend

    target = Target("cuda", "Fake sm_86", "gpu", "sm_86",
                    Limits(1024, shared_per_block=48 * 1024, shared_optin_per_block=99 * 1024),
                    "CUDA events", capability=(8, 6))
    fits = SPEC.resolve({"BK": 32, "STAGES": 3, "PASSES": 1})  # 96 KB in float32
    CudaBackend().check_limits(SPEC, fits, np.dtype(np.float32), target)
    deep = SPEC.resolve({"BK": 32, "STAGES": 4, "PASSES": 1})  # 128 KB
    with pytest.raises(InvalidValueError, match=r"131072 bytes .* 101376-byte limit "
                                                r"\(dynamic shared memory, opted in\)"):
        CudaBackend().check_limits(SPEC, deep, np.dtype(np.float32), target)


@pytest.mark.ptx  # the compiled-path kernel (nothing is compiled)
@pytest.mark.parametrize("dtype, passes", [("float32", 1), ("float32", 3), ("float16", 1)])
def test_generated_kernel_keeps_numbas_compile_passes_short(dtype: str, passes: int) -> None:
    """numba's SSA reconstruction rewrites the whole kernel once per name assigned in more
    than one place, and every later pass walks every block: the k steps of the interior
    and the edge loop have names of their own, so only the loop state is reassigned, and
    the epilogue's stores and (with a power-of-two ring) the checked loader are inlined by
    NVVM, not copied into the kernel by numba (same machine code; docs/performance.md)."""
    import ast
    import inspect
    from collections import Counter

    program = SPEC.program(SPEC.resolve({"PASSES": passes}), np.dtype(dtype))
    source = inspect.getsource(program.kernel.py_func)
    counts: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AugAssign) else [])
        for t in targets:  # names, alone or unpacked (not acc[i, j, r])
            counts.update(n.id for n in (t.elts if isinstance(t, ast.Tuple) else [t])
                          if isinstance(n, ast.Name))
    twice = sorted(n for n, c in counts.items() if c > 1)
    assert all(re.fullmatch(r"(rs|ws)[ab]|ss|kt|kf|tile|z|o[ab]\d+", n) for n in twice), twice
    names = program.kernel.py_func.__globals__
    for fn in ("put", "load_stage"):  # intrinsics, not jitted device functions
        assert not getattr(names[fn], "targetoptions", {}).get("inline"), fn


@pytest.mark.ptx  # the compiled-path kernels (nothing is compiled)
@pytest.mark.parametrize("name, stages, by_nvvm", [
    ("mma", 2, True), ("mma", 3, False), ("mma", 4, True),
    ("wgmma", 3, False), ("wgmma", 4, True), ("wgmma", 5, False)])
def test_checked_loader_is_inlined_by_nvvm_for_power_of_two_rings(
        name: str, stages: int, by_nvvm: bool) -> None:
    """The checked loader is inlined by NVVM where that gives the same machine code (a ring
    of a power-of-two depth) and by numba otherwise (docs/performance.md)."""
    from tilegemm.registry import get as get_kernel

    spec = get_kernel(name, "cuda")
    program = spec.program(spec.resolve({"STAGES": stages}), np.dtype("float32"))
    loader = program.kernel.py_func.__globals__["load_stage"]
    assert bool(getattr(loader, "targetoptions", {}).get("inline")) is not by_nvvm


@pytest.mark.cudasim
def test_a_gpu_older_than_sm80_computes_16_bit_operands_in_float32(monkeypatch) -> None:
    """On a T4 (sm_75) every float16 product was refused, kernel='auto' included, with
    advice (precision='ieee') that is refused for float16 too. There, as on the other
    backends, 16-bit operands are computed in float32 and rounded back once; naming the
    tensor-core rung still says why it cannot run."""
    import dataclasses

    from tilegemm.backends import cuda as cuda_backend

    be = cuda_backend.BACKEND
    old = dataclasses.replace(be.target(), capability=(7, 5), arch="sm_75")
    monkeypatch.setattr(type(be), "_target", lambda self, index: old)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 9)).astype(np.float16)
    b = rng.standard_normal((9, 4)).astype(np.float16)
    planned = tilegemm.plan(a, b, backend="cuda")
    assert planned.kernel != "mma" and planned.dtype == "float32"
    r = tilegemm.matmul(a, b, backend="cuda")
    want = (a.astype(np.float64) @ b).astype(np.float16)  # one rounding of the exact sum
    assert r.dtype == np.float16
    assert np.all(np.abs(r.astype(np.float64) - want) <= np.abs(want) * 2.0**-10 + 1e-3)
    with pytest.raises(UnavailableError, match="compute capability 8.0.*float16/bfloat16"):
        tilegemm.matmul(a, b, backend="cuda", kernel="mma")


@pytest.mark.cudasim
def test_16_bit_operands_on_an_ffma_rung_name_the_rungs_that_take_them() -> None:
    """'does not support dtype float32 (computed as bfloat16); it supports float32, ...'
    contradicted itself for NumPy bfloat16 operands (a float32 result)."""
    import ml_dtypes

    for x in (np.ones((4, 4), ml_dtypes.bfloat16), np.ones((4, 4), np.float16)):
        with pytest.raises(InvalidTypeError, match=r"operands.*which run on mma") as err:
            tilegemm.matmul(x, x, backend="cuda", kernel="pipelined")
        assert "dtype float32" not in str(err.value)
