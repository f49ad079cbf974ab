"""Every CPU rung against the float64 reference: hostile shapes, batches, layouts, gemm.

Parametrised over the registry (``tilegemm.kernels("cpu")``), so a new CPU rung is covered
without editing this file. Outputs are NaN-poisoned (conftest sets TILEGEMM_POISON=1), so an
element a rung never writes fails the check. Each (rung, parameters, dtype) compiles once per
process; shapes stay small except for one product of 512³.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from conftest import HOSTILE_SHAPES, blocked_module, bound, host_blocked_params
from tilegemm.backends import get_backend
from tilegemm.problem import describe, host_operand_3d, make_problem
from tilegemm.reference import assert_close, random_operands

CPU_RUNGS = tilegemm.kernels("cpu")
RUNG_IDS = [s.name for s in CPU_RUNGS]
FLOAT_DTYPES = ("float32", "float64")


def cases(dtypes: tuple[str, ...]) -> list:
    """(rung, dtype) pairs the rung supports, as pytest params with readable ids."""
    return [pytest.param(s, d, id=f"{s.name}-{d}") for s in CPU_RUNGS for d in dtypes
            if s.supports(d)]


def run(spec, a, b, **kw):
    return tilegemm.matmul(a, b, kernel=spec.name, backend="cpu", **kw)


@pytest.mark.parametrize("shape", HOSTILE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES + ("int32", "int64")))
def test_hostile_shapes(spec, dtype, shape):
    m, n, k = shape
    a, b = random_operands((m, k), (k, n), dtype)
    assert_close(run(spec, a, b), a, b, what=f"{spec.name} {dtype} {shape}")


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_explicit_out_prefilled_with_nan(spec, dtype):
    a, b = random_operands((2, 19, 23), (23, 29), dtype)
    out = np.full((2, 19, 29), np.nan, dtype=dtype)
    result = run(spec, a, b, out=out)
    assert result is out
    assert_close(out, a, b)


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((3, 7, 5), (3, 5, 11)),  # full batch on both
        ((3, 1, 7, 5), (4, 5, 11)),  # partial broadcast -> (3, 4, 7, 11)
        ((7, 5), (2, 3, 5, 11)),  # a shared by every product
        ((2, 3, 7, 5), (5, 11)),  # b shared
        ((40, 6, 4), (40, 4, 9)),  # many small products (batch-parallel path)
        ((0, 7, 5), (5, 11)),  # empty batch
    ],
)
@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_batches_and_broadcast(spec, dtype, shape_a, shape_b):
    a, b = random_operands(shape_a, shape_b, dtype)
    assert_close(run(spec, a, b), a, b)


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [((9,), (9, 13)), ((13, 9), (9,)), ((9,), (9,)), ((2, 13, 9), (9,)), ((9,), (3, 9, 4))],
)
@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_one_dimensional_operands(spec, dtype, shape_a, shape_b):
    a, b = random_operands(shape_a, shape_b, dtype)
    result = run(spec, a, b)
    assert result.shape == np.matmul(a, b).shape
    assert_close(result, a, b)


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_gemm_alpha_beta(spec, dtype, rng):
    a, b = random_operands((2, 17, 31), (31, 21), dtype)
    c = rng.uniform(-1, 1, size=(2, 17, 21)).astype(dtype)
    result = tilegemm.gemm(a, b, c, alpha=-1.5, beta=0.25, kernel=spec.name, backend="cpu")
    assert_close(result, a, b, alpha=-1.5, beta=0.25, c=c)
    # c broadcast along rows and the batch; c must not change
    c_row = rng.uniform(-1, 1, size=(21,)).astype(dtype)
    before = c_row.copy()
    result = tilegemm.gemm(a, b, c_row, alpha=2.0, beta=-3.0, kernel=spec.name, backend="cpu")
    assert_close(result, a, b, alpha=2.0, beta=-3.0, c=c_row)
    np.testing.assert_array_equal(c_row, before)


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_gemm_in_place_and_c_unread_when_beta_is_zero(spec, dtype, rng):
    a, b = random_operands((13, 37), (37, 19), dtype)
    c = rng.uniform(-1, 1, size=(13, 19)).astype(dtype)
    c0 = c.copy()
    result = tilegemm.gemm(a, b, c, alpha=0.5, beta=2.0, out=c, kernel=spec.name, backend="cpu")
    assert result is c
    assert_close(c, a, b, alpha=0.5, beta=2.0, c=c0)
    # beta == 0: a NaN-filled c must not leak into the result
    c_nan = np.full((13, 19), np.nan, dtype=dtype)
    result = tilegemm.gemm(a, b, c_nan, alpha=3.0, beta=0.0, out=c_nan, kernel=spec.name,
                           backend="cpu")
    assert_close(result, a, b, alpha=3.0)


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_transposes(spec, dtype):
    a, b = random_operands((2, 23, 11), (2, 17, 23), dtype)
    result = tilegemm.gemm(a, b, trans_a=True, trans_b=True, kernel=spec.name, backend="cpu")
    assert_close(result, a, b, trans_a=True, trans_b=True)


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_zero_k_and_empty_dims(spec, dtype, rng):
    a, b = random_operands((6, 0), (0, 5), dtype)
    result = run(spec, a, b)
    np.testing.assert_array_equal(result, np.zeros((6, 5), dtype=dtype))
    c = rng.uniform(-1, 1, size=(6, 5)).astype(dtype)
    result = tilegemm.gemm(a, b, c, beta=-2.0, kernel=spec.name, backend="cpu")
    np.testing.assert_allclose(result, -2.0 * c, rtol=0, atol=0)
    for sa, sb in (((0, 4), (4, 5)), ((6, 4), (4, 0)), ((0, 0), (0, 0))):
        a, b = random_operands(sa, sb, dtype)
        result = run(spec, a, b)
        assert result.shape == np.matmul(a, b).shape


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_fortran_ordered_and_strided_inputs(spec, dtype):
    a, b = random_operands((30, 44), (50, 66), dtype)
    a_f = np.asfortranarray(a[:, :25])
    b_s = b[::2, ::3]  # (25, 22), non-contiguous in both axes
    assert_close(run(spec, a_f, b_s), a_f, b_s)
    a_neg = a[::-1, 3:28]  # negative stride
    assert_close(run(spec, a_neg, b_s), a_neg, b_s)


@pytest.mark.parametrize(("spec", "dtype"), cases(FLOAT_DTYPES))
def test_nan_and_inf_propagate_like_numpy(spec, dtype):
    a, b = random_operands((3, 37, 29), (29, 35), dtype)
    a[0, 5, 7] = np.nan
    a[1, 36, 0] = np.inf  # last row: lands in a partial tile of a blocked rung
    b[28, 34] = -np.inf  # last column
    b[3, 2] = np.inf
    result = run(spec, a, b)
    with np.errstate(invalid="ignore"):  # inf - inf in the reference is the point here
        expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(result), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(result), np.isposinf(expected))
    assert np.isnan(result).any() and np.isinf(result).any()
    assert_close(result, a, b)


def block_crossing_shapes(spec) -> list[tuple[int, int, int]]:
    """Shapes just past (and just short of) each cache block of a rung's default parameters."""
    p = spec.defaults()
    if not {"MC", "KC", "NC"} <= set(p):
        return [(67, 61, 71)]
    return [(p["MC"] + 1, 61, p["KC"] + 3), (p["MR"] * 2 + 1, p["NC"] - 1, 5),
            (5, p["NC"] + p["NR"] + 3, 7)]


@pytest.mark.parametrize(
    ("spec", "shape"),
    [pytest.param(s, sh, id=f"{s.name}-{'x'.join(map(str, sh))}")
     for s in CPU_RUNGS for sh in block_crossing_shapes(s)],
)
def test_shapes_crossing_blocks(spec, shape):
    m, n, k = shape
    a, b = random_operands((m, k), (k, n), "float32")
    assert_close(run(spec, a, b), a, b, what=f"{spec.name} {shape}")


def test_blocked_small_blocks_cross_every_loop(rng):
    """Small MC/KC/NC so one modest product runs several jc, pc and ic blocks, with partial
    blocks and partial register tiles on every edge, plus alpha/beta across K panels."""
    spec = next(s for s in CPU_RUNGS if s.name == "blocked")
    params = {"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 256}
    a, b = random_operands((2, 101, 197), (197, 523), "float64")
    c = rng.uniform(-1, 1, size=(2, 101, 523))
    result = tilegemm.gemm(a, b, c, alpha=0.75, beta=-0.5, kernel="blocked", backend="cpu",
                           **params)
    assert_close(result, a, b, alpha=0.75, beta=-0.5, c=c)
    assert spec.is_valid(params)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(40, 600, 600), (2, 1000, 3), (1, 1000, 300), (300, 1000, 1)],
                         ids=["packed", "small", "row-gemv", "column-gemv"])
def test_an_infinite_alpha_scales_the_whole_product(dtype, shape, rng):
    """The blocked rung scales each K panel by alpha as it adds it; with alpha = inf,
    panels of opposite signs gave inf - inf = NaN for about half the elements (K > KC on
    every path but A @ x), where alpha·(A@B) is ±inf. beta·C is added after."""
    m, k, n = shape
    c = rng.standard_normal((m, n)).astype(dtype)
    # products whose sign no rounding can flip; a draw with too few of them (6 outputs of
    # 2 x 1000 x 3, one near 0 about once in 700 runs) is drawn again
    for _ in range(20):
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        clear = np.abs(exact) > 1e-2
        if clear.mean() > 0.9:
            break
    assert clear.mean() > 0.9
    for alpha, beta in ((np.inf, 0.0), (-np.inf, 0.5)):
        got = tilegemm.gemm(a, b, c, alpha=alpha, beta=beta, kernel="blocked", backend="cpu")
        assert np.isinf(got).all(), f"{np.isnan(got).sum()} NaN of {got.size}"
        np.testing.assert_array_equal(got[clear], (alpha * np.sign(exact))[clear])
    # beta·C is added to the scaled product: a C of +inf where alpha·(A@B) is -inf gives
    # NaN there, and +inf where both are +inf
    c_inf = np.full((m, n), np.inf, dtype)
    got = tilegemm.gemm(a, b, c_inf, alpha=-np.inf, beta=0.5, kernel="blocked", backend="cpu")
    positive, negative = clear & (exact > 0), clear & (exact < 0)
    assert np.isnan(got[positive]).all() and (got[negative] == np.inf).all()
    # inf × 0 is NaN, silently, as inside any kernel (no warning, nor an error under
    # errstate(all="raise"), which the scaling after the product raised at first)
    with np.errstate(all="raise"):
        got = tilegemm.gemm(a, np.zeros_like(b), c, alpha=np.inf, beta=1.0, kernel="blocked",
                            backend="cpu")
    assert np.isnan(got).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1024, 1), (13, 1024, 11), (2, 1024, 3), (1, 1024, 300),
                                   (300, 1024, 1), (3, 256, 64), (12, 256, 64)],
                         ids=["one", "packed", "small", "row-gemv", "column-gemv", "few-rows",
                              "few-rows-reread"])
def test_a_large_finite_alpha_scales_the_whole_product(dtype, shape, rng):
    """A finite alpha was applied per K panel: with alpha = 2**127 (float32; 2**1023 in
    float64), a first panel summing to -4 overflowed to -inf and the second (+5) could not
    bring it back, so a product of 1.0 gave -inf instead of alpha. The first half of K
    sums to -4 in every output, the second to +5 (dyadic values: exact in any order).
    A few rows sum K in panels shorter than KC (FEW_KC; 64 steps for 9-15 rows): with K
    inside one KC panel they gave -inf too."""
    m, k, n = shape
    alpha = float(2.0 ** (np.finfo(dtype).maxexp - 1))
    a = np.ones((m, k), dtype) * rng.choice([1.0, 2.0], (m, 1)).astype(dtype)
    b = np.empty((k, n), dtype)
    b[: k // 2], b[k // 2:] = -4 / (k // 2), 5 / (k - k // 2)
    got = tilegemm.gemm(a, b, alpha=alpha, kernel="blocked", backend="cpu", KC=512, FEW_KC=64)
    with np.errstate(over="ignore"):  # rows of 2s: 2·alpha is infinite, truly
        np.testing.assert_array_equal(got, alpha * (a[:, :1] @ np.ones((1, n), dtype)))
    c = rng.uniform(1, 2, (m, n)).astype(dtype)
    got = tilegemm.gemm(a, b, c, alpha=-alpha / 2, beta=0.5, kernel="blocked", backend="cpu",
                        KC=512, FEW_KC=64)
    want = (-alpha / 2) * a[:, :1].astype(np.float64) + 0.5 * c.astype(np.float64)
    np.testing.assert_allclose(got, want.astype(dtype), rtol=1e-6)


def test_blocked_64_wide_tile_crosses_every_loop(rng):
    """The widest tile (NR = 64: four AVX-512 vectors of float32 per row, the database's
    tile for large products on one Xeon) with a row count that is no power of two, across
    several jc/pc/ic blocks, partial tiles on every edge (523 columns: 11 tiles of 64 and
    a partial one), beta over K panels, and B given transposed (packed by the other copy)."""
    params = {"MR": 6, "NR": 64, "MC": 48, "KC": 64, "NC": 256}
    a, b = random_operands((2, 101, 197), (197, 523), "float32")
    c = rng.uniform(-1, 1, size=(2, 101, 523)).astype(np.float32)
    result = tilegemm.gemm(a, b, c, alpha=0.75, beta=-0.5, kernel="blocked", backend="cpu",
                           **params)
    assert_close(result, a, b, alpha=0.75, beta=-0.5, c=c)
    bt = np.ascontiguousarray(b.T).T  # B's transpose stored C-ordered
    assert_close(tilegemm.matmul(a[0], bt, kernel="blocked", backend="cpu", **params), a[0], b)


@pytest.mark.parametrize("spec", [s for s in CPU_RUNGS if s.rung > 1], ids=lambda s: s.name)
def test_one_large_product(spec):
    a, b = random_operands((512, 512), (512, 512), "float32")
    assert_close(run(spec, a, b), a, b)


@pytest.mark.parametrize("spec", CPU_RUNGS, ids=lambda s: s.name)
def test_prepare_launch_fetch_elapsed(spec):
    a, b = random_operands((2, 33, 20), (1, 20, 41), "float32")
    prob = make_problem(describe(a, "a"), describe(b, "b"))
    a3, b3 = host_operand_3d(a, prob, "a"), host_operand_3d(b, prob, "b")
    params = host_blocked_params("float32") if spec.name == "blocked" else spec.defaults()
    prepared = get_backend("cpu").prepare(spec, params, prob, a3, b3)
    prepared.launch()
    assert_close(prepared.fetch(), a, b)
    times = prepared.elapsed(3)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_blocked_micro_kernel_is_vectorised():
    """The register tile must compile to vector FMAs; scalar ones (or gathers) would drop
    the rung silently to a fraction of its speed — this catches that."""
    from llvmlite import binding as llvm

    from tilegemm.kernels.cpu.k02_blocked import K_UNROLL, micro_kernel

    features = llvm.get_host_cpu_features()
    if not (features.get("fma") and features.get("avx2")):
        pytest.skip("host CPU has no AVX2/FMA")
    uk = micro_kernel(16, 8, np.dtype("float32"))
    asm = uk.inspect_asm(uk.signatures[0])
    fmas = [ln for ln in asm.splitlines() if "vfmadd" in ln]
    vector = [ln for ln in fmas if "ymm" in ln or "zmm" in ln]
    # The K loop (K_UNROLL steps of 16*8 multiply-adds, at most 16 lanes a vector) is all
    # vector FMAs; the few scalar ones left are in the C update's odd corners.
    assert len(vector) >= K_UNROLL * 16 * 8 // 16, fmas[:4]
    assert len(fmas) - len(vector) <= len(vector) // 8, fmas[:4]
    assert "gather" not in asm


_HASWELL = ("+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+cx16,+movbe,+lzcnt,"
            "-avx512f,-avx512vl,-avx512bw,-avx512dq,-avx512cd")


def _k_loop_for_avx2(mr, nr, dtype, op="vfmadd"):
    """The explicit vector K loop for an MR×NR tile in 256-bit vectors, compiled to AVX2
    machine code (whatever the host): (count of ``op``, stack accesses) in its busiest
    block (the one with the most ``op``)."""
    import re

    import numba
    from llvmlite import binding as llvm

    from tilegemm.kernels.cpu._vector_tile import tile_loop

    dtype = np.dtype(dtype)
    kloop = tile_loop(mr, nr, dtype, 256, 4)
    nbt = numba.from_dtype(dtype)
    sig = numba.void(numba.int64, nbt[:, :, ::1], numba.int64, nbt[:, :, ::1], numba.int64,
                     nbt[:, ::1])

    @numba.njit(sig)
    def call(kc, ap, a0, bp, b0, t):
        kloop(kc, ap, a0, bp, b0, t)

    module = llvm.parse_assembly(call.inspect_llvm(call.signatures[0]))
    machine = llvm.Target.from_triple(module.triple).create_target_machine(
        cpu="haswell", features=_HASWELL, opt=3)
    blocks = re.split(r"\n(?=\.?[\w$.]+:)", machine.emit_assembly(module))
    loop = max(blocks, key=lambda b: b.count(op))
    return loop.count(op), loop.count("rsp")


def test_vector_k_loop_keeps_blis_avx2_tiles_in_registers():
    """BLIS's AVX2 tiles, 6×16 float32 and 6×8 float64, need 15 of the 16 vector registers
    (12 accumulators, 2 vectors of B, 1 broadcast). The explicit vector K loop must keep
    them there: 4 unrolled steps of 12 FMAs and no stack access (the SLP-vectorised scalars
    spilled here and ran at half speed). Negative control: 8×16 float32 needs 16
    accumulators + 3, so the same count must see its spills."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("reads x86 machine code")
    assert _k_loop_for_avx2(6, 16, "float32") == (4 * 12, 0)
    assert _k_loop_for_avx2(6, 8, "float64") == (4 * 12, 0)
    fmas, stack = _k_loop_for_avx2(8, 16, "float32")
    assert fmas == 4 * 16 and stack > 0


def test_integer_k_loop_multiplies_in_the_dtypes_own_width():
    """int32 tiles multiply and add 32-bit lanes (``vpmulld``/``vpaddd``): written as
    Python scalars, ``a * b`` of two int32 is an int64 in Numba, and the old tile
    multiplied 64-bit halves at half the rate. AVX2 has no 64-bit vector multiply, so an
    int64 tile shows LLVM's expansion of it (``vpmuludq``): the negative control that the
    count sees a 64-bit multiply where there is one. (Integer sums may be reassociated, and
    LLVM adds pairs of the unrolled steps' products before the accumulator, so a few
    values go through the stack: measured no slower than one step per trip.)"""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("reads x86 machine code")
    assert _k_loop_for_avx2(4, 16, "int32", op="vpmulld")[0] == 4 * 8
    assert _k_loop_for_avx2(4, 16, "int32", op="vpaddd")[0] == 4 * 8
    assert _k_loop_for_avx2(4, 16, "int32", op="vpmuludq")[0] == 0
    assert _k_loop_for_avx2(4, 8, "int64", op="vpmuludq")[0] >= 4 * 8


def test_vector_lanes_divide_the_tile():
    from tilegemm.kernels.cpu._vector_tile import lanes, tile_loop

    assert lanes(32, np.dtype("float32"), 512) == 16
    assert lanes(8, np.dtype("float32"), 512) == 8  # never wider than the row
    assert lanes(16, np.dtype("float64"), None) == 4  # 256-bit when LLVM chooses
    assert lanes(24, np.dtype("float32"), 512) == 8  # a divisor of NR
    assert lanes(32, np.dtype("int32"), 512) == 16
    with pytest.raises(ValueError, match="uint32"):
        tile_loop(4, 8, np.dtype("uint32"), 256, 4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("bits", [None, 512])
def test_vector_tile_store_writes_alpha_tile_plus_bb_c_into_a_strided_c(dtype, bits):
    """The tile's write-back into C (``tile_store``): C[i:i+MR, j:j+NR] = alpha*T, or
    alpha*T + bb*C, and nothing else of C; C's rows (38 wide) longer than the tile's and
    the offset (i, j) = (3, 5) no multiple of anything, so no access is aligned. Integers
    over their whole range, so the products wrap as NumPy's do."""
    import numba

    from tilegemm.kernels.cpu._vector_tile import tile_store

    mr, nr = 6, 16
    dt = np.dtype(dtype)
    rng = np.random.default_rng(5)
    nbt = numba.from_dtype(dt)
    store = tile_store(mr, nr, dt, bits, scale_c=False)
    store_c = tile_store(mr, nr, dt, bits, scale_c=True)

    @numba.njit(numba.void(nbt[:, ::1], nbt[:, ::1], numba.int64, numba.int64, nbt, nbt,
                           numba.int64))
    def call(t, c, i, j, alpha, bb, mode):
        if mode == 1:
            store(t, c, i, j, alpha)
        else:
            store_c(t, c, i, j, alpha, bb)

    def draw(shape):
        if dt.kind == "i":
            info = np.iinfo(dt)
            return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
        return rng.standard_normal(shape).astype(dt)

    tile = draw((mr, nr))
    # exact float products: one rounding, fused or not; integer ones wrap
    alpha, bb = (dt.type(2.0), dt.type(-0.5)) if dt.kind == "f" else (dt.type(3), dt.type(-7))
    for mode in (1, 2):
        c = draw((20, 38))
        want = c.copy()
        block = want[3:3 + mr, 5:5 + nr]
        with np.errstate(over="ignore"):
            block[...] = alpha * tile + (bb * block if mode == 2 else 0)
        call(tile, c, 3, 5, alpha, bb, mode)
        np.testing.assert_array_equal(c, want)


def test_micro_kernel_writes_c_as_vectors_not_named_scalars():
    """The micro-kernel's source is the vector K loop and the vector updates of C, for
    every dtype: no MR·NR named scalars for the SLP vectoriser to pack (a third of the
    float compile time, and the integer tiles' 64-bit arithmetic)."""
    from tilegemm.kernels.cpu import k02_blocked

    src = k02_blocked.micro_kernel_source()
    assert src.startswith("def ukernel(kc, Ap, r, Bp, s, T, C, i, j, alpha, bb, mode):")
    assert "kloop(kc, Ap," in src
    assert "tstore(T, C, i, j, alpha)" in src and "tstore_c(T, C, i, j, alpha, bb)" in src
    assert "c0_0" not in src and src.count("\n") < 12
    assert src.count("alpha * c") == 0


def test_vector_width_attributes_reach_every_function_definition():
    from tilegemm.kernels.cpu._slp import with_vector_width

    ir = ('declare i32 @"g"(i32)\n'
          'define i32 @"f"(i8** noalias captures(none) %"r", {i8*, i32}** %"e") {\n'
          'entry:\n  ret i32 0\n}\n'
          'define linkonce_odr i32 @"h"(i32 %"x") noinline\n{\nentry:\n  ret i32 %"x"\n}\n')
    out = with_vector_width(ir, 512)
    defines = [ln for ln in out.splitlines() if ln.startswith("define")]
    assert len(defines) == 2
    for ln in defines:
        assert '"prefer-vector-width"="512" "min-legal-vector-width"="512"' in ln
    assert 'declare i32 @"g"(i32)' in out.splitlines()  # declarations untouched
    assert out.count("{") == ir.count("{")


def test_blocked_uses_full_width_vectors_on_avx512():
    """LLVM prefers 256-bit vectors on Intel's AVX-512 server cores; the rung asks for 512
    (half the FMA throughput otherwise). Reads the machine code, so it needs such a CPU."""
    from tilegemm.kernels.cpu.k02_blocked import K_UNROLL, micro_kernel, vector_bits
    from tilegemm.tune.database import host_isa

    if host_isa() != "avx512":
        pytest.skip("host CPU has no AVX-512")
    assert vector_bits() == 512
    uk = micro_kernel(8, 32, np.dtype("float32"))
    fmas = [ln for ln in uk.inspect_asm(uk.signatures[0]).splitlines() if "vfmadd" in ln]
    wide = [ln for ln in fmas if "zmm" in ln]
    # the K loop: K_UNROLL steps of 16 zmm FMAs; narrower ones only in the C update's corners
    assert len(wide) >= 16 * K_UNROLL, fmas[:4]
    assert len(fmas) - len(wide) <= len(wide) // 8, fmas[:4]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_blocked_packed_path_on_small_shapes(dtype, monkeypatch):
    """Small products take the unpacked path; with its threshold at 0 the same hostile and
    batched shapes run through packing, partial tiles and the batch-parallel path."""
    spec = next(s for s in CPU_RUNGS if s.name == "blocked")
    params = host_blocked_params(dtype)
    program = spec.program(params, dtype)
    monkeypatch.setitem(program.__globals__, "DIRECT_PRODUCT", 0)
    cases = [((m, k), (k, n)) for m, n, k in HOSTILE_SHAPES]
    cases += [((40, 6, 4), (40, 4, 9)), ((3, 1, 7, 5), (4, 5, 11)), ((9,), (9, 13))]
    for shape_a, shape_b in cases:
        a, b = random_operands(shape_a, shape_b, dtype)
        # the parameters by hand: the rung named alone runs this machine's measured tile,
        # another program than the one patched above
        assert tilegemm.plan(a, b, kernel="blocked", **params).params == params
        assert_close(run(spec, a, b, **params), a, b, what=f"packed {dtype} {shape_a} {shape_b}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ("int32", "int64"))
def test_micro_kernel_every_k_remainder(dtype):
    """The micro-kernel's K loop runs ``K_UNROLL`` steps per iteration and then a remainder
    loop, and it writes a whole tile straight into C: every depth from 1 to past two
    unrolled iterations must equal the float64 product of the strips (tolerance scaled by
    K; integers exactly, over their whole range, so sums and products wrap as NumPy's),
    into a poisoned scratch tile (mode 0), a poisoned C (mode 1, C unread) and onto an
    existing C (mode 2, ``alpha*tile + bb*C``), leaving C's other elements alone."""
    from tilegemm.kernels.cpu.k02_blocked import K_UNROLL, micro_kernel

    dt = np.dtype(dtype)
    mr, nr = 4, 8
    uk = micro_kernel(mr, nr, dt)
    rng = np.random.default_rng(13)
    if dt.kind == "i":
        info = np.iinfo(dt)
        poison = dt.type(info.min)

        def draw(shape):
            return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)

        alphas = (dt.type(1), dt.type(0), dt.type(-3), dt.type(0), dt.type(5), dt.type(7))
    else:
        poison = dt.type(np.nan)

        def draw(shape):
            return rng.standard_normal(shape).astype(dt)

        alphas = (dt.type(1), dt.type(0), dt.type(2), dt.type(0), dt.type(-0.5), dt.type(3))

    def untouched(x):
        return np.isnan(x).all() if dt.kind == "f" else (x == poison).all()

    i, j = 3, 5  # the tile's corner inside a larger C
    for kc in range(1, 2 * K_UNROLL + 2):
        # strip r=1 and s=1 of two-strip panels, so the strip indexing is exercised too
        ap, bp = draw((2, kc, mr)), draw((2, kc, nr))
        tile = np.full((mr, nr), poison, dtype=dt)
        c = np.full((mr + 5, nr + 9), poison, dtype=dt)
        uk(kc, ap, 1, bp, 1, tile, c, i, j, alphas[0], alphas[1], 0)
        assert_close(tile, ap[1].T, bp[1], what=f"micro-kernel {dtype} kc={kc} to T")
        assert untouched(c)  # mode 0 leaves C alone
        uk(kc, ap, 1, bp, 1, tile, c, i, j, alphas[2], alphas[3], 1)
        assert_close(c[i:i + mr, j:j + nr], ap[1].T, bp[1], alpha=alphas[2],
                     what=f"micro-kernel {dtype} kc={kc} C = alpha*tile")
        outside = np.ones(c.shape, bool)
        outside[i:i + mr, j:j + nr] = False
        assert untouched(c[outside])
        c0 = c[i:i + mr, j:j + nr].copy()
        uk(kc, ap, 1, bp, 1, tile, c, i, j, alphas[4], alphas[5], 2)
        assert_close(c[i:i + mr, j:j + nr], ap[1].T, bp[1], alpha=alphas[4], beta=alphas[5],
                     c=c0, what=f"micro-kernel {dtype} kc={kc} C = alpha*tile + beta*C")
        assert untouched(c[outside])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_blocked_k_remainders_in_later_panels(dtype, monkeypatch):
    """Through the packed path with a small KC, K splits into panels whose depths are not
    multiples of the unroll (the last panel too): 1×K rows, K=1, partial tiles on both edges."""
    spec = next(s for s in CPU_RUNGS if s.name == "blocked")
    # tiles that other tests compile too (this machine's float32 tile; the small float64
    # tile of test_compile_cache), so that the suite compiles the rung no extra time
    # (about 20 s on two cores)
    tile = {} if dtype == "float32" else {"MR": 4, "NR": 8}
    params = host_blocked_params(dtype, {**tile, "MC": 48, "KC": 64})
    program = spec.program(params, dtype)
    monkeypatch.setitem(program.__globals__, "DIRECT_PRODUCT", 0)
    for m, n, k in ((1, 9, 67), (1, 1, 130), (5, 3, 1), (13, 17, 66), (49, 9, 131),
                    (7, 33, 65)):
        a, b = random_operands((m, k), (k, n), dtype)
        out = np.full((m, n), np.nan, dtype=dtype)
        result = tilegemm.matmul(a, b, out, kernel="blocked", backend="cpu", **params)
        assert_close(result, a, b, what=f"blocked KC=64 {dtype} {(m, n, k)}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", [3, 8])
def test_a_batch_of_mid_size_products_matches_each_product_alone(dtype, batch):
    """Mid-size products (between 96³ and 256³) run one per thread when the batch is large
    enough, else each threaded: either way every product is the same sums, bit for bit, as
    the product computed alone, and close to float64."""
    from tilegemm.kernels.cpu import k02_blocked

    a, b = random_operands((batch, 130, 140), (batch, 140, 120), dtype)
    assert k02_blocked.SMALL_PRODUCT < 130 * 140 * 120 <= 256**3
    got = tilegemm.matmul(a, b, kernel="blocked", backend="cpu")
    assert_close(got, a, b)
    for z in range(batch):
        alone = tilegemm.matmul(a[z], b[z], kernel="blocked", backend="cpu")
        np.testing.assert_array_equal(got[z], alone)


@pytest.mark.parametrize("chunk_strips", [1, 3, None], ids=["chunk1", "chunk3", "default"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_one_row_block_packs_b_in_chunks(dtype, chunk_strips, monkeypatch, rng):
    """Products of at most MC rows run as one row block split by columns, each task packing
    its own strips of B a chunk at a time, with no shared B panel. Chunks of one strip, of
    three (the last one partial) and the default size; several NC and K panels (alpha and
    beta across them), partial strips and tiles, A or B given transposed, a batch. (Given
    plainly, products this small run unpacked on CPUs with the wide 8-row tile, see
    ``takes_rows``; an operand given transposed keeps them on the packed path.)"""
    from tilegemm.kernels.cpu._threads import planned_threads
    from tilegemm.kernels.cpu.k02_blocked import one_row_block

    # float64 on small blocks (3 NC panels, 4 K panels), float32 on the defaults
    small = {"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 256}
    params, mod = blocked_module(small if dtype == "float64" else {}, dtype)
    mr, nr, mc, kc, nc = (params[x] for x in ("MR", "NR", "MC", "KC", "NC"))
    if chunk_strips is not None:
        monkeypatch.setitem(mod.__dict__, "B_CHUNK_BYTES",
                            chunk_strips * kc * nr * np.dtype(dtype).itemsize)
    threads = planned_threads()
    n, k = nc + 5 * nr + 3, 3 * kc + 5
    # (B given transposed: 40 rows or more, which take no dot products, see tiled_dots)
    for m, batch, tr in ((mc // mr * mr, 1, 1), (mc - mr + 3, 2, 1), (41, 1, 2),
                         (mc - 3, 1, 2)):
        assert one_row_block(m, n, k, threads, params, np.dtype(dtype).itemsize, 0)
        assert mod.layout(batch, m, n, k, threads, 0, 0, 0, bound(mod, params), tr)[0] == 1
        a, _ = random_operands((batch, m, k), (k, n), dtype)
        if tr & 1:  # A as the transpose of a C-ordered array, handed over in place
            a = np.ascontiguousarray(np.swapaxes(a, 1, 2)).swapaxes(1, 2)
        b = (rng.uniform(-1, 1, (n, k)).astype(dtype).T if tr & 2
             else rng.uniform(-1, 1, (k, n)).astype(dtype))
        c = rng.uniform(-1, 1, (batch, m, n)).astype(dtype)
        what = f"one row block {dtype} {(batch, m, n, k)} chunk={chunk_strips}"
        got = tilegemm.gemm(a, b, c, alpha=0.75, beta=-0.5, kernel="blocked", backend="cpu",
                            **params)
        assert_close(got, a, b, alpha=0.75, beta=-0.5, c=c, what=what)
        out = np.full((batch, m, n), np.nan, dtype=dtype)
        tilegemm.matmul(a, b, out, kernel="blocked", backend="cpu", **params)
        assert_close(out, a, b, what=what)


@pytest.mark.parametrize("tr", [0, 1, 2], ids=["plain", "a-transposed", "b-transposed"])
def test_small_products_of_more_rows_are_one_row_block_all_k_in_one_region(tr, rng):
    """A product of more than MC rows up to ``ONE_REGION_PRODUCT`` multiply-adds runs as one
    row block, each task running every K panel of its columns in the one parallel region:
    the same sums, bit for bit, as the packed path on the calling thread (panels in K order,
    beta on the first, A packed again for each), across 4 K panels, partial strips and
    tiles, alpha and beta."""
    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.kernels.cpu._threads import planned_threads

    params, mod = blocked_module({"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 4096},
                                  "float64")
    threads = planned_threads()
    m, n, k = 101, 64 * threads + 13, 3 * 64 + 5  # 3 row blocks of MC, 4 K panels
    assert m * n * k <= k02_blocked.ONE_REGION_PRODUCT
    cb = bound(mod, params)
    if mod.takes_rows(1, m, n, k, threads, 0, tr, cb):
        pytest.skip("given plainly, this product runs unpacked here (the wide 8-row tile)")
    nblk, groups = mod.layout(1, m, n, k, threads, 0, 0, 10**9, cb, tr)[:2]
    assert (nblk, groups) == (1, threads)  # one row block, one task per thread
    assert k02_blocked.one_row_block_why(m, n, k, threads, params, 8) == "small"
    a, b = random_operands((1, m, k), (1, k, n), np.float64)
    c = rng.uniform(-1, 1, (1, m, n))
    a_in = np.ascontiguousarray(np.swapaxes(a, 1, 2)) if tr & 1 else a
    b_in = np.ascontiguousarray(np.swapaxes(b, 1, 2)) if tr & 2 else b
    got = c.copy()
    mod.blocked_threads(a_in, b_in, got, 0.75, -0.5, threads, 0, np.empty(0), tr, 0, 10**9,
                        cb)
    alone = c.copy()
    mod.blocked_serial(a_in, b_in, alone, 0.75, -0.5, tr, cb)
    np.testing.assert_array_equal(got, alone)
    assert_close(got[0], a[0], b[0], alpha=0.75, beta=-0.5, c=c[0], what=f"tr={tr}")


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_plan_path_names_the_one_row_block_split_as_layout_makes_it(threads):
    """``k02_blocked.one_row_block`` (what ``plan`` says) and the compiled ``layout`` (what
    runs) agree on which products are one row block, for any thread count, K and L2 budget
    (none; 47 strips of MR=4 rows of A at KC=64 and a chunk of B; more than any panel).
    UNPACKED_KB = 256: where the CPU has the wide 8-row tile (AVX-512, NEON), the mid-size
    products below would otherwise run unpacked and never reach ``layout``."""
    from tilegemm.kernels.cpu import k02_blocked

    params, mod = blocked_module({"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 2048,
                                  "UNPACKED_KB": 256}, "float64")
    chunk = 64 * 8 * 8  # one strip of B at KC = 64
    cb = bound(mod, params)
    seen = set()
    for budget in (0, 47 * 4 * 64 * 8 + chunk, 10**9):
        for k in (40, 10**5):
            for m in (2, 4, 5, 44, 47, 48, 49, 96, 97, 188, 189, 300):
                for n in (9, 16, 17, 24, 25, 64, 1000, 1023, 1024, 3000):
                    shape = mod.layout(1, m, n, k, threads, 0, chunk, budget, cb, 0)
                    narrow = mod.takes_rows(1, m, n, k, threads, 0, 0, cb)
                    if narrow or mod.takes_few(1, m, n, k, threads, 0, 0):  # unpacked
                        assert shape == (0,) * 8, (m, n, k, threads, budget)
                        # a narrow product with A given transposed is packed
                        assert not narrow or mod.layout(1, m, n, k, threads, 0, chunk,
                                                        budget, cb, 1)[7] > 0
                        continue
                    why = k02_blocked.one_row_block_why(m, n, k, threads, params, 8, budget,
                                                        chunk)
                    assert k02_blocked.one_row_block(m, n, k, threads, params, 8, budget,
                                                     chunk) == (why is not None)
                    got = shape[0] == 1
                    assert (why is not None) == got, (m, n, k, threads, budget)
                    seen.add((why, m > 48))
    # (why one row block, more than MC rows): more rows are one block when their block of A
    # fits the budget only with 256 columns per task, and when the product is small (at
    # most ONE_REGION_PRODUCT) with 64 per thread
    assert {("rows", False), (None, True), ("small", True)} <= seen
    assert (("l2", True) in seen) == (threads <= 4)
    assert k02_blocked.ONE_REGION_PRODUCT >= 97 * 1000 * 40
    # plan's words (25 float64 columns: past one pass of the wide 8-row tile, so packed)
    for m, n, k in ((300, 1000, 10**5), (40, 1000, 10**5), (40, 25, 10**5),
                    (97, 1000, 40)):
        fused = k02_blocked.one_row_block(m, n, k, threads, params, 8)
        path = k02_blocked.path(1, m, n, k, threads, params, itemsize=8)
        assert ("one row block" in path) == fused and "packed panels" in path
        assert ("one parallel region" in path) == (m == 97)


def test_rows_whose_block_of_a_fits_the_l2_budget_run_as_one_row_block(monkeypatch, rng):
    """A product of more than MC rows runs as one row block while its packed block of A and
    a chunk of B fit ``L2_BUDGET`` bytes and its panel of B does not, and is right either
    way: rows of 2-4 MC, several K and NC panels, partial strips, B transposed, beta != 0."""
    from tilegemm.kernels.cpu._threads import planned_threads
    from tilegemm.kernels.cpu.k02_blocked import one_row_block

    params, mod = blocked_module({"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 4096},
                                  "float64")
    chunk = 3 * 64 * 8 * 8  # three strips of B at KC = 64
    monkeypatch.setitem(mod.__dict__, "B_CHUNK_BYTES", chunk)
    threads = planned_threads()
    if threads > 8:  # two tasks per thread, 256 columns each, of a 4096-column panel
        pytest.skip(f"{threads} threads: fewer than 256 columns of the panel per task")
    n, k = 4096 + 5 * 8 + 3, 3 * 64 + 5
    panel = 4096 * 64 * 8  # the packed panel of B: NC columns at KC
    for m, b_transposed in ((97, False), (150, True), (190, False)):
        block = (m + 3) // 4 * 4 * 64 * 8  # the MR-padded block of A at KC, in bytes
        for budget in (block + chunk - 1, block + chunk, panel):
            monkeypatch.setitem(mod.__dict__, "L2_BUDGET", budget)
            fused = one_row_block(m, n, k, threads, params, 8, budget, chunk)
            assert fused == (budget == block + chunk)
            assert (mod.layout(1, m, n, k, threads, 0, chunk, budget, bound(mod, params), 0)[0]
                    == 1) == fused
            a = rng.uniform(-1, 1, (m, k))
            b = rng.uniform(-1, 1, (n, k)).T if b_transposed else rng.uniform(-1, 1, (k, n))
            c = rng.uniform(-1, 1, (m, n))
            what = f"{m} rows, one row block: {fused}"
            got = tilegemm.gemm(a, b, c, alpha=0.75, beta=-0.5, kernel="blocked",
                                backend="cpu", **params)
            assert_close(got, a, b, alpha=0.75, beta=-0.5, c=c, what=what)
            out = np.full((m, n), np.nan)
            tilegemm.matmul(a, b, out, kernel="blocked", backend="cpu", **params)
            assert_close(out, a, b, what=what)
