"""matmul/gemm semantics (NumPy's) and bad input, on the always-present CPU backend."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tilegemm
from tilegemm.backends import get_backend
from tilegemm.reference import assert_close, random_operands

CPU = {"backend": "cpu", "kernel": "triple_loop"}


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((7, 5), (5, 3)),
        ((5,), (5, 3)),  # 1-D a: promoted to a row, axis removed
        ((7, 5), (5,)),  # 1-D b: promoted to a column, axis removed
        ((5,), (5,)),  # vector · vector → 0-d
        ((4, 7, 5), (5, 3)),  # batch × single
        ((7, 5), (4, 5, 3)),  # single × batch
        ((2, 1, 7, 5), (3, 5, 3)),  # partial broadcast in both
        ((2, 3, 7, 5), (2, 3, 5, 3)),  # full batch
        ((1, 7, 5), (1, 5, 3)),
        ((3, 5), (2, 4, 5, 1)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_follows_numpy_shapes(sa, sb, dtype):
    a, b = random_operands(sa, sb, dtype)
    c = tilegemm.matmul(a, b, **CPU)
    expected = np.matmul(a, b)
    assert type(c) is type(expected)  # vector · vector: a NumPy scalar, as np.matmul gives
    assert c.shape == expected.shape
    assert c.dtype == expected.dtype
    assert_close(c, a, b)


@pytest.mark.parametrize(
    ("da", "db"),
    [("float32", "float64"), ("int32", "float32"), ("int32", "int64"), ("int64", "int64")],
)
def test_mixed_dtypes_follow_result_type(da, db):
    a, _ = random_operands((6, 4), (1, 1), da)
    _, b = random_operands((1, 1), (4, 5), db)
    c = tilegemm.matmul(a, b, **CPU)
    assert c.dtype == np.result_type(a.dtype, b.dtype)
    assert_close(c, a, b)


def test_integers_are_exact():
    rng = np.random.default_rng()
    a = rng.integers(-1000, 1000, (9, 31)).astype(np.int64)
    b = rng.integers(-1000, 1000, (31, 11)).astype(np.int64)
    np.testing.assert_array_equal(tilegemm.matmul(a, b, **CPU), a @ b)


@pytest.mark.parametrize("order", ["F", "strided", "transposed"])
def test_layouts(order):
    a, b = random_operands((14, 10), (10, 12), "float64")
    if order == "F":
        a, b = np.asfortranarray(a), np.asfortranarray(b)
    elif order == "strided":
        a, b = a[::2, ::1], b[::1, ::2]  # (7, 10) @ (10, 6)
    else:
        a, b = np.ascontiguousarray(a.T).T, b.T.copy().T
    assert_close(tilegemm.matmul(a, b, **CPU), a, b)


def test_auto_picks_a_kernel_and_backend():
    a, b = random_operands((9, 8), (8, 7), "float32")
    assert_close(tilegemm.matmul(a, b), a, b)


def test_gemm_alpha_beta_and_transposes():
    rng = np.random.default_rng()
    a = rng.standard_normal((6, 9))  # op(a) = a.T: (9, 6)
    b = rng.standard_normal((5, 6))  # op(b) = b.T: (6, 5)
    c = rng.standard_normal((9, 5))
    r = tilegemm.gemm(a, b, c, alpha=-1.5, beta=0.25, trans_a=True, trans_b=True, **CPU)
    assert_close(r, a, b, alpha=-1.5, beta=0.25, c=c, trans_a=True, trans_b=True)
    np.testing.assert_allclose(r, -1.5 * a.T @ b.T + 0.25 * c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("flag", ["no", 0, 1, None, "True"])
def test_gemm_transpose_flags_must_be_booleans(flag):
    """A truthy string such as "no" was taken as True, and the shape error that followed
    hid the cause."""
    a, b = random_operands((4, 3), (3, 2), "float32")
    with pytest.raises(TypeError, match="trans_a must be True or False"):
        tilegemm.gemm(a, b, trans_a=flag, **CPU)
    r = tilegemm.gemm(a, b, trans_a=np.bool_(False), **CPU)  # NumPy's bool is a bool
    assert_close(r, a, b)


def test_gemm_beta_zero_ignores_nan_c():
    a, b = random_operands((4, 3), (3, 2), "float32")
    c = np.full((4, 2), np.nan, np.float32)
    r = tilegemm.gemm(a, b, c, beta=0.0, **CPU)
    assert np.isfinite(r).all()


def test_gemm_out_equals_c_updates_in_place():
    a, b = random_operands((4, 3), (3, 2), "float64")
    c = np.ones((4, 2))
    c0 = c.copy()
    r = tilegemm.gemm(a, b, c, beta=2.0, out=c, **CPU)
    assert r is c
    np.testing.assert_allclose(c, a @ b + 2 * c0)


def test_gemm_c_broadcasts():
    a, b = random_operands((4, 3), (3, 2), "float64")
    bias = np.array([1.0, -2.0])
    r = tilegemm.gemm(a, b, bias, beta=1.0, **CPU)
    np.testing.assert_allclose(r, a @ b + bias)


def test_out_is_written_and_returned():
    a, b = random_operands((5, 4), (4, 3), "float32")
    out = np.full((5, 3), np.nan, np.float32)
    r = tilegemm.matmul(a, b, out=out, **CPU)
    assert r is out
    assert_close(out, a, b)


@pytest.mark.parametrize(
    ("sa", "sb", "shape"),
    [((0, 4), (4, 3), (0, 3)), ((5, 4), (4, 0), (5, 0)), ((0, 5, 4), (4, 3), (0, 5, 3))],
)
def test_empty_dimensions(sa, sb, shape):
    a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
    c = tilegemm.matmul(a, b, **CPU)
    assert c.shape == shape and c.dtype == np.float32


def test_k_zero_gives_zeros_and_beta_c():
    a, b = np.ones((3, 0)), np.ones((0, 4))
    np.testing.assert_array_equal(tilegemm.matmul(a, b, **CPU), np.zeros((3, 4)))
    c = np.full((3, 4), 2.0)
    np.testing.assert_array_equal(tilegemm.gemm(a, b, c, beta=3.0, **CPU), 6.0)


def test_nan_and_inf_propagate_like_numpy():
    a, b = random_operands((4, 4), (4, 4), "float64")
    a[1, 2] = np.nan
    a[2, 0] = np.inf
    b[3, 3] = -np.inf
    with np.errstate(invalid="ignore"):
        expected = a @ b
    got = tilegemm.matmul(a, b, **CPU)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(expected)],
                                  expected[~finite & ~np.isnan(expected)])
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-12)


# --- bad input: a clear error before anything runs, and `out` left untouched ---------

def test_mismatched_shapes_name_both_shapes():
    a, b = np.ones((3, 4)), np.ones((5, 2))
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 2\)"):
        tilegemm.matmul(a, b)


def test_batch_dims_that_do_not_broadcast():
    with pytest.raises(ValueError, match="do not broadcast"):
        tilegemm.matmul(np.ones((2, 3, 4)), np.ones((3, 4, 5)))


@pytest.mark.parametrize("zero_d", [np.float32(2.0), np.array(3.0)])
def test_zero_d_inputs(zero_d):
    with pytest.raises(ValueError, match="0-d"):
        tilegemm.matmul(zero_d, np.ones((3, 3)))
    with pytest.raises(ValueError, match="0-d"):
        tilegemm.matmul(np.ones((3, 3)), zero_d)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.longdouble, object])
def test_unsupported_dtypes_list_supported(dtype):
    a = np.ones((2, 2), dtype=dtype)
    with pytest.raises(TypeError, match="float32, float64, int32, int64, float16, bfloat16, bool"):
        tilegemm.matmul(a, a)


@pytest.mark.parametrize("dtype", [np.bool_, np.float16, np.uint8, np.int8, np.uint64])
def test_narrow_dtypes_are_computed_and_cast_back(dtype):
    """They were refused; NumPy computes them, so do we (in a kernel dtype, cast back)."""
    a = (np.arange(6).reshape(2, 3) % 3).astype(dtype)
    b = (np.arange(6).reshape(3, 2) % 2).astype(dtype)
    got = tilegemm.matmul(a, b, backend="cpu")
    want = np.matmul(a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_mixed_pair_with_a_supported_result_is_computed():
    """float64 @ int8 was refused although its result type, float64, is computed."""
    a = np.arange(6.0).reshape(2, 3)
    b = np.ones((3, 2), np.int8)
    got = tilegemm.matmul(a, b, backend="cpu")
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, a @ b)


def test_shape_errors_come_before_dtype_errors():
    """A shape mismatch with an unsupported dtype raised TypeError, not NumPy's ValueError."""
    with pytest.raises(ValueError):
        tilegemm.matmul(np.ones((2, 3), np.complex64), np.ones((4, 2)))


def test_kernel_without_dtype_support():
    usable = {s.name for s in tilegemm.backends() if s.usable}
    spec = next((s for s in tilegemm.kernels() if "int32" not in s.dtypes
                 and s.backend in usable), None)
    if spec is None:
        pytest.skip("every usable kernel supports int32")
    a = np.ones((2, 2), np.int32)
    with pytest.raises(TypeError, match=f"{spec.name}.*does not support dtype int32"):
        tilegemm.matmul(a, a, kernel=spec.name, backend=spec.backend)


def test_out_follows_numpy_strides_casts_and_overlap():
    """out had to be C-contiguous and of the exact result dtype; NumPy accepts views, casts
    under same_kind, and overlap with an input."""
    a, b = random_operands((4, 3), (3, 2), "float32")
    big = np.full((4, 4), 7.0, np.float32)
    got = tilegemm.matmul(a, b, out=big[:, ::2], **CPU)
    assert got.base is big and np.all(big[:, 1::2] == 7.0)
    assert_close(big[:, ::2], a, b)
    wider = np.full((4, 2), np.nan, np.float64)
    assert tilegemm.matmul(a, b, out=wider, **CPU) is wider
    assert_close(wider.astype(np.float32), a, b)
    sq = np.arange(9.0).reshape(3, 3)
    want = sq @ sq
    tilegemm.matmul(sq, sq, out=sq[::-1, :], **CPU)
    np.testing.assert_array_equal(sq[::-1, :], want)


def _untouched(call, out):
    before = out.copy()
    with pytest.raises((ValueError, TypeError)):
        call()
    np.testing.assert_array_equal(out, before)


def test_bad_out_is_refused_and_untouched():
    a, b = random_operands((4, 3), (3, 2), "float32")
    wrong_shape = np.full((2, 4), 7.0, np.float32)
    _untouched(lambda: tilegemm.matmul(a, b, out=wrong_shape, **CPU), wrong_shape)
    wrong_dtype = np.full((4, 2), 7, np.int32)  # float32 -> int32 is not a same_kind cast
    _untouched(lambda: tilegemm.matmul(a, b, out=wrong_dtype, **CPU), wrong_dtype)
    read_only = np.full((4, 2), 7.0, np.float32)
    read_only.flags.writeable = False
    _untouched(lambda: tilegemm.matmul(a, b, out=read_only, **CPU), read_only)
    # a bad parameter with a good out: still untouched
    good = np.full((4, 2), 7.0, np.float32)
    _untouched(lambda: tilegemm.matmul(a, b, out=good, backend="cpu", kernel="nope"), good)


def test_unknown_kernel_and_backend_list_choices():
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match="choices: .*triple_loop"):
        tilegemm.matmul(a, a, backend="cpu", kernel="nope")
    with pytest.raises(ValueError, match="choices: auto, cuda, opencl, cpu"):
        tilegemm.matmul(a, a, backend="tpu")


def test_parameters_need_explicit_kernel_and_are_validated():
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match="explicit kernel"):
        tilegemm.matmul(a, a, TILE=16)
    with pytest.raises(ValueError, match="has no parameter"):
        tilegemm.matmul(a, a, backend="cpu", kernel="triple_loop", TILE=16)


def test_gemm_needs_c_when_beta_nonzero_and_checks_scalars():
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match="beta != 0 needs c"):
        tilegemm.gemm(a, a, beta=1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        tilegemm.gemm(a, a, np.ones((3, 3)), beta=1.0)
    with pytest.raises(TypeError, match="alpha"):
        tilegemm.gemm(a, a, alpha="2")
    with pytest.raises(TypeError, match="must be an integer"):
        tilegemm.gemm(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), alpha=0.5, **CPU)


def test_inputs_are_not_modified():
    a, b = random_operands((6, 5), (5, 4), "float32")
    a0, b0 = a.copy(), b.copy()
    c = np.ones((6, 4), np.float32)
    c0 = c.copy()
    tilegemm.gemm(a, b, c, alpha=2, beta=3, **CPU)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    np.testing.assert_array_equal(c, c0)


def test_backends_report_usability_and_reason():
    found = {s.name: s for s in tilegemm.backends()}
    assert set(found) == {"cuda", "opencl", "cpu", "cudac"}
    assert found["cpu"].usable
    for s in found.values():
        assert s.reason  # always says why (or what)


def test_cuda_request_without_gpu_is_a_clear_error():
    status = {s.name: s for s in tilegemm.backends()}["cuda"]
    if status.usable:
        pytest.skip("a CUDA device (or the simulator) is usable here")
    with pytest.raises(RuntimeError, match=r"backend 'cuda' is not usable here.*Usable backends"):
        tilegemm.matmul(np.ones((2, 2)), np.ones((2, 2)), backend="cuda")


def test_a_rung_of_another_backend_is_named_as_such():
    """kernel='wgmma' on the CPU (kernel names are per backend): the error says which
    backend has it and lists the CPU's own, before any launch."""
    a = np.ones((3, 3), np.float32)
    # the hint recommends the backend only where it can run (the simulator counts)
    hint = ("pass backend='cuda'" if get_backend("cuda").status().usable
            else "not usable here")
    with pytest.raises(ValueError, match=r"unknown kernel 'wgmma' for backend 'cpu' "
                       rf"\(kernel 'wgmma' is a rung of backend 'cuda'(: |, ){hint}\); "
                       r"choices: triple_loop, blocked"):
        tilegemm.matmul(a, a, kernel="wgmma", backend="cpu")
    with pytest.raises(ValueError, match=r"unknown kernel 'nope' for backend 'cpu'; choices"):
        tilegemm.matmul(a, a, kernel="nope", backend="cpu")


def test_import_touches_no_gpu_library():
    code = (
        "import sys, tilegemm; tilegemm.kernels(); "
        "bad = [m for m in ('numba.cuda', 'pyopencl', 'cupy', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.cudasim
def test_device_arrays_stay_on_device():
    """numba device arrays in → device arrays out (the simulator's, here), out= honoured."""
    from numba import cuda

    a, b = random_operands((3, 7, 5), (5, 4), "float32")
    da, db = cuda.to_device(a), cuda.to_device(b)
    r = tilegemm.matmul(da, db, kernel="naive", BLOCK=8)
    assert getattr(r, "__cuda_ndarray__", False) and r.shape == (3, 7, 4)
    assert_close(r.copy_to_host(), a, b)
    out = cuda.to_device(np.full((3, 7, 4), np.nan, np.float32))
    assert tilegemm.matmul(da, db, out=out, kernel="naive", BLOCK=8) is out
    assert_close(out.copy_to_host(), a, b)
    v = np.random.default_rng().uniform(0.5, 1.5, 5).astype(np.float32)
    r = tilegemm.matmul(da, cuda.to_device(v), kernel="naive", BLOCK=8)
    assert r.shape == (3, 7)
    assert_close(r.copy_to_host(), a, v)
    c = np.ones((3, 7, 4), np.float32)
    r = tilegemm.gemm(da, db, cuda.to_device(c), beta=2.0, kernel="naive", BLOCK=8)
    assert_close(r.copy_to_host(), a, b, beta=2.0, c=c)
    bt = np.ascontiguousarray(b.T)
    r = tilegemm.gemm(cuda.to_device(a[0]), cuda.to_device(bt), trans_b=True, kernel="naive",
                      BLOCK=8)
    assert_close(r.copy_to_host(), a[0], bt, trans_b=True)


@pytest.mark.cudasim
def test_device_and_host_mix_and_mismatched_dtype():
    from numba import cuda

    a, b = random_operands((4, 5), (5, 3), "float32")
    r = tilegemm.matmul(cuda.to_device(a), b, kernel="naive", BLOCK=8)  # host b is copied in
    assert_close(r.copy_to_host(), a, b)
    with pytest.raises(TypeError, match="numba arrays have no device-side cast"):
        tilegemm.matmul(cuda.to_device(a), cuda.to_device(b.astype(np.float64)),
                        kernel="naive", BLOCK=8)
    with pytest.raises(ValueError, match="use backend='cuda'"):
        tilegemm.matmul(cuda.to_device(a), b, backend="cpu")


@pytest.mark.cudasim
def test_plan_refuses_the_numba_device_arrays_a_call_refuses():
    """plan() approved mixed dtypes, partially broadcast batches and trans_a on a batch of
    numba device arrays, which the call then refused inside the backend's run."""
    from numba import cuda

    f32 = np.ones((2, 1, 4, 3), np.float32)
    cases = [
        (dict(a=cuda.to_device(f32[0, 0].astype(np.float64)),
              b=cuda.to_device(np.ones((3, 2), np.float32))), TypeError, "device-side cast"),
        (dict(a=cuda.to_device(f32), b=cuda.to_device(np.ones((1, 2, 3, 2), np.float32))),
         ValueError, "partially broadcast batch"),
        (dict(a=cuda.to_device(np.ones((2, 3, 4), np.float32)),
              b=cuda.to_device(np.ones((2, 3, 2), np.float32)), trans_a=True),
         ValueError, "trans_a/trans_b on batched numba"),
    ]
    for kw, error, message in cases:
        with pytest.raises(error, match=message):
            tilegemm.plan(**kw, backend="cuda")
        with pytest.raises(error, match=message):
            tilegemm.gemm(**kw, backend="cuda")


def test_kernels_and_reference_are_modules_that_can_be_called():
    """``tilegemm.kernels`` and ``tilegemm.reference`` are public functions and modules at
    once. Functions bound over the modules' names hid them: ``import
    tilegemm.kernels.cpu.k01_triple_loop as k`` failed ("cannot import name 'cpu' from
    'kernels'"), and so did ``tilegemm.kernels.cpu`` after the module was imported."""
    import inspect

    import tilegemm.kernels.cpu.k01_triple_loop as rung
    import tilegemm.reference as ref

    assert rung.__name__ == "tilegemm.kernels.cpu.k01_triple_loop"
    assert tilegemm.kernels.cpu.k01_triple_loop is rung
    assert [s.name for s in tilegemm.kernels("cpu")] == ["triple_loop", "blocked"]
    assert {s.backend for s in tilegemm.kernels()} >= {"cpu", "opencl", "cuda"}
    assert "backend" in inspect.signature(tilegemm.kernels).parameters
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        tilegemm.kernels("nope")
    assert ref.assert_close is tilegemm.assert_close
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 7)), rng.standard_normal((7, 2))
    got = tilegemm.reference(a.astype(np.float32), b.astype(np.float32), alpha=2.0)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, 2.0 * (a.astype(np.float32).astype(np.float64)
                                           @ b.astype(np.float32).astype(np.float64)))
