"""Split-K and the wave-aware choice of pipelined's parameters.

Two parts:
- ``cudasim``: the split-K launch (partial products into a workspace, then an in-order sum
  applying alpha, beta and C) on numba's simulator, with the simulator's small tiles:
  float32 and float64, batches, transposes, out=, NaN-poisoned outputs and workspaces,
  K a prime and K shorter than the slices (empty slices), and bit-identical repeats.
- plain: which parameters kernel="auto" picks on a device with a given number of SMs
  (a Target made here; no GPU needed).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilegemm
from tilegemm import registry
from tilegemm.backends.base import Limits, Target
from tilegemm.problem import problem_for
from tilegemm.reference import assert_close, random_operands

CUDA_LIMITS = Limits(threads_per_block=1024, block_dims=(1024, 1024, 64),
                     shared_per_block=48 * 1024, registers_per_block=65536,
                     registers_per_thread=255)


def _spec() -> registry.KernelSpec:
    return registry.get("pipelined", "cuda")


def _sim(split: int) -> dict[str, int]:
    spec = _spec()
    return spec.resolve({**spec.sim_params, "SPLIT_K": split})


# --- split-K on the simulator ----------------------------------------------------------------

# (M, N, K): vector path with K a multiple of the slices; K prime (slices of unequal
# length, scalar path); K shorter than one k-tile (all but the first slice empty); several
# tiles in M and N with partial edges; interior tiles on the 128-bit path (64x48x96).
SPLIT_SHAPES = [(17, 20, 64), (13, 7, 61), (9, 12, 5), (37, 35, 41), (64, 48, 96)]


@pytest.mark.cudasim
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_split_k_float32(split: int, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    a, b = random_operands((m, k), (k, n), np.float32)
    c = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda", **_sim(split))
    assert_close(c, a, b, what=f"split-K {split} {shape}")


@pytest.mark.cudasim
def test_split_k_float64_batched_gemm() -> None:
    """float64, A shared by a batch of B, alpha/beta with C read, trans_a (a strided A)."""
    rng = np.random.default_rng(3)
    a, b = random_operands((1, 29, 23), (3, 29, 18), np.float64)  # a is stored K x M
    c0 = rng.uniform(-1, 1, size=(3, 23, 18))
    out = tilegemm.gemm(a, b, c0, alpha=-1.5, beta=0.5, trans_a=True, kernel="pipelined",
                        backend="cuda", **_sim(4))
    assert_close(out, a, b, alpha=-1.5, beta=0.5, c=c0, trans_a=True,
                 what="split-K float64 batched trans_a")


@pytest.mark.cudasim
def test_split_k_out_trans_b_and_nan_out() -> None:
    """out= filled with NaN and beta == 0: every element is written, none is read; then
    out=c updated in place with beta != 0 and a transposed B."""
    rng = np.random.default_rng(4)
    a, bt = random_operands((2, 19, 33), (2, 14, 33), np.float32)  # bt is N x K
    out = np.full((2, 19, 14), np.nan, dtype=np.float32)
    tilegemm.gemm(a, bt, trans_b=True, out=out, kernel="pipelined", backend="cuda", **_sim(2))
    assert_close(out, a, bt, trans_b=True, what="split-K out= trans_b")
    c = rng.uniform(-1, 1, size=(2, 19, 14)).astype(np.float32)
    c0 = c.copy()
    tilegemm.gemm(a, bt, c, alpha=2.0, beta=-1.0, trans_b=True, out=c, kernel="pipelined",
                  backend="cuda", **_sim(2))
    assert_close(c, a, bt, alpha=2.0, beta=-1.0, c=c0, trans_b=True, what="split-K out=c")


@pytest.mark.cudasim
def test_split_k_is_deterministic() -> None:
    """The slices are summed in a fixed order: repeated calls give the same bits."""
    a, b = random_operands((21, 70), (70, 18), np.float32)
    params = _sim(4)
    first = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda", **params)
    for _ in range(2):
        again = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda", **params)
        assert np.array_equal(first, again)
    assert_close(first, a, b, what="split-K repeat")


@pytest.mark.cudasim
@pytest.mark.parametrize("one_block", [False, True])
def test_split_k_writes_every_workspace_element(one_block: bool) -> None:
    """A workspace full of NaN (and a NaN C) is overwritten everywhere, empty slices
    included (K=5 in 4 slices of 8); with a grid of one block, the grid-stride loops still
    cover every tile, slice and product."""
    from numba import cuda

    from tilegemm.kernels.cuda._splitk import SplitKProgram

    program = _spec().build(_sim(4), np.dtype(np.float32))
    assert isinstance(program, SplitKProgram)
    if one_block:
        program = dataclasses.replace(program, grid=lambda batch, m, n: (1, 1, 1))
    for m, n, k in ((9, 12, 5), (37, 18, 44)):
        a, b = random_operands((2, m, k), (1, k, n), np.float32)
        work = program.workspaces.get((4 * 2, m, n), np.dtype(np.float32), 0)
        work.copy_to_device(np.full(work.shape, np.nan, dtype=np.float32))
        c = cuda.to_device(np.full((2, m, n), np.nan, dtype=np.float32))
        program.launch(cuda.to_device(a), cuda.to_device(b), c, np.float32(1), np.float32(0))
        assert_close(c.copy_to_host(), a, b, what=f"split-K workspace {m}x{n}x{k}")


@pytest.mark.cudasim
@pytest.mark.simulator
def test_the_sum_of_the_slices_is_the_same_in_the_gpus_launch_shape(
        monkeypatch, rng: np.random.Generator) -> None:
    """The simulator runs the slices' sum as one warp striding over C (every simulated
    thread is a Python thread); a GPU runs a thread an element, 256 a block. Both give
    the slices added in order, exactly."""
    from numba import cuda

    from tilegemm.kernels.cuda import _splitk
    from tilegemm.launch import MAX_GRID_X

    assert _splitk.reduce_launch(5000) == (1, 32)
    with monkeypatch.context() as off:
        off.setattr(_splitk.simulator, "enabled", lambda: False)
        gpu = _splitk.reduce_launch(2 * 9 * 13)
        assert gpu == (1, 256) and _splitk.reduce_launch(5000) == (20, 256)
        assert _splitk.reduce_launch(10**12) == (MAX_GRID_X, 256)
    w = rng.standard_normal((2 * 3, 9, 13)).astype(np.float32)  # 2 products, 3 slices
    want = np.float32(0.5) * ((w[0::3] + w[1::3]) + w[2::3])
    for blocks, threads in ((1, 32), gpu, (3, 64)):
        c = cuda.to_device(np.full((2, 9, 13), np.nan, np.float32))
        _splitk.reduce_kernel()[blocks, threads](cuda.to_device(w), c, np.float32(0.5),
                                                 np.float32(0))
        np.testing.assert_array_equal(c.copy_to_host(), want)


@pytest.mark.cudasim
def test_small_tile_runs() -> None:
    """The 128x64 tile kernel="auto" picks for products that 128x128 tiles cannot spread
    over the SMs: one full interior block and a partial one."""
    from tilegemm.kernels.cuda.k09_pipelined import SMALL_TILE

    for m, n, k in ((128, 64, 16), (67, 45, 24)):
        a, b = random_operands((m, k), (k, n), np.float32)
        c = tilegemm.matmul(a, b, kernel="pipelined", backend="cuda", **SMALL_TILE)
        assert_close(c, a, b, what=f"128x64 tile {m}x{n}x{k}")


# --- the choice, on a device described by its Target ------------------------------------------

def _gpu(sms: int) -> Target:
    return Target("cuda", f"a GPU with {sms} SMs", "gpu", "sm_90", CUDA_LIMITS,
                  timer="CUDA events", capability=(9, 0), accelerated=True,
                  compute_units=sms)


def _shaped(m: int, n: int, k: int, sms: int = 132, dtype: str = "float32",
            batch: int = 0) -> dict[str, int]:
    from tilegemm.kernels.cuda.k09_pipelined import shape_params

    spec = _spec()
    found = shape_params(spec.defaults(), problem_for(m, n, k, dtype, batch), _gpu(sms))
    return spec.defaults() if found is None else found[0]


def test_split_k_for_few_tiles_and_long_k() -> None:
    """512x512x8192 has 16 tiles of 128x128: 8 slices of 1024 give 128 blocks, one per SM
    (a split-K block needs more than 128 registers: one block per SM)."""
    for dtype in ("float32", "float64"):
        p = _shaped(512, 512, 8192, dtype=dtype)
        assert p["SPLIT_K"] == 8 and (p["BM"], p["BN"]) == (128, 128)
    assert _shaped(512, 512, 8192, sms=16)["SPLIT_K"] == 1  # 16 tiles fill 16 SMs
    assert _shaped(512, 512, 8192, sms=64)["SPLIT_K"] == 4
    assert _shaped(512, 512, 8192, sms=200)["SPLIT_K"] == 16
    assert _shaped(512, 512, 8192, batch=2)["SPLIT_K"] == 4  # the batch gives blocks too
    p = _shaped(512, 512, 8192, batch=4)  # 128 tiles of 128x64 are enough
    assert p["SPLIT_K"] == 1 and p["BN"] == 64


def test_large_products_keep_the_defaults() -> None:
    defaults = _spec().defaults()
    for m, n, k in ((4096, 4096, 4096), (2048, 2048, 2048), (8192, 8192, 8192),
                    (4097, 4097, 4097), (4096, 4096, 512)):
        assert _shaped(m, n, k) == defaults, (m, n, k)


def test_smaller_tile_when_it_fills_a_wave() -> None:
    """1024^3 and 1000^3: 64 tiles of 128x128 for 132 SMs, 128 of 128x64."""
    from tilegemm.kernels.cuda.k09_pipelined import SMALL_TILE

    for m in (1024, 1000):
        p = _shaped(m, m, m)
        assert {k: p[k] for k in SMALL_TILE} == SMALL_TILE and p["SPLIT_K"] == 1
    _spec().resolve(SMALL_TILE)  # valid for the rung's constraints


def test_split_limits() -> None:
    """Slices keep at least 16 k-tiles; tiny products and unknown SM counts keep the
    defaults; the split is the smallest that reaches one wave."""
    defaults = _spec().defaults()
    assert _shaped(64, 64, 64) == defaults  # K too short to split, 128x64 no better
    assert _shaped(512, 512, 256)["SPLIT_K"] == 2  # 2 slices of 128 = 16 k-tiles
    assert _shaped(512, 512, 254)["SPLIT_K"] == 1  # 2 slices of 127
    assert _shaped(256, 256, 100000)["SPLIT_K"] == 16  # capped by the largest choice
    assert _shaped(512, 512, 8192, sms=0) == defaults
    assert _shaped(512, 512, 900)["SPLIT_K"] == 4  # 8 slices of 113 would be too short


def test_auto_plan_applies_the_shape_choice(tmp_path, monkeypatch) -> None:
    """kernel="auto" without a tuned entry: the defaults, adapted to the SM count, and the
    reason in the plan's source; a tuned entry is never adapted (not exercised here)."""
    from tilegemm.backends import get_backend
    from tilegemm.tune.select import auto_plan

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    backend = get_backend("cuda")
    spec, params, source = auto_plan(backend, _gpu(132), problem_for(512, 512, 8192, "float32"))
    assert spec.name == "pipelined" and params["SPLIT_K"] == 8
    assert source.startswith("default; split-K")
    spec, params, source = auto_plan(backend, _gpu(132), problem_for(4096, 4096, 4096,
                                                                     "float32"))
    assert params == spec.defaults() and source == "default"


def test_tuner_baseline_is_the_adapted_choice() -> None:
    """`tilegemm tune` times what kernel="auto" runs untuned for the shape, so a tuned
    entry must beat the split-K choice, not the plain defaults, to replace it."""
    from tilegemm.backends import get_backend
    from tilegemm.tune.select import untuned_choice

    backend = get_backend("cuda")
    prob = problem_for(512, 512, 8192, "float32")
    spec, params = untuned_choice(backend, "float32", _gpu(132), prob)
    assert spec.name == "pipelined" and params["SPLIT_K"] == 8
    spec, params = untuned_choice(backend, "float32", _gpu(132))
    assert params == spec.defaults()


def test_tuner_holds_split_k_at_the_shapes_choice() -> None:
    """SPLIT_K is chosen per shape, not searched: the tuner's candidates keep the value
    kernel="auto" runs (the defaults' 1 unless told), so its budget goes to tile sizes."""
    from tilegemm.tune.space import candidates

    spec = _spec()
    plain = candidates(spec, "float32", CUDA_LIMITS)
    held = candidates(spec, "float32", CUDA_LIMITS, held={"SPLIT_K": 8, "BM": 64})
    assert plain and {p["SPLIT_K"] for p in plain} == {1}
    assert {p["SPLIT_K"] for p in held} == {8}
    assert len(held) == len(plain)  # BM is searched: holding it changes nothing
