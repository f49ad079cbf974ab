"""Rung ``wgmma`` (Hopper warpgroup MMA, sm_90a): products against float64 on odd shapes for
each precision (under the simulator, whose stand-in decodes the 128-byte-swizzled
descriptors), how it is chosen (only by name, only on sm_90), and its sm_90a machine code.

The products (marker ``cudasim`` without ``simulator``) also run on a Hopper GPU with
``TILEGEMM_GPU_TESTS=1``, where they check what the simulator cannot: that the hardware
reads the swizzled tiles as the stand-in does."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import tilegemm
from conftest import record_async_copies, transposed_device_array
from tilegemm import registry, simulator
from tilegemm.errors import InvalidValueError, UnavailableError
from tilegemm.kernels.cuda._tensorcore import tf32_round

SPEC = registry.get("wgmma", "cuda")
BF16 = np.dtype("bfloat16")  # ml_dtypes.bfloat16 (tilegemm imports ml_dtypes)


def _needs_sm90() -> None:
    """Skip on a real GPU other than compute capability 9.0; the simulator always runs."""
    if not simulator.enabled():
        from numba import cuda

        if tuple(cuda.get_current_device().compute_capability) != (9, 0):
            pytest.skip("wgmma needs an sm_90 GPU (H100, H200, GH200)")


def _sim(**over: int) -> dict[str, int]:
    return {k: v for k, v in SPEC.sim_params.items() if k != "PASSES"} | over


def _check(r: np.ndarray, want: np.ndarray, k: int, scale: np.ndarray | None = None) -> None:
    """float32 accumulation of k exact products (TF32 x TF32 and 16-bit x 16-bit fit a
    float32): a K-scaled bound; NaN anywhere (the poisoned output) fails."""
    assert not np.isnan(r).any()
    big = np.max(np.abs(want)) if scale is None else scale
    assert np.all(np.abs(r - want) <= 4 * k * 2.0**-24 * big + 1e-6), np.max(np.abs(r - want))


def _strided(x: np.ndarray) -> np.ndarray:
    """``x`` as a view with a row stride larger than its rows (still 16-byte aligned)."""
    pad = np.zeros(x.shape[:-1] + (x.shape[-1] + 8,), x.dtype)
    pad[..., : x.shape[-1]] = x
    return pad[..., : x.shape[-1]]


# (a shape, b shape, how): partial tiles on every edge with K not a multiple of BK and
# primes; one interior block (the unchecked copies for K/BK - (STAGES-2) = 2 k-tiles) and
# edge blocks; an interior block with no unchecked k-tile (K < 2 BK: B's first loads must
# not run); a batch with B broadcast and K below one tile; a transposed (K-strided) A,
# which takes the 4-byte / plain-load copy path; a batch of interior blocks (one unchecked
# k-tile) with a strided B view.
TF32_CASES = [((67, 37), (37, 41), ""), ((67, 96), (96, 37), ""), ((64, 40), (40, 32), ""),
              ((2, 9, 13), (13, 40), ""), ((70, 33), (33, 24), "a.T"),
              ((2, 64, 64), (64, 35), "strided b")]


def _shape(a: np.ndarray, b: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    if how == "a.T":
        a = np.ascontiguousarray(a.T).T  # same values, K-strided
    elif how == "strided b":
        b = _strided(b)
    return a, b


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape", "how"), TF32_CASES)
def test_tf32_matches_float64_of_rounded_operands(a_shape: tuple, b_shape: tuple, how: str,
                                                  rng: np.random.Generator) -> None:
    _needs_sm90()
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    a, b = _shape(a, b, how)
    r = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="wgmma", **_sim())
    assert r.dtype == np.float32 and r.shape == np.matmul(a, b).shape
    _check(r, np.matmul(tf32_round(a).astype(np.float64), tf32_round(b)), a.shape[-1])


# 3×TF32: an interior block (unchecked copies, B split by the thread that stored it) and
# edge blocks with K not a multiple of BK, a transposed A (two warpgroups and a longer K:
# test_a_slot_reused_too_soon_is_caught).
THREE_CASES = [((67, 96), (96, 37), ""), ((70, 33), (33, 24), "a.T")]


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape", "how"), THREE_CASES)
def test_3xtf32_is_near_float32_and_better_than_tf32(a_shape: tuple, b_shape: tuple, how: str,
                                                     rng: np.random.Generator) -> None:
    """Three passes (small x big, big x small, big x big, each operand split into a TF32
    big part and a TF32 small part) give float32-like error; one pass does not."""
    _needs_sm90()
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    a, b = _shape(a, b, how)
    want = np.matmul(a.astype(np.float64), b)
    r3 = tilegemm.matmul(a, b, backend="cuda", precision="3xtf32", kernel="wgmma", **_sim())
    r1 = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="wgmma", **_sim())
    assert r3.dtype == np.float32 and not np.isnan(r3).any()
    k = a.shape[-1]
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
    assert np.all(np.abs(r3 - want) <= 4 * k * 2.0**-22 * scale), np.max(np.abs(r3 - want))
    assert np.max(np.abs(r1 - want)) > 8 * np.max(np.abs(r3 - want))  # the passes matter


@pytest.mark.cudasim
@pytest.mark.parametrize(("promote", "a_shape", "b_shape"),
                         [(1, (70, 200), (200, 45)), (2, (64, 160), (160, 32))])
def test_3xtf32_promoted_partial_sums(promote: int, a_shape: tuple, b_shape: tuple,
                                      rng: np.random.Generator) -> None:
    """PROMOTE: the tensor core sums 1 or 2 k-tiles into a fresh partial that the threads
    add to the result. Edge blocks (the checked loop), and an interior block of 5 k-tiles
    with PROMOTE=2 (promotions in both loops, the last partial added after them): a partial
    lost or added twice is an error of whole products, far above this bound."""
    _needs_sm90()
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    r = tilegemm.matmul(a, b, backend="cuda", precision="3xtf32", kernel="wgmma",
                        **_sim(PROMOTE=promote))
    assert not np.isnan(r).any()
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
    err = np.abs(r - np.matmul(a.astype(np.float64), b))
    assert np.all(err <= 4 * a.shape[-1] * 2.0**-24 * scale), np.max(err / scale)


@pytest.mark.cudasim
def test_3xtf32_stays_float32_like_over_a_long_k(rng: np.random.Generator) -> None:
    """The tensor core truncates its sums (the simulator's emulation too): 3×TF32 summed
    over all of K there was 12× SGEMM's error at 4096³ on an H100 and an H200. With each
    k-tile's partial promoted (PROMOTE=1, 8 k-tiles), within 2**-22 of |A|·|B|
    elementwise, where float32 lands (1.3e-7 here; 2.3e-7 at PROMOTE=2, 4.0e-7 at
    PROMOTE=4: the longer a partial, the more truncations it keeps)."""
    _needs_sm90()
    a = rng.standard_normal((64, 256)).astype(np.float32)
    b = rng.standard_normal((256, 32)).astype(np.float32)
    r = tilegemm.matmul(a, b, backend="cuda", precision="3xtf32", kernel="wgmma",
                        **_sim(PROMOTE=1))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
    err = np.abs(r - np.matmul(a.astype(np.float64), b)) / scale
    assert np.max(err) <= 2.0**-22, np.max(err)


HALF_CASES = [("float16", (67, 136), (136, 41), ""), ("bfloat16", (2, 9, 70), (70, 33), ""),
              ("bfloat16", (64, 192), (192, 32), "strided b"), ("float16", (36, 20), (20, 17),
                                                                "a.T")]


@pytest.mark.cudasim
@pytest.mark.parametrize(("dtype", "a_shape", "b_shape", "how"), HALF_CASES)
def test_16bit_products_accumulate_in_float32(dtype: str, a_shape: tuple, b_shape: tuple,
                                              how: str, rng: np.random.Generator) -> None:
    _needs_sm90()
    if dtype == "bfloat16":
        nptype: Any = pytest.importorskip("ml_dtypes").bfloat16
    else:
        nptype = np.float16
    a = rng.standard_normal(a_shape).astype(nptype)
    b = rng.standard_normal(b_shape).astype(nptype)
    a, b = _shape(a, b, how)
    r = tilegemm.matmul(a, b, backend="cuda", kernel="wgmma", dtype=np.float32, **_sim())
    assert r.dtype == np.float32
    _check(r, np.matmul(a.astype(np.float64), b.astype(np.float64)), a.shape[-1])


# BCOPY=1, B copied K-major before the product and then copied like A: interior blocks
# (its unchecked copies) and edge blocks with K not a multiple of BK, a batch with B
# broadcast and K below one tile, a strided B view, a transposed A; 3xTF32 (B's small
# parts split from the copied tile) and both 16-bit types.
KMAJOR_CASES = [("tf32", (67, 96), (96, 37), ""), ("tf32", (2, 9, 13), (13, 40), ""),
                ("tf32", (2, 64, 64), (64, 35), "strided b"), ("tf32", (70, 33), (33, 24), "a.T"),
                ("3xtf32", (64, 96), (96, 32), ""), ("float16", (67, 256), (256, 37), ""),
                ("bfloat16", (64, 192), (192, 32), "")]


def _kmajor_product(mode: str, a: np.ndarray, b: Any, **over: int) -> tuple[np.ndarray, np.ndarray]:
    """(result, float64 reference) of rung wgmma with BCOPY=1 in ``mode``; ``b`` may be a
    device array (``b64`` then comes from its host copy)."""
    b64 = np.asarray(b.copy_to_host() if hasattr(b, "copy_to_host") else b)
    if mode in ("tf32", "3xtf32"):
        r = tilegemm.matmul(a, b, backend="cuda", precision=mode, kernel="wgmma",
                            **_sim(BCOPY=1, **over))
        if mode == "tf32":
            a, b64 = tf32_round(a), tf32_round(b64)
    else:
        r = tilegemm.matmul(a, b, backend="cuda", kernel="wgmma", dtype=np.float32,
                            **_sim(BCOPY=1, **over))
    r = np.asarray(r.copy_to_host() if hasattr(r, "copy_to_host") else r)
    return r, np.matmul(a.astype(np.float64), b64.astype(np.float64))


# The larger tiles kernel="auto" takes for large products (shape_params), at the defaults
# otherwise (BCOPY=1, a 4-deep ring): one interior block with one unchecked k-tile, edge
# blocks in both dimensions with K not a multiple of BK, a batch. The simulator runs the
# first two cases at 128x256 in TF32 (10 s and 5 s) and in float16 with BCOPY=2 (3 s and
# 2 s); a GPU runs them all.
BIG_TILE_CASES = [((128, 96), (96, 256)), ((100, 40), (40, 200)), ((131, 97), (97, 263)),
                  ((3, 300, 129), (129, 520))]


@pytest.mark.cudasim
@pytest.mark.slow
@pytest.mark.parametrize("tile", [(128, 256), (256, 128)])
@pytest.mark.parametrize(("mode", "bcopy"), [("tf32", 1), ("float16", 1), ("bfloat16", 1),
                                             ("float16", 2), ("bfloat16", 2)])
def test_the_larger_tiles_on_odd_shapes(tile: tuple[int, int], mode: str, bcopy: int,
                                        rng: np.random.Generator) -> None:
    """The larger tiles on odd shapes; with BCOPY=2 too (B's N-major tiles then have four
    panels at 128x256)."""
    _needs_sm90()
    on_sim = simulator.enabled()
    if on_sim and (tile, mode, bcopy) not in (((128, 256), "tf32", 1),
                                              ((128, 256), "float16", 2)):
        pytest.skip("on a GPU only: 40-90 s a product on the simulator")
    for a_shape, b_shape in BIG_TILE_CASES[:2] if on_sim else BIG_TILE_CASES:
        dtype = {"tf32": np.float32, "float16": np.float16, "bfloat16": BF16}[mode]
        a = rng.standard_normal(a_shape).astype(dtype)
        b = rng.standard_normal(b_shape).astype(dtype)
        if mode == "tf32":
            r = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="wgmma",
                                BM=tile[0], BN=tile[1])
            a, b = tf32_round(a), tf32_round(b)
        else:
            r = tilegemm.matmul(a, b, backend="cuda", kernel="wgmma", dtype=np.float32,
                                BM=tile[0], BN=tile[1], BCOPY=bcopy)
        assert r.dtype == np.float32 and r.shape == np.matmul(a, b).shape
        _check(r, np.matmul(a.astype(np.float64), b.astype(np.float64)), a.shape[-1])


@pytest.mark.cudasim
@pytest.mark.parametrize(("mode", "a_shape", "b_shape", "how"), KMAJOR_CASES)
def test_b_copied_k_major_before_the_product(mode: str, a_shape: tuple, b_shape: tuple,
                                             how: str, rng: np.random.Generator) -> None:
    _needs_sm90()
    dtype: Any = np.float32
    if mode == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    elif mode == "float16":
        dtype = np.float16
    a, b = _shape(rng.standard_normal(a_shape).astype(dtype),
                  rng.standard_normal(b_shape).astype(dtype), how)
    r, want = _kmajor_product(mode, a, b)
    assert r.dtype == np.float32 and r.shape == want.shape
    k = a.shape[-1]
    if mode == "3xtf32":
        scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b))
        assert not np.isnan(r).any()
        assert np.all(np.abs(r - want) <= 4 * k * 2.0**-22 * scale), np.max(np.abs(r - want))
    else:
        _check(r, want, k)


# BCOPY=2, 16-bit B's tiles copied N-major and read by the transposed-B wgmma, BN=128 (two
# 64-column panels): an interior block (unchecked copies for 2 k-tiles) with K a multiple
# of BK; edge blocks in both dimensions with K not a multiple of BK; a batch with B
# broadcast and K below one tile; a strided B view (rows 16-byte aligned: cp.async); an
# odd N (rows not 16-byte aligned: plain loads); a transposed (K-strided) A.
MN_CASES = [("float16", (64, 192), (192, 128), ""), ("bfloat16", (67, 136), (136, 150), ""),
            ("float16", (2, 9, 40), (40, 130), ""), ("bfloat16", (64, 192), (192, 128),
                                                      "strided b"),
            ("float16", (70, 72), (72, 37), ""), ("bfloat16", (36, 80), (80, 64), "a.T")]


@pytest.mark.cudasim
@pytest.mark.parametrize(("dtype", "a_shape", "b_shape", "how"), MN_CASES)
def test_16bit_b_read_n_major(dtype: str, a_shape: tuple, b_shape: tuple, how: str,
                              rng: np.random.Generator) -> None:
    _needs_sm90()
    nptype: Any = BF16 if dtype == "bfloat16" else np.float16
    a, b = _shape(rng.standard_normal(a_shape).astype(nptype),
                  rng.standard_normal(b_shape).astype(nptype), how)
    r = tilegemm.matmul(a, b, backend="cuda", kernel="wgmma", dtype=np.float32,
                        **_sim(BCOPY=2, BN=128))
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert r.dtype == np.float32 and r.shape == want.shape
    _check(r, want, a.shape[-1])


# (A shape, B shape, A transposed on the device, B transposed on the device, the kernel
# variant (A M-major, B K-major) that reads them): both layouts of each, interior blocks
# with unchecked copies (M = N = 128, K = 192), edge blocks (M = 72, N = 150, K = 80), a
# batch with both transposed; rows off 16 bytes (M = 67, K = 37) take the plain loads.
LAYOUT_CASES = [((128, 192), (192, 128), True, False, (True, False)),
                ((72, 80), (80, 150), True, False, (True, False)),
                ((67, 80), (80, 70), False, True, (False, True)),
                ((128, 192), (192, 128), True, True, (True, True)),
                ((2, 72, 80), (2, 80, 64), True, True, (True, True)),
                ((67, 80), (80, 64), True, False, (False, False)),
                ((67, 37), (37, 70), False, True, (False, False))]


@pytest.mark.cudasim
@pytest.mark.parametrize(("a_shape", "b_shape", "a_t", "b_t", "variant"), LAYOUT_CASES)
def test_in_place_program_reads_each_layout(a_shape: tuple, b_shape: tuple, a_t: bool,
                                            b_t: bool, variant: tuple[bool, bool],
                                            rng: np.random.Generator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """BCOPY=2 never copies a 16-bit operand: A M-major (``x.T @ y`` on device arrays) and
    B K-major (``x @ w.T``) each go, through a transposed view, to the variant compiled for
    that layout (A read by the transposed-A wgmma, B like BCOPY=1's K-major copy); rows off
    16 bytes to the default kernel's plain loads. Each gives the product."""
    from numba import cuda

    from tilegemm.kernels.cuda._kmajor import InPlaceProgram

    _needs_sm90()
    params = _sim(BCOPY=2, BN=128, PASSES=1)
    program = SPEC.program(SPEC.resolve(params), np.float16)
    assert isinstance(program, InPlaceProgram)
    ran: list[Any] = []
    launch_with = InPlaceProgram.launch_with

    def record(self: Any, kernel: Any, *args: Any, **kw: Any) -> None:
        ran.append(kernel)
        launch_with(self, kernel, *args, **kw)

    monkeypatch.setattr(InPlaceProgram, "launch_with", record)
    a, a64 = transposed_device_array(rng, a_shape, np.float16) if a_t else (cuda.to_device(
        x := rng.standard_normal(a_shape).astype(np.float16)), x)
    b, b64 = transposed_device_array(rng, b_shape, np.float16) if b_t else (cuda.to_device(
        y := rng.standard_normal(b_shape).astype(np.float16)), y)
    r = tilegemm.matmul(a, b, backend="cuda", kernel="wgmma", dtype=np.float32,
                        **_sim(BCOPY=2, BN=128))
    r = np.asarray(r.copy_to_host() if hasattr(r, "copy_to_host") else r)
    _check(r, np.matmul(a64.astype(np.float64), b64.astype(np.float64)), a_shape[-1])
    assert ran == [program.kernel_for(*variant)]


def test_n_major_b_is_for_16bit_operands_in_whole_panels() -> None:
    with pytest.raises(InvalidValueError, match="BN a multiple of 64"):
        SPEC.resolve({"BCOPY": 2, "BN": 32})
    p = SPEC.resolve({"BCOPY": 2})
    assert "no transposed form for TF32" in SPEC.dtype_check(p, np.dtype(np.float32))
    assert SPEC.dtype_check(p, np.dtype(np.float16)) is None
    assert SPEC.dtype_check(p, BF16) is None


@pytest.mark.cudasim
@pytest.mark.simulator
def test_n_major_b_asked_for_tf32_is_refused_before_any_launch() -> None:
    a = np.ones((8, 8), np.float32)
    out = np.full((8, 8), 7.0, np.float32)
    with pytest.raises(InvalidValueError, match="no transposed form for TF32"):
        tilegemm.matmul(a, a, out=out, backend="cuda", kernel="wgmma", precision="tf32",
                        BCOPY=2)
    assert np.all(out == 7.0)


@pytest.mark.cudasim
@pytest.mark.parametrize("bcopy", [0, 1])
def test_tf32_unrounded_operands_are_truncated(bcopy: int, rng: np.random.Generator) -> None:
    """ROUND=0: no rounding pass; the tensor core reads the float32 operands' top 19 bits
    (truncation). The result matches float64 of the truncated operands, and not of the
    rounded ones (so the rounding really is skipped), on interior and edge blocks."""
    from tilegemm.kernels.cuda._tensorcore import tf32_truncate

    _needs_sm90()
    a = rng.standard_normal((67, 96)).astype(np.float32)
    b = rng.standard_normal((96, 37)).astype(np.float32)
    r = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="wgmma",
                        **_sim(ROUND=0, BCOPY=bcopy))
    _check(r, np.matmul(tf32_truncate(a).astype(np.float64), tf32_truncate(b)), 96)
    with pytest.raises(AssertionError):
        _check(r, np.matmul(tf32_round(a).astype(np.float64), tf32_round(b)), 96)


def test_round_is_a_tf32_choice() -> None:
    with pytest.raises(InvalidValueError, match="ROUND=0 applies to TF32"):
        SPEC.resolve({"PASSES": 3, "ROUND": 0})
    assert "ROUND=0" in SPEC.dtype_check(SPEC.resolve({"ROUND": 0}), np.dtype(np.float16))
    assert SPEC.dtype_check(SPEC.resolve({"ROUND": 0}), np.dtype(np.float32)) is None


@pytest.mark.cudasim
@pytest.mark.simulator
def test_k_major_b_is_read_in_place_and_a_copy_past_k_is_never_read(
        rng: np.random.Generator) -> None:
    """A device B that is K-major already (the transpose of a C-ordered array) is read
    through a view when nothing is to be rounded (16-bit): the program makes no workspace.
    With TF32 rounding, A and B are copied rounded (two workspaces), a K-major B too; B's
    copy has rows padded to 16 bytes (K = 13 -> 16 in float32): padding poisoned with NaN
    must not reach the result (the copies stop at K), and the workspaces are reused."""
    from numba import cuda

    from tilegemm.kernels.cuda._kmajor import kmajor_shape

    half = SPEC.program(SPEC.resolve(_sim(BCOPY=1, PASSES=1)), np.float16)
    half.workspaces._spaces.clear()
    a = rng.standard_normal((67, 16)).astype(np.float16)
    bt = rng.standard_normal((37, 16)).astype(np.float16)  # B's transpose, C-ordered
    r, want = _kmajor_product("float16", a, cuda.to_device(bt).transpose())
    _check(r, want, 16)
    assert len(half.workspaces) == 0  # read in place

    program = SPEC.program(SPEC.resolve(_sim(BCOPY=1, PASSES=1)), np.float32)
    program.workspaces._spaces.clear()
    a = rng.standard_normal((67, 13)).astype(np.float32)
    bt = rng.standard_normal((37, 13)).astype(np.float32)
    work = program.workspaces.get(kmajor_shape((1, 13, 37), 4), np.dtype(np.float32), 0, "B")
    assert work.shape == (1, 37, 16)
    work.copy_to_device(np.full(work.shape, np.nan, dtype=np.float32))
    r, want = _kmajor_product("tf32", a, np.ascontiguousarray(bt.T))
    _check(r, want, 13)
    assert len(program.workspaces) == 2  # A's and B's rounded copies; B's reused
    a16 = rng.standard_normal((67, 16)).astype(np.float32)
    bt16 = rng.standard_normal((37, 16)).astype(np.float32)
    r, want = _kmajor_product("tf32", a16, cuda.to_device(bt16).transpose())
    _check(r, want, 16)  # a K-major B, copied rounded (an unrounded B fails this bound)


@pytest.mark.cudasim
@pytest.mark.parametrize(("mode", "k"), [("float16", 80), ("tf32", 80), ("tf32", 13)])
def test_an_m_major_a_is_copied_k_major_before_the_product(mode: str, k: int,
                                                           rng: np.random.Generator,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """BCOPY=1 with a device A laid out M-major (the transpose of a C-ordered array, as in
    ``x.T @ y``): A gets a K-major copy (rounded for TF32) made with B's, so its tiles go by
    whole 16-byte cp.async copies instead of the kernel's plain loads; the copy's rows are
    padded to 16 bytes (K = 13 -> 16 in float32: not whole chunks, yet copied so), and NaN
    in the padding must not reach the result. A K-major A is not copied in 16-bit."""
    from tilegemm.kernels.cuda._kmajor import kmajor_shape

    _needs_sm90()
    dtype = np.float16 if mode == "float16" else np.float32
    program = SPEC.program(SPEC.resolve(_sim(BCOPY=1, PASSES=1)), dtype)
    program.workspaces._spaces.clear()
    a, a_host = transposed_device_array(rng, (72, k), dtype)
    b = rng.standard_normal((k, 40)).astype(dtype)
    if mode == "tf32":
        work = program.workspaces.get(kmajor_shape((1, k, 72), 4), np.dtype(dtype), 0, "A")
        work.copy_to_device(np.full(work.shape, np.nan, dtype=dtype))
    over = {"precision": "tf32"} if mode == "tf32" else {"dtype": np.float32}
    copies = record_async_copies(monkeypatch)
    r = tilegemm.matmul(a, b, backend="cuda", kernel="wgmma", **over, **_sim(BCOPY=1))
    r = np.asarray(r.copy_to_host() if hasattr(r, "copy_to_host") else r)
    a64, b64 = (tf32_round(a_host), tf32_round(b)) if mode == "tf32" else (a_host, b)
    _check(r, np.matmul(a64.astype(np.float64), b64.astype(np.float64)), k)
    slots = {key[-1] for key in program.workspaces._spaces}
    assert slots == {"A", "B"}, slots
    if simulator.enabled():
        assert ((1, 72, k), 16) in copies, "A's copy was not read by 16-byte copies"
    if mode == "float16":  # the same product with A K-major: no copy of A
        program.workspaces._spaces.clear()
        tilegemm.matmul(np.ascontiguousarray(a_host), b, backend="cuda", kernel="wgmma",
                        dtype=np.float32, **_sim(BCOPY=1))
        assert {key[-1] for key in program.workspaces._spaces} == {"B"}


@pytest.mark.cudasim
def test_gemm_alpha_beta_reads_c(rng: np.random.Generator) -> None:
    _needs_sm90()
    a = rng.standard_normal((9, 40)).astype(np.float32)
    b = rng.standard_normal((40, 11)).astype(np.float32)
    c = rng.standard_normal((9, 11)).astype(np.float32)
    r = tilegemm.gemm(a, b, c, alpha=2.0, beta=-0.5, backend="cuda", precision="tf32",
                      kernel="wgmma", **_sim())
    want = 2.0 * np.matmul(tf32_round(a).astype(np.float64), tf32_round(b)) - 0.5 * c
    _check(r, want, 40, 2.0 * np.max(np.abs(want)))


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.slow  # ~10 s: two blocks of 256 threads
def test_two_warpgroups_and_a_deeper_ring(rng: np.random.Generator) -> None:
    """2-warpgroup blocks (one interior, one on N's edge), a 4-stage ring, 4 k-tiles (2 of
    them unchecked)."""
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 20)).astype(np.float32)
    r = tilegemm.matmul(a, b, backend="cuda", precision="tf32", kernel="wgmma",
                        **_sim(BM=128, BN=16, STAGES=4))
    _check(r, np.matmul(tf32_round(a).astype(np.float64), tf32_round(b)), 128)


@pytest.mark.cudasim
@pytest.mark.simulator
def test_copies_one_tile_further_ahead_are_caught(rng: np.random.Generator) -> None:
    """The ring's ordering, checked: copying STAGES - 1 tiles ahead (instead of STAGES - 2)
    rewrites the stage of tile kt-1 while its product may still run. The simulator's
    stand-in computes a product when a wait retires it, reading shared memory then, so the
    result is wrong there (on a GPU it would be wrong only sometimes). With BCOPY=0: B's
    tiles are written by ordinary stores, at once; the stand-in for ``cp.async`` (every
    copy with BCOPY=1) lands its copies at the wait, so there the early rewrite comes too
    late to show. The ring's order is the same code for both."""
    from tilegemm.kernels.cuda import k11_wgmma

    a = rng.standard_normal((1, 64, 160)).astype(np.float32)
    b = rng.standard_normal((1, 160, 32)).astype(np.float32)
    want = np.matmul(tf32_round(a).astype(np.float64), tf32_round(b))
    p = SPEC.resolve({**_sim(), "PASSES": 1, "BCOPY": 0})
    for ahead, ok in ((p["STAGES"] - 2, True), (p["STAGES"] - 1, False)):
        c = np.full((1, 64, 32), np.nan, np.float32)
        k11_wgmma.build(p, np.dtype(np.float32), ahead).launch(a, b, c, 1.0, 0.0)
        assert (np.max(np.abs(c - want)) < 1e-3) == ok, (ahead, np.max(np.abs(c - want)))


@pytest.mark.cudasim
@pytest.mark.simulator
def test_a_slot_reused_too_soon_is_caught(rng: np.random.Generator,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """3×TF32's slots of small parts, checked: with one slot, a thread splits tile kt+1's
    parts over tile kt's while that tile's product may still run (only tile kt-1 is known
    to have retired); the simulator computes a product when a wait retires it, reading
    shared memory then, so the result is wrong. Three slots (the rung's) are right with two
    warpgroups, whose products retire independently. (Two slots race only across
    warpgroups: a thread may split tile kt before the other warpgroup has retired tile
    kt-2; the simulator catches that only in some thread interleavings.)"""
    from tilegemm.kernels.cuda import k11_wgmma

    a = rng.standard_normal((1, 128, 160)).astype(np.float32)
    b = rng.standard_normal((1, 160, 16)).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b)
    p = SPEC.resolve({"BM": 128, "BN": 16, "STAGES": 3, "GROUP_M": 2, "PASSES": 3})
    for slots, ok in ((3, True), (1, False)):
        monkeypatch.setattr(k11_wgmma, "SMALL_SLOTS", slots)
        c = np.full((1, 128, 16), np.nan, np.float32)
        k11_wgmma.build(p, np.dtype(np.float32)).launch(a, b, c, 1.0, 0.0)
        assert (np.max(np.abs(c - want)) < 1e-3) == ok, (slots, np.max(np.abs(c - want)))


# --- how it is chosen -----------------------------------------------------------------------


@pytest.mark.parametrize("capability", [(9, 0), (8, 0), (8, 9), (10, 0), None])
def test_auto_picks_wgmma_on_sm90_only(capability: tuple[int, int] | None) -> None:
    """Checked and timed on an H100 and an H200: kernel="auto" runs wgmma for tensor-core
    requests on compute capability 9.0, and mma on any other GPU and where the capability
    is unknown (the simulator stands for any GPU)."""
    from tilegemm.precision import apply_precision

    assert not SPEC.named_only and registry.default_for("cuda", "float32").name != "wgmma"
    want = "wgmma" if capability == (9, 0) else "mma"
    for dtype, precision in ((np.float32, "tf32"), (np.float32, "3xtf32"),
                             (np.float16, None), (BF16, None)):
        name, params = apply_precision(precision, "auto", "cuda", np.dtype(dtype), {},
                                       capability=capability)
        assert name == want, (dtype, precision)
        if precision:
            assert params["PASSES"] == registry.get(want, "cuda").precisions[precision]
    name, _ = apply_precision(None, "auto", "cuda", np.dtype(np.float32), {},
                              capability=(9, 0))
    assert name == "auto"  # IEEE float32: the FFMA ladder, never a tensor-core rung


def test_wgmma_needs_a_tensor_core_precision() -> None:
    from tilegemm.precision import apply_precision

    with pytest.raises(InvalidValueError, match="pass precision= one of 'tf32', '3xtf32'"):
        apply_precision(None, "wgmma", "cuda", np.dtype(np.float32), {})
    for precision, passes in (("tf32", 1), ("3xtf32", 3)):
        name, params = apply_precision(precision, "wgmma", "cuda", np.dtype(np.float32), {})
        assert name == "wgmma" and params["PASSES"] == passes


def test_the_simulator_holds_wgmma_to_sm90s_shared_memory() -> None:
    """The simulator stands for any GPU and carries sm_80's 99 KB opt-in limit, which
    refused wgmma at its defaults (a 128 KB ring), a rung that only runs on sm_90."""
    from tilegemm.backends.base import Target
    from tilegemm.backends.cuda import CUDA_LIMITS, CudaBackend

    sim = Target("cuda", "simulator", "simulator", "", CUDA_LIMITS, timer="CUDA events",
                 simulated=True)
    dtype = np.dtype(np.float32)
    CudaBackend().check_limits(SPEC, SPEC.resolve({"PASSES": 1}), dtype, sim)  # 128 KB
    with pytest.raises(InvalidValueError, match="227 KB"):
        CudaBackend().check_limits(SPEC, SPEC.resolve({"PASSES": 1, "STAGES": 6, "BM": 256}),
                                   dtype, sim)
    mma = registry.get("mma", "cuda")  # a rung for any arch keeps the smallest limit
    with pytest.raises(InvalidValueError, match="101376-byte limit"):
        CudaBackend().check_limits(mma, mma.resolve({"BK": 32, "STAGES": 4, "PASSES": 1}),
                                   dtype, sim)


def _gpu(capability: tuple[int, int], sms: int = 0) -> Any:
    """A GPU's Target (no GPU needed) of ``capability``, with an H100's opt-in shared memory
    and ``sms`` SMs (0: not reported)."""
    from dataclasses import replace

    from tilegemm.backends.base import Target
    from tilegemm.backends.cuda import CUDA_LIMITS

    limits = replace(CUDA_LIMITS, shared_optin_per_block=227 * 1024)
    return Target("cuda", "GPU", "gpu", "sm_{}{}".format(*capability), limits, "CUDA events",
                  capability=capability, compute_units=sms)


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_any_gpu_but_sm90_is_refused_listing_what_runs(capability: tuple[int, int]) -> None:
    from tilegemm.backends.cuda import BACKEND

    target = _gpu(capability)
    with pytest.raises(UnavailableError, match=r"sm_90a.*compute capability 9\.0.*"
                                               r"Tensor-core kernels that run here: mma"):
        BACKEND.check_limits(SPEC, SPEC.defaults(), np.dtype(np.float32), target)
    BACKEND.check_limits(SPEC, SPEC.defaults(), np.dtype(np.float32), _gpu((9, 0)))  # runs


def test_tuner_space_and_baseline() -> None:
    """Searchable by the tuner; the untuned baseline is what kernel="auto" runs there:
    wgmma on compute capability 9.0, mma on other GPUs."""
    from tilegemm.backends.cuda import BACKEND, CUDA_LIMITS
    from tilegemm.commands.tune import baseline_choice
    from tilegemm.tune import select, space

    cands = space.candidates(SPEC, "float32", CUDA_LIMITS, "tf32")
    assert cands and all(p["PASSES"] == 1 for p in cands)
    assert all(p["ROUND"] == 1 for p in cands)  # truncation is asked for, never tuned in
    assert {p["BCOPY"] for p in cands} == {0, 1}  # TF32: B must be K-major
    assert {p["BCOPY"] for p in space.candidates(SPEC, "float16", CUDA_LIMITS)} == {0, 1, 2}
    three = space.candidates(SPEC, "float32", CUDA_LIMITS, "3xtf32")
    assert three and all(p["PASSES"] == 3 for p in three)
    assert space.candidates(SPEC, "bfloat16", CUDA_LIMITS)
    mma = registry.get("mma", "cuda")
    for capability, want in (((9, 0), SPEC), ((8, 0), mma)):
        choice = baseline_choice(BACKEND, _gpu(capability), np.dtype(np.float32), "tf32",
                                 [mma, SPEC], select.untuned_choice)
        assert choice is not None and choice[0] is want
    # for a product, the tiles a call fits to it (shape_params), as kernel="auto" runs them
    from tilegemm.problem import problem_for

    h100 = _gpu((9, 0), sms=132)
    for n, tile in ((4096, (128, 256)), (1024, (128, 128))):
        choice = baseline_choice(BACKEND, h100, np.dtype(np.float32), "tf32", [mma, SPEC],
                                 select.untuned_choice, problem_for(n, n, n, "float32"))
        assert choice is not None and (choice[1]["BM"], choice[1]["BN"]) == tile


def _auto_tile(m: int, n: int, k: int = 4096, batch: int = 0, sms: int = 132,
               dtype: str = "float32", **given: int) -> tuple[int, int] | None:
    """The block tile kernel="auto" gives wgmma for an (M, N, K) product on a GPU of
    ``sms`` SMs, starting from the defaults (with ``given`` on top); None: the defaults'."""
    from tilegemm.kernels.cuda.k11_wgmma import shape_params
    from tilegemm.problem import problem_for

    found = shape_params(SPEC.resolve(given), problem_for(m, n, k, dtype, batch),
                         _gpu((9, 0), sms))
    return None if found is None else (found[0]["BM"], found[0]["BN"])


def test_auto_takes_the_larger_tiles_where_there_are_enough() -> None:
    """128x256 or 256x128 tiles ran 1.13-1.18x faster than 128x128 on an H200 at 4096³ and
    8192³, and slower or no faster where they made fewer than two blocks per SM."""
    assert _auto_tile(4096, 4096) == (128, 256)  # 512 blocks for 132 SMs
    assert _auto_tile(4096, 4096, dtype="bfloat16") == (128, 256)
    assert _auto_tile(4096, 2048) is None  # 256 blocks of either: under two per SM
    # 16 x 17 = 272 blocks of 256x128 (less past the edge), 32 x 9 = 288 of 128x256
    assert _auto_tile(4096, 2112) == (256, 128)
    assert _auto_tile(1536, 1536) is None  # measured: 69 TFLOP/s against 100 (TF32)
    assert _auto_tile(1024, 1024, batch=9) == (128, 256)  # 288 blocks over the batch
    # both larger tiles make enough blocks: the one with fewer (less past the edges)
    assert _auto_tile(32768, 384) == (256, 128)  # 384 blocks against 512
    assert _auto_tile(384, 32768) == (128, 256)
    assert _auto_tile(4096, 4096, sms=300) is None  # a GPU with more SMs needs more
    assert _auto_tile(4096, 4096, sms=0) is None  # no SM count: the defaults
    assert _auto_tile(4096, 4096, PASSES=3) is None  # 3xTF32: no ring of larger tiles fits
    assert _auto_tile(4096, 4096, BN=64) is None  # only the defaults are adapted


def test_auto_reads_16bit_b_n_major() -> None:
    """An untuned 16-bit product takes BCOPY=2 (B read N-major by the transposed-B wgmma,
    no copy before the kernel: 1.17x BCOPY=1 on an H200 at 4096³), at any size and SM
    count where B's rows lie on 16 bytes; TF32, which has no transposed form, and
    parameters given by hand keep BCOPY=1."""
    from tilegemm.kernels.cuda.k11_wgmma import shape_params
    from tilegemm.problem import problem_for

    def bcopy(dtype: str, m: int = 4096, sms: int = 132, n: int | None = None,
              **given: int) -> int | None:
        found = shape_params(SPEC.resolve(given), problem_for(m, n or m, m, dtype),
                             _gpu((9, 0), sms))
        return None if found is None else found[0]["BCOPY"]

    for dtype in ("float16", "bfloat16"):
        assert bcopy(dtype) == 2
        assert bcopy(dtype, m=64) == 2  # a small product keeps its tile, not its copy
        assert bcopy(dtype, sms=0) == 2  # the layout does not depend on the SM count
        assert bcopy(dtype, BCOPY=0) == 0  # only the default is adapted (the tile is)
        assert bcopy(dtype, m=64, BCOPY=0) is None
        # rows of B off 16 bytes: BCOPY=2 would read them element by element on every
        # k-tile, BCOPY=1's copy pads them once
        assert bcopy(dtype, n=4100) == 1 and bcopy(dtype, m=64, n=60) is None
        assert bcopy(dtype, n=4104) == 2
    assert bcopy("float32") == 1  # 128x256 tiles, B still copied K-major
    assert bcopy("float32", m=64) is None


@pytest.mark.cudasim
@pytest.mark.simulator
def test_plan_on_an_h100_fits_wgmmas_tile_to_the_product(monkeypatch) -> None:  # noqa: ANN001
    """An untuned tensor-core call on a (stand-in) sm_90 GPU of 132 SMs: 128x256 tiles at
    4096³ (TF32, 16-bit), with the reason in the plan; 128x128 for a small product, for
    3xTF32 and for parameters given by hand."""
    import dataclasses

    from tilegemm import precision as precision_module
    from tilegemm.backends import cuda as cuda_backend

    be = cuda_backend.BACKEND
    sim = be.target()
    h100 = dataclasses.replace(sim, capability=(9, 0), arch="sm_90", simulated=False,
                               compute_units=132, limits=dataclasses.replace(
                                   sim.limits, shared_optin_per_block=227 * 1024))
    monkeypatch.setattr(type(be), "_target", lambda self, index: h100)
    monkeypatch.setattr(precision_module, "_simulated", lambda backend: False)  # defaults
    big = np.broadcast_to(np.float32(1), (4096, 4096))  # a shape only: plan reads no data
    tiles = "512 tiles of 128x256 for 132 SMs (1024 of 128x128)"
    n_major = "16-bit B read N-major, not copied (BCOPY=2)"
    for x, precision, source, bcopy in ((big, "tf32", f"default; {tiles}", 1),
                                        (big.astype(np.float16), None,
                                         f"default; {n_major}; {tiles}", 2)):
        planned = tilegemm.plan(x, x, backend="cuda", precision=precision)
        assert (planned.params["BM"], planned.params["BN"]) == (128, 256), planned
        assert planned.source == source and planned.params["BCOPY"] == bcopy
    small = np.ones((256, 256), np.float32)
    for x, precision, given, bcopy in ((big, "3xtf32", {}, 1), (small, "tf32", {}, 1),
                                       (small.astype(np.float16), None, {}, 2),
                                       (big, "tf32", {"kernel": "wgmma", "STAGES": 6}, 1),
                                       (big.astype(np.float16), None,
                                        {"kernel": "wgmma", "BCOPY": 1}, 1)):
        planned = tilegemm.plan(x, x, backend="cuda", precision=precision, **given)
        assert (planned.params["BM"], planned.params["BN"]) == (128, 128), planned
        assert planned.params["BCOPY"] == bcopy, planned


# --- machine code (sm_90a, no GPU needed) ---------------------------------------------------


def _clean_sass(params: dict[str, int], dtype: str) -> str:
    """The rung's sm_90a SASS for ``params``, after checking what every configuration must
    have: wgmma not serialized (ptxas does so, with a warning, when the function makes a
    call, e.g. for a 64-bit division), no local memory, no spills, registers within the
    256-thread block."""
    from tilegemm.analysis.resources import link, parse_ptxas_log, ptx_for
    from tilegemm.analysis.sass import disassemble

    ptx = ptx_for(SPEC, params, dtype, "sm_90")
    assert "\n.target sm_90a" in ptx and ".extern .shared .align 1024" in ptx
    log, cubin = link(ptx, "sm_90")
    assert "serialized" not in log, log
    text = disassemble(cubin)
    assert not re.search(r"\b(LDL|STL)\b", text)
    figures = parse_ptxas_log(log)
    assert figures["spill_stores"] == figures["spill_loads"] == figures["stack"] == 0
    assert 0 < figures["registers"] <= 255
    return text


@pytest.mark.ptx
@pytest.mark.parametrize(("dtype", "opcode"), [
    ("float32", r"HGMMA\.64x128x8\.F32\.TF32"), ("float16", r"HGMMA\.64x128x16\.F32 "),
    ("bfloat16", r"HGMMA\.64x128x16\.F32\.BF16")])
def test_sass_at_the_defaults(dtype: str, opcode: str) -> None:
    """sm_90a SASS at the defaults: the four k steps of a tile are four chained HGMMA, and
    what every configuration must have (:func:`_clean_sass`)."""
    text = _clean_sass(SPEC.defaults(), dtype)
    # 4 per k-tile in each of the two k loops (interior and checked)
    assert len(re.findall(opcode, text)) == 8, text
    assert len(re.findall(r"WARPGROUP\.DEPBAR", text)) == 3  # wait_group 1 (twice), 0


@pytest.mark.ptx
def test_sass_of_3xtf32_at_the_defaults() -> None:
    """3×TF32 at the defaults: three chained HGMMA per k step (12 a k-tile in each of the
    two k loops), what every configuration must have (:func:`_clean_sass`), and its ring
    with the three slots of small parts within an H100 block's 227 KB."""
    from tilegemm.kernels.cuda.k11_wgmma import SMEM_SM90

    p = SPEC.resolve({"PASSES": 3})
    assert SPEC.smem(p, 4) == 224 * 1024 <= SMEM_SM90
    text = _clean_sass(p, "float32")
    assert len(re.findall(r"HGMMA\.64x128x8\.F32\.TF32", text)) == 24


@pytest.mark.ptx
def test_sass_of_3xtf32_with_promoted_partial_sums() -> None:
    """PROMOTE=1 at the defaults: the partial's 64 registers on top of the result's fit
    (255 at most, no spills, wgmma not serialized), and still 12 HGMMA a k-tile."""
    text = _clean_sass(SPEC.resolve({"PASSES": 3, "PROMOTE": 1}), "float32")
    assert len(re.findall(r"HGMMA\.64x128x8\.F32\.TF32", text)) == 24


@pytest.mark.ptx
def test_no_code_for_other_architectures() -> None:
    from tilegemm.analysis.resources import archs_for, ptx_for

    assert archs_for(SPEC) == ("sm_90",)
    with pytest.raises(InvalidValueError, match="compiles only for sm_90"):
        ptx_for(SPEC, SPEC.defaults(), "float32", "sm_80")


# The interior loop, per thread per k-tile (numba-cuda 0.30.4, CUDA 13.5): at the defaults
# (BCOPY=1: A and B by cp.async, 8 copies) 129 instructions in TF32, 132 in float16 and
# bfloat16; with BCOPY=0 (B through registers, 4 copies of A) 278 in TF32, 239/237 in
# float16/bfloat16 (907 and ~1250 with the checked loader on every tile); with BCOPY=2 (B's
# tiles N-major, 8 copies) 131/132 in float16/bfloat16; 4 HGMMA in each.
# Skipped with another toolchain.
GUARD_TOOLCHAIN = {"nvdisasm": "13.5.37", "nvvm": "13.5.37"}
# (dtype, BCOPY): (cp.async copies, hot-loop instructions at most)
WGMMA_GUARD = {("float32", 1): (8, 140), ("float16", 1): (8, 140), ("bfloat16", 1): (8, 140),
               ("float32", 0): (4, 290), ("bfloat16", 0): (4, 250), ("float16", 2): (8, 140),
               ("bfloat16", 2): (8, 140)}


@pytest.mark.ptx
@pytest.mark.parametrize(("dtype", "bcopy"), list(WGMMA_GUARD))
def test_hot_loop_issue_share_does_not_regress(dtype: str, bcopy: int) -> None:
    from tilegemm.analysis import sass
    from tilegemm.analysis.sass_mma import mma_report

    try:
        sass.nvdisasm_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    if sass.toolchain() != GUARD_TOOLCHAIN:
        pytest.skip(f"toolchain {sass.toolchain()} differs from {GUARD_TOOLCHAIN}")
    copies, most = WGMMA_GUARD[(dtype, bcopy)]
    r = mma_report(SPEC, SPEC.resolve({"BCOPY": bcopy, "STAGES": 0 if bcopy else 4}), dtype,
                   "sm_90")
    assert r.hot["HMMA"] == 4 and r.hot["LDGSTS"] == copies and r.hot["BAR"] == 1, r.hot
    assert r.hot["total"] <= most, r.hot
    assert r.local_memory == 0


@pytest.mark.ptx
@pytest.mark.parametrize("variant", [(True, False), (False, True), (True, True)])
def test_sass_of_the_in_place_layouts(variant: tuple[bool, bool]) -> None:
    """BCOPY=2's kernels for the other operand layouts (A M-major, B K-major, both): the
    wgmma's transposed forms where a tile is M- or N-major (``.tnspA``, ``.tnspB`` on its
    descriptor), 4 HGMMA and 8 cp.async a k-tile, no local memory, no spills, wgmma not
    serialized (numba-cuda 0.30.4, CUDA 13.5: 127-132 instructions, 158-210 registers)."""
    from tilegemm.analysis import sass
    from tilegemm.analysis.resources import kernel_ptx, link, parse_ptxas_log
    from tilegemm.analysis.sass_mma import count

    try:
        sass.nvdisasm_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    program = SPEC.program(SPEC.resolve({"BCOPY": 2}), np.float16)
    kernel = program.kernel_for(*variant)
    ptx = kernel_ptx(kernel, program.signature("float16"), {"sm_90": (9, 0, "a")})["sm_90"]
    log, cubin = link(ptx, "sm_90")
    assert "serialized" not in log, log
    figures = parse_ptxas_log(log)
    assert figures["spill_stores"] == figures["spill_loads"] == figures["stack"] == 0
    text = sass.disassemble(cubin)
    a_mn, b_kmajor = variant
    descs = re.findall(r"HGMMA\.64x128x16\.F32 R\d+, gdesc\[UR\d+\]([.\w]*)", text)
    want = (".tnspA" if a_mn else "") + ("" if b_kmajor else ".tnspB")
    assert descs and set(descs) == {want}, set(descs)
    r = count(text, kernel="wgmma", arch="sm_90", dtype="float16", params={})
    assert r.hot["HMMA"] == 4 and r.hot["LDGSTS"] == 8 and r.local_memory == 0, r.hot
    if sass.toolchain() == GUARD_TOOLCHAIN:
        assert r.hot["total"] <= 140, r.hot


@pytest.mark.cudasim
@pytest.mark.simulator
def test_plan_on_an_h100_runs_wgmma_for_tensor_core_requests(monkeypatch) -> None:  # noqa: ANN001
    """matmul's decision passes the device's compute capability to the choice of rung: on
    a (stand-in) sm_90 GPU the plan for TF32, 3xTF32 and 16-bit operands is wgmma; under
    the simulator, which stands for any GPU, mma."""
    import dataclasses

    from tilegemm.backends import cuda as cuda_backend

    be = cuda_backend.BACKEND
    a = np.ones((64, 32), np.float32)
    assert tilegemm.plan(a, a.T, backend="cuda", precision="tf32").kernel == "mma"
    h100 = dataclasses.replace(be.target(), capability=(9, 0), arch="sm_90", simulated=False)
    monkeypatch.setattr(type(be), "_target", lambda self, index: h100)
    for x, precision in ((a, "tf32"), (a, "3xtf32"), (a.astype(np.float16), None)):
        planned = tilegemm.plan(x, x.T, backend="cuda", precision=precision)
        assert planned.kernel == "wgmma", precision
