"""Rung ``mma`` (tensor cores) and ``precision=``: results against float64 with the error
model of each precision, the errors for requests nothing can compute, and the compiled
machine code (HMMA, no local memory)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import tilegemm
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


def test_auto_at_ieee_never_picks_a_tensor_core_rung() -> None:
    assert registry.default_for("cuda", "float32").name != "mma"
    assert not SPEC.supports("float64")


# --- machine code ---------------------------------------------------------------------------


def _sass_without_local_memory(dtype: str, arch: str) -> tuple[dict[str, int], str, int]:
    """The rung at its defaults compiled for ``arch``: no spills, no stack frame, no LDL/STL
    in the SASS. Returns the parameters, the SASS text and the HMMA of one warp-tile k step."""
    from tilegemm.analysis.resources import cuda_resources, ptx_for
    from tilegemm.analysis.sass import disassemble, link_cubin

    params = SPEC.defaults()
    r = cuda_resources(SPEC, params, dtype, arch)
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    text = disassemble(link_cubin(ptx_for(SPEC, params, dtype, arch), arch))
    assert not re.search(r"\b(LDL|STL)(\.|\s)", text)
    return params, text, (params["WM"] // 16) * (params["WN"] // 8)


@pytest.mark.ptx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_hmma_in_sass_and_no_local_memory(arch: str) -> None:
    params, text, per_step = _sass_without_local_memory("float32", arch)
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
    assert r.dtype == BF16 and r.shape == np.matmul(a, b).shape
    want = _exact(a, b)
    # exact bfloat16 inputs, float32 sums: only the final rounding to bfloat16 (8 bits)
    err = np.abs(r.astype(np.float64) - want)
    assert np.all(err <= np.abs(want) * 2.0**-8 + 1e-6 * np.sqrt(a.shape[-1]))


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
    assert np.max(np.abs(r - want)) < np.max(np.abs(
        tilegemm.matmul(a, b, backend="cuda").astype(np.float64) - want))  # not rounded
    out = np.full(want.shape, np.nan, np.float32)  # a float32 out asks for the same
    assert tilegemm.matmul(a, b, out, backend="cuda") is out
    assert np.array_equal(out, r)


@pytest.mark.cudasim
def test_bfloat16_numba_device_arrays_are_refused_before_anything_is_written(
        rng: np.random.Generator) -> None:
    """numba has no bfloat16 type; its simulator held ml_dtypes arrays anyway, and the
    kernel read their values as 16-bit integers: the product came back as zeros."""
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
    assert r.dtype == BF16
    assert np.all(np.abs(r.astype(np.float64) - want) <= np.abs(want) * 2.0**-8 + 1e-5)
    r32 = tilegemm.gemm(a, b, c, alpha=2.0, beta=-0.5, backend="cuda", dtype=np.float32)
    assert r32.dtype == np.float32 and np.max(np.abs(r32 - want)) < 1e-5


def test_bfloat16_elsewhere_is_computed_in_float32_and_rounded_back(
        rng: np.random.Generator) -> None:
    """As float16: backends without tensor cores accumulate in float32 and round once."""
    a, b = _half_operands(rng, (5, 7), (7, 3), BF16)
    want32 = np.matmul(a.astype(np.float32), b.astype(np.float32))
    r = tilegemm.matmul(a, b, backend="cpu")
    assert r.dtype == BF16 and np.array_equal(r, want32.astype(BF16))
    r32 = tilegemm.matmul(a, b, backend="cpu", dtype=np.float32)
    assert r32.dtype == np.float32 and np.allclose(r32, want32, rtol=1e-6, atol=1e-6)
    with pytest.raises(UnavailableError, match="needs tensor cores"):
        tilegemm.matmul(a, b, backend="cpu", precision="tf32")


@pytest.mark.opencl
def test_bfloat16_on_opencl_is_computed_in_float32(rng: np.random.Generator) -> None:
    a, b = _half_operands(rng, (6, 5), (5, 4), BF16)
    r = tilegemm.matmul(a, b, backend="opencl")
    want32 = np.matmul(a.astype(np.float32), b.astype(np.float32))
    assert r.dtype == BF16
    assert np.all(np.abs(r.astype(np.float32) - want32) <= np.abs(want32) * 2.0**-8 + 1e-6)


def test_dtype_argument_follows_numpy() -> None:
    a = np.ones((2, 3), np.float64)
    with pytest.raises(InvalidTypeError, match="from dtype\\('float64'\\) to dtype\\('int32'\\)"):
        tilegemm.matmul(a, a.T, backend="cpu", dtype=np.int32)
    with pytest.raises(InvalidTypeError, match="no common dtype"):
        tilegemm.matmul(np.ones((2, 2), BF16), np.ones((2, 2), np.float16), backend="cpu")
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
            ((40, 64), (64, 64), {"BN": 32, "WN": 32})]


def _strided(x: np.ndarray) -> np.ndarray:
    """``x`` as a view with a row stride larger than its rows (still 16-byte aligned)."""
    pad = np.zeros(x.shape[:-1] + (x.shape[-1] + 8,), x.dtype)
    pad[..., : x.shape[-1]] = x
    return pad[..., : x.shape[-1]]


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape", "over"), INTERIOR)
@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
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
